//! The analysis pipeline: first pass (timeline, blobs), image loading,
//! parallel unwinding a chunk of blocks at a time, streaming aggregation,
//! then symbolication of each unique address once.

use crate::error::AnalyzeError;
use crate::image::ImageData;
use crate::image::{load_image, short_name, LoadedImage, LocateOptions, Source};
use crate::options::{AnalyzeOptions, Progress};
use crate::profile::{
    hex, Function, ImageInfo, Location, LocationLine, ProcessInfo, Profile, SequenceEntry, Stack,
    Stats, ThreadProfile,
};
use crate::symbolicate::{FrameLine, JitMap, Symbolizer};
use crate::timeline::Mapping;
use crate::timeline::{scan, ProcessTimeline, Timeline, CHUNK_BLOCKS};
use crate::unwind::MAX_FRAMES;
use crate::unwind::{ArchCache, ArchUnwinder, ModuleCache};
use lrnprof_format::{Endian, Pid, Record, Regs, Sample, TraceReader};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// Outermost functions that mean a stack reached its thread's root.
const ROOT_FUNCTIONS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__GI___clone",
    "__GI___clone3",
    "thread_start",
    "_pthread_start",
    "pthread_start",
    "start",
];

/// No image (the frame is outside every mapping).
const NO_IMAGE: u32 = u32::MAX;

/// A frame before symbolication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FrameKey {
    image: u32,
    /// The process, for frames outside images (JIT maps are per process).
    pid: u32,
    /// SVMA lookup address in `image`, file offset when the image has no
    /// data, or AVMA when outside images.
    addr: u64,
}

/// One sample after unwinding.
struct UnwoundSample {
    thread: u32,
    time: lrnprof_format::Timestamp,
    weight: u64,
    frames: Vec<FrameKey>,
    clean: bool,
    used_kernel_chain: bool,
    presymbolized: bool,
}

/// Per process: the unwinder of each generation.
struct ProcessUnwind<'a> {
    timeline: &'a ProcessTimeline,
    unwinders: Vec<ArchUnwinder>,
}

/// Analyze the trace at `path`.
pub fn analyze(
    path: &Path,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    for dir in &options.symbols_dirs {
        if !dir.is_dir() {
            return Err(AnalyzeError::SymbolsDir(dir.clone()));
        }
    }
    let reader = TraceReader::open(path).map_err(|source| AnalyzeError::Trace {
        path: path.to_path_buf(),
        source,
    })?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.jobs)
        .build()
        .map_err(|e| AnalyzeError::ThreadPool {
            jobs: options.jobs,
            message: e.to_string(),
        })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let result = pool.install(|| run(&reader, &name, options, progress));
    progress.finish();
    let profile = result?;
    if options.filter != Default::default()
        && profile.stats.samples == 0
        && profile.stats.trace_samples > 0
    {
        return Err(AnalyzeError::NothingSelected(options.filter.describe()));
    }
    Ok(profile)
}

fn report_warnings<D: AsRef<[u8]>>(reader: &TraceReader<D>) -> Vec<String> {
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

fn run<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    trace_name: &str,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    let mut warnings = report_warnings(reader);
    let mut timeline = scan(reader, progress);
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
    let unwinders: HashMap<Pid, ProcessUnwind> = timeline
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
                    timeline: p,
                    unwinders,
                },
            )
        })
        .collect();
    let jit_maps = load_jit_maps(&timeline, options.offline);

    let mut agg = Aggregator::new(timeline.threads.len(), options.keep_sequences);
    let ctx = SampleContext {
        timeline: &timeline,
        images: &images,
        unwinders: &unwinders,
        options,
        little_endian: timeline.header.endian == Endian::Little,
    };
    let blocks = reader.blocks();
    let total = blocks.len() as u64;
    let mut done = 0;
    for chunk in blocks.chunks(CHUNK_BLOCKS) {
        let samples: Vec<Sample> = chunk
            .par_iter()
            .flat_map_iter(|b| {
                reader
                    .decode_block(b)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|r| match r {
                        Record::Sample(s) if ctx.selected(&s) => Some(s),
                        _ => None,
                    })
            })
            .collect();
        let unwound: Vec<UnwoundSample> = samples
            .par_iter()
            .map_init(|| ArchCache::new(arch), |cache, s| ctx.unwind(cache, s))
            .collect();
        for u in unwound {
            agg.add(u);
        }
        done += chunk.len() as u64;
        progress.update("unwinding", done, total);
    }

    let lines = symbolicate(
        &agg.frames,
        &images,
        &jit_maps,
        !options.no_inline,
        progress,
    );
    Ok(build_profile(
        reader, trace_name, timeline, images, agg, lines, warnings,
    ))
}

