//! What every command shares: opening a trace, the first pass, loading
//! images, building one unwinder per process generation, and unwinding one
//! sample into frames.

use crate::address::{Avma, FileOffset, Svma};
use crate::error::AnalyzeError;
use crate::image::{load_image, ImageData, LoadedImage, LocateOptions};
use crate::kept::KeptBlocks;
use crate::options::{AnalyzeOptions, Progress, SampleFilter};
use crate::symbolicate::JitMap;
use crate::timeline::{chunk_blocks, generation_index, scan, Generation, Mapping, Timeline};
use crate::unwind::{
    ArchCache, ArchUnwinder, ModuleCache, Unwound, MAX_FRAMES, MAX_GENERATIONS_SHARING_CACHE,
};
use lrnprof_format::{
    Arch, BlockInfo, Endian, ImageKind, Pid, Record, Regs, Sample, SampleKind, Tid, Timestamp,
    TraceReader,
};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A frame before symbolication: its lookup address (a return address
/// already moved back into its call instruction) in the address space
/// that can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum FrameKey {
    /// In image `image` (index into [`Prepared::images`]), whose data was
    /// found: its symbols and DWARF are looked up at `svma`.
    Image { image: u32, svma: Svma },
    /// In image `image` without data: only where in its file is known.
    Unresolved { image: u32, offset: FileOffset },
    /// Outside every image (JIT code, or an address no mapping holds): only
    /// process `pid`'s JIT map can name it.
    Outside { pid: Pid, avma: Avma },
    /// In the kernel: the kernel's symbol table names it.
    Kernel { avma: Avma },
}

impl FrameKey {
    /// The image the frame lies in, if any.
    pub fn image(&self) -> Option<u32> {
        match *self {
            FrameKey::Image { image, .. } | FrameKey::Unresolved { image, .. } => Some(image),
            FrameKey::Outside { .. } | FrameKey::Kernel { .. } => None,
        }
    }

    /// The address as the profile shows it ([`Location::address`](crate::Location)).
    pub fn address(&self) -> u64 {
        match *self {
            FrameKey::Image { svma, .. } => svma.0,
            FrameKey::Unresolved { offset, .. } => offset.0,
            FrameKey::Outside { avma, .. } | FrameKey::Kernel { avma } => avma.0,
        }
    }
}

/// Per process: each generation of its image map, its unwinder, and each
/// mapping's bias (AVMA minus SVMA, 0 for images without data).
struct ProcessUnwind {
    generations: Vec<Generation>,
    unwinders: Vec<ArchUnwinder>,
    biases: Vec<Vec<u64>>,
}

/// The image map in effect for a sample.
#[derive(Clone, Copy)]
pub(crate) struct GenerationRef<'p> {
    /// Index of the generation in its process.
    pub index: usize,
    pub mappings: &'p [Mapping],
    biases: &'p [u64],
    pub unwinder: &'p ArchUnwinder,
}

/// The bytes of a trace file: mapped, so that memory holds only the pages
/// being read (the passes [`release`](Self::release) what they are done
/// with); read whole where the file cannot be mapped.
#[derive(Clone)]
pub(crate) enum TraceBytes {
    Mapped(Arc<memmap2::Mmap>),
    Read(Arc<Vec<u8>>),
}

impl AsRef<[u8]> for TraceBytes {
    fn as_ref(&self) -> &[u8] {
        match self {
            TraceBytes::Mapped(m) => m,
            TraceBytes::Read(v) => v,
        }
    }
}

