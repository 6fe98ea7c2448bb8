//! The target's image list, from dyld's `dyld_all_image_infos`, turned
//! into image map records, and what of each image is copied into the trace.
//!
//! The target's memory is reached through [`TaskMemory`] (the macOS backend
//! implements it with `mach_vm_read_overwrite`), so this logic is tested on
//! any host against a fake task.

use super::{
    parse_all_image_infos, parse_c_string, parse_header, parse_image_info_array,
    parse_load_commands, AllImageInfos, MachOImage, DYLD_ALL_IMAGE_INFOS_LEN, MACH_HEADER_64_LEN,
    MAX_PATH_LEN,
};
use crate::error::RecordError;
use lrnprof_format::{
    BlobKind, BuildId, ImageKind, ImageMapRecord, ImageUnmapRecord, Pid, Record, Timestamp,
};
use lrnprof_image::{
    build_id_of_bytes, split_blob, thin_slice, EmbedLevel, MACHO_HEADER_SECTION,
    MACHO_UNWIND_SECTIONS,
};
use std::collections::{BTreeMap, BTreeSet};
/// The most bytes copied for one section; bigger ones are skipped.
const MAX_SECTION_LEN: u64 = 64 << 20;
/// Blob data per record: well under the format's record size limit.
const BLOB_PART_LEN: usize = 512 << 10;

/// Another task's memory, as the image tracker needs it.
pub(crate) trait TaskMemory {
    /// Copy `buf.len()` bytes at AVMA `address` into `buf`; `false` if any
    /// of them is not readable.
    fn read(&self, address: u64, buf: &mut [u8]) -> bool;

    /// AVMA of the task's `dyld_all_image_infos`; 0 before dyld set it up.
    fn all_image_infos_address(&self) -> Result<u64, RecordError>;
}

/// The error for memory of the target that could not be read.
fn unreadable(what: &str, address: u64) -> RecordError {
    RecordError::Sys {
        what: format!("reading {what} at {address:#x} in the target"),
        source: std::io::Error::other("memory not readable"),
    }
}

/// The most bytes of an image file embedded whole; bigger files are left
/// for the analysis machine to provide (`--symbols`).
const MAX_EMBEDDED_FILE_LEN: u64 = 64 << 20;

/// What still has to be copied into the trace for an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Embed {
    /// Nothing (no UUID to key it by, or already done).
    Nothing,
    /// A shared-cache image: its unwind sections, from memory, now.
    SectionsFromMemory,
    /// An image with a file: the file, read from disk when recording ends.
    FileAtEnd,
}

/// One image currently mapped in the target.
struct Known {
    /// One past the end of `__TEXT` (AVMA).
    end: u64,
    /// Its path as dyld reports it.
    path: String,
    /// What its header and load commands say.
    image: MachOImage,
    /// What to embed once a sample touches it.
    embed: Embed,
}

/// An image file to copy into the trace when recording ends.
#[derive(Debug, Clone)]
pub(crate) struct FileToEmbed {
    /// Path as dyld reported it.
    pub path: String,
    /// The UUID the mapped image has: the file is used only if it matches.
    pub uuid: [u8; 16],
    /// The image's `cputype`, to pick the slice of a universal file.
    pub cputype: u32,
}

/// Tracks the target's images and turns changes into records.
pub(crate) struct Images {
    pid: Pid,
    /// How much of each touched image to embed.
    level: EmbedLevel,
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
    /// Files of touched images, embedded when recording ends.
    files: Vec<FileToEmbed>,
    /// UUIDs already embedded or queued (an image may be mapped again).
    embedded: BTreeSet<[u8; 16]>,
    /// Image list reads or images that could not be parsed.
    pub unreadable: u64,
}

