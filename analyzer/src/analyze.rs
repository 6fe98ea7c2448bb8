//! The analysis pipeline: first pass (timeline, blobs), image loading,
//! parallel unwinding block by block, streaming aggregation in trace
//! order into a [`ProfileBuilder`], then symbolication of each unique
//! address once.

use crate::error::AnalyzeError;
use crate::kept::KeptArena;
#[cfg(test)]
use crate::options::SampleFilter;
use crate::options::{AnalyzeOptions, Progress};
use crate::ordered::for_each_in_order;
use crate::pipeline::{open, pool, prepare_keeping, TraceBytes};
use crate::profile::{kinds_of, HeapScale, Profile, ProfileBuilder, UnwoundBlock};
use crate::symbolicate::symbolicate;
use crate::timeline::chunk_blocks;
use crate::unwind::{unwind_block, BlockContext};
use lrnprof_format::{BlockInfo, Timestamp, TraceReader};
use std::path::Path;
use std::sync::Mutex;

/// Decompressed bytes of blocks the first pass keeps for the second
/// (bytes): a trace whose blocks fit is decompressed once, and memory
/// stays bounded for longer ones.
const KEPT_BLOCKS_BUDGET: u64 = 32 << 20;

/// Analyze the trace at `path`, on a pool of `options.jobs` workers.
pub fn analyze(
    path: &Path,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    analyze_in(&pool(options.jobs)?, path, options, progress)
}

/// Analyze the trace at `path` on the workers of `pool` (`options.jobs`
/// is not looked at): a caller that writes the profile on the same pool
/// starts its workers once.
pub fn analyze_in(
    pool: &rayon::ThreadPool,
    path: &Path,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    let reader = open(path, options)?;
    let name = match path.file_name() {
        _ if path == Path::new("-") => "stdin".to_string(),
        Some(n) => n.to_string_lossy().into_owned(),
        None => String::new(),
    };
    let result = pool.install(|| run(&reader, &name, options, progress));
    progress.finish();
    let profile = result?;
    let by_sample = options.filter != Default::default();
    let by_stack = !options.stacks.is_empty();
    if (by_sample || by_stack) && profile.stats.samples == 0 && profile.stats.trace_samples > 0 {
        let mut why = match (by_sample, by_stack) {
            (true, false) => options.filter.describe(),
            (true, true) => format!(
                "{} {}",
                options.filter.describe(),
                options.stacks.describe()
            ),
            // The stack filter alone left nothing.
            (false, _) => format!(
                "{}: no stack has functions so named; `lrnprof-analyze top TRACE -n 0` \
                 lists the names",
                options.stacks.describe()
            ),
        };
        if options.filter.cgroup.is_some() && profile.processes.iter().all(|p| p.cgroup.is_none()) {
            why.push_str(
                ": the trace recorded no cgroups; only `lrnprof-rec --all` and `--kernel` recordings do",
            );
        }
        return Err(AnalyzeError::NothingSelected(why));
    }
    Ok(profile)
}

