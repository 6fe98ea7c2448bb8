//! The images of each recorded process: their build ids (from the kernel,
//! the ELF file or the vDSO's memory), which ones samples touched, and
//! what of them to embed when recording ends: their sections, and a frame
//! table of the addresses the trace refers to. Runs on the writer thread.

use super::procfs::{self, MapsEntry};
use super::replica::Rebuilt;
use super::spaces::AddressSpaces;
use super::sys;
use super::touched::{SampleRefs, Touched};
use crate::report::RecordWarning;
use crate::sink::FramesNamed;
use lrnprof_format::{
    Blob, BlobKind, BuildId, ImageKind, ImageMapRecord, Pid, Record, StackHint, Timestamp,
};
use lrnprof_image::{
    blobs_for_open_file, blobs_for_touched_file, build_id_of_bytes, build_id_of_file,
    frame_table_for_file, split_blob, EmbedLevel, FrameCache, FrameRequest, FRAMES_TABLE,
    MAX_BLOB_PART, SYMBOL_SECTIONS,
};
use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
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
    /// The root directory of the process that mapped it, held open, where
    /// that is not ours (a container, a chroot): its debug files, `.dwo`
    /// files and supplementary files are looked for under it, through
    /// `/proc/self/fd/N`, which stays valid after the process exits.
    pub root: Option<std::sync::Arc<std::fs::File>>,
}

/// Most bytes of one image's frame table, and of all of them: past it the
/// addresses left out are named from the image's symbol table only, and
/// the recorder says so.
const MAX_FRAME_TABLE_BYTES: usize = 4 << 20;
const MAX_FRAME_TABLES_BYTES: usize = 16 << 20;

/// Where a process writes its perf map (`/tmp/perf-PID.map`, by the pid
/// it sees, in the `/tmp` it sees).
struct JitPlace {
    /// Its pid in its own PID namespace, where that is not ours.
    own_pid: Option<u32>,
    /// Its `/tmp`, open, where it may not be ours.
    tmp: Option<std::fs::File>,
}

/// Image book-keeping for the converter.
pub(crate) struct Images {
    embed: EmbedLevel,
    /// The images of each process over time, so a forked child gets its
    /// parent's.
    spaces: AddressSpaces,
    /// Build ids by file identity (device, inode, mtime in ns).
    build_ids: HashMap<(u64, u64, i64), Option<BuildId>>,
    /// Images by build id, for embedding.
    seen: HashMap<BuildId, SeenImage>,
    /// vDSO bytes by build id.
    vdso: HashMap<BuildId, Vec<u8>>,
    /// What samples touched.
    touched: Touched,
    open_files: usize,
    /// Roots of processes that are not ours, open, by device and inode.
    roots: HashMap<(u64, u64), std::sync::Arc<std::fs::File>>,
    /// Where each process with anonymous executable memory (JIT code)
    /// writes its perf map, learned while it runs: the pid it sees itself
    /// as (in a PID namespace: a container's) and its `/tmp` if that may
    /// not be ours.
    jit_places: HashMap<u32, JitPlace>,
    /// Frame tables kept between recordings.
    cache: Option<FrameCache>,
    /// Code addresses named in the frame tables so far, and how many of
    /// them came from `cache`.
    named: std::cell::Cell<FramesNamed>,
}

impl Images {
    /// No images yet; embed at `embed` when asked.
    pub fn new(embed: EmbedLevel) -> Images {
        Images {
            embed,
            spaces: AddressSpaces::default(),
            build_ids: HashMap::new(),
            seen: HashMap::new(),
            vdso: HashMap::new(),
            // Frame tables name frames: they come with symbols.
            touched: Touched::new(embed >= EmbedLevel::Symbols),
            open_files: 0,
            roots: HashMap::new(),
            jit_places: HashMap::new(),
            cache: None,
            named: Default::default(),
        }
    }

    /// What the frame tables built so far named, and how much of it the
    /// frame cache had kept.
    pub fn frames_named(&self) -> FramesNamed {
        self.named.get()
    }

    /// Take addresses resolved by earlier recordings from `cache`, and
    /// keep there those this one resolves.
    pub fn with_cache(mut self, cache: Option<FrameCache>) -> Images {
        self.cache = cache;
        self
    }

