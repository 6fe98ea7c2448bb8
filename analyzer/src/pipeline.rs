//! What every command shares: opening a trace, the first pass, loading
//! images, building one unwinder per process generation, and unwinding one
//! sample into frames.

use crate::address::{Avma, FileOffset, Svma};
use crate::error::AnalyzeError;
use crate::image::{load_image, ImageData, LoadedImage, LocateOptions};
use crate::options::{AnalyzeOptions, Progress, SampleFilter};
use crate::symbolicate::JitMap;
use crate::timeline::{
    chunk_blocks, generation_index, scan, Generation, Mapping, SampleCache, Timeline,
};
use crate::unwind::{
    continue_with_callchain, ArchCache, ArchUnwinder, ModuleCache, Unwound, MAX_FRAMES,
};
use lrnprof_format::{Arch, Endian, ImageKind, Pid, Record, Regs, Sample, Tid, TraceReader};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

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

/// Per process: each generation of its image map and its unwinder.
struct ProcessUnwind {
    generations: Vec<Generation>,
    unwinders: Vec<ArchUnwinder>,
}

/// Open `path`, checking the `--symbols` directories first.
pub(crate) fn open(
    path: &Path,
    options: &AnalyzeOptions,
) -> Result<TraceReader<Vec<u8>>, AnalyzeError> {
    for dir in &options.symbols_dirs {
        if !dir.is_dir() {
            return Err(AnalyzeError::SymbolsDir(dir.clone()));
        }
    }
    TraceReader::open(path).map_err(|source| AnalyzeError::Trace {
        path: path.to_path_buf(),
        source,
    })
}

/// A worker pool of `jobs` threads (0: one per CPU).
pub(crate) fn pool(jobs: usize) -> Result<rayon::ThreadPool, AnalyzeError> {
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
    /// Samples kept from the first pass, per block (`None`: decode again).
    pub cache: SampleCache,
    unwinders: HashMap<Pid, ProcessUnwind>,
    pub arch: Arch,
    little_endian: bool,
}

/// First pass, image loading and unwinders. Call inside the worker pool.
/// With `keep_samples`, the first pass keeps the first blocks' samples in
/// [`Prepared::cache`].
pub(crate) fn prepare<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
    keep_samples: bool,
) -> Prepared {
    let mut warnings = report_warnings(reader);
    let (mut timeline, cache) = scan(reader, progress, keep_samples);
    timeline.blobs.finish();
    warnings.append(&mut timeline.warnings);
    warnings.extend(timeline.blobs.problems.iter().cloned());

    let locate = LocateOptions {
        symbols_dirs: options.symbols_dirs.clone(),
        offline: options.offline,
        debug_roots: Vec::new(),
    };
    let images: Vec<LoadedImage> = timeline
        .images
        .par_iter()
        .map(|key| load_image(key, &timeline.blobs, &locate))
        .collect();

    let arch = timeline.header.arch;
    let module_cache = ModuleCache::default();
    let unwinders = timeline
        .processes
        .iter()
        .map(|(pid, p)| {
            let unwinders = p
                .generations
                .par_iter()
                .map(|g| ArchUnwinder::build(arch, &g.mappings, &images, &module_cache))
                .collect();
            (
                *pid,
                ProcessUnwind {
                    generations: p.generations.clone(),
                    unwinders,
                },
            )
        })
        .collect();
    let jit_maps = load_jit_maps(&timeline, options.offline);
    let kernel_symbols = load_kernel_symbols(&timeline, options.offline);
    let little_endian = timeline.header.endian == Endian::Little;
    Prepared {
        timeline,
        images,
        jit_maps,
        kernel_symbols,
        warnings,
        cache,
        unwinders,
        arch,
        little_endian,
    }
}

/// The second pass: the samples that `keep` selects, a chunk of blocks at
/// a time (decoded in parallel, or taken from the first pass's cache),
/// in trace order, each chunk handed to `each` with how many blocks are
/// done. Call inside the worker pool.
pub(crate) fn for_each_sample_chunk<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    cache: &mut SampleCache,
    keep: impl Fn(&Sample) -> bool + Sync,
    mut each: impl FnMut(Vec<Sample>, u64),
) {
    let blocks = reader.blocks();
    let step = chunk_blocks();
    let mut done = 0;
    for (n, chunk) in blocks.chunks(step).enumerate() {
        let cached: Vec<Option<Vec<Sample>>> = (0..chunk.len())
            .map(|i| cache.get_mut(n * step + i).and_then(Option::take))
            .collect();
        let samples: Vec<Sample> = chunk
            .par_iter()
            .zip(cached)
            .flat_map_iter(|(b, cached)| {
                cached
                    .unwrap_or_else(|| {
                        reader
                            .decode_block(b)
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|r| match r {
                                Record::Sample(s) => Some(s),
                                _ => None,
                            })
                            .collect()
                    })
                    .into_iter()
                    .filter(|s| keep(s))
            })
            .collect();
        done += chunk.len() as u64;
        each(samples, done);
    }
}

