//! The target's image list, from dyld's `dyld_all_image_infos`, and the
//! unwind sections of dyld-shared-cache images copied into the trace.

use super::sys::{self, Port};
use crate::error::RecordError;
use crate::macho::{
    parse_all_image_infos, parse_c_string, parse_header, parse_image_info_array,
    parse_load_commands, AllImageInfos, MachOImage, DYLD_ALL_IMAGE_INFOS_LEN, MACH_HEADER_64_LEN,
    MAX_PATH_LEN,
};
use lrnprof_format::{
    Blob, BlobKind, BuildId, ImageKind, ImageMapRecord, ImageUnmapRecord, Pid, Record, Timestamp,
};
use std::collections::BTreeMap;

/// Sections of a shared-cache image copied into the trace: what the
/// analyzer needs to unwind through code whose file it will never have.
const EMBEDDED_SECTIONS: [(&str, &str); 2] =
    [("__TEXT", "__unwind_info"), ("__TEXT", "__eh_frame")];
/// The most bytes copied for one section; bigger ones are skipped.
const MAX_SECTION_LEN: u64 = 64 << 20;
/// Blob data per record: well under the format's record size limit.
const BLOB_PART_LEN: usize = 512 << 10;

/// One image currently mapped in the target.
struct Known {
    /// One past the end of `__TEXT` (AVMA).
    end: u64,
    /// What its header and load commands say.
    image: MachOImage,
    /// Whether it is a shared-cache image whose sections are not yet in the trace.
    needs_embedding: bool,
}

/// Tracks the target's images and turns changes into records.
pub(super) struct Images {
    pid: Pid,
    /// `dyld_all_image_infos` AVMA; 0 until dyld has set it up.
    infos_address: u64,
    /// What identified the image list at the last read: the change
    /// timestamp (macOS 10.12+), else the array address and count.
    last_change: Option<(u64, u64, u32)>,
    /// Images by load address (AVMA of their Mach-O header).
    known: BTreeMap<u64, Known>,
    /// Lowest start and highest end of the images still to embed: a quick
    /// filter before the map lookup, since most stack words miss them.
    pending: Option<(u64, u64)>,
    /// Image list reads or images that could not be parsed.
    pub unreadable: u64,
}

impl Images {
    pub fn new(pid: Pid) -> Images {
        Images {
            pid,
            infos_address: 0,
            last_change: None,
            known: BTreeMap::new(),
            pending: None,
            unreadable: 0,
        }
    }

    /// The `cputype` of the main executable, once dyld has listed it.
    pub fn executable_cputype(&self) -> Option<u32> {
        self.known
            .values()
            .find(|k| k.image.header.filetype == 2)
            .map(|k| k.image.header.cputype)
    }

    /// Re-read the image list if dyld changed it; push map and unmap
    /// records for the differences.
    pub fn refresh(
        &mut self,
        task: &Port,
        time: Timestamp,
        out: &mut Vec<Record>,
    ) -> Result<(), RecordError> {
        if self.infos_address == 0 {
            self.infos_address = sys::dyld_all_image_infos_address(task)
                .map_err(|c| sys::kern_error("task_info(TASK_DYLD_INFO)", c))?;
            if self.infos_address == 0 {
                return Ok(());
            }
        }
        let mut raw = [0u8; DYLD_ALL_IMAGE_INFOS_LEN];
        if sys::read_memory(task, self.infos_address, &mut raw).is_err() {
            // Older layouts are shorter; the version tells what is there.
            sys::read_memory(task, self.infos_address, &mut raw[..152])
                .map_err(|c| sys::kern_error("reading dyld_all_image_infos", c))?;
        }
        let infos = parse_all_image_infos(&raw)?;
        if !infos.is_stable() {
            return Ok(()); // dyld is mid-update: next tick.
        }
        let change = (
            infos.info_array_change_timestamp.unwrap_or(0),
            infos.info_array,
            infos.info_array_count,
        );
        if self.last_change == Some(change) {
            return Ok(());
        }
        let current = self.read_list(task, &infos)?;
        self.last_change = Some(change);
        self.apply(task, current, time, out);
        Ok(())
    }

    /// The (load address, path address) of every image, dyld included.
    fn read_list(
        &self,
        task: &Port,
        infos: &AllImageInfos,
    ) -> Result<Vec<(u64, u64)>, RecordError> {
        let mut array = vec![0u8; infos.info_array_len()?];
        sys::read_memory(task, infos.info_array, &mut array)
            .map_err(|c| sys::kern_error("reading the dyld image array", c))?;
        let mut list: Vec<(u64, u64)> = parse_image_info_array(&array, infos.info_array_count)?
            .into_iter()
            .map(|i| (i.load_address, i.file_path))
            .collect();
        if infos.dyld_image_load_address != 0 {
            list.push((infos.dyld_image_load_address, infos.dyld_path));
        }
        Ok(list)
    }

