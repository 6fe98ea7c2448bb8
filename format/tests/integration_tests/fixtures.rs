//! Records of every kind, for the tests to write and read back.

use lrnprof_format::*;

/// A deterministic pseudo-random byte pattern.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A sample of thread `tid` whose stack is `depth` bytes below a fixed stack
/// top, with bytes that stay the same near the top as real stacks do.
pub fn sample(time: u64, tid: u32, depth: usize) -> Sample {
    let top = 0x7fff_0000_0000u64 + u64::from(tid) * 0x10_0000;
    let whole = pattern(64 * 1024, u64::from(tid));
    let mut bytes = whole[whole.len() - depth..].to_vec();
    // The leaf part changes from sample to sample.
    let leaf = pattern(depth.min(128), time);
    bytes[..leaf.len()].copy_from_slice(&leaf);
    Sample {
        time: Timestamp(time),
        pid: Pid(100),
        tid: Tid(tid),
        cpu: Some(tid % 2),
        kind: SampleKind::CpuTime,
        weight: 1_000_000,
        regs: Regs::X86_64(RegsX86_64 {
            ip: 0x40_1000 + time % 0x100,
            sp: top - depth as u64,
            bp: top - 16,
        }),
        stack: StackSnapshot {
            start: top - depth as u64,
            bytes,
        },
        kernel_callchain: if tid.is_multiple_of(2) {
            vec![0x40_1000, 0x40_2000]
        } else {
            vec![]
        },
        frames: vec![],
        kernel_frames: Vec::new(),
        flags: SampleFlags::default(),
        detail: SampleDetail::None,
    }
}

/// One record of each kind and each variant of the current version, in
/// time order.
pub fn every_kind() -> Vec<Record> {
    let mut records = every_kind_of_v2();
    let summary = records.pop().expect("a summary");
    records.extend(added_in_v3());
    records.push(summary);
    records
}

/// Records that version 3 added.
pub fn added_in_v3() -> Vec<Record> {
    vec![Record::SyscallTally(SyscallTallyRecord {
        time: Timestamp(1_000_000_029),
        from: Timestamp(29),
        pid: Pid(100),
        tid: Tid(101),
        nr: 1,
        calls: 1_000,
        finished: 999,
        errors: 3,
        total_ns: 2_500_000,
        max_ns: 90_000,
        sampled_calls: 16,
        sampled_finished: 16,
        sampled_errors: 1,
        sampled_ns: 41_000,
    })]
}

/// One record of each kind and each variant of version 2, in time order.
pub fn every_kind_of_v2() -> Vec<Record> {
    let mut records = every_kind_in_committed_v1();
    let summary = records.pop().expect("a summary");
    records.push(Record::Idle(IdleRecord {
        time: Timestamp(12),
        pid: Pid(100),
        tid: Tid(100),
        ticks: 250,
    }));
    records.extend(added_in_v2());
    records.push(summary);
    records
}