pub(crate) fn report_warnings<D: AsRef<[u8]>>(reader: &TraceReader<D>) -> Vec<String> {
    let mut w = Vec::new();
    let report = reader.report();
    if !report.finished {
        w.push(
            "trace was not finished cleanly (recorder killed or disk full): analyzing its readable part"
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
        if f.pid.is_some_and(|p| p != s.pid) || f.tid.is_some_and(|t| t != s.tid) {
            return false;
        }
        let name_of = |pid, tid| {
            self.timeline
                .threads
                .get(&(pid, tid))
                .and_then(|t| t.name.as_ref())
        };
        if let Some(name) = &f.thread_name {
            if name_of(s.pid, s.tid) != Some(name) {
                return false;
            }
        }
        if let Some(comm) = &f.comm {
            let main = Tid(s.pid.0);
            if name_of(s.pid, main) != Some(comm) && name_of(s.pid, s.tid) != Some(comm) {
                return false;
            }
        }
        if let Some(text) = &f.cgroup {
            let cgroup = self.timeline.processes.get(&s.pid);
            if !cgroup
                .and_then(|p| p.cgroup.as_ref())
                .is_some_and(|c| c.contains(text.as_str()))
            {
                return false;
            }
        }
        let start = self.timeline.header.start_time.0;
        let secs = s.time.0.saturating_sub(start) as f64 / 1e9;
        if f.from_secs.is_some_and(|from| secs < from) || f.to_secs.is_some_and(|to| secs >= to) {
            return false;
        }
        true
    }

    fn generation(&self, s: &Sample) -> Option<(&Generation, &ArchUnwinder)> {
        let p = self.unwinders.get(&s.pid)?;
        let i = generation_index(&p.generations, s.time)?;
        Some((p.generations.get(i)?, p.unwinders.get(i)?))
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
        let generation = self.generation(s);
        let mut u = if let Some((_, unwinder)) = generation {
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
            let mut frames = vec![s.regs.ip()];
            let used = continue_with_callchain(&mut frames, &s.kernel_callchain);
            Unwound {
                frames,
                clean: false,
                used_kernel_chain: used,
            }
        };
        if let (Some((g, _)), Regs::Aarch64(r)) = (generation, &s.regs) {
            self.add_frameless_caller(&g.mappings, r.lr, &mut u.frames);
        }
        u
    }

    /// Frames of `s` (from [`unwind`](Self::unwind)) as symbolication
    /// keys: return addresses moved back into their call instruction. The
    /// sample's kernel frames come first (the leaf end), as perf shows them.
    pub fn frame_keys(&self, s: &Sample, frames: &[u64]) -> Vec<FrameKey> {
        let mappings = self
            .generation(s)
            .map(|(g, _)| &g.mappings[..])
            .unwrap_or(&[]);
        let back = |i: usize, avma: u64| if i == 0 { avma } else { avma.wrapping_sub(1) };
        // A kernel thread has no user context: its registers are zero.
        let user = if !s.kernel_frames.is_empty() && frames == [0] {
            &[][..]
        } else {
            frames
        };
        let kernel = s
            .kernel_frames
            .iter()
            .enumerate()
            .map(|(i, &avma)| FrameKey::Kernel {
                avma: Avma(back(i, avma)),
            });
        kernel
            .chain(
                user.iter()
                    .enumerate()
                    .map(|(i, &avma)| self.frame_key(s.pid, mappings, Avma(back(i, avma)))),
            )
            .collect()
    }

    /// On AArch64 a function without a frame record keeps its return
    /// address in `lr` only. Where the instruction pointer's image has no
    /// unwind data, framehop falls back to the frame-pointer chain, which
    /// skips that caller: put `lr` back when it is a code address in
    /// another function (by symbols) than the instruction pointer, and not
    /// already the next frame.
    fn add_frameless_caller(&self, mappings: &[Mapping], lr: u64, frames: &mut Vec<u64>) {
        let Some(&pc) = frames.first() else { return };
        if lr == 0 || frames.get(1) == Some(&lr) {
            return;
        }
        let Some((pc_map, pc_data)) = self.image_data_at(mappings, pc) else {
            return;
        };
        if pc_data.has_unwind_data() || !pc_map.executable {
            return;
        }
        let Some((lr_map, lr_data)) = self.image_data_at(mappings, lr.wrapping_sub(4)) else {
            return;
        };
        let function = |m: &Mapping, d: &ImageData, avma: u64| {
            let svma = avma.wrapping_sub(d.bias(m));
            let i = d
                .symbols
                .partition_point(|s| s.svma <= svma)
                .checked_sub(1)?;
            Some((m.image, d.symbols[i].svma))
        };
        let pc_fn = function(pc_map, pc_data, pc);
        let lr_fn = function(lr_map, lr_data, lr.wrapping_sub(4));
        if pc_fn.is_some() && lr_fn.is_some() && pc_fn != lr_fn && frames.len() < MAX_FRAMES {
            frames.insert(1, lr);
        }
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

    fn frame_key(&self, pid: Pid, mappings: &[Mapping], lookup: Avma) -> FrameKey {
        let avma = lookup.0;
        let i = mappings.partition_point(|m| m.start <= avma);
        let m = i
            .checked_sub(1)
            .map(|i| &mappings[i])
            .filter(|m| avma < m.end);
        match m {
            Some(m) if self.images[m.image as usize].key.kind != ImageKind::Anonymous => {
                match &self.images[m.image as usize].data {
                    Some(d) => FrameKey::Image {
                        image: m.image,
                        svma: Svma(avma.wrapping_sub(d.bias(m))),
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