fn run(
    reader: &TraceReader<TraceBytes>,
    trace_name: &str,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<Profile, AnalyzeError> {
    let kinds = kinds_of(reader.header());
    if let Some(value) = options.value {
        if !kinds.contains(&value) {
            return Err(AnalyzeError::ValueNotRecorded {
                value: value.name().to_string(),
                recorded: kinds
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    let mut arena = KeptArena::new(reader.blocks(), KEPT_BLOCKS_BUDGET);
    let kept = arena.blocks();
    let prepared = prepare_keeping(
        reader,
        options,
        progress,
        &|b| reader_release(reader, b),
        &kept,
    );
    let mut builder = ProfileBuilder::new(
        prepared.timeline.threads.len(),
        options.keep_sequences,
        options.every_sample,
        kinds,
        options.value,
    );
    let heap = reader.header().events.heap.as_ref().map(|h| HeapScale {
        mean_interval: h.mean_interval,
    });
    // Memory in use is counted at the end of the selected time range.
    let inuse_at = options.filter.to_secs.map(|secs| {
        Timestamp(
            reader
                .header()
                .start_time
                .0
                .saturating_add((secs.max(0.0) * 1e9) as u64),
        )
    });
    let cx = BlockContext {
        prepared: &prepared,
        filter: &options.filter,
        heap,
        inuse_at,
    };
    let blocks = reader.blocks();
    let total = blocks.len() as u64;
    // Blocks the builder is done with, their buffers for the next ones.
    let spare: Mutex<Vec<UnwoundBlock>> = Mutex::new(Vec::new());
    // Each block is decoded once and unwound by one worker; the builder
    // takes the blocks in trace order while the workers unwind the next.
    for_each_in_order(
        blocks.len(),
        chunk_blocks() * 2,
        |i| {
            if prepared.timeline.bad_blocks.contains(&i) {
                return UnwoundBlock::default();
            }
            let buffers = spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default();
            let unwound = match kept.take_or_decompress(reader, i) {
                Ok(raw) => unwind_block(&cx, &raw, buffers),
                Err(_) => UnwoundBlock::default(),
            };
            reader_release(reader, &blocks[i..=i]);
            unwound
        },
        |i, unwound| {
            builder.add_block(&unwound);
            spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(unwound);
            progress.update("unwinding", i as u64 + 1, total);
        },
    );
    drop(spare);
    // The kept blocks are all read: their memory goes back before
    // symbolication.
    drop(kept);
    drop(arena);

    let lines = symbolicate(
        builder.frames(),
        &prepared.images,
        &prepared.jit_maps,
        prepared.kernel_symbols.as_ref(),
        !options.no_inline,
        progress,
    );
    Ok(builder.finish(reader, trace_name, prepared, lines, &options.stacks))
}

/// Drop the trace pages of `blocks`, which the pass is done with.
fn reader_release(reader: &TraceReader<TraceBytes>, blocks: &[BlockInfo]) {
    reader.data().release(blocks);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::NoProgress;
    use crate::output::OutputFormat;
    use crate::profile::ValueKind;
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
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
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
                cgroup: None,
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
        write_trace_with(path, &TraceHeader::example(), records);
    }

    /// Write `records` as a finished trace with `header` at `path`.
    fn write_trace_with(path: &Path, header: &TraceHeader, records: &[Record]) {
        let mut out = Vec::new();
        let mut w = TraceWriter::new(&mut out, header, WriterOptions::default()).unwrap();
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
                        kernel_frames: Vec::new(),
                        flags: SampleFlags::default(),
                        detail: SampleDetail::None,
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

    fn event(
        time: u64,
        frames: Vec<u64>,
        kind: SampleKind,
        weight: u64,
        detail: SampleDetail,
    ) -> Record {
        let Record::Sample(s) = sample(time, frames) else {
            unreachable!()
        };
        Record::Sample(lrnprof_format::Sample {
            kind,
            weight,
            detail,
            ..s
        })
    }

    /// One thread that runs on CPU in liba+0x100, allocates 100 bytes
    /// (freed) and 50 bytes (never freed) in +0x200, makes a 5 ns syscall
    /// that fails in +0x300 and waits 1000 ns off CPU in +0x400.
    fn every_event_trace(path: &Path) {
        let mut header = TraceHeader::example();
        header.events = EventSettings {
            cpu: true,
            heap: Some(HeapSettings { mean_interval: 1 }),
            syscalls: Some(SyscallSettings {
                filter: Vec::new(),
                stack_size: 1024,
                stack_every: 1,
            }),
            off_cpu: Some(OffCpuSettings { stack_size: 1024 }),
        };
        let (p, t) = (Pid(1), Tid(1));
        let records = vec![
            Record::Thread(ThreadRecord {
                time: Timestamp(1),
                pid: p,
                tid: t,
                event: ThreadEvent::Existing,
                name: Some("main".into()),
            }),
            map(2, "/nonexistent/liba.so", 1),
            sample(10, vec![0x10100]),
            event(
                20,
                vec![0x10200],
                SampleKind::Allocation,
                100,
                SampleDetail::Allocation { address: 0xa1 },
            ),
            Record::Free(FreeRecord {
                time: Timestamp(25),
                pid: p,
                tid: t,
                address: 0xa1,
            }),
            event(
                30,
                vec![0x10200],
                SampleKind::Allocation,
                50,
                SampleDetail::Allocation { address: 0xa2 },
            ),
            event(
                40,
                vec![0x10300],
                SampleKind::Syscall,
                1,
                SampleDetail::Syscall {
                    nr: 2,
                    args: [0; 6],
                },
            ),
            Record::SyscallExit(SyscallExitRecord {
                time: Timestamp(45),
                pid: p,
                tid: t,
                nr: 2,
                ret: -2,
            }),
            event(
                50,
                vec![0x10400],
                SampleKind::OffCpu,
                0,
                SampleDetail::OffCpu { preempted: false },
            ),
            Record::SwitchIn(SwitchInRecord {
                time: Timestamp(1050),
                pid: p,
                tid: t,
            }),
        ];
        write_trace_with(path, &header, &records);
    }

    #[test]
    fn every_value_the_trace_recorded_is_a_profile_value() {
        let path =
            std::env::temp_dir().join(format!("lrnprof-an-values-{}.lpt", std::process::id()));
        every_event_trace(&path);
        let with = |value: Option<&str>| AnalyzeOptions {
            offline: true,
            value: value.map(|v| ValueKind::from_name(v).unwrap()),
            ..Default::default()
        };
        let profile = analyze(&path, &with(None), &NoProgress).unwrap();
        assert_eq!(profile.value_kinds.len(), 9);
        assert_eq!(profile.primary_value(), Some(ValueKind::Cpu));
        // Folded shows CPU sample counts unless asked otherwise.
        assert_eq!(folded(&path, &with(None)), "main-1;liba.so+0x100 1\n");
        for (value, expected) in [
            ("cpu", "main-1;liba.so+0x100 1000\n"),
            ("alloc_objects", "main-1;liba.so+0x200 2\n"),
            ("alloc_space", "main-1;liba.so+0x200 150\n"),
            ("inuse_objects", "main-1;liba.so+0x200 1\n"),
            ("inuse_space", "main-1;liba.so+0x200 50\n"),
            ("syscalls", "main-1;liba.so+0x300 1\n"),
            ("syscall_time", "main-1;liba.so+0x300 5\n"),
            ("off_cpu", "main-1;liba.so+0x400 1000\n"),
        ] {
            assert_eq!(
                folded(&path, &with(Some(value))),
                expected,
                "--value {value}"
            );
        }
        // Memory in use at the end of a range: the freed block was still
        // live 22 ns in.
        let early = AnalyzeOptions {
            filter: SampleFilter {
                to_secs: Some(22e-9),
                ..Default::default()
            },
            ..with(Some("inuse_space"))
        };
        assert_eq!(folded(&path, &early), "main-1;liba.so+0x200 100\n");
        // A value the trace did not record is an error that lists the others.
        let err = analyze(&path, &with(Some("cycles")), &NoProgress).unwrap_err();
        assert!(
            matches!(err, AnalyzeError::ValueNotRecorded { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("inuse_space"), "{err}");
        // pprof has every sample type, the selected one as its default.
        let profile = analyze(&path, &with(Some("syscall_time")), &NoProgress).unwrap();
        let pb = crate::output::pprof_bytes(&profile);
        for name in [
            "alloc_objects",
            "inuse_space",
            "syscall_time",
            "off_cpu",
            "bytes",
        ] {
            assert!(
                pb.windows(name.len()).any(|w| w == name.as_bytes()),
                "{name}"
            );
        }
        // speedscope weighs bytes in bytes.
        let profile = analyze(
            &path,
            &AnalyzeOptions {
                keep_sequences: true,
                ..with(Some("alloc_space"))
            },
            &NoProgress,
        )
        .unwrap();
        let mut out = Vec::new();
        OutputFormat::Speedscope
            .writer()
            .write(&profile, &mut out)
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["profiles"][0]["unit"], "bytes");
        assert_eq!(json["profiles"][0]["weights"], serde_json::json!([150]));
        let info = crate::info::TraceInfo::new(&profile);
        assert!(info.events.contains("every allocation"), "{}", info.events);
        assert!(
            info.to_text().contains("syscall_time 0.000 s"),
            "{}",
            info.to_text()
        );
        assert!(
            info.to_text().contains(
                "events:       1 CPU samples, 2 sampled allocations, \
                 1 frees of sampled allocations, 1 system calls, 1 switch-outs\n"
            ),
            "{}",
            info.to_text()
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn allocation_stacks_start_below_the_allocation_sampler() {
        let path =
            std::env::temp_dir().join(format!("lrnprof-an-sampler-{}.lpt", std::process::id()));
        let mut header = TraceHeader::example();
        header.events.heap = Some(HeapSettings { mean_interval: 1 });
        let sampler = Record::ImageMap(ImageMapRecord {
            start: 0x30000,
            end: 0x40000,
            path: "/run/user/1/lrnprof/liblrnprof_preload-0123456789abcdef.so".into(),
            build_id: Some(BuildId(vec![9])),
            ..match map(2, "x", 0) {
                Record::ImageMap(m) => m,
                _ => unreachable!(),
            }
        });
        // Unwound: two frames in the sampler, then the program's.
        let frames = vec![0x30100, 0x30200, 0x10100, 0x10200];
        let records = vec![
            map(1, "/nonexistent/liba.so", 1),
            sampler,
            event(
                10,
                frames.clone(),
                SampleKind::Allocation,
                64,
                SampleDetail::Allocation { address: 0xa0 },
            ),
            // A CPU sample in the sampler is the sampler's cost: kept.
            sample(20, frames),
        ];
        write_trace_with(&path, &header, &records);
        let with = |value: &str| AnalyzeOptions {
            offline: true,
            value: ValueKind::from_name(value),
            ..Default::default()
        };
        assert_eq!(
            folded(&path, &with("alloc_space")),
            "tid-1;liba.so+0x1ff;liba.so+0xff 64\n"
        );
        assert_eq!(
            folded(&path, &with("cpu")),
            "tid-1;liba.so+0x1ff;liba.so+0xff;\
             liblrnprof_preload-0123456789abcdef.so+0x1ff;\
             liblrnprof_preload-0123456789abcdef.so+0x100 1000\n"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn cycle_samples_are_labelled_cycles() {
        let path =
            std::env::temp_dir().join(format!("lrnprof-an-cycles-{}.lpt", std::process::id()));
        let mut header = TraceHeader::example();
        header.sampling.event = SampleEvent::Cycles;
        let records = vec![
            map(2, "/nonexistent/liba.so", 1),
            event(
                10,
                vec![0x10100],
                SampleKind::Cycles,
                3_000_000,
                SampleDetail::None,
            ),
            event(
                20,
                vec![0x10100],
                SampleKind::Cycles,
                1_000_000,
                SampleDetail::None,
            ),
        ];
        write_trace_with(&path, &header, &records);
        let options = AnalyzeOptions {
            offline: true,
            keep_sequences: true,
            ..Default::default()
        };
        let profile = analyze(&path, &options, &NoProgress).unwrap();
        assert_eq!(profile.value_kinds, [ValueKind::Samples, ValueKind::Cycles]);
        assert_eq!(profile.stacks[0].values, [2, 4_000_000]);
        let pb = crate::output::pprof_bytes(&profile);
        let has = |s: &str| pb.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has("cycles") && !has("nanoseconds"), "cycles are not time");
        let mut out = Vec::new();
        OutputFormat::Speedscope
            .writer()
            .write(&profile, &mut out)
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["profiles"][0]["unit"], "none");
        let info = crate::info::TraceInfo::new(&profile);
        assert!(info.events.contains("cycle counter"), "{}", info.events);
        std::fs::remove_file(&path).unwrap();
    }

    /// A system call's stack copy is small (1 KiB by default), so its
    /// samples seldom reach the root: the share of each kind is told
    /// apart, also where samples of two kinds share a stack.
    #[test]
    fn the_share_that_reached_the_root_is_told_per_kind() {
        let path =
            std::env::temp_dir().join(format!("lrnprof-an-rootkind-{}.lpt", std::process::id()));
        let mut header = TraceHeader::example();
        header.events.syscalls = Some(SyscallSettings {
            filter: Vec::new(),
            stack_size: 1024,
            stack_every: 1,
        });
        let with = |time, kind, flags, detail| match sample(time, vec![0x10100, 0x10200]) {
            Record::Sample(s) => Record::Sample(lrnprof_format::Sample {
                kind,
                flags,
                detail,
                ..s
            }),
            _ => unreachable!(),
        };
        let call = SampleDetail::Syscall {
            nr: 1,
            args: [0; 6],
        };
        let records = vec![
            map(1, "/nonexistent/liba.so", 1),
            with(
                10,
                SampleKind::CpuTime,
                SampleFlags::REACHED_ROOT,
                SampleDetail::None,
            ),
            with(
                20,
                SampleKind::CpuTime,
                SampleFlags::REACHED_ROOT,
                SampleDetail::None,
            ),
            with(30, SampleKind::Syscall, SampleFlags::default(), call),
            with(40, SampleKind::Syscall, SampleFlags::default(), call),
            with(50, SampleKind::Syscall, SampleFlags::REACHED_ROOT, call),
        ];
        write_trace_with(&path, &header, &records);
        let options = AnalyzeOptions {
            offline: true,
            ..Default::default()
        };
        let profile = analyze(&path, &options, &NoProgress).unwrap();
        let st = &profile.stats;
        assert_eq!((st.samples, st.root_samples), (5, 3));
        let kinds = st.root_by_kind;
        assert_eq!((kinds.cpu.samples, kinds.cpu.root_samples), (2, 2));
        assert_eq!(
            (kinds.syscalls.samples, kinds.syscalls.root_samples),
            (3, 1)
        );
        assert_eq!(kinds.allocations.samples + kinds.off_cpu.samples, 0);
        assert_eq!(
            st.root_by_kind_text().as_deref(),
            Some("CPU samples 100.0%, system calls 33.3%")
        );
        let text = crate::info::TraceInfo::new(&profile).to_text();
        assert!(
            text.contains("(CPU samples 100.0%, system calls 33.3%)")
                && text.contains("copied up to 1024 bytes"),
            "{text}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