impl Images {
    pub fn new(pid: Pid, level: EmbedLevel) -> Images {
        Images {
            pid,
            level,
            infos_address: 0,
            last_change: None,
            known: BTreeMap::new(),
            pending: None,
            files: Vec::new(),
            embedded: BTreeSet::new(),
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
        task: &impl TaskMemory,
        time: Timestamp,
        out: &mut Vec<Record>,
    ) -> Result<(), RecordError> {
        if self.infos_address == 0 {
            self.infos_address = task.all_image_infos_address()?;
            if self.infos_address == 0 {
                return Ok(());
            }
        }
        let mut raw = [0u8; DYLD_ALL_IMAGE_INFOS_LEN];
        // Older layouts are shorter; the version tells what is there.
        if !task.read(self.infos_address, &mut raw)
            && !task.read(self.infos_address, &mut raw[..152])
        {
            return Err(unreadable("dyld_all_image_infos", self.infos_address));
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
        task: &impl TaskMemory,
        infos: &AllImageInfos,
    ) -> Result<Vec<(u64, u64)>, RecordError> {
        let mut array = vec![0u8; infos.info_array_len()?];
        if !task.read(infos.info_array, &mut array) {
            return Err(unreadable("the dyld image array", infos.info_array));
        }
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
        task: &impl TaskMemory,
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
                path: path.clone(),
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
                    path,
                    embed: match (image.uuid, shared, self.level) {
                        (None, _, _) | (_, _, EmbedLevel::None) => Embed::Nothing,
                        // Unwind data only: the sections, from memory.
                        (Some(_), true, _) | (Some(_), false, EmbedLevel::Unwind) => {
                            Embed::SectionsFromMemory
                        }
                        // Symbols too: the whole file (DWARF lives in dSYMs).
                        (Some(_), false, _) => Embed::FileAtEnd,
                    },
                    image,
                },
            );
        }
        self.recompute_pending();
    }

    /// Whether some mapped image is not yet embedded.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    fn recompute_pending(&mut self) {
        self.pending = self
            .known
            .iter()
            .filter(|(_, k)| k.embed != Embed::Nothing)
            .fold(None, |acc, (&start, k)| match acc {
                None => Some((start, k.end)),
                Some((lo, hi)) => Some((lo.min(start), hi.max(k.end))),
            });
    }

    /// The image containing `address` whose data is not yet in the trace,
    /// if any.
    pub fn wants_embedding(&self, address: u64) -> Option<u64> {
        let (lo, hi) = self.pending?;
        if address < lo || address >= hi {
            return None;
        }
        let (&start, known) = self.known.range(..=address).next_back()?;
        (address < known.end && known.embed != Embed::Nothing).then_some(start)
    }

    /// The image loaded at `start` was touched by a sample for the first
    /// time, so only images that matter are embedded. A shared-cache image
    /// has its unwind sections (and its header with the load commands, so
    /// the analyzer knows the layout) copied from memory into blob records
    /// now; an image with a file is queued for [`Images::take_files`].
    pub fn embed(&mut self, task: &impl TaskMemory, start: u64, out: &mut Vec<Record>) {
        let Some(known) = self.known.get_mut(&start) else {
            return;
        };
        let what = std::mem::replace(&mut known.embed, Embed::Nothing);
        let image = known.image.clone();
        let path = known.path.clone();
        self.recompute_pending();
        if image.uuid.is_some_and(|u| !self.embedded.insert(u)) {
            return;
        }
        match (what, image.uuid) {
            (Embed::SectionsFromMemory, _) => {}
            (Embed::FileAtEnd, Some(uuid)) => {
                self.files.push(FileToEmbed {
                    path,
                    uuid,
                    cputype: image.header.cputype,
                });
                return;
            }
            _ => return,
        }
        let (Some(uuid), Some(text), Some(slide)) =
            (image.uuid, image.text_segment(), image.slide(start))
        else {
            return;
        };
        let build_id = BuildId(uuid.to_vec());
        let mut header = vec![0u8; image.header.total_len()];
        if task.read(start, &mut header) {
            push_blob(out, &build_id, MACHO_HEADER_SECTION, text.vmaddr, header);
        }
        // What the analyzer needs to unwind through code whose file it
        // will never have.
        for (segment, name) in MACHO_UNWIND_SECTIONS {
            let Some(section) = image.section(segment, name) else {
                continue;
            };
            if section.size == 0 || section.size > MAX_SECTION_LEN {
                continue;
            }
            let mut bytes = vec![0u8; section.size as usize];
            if task.read(section.addr.wrapping_add(slide), &mut bytes) {
                push_blob(out, &build_id, name, section.addr, bytes);
            }
        }
    }

    /// The files of touched images, to embed when recording ends.
    pub fn take_files(&mut self) -> Vec<FileToEmbed> {
        std::mem::take(&mut self.files)
    }
}

