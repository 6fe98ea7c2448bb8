//! The images of each recorded process: their build ids (from the kernel,
//! the ELF file or the vDSO's memory), which ones samples touched, and
//! what of them to embed when recording ends. Runs on the writer thread.

use super::procfs::{self, MapsEntry};
use super::sys;
use crate::report::RecordWarning;
use lrnprof_format::{Blob, BlobKind, BuildId, ImageKind, ImageMapRecord, Pid, Record, Timestamp};
use lrnprof_image::{
    blobs_for_open_file, build_id_of_bytes, build_id_of_file, split_blob, EmbedLevel, MAX_BLOB_PART,
};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;

/// Image files kept open for embedding at most; later images are embedded
/// only if their path still resolves at the end.
const MAX_OPEN_IMAGE_FILES: usize = 512;

/// An image seen during the recording, for embedding later.
#[derive(Debug)]
pub(crate) struct SeenImage {
    /// The file, opened when the image was first seen (its path through
    /// `/proc/PID/root` is gone once the process exits); `None` for the vDSO.
    pub file: Option<std::fs::File>,
    /// The path, for messages.
    pub path: String,
    /// Its kind.
    pub kind: ImageKind,
}

/// An image's range in one process, for [`Images::touch`].
struct TouchRange {
    start: u64,
    end: u64,
    id: BuildId,
    /// Whether `id` is already in the touched set.
    touched: bool,
}

/// Image book-keeping for the converter.
pub(crate) struct Images {
    embed: EmbedLevel,
    /// The images of each process, so a forked child gets its parent's.
    process_images: HashMap<u32, Vec<ImageMapRecord>>,
    /// Build ids by file identity (device, inode, mtime in ns).
    build_ids: HashMap<(u64, u64, i64), Option<BuildId>>,
    /// Images by build id, for embedding.
    seen: HashMap<BuildId, SeenImage>,
    /// vDSO bytes by build id.
    vdso: HashMap<BuildId, Vec<u8>>,
    /// Per process: image ranges sorted by start, with their build ids,
    /// to find the images samples touch. Rebuilt when marked dirty.
    touch_index: HashMap<u32, Vec<TouchRange>>,
    dirty_index: HashSet<u32>,
    touched: HashSet<BuildId>,
    /// Each thread's previous stack copy (start AVMA, bytes), so only the
    /// words that changed are looked up.
    prev_stacks: HashMap<(u32, u32), (u64, Vec<u8>)>,
    open_files: usize,
}

/// Keep at most this many threads' previous stack copies (64 KiB each at
/// most); past it they are forgotten and the next copies scanned whole.
const MAX_PREV_STACKS: usize = 4096;

impl Images {
    /// No images yet; embed at `embed` when asked.
    pub fn new(embed: EmbedLevel) -> Images {
        Images {
            embed,
            process_images: HashMap::new(),
            build_ids: HashMap::new(),
            seen: HashMap::new(),
            vdso: HashMap::new(),
            touch_index: HashMap::new(),
            dirty_index: HashSet::new(),
            touched: HashSet::new(),
            prev_stacks: HashMap::new(),
            open_files: 0,
        }
    }

    /// Whether samples should be checked for the images they touch.
    pub fn embedding(&self) -> bool {
        self.embed != EmbedLevel::None
    }

    /// Remember that `m` is mapped in its process (replacing overlapped
    /// mappings).
    pub fn remember(&mut self, m: &ImageMapRecord) {
        let list = self.process_images.entry(m.pid.0).or_default();
        list.retain(|old| old.end <= m.start || old.start >= m.end);
        list.push(m.clone());
        self.dirty_index.insert(m.pid.0);
    }

    /// The process's address space is gone (exit) or replaced (exec).
    pub fn forget_process(&mut self, pid: u32) {
        self.process_images.remove(&pid);
        self.touch_index.remove(&pid);
        self.dirty_index.insert(pid);
    }

    /// The images of `parent`, as records for its new child `child` at `time`.
    pub fn inherited(&self, parent: u32, child: u32, time: u64) -> Vec<Record> {
        self.process_images
            .get(&parent)
            .into_iter()
            .flatten()
            .map(|m| {
                Record::ImageMap(ImageMapRecord {
                    time: Timestamp(time),
                    pid: Pid(child),
                    ..m.clone()
                })
            })
            .collect()
    }