/// Records and fields that version 2 added.
pub fn added_in_v2() -> Vec<Record> {
    vec![
        Record::Process(ProcessRecord {
            time: Timestamp(20),
            pid: Pid(300),
            parent: Some(Pid(1)),
            event: ProcessEvent::Existing,
            command: vec!["/srv/api".into()],
            executable: Some("/srv/api".into()),
            cgroup: Some("/system.slice/docker-4f2a.scope".into()),
        }),
        Record::Sample(Sample {
            kind: SampleKind::Allocation,
            weight: 4096,
            detail: SampleDetail::Allocation {
                address: 0x5555_0000_1000,
            },
            ..sample(21, 100, 512)
        }),
        Record::Free(FreeRecord {
            time: Timestamp(22),
            pid: Pid(100),
            tid: Tid(101),
            address: 0x5555_0000_1000,
        }),
        Record::Sample(Sample {
            kind: SampleKind::Syscall,
            weight: 1,
            detail: SampleDetail::Syscall {
                nr: 1,
                args: [1, 0x5555_0000_2000, 12, 0, 0, u64::MAX],
            },
            kernel_frames: vec![0xffff_ffff_8100_1000, 0xffff_ffff_8100_2000],
            ..sample(23, 100, 600)
        }),
        Record::SyscallExit(SyscallExitRecord {
            time: Timestamp(24),
            pid: Pid(100),
            tid: Tid(100),
            nr: 1,
            ret: -9,
        }),
        Record::Sample(Sample {
            kind: SampleKind::OffCpu,
            weight: 0,
            detail: SampleDetail::OffCpu { preempted: true },
            flags: SampleFlags::STACK_CUT_SHORT,
            ..sample(25, 100, 700)
        }),
        Record::SwitchIn(SwitchInRecord {
            time: Timestamp(26),
            pid: Pid(100),
            tid: Tid(100),
        }),
        Record::Sample(Sample {
            kind: SampleKind::Cycles,
            weight: 2_500_000,
            flags: SampleFlags::REACHED_ROOT,
            frames: vec![0x40_1000, 0x40_2000],
            stack: StackSnapshot::default(),
            ..sample(27, 102, 16)
        }),
        Record::Lost(LostRecord {
            time: Timestamp(28),
            pid: Some(Pid(100)),
            tid: None,
            count: 7,
            source: LostSource::HeapSampler,
        }),
        Record::Lost(LostRecord {
            time: Timestamp(28),
            pid: None,
            tid: None,
            count: 1,
            source: LostSource::Recorder,
        }),
        Record::Blob(Blob {
            build_id: BuildId(vec![0xab; 20]),
            kind: BlobKind::KernelSymbols,
            compressed: false,
            offset: 0,
            total_len: 39,
            data: b"ffffffff81000000 T _stext\nffffffff8100\n".to_vec(),
        }),
        Record::Blob(Blob {
            build_id: BuildId(vec![0xde, 0xad, 0xbe, 0xef]),
            kind: BlobKind::Table {
                name: "frames".into(),
            },
            compressed: true,
            offset: 0,
            total_len: 2,
            data: vec![0, 1],
        }),
    ]
}

