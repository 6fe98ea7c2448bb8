//! `syscall_report` on synthetic traces with pre-unwound frames.

use super::*;
use crate::options::{NoProgress, SampleFilter};
use lrnprof_format::*;

/// `liba.so` (the program) at 0x10000, `libc.so.6` at 0x30000.
fn map(time: u64, path: &str, start: u64) -> Record {
    Record::ImageMap(ImageMapRecord {
        time: Timestamp(time),
        pid: Pid(1),
        start,
        end: start + 0x10000,
        file_offset: 0,
        path: path.into(),
        build_id: Some(BuildId(vec![start as u8 + 1])),
        kind: ImageKind::File,
        executable: true,
    })
}

/// A syscall entry of thread `tid` at `time`, made from libc's wrapper
/// (0x30100) called at liba.so+`site`.
fn enter(time: u64, tid: u32, nr: u32, site: u64) -> Record {
    Record::Sample(Sample {
        time: Timestamp(time),
        pid: Pid(1),
        tid: Tid(tid),
        cpu: None,
        kind: SampleKind::Syscall,
        weight: 1,
        regs: Regs::X86_64(RegsX86_64::default()),
        stack: StackSnapshot::default(),
        kernel_callchain: Vec::new(),
        frames: vec![0x30100, 0x10000 + site, 0x10900],
        kernel_frames: Vec::new(),
        flags: SampleFlags::default(),
        detail: SampleDetail::Syscall { nr, args: [0; 6] },
    })
}

fn exit(time: u64, tid: u32, nr: u32, ret: i64) -> Record {
    Record::SyscallExit(SyscallExitRecord {
        time: Timestamp(time),
        pid: Pid(1),
        tid: Tid(tid),
        nr,
        ret,
    })
}

const WRITE: u32 = 1;
const OPENAT: u32 = 257;
const EXIT_GROUP: u32 = 231;

/// A header of syscall tracing with 1 KiB stacks, one call in
/// `stack_every` recorded.
fn syscall_header(stack_every: u32) -> TraceHeader {
    let mut header = TraceHeader::example();
    header.events = EventSettings {
        cpu: false,
        syscalls: Some(SyscallSettings {
            filter: Vec::new(),
            stack_size: 1024,
            stack_every,
        }),
        ..EventSettings::default()
    };
    header
}

/// Thread 1 writes 11 times at liba+0x200 (100 ns each, the last 5 ms);
/// thread 2 fails to open 3 times at liba+0x300 (ENOENT), then exits
/// the process.
fn trace(path: &Path) {
    let header = syscall_header(1);
    let mut records = vec![
        map(1, "/nonexistent/liba.so", 0x10000),
        map(1, "/nonexistent/libc.so.6", 0x30000),
    ];
    let mut t = 1000;
    for i in 0..11 {
        records.push(enter(t, 1, WRITE, 0x200));
        let took = if i == 10 { 5_000_000 } else { 100 };
        records.push(exit(t + took, 1, WRITE, 1));
        t += took + 1000;
    }
    for _ in 0..3 {
        records.push(enter(t, 2, OPENAT, 0x300));
        records.push(exit(t + 50, 2, OPENAT, -2));
        t += 1000;
    }
    records.push(enter(t, 2, EXIT_GROUP, 0x400));
    records.push(Record::Thread(ThreadRecord {
        time: Timestamp(t + 10),
        pid: Pid(1),
        tid: Tid(2),
        event: ThreadEvent::Exit,
        name: None,
    }));
    let mut out = Vec::new();
    let mut w = TraceWriter::new(&mut out, &header, WriterOptions::default()).unwrap();
    for r in &records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    std::fs::write(path, out).unwrap();
}