    /// Note the images a sample of thread `tid` refers to: its instruction
    /// pointer, its callchain, and the words of its stack copy (`stack`,
    /// starting at AVMA `sp`). Only words that changed since the thread's
    /// previous copy are looked up: an unchanged word was looked up when it
    /// first appeared, and every copy is scanned whole again after the
    /// process's images change. Consecutive copies share most of their
    /// words, so this is most of the recorder's per-sample work saved.
    pub fn touch_sample(
        &mut self,
        pid: u32,
        tid: u32,
        ip: u64,
        callchain: &[u64],
        sp: u64,
        stack: &[u8],
    ) {
        if self.dirty_index.contains(&pid) {
            self.prev_stacks.retain(|&(p, _), _| p != pid);
        }
        let prev = self.prev_stacks.remove(&(pid, tid));
        let words = changed_words(sp, stack, prev.as_ref());
        let addrs = std::iter::once(ip)
            .chain(callchain.iter().copied())
            .chain(words);
        self.touch(pid, addrs);
        let mut bytes = prev.map(|(_, b)| b).unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(stack);
        if self.prev_stacks.len() >= MAX_PREV_STACKS {
            self.prev_stacks.clear();
        }
        self.prev_stacks.insert((pid, tid), (sp, bytes));
    }

    /// Note that process `pid` refers to each of `addrs`: the images
    /// holding them are embedded at the end. Only images not yet touched
    /// are looked up, without hashing per address.
    pub fn touch(&mut self, pid: u32, addrs: impl IntoIterator<Item = u64>) {
        if self.dirty_index.remove(&pid) {
            let mut ranges: Vec<TouchRange> = self
                .process_images
                .get(&pid)
                .into_iter()
                .flatten()
                .filter_map(|m| {
                    let id = m.build_id.as_ref()?;
                    (!self.touched.contains(id)).then(|| TouchRange {
                        start: m.start,
                        end: m.end,
                        touched: false,
                        id: id.clone(),
                    })
                })
                .collect();
            ranges.sort_by_key(|r| r.start);
            self.touch_index.insert(pid, ranges);
        }
        let Some(ranges) = self.touch_index.get_mut(&pid) else {
            return;
        };
        let (Some(lo), Some(hi)) = (
            ranges.first().map(|r| r.start),
            ranges.iter().map(|r| r.end).max(),
        ) else {
            return;
        };
        let mut newly_touched = false;
        for addr in addrs {
            if addr < lo || addr >= hi {
                continue;
            }
            let i = ranges.partition_point(|r| r.start <= addr);
            if i == 0 {
                continue;
            }
            let r = &mut ranges[i - 1];
            if addr < r.end && !r.touched {
                r.touched = true;
                newly_touched = true;
                self.touched.insert(r.id.clone());
            }
        }
        // The index keeps only images not touched yet, so words pointing
        // into images already known cost nothing more than the bounds test.
        if newly_touched {
            ranges.retain(|r| !r.touched);
        }
    }

