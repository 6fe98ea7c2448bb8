//! The analysis pipeline: first pass (timeline, blobs), image loading,
//! parallel unwinding a chunk of blocks at a time, streaming aggregation,
//! then symbolication of each unique address once.

use crate::error::AnalyzeError;
use crate::image::Source;
#[cfg(test)]
use crate::options::SampleFilter;
use crate::options::{AnalyzeOptions, Progress};
use crate::pipeline::{open, pool, prepare, FrameKey, Prepared, NO_IMAGE};
use crate::profile::{
    hex, Function, ImageInfo, Location, LocationLine, ProcessInfo, Profile, SequenceEntry, Stack,
    Stats, ThreadProfile,
};
use crate::symbolicate::{symbolicate, Resolved};
use crate::timeline::chunk_blocks;
use crate::unwind::ArchCache;
use lrnprof_format::{Record, Sample, TraceReader};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// Outermost functions that mean a stack reached its thread's root.
const ROOT_FUNCTIONS: &[&str] = &[
    "_start",
    // The dynamic loader's entry code after `_start`, while it runs the
    // libraries' constructors (glibc).
    "_dl_start_user",
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

/// Analyze the trace at `path`.
pub fn analyze(
    path: &Path,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    let reader = open(path, options)?;
    let pool = pool(options.jobs)?;
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

fn run<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    trace_name: &str,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    let mut prepared = prepare(reader, options, progress, true);
    let mut cache = std::mem::take(&mut prepared.cache);
    let mut agg = Aggregator::new(prepared.timeline.threads.len(), options.keep_sequences);
    let blocks = reader.blocks();
    let total = blocks.len() as u64;
    let mut done = 0;
    let step = chunk_blocks();
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
                    .filter(|s| prepared.selected(&options.filter, s))
            })
            .collect();
        let unwound: Vec<UnwoundSample> = samples
            .par_iter()
            .map_init(
                || ArchCache::new(prepared.arch),
                |cache, s| {
                    let u = prepared.unwind(cache, s);
                    UnwoundSample {
                        thread: prepared.timeline.thread_index[&(s.pid, s.tid)],
                        time: s.time,
                        weight: s.weight,
                        frames: prepared.frame_keys(s, &u.frames),
                        clean: u.clean,
                        used_kernel_chain: u.used_kernel_chain,
                        presymbolized: !s.frames.is_empty(),
                    }
                },
            )
            .collect();
        for u in unwound {
            agg.add(u);
        }
        done += chunk.len() as u64;
        progress.update("unwinding", done, total);
    }

    let lines = symbolicate(
        &agg.frames,
        &prepared.images,
        &prepared.jit_maps,
        !options.no_inline,
        progress,
    );
    Ok(build_profile(reader, trace_name, prepared, agg, lines))
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
        s.weight = s.weight.saturating_add(u.weight);
        self.stack_clean[id as usize] += u64::from(u.clean);
        let t = &mut self.thread_samples[u.thread as usize];
        t.0 += 1;
        t.1 = t.1.saturating_add(u.weight);
        self.kernel_chain += u64::from(u.used_kernel_chain);
        self.presymbolized += u64::from(u.presymbolized);
        if self.keep_sequences {
            let seq = &mut self.sequences[u.thread as usize];
            match seq.last_mut() {
                Some(last) if last.stack == id => {
                    last.samples += 1;
                    last.weight = last.weight.saturating_add(u.weight);
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

fn source_text(s: &Source) -> String {
    s.to_string()
}

fn build_profile<D: AsRef<[u8]>>(
    reader: &TraceReader<D>,
    trace_name: &str,
    prepared: Prepared,
    agg: Aggregator,
    lines: Vec<Resolved>,
) -> Profile {
    let Prepared {
        timeline,
        images,
        mut warnings,
        ..
    } = prepared;
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
            idle_ticks: t.idle_ticks,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::NoProgress;
    use crate::output::OutputFormat;
    use lrnprof_format::*;

    fn sample(time: u64, frames: Vec<u64>) -> Record {
        Record::Sample(lrnprof_format::Sample {
            time: Timestamp(time),
            pid: Pid(1),
            tid: Tid(1),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight: 1000,
            regs: Regs::X86_64(RegsX86_64::default()),
            stack: StackSnapshot::default(),
            kernel_callchain: Vec::new(),
            frames,
        })
    }

    fn map(time: u64, path: &str, id: u8) -> Record {
        Record::ImageMap(ImageMapRecord {
            time: Timestamp(time),
            pid: Pid(1),
            start: 0x10000,
            end: 0x20000,
            file_offset: 0,
            path: path.into(),
            build_id: Some(BuildId(vec![id])),
            kind: ImageKind::File,
            executable: true,
        })
    }

    /// A pre-unwound trace: one address range holds liba.so, then is
    /// unmapped and reused by libb.so; plus a JIT frame and a frame outside
    /// every image, and idle ticks of the thread.
    fn synthetic_trace(path: &Path) {
        let records = vec![
            Record::Thread(ThreadRecord {
                time: Timestamp(1),
                pid: Pid(1),
                tid: Tid(1),
                event: ThreadEvent::Existing,
                name: Some("main".into()),
            }),
            map(2, "/nonexistent/liba.so", 1),
            Record::Idle(IdleRecord {
                time: Timestamp(3),
                pid: Pid(1),
                tid: Tid(1),
                ticks: 7,
            }),
            sample(10, vec![0x10100, 0x10200]),
            Record::ImageUnmap(ImageUnmapRecord {
                time: Timestamp(20),
                pid: Pid(1),
                start: 0x10000,
                end: 0x20000,
            }),
            map(30, "/nonexistent/libb.so", 2),
            sample(40, vec![0x10100]),
            sample(2_000_000_050, vec![0x5010, 0x999]),
            // exec drops every image: the same address is now unknown.
            Record::Process(ProcessRecord {
                time: Timestamp(2_000_000_060),
                pid: Pid(1),
                parent: None,
                event: ProcessEvent::Exec,
                command: vec!["other".into()],
                executable: None,
            }),
            sample(2_000_000_070, vec![0x10100]),
            Record::Blob(Blob {
                build_id: BuildId(Vec::new()),
                kind: BlobKind::JitMap { pid: Pid(1) },
                compressed: false,
                offset: 0,
                total_len: 19,
                data: b"5000 100 jitted_fn\n".to_vec(),
            }),
        ];
        write_trace_file(path, &records);
    }

    /// Write `records` as a finished trace at `path`.
    fn write_trace_file(path: &Path, records: &[Record]) {
        let mut out = Vec::new();
        let mut w =
            TraceWriter::new(&mut out, &TraceHeader::example(), WriterOptions::default()).unwrap();
        for r in records {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        std::fs::write(path, out).unwrap();
    }

    fn folded(path: &Path, options: &AnalyzeOptions) -> String {
        let profile = analyze(path, options, &NoProgress).unwrap();
        let mut out = Vec::new();
        OutputFormat::Folded
            .writer()
            .write(&profile, &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn image_map_over_time_jit_and_unknown_frames() {
        let path =
            std::env::temp_dir().join(format!("lrnprof-an-synth-{}.lpt", std::process::id()));
        synthetic_trace(&path);
        let options = AnalyzeOptions {
            offline: true,
            ..Default::default()
        };
        // Return addresses are looked up (and shown) one byte back.
        assert_eq!(
            folded(&path, &options),
            "main-1;0x10100 1\n\
             main-1;0x998;jitted_fn 1\n\
             main-1;liba.so+0x1ff;liba.so+0x100 1\n\
             main-1;libb.so+0x100 1\n"
        );
        let early = AnalyzeOptions {
            filter: SampleFilter {
                to_secs: Some(1.0),
                ..Default::default()
            },
            ..options.clone()
        };
        assert!(!folded(&path, &early).contains("jitted_fn"));
        let none = AnalyzeOptions {
            filter: SampleFilter {
                tid: Some(Tid(99)),
                ..Default::default()
            },
            ..options.clone()
        };
        assert!(matches!(
            analyze(&path, &none, &NoProgress),
            Err(AnalyzeError::NothingSelected(_))
        ));
        let profile = analyze(&path, &options, &NoProgress).unwrap();
        assert_eq!(profile.stats.samples, 4);
        // Idle ticks are counted per thread, shown by info, not sampled.
        assert_eq!(profile.threads[0].idle_ticks, 7);
        let info = crate::info::TraceInfo::new(&profile);
        assert_eq!(info.threads[0].idle_ticks, 7);
        assert!(
            info.to_text().contains("idle at 7 ticks"),
            "{}",
            info.to_text()
        );
        assert_eq!(profile.stats.unknown_frames, 5, "{:?}", profile.locations);
        assert!(
            profile.warnings.iter().any(|w| w.contains("liba.so (01)")),
            "{:?}",
            profile.warnings
        );
        std::fs::remove_file(&path).unwrap();
    }

    /// Untrusted traces: random registers, stacks, mappings (of a real
    /// image with unwind data), callchains and frames must never panic.
    #[test]
    fn random_garbage_never_panics() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let exe = std::env::current_exe()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut records = Vec::new();
        for i in 0..400u64 {
            let r = next();
            let record = match r % 4 {
                0 => Record::ImageMap(ImageMapRecord {
                    time: Timestamp(i),
                    pid: Pid(1),
                    start: next() & 0xffff_f000,
                    end: next() & 0xffff_ffff,
                    file_offset: if r & 16 == 0 { next() } else { next() & 0xf000 },
                    path: exe.clone(),
                    build_id: None,
                    kind: ImageKind::File,
                    executable: r & 32 == 0,
                }),
                1 => Record::ImageUnmap(ImageUnmapRecord {
                    time: Timestamp(i),
                    pid: Pid(1),
                    start: next() & 0xffff_f000,
                    end: next() & 0xffff_ffff,
                }),
                _ => {
                    let sp = next() & 0xffff_fff8;
                    let stack: Vec<u8> = (0..(next() % 512)).map(|_| next() as u8).collect();
                    Record::Sample(lrnprof_format::Sample {
                        time: Timestamp(i),
                        pid: Pid(1),
                        tid: Tid((r % 3) as u32),
                        cpu: None,
                        kind: SampleKind::CpuTime,
                        weight: next(),
                        regs: if r & 8 == 0 {
                            Regs::X86_64(RegsX86_64 {
                                ip: next() & 0xffff_ffff,
                                sp,
                                bp: next(),
                            })
                        } else {
                            Regs::Aarch64(RegsAarch64 {
                                pc: next(),
                                sp,
                                fp: next(),
                                lr: next(),
                            })
                        },
                        stack: StackSnapshot {
                            start: sp,
                            bytes: stack,
                        },
                        kernel_callchain: (0..next() % 8).map(|_| next()).collect(),
                        frames: if r & 64 == 0 {
                            Vec::new()
                        } else {
                            vec![next(), next()]
                        },
                    })
                }
            };
            records.push(record);
        }
        let path =
            std::env::temp_dir().join(format!("lrnprof-an-garbage-{}.lpt", std::process::id()));
        write_trace_file(&path, &records);
        for format in [
            OutputFormat::Pprof,
            OutputFormat::Folded,
            OutputFormat::Speedscope,
        ] {
            let options = AnalyzeOptions {
                keep_sequences: true,
                ..Default::default()
            };
            let profile = analyze(&path, &options, &NoProgress).unwrap();
            assert!(profile.stats.samples > 0);
            format.writer().write(&profile, &mut Vec::new()).unwrap();
        }
        std::fs::remove_file(&path).unwrap();
    }
}