struct SampleContext<'a> {
    timeline: &'a Timeline,
    images: &'a [LoadedImage],
    unwinders: &'a HashMap<Pid, ProcessUnwind<'a>>,
    options: &'a AnalyzeOptions,
    little_endian: bool,
}

impl SampleContext<'_> {
    fn selected(&self, s: &Sample) -> bool {
        let f = &self.options.filter;
        if f.pid.is_some_and(|p| p != s.pid) || f.tid.is_some_and(|t| t != s.tid) {
            return false;
        }
        if let Some(name) = &f.thread_name {
            let thread = self.timeline.threads.get(&(s.pid, s.tid));
            if thread.and_then(|t| t.name.as_ref()) != Some(name) {
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

    fn unwind(&self, cache: &mut ArchCache, s: &Sample) -> UnwoundSample {
        let process = self.unwinders.get(&s.pid);
        let generation = process.and_then(|p| {
            let (i, g) = p.timeline.generation_at(s.time)?;
            Some((g, p.unwinders.get(i)?))
        });
        let presymbolized = !s.frames.is_empty();
        let u = if presymbolized {
            crate::unwind::Unwound {
                frames: s.frames.clone(),
                clean: false,
                used_kernel_chain: false,
            }
        } else if let Some((_, unwinder)) = generation {
            // A trace is untrusted input: should the unwinder panic on it,
            // keep the instruction pointer and go on.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                unwinder.unwind(cache, s, self.little_endian)
            }))
            .unwrap_or_else(|_| crate::unwind::Unwound {
                frames: vec![s.regs.ip()],
                clean: false,
                used_kernel_chain: false,
            })
        } else {
            let mut frames = vec![s.regs.ip()];
            let used = crate::unwind::continue_with_callchain(&mut frames, &s.kernel_callchain);
            crate::unwind::Unwound {
                frames,
                clean: false,
                used_kernel_chain: used,
            }
        };
        let mappings = generation.map(|(g, _)| &g.mappings[..]).unwrap_or(&[]);
        let mut u = u;
        if let (false, Regs::Aarch64(r)) = (presymbolized, &s.regs) {
            self.add_frameless_caller(mappings, r.lr, &mut u.frames);
        }
        let frames = u
            .frames
            .iter()
            .enumerate()
            .map(|(i, &avma)| {
                let lookup = if i == 0 { avma } else { avma.wrapping_sub(1) };
                self.frame_key(s.pid, mappings, lookup)
            })
            .collect();
        UnwoundSample {
            thread: self.timeline.thread_index[&(s.pid, s.tid)],
            time: s.time,
            weight: s.weight,
            frames,
            clean: u.clean,
            used_kernel_chain: u.used_kernel_chain,
            presymbolized,
        }
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

    fn frame_key(&self, pid: Pid, mappings: &[Mapping], avma: u64) -> FrameKey {
        let i = mappings.partition_point(|m| m.start <= avma);
        let m = i
            .checked_sub(1)
            .map(|i| &mappings[i])
            .filter(|m| avma < m.end);
        match m {
            Some(m)
                if self.images[m.image as usize].key.kind
                    != lrnprof_format::ImageKind::Anonymous =>
            {
                let addr = match &self.images[m.image as usize].data {
                    Some(d) => avma.wrapping_sub(d.bias(m)),
                    None => avma - m.start + m.file_offset,
                };
                FrameKey {
                    image: m.image,
                    pid: 0,
                    addr,
                }
            }
            _ => FrameKey {
                image: NO_IMAGE,
                pid: pid.0,
                addr: avma,
            },
        }
    }
}