    /// The blobs to embed: sections of every touched image, the vDSO's
    /// bytes, and JIT maps. Problems go onto `warnings`; they never fail
    /// the recording.
    pub fn embedded_blobs(
        &mut self,
        pids: &HashSet<u32>,
        warnings: &mut Vec<RecordWarning>,
    ) -> Vec<Blob> {
        let mut out = Vec::new();
        if self.embed == EmbedLevel::None {
            return out;
        }
        let mut ids: Vec<&BuildId> = self.touched.iter().collect();
        ids.sort();
        for id in ids {
            let Some(image) = self.seen.get(id) else {
                continue;
            };
            match (&image.file, image.kind) {
                (_, ImageKind::Vdso) => {
                    if let Some(bytes) = self.vdso.get(id) {
                        let kind = BlobKind::Image;
                        out.extend(split_blob(id, kind, false, bytes.clone(), MAX_BLOB_PART));
                    }
                }
                (Some(file), ImageKind::File) => {
                    let result = file.try_clone().map_err(|e| e.to_string()).and_then(|f| {
                        blobs_for_open_file(f, id, self.embed).map_err(|e| e.to_string())
                    });
                    match result {
                        Ok(blobs) => out.extend(blobs),
                        Err(reason) => warnings.push(RecordWarning::NotEmbedded {
                            path: image.path.clone(),
                            reason,
                        }),
                    }
                }
                (None, ImageKind::File) => {
                    let reopened = std::fs::File::open(&image.path).ok().filter(|_| {
                        build_id_of_file(std::path::Path::new(&image.path)).as_ref() == Some(id)
                    });
                    match reopened.map(|f| blobs_for_open_file(f, id, self.embed)) {
                        Some(Ok(blobs)) => out.extend(blobs),
                        _ => warnings.push(RecordWarning::NotEmbedded {
                            path: image.path.clone(),
                            reason: "the file is gone or changed".into(),
                        }),
                    }
                }
                _ => {}
            }
        }
        let mut pids: Vec<u32> = pids.iter().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let host = format!("/tmp/perf-{pid}.map");
            let in_root = format!("/proc/{pid}/root/tmp/perf-{pid}.map");
            if let Some(data) = [host, in_root].iter().find_map(|p| std::fs::read(p).ok()) {
                out.extend(split_blob(
                    &BuildId(Vec::new()),
                    BlobKind::JitMap { pid: Pid(pid) },
                    false,
                    data,
                    MAX_BLOB_PART,
                ));
            }
        }
        out
    }

    pub fn record_from_maps(&mut self, t: u64, pid: u32, m: &MapsEntry) -> Option<Record> {
        if m.path == "[vsyscall]" {
            return None;
        }
        self.record(t, pid, m.start, m.end, m.offset, &m.path, None)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        t: u64,
        pid: u32,
        start: u64,
        end: u64,
        file_offset: u64,
        path: &str,
        kernel_build_id: Option<&[u8]>,
    ) -> Option<Record> {
        let kind = image_kind(path);
        let build_id = match (kernel_build_id, kind) {
            (Some(id), _) if !id.is_empty() => {
                let id = BuildId(id.to_vec());
                if kind == ImageKind::File && !self.seen.contains_key(&id) {
                    // Keep the file only if it is still the one mapped.
                    let file = self
                        .host_path(pid, start, end, path)
                        .filter(|p| build_id_of_file(p).as_ref() == Some(&id))
                        .and_then(|p| self.open_image_file(&p));
                    self.seen.insert(
                        id.clone(),
                        SeenImage {
                            file,
                            path: path.to_string(),
                            kind,
                        },
                    );
                }
                Some(id)
            }
            (_, ImageKind::File) => self.file_build_id(pid, start, end, path),
            (_, ImageKind::Vdso) => self.vdso_build_id(pid, start, end),
            _ => None,
        };
        Some(Record::ImageMap(ImageMapRecord {
            time: Timestamp(t),
            pid: Pid(pid),
            start,
            end,
            file_offset,
            path: path.to_string(),
            build_id,
            kind,
            executable: true,
        }))
    }

    /// Open an image file to embed later, within the open-file budget.
    fn open_image_file(&mut self, path: &std::path::Path) -> Option<std::fs::File> {
        if self.open_files >= MAX_OPEN_IMAGE_FILES {
            return None;
        }
        let file = std::fs::File::open(path).ok()?;
        self.open_files += 1;
        Some(file)
    }

    /// Where to read an image's file from here: through the process's root
    /// (containers), or through its mapping if the file was deleted.
    fn host_path(&self, pid: u32, start: u64, end: u64, path: &str) -> Option<std::path::PathBuf> {
        // The mapping itself reaches the file even once it is deleted.
        let mapping: std::path::PathBuf = format!("/proc/{pid}/map_files/{start:x}-{end:x}").into();
        let candidates = [
            path.strip_suffix(" (deleted)").map(|_| mapping.clone()),
            Some(procfs::root_path(pid, path)),
            Some(std::path::PathBuf::from(path)),
            Some(mapping),
        ];
        candidates.into_iter().flatten().find(|p| p.exists())
    }

    fn file_build_id(&mut self, pid: u32, start: u64, end: u64, path: &str) -> Option<BuildId> {
        let host = self.host_path(pid, start, end, path)?;
        let meta = std::fs::metadata(&host).ok()?;
        let key = (
            meta.dev(),
            meta.ino(),
            meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        );
        let id = match self.build_ids.get(&key) {
            Some(id) => id.clone(),
            None => {
                let id = build_id_of_file(&host);
                self.build_ids.insert(key, id.clone());
                id
            }
        };
        if let Some(id) = &id {
            if !self.seen.contains_key(id) {
                let file = self.open_image_file(&host);
                self.seen.insert(
                    id.clone(),
                    SeenImage {
                        file,
                        path: path.to_string(),
                        kind: ImageKind::File,
                    },
                );
            }
        }
        id
    }

    fn vdso_build_id(&mut self, pid: u32, start: u64, end: u64) -> Option<BuildId> {
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        if len > 1 << 20 {
            return None;
        }
        let bytes = sys::read_process_memory(pid, start, len).ok()?;
        let id = build_id_of_bytes(&bytes)?;
        self.seen.entry(id.clone()).or_insert(SeenImage {
            file: None,
            path: "[vdso]".to_string(),
            kind: ImageKind::Vdso,
        });
        self.vdso.entry(id.clone()).or_insert(bytes);
        Some(id)
    }
}

/// What kind of image a mapping's path names.
pub(crate) fn image_kind(path: &str) -> ImageKind {
    if path == "[vdso]" {
        ImageKind::Vdso
    } else if path.starts_with('/') && !path.starts_with("//anon") {
        ImageKind::File
    } else {
        ImageKind::Anonymous
    }
}

