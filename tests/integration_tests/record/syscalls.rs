//! System calls and off-CPU time end to end: `lrnprof-rec --syscalls` /
//! `--off-cpu` on the `rec_syscalls` fixture, read back with
//! `lrnprof-analyze syscalls` (the library and the command), compared with
//! `strace -c -f` on the same program; a sleep's off-CPU time; a target
//! killed in the middle of a call; the errors of an unprivileged user.

use super::support::{
    assert_exit_code, assert_success, assert_time_ordered, launch, load, load_complete,
    perf_event_paranoid, recorder_for_nobody, refused_for_nobody, samples, NO_FP,
};
use lrnprof_analyzer::{
    analyze, syscall_report, AnalyzeOptions, NoProgress, OutputFormat, Profile, SampleFilter,
    SyscallReport, SyscallReportOptions, ValueKind,
};
use lrnprof_format::{syscall_number, Arch, Record, SampleKind, Target};
use lrnprof_tests::{
    build_c, has_program, is_root, lrnprof_analyze, lrnprof_rec_command, remove_scratch_dir,
    require_tracing, scratch_dir, skip, wait_until,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn build(dir: &Path) -> PathBuf {
    build_c(&["rec_syscalls.c"], NO_FP, dir, "rec_syscalls")
}

/// `profile` as folded stacks.
fn folded(profile: &Profile) -> String {
    let mut out = Vec::new();
    OutputFormat::Folded
        .writer()
        .write(profile, &mut out)
        .unwrap();
    String::from_utf8(out).unwrap()
}

fn report(trace: &Path, filter: SampleFilter) -> SyscallReport {
    let options = SyscallReportOptions {
        analyze: AnalyzeOptions {
            filter,
            ..Default::default()
        },
        ..Default::default()
    };
    syscall_report(trace, &options, &NoProgress).expect("analyzing the syscalls")
}

/// (calls, errors) at the call site `function` for `syscall`.
fn at_site(r: &SyscallReport, syscall: &str, function: &str) -> Option<(u64, u64)> {
    let s = r.syscalls.iter().find(|s| s.syscall == syscall)?;
    let site = s.call_sites.iter().find(|c| c.site.function == function)?;
    assert!(
        site.site
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("rec_syscalls.c"))
            && site.site.line.is_some(),
        "{syscall} at {function}: no file:line in {:?}",
        site.site
    );
    Some((site.calls, site.errors))
}

/// `strace -c -f` output: syscall -> (calls, errors).
fn parse_strace_summary(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors,] syscall
        let (calls, errors) = match f.len() {
            5 => (f[3], "0"),
            6 => (f[3], f[4]),
            _ => continue,
        };
        let (Ok(calls), Ok(errors)) = (calls.parse(), errors.parse()) else {
            continue;
        };
        if f[f.len() - 1] != "total" {
            out.insert(f[f.len() - 1].to_string(), (calls, errors));
        }
    }
    out
}