fn load_jit_maps(timeline: &Timeline, offline: bool) -> HashMap<u32, JitMap> {
    let local_host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let same_machine = !offline && !local_host.is_empty() && local_host == timeline.header.hostname;
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

/// Streaming aggregation in sample order: ids are first-seen order, so the
/// result does not depend on how work was split between threads.
struct Aggregator {
    frames: Vec<FrameKey>,
    frame_ids: HashMap<FrameKey, u32>,
    stacks: Vec<Stack>,
    stack_clean: Vec<u64>,
    stack_ids: HashMap<(u32, Vec<u32>), u32>,
    sequences: Vec<Vec<SequenceEntry>>,
    keep_sequences: bool,
    thread_samples: Vec<(u64, u64)>,
    kernel_chain: u64,
    presymbolized: u64,
}

impl Aggregator {
    fn new(threads: usize, keep_sequences: bool) -> Aggregator {
        Aggregator {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: Vec::new(),
            stack_clean: Vec::new(),
            stack_ids: HashMap::new(),
            sequences: vec![Vec::new(); threads],
            keep_sequences,
            thread_samples: vec![(0, 0); threads],
            kernel_chain: 0,
            presymbolized: 0,
        }
    }

    fn add(&mut self, u: UnwoundSample) {
        let ids: Vec<u32> = u
            .frames
            .iter()
            .map(|f| {
                let next = self.frames.len() as u32;
                *self.frame_ids.entry(*f).or_insert_with(|| {
                    self.frames.push(*f);
                    next
                })
            })
            .collect();
        let next = self.stacks.len() as u32;
        let stacks = &mut self.stacks;
        let clean = &mut self.stack_clean;
        let id = *self
            .stack_ids
            .entry((u.thread, ids))
            .or_insert_with_key(|(thread, ids)| {
                stacks.push(Stack {
                    thread: *thread,
                    locations: ids.clone(),
                    samples: 0,
                    weight: 0,
                    root_samples: 0,
                });
                clean.push(0);
                next
            });
        let s = &mut self.stacks[id as usize];
        s.samples += 1;
        s.weight += u.weight;
        self.stack_clean[id as usize] += u64::from(u.clean);
        let t = &mut self.thread_samples[u.thread as usize];
        t.0 += 1;
        t.1 += u.weight;
        self.kernel_chain += u64::from(u.used_kernel_chain);
        self.presymbolized += u64::from(u.presymbolized);
        if self.keep_sequences {
            let seq = &mut self.sequences[u.thread as usize];
            match seq.last_mut() {
                Some(last) if last.stack == id => {
                    last.samples += 1;
                    last.weight += u.weight;
                    last.last_time = u.time;
                }
                _ => seq.push(SequenceEntry {
                    stack: id,
                    time: u.time,
                    last_time: u.time,
                    samples: 1,
                    weight: u.weight,
                }),
            }
        }
    }
}

/// A frame's function levels (innermost first) and whether it was resolved.
type Resolved = (Vec<FrameLine>, bool);

/// Symbolicate every unique frame once. Returns, per frame, its function
/// levels (innermost first) and whether it was resolved.
fn symbolicate(
    frames: &[FrameKey],
    images: &[LoadedImage],
    jit_maps: &HashMap<u32, JitMap>,
    inline: bool,
    progress: &dyn Progress,
) -> Vec<Resolved> {
    let mut by_image: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, f) in frames.iter().enumerate() {
        by_image.entry(f.image).or_default().push(i);
    }
    let mut groups: Vec<(u32, Vec<usize>)> = by_image.into_iter().collect();
    groups.sort_by_key(|g| g.0);
    // Split big images so that one large executable still uses every worker.
    let per_chunk = (frames.len() / rayon::current_num_threads().max(1)).max(512);
    let work: Vec<(u32, &[usize])> = groups
        .iter()
        .flat_map(|(img, idx)| idx.chunks(per_chunk).map(move |c| (*img, c)))
        .collect();
    let total = work.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<Vec<(usize, Resolved)>> = work
        .par_iter()
        .map(|(img, idx)| {
            let out = if *img == NO_IMAGE {
                idx.iter()
                    .map(|&i| {
                        let f = frames[i];
                        let name = jit_maps.get(&f.pid).and_then(|m| m.lookup(f.addr));
                        (
                            i,
                            match name {
                                Some(n) => (vec![line(n.to_string())], true),
                                None => (vec![line(format!("{:#x}", f.addr))], false),
                            },
                        )
                    })
                    .collect()
            } else {
                let image = &images[*img as usize];
                let symbolizer = image.data.as_ref().map(Symbolizer::new);
                idx.iter()
                    .map(|&i| {
                        let f = frames[i];
                        let lines = symbolizer
                            .as_ref()
                            .map(|s| s.lookup(f.addr, inline))
                            .unwrap_or_default();
                        (
                            i,
                            if lines.is_empty() {
                                let base = image.data.as_ref().map_or(0, |d| d.base_svma);
                                let off = f.addr.wrapping_sub(base);
                                (
                                    vec![line(format!("{}+{off:#x}", image.short_name()))],
                                    false,
                                )
                            } else {
                                (lines, true)
                            },
                        )
                    })
                    .collect()
            };
            let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            progress.update("symbolicating", d, total);
            out
        })
        .collect();
    let mut lines = vec![(Vec::new(), false); frames.len()];
    for (i, l) in results.into_iter().flatten() {
        lines[i] = l;
    }
    lines
}

fn line(function: String) -> FrameLine {
    FrameLine {
        function,
        file: None,
        line: None,
    }
}

fn source_text(s: &Source) -> String {
    s.to_string()
}