/// The words of `stack` (starting at AVMA `sp`) that differ from the
/// previous copy `prev` at the same address, as native-endian values.
fn changed_words<'a>(
    sp: u64,
    stack: &'a [u8],
    prev: Option<&'a (u64, Vec<u8>)>,
) -> impl Iterator<Item = u64> + 'a {
    stack.chunks_exact(8).enumerate().filter_map(move |(i, w)| {
        let addr = sp.wrapping_add(8 * i as u64);
        let same = prev.is_some_and(|(start, bytes)| {
            addr.checked_sub(*start)
                .filter(|off| off.is_multiple_of(8))
                .and_then(|off| usize::try_from(off).ok())
                .and_then(|off| bytes.get(off..off + 8))
                .is_some_and(|p| p == w)
        });
        (!same).then(|| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_kinds_from_paths() {
        assert_eq!(image_kind("/usr/lib/libc.so.6"), ImageKind::File);
        assert_eq!(image_kind("/tmp/x.so (deleted)"), ImageKind::File);
        assert_eq!(image_kind("[vdso]"), ImageKind::Vdso);
        assert_eq!(image_kind("//anon"), ImageKind::Anonymous);
        assert_eq!(image_kind(""), ImageKind::Anonymous);
    }

    fn map(pid: u32, start: u64, end: u64, id: u8) -> ImageMapRecord {
        ImageMapRecord {
            time: Timestamp(1),
            pid: Pid(pid),
            start,
            end,
            file_offset: 0,
            path: format!("/lib{id}.so"),
            build_id: Some(BuildId(vec![id])),
            kind: ImageKind::File,
            executable: true,
        }
    }

    #[test]
    fn touches_find_the_image_holding_an_address() {
        let mut images = Images::new(EmbedLevel::Symbols);
        images.remember(&map(1, 0x1000, 0x2000, 1));
        images.remember(&map(1, 0x5000, 0x6000, 2));
        images.touch(1, [0x5fff, 0x3000]); // in the second image; between images
        images.touch(2, [0x1000]); // another process
        assert_eq!(images.touched, HashSet::from([BuildId(vec![2])]));
        // A new mapping over the first replaces it.
        images.remember(&map(1, 0x1000, 0x2000, 3));
        images.touch(1, [0x1800]);
        assert!(images.touched.contains(&BuildId(vec![3])));
        assert!(!images.touched.contains(&BuildId(vec![1])));
    }

    #[test]
    fn only_changed_stack_words_are_looked_up_until_the_images_change() {
        let mut images = Images::new(EmbedLevel::Symbols);
        images.remember(&map(1, 0x1000, 0x2000, 1));
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        // First copy: a word into image 1 is found.
        images.touch_sample(1, 7, 0, &[], 0x8000, &words(&[0x1234, 0x9999]));
        assert!(images.touched.contains(&BuildId(vec![1])));
        // Image 2 is mapped where an unchanged word of the next copy
        // already pointed: the images changed, so the copy is scanned whole.
        images.remember(&map(1, 0x9000, 0xa000, 2));
        images.touch_sample(1, 7, 0, &[], 0x8000, &words(&[0x1234, 0x9999]));
        assert!(images.touched.contains(&BuildId(vec![2])));
        // Words equal to the previous copy's at the same address are skipped,
        // changed and new words are looked up (here, one sp lower).
        images.remember(&map(1, 0xb000, 0xc000, 3));
        images.touch_sample(1, 7, 0, &[], 0x8000, &words(&[0x1234, 0x9999]));
        images.remember(&map(1, 0xd000, 0xe000, 4));
        images.touch_sample(1, 7, 0, &[], 0x8000, &words(&[0x1234, 0x9999]));
        assert!(!images.touched.contains(&BuildId(vec![3])));
        images.touch_sample(1, 7, 0, &[], 0x7ff8, &words(&[0xb010, 0x1234, 0x9999]));
        assert!(images.touched.contains(&BuildId(vec![3])));
        assert!(!images.touched.contains(&BuildId(vec![4])));
        // changed_words itself: only the differing, aligned words.
        let prev = (0x100u64, words(&[1, 2, 3]));
        let changed: Vec<u64> = changed_words(0xf8, &words(&[9, 1, 5, 3]), Some(&prev)).collect();
        assert_eq!(changed, vec![9, 5]);
        let misaligned: Vec<u64> = changed_words(0x104, &words(&[1, 2]), Some(&prev)).collect();
        assert_eq!(misaligned, vec![1, 2]);
    }

    #[test]
    fn children_inherit_their_parents_images() {
        let mut images = Images::new(EmbedLevel::None);
        images.remember(&map(1, 0x1000, 0x2000, 1));
        let inherited = images.inherited(1, 9, 50);
        let [Record::ImageMap(m)] = &inherited[..] else {
            panic!("{inherited:?}")
        };
        assert_eq!((m.pid, m.time, m.start), (Pid(9), Timestamp(50), 0x1000));
        images.forget_process(1);
        assert!(images.inherited(1, 9, 60).is_empty());
    }
}