fn push_blob(out: &mut Vec<Record>, build_id: &BuildId, name: &str, svma: u64, data: Vec<u8>) {
    let kind = BlobKind::Section {
        name: name.to_string(),
        svma,
    };
    push_blob_parts(out, build_id, kind, data);
}

/// `data` as blob records of at most [`BLOB_PART_LEN`] bytes each.
fn push_blob_parts(out: &mut Vec<Record>, build_id: &BuildId, kind: BlobKind, data: Vec<u8>) {
    let parts = split_blob(build_id, kind, false, data, BLOB_PART_LEN);
    out.extend(parts.into_iter().map(Record::Blob));
}

/// Read the Mach-O header and load commands at `address` of `task`.
fn read_image(task: &impl TaskMemory, address: u64) -> Result<MachOImage, RecordError> {
    let mut head = [0u8; MACH_HEADER_64_LEN];
    if !task.read(address, &mut head) {
        return Err(unreadable("a Mach-O header", address));
    }
    let header = parse_header(&head)?;
    let mut all = vec![0u8; header.total_len()];
    if !task.read(address, &mut all) {
        return Err(unreadable("Mach-O load commands", address));
    }
    parse_load_commands(&all)
}

/// Read the NUL-terminated string at `address`, page by page so that a
/// string ending just before an unmapped page can still be read.
fn read_c_string(task: &impl TaskMemory, address: u64) -> Option<String> {
    const PAGE: u64 = 4096;
    if address == 0 {
        return None;
    }
    let mut bytes = Vec::new();
    let mut at = address;
    while bytes.len() < MAX_PATH_LEN {
        let chunk = (PAGE - at % PAGE) as usize;
        let mut buf = vec![0u8; chunk];
        if !task.read(at, &mut buf) {
            return None;
        }
        let done = buf.contains(&0);
        bytes.extend_from_slice(&buf);
        if done {
            return parse_c_string(&bytes).ok();
        }
        at += chunk as u64;
    }
    None
}

/// Blob records holding the image file `file.path` (the slice the target
/// runs, for a universal file), if it is small enough and still has the
/// mapped image's UUID; otherwise why not.
pub(crate) fn embed_file(file: &FileToEmbed, out: &mut Vec<Record>) -> Result<(), String> {
    let len = std::fs::metadata(&file.path)
        .map_err(|e| format!("{}: {e}", file.path))?
        .len();
    if len > MAX_EMBEDDED_FILE_LEN {
        return Err(format!(
            "{}: {len} bytes, more than the {MAX_EMBEDDED_FILE_LEN} embedded",
            file.path
        ));
    }
    let bytes = std::fs::read(&file.path).map_err(|e| format!("{}: {e}", file.path))?;
    let image = thin_slice(&bytes, file.cputype).map_err(|e| format!("{}: {e}", file.path))?;
    if build_id_of_bytes(image).map(|id| id.0) != Some(file.uuid.to_vec()) {
        return Err(format!(
            "{}: the file on disk is not the mapped image (UUID differs)",
            file.path
        ));
    }
    push_blob_parts(
        out,
        &BuildId(file.uuid.to_vec()),
        BlobKind::Image,
        image.to_vec(),
    );
    Ok(())
}

#[cfg(test)]
mod tests;
