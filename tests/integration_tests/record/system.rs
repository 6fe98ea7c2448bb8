//! System-wide recording (`lrnprof-rec --all`) and kernel frames
//! (`--kernel`) on the `rec_system` fixture: processes the test starts
//! itself (not the recorder's children) appear with complete stacks, a
//! process that execs and a short-lived one are named and sampled, the
//! recorder leaves itself out; a write(2) loop shows a named kernel frame
//! offline; with `--off-cpu --kernel` a wait in read(2) shows where the
//! kernel blocked, and kernel threads' switch-outs are kept only then; an
//! unprivileged user gets one line of advice and no file.

use super::support::{
    load, perf_event_paranoid, rec_command, recorder_for_nobody, refused_for_nobody, samples, NO_FP,
};
use lrnprof_analyzer::{
    analyze, AnalyzeOptions, EventKind, NoProgress, OutputFormat, SampleFilter,
};
use lrnprof_format::{
    BlobKind, ImageKind, Pid, ProcessEvent, Record, SampleKind, Target, ThreadEvent, Tid,
    TraceReader,
};
use lrnprof_tests::{
    build_c, has_program, is_root, remove_scratch_dir, require_perf, scratch_dir, skip, wait_until,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn build(dir: &Path) -> PathBuf {
    build_c(&["rec_system.c"], NO_FP, dir, "rec_system")
}

/// `program args`, started by the test (outside the recorder).
fn start(program: &Path, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .expect("starting the fixture")
}

/// `lrnprof-rec --all` writing `trace`, its stderr kept.
fn record_all(trace: &Path) -> Child {
    rec_command(trace)
        .arg("--all")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Stop `recorder` as Ctrl-C would, and wait for it.
fn interrupt(recorder: Child) -> std::process::Output {
    // Safety: kill sends a signal to our child, which has not been reaped.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    recorder.wait_with_output().unwrap()
}

/// Whether system-wide recording is refused here (not root, paranoid).
fn system_refused() -> Option<String> {
    let paranoid = perf_event_paranoid();
    (!is_root() && paranoid > 0).then(|| {
        format!("--all needs root or kernel.perf_event_paranoid 0 or lower (it is {paranoid})")
    })
}

/// The folded stacks of `trace` (`filter` applied), analyzed offline.
fn folded(trace: &Path, filter: SampleFilter) -> String {
    let options = AnalyzeOptions {
        offline: true,
        filter,
        ..Default::default()
    };
    let profile = analyze(trace, &options, &NoProgress).expect("analyzing the trace");
    let mut out = Vec::new();
    OutputFormat::Folded
        .writer()
        .write(&profile, &mut out)
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// Samples of `pid` in `folded` (lines start `NAME-PID;`) whose stack
/// holds `frames` in this order, root first.
fn count(folded: &str, pid: u32, frames: &str) -> u64 {
    folded
        .lines()
        .filter(|l| {
            let (stack, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            stack
                .split(';')
                .next()
                .is_some_and(|t| t.ends_with(&format!("-{pid}")))
                && stack.contains(frames)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

/// Samples of `pid` whose stack holds `first` and, after it, `then`.
fn count_both(folded: &str, pid: u32, first: &str, then: &str) -> u64 {
    folded
        .lines()
        .filter(|l| {
            l.split(';')
                .next()
                .is_some_and(|t| t.ends_with(&format!("-{pid}")))
                && l.find(first).is_some_and(|i| l[i..].contains(then))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

#[test]
fn every_process_is_recorded_with_complete_stacks() {
    require_perf!();
    if let Some(why) = system_refused() {
        skip!("{why}");
    }
    let dir = scratch_dir("rec-system-all");
    let program = build(&dir);
    let trace = dir.join("all.lpt");
    // Two unrelated processes running before the recording starts.
    let mut alpha = start(&program, &["alpha"]);
    let mut beta = start(&program, &["beta"]);
    let recorder = record_all(&trace);
    // The trace holds a sample once the events are enabled and drained.
    super::support::wait_for_a_readable_sample(&trace);
    // Started, exec'd and exited while recorded.
    let exec = start(&program, &["exec", "150"]);
    let short = start(&program, &["short", "60"]);
    let (exec_pid, short_pid) = (exec.id(), short.id());
    for mut c in [exec, short] {
        assert!(c.wait().unwrap().success());
    }
    // Until alpha and beta have been sampled a while.
    wait_until("alpha and beta sampled", || {
        std::fs::read_to_string(format!("/proc/{}/stat", alpha.id()))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")?
                    .1
                    .split(' ')
                    .nth(11)?
                    .parse::<u64>()
                    .ok()
            })
            .is_some_and(|utime_ticks| utime_ticks >= 30)
    });
    let recorder_pid = recorder.id();
    // Ctrl-C.
    let out = interrupt(recorder);
    let _ = alpha.kill();
    let _ = beta.kill();
    let _ = (alpha.wait(), beta.wait());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    let (reader, records) = load(&trace);
    assert_eq!(reader.header().target, Target::System);
    let sampled: HashSet<u32> = samples(&records).iter().map(|s| s.pid.0).collect();
    assert!(
        !sampled.contains(&recorder_pid),
        "the recorder sampled itself"
    );
    // Each process is known with its cgroup.
    let process = |pid: u32, event: fn(&ProcessEvent) -> bool| {
        records.iter().any(|r| {
            matches!(r, Record::Process(p) if p.pid == Pid(pid) && event(&p.event) && p.cgroup.is_some())
        })
    };
    assert!(process(alpha.id(), |e| *e == ProcessEvent::Existing));
    assert!(process(exec_pid, |e| *e == ProcessEvent::Fork));
    assert!(process(exec_pid, |e| *e == ProcessEvent::Exec));
    // The exec carries the new command line (read as the process exec'd).
    assert!(
        records.iter().any(|r| matches!(r,
            Record::Process(p) if p.pid == Pid(exec_pid) && p.event == ProcessEvent::Exec
                && p.command.iter().any(|a| a == "after"))),
        "no exec record of {exec_pid} with its new command line"
    );
    assert!(process(short_pid, |e| *e == ProcessEvent::Fork));
    assert!(records.iter().any(|r| matches!(r,
        Record::Thread(t) if t.pid == Pid(short_pid) && t.event == ThreadEvent::Rename
            && t.name.as_deref() == Some("rec_system"))));

    let all = folded(&trace, SampleFilter::default());
    // Complete stacks: from the C runtime's entry down to the leaf.
    for (pid, frames) in [
        (alpha.id(), "main;alpha_outer;alpha_inner"),
        (beta.id(), "main;beta_outer;beta_inner"),
        (exec_pid, "main;before_exec"),
        (exec_pid, "main;after_exec"),
        (short_pid, "main;short_work"),
    ] {
        let n = count(&all, pid, frames);
        assert!(n > 0, "no samples of {pid} in {frames}:\n{all}");
        // Through libc's start: `__libc_start_main` by its exported symbol,
        // or `__libc_start_main_impl;__libc_start_call_main` where the
        // recorder found libc's debug file (Debian's libc6-dbg).
        let rooted = count_both(&all, pid, ";_start;__libc_start_main", frames);
        assert!(
            rooted * 10 >= n * 9,
            "{pid} {frames}: {rooted} of {n} samples reach the root:\n{all}"
        );
    }
    // The filters select processes by name and cgroup.
    let alpha_only = folded(
        &trace,
        SampleFilter {
            pid: Some(Pid(alpha.id())),
            ..Default::default()
        },
    );
    assert!(!alpha_only.contains("beta_inner"));
    let by_name = folded(
        &trace,
        SampleFilter {
            comm: Some("rec_system".into()),
            ..Default::default()
        },
    );
    assert!(
        by_name.lines().all(|l| l.starts_with("rec_system-")),
        "{by_name}"
    );
    assert!(by_name.contains("alpha_inner") && by_name.contains("short_work"));
    remove_scratch_dir(&dir);
}

#[test]
fn processes_started_while_recording_keep_their_vdso_and_jit_maps() {
    require_perf!();
    if let Some(why) = system_refused() {
        skip!("{why}");
    }
    let dir = scratch_dir("rec-system-new");
    let program = build(&dir);
    let jit = build_c(&["rec_jit.c"], &["-O2", "-g"], &dir, "rec_jit");
    let trace = dir.join("new.lpt");
    let recorder = record_all(&trace);
    // Something to sample until the events are on.
    let mut busy = start(&program, &["alpha"]);
    super::support::wait_for_a_readable_sample(&trace);
    let _ = busy.kill();
    let _ = busy.wait();
    // Both start after the recorder read /proc: only the kernel's records
    // tell of their images.
    let mut vdso = start(&program, &["vdso", "300"]);
    let vdso_pid = vdso.id();
    assert!(vdso.wait().unwrap().success());
    let mut jit = start(&jit, &["200"]);
    let jit_pid = jit.id();
    assert!(jit.wait().unwrap().success());
    let out = interrupt(recorder);
    let map_file = PathBuf::from(format!("/tmp/perf-{jit_pid}.map"));
    let map_text = std::fs::read_to_string(&map_file);
    let _ = std::fs::remove_file(&map_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let map_text = map_text.expect("rec_jit wrote its perf map");

    let (_, records) = load(&trace);
    let mapped = |pid: u32, kind: ImageKind| {
        records
            .iter()
            .filter_map(|r| match r {
                Record::ImageMap(m) if m.pid == Pid(pid) && m.kind == kind => Some(m),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert!(
        !mapped(vdso_pid, ImageKind::Vdso).is_empty(),
        "no vDSO of {vdso_pid}"
    );
    let jit_start = u64::from_str_radix(map_text.split(' ').next().unwrap(), 16).unwrap();
    assert!(
        mapped(jit_pid, ImageKind::Anonymous)
            .iter()
            .any(|m| (m.start..m.end).contains(&jit_start)),
        "the JIT's anonymous executable region"
    );
    let embedded = records.iter().find_map(|r| match r {
        Record::Blob(b) if b.kind == BlobKind::JitMap { pid: Pid(jit_pid) } => Some(&b.data),
        _ => None,
    });
    assert_eq!(
        embedded,
        Some(&map_text.into_bytes()),
        "the perf map embedded"
    );
    // The vDSO's frames are named offline, from its bytes in the trace.
    let all = folded(&trace, SampleFilter::default());
    let in_vdso = count(&all, vdso_pid, "vdso_loop;");
    let named = count_both(&all, vdso_pid, "vdso_loop;", "__vdso_clock_gettime");
    assert!(in_vdso > 0, "no samples of {vdso_pid} in vdso_loop:\n{all}");
    assert!(named > 0, "no named vDSO frame under vdso_loop:\n{all}");
    remove_scratch_dir(&dir);
}

#[test]
fn kernel_frames_are_named_offline() {
    require_perf!();
    if !is_root() {
        skip!("--kernel needs root here to read kernel addresses (kptr_restrict)");
    }
    let dir = scratch_dir("rec-system-kernel");
    let program = build(&dir);
    let trace = dir.join("kernel.lpt");
    let out = rec_command(&trace)
        .args(["--kernel", "--"])
        .arg(&program)
        .args(["write", "300"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let (reader, records) = load(&trace);
    assert!(reader.header().sampling.include_kernel);
    assert!(samples(&records)
        .iter()
        .any(|s| !s.kernel_frames.is_empty()));
    let kernel_names = kernel_function_names();
    let all = folded(&trace, SampleFilter::default());
    // A stack through write_loop whose leaf is a named kernel function.
    let named = all.lines().any(|l| {
        let stack = l.rsplit_once(' ').map_or(l, |(s, _)| s);
        stack.contains(";write_loop;")
            && stack
                .rsplit(';')
                .next()
                .is_some_and(|leaf| kernel_names.contains(leaf))
    });
    assert!(named, "no named kernel frame under write_loop:\n{all}");
    remove_scratch_dir(&dir);
}

/// The names of the kernel's functions, from `/proc/kallsyms`.
fn kernel_function_names() -> HashSet<String> {
    std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_ascii_whitespace().nth(2))
        .map(str::to_string)
        .collect()
}

#[test]
fn off_cpu_with_kernel_shows_where_the_thread_blocked() {
    require_perf!();
    if !is_root() {
        skip!("--kernel needs root here to read kernel addresses (kptr_restrict)");
    }
    let dir = scratch_dir("rec-system-off-cpu-kernel");
    let program = build(&dir);
    let trace = dir.join("block.lpt");
    let out = rec_command(&trace)
        .args(["--kernel", "--off-cpu", "--no-cpu", "--"])
        .arg(&program)
        .args(["block", "50"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let kernel_names = kernel_function_names();
    let profile = analyze(&trace, &AnalyzeOptions::default(), &NoProgress).unwrap();
    // Each wait: the user stack to read, then the kernel's part, down to
    // the scheduler. Counted in switch-outs (folded output would give
    // nanoseconds off CPU).
    let off_cpu = EventKind::OffCpu.index();
    let blocked: u64 = profile
        .stacks
        .iter()
        .filter(|stack| {
            // Function names, leaf first.
            let names: Vec<&str> = stack
                .locations
                .iter()
                .flat_map(|&l| &profile.locations[l as usize].lines)
                .map(|line| profile.functions[line.function as usize].name.as_str())
                .collect();
            let at = |name: &str| names.iter().position(|&n| n == name);
            at("block_loop").is_some_and(|b| at("main") == Some(b + 1))
                && at("schedule").is_some()
                && names
                    .first()
                    .is_some_and(|&leaf| kernel_names.contains(leaf))
        })
        .map(|stack| stack.kind_samples[off_cpu])
        .sum();
    let all = folded(&trace, SampleFilter::default());
    assert!(
        blocked >= 25,
        "{blocked} of 50 waits blocked in a named kernel function:\n{all}"
    );
    remove_scratch_dir(&dir);
}

/// Recorders that run until the test stops them: killed should it fail
/// first, so that they do not record on.
struct KillOnDrop(Vec<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Switch-outs of kernel threads (no user registers) in `trace` so far,
/// and how many of them have kernel frames.
fn kernel_thread_switch_outs(trace: &Path) -> (usize, usize) {
    let Ok(reader) = TraceReader::open(trace) else {
        return (0, 0);
    };
    let mut found = (0, 0);
    for r in reader.records().flatten() {
        if let Record::Sample(s) = r {
            if s.kind == SampleKind::OffCpu && s.regs.ip() == 0 && s.regs.sp() == 0 {
                found.0 += 1;
                found.1 += usize::from(!s.kernel_frames.is_empty());
            }
        }
    }
    found
}

#[test]
fn kernel_threads_switch_outs_are_kept_only_with_kernel() {
    require_perf!();
    if let Some(why) = system_refused() {
        skip!("{why}");
    }
    let dir = scratch_dir("rec-system-kthreads");
    let plain = dir.join("plain.lpt");
    let kernel = dir.join("kernel.lpt");
    let off_cpu = |trace: &Path, extra: &[&str]| {
        rec_command(trace)
            .args(["--all", "--off-cpu", "--no-cpu"])
            .args(extra)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Without --kernel a kernel thread's switch-out has nothing to show
    // (no user context, no kernel frames): it is left out. To know that
    // one happened while it recorded, a second recording with --kernel
    // runs inside the first one's time.
    let mut running = KillOnDrop(vec![off_cpu(&plain, &[])]);
    super::support::wait_for_a_readable_sample(&plain);
    running.0.insert(0, off_cpu(&kernel, &["--kernel"]));
    wait_until(
        "a kernel thread's switch-out recorded with --kernel",
        || kernel_thread_switch_outs(&kernel).0 > 0,
    );
    // Threads that end while both record: a dying thread's last
    // switch-out is no wait (no switch-in follows) and is not kept.
    for _ in 0..5 {
        std::thread::spawn(|| ()).join().unwrap();
    }
    // The one with --kernel first, so the other's time covers it.
    for recorder in std::mem::take(&mut running.0) {
        let out = interrupt(recorder);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(kernel_thread_switch_outs(&plain), (0, 0));
    for trace in [&plain, &kernel] {
        let (_, records) = load(trace);
        let dead = samples(&records)
            .iter()
            .filter(|s| s.kind == SampleKind::OffCpu && s.tid == Tid(u32::MAX))
            .count();
        assert_eq!(dead, 0, "{trace:?}: switch-outs of threads gone");
    }
    let (switches, with_frames) = kernel_thread_switch_outs(&kernel);
    assert!(
        switches > 0 && with_frames == switches,
        "{switches} switch-outs, {with_frames} with kernel frames"
    );
    // A kernel thread's kernel callchain is whole: it reaches the root.
    // Kernel threads are kthreadd (pid 2) and its children; a user
    // process has no user registers either once it has let go of its
    // memory on exit, and those last switch-outs stop in the kernel.
    let (_, records) = load(&kernel);
    let kernel_threads: std::collections::BTreeSet<Pid> = records
        .iter()
        .filter_map(|r| match r {
            Record::Process(p) if p.pid == Pid(2) || p.parent == Some(Pid(2)) => Some(p.pid),
            _ => None,
        })
        .collect();
    let pid = samples(&records)
        .iter()
        .find(|s| {
            s.kind == SampleKind::OffCpu && s.regs.ip() == 0 && kernel_threads.contains(&s.pid)
        })
        .map(|s| s.pid)
        .expect("a kernel thread's switch-out");
    let options = AnalyzeOptions {
        offline: true,
        filter: SampleFilter {
            pid: Some(pid),
            ..Default::default()
        },
        ..Default::default()
    };
    let profile = analyze(&kernel, &options, &NoProgress).expect("analyzing the trace");
    assert!(profile.stats.samples > 0);
    assert_eq!(
        profile.stats.root_samples, profile.stats.samples,
        "pid {pid:?}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn an_unprivileged_user_is_told_what_all_and_kernel_need() {
    if !cfg!(target_os = "linux") || !is_root() || !has_program("runuser") {
        skip!("needs Linux, root and runuser to act as the user nobody");
    }
    let paranoid = perf_event_paranoid();
    if paranoid < 2 {
        skip!("kernel.perf_event_paranoid is {paranoid} here: unprivileged users may sample the kernel");
    }
    let dir = scratch_dir("rec-system-perm");
    let rec_copy = recorder_for_nobody(&dir);
    for (args, expect) in [
        (
            &["--all", "--duration", "1"][..],
            ["--all", "perf_event_paranoid=0"],
        ),
        (
            &["--kernel", "--", "true"][..],
            ["--kernel", "perf_event_paranoid=1"],
        ),
    ] {
        let said = refused_for_nobody(&rec_copy, &dir.join("t.lpt"), args);
        assert!(expect.iter().all(|e| said.contains(e)), "{args:?}: {said}");
    }
    remove_scratch_dir(&dir);
}