fn options() -> SyscallReportOptions {
    SyscallReportOptions {
        analyze: AnalyzeOptions {
            offline: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("lrnprof-sc-{name}-{}.lpt", std::process::id()))
}

#[test]
fn counts_errors_sites_and_slow_calls() {
    let path = temp("all");
    trace(&path);
    let r = syscall_report(&path, &options(), &NoProgress).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!((r.calls, r.errors, r.lost), (15, 3, 0));
    let names: Vec<&str> = r.syscalls.iter().map(|s| s.syscall.as_str()).collect();
    assert_eq!(
        names,
        ["write", "openat", "exit_group"],
        "the most time first"
    );
    let write = &r.syscalls[0];
    assert_eq!(
        (write.calls, write.errors, write.max_ns),
        (11, 0, 5_000_000)
    );
    assert_eq!(write.total_ns, 5_001_000);
    // The call site is the caller of libc's wrapper, one byte back.
    assert_eq!(write.call_sites.len(), 1);
    assert_eq!(write.call_sites[0].site.function, "liba.so+0x1ff");
    assert_eq!(write.call_sites[0].median_ns, 100);
    assert_eq!(write.slow_calls.len(), 1);
    assert_eq!(write.slow_calls[0].duration_ns, 5_000_000);
    assert_eq!(write.slow_calls[0].tid, 1);
    let openat = &r.syscalls[1];
    assert_eq!((openat.calls, openat.errors), (3, 3));
    assert_eq!(openat.errnos, BTreeMap::from([("ENOENT".to_string(), 3)]));
    assert_eq!(openat.call_sites[0].site.function, "liba.so+0x2ff");
    assert!(openat.slow_calls.is_empty());
    let exit_group = &r.syscalls[2];
    assert_eq!((exit_group.calls, exit_group.unfinished), (1, 1));
}

#[test]
fn filters_by_name_class_thread_and_time() {
    let path = temp("filters");
    trace(&path);
    let with = |syscalls: &[&str], filter: SampleFilter| SyscallReportOptions {
        syscalls: syscalls.iter().map(|s| s.to_string()).collect(),
        analyze: AnalyzeOptions {
            filter,
            ..options().analyze
        },
        ..options()
    };
    let report = |o: &SyscallReportOptions| syscall_report(&path, o, &NoProgress);
    let file = report(&with(&["%file"], SampleFilter::default())).unwrap();
    assert_eq!(file.calls, 3);
    let both = report(&with(&["write,exit_group"], SampleFilter::default())).unwrap();
    assert_eq!(both.calls, 12);
    let thread = report(&with(
        &[],
        SampleFilter {
            tid: Some(Tid(2)),
            ..Default::default()
        },
    ))
    .unwrap();
    assert_eq!(thread.calls, 4);
    let late = SampleFilter {
        from_secs: Some(5e-3),
        ..Default::default()
    };
    assert_eq!(report(&with(&[], late)).unwrap().calls, 4);
    assert!(matches!(
        report(&with(&["wirte"], SampleFilter::default())),
        Err(AnalyzeError::SyscallFilter(_))
    ));
    assert!(matches!(
        report(&with(&["%network"], SampleFilter::default())),
        Err(AnalyzeError::NothingSelected(_))
    ));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_trace_without_syscalls_says_how_to_record_them() {
    let path = temp("none");
    let mut out = Vec::new();
    TraceWriter::new(&mut out, &TraceHeader::example(), WriterOptions::default())
        .unwrap()
        .finish()
        .unwrap();
    std::fs::write(&path, out).unwrap();
    let err = syscall_report(&path, &options(), &NoProgress).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert!(err.to_string().contains("lrnprof-rec --syscalls"), "{err}");
}

#[test]
fn wrapper_images_are_libc_the_loader_and_the_vdso() {
    for p in [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/ld-linux-aarch64.so.1",
        "[vdso]",
        "/lib/ld-musl-x86_64.so.1",
    ] {
        assert!(is_system_wrapper(p), "{p}");
    }
    for p in [
        "/usr/bin/python3",
        "/usr/lib/libcurl.so.4",
        "/lib/libcap.so.2",
    ] {
        assert!(!is_system_wrapper(p), "{p}");
    }
}

/// One write in 4 recorded: thread 1 made 12 writes, of which 3 were
/// recorded (at two sites), and 2 more failed writes at a third site of
/// which 1 was recorded; the tally says the rest.
#[test]
fn tallies_make_counts_exact_and_scale_call_sites() {
    let path = temp("tally");
    let header = syscall_header(4);
    let mut records = vec![
        map(1, "/nonexistent/liba.so", 0x10000),
        map(1, "/nonexistent/libc.so.6", 0x30000),
    ];
    let mut t = 1000;
    for (site, ret) in [(0x200, 1), (0x200, 1), (0x300, 1), (0x400, -9)] {
        records.push(enter(t, 1, WRITE, site));
        records.push(exit(t + 400, 1, WRITE, ret));
        t += 1000;
    }
    records.push(Record::SyscallTally(SyscallTallyRecord {
        time: Timestamp(t),
        from: Timestamp(1),
        pid: Pid(1),
        tid: Tid(1),
        nr: WRITE,
        calls: 16,
        finished: 16,
        errors: 2,
        total_ns: 4_000,
        max_ns: 400,
        sampled_calls: 4,
        sampled_finished: 4,
        sampled_errors: 1,
        sampled_ns: 1_600,
    }));
    let mut out = Vec::new();
    let mut w = TraceWriter::new(&mut out, &header, WriterOptions::default()).unwrap();
    for r in &records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    std::fs::write(&path, out).unwrap();
    let r = syscall_report(&path, &options(), &NoProgress).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(r.stack_every, 4);
    let write = &r.syscalls[0];
    assert_eq!(write.stack_every, 4, "said per syscall too (--json)");
    // Exact: tallied calls, plus recorded, minus recorded and tallied.
    assert_eq!((write.calls, write.errors, write.unfinished), (16, 2, 0));
    assert_eq!((write.total_ns, write.max_ns), (4_000, 400));
    // The one recorded EBADF stands for both errors.
    assert_eq!(write.errnos, BTreeMap::from([("EBADF".to_string(), 2)]));
    // Each recorded call stands for 4; the exact time is shared by the
    // sites' recorded time.
    let site = |f: &str| {
        let s = write
            .call_sites
            .iter()
            .find(|s| s.site.function == f)
            .unwrap();
        (s.calls, s.errors, s.total_ns)
    };
    assert_eq!(site("liba.so+0x1ff"), (8, 0, 2_000));
    assert_eq!(site("liba.so+0x2ff"), (4, 0, 1_000));
    assert_eq!(site("liba.so+0x3ff"), (4, 4, 1_000));
    assert!(r.warnings.iter().any(|w| w.contains("one call in 4")));
}

#[test]
fn errno_counts_scale_to_the_exact_errors() {
    let counts = BTreeMap::from([("EBADF".to_string(), 2), ("ENOENT".to_string(), 1)]);
    let scaled = scale_counts(counts.clone(), 10);
    assert_eq!(scaled.values().sum::<u64>(), 10);
    assert_eq!(scaled["ENOENT"], 3);
    assert_eq!(scale_counts(counts.clone(), 3), counts);
    assert_eq!(
        scale_counts(BTreeMap::new(), 2),
        BTreeMap::from([("(not recorded)".to_string(), 2)])
    );
}