/// The records of every kind that `tests/data/v1.lpt` holds, as a version-2
/// reader returns them: the format gained `Idle` records before its first
/// release, after that file was made.
pub fn every_kind_in_committed_v1() -> Vec<Record> {
    vec![
        Record::Process(ProcessRecord {
            time: Timestamp(1),
            pid: Pid(100),
            parent: Some(Pid(1)),
            event: ProcessEvent::Existing,
            command: vec!["./app".into(), "--flag".into()],
            executable: Some("/usr/bin/app".into()),
            cgroup: None,
        }),
        Record::Thread(ThreadRecord {
            time: Timestamp(2),
            pid: Pid(100),
            tid: Tid(100),
            event: ThreadEvent::Existing,
            name: Some("app".into()),
        }),
        Record::ImageMap(ImageMapRecord {
            time: Timestamp(3),
            pid: Pid(100),
            start: 0x40_0000,
            end: 0x48_0000,
            file_offset: 0,
            path: "/usr/bin/app".into(),
            build_id: Some(BuildId(vec![0xde, 0xad, 0xbe, 0xef])),
            kind: ImageKind::File,
            executable: true,
        }),
        Record::ImageMap(ImageMapRecord {
            time: Timestamp(3),
            pid: Pid(100),
            start: 0x7fff_f7fc_1000,
            end: 0x7fff_f7fc_3000,
            file_offset: 0,
            path: "[vdso]".into(),
            build_id: None,
            kind: ImageKind::Vdso,
            executable: true,
        }),
        Record::Sample(sample(4, 100, 4096)),
        Record::Sample(Sample {
            regs: Regs::Aarch64(RegsAarch64 {
                pc: 0x1_0000_4000,
                sp: 0x1_6fdf_f000,
                fp: 0x1_6fdf_f040,
                lr: 0x1_0000_3ff0,
            }),
            frames: vec![0x1_0000_4000, 0x1_0000_3ff0],
            stack: StackSnapshot::default(),
            ..sample(5, 101, 16)
        }),
        Record::Thread(ThreadRecord {
            time: Timestamp(6),
            pid: Pid(100),
            tid: Tid(102),
            event: ThreadEvent::Start,
            name: None,
        }),
        Record::Thread(ThreadRecord {
            time: Timestamp(6),
            pid: Pid(100),
            tid: Tid(102),
            event: ThreadEvent::Rename,
            name: Some("worker-1".into()),
        }),
        Record::Lost(LostRecord {
            time: Timestamp(7),
            pid: Some(Pid(100)),
            tid: None,
            count: 3,
            source: LostSource::Kernel,
        }),
        Record::ImageUnmap(ImageUnmapRecord {
            time: Timestamp(8),
            pid: Pid(100),
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
        }),
        Record::Thread(ThreadRecord {
            time: Timestamp(9),
            pid: Pid(100),
            tid: Tid(102),
            event: ThreadEvent::Exit,
            name: None,
        }),
        Record::Process(ProcessRecord {
            time: Timestamp(10),
            pid: Pid(101),
            parent: Some(Pid(100)),
            event: ProcessEvent::Fork,
            command: vec![],
            executable: None,
            cgroup: None,
        }),
        Record::Process(ProcessRecord {
            time: Timestamp(11),
            pid: Pid(101),
            parent: Some(Pid(100)),
            event: ProcessEvent::Exec,
            command: vec!["/bin/true".into()],
            executable: Some("/bin/true".into()),
            cgroup: None,
        }),
        Record::Process(ProcessRecord {
            time: Timestamp(12),
            pid: Pid(101),
            parent: None,
            event: ProcessEvent::Exit { code: Some(0) },
            command: vec![],
            executable: None,
            cgroup: None,
        }),
        Record::Blob(Blob {
            build_id: BuildId(vec![0xde, 0xad, 0xbe, 0xef]),
            kind: BlobKind::Section {
                name: ".eh_frame".into(),
                svma: 0x40_2000,
            },
            compressed: false,
            offset: 0,
            total_len: 3,
            data: vec![1, 2, 3],
        }),
        Record::Blob(Blob {
            build_id: BuildId(vec![]),
            kind: BlobKind::JitMap { pid: Pid(100) },
            compressed: false,
            offset: 0,
            total_len: 20,
            data: b"7f0000001000 10 jit\n".to_vec(),
        }),
        Record::Blob(Blob {
            build_id: BuildId(vec![1; 20]),
            kind: BlobKind::Image,
            compressed: true,
            offset: 0,
            total_len: 4,
            data: vec![9, 9, 9, 9],
        }),
        Record::Summary(Summary {
            end_time: Timestamp(13),
            samples: 2,
            lost: 3,
            threads: 3,
            images: 2,
        }),
    ]
}

/// Write `records` to a finished trace in memory.
pub fn write_trace(records: &[Record], block_size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let options = WriterOptions {
        block_size,
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::new(&mut out, &TraceHeader::example(), options).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    out
}

/// Many samples of a few threads, so the trace has many blocks.
pub fn many_samples(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| {
            Record::Sample(sample(
                1000 + i,
                200 + (i % 3) as u32,
                512 + (i as usize * 37) % 8000,
            ))
        })
        .collect()
}

/// All records of a trace, panicking on errors.
pub fn read_all(data: &[u8]) -> Vec<Record> {
    TraceReader::new(data)
        .unwrap()
        .records()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// Samples of one thread that switches between two unrelated 2 KiB stacks,
/// as an interpreter moving up and down does: every snapshot after the
/// second matches the one two samples back, not the latest.
pub fn alternating_stacks(n: u64) -> Vec<Record> {
    let top = 0x7ffe_0000_0000u64;
    let stacks = [pattern(2048, 41), pattern(2048, 42)];
    (0..n)
        .map(|i| {
            let bytes = stacks[(i % 2) as usize].clone();
            Record::Sample(Sample {
                stack: StackSnapshot {
                    start: top - bytes.len() as u64,
                    bytes,
                },
                ..sample(5000 + i, 400, 16)
            })
        })
        .collect()
}