impl TraceBytes {
    /// The trace at `path`; `-` reads it from standard input.
    fn open(path: &Path) -> std::io::Result<TraceBytes> {
        if path == Path::new("-") {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)?;
            return Ok(TraceBytes::Read(Arc::new(bytes)));
        }
        let file = std::fs::File::open(path)?;
        // Safety: the map is read-only and lives as long as the reader that
        // uses it. Should another process truncate the file while it is
        // mapped, reading the lost pages faults (SIGBUS): analyzing a trace
        // needs the file to stay as it is, which a recorder that only
        // appends also respects.
        match unsafe { memmap2::Mmap::map(&file) } {
            Ok(map) => Ok(TraceBytes::Mapped(Arc::new(map))),
            Err(_) => Ok(TraceBytes::Read(Arc::new(std::fs::read(path)?))),
        }
    }

    /// Drop the pages of `blocks` from memory: a pass that is done with
    /// them keeps the resident set independent of the trace's length.
    pub fn release(&self, blocks: &[BlockInfo]) {
        let (Some(first), Some(last)) = (blocks.first(), blocks.last()) else {
            return;
        };
        let TraceBytes::Mapped(map) = self else {
            return;
        };
        let start = first.offset.0 as usize;
        let end = (last.offset.0 + last.header.total_len()) as usize;
        // Pages only: the first and last may hold bytes of other blocks,
        // which are read again from the file if needed.
        if end > start && end <= map.len() {
            // Safety: for a read-only shared file mapping, MADV_DONTNEED
            // only drops the page-table entries; the next read faults the
            // same bytes back in from the file. No data is lost.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

/// Open `path`, checking the `--symbols` directories first.
pub(crate) fn open(
    path: &Path,
    options: &AnalyzeOptions,
) -> Result<TraceReader<TraceBytes>, AnalyzeError> {
    for dir in &options.symbols_dirs {
        if !dir.is_dir() {
            return Err(AnalyzeError::SymbolsDir(dir.clone()));
        }
    }
    if options.debuginfod {
        crate::image::debuginfod_usable().map_err(AnalyzeError::Debuginfod)?;
    }
    let error = |source| AnalyzeError::Trace {
        path: path.to_path_buf(),
        source,
    };
    let bytes = TraceBytes::open(path).map_err(|e| error(e.into()))?;
    TraceReader::new(bytes).map_err(error)
}

/// The most worker threads a pool may have. Far more threads than CPUs
/// gain nothing, and too many cannot even start: each needs a few memory
/// mappings, and a thread that cannot map its signal stack panics before
/// it runs, while the pool waits for it forever (`-j 100000` hung so).
pub const MAX_JOBS: usize = 1024;

/// A worker pool of `jobs` threads (0: one per CPU), at most [`MAX_JOBS`].
pub fn pool(jobs: usize) -> Result<rayon::ThreadPool, AnalyzeError> {
    if jobs > MAX_JOBS {
        return Err(AnalyzeError::ThreadPool {
            jobs,
            message: format!("at most {MAX_JOBS} are allowed (--jobs)"),
        });
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| AnalyzeError::ThreadPool {
            jobs,
            message: e.to_string(),
        })
}

/// Everything known before the samples are unwound.
pub(crate) struct Prepared {
    pub timeline: Timeline,
    pub images: Vec<LoadedImage>,
    pub jit_maps: HashMap<u32, JitMap>,
    /// The kernel's symbols, when the trace has kernel frames.
    pub kernel_symbols: Option<JitMap>,
    pub warnings: Vec<String>,
    unwinders: HashMap<Pid, ProcessUnwind>,
    pub arch: Arch,
    little_endian: bool,
    /// Per image: whether it is lrnprof's allocation sampler.
    sampler_images: Vec<bool>,
    unwinders_share_cache: bool,
}

/// File names of lrnprof's allocation sampler, which `lrnprof-rec --heap`
/// writes as `liblrnprof_preload-HASH.so`.
const SAMPLER_PREFIX: &str = "liblrnprof_preload";

/// Whether the image at `path` is lrnprof's allocation sampler.
fn is_sampler(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with(SAMPLER_PREFIX))
}

/// First pass, image loading and unwinders. Call inside the worker pool.
/// `release` is told the blocks the first pass is done with.
pub(crate) fn prepare<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
    release: &(dyn Fn(&[BlockInfo]) + Sync),
) -> Prepared {
    prepare_keeping(reader, options, progress, release, &KeptBlocks::default())
}