fn build_profile<D: AsRef<[u8]>>(
    reader: &TraceReader<D>,
    trace_name: &str,
    timeline: Timeline,
    images: Vec<LoadedImage>,
    agg: Aggregator,
    lines: Vec<Resolved>,
    mut warnings: Vec<String>,
) -> Profile {
    // Functions and locations in first-seen frame order.
    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: HashMap<(String, Option<String>), u32> = HashMap::new();
    let mut image_frames = vec![0u64; images.len()];
    let mut locations = Vec::with_capacity(agg.frames.len());
    for (key, (frame_lines, known)) in agg.frames.iter().zip(lines) {
        let lines = frame_lines
            .into_iter()
            .map(|l| {
                let k = (l.function, l.file);
                let next = functions.len() as u32;
                let id = *function_ids.entry(k.clone()).or_insert_with(|| {
                    functions.push(Function {
                        name: k.0,
                        file: k.1,
                        first_line: None,
                    });
                    next
                });
                let f = &mut functions[id as usize];
                if let Some(line) = l.line {
                    f.first_line = Some(f.first_line.map_or(line, |x| x.min(line)));
                }
                LocationLine {
                    function: id,
                    line: l.line,
                }
            })
            .collect();
        locations.push(Location {
            image: (key.image != NO_IMAGE).then_some(key.image),
            address: key.addr,
            lines,
            unknown: !known,
        });
    }

    let mut stats = Stats {
        trace_samples: timeline.samples,
        presymbolized_samples: agg.presymbolized,
        kernel_callchain_samples: agg.kernel_chain,
        lost_samples: timeline.lost,
        trace_bytes: reader.len(),
        finished: reader.report().finished,
        ..Default::default()
    };
    if let (Some(a), Some(b)) = (timeline.first_time, timeline.last_time) {
        stats.duration_ns = b.0 - a.0;
    }
    let mut threads: Vec<ThreadProfile> = timeline
        .threads
        .iter()
        .enumerate()
        .map(|(i, ((pid, tid), t))| ThreadProfile {
            pid: *pid,
            tid: *tid,
            name: t.name.clone(),
            trace_samples: t.samples,
            samples: agg.thread_samples[i].0,
            weight: agg.thread_samples[i].1,
            root_samples: 0,
        })
        .collect();
    stats.stack_bytes = timeline.threads.values().map(|t| t.stack_bytes).sum();
    let mut stacks = agg.stacks;
    for (s, clean) in stacks.iter_mut().zip(agg.stack_clean) {
        let outer_is_root = s.locations.last().is_some_and(|&l| {
            locations[l as usize].lines.last().is_some_and(|ll| {
                ROOT_FUNCTIONS.contains(&functions[ll.function as usize].name.as_str())
            })
        });
        s.root_samples = if outer_is_root { s.samples } else { clean };
        stats.samples += s.samples;
        stats.root_samples += s.root_samples;
        threads[s.thread as usize].root_samples += s.root_samples;
        stats.frames += s.samples * s.locations.len() as u64;
        for &l in &s.locations {
            let loc = &locations[l as usize];
            if loc.unknown {
                stats.unknown_frames += s.samples;
            }
            if let Some(img) = loc.image {
                image_frames[img as usize] += s.samples;
            }
        }
    }

    let mut missing = Vec::new();
    let image_infos: Vec<ImageInfo> = images
        .iter()
        .zip(&image_frames)
        .map(|(img, &frames)| {
            let has_debug_info = img.data.as_ref().is_some_and(|d| d.has_dwarf());
            if frames > 0
                && img.key.kind != lrnprof_format::ImageKind::Anonymous
                && (img.unwind_source == Source::Missing || img.symbol_source == Source::Missing)
            {
                missing.push(format!(
                    "{} ({})",
                    img.key.path,
                    hex(&img.key.build_id).unwrap_or_else(|| "no build id".into())
                ));
            }
            ImageInfo {
                path: img.key.path.clone(),
                build_id: hex(&img.key.build_id),
                unwind_data: source_text(&img.unwind_source),
                symbol_data: source_text(&img.symbol_source),
                has_debug_info,
                notes: img.notes.clone(),
                frames,
            }
        })
        .collect();
    if !missing.is_empty() {
        warnings.push(format!(
            "unwind or symbol data missing for {}: give their files with --symbols DIR or record with embedded data",
            missing.join(", ")
        ));
    }
    for img in &images {
        for n in &img.notes {
            if n.starts_with("not using") {
                warnings.push(n.clone());
            }
        }
    }
    let processes = timeline
        .processes
        .iter()
        .map(|(pid, p)| ProcessInfo {
            pid: pid.0,
            command: p.command.clone(),
            executable: p.executable.clone(),
        })
        .collect();
    let _ = short_name;
    Profile {
        header: timeline.header,
        trace_name: trace_name.to_string(),
        threads,
        processes,
        images: image_infos,
        functions,
        locations,
        stacks,
        sequences: agg.sequences,
        stats,
        warnings,
    }
}