    fn apply(
        &mut self,
        task: &Port,
        current: Vec<(u64, u64)>,
        time: Timestamp,
        out: &mut Vec<Record>,
    ) {
        let present: std::collections::BTreeSet<u64> = current.iter().map(|c| c.0).collect();
        let gone: Vec<u64> = self
            .known
            .keys()
            .filter(|a| !present.contains(a))
            .copied()
            .collect();
        for start in gone {
            if let Some(k) = self.known.remove(&start) {
                out.push(Record::ImageUnmap(ImageUnmapRecord {
                    time,
                    pid: self.pid,
                    start,
                    end: k.end,
                }));
            }
        }
        for (load_address, path_address) in current {
            if load_address == 0 || self.known.contains_key(&load_address) {
                continue;
            }
            let image = match read_image(task, load_address) {
                Ok(image) => image,
                Err(_) => {
                    self.unreadable += 1;
                    continue;
                }
            };
            let Some(text) = image.text_segment() else {
                self.unreadable += 1;
                continue;
            };
            let end = load_address.saturating_add(text.vmsize);
            let path = read_c_string(task, path_address).unwrap_or_else(|| {
                if image.header.filetype == 7 {
                    "/usr/lib/dyld".to_string()
                } else {
                    format!("[unknown image at {load_address:#x}]")
                }
            });
            let shared = image.header.in_shared_cache();
            out.push(Record::ImageMap(ImageMapRecord {
                time,
                pid: self.pid,
                start: load_address,
                end,
                // The load address is the start of __TEXT, which begins at
                // file offset 0 of a standalone image; shared-cache images
                // have no file of their own.
                file_offset: 0,
                path,
                build_id: image.uuid.map(|u| BuildId(u.to_vec())),
                kind: if shared {
                    ImageKind::SharedCache
                } else {
                    ImageKind::File
                },
                executable: true,
            }));
            self.known.insert(
                load_address,
                Known {
                    end,
                    needs_embedding: shared && image.uuid.is_some(),
                    image,
                },
            );
        }
        self.recompute_pending();
    }

    /// Whether some mapped shared-cache image is not yet embedded.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    fn recompute_pending(&mut self) {
        self.pending =
            self.known
                .iter()
                .filter(|(_, k)| k.needs_embedding)
                .fold(None, |acc, (&start, k)| match acc {
                    None => Some((start, k.end)),
                    Some((lo, hi)) => Some((lo.min(start), hi.max(k.end))),
                });
    }

    /// The shared-cache image containing `address` whose sections are not
    /// yet in the trace, if any.
    pub fn wants_embedding(&self, address: u64) -> Option<u64> {
        let (lo, hi) = self.pending?;
        if address < lo || address >= hi {
            return None;
        }
        let (&start, known) = self.known.range(..=address).next_back()?;
        (address < known.end && known.needs_embedding).then_some(start)
    }

    /// Copy the unwind sections (and the header with its load commands, so
    /// the analyzer knows the layout) of the shared-cache image loaded at
    /// `start` into blob records. Called the first time a sample touches
    /// the image, so only images that matter are embedded.
    pub fn embed(&mut self, task: &Port, start: u64, out: &mut Vec<Record>) {
        let Some(known) = self.known.get_mut(&start) else {
            return;
        };
        known.needs_embedding = false;
        let image = known.image.clone();
        self.recompute_pending();
        let (Some(uuid), Some(text), Some(slide)) =
            (image.uuid, image.text_segment(), image.slide(start))
        else {
            return;
        };
        let build_id = BuildId(uuid.to_vec());
        let mut header = vec![0u8; image.header.total_len()];
        if sys::read_memory(task, start, &mut header).is_ok() {
            push_blob(out, &build_id, "__TEXT", text.vmaddr, header);
        }
        for (segment, name) in EMBEDDED_SECTIONS {
            let Some(section) = image.section(segment, name) else {
                continue;
            };
            if section.size == 0 || section.size > MAX_SECTION_LEN {
                continue;
            }
            let mut bytes = vec![0u8; section.size as usize];
            if sys::read_memory(task, section.addr.wrapping_add(slide), &mut bytes).is_ok() {
                push_blob(out, &build_id, name, section.addr, bytes);
            }
        }
    }
}

fn push_blob(out: &mut Vec<Record>, build_id: &BuildId, name: &str, svma: u64, data: Vec<u8>) {
    let total_len = data.len() as u64;
    for (i, part) in data.chunks(BLOB_PART_LEN).enumerate() {
        out.push(Record::Blob(Blob {
            build_id: build_id.clone(),
            kind: BlobKind::Section {
                name: name.to_string(),
                svma,
            },
            compressed: false,
            offset: (i * BLOB_PART_LEN) as u64,
            total_len,
            data: part.to_vec(),
        }));
    }
}

/// Read the Mach-O header and load commands at `address` of `task`.
fn read_image(task: &Port, address: u64) -> Result<MachOImage, RecordError> {
    let mut head = [0u8; MACH_HEADER_64_LEN];
    sys::read_memory(task, address, &mut head)
        .map_err(|c| sys::kern_error("reading a Mach-O header", c))?;
    let header = parse_header(&head)?;
    let mut all = vec![0u8; header.total_len()];
    sys::read_memory(task, address, &mut all)
        .map_err(|c| sys::kern_error("reading Mach-O load commands", c))?;
    parse_load_commands(&all)
}

/// Read the NUL-terminated string at `address`, page by page so that a
/// string ending just before an unmapped page can still be read.
fn read_c_string(task: &Port, address: u64) -> Option<String> {
    const PAGE: u64 = 4096;
    if address == 0 {
        return None;
    }
    let mut bytes = Vec::new();
    let mut at = address;
    while bytes.len() < MAX_PATH_LEN {
        let chunk = (PAGE - at % PAGE) as usize;
        let mut buf = vec![0u8; chunk];
        sys::read_memory(task, at, &mut buf).ok()?;
        let done = buf.contains(&0);
        bytes.extend_from_slice(&buf);
        if done {
            return parse_c_string(&bytes).ok();
        }
        at += chunk as u64;
    }
    None
}