/// [`prepare`], keeping in `kept` the decompressed blocks it has room
/// for, for the second pass.
pub(crate) fn prepare_keeping<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
    release: &(dyn Fn(&[BlockInfo]) + Sync),
    kept: &KeptBlocks<'_>,
) -> Prepared {
    let mut warnings = report_warnings(reader);
    let mut timeline = scan(reader, progress, release, kept);
    timeline.blobs.finish();
    warnings.append(&mut timeline.warnings);
    warnings.extend(timeline.blobs.problems.iter().cloned());

    let locate = LocateOptions {
        symbols_dirs: options.symbols_dirs.clone(),
        offline: options.offline,
        debuginfod: options.debuginfod && !options.offline,
        debug_roots: Vec::new(),
    };
    let images: Vec<LoadedImage> = timeline
        .images
        .par_iter()
        .map(|key| load_image(key, &timeline.blobs, &locate))
        .collect();

    let arch = timeline.header.arch;
    let module_cache = ModuleCache::default();
    let unwinders: HashMap<Pid, ProcessUnwind> = timeline
        .processes
        .iter()
        .map(|(pid, p)| {
            let unwinders = p
                .generations
                .par_iter()
                .map(|g| ArchUnwinder::build(arch, &g.mappings, &images, &module_cache, p.abi32))
                .collect();
            let biases = p
                .generations
                .iter()
                .map(|g| {
                    g.mappings
                        .iter()
                        .map(|m| {
                            images[m.image as usize]
                                .data
                                .as_ref()
                                .map_or(0, |d| d.bias(m))
                        })
                        .collect()
                })
                .collect();
            (
                *pid,
                ProcessUnwind {
                    generations: p.generations.clone(),
                    unwinders,
                    biases,
                },
            )
        })
        .collect();
    let jit_maps = load_jit_maps(&timeline, options.offline);
    let kernel_symbols = load_kernel_symbols(&timeline, options.offline);
    let little_endian = timeline.header.endian == Endian::Little;
    let sampler_images = timeline
        .images
        .iter()
        .map(|k| is_sampler(&k.path))
        .collect();
    let unwinders_share_cache = unwinders
        .values()
        .flat_map(|p: &ProcessUnwind| &p.unwinders)
        .map(|u| u.generations)
        .sum::<usize>()
        < MAX_GENERATIONS_SHARING_CACHE;
    Prepared {
        timeline,
        images,
        jit_maps,
        kernel_symbols,
        warnings,
        unwinders,
        arch,
        little_endian,
        sampler_images,
        unwinders_share_cache,
    }
}

/// A second pass over whole samples: those that `keep` selects, a chunk
/// of blocks at a time (decoded in parallel), in trace order, each chunk
/// handed to `each` with how many blocks are done; the pages of a chunk
/// are released once it is decoded. Call inside the worker pool.
///
/// For views that unwind a few samples of their kind (syscalls); the
/// profile goes through [`unwind_block`](crate::unwind::unwind_block),
/// which reads stacks in place and unwinds only what changed.
pub(crate) fn for_each_sample_chunk(
    reader: &TraceReader<TraceBytes>,
    keep: impl Fn(&Sample) -> bool + Sync,
    mut each: impl FnMut(Vec<Sample>, u64),
) {
    let blocks = reader.blocks();
    let mut done = 0;
    for chunk in blocks.chunks(chunk_blocks()) {
        let samples: Vec<Sample> = chunk
            .par_iter()
            .flat_map_iter(|b| {
                reader
                    .decode_block(b)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|r| match r {
                        Record::Sample(s) if keep(&s) => Some(s),
                        _ => None,
                    })
            })
            .collect();
        reader.data().release(chunk);
        done += chunk.len() as u64;
        each(samples, done);
    }
}