    /// Whether samples should be checked for the images they touch.
    pub fn embedding(&self) -> bool {
        self.embed != EmbedLevel::None
    }

    /// Remember that `m` is mapped in its process from its time on
    /// (replacing overlapped mappings). Returns the records of children
    /// forked after it, heard before it, that get a copy.
    pub fn remember(&mut self, m: &ImageMapRecord) -> Vec<ImageMapRecord> {
        let (changed, given) = self.spaces.map(m);
        self.changed(&changed);
        given
    }

    /// Process `pid`'s address space is gone (exit) or replaced (exec) at
    /// `time`.
    pub fn forget_process(&mut self, pid: u32, time: u64) {
        self.spaces.replace(pid, time);
        self.changed(&[pid]);
    }

    /// The images `parent` had mapped at `time`, as records for its new
    /// child `child`, forked then.
    pub fn inherited(&mut self, parent: u32, child: u32, time: u64) -> Vec<Record> {
        let copies = self.spaces.fork(parent, child, time);
        self.changed(&[child]);
        copies.into_iter().map(Record::ImageMap).collect()
    }

    fn changed(&mut self, pids: &[u32]) {
        for &pid in pids {
            self.touched.mappings_changed(pid);
            if self.spaces.current().contains_key(&pid) {
                self.touched.mappings_known(self.spaces.current(), pid);
            }
        }
    }

    /// Every ring has been read past time `before` (see
    /// [`Touched::round`]).
    pub fn round(&mut self, before: u64) {
        let spaces = &self.spaces;
        self.touched.round(spaces.current(), before, |pid, time| {
            spaces.then_if_ended(pid, time)
        });
    }

    /// Note the images a sample refers to, and the code addresses in them
    /// (see [`Touched`]).
    pub fn touch_sample(&mut self, sample: &SampleRefs<'_>) -> StackHint {
        let then = self.spaces.then_if_ended(sample.pid, sample.time);
        self.touched
            .sample(self.spaces.current(), then.as_deref(), sample)
    }

    /// Like [`touch_sample`](Self::touch_sample), for a copy put together
    /// from the blocks that changed (see [`Touched::sample_rebuilt`]).
    pub fn touch_rebuilt(
        &mut self,
        sample: &SampleRefs<'_>,
        id: u64,
        rebuilt: &Rebuilt,
    ) -> StackHint {
        let then = self.spaces.then_if_ended(sample.pid, sample.time);
        self.touched
            .sample_rebuilt(self.spaces.current(), then.as_deref(), sample, id, rebuilt)
    }

    /// A number for a stack copy, given to no other.
    pub fn next_stack_id(&mut self) -> u64 {
        self.touched.next_id()
    }