#[test]
fn counts_and_errors_match_strace_and_calls_have_their_call_sites() {
    require_tracing!();
    if !has_program("strace") {
        skip!("strace is not installed (Debian package strace)");
    }
    let dir = scratch_dir("rec-syscalls-counts");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    let result = launch(&out, &["--syscalls"], &exe, &["counts"]);
    assert_success(&result);
    let (reader, records) = load_complete(&out);
    assert_time_ordered(&records);
    assert!(reader.header().events.syscalls.is_some());
    let r = report(&out, SampleFilter::default());

    let summary = dir.join("strace.txt");
    let status = Command::new("strace")
        .args(["-c", "-f", "-o"])
        .arg(&summary)
        .arg(&exe)
        .arg("counts")
        .status()
        .unwrap();
    assert!(status.success());
    let mut strace = parse_strace_summary(&std::fs::read_to_string(&summary).unwrap());
    // Recording starts at the launched command's execve; strace leaves out
    // calls that never return, which lrnprof counts (as unfinished).
    strace.remove("execve");
    let ours: BTreeMap<String, (u64, u64)> = r
        .syscalls
        .iter()
        .filter(|s| !["exit_group", "exit"].contains(&s.syscall.as_str()))
        .map(|s| (s.syscall.clone(), (s.calls, s.errors)))
        .collect();
    assert_eq!(ours, strace, "lrnprof vs strace -c -f (calls, errors)");
    // Every failed open is a missing file (the loader's search of
    // LD_LIBRARY_PATH included), every failed close a bad descriptor.
    let errnos = |name: &str| {
        let s = r.syscalls.iter().find(|s| s.syscall == name).unwrap();
        (s.errnos.clone(), s.errors)
    };
    let (openat, errors) = errnos("openat");
    assert_eq!(openat, BTreeMap::from([("ENOENT".to_string(), errors)]));
    let (close, errors) = errnos("close");
    assert_eq!(close, BTreeMap::from([("EBADF".to_string(), errors)]));

    // Each call is attributed to the function that called the libc wrapper.
    assert_eq!(at_site(&r, "openat", "failing_open"), Some((5, 5)));
    assert_eq!(at_site(&r, "close", "bad_close"), Some((3, 3)));
    assert_eq!(at_site(&r, "write", "null_writes"), Some((100, 0)));

    // The command: CSV per call site, JSON with the documented fields.
    let csv = Command::new(lrnprof_analyze())
        .args(["syscalls", "--csv", "--sites", "--syscall", "write"])
        .arg(&out)
        .output()
        .unwrap();
    assert_success(&csv);
    let csv = String::from_utf8(csv.stdout).unwrap();
    assert!(
        csv.lines().any(|l| l.starts_with("write,")
            && l.contains(",null_writes,")
            && l.contains(",100,0,")),
        "{csv}"
    );
    let json = Command::new(lrnprof_analyze())
        .args(["syscalls", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    assert_success(&json);
    let json = String::from_utf8(json.stdout).unwrap();
    assert!(json.trim_start().starts_with('['), "{json}");
    for key in ["\"syscall\"", "\"calls\"", "\"errors\"", "\"total_ns\""] {
        assert!(json.contains(key), "{key} in {json}");
    }
    remove_scratch_dir(&dir);
}

/// `strace -c -f` of `rec_syscalls MODE`, without the calls lrnprof does
/// not compare: execve (recording starts at the launched command's), and
/// calls that never return (strace leaves them out, lrnprof counts them
/// as unfinished).
fn strace_counts(dir: &Path, exe: &Path, mode: &str) -> BTreeMap<String, (u64, u64)> {
    let summary = dir.join(format!("strace-{mode}.txt"));
    let status = Command::new("strace")
        .args(["-c", "-f", "-o"])
        .arg(&summary)
        .arg(exe)
        .arg(mode)
        .status()
        .unwrap();
    assert!(status.success());
    let mut strace = parse_strace_summary(&std::fs::read_to_string(&summary).unwrap());
    strace.remove("execve");
    strace
}

/// (calls, errors) per syscall, without those that never return.
fn counts(r: &SyscallReport) -> BTreeMap<String, (u64, u64)> {
    r.syscalls
        .iter()
        .filter(|s| !["exit_group", "exit"].contains(&s.syscall.as_str()))
        .map(|s| (s.syscall.clone(), (s.calls, s.errors)))
        .collect()
}

#[test]
fn one_call_in_16_recorded_keeps_counts_exact_and_finds_call_sites_in_a_forked_child() {
    require_tracing!();
    if !is_root() {
        skip!("--syscall-stack-every loads BPF programs: needs root");
    }
    if !has_program("strace") {
        skip!("strace is not installed (Debian package strace)");
    }
    let dir = scratch_dir("rec-syscalls-every");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    let args = ["--syscalls", "--no-cpu", "--syscall-stack-every", "16"];
    assert_success(&launch(&out, &args, &exe, &["fork"]));
    let (reader, records) = load_complete(&out);
    assert_time_ordered(&records);
    assert_eq!(
        reader
            .header()
            .events
            .syscalls
            .as_ref()
            .map(|s| s.stack_every),
        Some(16)
    );
    let recorded = samples(&records).len();
    assert!(
        records.iter().any(|r| matches!(r, Record::SyscallTally(_))),
        "no tallies"
    );
    let r = report(&out, SampleFilter::default());
    assert_eq!(r.stack_every, 16);
    // Every call counted, in both processes, though far fewer recorded.
    assert_eq!(
        counts(&r),
        strace_counts(&dir, &exe, "fork"),
        "lrnprof vs strace -c -f"
    );
    assert!(
        (recorded as u64) < r.calls,
        "{recorded} recorded of {}",
        r.calls
    );
    // The child's calls: each thread's first call of a syscall is
    // recorded, and stands for all its calls of that syscall.
    assert_eq!(at_site(&r, "openat", "failing_open"), Some((5, 5)));
    assert_eq!(at_site(&r, "close", "bad_close"), Some((3, 3)));
    // The parent's writes: 7 of 100 recorded, all at one site.
    assert_eq!(at_site(&r, "write", "null_writes"), Some((100, 0)));
    let writes = records
        .iter()
        .filter(|r| {
            matches!(r, Record::Sample(s) if matches!(s.detail,
                lrnprof_format::SampleDetail::Syscall { nr, .. }
                    if Some(nr) == syscall_number(Arch::X86_64, "write")))
        })
        .count();
    if cfg!(target_arch = "x86_64") {
        assert_eq!(writes, 7, "writes 1, 17, ..., 97 recorded");
    }
    let text = Command::new(lrnprof_analyze())
        .args(["syscalls"])
        .arg(&out)
        .output()
        .unwrap();
    assert_success(&text);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("estimated from 1 call in 16"), "{text}");
    remove_scratch_dir(&dir);
}

#[test]
fn calls_from_two_threads_belong_to_their_threads_and_functions() {
    require_tracing!();
    let dir = scratch_dir("rec-syscalls-threads");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    // With CPU samples too: both kinds in one trace.
    assert_success(&launch(&out, &["--syscalls"], &exe, &["threads"]));
    let (reader, records) = load_complete(&out);
    assert!(reader.header().events.cpu && reader.header().events.syscalls.is_some());
    assert!(samples(&records)
        .iter()
        .all(|s| matches!(s.kind, SampleKind::Syscall | SampleKind::CpuTime)));
    let thread = |name: &str| {
        report(
            &out,
            SampleFilter {
                thread_name: Some(name.into()),
                ..Default::default()
            },
        )
    };
    let opener = thread("opener");
    assert_eq!(at_site(&opener, "openat", "failing_open"), Some((5, 5)));
    assert_eq!(at_site(&opener, "close", "bad_close"), Some((3, 3)));
    assert!(!opener.syscalls.iter().any(|s| s.syscall == "write"));
    let writer = thread("writer");
    assert_eq!(at_site(&writer, "write", "null_writes"), Some((100, 0)));
    assert_eq!(at_site(&writer, "openat", "failing_open"), None);
    remove_scratch_dir(&dir);
}

#[test]
fn a_one_second_sleep_is_one_second_off_cpu_in_its_function() {
    require_tracing!();
    let dir = scratch_dir("rec-offcpu");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    let result = launch(&out, &["--off-cpu"], &exe, &["sleep"]);
    assert_success(&result);
    // How long the call took by the program's own clock: the off-CPU time
    // is checked against that, not against the machine keeping time.
    let stdout = String::from_utf8_lossy(&result.stdout);
    let slept: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sleepy_ns ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("the fixture did not say how long it slept: {stdout}"));
    assert!(
        slept >= 1_000_000_000,
        "nanosleep returned early: {slept} ns"
    );
    let (reader, records) = load_complete(&out);
    assert!(reader.header().events.off_cpu.is_some());
    assert!(records.iter().any(|r| matches!(r, Record::SwitchIn(_))));
    let profile = analyze(
        &out,
        &AnalyzeOptions {
            value: Some(ValueKind::OffCpu),
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    // Off-CPU time sits beside CPU time, for a wall-clock view per thread.
    assert!(profile.value_kinds.contains(&ValueKind::Cpu));
    assert!(profile.value_kinds.contains(&ValueKind::OffCpu));
    let folded = folded(&profile);
    let in_sleepy: u64 = folded
        .lines()
        .filter(|l| l.contains(";sleepy;") || l.contains(";sleepy "))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    // The sleep's switch-out comes after the first clock read and its
    // switch-in before the second: within 10% of the program's own measure
    // (and so of the 1 s asked for, on an idle machine).
    assert!(
        in_sleepy * 10 >= slept * 9 && in_sleepy * 10 <= slept * 11,
        "off-CPU time in sleepy: {in_sleepy} ns; the program measured {slept} ns\n{folded}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn a_signal_handlers_return_unwinds_into_the_interrupted_function() {
    require_tracing!();
    let dir = scratch_dir("rec-sigreturn");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    // The signal frame (about 1 KiB with the FPU state) must fit the copy.
    let args = [
        "--syscall-filter",
        "rt_sigreturn",
        "--syscall-stack-size",
        "16384",
    ];
    assert_success(&launch(&out, &args, &exe, &["signals"]));
    let profile = analyze(
        &out,
        &AnalyzeOptions {
            value: Some(ValueKind::Syscalls),
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let folded = folded(&profile);
    // Each call is made by the trampoline, at its last instruction, and
    // the signal interrupted raise() in signal_loop.
    let through: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(stack, _)| {
            stack.contains(";main;signal_loop;") && stack.ends_with(";__restore_rt")
        })
        .map(|(_, n)| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(through, 50, "{folded}");
    remove_scratch_dir(&dir);
}

/// The fixture's pid, once it runs (its parent is the recorder).
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let ppid: u32 = rest.split(' ').nth(1)?.parse().ok()?;
        (name == "rec_syscalls" && ppid == parent).then_some(pid)
    })
}

#[test]
fn a_target_killed_in_a_call_leaves_a_consistent_trace() {
    require_tracing!();
    let dir = scratch_dir("rec-syscalls-killed");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    // stdin is a pipe nobody writes to: the fixture blocks in read().
    let recorder = lrnprof_rec_command()
        .arg("--out")
        .arg(&out)
        .args(["--syscalls", "--off-cpu", "--"])
        .arg(&exe)
        .arg("block")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pid = None;
    wait_until("the fixture blocked in read()", || {
        pid = pid.or_else(|| child_of(recorder.id()));
        let read = syscall_number(
            if cfg!(target_arch = "aarch64") {
                Arch::Aarch64
            } else {
                Arch::X86_64
            },
            "read",
        )
        .unwrap();
        pid.is_some_and(|p| {
            std::fs::read_to_string(format!("/proc/{p}/syscall"))
                .is_ok_and(|s| s.split(' ').next() == Some(&read.to_string()))
        })
    });
    let pid = pid.unwrap();
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let result = recorder.wait_with_output().unwrap();
    assert_exit_code(&result, 128 + 9);
    let (reader, records) = load_complete(&out);
    assert_time_ordered(&records);
    let Target::Launch { pid: launched, .. } = reader.header().target else {
        panic!("launched")
    };
    assert_eq!(launched.0, pid);
    let r = report(&out, SampleFilter::default());
    let read = r.syscalls.iter().find(|s| s.syscall == "read").unwrap();
    let site = read
        .call_sites
        .iter()
        .find(|c| c.site.function == "blocked_read")
        .unwrap_or_else(|| panic!("no read at blocked_read: {:?}", read.call_sites));
    // The call ended with the process: its return (an interrupted call)
    // or the thread's exit closes it; it is counted once either way.
    assert_eq!(site.calls, 1);
    assert!(
        !r.syscalls.iter().any(|s| s.syscall == "exit_group"),
        "killed, not exited"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn attaching_traces_the_calls_made_from_then_on() {
    require_tracing!();
    let dir = scratch_dir("rec-syscalls-attach");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    let mut target = Command::new(&exe).arg("forever").spawn().unwrap();
    let pid = target.id().to_string();
    let result = lrnprof_rec_command()
        .arg("--out")
        .arg(&out)
        .args(["--pid", &pid, "--syscalls", "--no-cpu", "--duration", "0.5"])
        .output()
        .unwrap();
    let _ = target.kill();
    let _ = target.wait();
    assert_success(&result);
    let (reader, _) = load_complete(&out);
    assert!(!reader.header().events.cpu);
    let r = report(&out, SampleFilter::default());
    let write = r.syscalls.iter().find(|s| s.syscall == "write").unwrap();
    assert!(write.calls > 100, "{} writes in 0.5 s", write.calls);
    // At most the call in progress when recording stopped has no return.
    assert!(write.unfinished <= 1, "{} unfinished", write.unfinished);
    assert_eq!(write.call_sites.len(), 1, "{:?}", write.call_sites);
    assert_eq!(write.call_sites[0].site.function, "writes_forever");
    remove_scratch_dir(&dir);
}

#[test]
fn an_unprivileged_user_is_told_what_tracing_needs() {
    // Needs root to run the recorder as an unprivileged user.
    if !cfg!(target_os = "linux") || !is_root() || !has_program("runuser") {
        skip!("needs Linux, root and runuser to act as the user nobody");
    }
    let paranoid = perf_event_paranoid();
    if paranoid < 2 {
        skip!("kernel.perf_event_paranoid is {paranoid} here: unprivileged users may trace");
    }
    let dir = scratch_dir("rec-syscalls-perm");
    let rec_copy = recorder_for_nobody(&dir);
    for (flag, expect) in [
        // tracefs is readable by root only, or perf_event_open refuses
        // tracepoint data: either way the line says what to change.
        ("--syscalls", ["tracefs", "--syscalls"]),
        ("--off-cpu", ["--off-cpu", "perf_event_paranoid"]),
    ] {
        let said = refused_for_nobody(&rec_copy, &dir.join("t.lpt"), &[flag, "--", "true"]);
        assert!(expect.iter().any(|e| said.contains(e)), "{flag}: {said}");
    }
    remove_scratch_dir(&dir);
}

#[test]
fn every_exit_follows_its_entry() {
    // With every event kind recorded, each thread's syscall exit comes
    // after the entry of the same call.
    require_tracing!();
    let dir = scratch_dir("rec-syscalls-order");
    let exe = build(&dir);
    let out = dir.join("t.lpt");
    assert_success(&launch(
        &out,
        &["--syscalls", "--off-cpu"],
        &exe,
        &["counts"],
    ));
    let (_, records) = load(&out);
    let mut open: BTreeMap<u32, u32> = BTreeMap::new();
    for r in &records {
        match r {
            Record::Sample(s) => {
                if let lrnprof_format::SampleDetail::Syscall { nr, .. } = s.detail {
                    open.insert(s.tid.0, nr);
                }
            }
            Record::SyscallExit(e) => {
                if let Some(nr) = open.remove(&e.tid.0) {
                    assert_eq!(nr, e.nr, "an exit of another call than the last entry");
                }
            }
            _ => {}
        }
    }
    remove_scratch_dir(&dir);
}