pub(crate) fn report_warnings<D: AsRef<[u8]>>(reader: &TraceReader<D>) -> Vec<String> {
    let mut w = Vec::new();
    let report = reader.report();
    if !report.finished {
        w.push(
            "trace was not finished cleanly (still being recorded, or the recorder was killed \
             or ran out of disk): analyzing its readable part"
                .to_string(),
        );
    }
    for s in &report.skipped {
        w.push(format!(
            "{} bytes at offset {} skipped: {}",
            s.len, s.offset, s.reason
        ));
    }
    w
}

impl Prepared {
    /// Whether `s` passes `f`.
    pub fn selected(&self, f: &SampleFilter, s: &Sample) -> bool {
        self.selected_at(f, s.pid, s.tid, s.time)
    }

    /// Whether `f` keeps what thread `tid` of `pid` did at `time`.
    pub fn selected_at(&self, f: &SampleFilter, pid: Pid, tid: Tid, time: Timestamp) -> bool {
        if f.pid.is_some_and(|p| p != pid) || f.tid.is_some_and(|t| t != tid) {
            return false;
        }
        let name_of = |pid, tid| {
            self.timeline
                .threads
                .get(&(pid, tid))
                .and_then(|t| t.name.as_ref())
        };
        if let Some(name) = &f.thread_name {
            // The name the thread had then: a thread renamed during the
            // recording (as thread pools name threads after their task)
            // is selected by each name for its time.
            let then = self.timeline.threads.get(&(pid, tid));
            if then.and_then(|t| t.name_at(time)) != Some(name) {
                return false;
            }
        }
        if let Some(comm) = &f.comm {
            let main = Tid(pid.0);
            if name_of(pid, main) != Some(comm) && name_of(pid, tid) != Some(comm) {
                return false;
            }
        }
        if let Some(text) = &f.cgroup {
            let cgroup = self.timeline.processes.get(&pid);
            if !cgroup
                .and_then(|p| p.cgroup.as_ref())
                .is_some_and(|c| c.contains(text.as_str()))
            {
                return false;
            }
        }
        let start = self.timeline.header.start_time.0;
        let secs = time.0.saturating_sub(start) as f64 / 1e9;
        if f.from_secs.is_some_and(|from| secs < from) || f.to_secs.is_some_and(|to| secs >= to) {
            return false;
        }
        true
    }