    /// Keep `runs`, a [`StackHint`]'s, for a later sample's hint.
    pub fn recycle_runs(&mut self, runs: Vec<(u32, u32)>) {
        self.touched.recycle_runs(runs);
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
        let mut table_budget = MAX_FRAME_TABLES_BYTES;
        // At `debug` the DWARF travels and the analyzer names frames with
        // it and the symbol tables, not from the frame table.
        let symbols_only = self.embed == EmbedLevel::Symbols;
        for id in self.touched.touched_ids() {
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
                    let result = file
                        .try_clone()
                        .map_err(|e| e.to_string())
                        .and_then(|f| self.image_blobs(id, f).map_err(|e| e.to_string()));
                    match result {
                        Ok(blobs) => {
                            let (table, w, complete) =
                                self.frame_table(id, image, file, &mut table_budget);
                            out.extend(without_named_sections(blobs, complete && symbols_only));
                            out.extend(table);
                            warnings.extend(w);
                        }
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
                    let blobs = reopened.map(|f| {
                        let blobs = self
                            .image_blobs(id, f.try_clone()?)
                            .map_err(std::io::Error::other)?;
                        Ok::<_, std::io::Error>((f, blobs))
                    });
                    match blobs {
                        Some(Ok((file, blobs))) => {
                            let (table, w, complete) =
                                self.frame_table(id, image, &file, &mut table_budget);
                            out.extend(without_named_sections(blobs, complete && symbols_only));
                            out.extend(table);
                            warnings.extend(w);
                        }
                        _ => warnings.push(RecordWarning::NotEmbedded {
                            path: image.path.clone(),
                            reason: "the file is gone or changed".into(),
                        }),
                    }
                }
                _ => {}
            }
        }
        // The cache directory fails alike for every image: once is enough.
        let mut cache_warned = false;
        warnings.retain(|w| {
            !matches!(w, RecordWarning::FrameCacheNotUpdated { .. })
                || !std::mem::replace(&mut cache_warned, true)
        });
        let mut pids: Vec<u32> = pids.iter().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let place = self.jit_places.get(&pid);
            let own = place.and_then(|p| p.own_pid).unwrap_or(pid);
            let mut places = Vec::new();
            // In its own /tmp (a container's, open since it ran), by the
            // pid it knows itself by; in ours, by either.
            match place.and_then(|p| p.tmp.as_ref()) {
                Some(tmp) => {
                    let fd = tmp.as_raw_fd();
                    places.push(format!("/proc/self/fd/{fd}/perf-{own}.map"));
                }
                None => places.push(format!("/tmp/perf-{own}.map")),
            }
            places.push(format!("/tmp/perf-{pid}.map"));
            places.push(format!("/proc/{pid}/root/tmp/perf-{own}.map"));
            places.dedup();
            if let Some(data) = places.iter().find_map(|p| std::fs::read(p).ok()) {
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

    /// The blobs of image `id` (its file `file`) at the embed level: with
    /// only the `.eh_frame` entries the trace's code addresses reach when
    /// they are all known (none left out past the cap), else with the
    /// whole section.
    fn image_blobs(
        &self,
        id: &BuildId,
        file: std::fs::File,
    ) -> Result<Vec<Blob>, lrnprof_image::ImageError> {
        // Code addresses are collected from `symbols` on (see `new`);
        // `debug` keeps whole sections.
        let lookups = match self.touched.image(id) {
            Some(t) if t.left_out == 0 && self.embed == EmbedLevel::Symbols => t.lookups(),
            _ => Vec::new(),
        };
        if lookups.is_empty() {
            return blobs_for_open_file(file, id, self.embed);
        }
        blobs_for_touched_file(file, id, self.embed, &lookups).map(|(blobs, _)| blobs)
    }

    /// The frame table of image `id` (its file `file`), within what is
    /// left of `budget` bytes, a warning if addresses were left out, and
    /// whether it holds every code address the trace refers to in the
    /// image (then nothing else is needed to name them).
    fn frame_table(
        &self,
        id: &BuildId,
        image: &SeenImage,
        file: &std::fs::File,
        budget: &mut usize,
    ) -> (Vec<Blob>, Vec<RecordWarning>, bool) {
        let lookups = match self.touched.image(id) {
            Some(t) if self.embed >= EmbedLevel::Symbols => t.lookups(),
            _ => Vec::new(),
        };
        if lookups.is_empty() {
            return (Vec::new(), Vec::new(), false);
        }
        let incomplete = |reason: String| {
            Some(RecordWarning::FrameTableIncomplete {
                path: image.path.clone(),
                reason,
            })
        };
        // Without a table, an analysis without the image's files lacks
        // its inline frames and file:line: say so.
        let no_table = |e: &dyn std::fmt::Display| {
            incomplete(format!(
                "{e}; no frame table: its {} code addresses are named from its symbol \
                 table only, without inline frames and file:line, where the trace is \
                 analyzed without the image's files",
                lookups.len()
            ))
        };
        let file = match file.try_clone() {
            Ok(f) => f,
            Err(e) => return (Vec::new(), no_table(&e).into_iter().collect(), false),
        };
        let path = image.path.strip_suffix(" (deleted)").unwrap_or(&image.path);
        // A container's own debug files, through its root held open.
        let roots: Vec<std::path::PathBuf> = image
            .root
            .iter()
            .map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()).into())
            .collect();
        let built = frame_table_for_file(FrameRequest {
            file,
            path,
            build_id: id,
            file_offsets: &lookups,
            max_bytes: MAX_FRAME_TABLE_BYTES.min(*budget),
            debug_roots: &roots,
            // Images without DWARF get a table too: their symbol tables
            // then need not travel.
            symbols_alone: true,
            cache: self.cache.as_ref(),
        });
        let built = match built {
            Ok(Some(built)) => built,
            Ok(None) => return (Vec::new(), Vec::new(), false),
            Err(e) => return (Vec::new(), no_table(&e).into_iter().collect(), false),
        };
        *budget = budget.saturating_sub(built.bytes.len());
        let named = self.named.get();
        self.named.set(FramesNamed {
            addresses: named.addresses + built.addresses as u64,
            from_cache: named.from_cache + built.from_cache as u64,
        });
        let kind = BlobKind::Table {
            name: FRAMES_TABLE.to_string(),
        };
        let blobs = split_blob(id, kind, false, built.bytes, MAX_BLOB_PART);
        let left_out = built.left_out as u64 + self.touched.image(id).map_or(0, |t| t.left_out);
        let warning = (left_out > 0).then(|| {
            incomplete(format!(
                "{left_out} of {} code addresses left out (frame tables are capped at {} KiB \
                 per image and {} KiB in all); those are named from its symbol table only",
                left_out + built.addresses as u64,
                MAX_FRAME_TABLE_BYTES >> 10,
                MAX_FRAME_TABLES_BYTES >> 10
            ))
        });
        let split = built.split_dwarf_missing.as_ref().map(|(units, first)| {
            let looked = first
                .as_ref()
                .map(|p| format!(" (the first was looked for at {})", p.display()))
                .unwrap_or_default();
            incomplete(format!(
                "the split DWARF (.dwo files, -gsplit-dwarf) of {units} of its compilation \
                 units was not found{looked}: their functions are named from the symbol \
                 table, without inline frames; keep the .dwo files where the compiler wrote \
                 them, or put a .dwp package (dwp, llvm-dwp) beside the image"
            ))
        });
        let alt = built.alt_file_missing.as_ref().map(|name| {
            incomplete(format!(
                "its DWARF refers to a supplementary debug file (dwz) that was not found: \
                 {}; the names and inline functions it holds are missing (install the \
                 package that ships it, usually beside the debug package)",
                name.display()
            ))
        });
        let complete = left_out == 0 && built.addresses == lookups.len();
        let not_kept = built
            .cache_error
            .map(|reason| RecordWarning::FrameCacheNotUpdated { reason });
        (
            blobs,
            warning
                .flatten()
                .into_iter()
                .chain(split.flatten())
                .chain(alt.flatten())
                .chain(not_kept)
                .collect(),
            complete,
        )
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
                    let root = self.root_of(pid);
                    self.seen.insert(
                        id.clone(),
                        SeenImage {
                            file,
                            path: path.to_string(),
                            kind,
                            root,
                        },
                    );
                }
                Some(id)
            }
            (_, ImageKind::File) => self.file_build_id(pid, start, end, path),
            (_, ImageKind::Vdso) => self.vdso_build_id(pid, start, end),
            (_, ImageKind::Anonymous) => {
                if !self.jit_places.contains_key(&pid) {
                    let place = JitPlace {
                        own_pid: procfs::namespaced_pid(pid),
                        tmp: self.jit_tmp(pid),
                    };
                    self.jit_places.insert(pid, place);
                }
                None
            }
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

    /// The root directory of process `pid`, open, if it is not ours (the
    /// process runs in a container or a chroot); `None` if it is ours or
    /// cannot be read.
    fn root_of(&mut self, pid: u32) -> Option<std::sync::Arc<std::fs::File>> {
        let theirs = std::fs::metadata(procfs::root_path(pid, "")).ok()?;
        let ours = std::fs::metadata("/").ok()?;
        let key = (theirs.dev(), theirs.ino());
        if key == (ours.dev(), ours.ino()) {
            return None;
        }
        if let Some(root) = self.roots.get(&key) {
            return Some(root.clone());
        }
        let root = std::sync::Arc::new(std::fs::File::open(procfs::root_path(pid, "")).ok()?);
        self.roots.insert(key, root.clone());
        Some(root)
    }

    /// The `/tmp` directory process `pid` sees, open, if it may not be
    /// ours: its root is not, or it has a mount namespace of its own (a
    /// container's private `/tmp`). Open, it stays readable after the
    /// process exits, even where its namespace and mounts go with it.
    /// Counted with the image files kept open: past that budget a later
    /// process's map is read by path at the end.
    fn jit_tmp(&mut self, pid: u32) -> Option<std::fs::File> {
        let same = |a: &str, b: &str| {
            let id = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
            id(a).is_some_and(|a| Some(a) == id(b))
        };
        if same(&format!("/proc/{pid}/ns/mnt"), "/proc/self/ns/mnt")
            && same(&procfs::root_path(pid, "").to_string_lossy(), "/")
        {
            return None;
        }
        self.open_image_file(&procfs::root_path(pid, "/tmp"))
    }

    /// Open an image file to embed later (or a container's `/tmp`, see
    /// [`Self::jit_tmp`]), within the open-file budget.
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
        candidates
            .into_iter()
            .flatten()
            .find(|p| p.exists())
            .or_else(|| {
                // The main thread has ended: its root and mappings are gone.
                let tid = procfs::other_live_thread(pid)?;
                self.host_path(tid, start, end, path)
            })
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
                let root = self.root_of(pid);
                self.seen.insert(
                    id.clone(),
                    SeenImage {
                        file,
                        path: path.to_string(),
                        kind: ImageKind::File,
                        root,
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
        let read = |pid: u32, start: u64| {
            sys::read_process_memory(pid, start, len)
                .or_else(|e| match procfs::other_live_thread(pid) {
                    Some(tid) => sys::read_process_memory(tid, start, len),
                    None => Err(e),
                })
                .ok()
        };
        let bytes = match read(pid, start) {
            Some(bytes) => bytes,
            // Gone before its vDSO was read (a short-lived process). The
            // kernel maps the same vDSO into every process of an ABI: one
            // of the same size read from another process, or the
            // recorder's own, is it.
            None => {
                let mut same_size = self.vdso.iter().filter(|(_, b)| b.len() == len);
                if let (Some((id, _)), None) = (same_size.next(), same_size.next()) {
                    return Some(id.clone());
                }
                let me = std::process::id();
                let own = procfs::read_maps(me)
                    .ok()?
                    .into_iter()
                    .find(|m| m.path == "[vdso]" && m.end - m.start == len as u64)?;
                read(me, own.start)?
            }
        };
        let id = build_id_of_bytes(&bytes)?;
        self.seen.entry(id.clone()).or_insert(SeenImage {
            file: None,
            path: "[vdso]".to_string(),
            kind: ImageKind::Vdso,
            root: None,
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

/// `blobs` of one image without the sections an analyzer derives from
/// others: `.eh_frame_hdr` is a sorted index of `.eh_frame` (which the
/// analyzer makes again from `.eh_frame` when the header is missing) and
/// compresses badly, about a quarter of what the unwind tables of a large
/// image take in the trace.
fn without_derived_sections(mut blobs: Vec<Blob>) -> Vec<Blob> {
    let is_section = |b: &Blob, section: &str| matches!(&b.kind, BlobKind::Section { name, .. } if name == section);
    if blobs.iter().any(|b| is_section(b, ".eh_frame")) {
        blobs.retain(|b| !is_section(b, ".eh_frame_hdr"));
    }
    blobs
}

/// `blobs` of one image without the sections an analyzer derives from
/// others ([`without_derived_sections`]) and, when its frame table names
/// every code address of the trace in it (`table_complete`) and it has
/// unwind tables, without its symbol tables: the analyzer names an image's
/// addresses from the table first, and reads symbol tables otherwise only
/// for the AArch64 leaf heuristic (frameless leaves in images without
/// unwind tables), so on AArch64 they stay.
fn without_named_sections(blobs: Vec<Blob>, table_complete: bool) -> Vec<Blob> {
    let mut blobs = without_derived_sections(blobs);
    let name = |b: &Blob| match &b.kind {
        BlobKind::Section { name, .. } => Some(name.clone()),
        _ => None,
    };
    let unwinds = blobs
        .iter()
        .any(|b| matches!(name(b).as_deref(), Some(".eh_frame" | ".debug_frame")));
    if table_complete && unwinds && !cfg!(target_arch = "aarch64") {
        blobs.retain(|b| !name(b).is_some_and(|n| SYMBOL_SECTIONS.contains(&n.as_str())));
    }
    blobs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob of section `name` of a made-up image.
    fn section_blob(name: &str) -> Blob {
        Blob {
            build_id: BuildId(vec![1]),
            kind: BlobKind::Section {
                name: name.into(),
                svma: 0x1000,
            },
            compressed: false,
            offset: 0,
            total_len: 4,
            data: vec![0; 4],
        }
    }

    /// The names of `blobs`, all sections.
    fn section_names(blobs: Vec<Blob>) -> Vec<String> {
        blobs
            .into_iter()
            .map(|b| match b.kind {
                BlobKind::Section { name, .. } => name,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn symbol_tables_stay_unless_the_frame_table_names_everything() {
        let blob = section_blob;
        let names = section_names;
        let all = || {
            [
                ".eh_frame",
                ".dynsym",
                ".dynstr",
                ".symtab",
                ".strtab",
                ".rela.plt",
                ".lrnprof.layout",
            ]
            .map(blob)
            .to_vec()
        };
        assert_eq!(names(without_named_sections(all(), false)).len(), 7);
        let complete = names(without_named_sections(all(), true));
        if cfg!(target_arch = "aarch64") {
            assert_eq!(complete.len(), 7);
        } else {
            assert_eq!(complete, [".eh_frame", ".lrnprof.layout"]);
        }
        // Without unwind tables the symbols stay, whatever the table.
        let no_unwind = vec![blob(".dynsym"), blob(".dynstr")];
        assert_eq!(names(without_named_sections(no_unwind, true)).len(), 2);
    }

    #[test]
    fn the_eh_frame_index_is_left_out_only_beside_the_eh_frame() {
        let blob = section_blob;
        let names = section_names;
        let all = vec![blob(".dynsym"), blob(".eh_frame_hdr"), blob(".eh_frame")];
        assert_eq!(
            names(without_derived_sections(all)),
            [".dynsym", ".eh_frame"]
        );
        // Without the `.eh_frame` the index is all there is: kept.
        let alone = vec![blob(".eh_frame_hdr"), blob(".debug_frame")];
        assert_eq!(
            names(without_derived_sections(alone)),
            [".eh_frame_hdr", ".debug_frame"]
        );
    }

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
    fn a_mapping_over_another_replaces_it_for_samples() {
        let mut images = Images::new(EmbedLevel::Symbols);
        images.remember(&map(1, 0x1000, 0x2000, 1));
        images.remember(&map(1, 0x5000, 0x6000, 2));
        images.remember(&map(1, 0x1000, 0x2000, 3));
        images.touch_sample(&SampleRefs {
            pid: 1,
            tid: 1,
            ip: 0x1800,
            lr: None,
            callchain: &[],
            sp: 0,
            time: 1,
            stack: &[],
            words32: false,
        });
        let ids: Vec<&BuildId> = images.touched.touched_ids();
        assert_eq!(ids, [&BuildId(vec![3])]);
    }

    /// A sample heard after its process's exit (or exec) from another
    /// CPU's ring refers to what the process had mapped when it was taken,
    /// also when that mapping is heard later still.
    #[test]
    fn a_sample_heard_after_its_process_ended_finds_its_images() {
        let mut images = Images::new(EmbedLevel::Symbols);
        images.remember(&ImageMapRecord {
            time: Timestamp(10),
            ..map(1, 0x1000, 0x2000, 1)
        });
        images.forget_process(1, 30);
        images.remember(&ImageMapRecord {
            time: Timestamp(40),
            ..map(1, 0x1000, 0x2000, 2)
        });
        for (time, ip) in [(20, 0x1800), (50, 0x1900), (25, 0x17100)] {
            images.touch_sample(&SampleRefs {
                pid: 1,
                tid: 1,
                ip,
                lr: None,
                callchain: &[],
                sp: 0,
                time,
                stack: &[],
                words32: false,
            });
        }
        let ips = |images: &Images, id: u8| {
            let mut ips: Vec<u64> = images
                .touched
                .image(&BuildId(vec![id]))
                .unwrap()
                .ips
                .iter()
                .copied()
                .collect();
            ips.sort_unstable();
            ips
        };
        assert_eq!(ips(&images, 1), [0x800]);
        assert_eq!(ips(&images, 2), [0x900]);
        // Mapped before the sample at 25, heard after it and the exit.
        images.remember(&ImageMapRecord {
            time: Timestamp(15),
            ..map(1, 0x17000, 0x18000, 4)
        });
        images.round(26);
        assert_eq!(ips(&images, 4), [0x100]);
    }

    /// This test binary, as if mapped in a process of ours with a sample
    /// in this function: the bytes of its embedded frame table, and the
    /// warnings. `None` when the binary has no build id.
    fn embed_this_function(cache: Option<FrameCache>) -> Option<(Vec<u8>, Vec<RecordWarning>)> {
        let exe = std::env::current_exe().unwrap();
        let path = exe.to_str().unwrap();
        let pid = std::process::id();
        let mut images = Images::new(EmbedLevel::Symbols).with_cache(cache);
        // Mapped from file offset 0 at 0x10000: an AVMA is 0x10000 + offset.
        let Some(Record::ImageMap(m)) =
            images.record(1, pid, 0x10000, 0x10000 + (64 << 20), 0, path, None)
        else {
            panic!("no image record");
        };
        let Some(id) = m.build_id.clone() else {
            // Like the end-to-end tests: under CI a check not made fails.
            let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
            assert!(!ci, "this test binary has no build id");
            return None;
        };
        images.remember(&m);
        // Some code address: where this function's code is, in the file.
        let here = embed_this_function as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let offset = maps
            .lines()
            .find_map(|l| {
                let e = &procfs::parse_maps(l)[0];
                (e.start <= here && here < e.end && e.path == path)
                    .then(|| here - e.start + e.offset)
            })
            .expect("this function's mapping");
        images.touch_sample(&SampleRefs {
            pid,
            tid: pid,
            ip: 0x10000 + offset,
            lr: None,
            callchain: &[],
            sp: 0,
            time: 1,
            stack: &[],
            words32: false,
        });
        let mut warnings = Vec::new();
        let blobs = images.embedded_blobs(&HashSet::new(), &mut warnings);
        let table = blobs
            .into_iter()
            .find(|b| {
                b.build_id == id
                    && matches!(&b.kind, BlobKind::Table { name } if name == FRAMES_TABLE)
            })
            .expect("a frame table");
        Some((table.data, warnings))
    }

    /// This test binary, as if mapped in a process of ours: its sections
    /// and the frame table of a sampled address are embedded.
    #[test]
    fn a_touched_image_with_dwarf_gets_a_frame_table() {
        let Some((table, warnings)) = embed_this_function(None) else {
            return;
        };
        assert!(warnings.is_empty(), "{warnings:?}");
        let table = lrnprof_image::FrameTable::parse(&table).unwrap();
        assert_eq!(table.len(), 1);
        let lines = &table.entries()[0].1;
        assert!(
            lines
                .last()
                .is_some_and(|l| l.function.ends_with("embed_this_function")),
            "{lines:?}"
        );
    }

    /// A recording keeps its frame tables in the cache (an entry appears);
    /// the next one with the same addresses embeds the same table (that it
    /// comes from the cache is tested in `lrnprof-image`). A cache that
    /// cannot be written costs the trace nothing and is said once.
    #[test]
    fn frame_tables_are_kept_between_recordings() {
        let root = std::env::temp_dir().join(format!("lrnprof-rec-frames-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let Some((uncached, _)) = embed_this_function(None) else {
            return;
        };
        let cache = FrameCache::new(&root);
        let (first, warnings) = embed_this_function(Some(cache.clone())).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(first, uncached);
        let entries = || std::fs::read_dir(cache.dir()).map_or(0, |d| d.count());
        assert_eq!(entries(), 1, "this binary's entry is kept");
        let (second, _) = embed_this_function(Some(cache.clone())).unwrap();
        assert_eq!(second, uncached);
        std::fs::remove_dir_all(&root).unwrap();
        // A file where the directory should be: not even root writes there.
        std::fs::write(&root, b"not a directory").unwrap();
        let (third, warnings) = embed_this_function(Some(FrameCache::new(&root))).unwrap();
        assert_eq!(third, uncached);
        let [RecordWarning::FrameCacheNotUpdated { reason }] = &warnings[..] else {
            panic!("{warnings:?}");
        };
        assert!(reason.contains(&root.display().to_string()), "{reason}");
        std::fs::remove_file(&root).unwrap();
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
        images.forget_process(1, 55);
        assert!(images.inherited(1, 10, 60).is_empty());
    }
}