    /// The image map of process `pid` at `time`, if the process has one.
    pub fn generation_at(&self, pid: Pid, time: Timestamp) -> Option<GenerationRef<'_>> {
        let p = self.unwinders.get(&pid)?;
        let index = generation_index(&p.generations, time)?;
        Some(GenerationRef {
            index,
            mappings: &p.generations.get(index)?.mappings,
            biases: p.biases.get(index)?,
            unwinder: p.unwinders.get(index)?,
        })
    }

    /// Whether one framehop cache may serve every unwinder of the
    /// analysis, so that workers keep theirs from block to block.
    pub fn unwinders_share_cache(&self) -> bool {
        self.unwinders_share_cache
    }

    /// Whether the trace's stacks are little endian.
    pub fn little_endian(&self) -> bool {
        self.little_endian
    }

    /// The frames of `s` as AVMAs (instruction pointer, then return
    /// addresses): taken from the sample if it was stripped, else unwound.
    pub fn unwind(&self, cache: &mut ArchCache, s: &Sample) -> Unwound {
        if !s.frames.is_empty() {
            return Unwound {
                frames: s.frames.clone(),
                clean: false,
                used_kernel_chain: false,
            };
        }
        let generation = self.generation_at(s.pid, s.time);
        let mut u = if let Some(GenerationRef { unwinder, .. }) = generation {
            // A trace is untrusted input: should the unwinder panic on it,
            // keep the instruction pointer and go on.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                unwinder.unwind(cache, s, self.little_endian)
            }))
            .unwrap_or_else(|_| Unwound {
                frames: vec![s.regs.ip()],
                clean: false,
                used_kernel_chain: false,
            })
        } else {
            Unwound::ip_then_callchain(s.regs.ip(), &s.kernel_callchain)
        };
        if let (Some(g), Regs::Aarch64(r)) = (generation, &s.regs) {
            if self.frameless_caller(g.mappings, r.lr, &u.frames) {
                u.frames.insert(1, r.lr);
            }
        }
        u
    }

    /// Frames of `s` (from [`unwind`](Self::unwind)) as symbolication
    /// keys: return addresses moved back into their call instruction. The
    /// sample's kernel frames come first (the leaf end), as perf shows them.
    /// An allocation's stack starts inside lrnprof's allocation sampler,
    /// where it was copied: those frames are dropped, so its leaf is the
    /// program's call to the allocator.
    pub fn frame_keys(&self, s: &Sample, frames: &[u64]) -> Vec<FrameKey> {
        let mut keys = Vec::with_capacity(s.kernel_frames.len() + frames.len());
        push_kernel_keys(&s.kernel_frames, &mut keys);
        // A kernel thread has no user context: its registers are zero.
        let user = if kernel_only(s) { &[][..] } else { frames };
        let generation = self.generation_at(s.pid, s.time);
        self.push_frame_keys(s.pid, generation.as_ref(), user.iter().copied(), &mut keys);
        if s.kind == SampleKind::Allocation {
            self.drop_sampler_frames(&mut keys, 0);
        }
        keys
    }

    /// Drop the frames of lrnprof's allocation sampler at the start of
    /// `keys[start..]` (an allocation's frames, leaf first).
    pub fn drop_sampler_frames(&self, keys: &mut Vec<FrameKey>, start: usize) {
        let ours = keys
            .get(start..)
            .unwrap_or(&[])
            .iter()
            .take_while(|k| {
                k.image()
                    .is_some_and(|i| self.sampler_images.get(i as usize) == Some(&true))
            })
            .count();
        keys.drain(start..start + ours);
    }

    /// Append the keys of `frames` (the first one the instruction pointer)
    /// of a sample of `pid` taken under `generation` to `out`.
    pub fn push_frame_keys(
        &self,
        pid: Pid,
        generation: Option<&GenerationRef<'_>>,
        frames: impl Iterator<Item = u64>,
        out: &mut Vec<FrameKey>,
    ) {
        let (mappings, biases) = generation.map_or((&[][..], &[][..]), |g| (g.mappings, g.biases));
        out.extend(frames.enumerate().map(|(i, avma)| {
            let lookup = if i == 0 { avma } else { avma.wrapping_sub(1) };
            self.frame_key(pid, mappings, biases, Avma(lookup))
        }));
    }

    /// On AArch64 a function without a frame record keeps its return
    /// address in `lr` only. Where the instruction pointer's image has no
    /// unwind data, framehop falls back to the frame-pointer chain, which
    /// skips that caller: put `lr` back when it is a code address in
    /// another function (by symbols) than the instruction pointer, and not
    /// already the next frame.
    /// Whether `lr` is such a caller of `frames`, to insert at index 1.
    pub fn frameless_caller(&self, mappings: &[Mapping], lr: u64, frames: &[u64]) -> bool {
        let Some(&pc) = frames.first() else {
            return false;
        };
        if lr == 0 || frames.get(1) == Some(&lr) {
            return false;
        }
        let Some((pc_map, pc_data)) = self.image_data_at(mappings, pc) else {
            return false;
        };
        if pc_data.has_unwind_data() || !pc_map.executable {
            return false;
        }
        let Some((lr_map, lr_data)) = self.image_data_at(mappings, lr.wrapping_sub(4)) else {
            return false;
        };
        let function = |m: &Mapping, d: &ImageData, avma: u64| {
            let svma = avma.wrapping_sub(d.bias(m));
            let symbols = d.symbols.table();
            let i = symbols.partition_point(|s| s.svma <= svma).checked_sub(1)?;
            Some((m.image, symbols[i].svma))
        };
        let pc_fn = function(pc_map, pc_data, pc);
        let lr_fn = function(lr_map, lr_data, lr.wrapping_sub(4));
        pc_fn.is_some() && lr_fn.is_some() && pc_fn != lr_fn && frames.len() < MAX_FRAMES
    }

    fn image_data_at<'m>(
        &self,
        mappings: &'m [Mapping],
        avma: u64,
    ) -> Option<(&'m Mapping, &ImageData)> {
        let i = mappings
            .partition_point(|m| m.start <= avma)
            .checked_sub(1)?;
        let m = &mappings[i];
        if avma >= m.end {
            return None;
        }
        Some((m, self.images[m.image as usize].data.as_ref()?))
    }

    fn frame_key(&self, pid: Pid, mappings: &[Mapping], biases: &[u64], lookup: Avma) -> FrameKey {
        let avma = lookup.0;
        let i = mappings.partition_point(|m| m.start <= avma);
        let m = i
            .checked_sub(1)
            .map(|i| (&mappings[i], biases.get(i).copied().unwrap_or(0)))
            .filter(|(m, _)| avma < m.end);
        match m {
            Some((m, bias)) if self.images[m.image as usize].key.kind != ImageKind::Anonymous => {
                match &self.images[m.image as usize].data {
                    Some(_) => FrameKey::Image {
                        image: m.image,
                        svma: Svma(avma.wrapping_sub(bias)),
                    },
                    None => FrameKey::Unresolved {
                        image: m.image,
                        offset: FileOffset((avma - m.start).wrapping_add(m.file_offset)),
                    },
                }
            }
            _ => FrameKey::Outside { pid, avma: lookup },
        }
    }
}

/// Whether the trace was recorded on this machine (and local files may be
/// read).
fn same_machine(timeline: &Timeline, offline: bool) -> bool {
    let local_host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    !offline && !local_host.is_empty() && local_host == timeline.header.hostname
}

/// The kernel's symbols of a trace that sampled the kernel: embedded, or
/// this machine's when recorded here.
fn load_kernel_symbols(timeline: &Timeline, offline: bool) -> Option<JitMap> {
    if !timeline.header.sampling.include_kernel {
        return None;
    }
    if let Some(data) = timeline.blobs.kernel_symbols() {
        return Some(JitMap::parse_kallsyms(&String::from_utf8_lossy(&data)));
    }
    if same_machine(timeline, offline) {
        let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
        return Some(JitMap::parse_kallsyms(&text));
    }
    None
}

fn load_jit_maps(timeline: &Timeline, offline: bool) -> HashMap<u32, JitMap> {
    let same_machine = same_machine(timeline, offline);
    let mut maps = HashMap::new();
    for pid in timeline.processes.keys() {
        if let Some(data) = timeline.blobs.jit_map(*pid) {
            maps.insert(pid.0, JitMap::parse(&String::from_utf8_lossy(&data)));
        } else if same_machine {
            if let Ok(text) = std::fs::read_to_string(format!("/tmp/perf-{}.map", pid.0)) {
                maps.insert(pid.0, JitMap::parse(&text));
            }
        }
    }
    maps
}

/// Append the keys of a sample's kernel frames (leaf first) to `out`.
pub(crate) fn push_kernel_keys(kernel_frames: &[u64], out: &mut Vec<FrameKey>) {
    out.extend(kernel_frames.iter().enumerate().map(|(i, &avma)| {
        let lookup = if i == 0 { avma } else { avma.wrapping_sub(1) };
        FrameKey::Kernel { avma: Avma(lookup) }
    }));
}

/// Whether `s` was taken in a kernel thread (kernel frames, no user
/// context: its registers are zero).
pub(crate) fn kernel_only(s: &Sample) -> bool {
    !s.kernel_frames.is_empty() && s.regs.ip() == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_is_known_by_its_file_name() {
        assert!(is_sampler(
            "/run/user/1000/lrnprof/liblrnprof_preload-0123456789abcdef.so"
        ));
        assert!(is_sampler("liblrnprof_preload.so"));
        assert!(!is_sampler("/usr/lib/libc.so.6"));
        assert!(!is_sampler("/opt/liblrnprof_preload/libc.so"));
    }
}
