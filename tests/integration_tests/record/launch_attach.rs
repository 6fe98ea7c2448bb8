//! Recording by launching and by attaching: threads, images (including
//! ones mapped mid-run), deep stacks, thread churn, fork and exec.

use super::support::{
    assert_complete, assert_exit_code, assert_samples_plausible, assert_success,
    assert_time_ordered, build_id, build_threads, images, launch, load, load_complete, os, rec,
    root_pid, samples, stack_holds_address_in, symbol_avma, thread_names, NO_FP,
};
use lrnprof_format::{
    ImageKind, Pid, ProcessEvent, Record, Sample, SampleEvent, SampleKind, Target, ThreadEvent,
};
use lrnprof_tests::{
    build_c, is_root, remove_scratch_dir, require_perf, scratch_dir, skip, wait_until,
};
use std::path::Path;
use std::process::Command;

#[test]
fn launch_records_named_threads_images_and_samples() {
    require_perf!();
    let dir = scratch_dir("rec-launch");
    let exe = build_threads(&dir);
    let out = dir.join("t.lpt");
    let result = launch(&out, &[], &exe, &["600"]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(
        result.status.code(),
        Some(7),
        "exit status passed on: {stderr}"
    );
    assert!(
        stderr.contains("samples") && stderr.contains("bytes/sample"),
        "{stderr}"
    );
    // The recorder's CPU, split where the recording stopped: the parts
    // add up to the whole (each rounded to a millisecond).
    let cpu = stderr
        .lines()
        .find_map(|l| l.strip_prefix("lrnprof-rec: recorder CPU "))
        .unwrap_or_else(|| panic!("no recorder CPU line: {stderr}"));
    let seconds: Vec<f64> = cpu
        .split([' ', ':', ',', '('])
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        cpu.contains(" s while recording (") && cpu.contains(" µs per sample), "),
        "{cpu}"
    );
    let [total, during, per_sample, after] = seconds[..] else {
        panic!("{cpu}");
    };
    assert!((during + after - total).abs() <= 0.0015, "{cpu}");
    assert!(per_sample > 0.0, "{cpu}");

    let (reader, records) = load_complete(&out);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    let pid = root_pid(&reader);
    let names = thread_names(&records);
    assert!(names.iter().any(|n| n == "worker-a"), "{names:?}");
    assert!(names.iter().any(|n| n == "worker-b"), "{names:?}");

    let maps = images(&records);
    let main_map = maps
        .iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("the fixture's image");
    assert_eq!(main_map.build_id.as_ref().unwrap().0, build_id(&exe));
    assert!(maps
        .iter()
        .any(|m| m.kind == ImageKind::Vdso && m.build_id.is_some()));
    assert!(maps
        .iter()
        .any(|m| m.path.contains("libc.so") && m.build_id.is_some()));

    let all = samples(&records);
    // CPU time only: a loaded machine gives the workers less of it.
    assert!(all.len() >= 10, "only {} samples", all.len());
    let worker_tids: Vec<u32> = all
        .iter()
        .map(|s| s.tid.0)
        .filter(|&t| t != pid.0)
        .collect();
    assert!(
        !worker_tids.is_empty(),
        "no samples from the worker threads"
    );
    // The leaf runs in the fixture's code, called from parent_one/parent_two.
    let leaf = symbol_avma(&records, pid, &exe, "leaf_work");
    assert!(all.iter().filter(|s| leaf.contains(&s.regs.ip())).count() * 2 > all.len());
    assert!(
        matches!(&reader.header().target, Target::Launch { command, .. } if command[1] == "600")
    );
    remove_scratch_dir(&dir);
}

#[test]
fn attach_by_pid_records_existing_threads_and_images() {
    require_perf!();
    let dir = scratch_dir("rec-attach");
    let exe = build_threads(&dir);
    let mut child = Command::new(&exe).arg("20000").spawn().unwrap();
    let pid = child.id();
    wait_until("both workers naming themselves", || {
        let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                    .collect()
            })
            .unwrap_or_default();
        names.iter().filter(|n| n.starts_with("worker-")).count() == 2
    });
    let out = dir.join("t.lpt");
    let result = rec(&[
        os("--pid"),
        os(&pid.to_string()),
        os("--duration"),
        os("1"),
        os("--out"),
        out.as_os_str(),
    ]);
    // A thread id (as `top -H` shows) stands for its whole process.
    let worker_a = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = std::fs::read_to_string(path.join("comm")).ok()?;
            let tid = path.file_name()?.to_str()?.to_string();
            (name.trim_end() == "worker-a").then_some(tid)
        })
        .next()
        .expect("worker-a's thread id");
    let by_tid = dir.join("tid.lpt");
    let tid_result = rec(&[
        os("--pid"),
        os(&worker_a),
        os("--duration"),
        os("0.5"),
        os("--out"),
        by_tid.as_os_str(),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert_success(&result);
    assert_success(&tid_result);
    let stderr = String::from_utf8_lossy(&tid_result.stderr);
    assert!(
        stderr.contains(&format!(
            "{worker_a} is a thread of process {pid} (rec_threads): recording the whole process"
        )),
        "{stderr}"
    );
    let (tid_reader, tid_records) = load_complete(&by_tid);
    assert_eq!(
        tid_reader.header().target,
        Target::Attach {
            pids: vec![Pid(pid)]
        }
    );
    assert!(
        images(&tid_records)
            .iter()
            .any(|m| m.pid.0 == pid && Path::new(&m.path) == exe),
        "the process's images"
    );
    let tid_samples = samples(&tid_records);
    assert!(!tid_samples.is_empty());
    assert!(tid_samples.iter().all(|s| s.pid.0 == pid));
    let (reader, records) = load_complete(&out);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    assert_eq!(
        reader.header().target,
        Target::Attach {
            pids: vec![Pid(pid)]
        }
    );
    let existing: Vec<String> = records
        .iter()
        .filter_map(|r| match r {
            Record::Thread(t) if t.event == ThreadEvent::Existing => t.name.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(existing.len(), 3, "{existing:?}");
    assert!(existing.contains(&"worker-a".to_string()), "{existing:?}");
    let start = reader.header().start_time;
    let exe_map = images(&records)
        .into_iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("the fixture's image from /proc/PID/maps");
    assert_eq!(exe_map.time, start);
    assert_eq!(exe_map.build_id.as_ref().unwrap().0, build_id(&exe));
    let n = samples(&records).len();
    // CPU time only: a loaded machine gives the workers less of it.
    assert!(n >= 10, "only {n} samples in 1 s of two busy threads");
    remove_scratch_dir(&dir);
}

/// Whether process `pid`'s main thread has ended and its two workers
/// named themselves.
fn main_ended_workers_named(pid: u32) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s[s.rfind(')')? + 1..].trim_start().chars().next());
    let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .collect()
        })
        .unwrap_or_default();
    state == Some('Z') && names.iter().filter(|n| n.starts_with("worker-")).count() == 2
}

#[test]
fn attach_after_the_main_thread_ended_records_until_the_last_thread_ends() {
    require_perf!();
    let dir = scratch_dir("rec-attach-main-ended");
    let exe = build_threads(&dir);
    // Each worker runs 1.5 s of CPU time, then the process exits.
    let mut child = Command::new(&exe)
        .arg("1500")
        .env("REC_CPU_TIME", "1")
        .env("REC_MAIN_EXITS", "1")
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_until("the main thread ending, the workers named", || {
        main_ended_workers_named(pid)
    });
    let out = dir.join("t.lpt");
    // No duration: the recording ends with the process, which stays a
    // zombie (not reaped) until the recorder has returned.
    let result = rec(&[
        os("--pid"),
        os(&pid.to_string()),
        os("--out"),
        out.as_os_str(),
    ]);
    let status = child.wait().unwrap();
    assert_success(&result);
    assert!(status.success(), "{status:?}");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("(target exited)"), "{stderr}");
    let (_, records) = load_complete(&out);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    // What the main thread's /proc entries no longer show was read through
    // a worker's.
    let command = records.iter().find_map(|r| match r {
        Record::Process(p) if p.pid == Pid(pid) => Some(p.command.clone()),
        _ => None,
    });
    assert_eq!(
        command,
        Some(vec![exe.to_string_lossy().into_owned(), "1500".to_string()])
    );
    let exe_map = images(&records)
        .into_iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("the fixture's image, from a worker's maps");
    assert_eq!(exe_map.build_id.as_ref().unwrap().0, build_id(&exe));
    let all = samples(&records);
    assert!(all.len() >= 10, "only {} samples", all.len());
    assert!(all.iter().all(|s| s.pid == Pid(pid) && s.tid.0 != pid));
    // The workers' stack copies reach back to where they started.
    let share = share_reaching(&records, Pid(pid), &exe, "leaf_work", "worker_main");
    assert!(
        share >= 0.99,
        "only {share} of leaf samples reach worker_main"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn dlopened_library_appears_mid_run() {
    require_perf!();
    let dir = scratch_dir("rec-dlopen");
    let plugin = build_c(
        &["rec_plugin.c"],
        &["-O2", "-g", "-shared", "-fPIC", "-Wl,--build-id"],
        &dir,
        "librec_plugin.so",
    );
    let exe = build_c(
        &["rec_dlopen.c"],
        &["-O2", "-g", "-ldl"],
        &dir,
        "rec_dlopen",
    );
    let out = dir.join("t.lpt");
    let result = launch(&out, &[], &exe, &["600", plugin.to_str().unwrap()]);
    assert_exit_code(&result, 0);
    let (_, records) = load_complete(&out);
    assert_samples_plausible(&records);
    let plugin_map = images(&records)
        .into_iter()
        .find(|m| Path::new(&m.path) == plugin && m.executable)
        .expect("the dlopened library");
    assert_eq!(plugin_map.build_id.as_ref().unwrap().0, build_id(&plugin));
    let first_sample = samples(&records)[0].time;
    assert!(plugin_map.time > first_sample, "mapped mid-run");
    let in_plugin = samples(&records)
        .iter()
        .filter(|s| (plugin_map.start..plugin_map.end).contains(&s.regs.ip()))
        .count();
    assert!(in_plugin > 0, "no sample inside the dlopened library");
    remove_scratch_dir(&dir);
}

/// The share of samples in `leaf` whose stack copy reaches back to a
/// return address into `main`.
fn share_reaching_main(out: &Path, exe: &Path, leaf: &str) -> f64 {
    let (reader, records) = load_complete(out);
    share_reaching(&records, root_pid(&reader), exe, leaf, "main")
}

/// The share of process `pid`'s samples in `leaf` (a function of `exe`)
/// whose stack copy holds a return address into `caller`.
fn share_reaching(records: &[Record], pid: Pid, exe: &Path, leaf: &str, caller: &str) -> f64 {
    let leaf = symbol_avma(records, pid, exe, leaf);
    let main = symbol_avma(records, pid, exe, caller);
    let in_leaf: Vec<&Sample> = samples(records)
        .into_iter()
        .filter(|s| s.pid == pid && leaf.contains(&s.regs.ip()))
        .collect();
    assert!(
        in_leaf.len() >= 10,
        "only {} samples in the leaf",
        in_leaf.len()
    );
    let reaching = in_leaf
        .iter()
        .filter(|s| stack_holds_address_in(s, &main))
        .count();
    reaching as f64 / in_leaf.len() as f64
}

/// The fixture's stacks in `trace`, analyzed: every sample reaches the
/// root, through named functions, and its image's path says where the
/// name had bytes that are not UTF-8.
fn assert_recorded_whole(trace: &Path, built: &Path) {
    let (_, records) = load_complete(trace);
    let map = images(&records)
        .into_iter()
        .find(|m| m.path.ends_with("rec\u{FFFD}threads"))
        .unwrap_or_else(|| panic!("no image named rec\u{FFFD}threads in {trace:?}"));
    assert_eq!(map.build_id.as_ref().unwrap().0, build_id(built));
    let profile = lrnprof_analyzer::analyze(
        trace,
        &lrnprof_analyzer::AnalyzeOptions::default(),
        &lrnprof_analyzer::NoProgress,
    )
    .unwrap();
    let s = &profile.stats;
    assert!(s.samples >= 10, "{trace:?}: {} samples", s.samples);
    assert!(
        s.root_samples * 10 >= s.samples * 9,
        "{trace:?}: {} of {} samples at the root",
        s.root_samples,
        s.samples
    );
    assert!(
        profile.functions.iter().any(|f| f.name == "parent_two"),
        "{trace:?}: the program's functions are not named"
    );
}

#[test]
#[cfg(target_os = "linux")]
fn a_program_whose_path_is_not_utf8_is_recorded_whole() {
    use std::os::unix::ffi::OsStrExt;
    require_perf!();
    let dir = scratch_dir("rec-not-utf8");
    let built = build_threads(&dir);
    // Linux paths (and so process names) may hold any byte.
    let exe = dir.join(std::ffi::OsStr::from_bytes(b"rec\xffthreads"));
    std::fs::copy(&built, &exe).unwrap();
    let launched = dir.join("launched.lpt");
    // An argument with a newline (the third, which the fixture ignores).
    assert_exit_code(&launch(&launched, &[], &exe, &["300", "2", "a\nb"]), 7);
    assert_recorded_whole(&launched, &built);
    // `info` keeps each process on one line.
    let info = Command::new(lrnprof_tests::lrnprof_analyze())
        .arg("info")
        .arg(&launched)
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.lines()
            .any(|l| l.ends_with("rec\u{FFFD}threads 300 2 a\\nb")),
        "{info}"
    );
    // Attached: /proc/PID/stat, comm and maps hold the name's bytes.
    let mut child = Command::new(&exe).arg("20000").spawn().unwrap();
    let pid = child.id();
    wait_until("the program mapped", || {
        std::fs::read(format!("/proc/{pid}/maps"))
            .is_ok_and(|m| m.windows(11).any(|w| w == b"rec\xffthreads"))
    });
    let attached = dir.join("attached.lpt");
    let result = rec(&[
        os("--pid"),
        os(&pid.to_string()),
        os("--duration"),
        os("0.5"),
        os("--out"),
        attached.as_os_str(),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert_success(&result);
    assert_recorded_whole(&attached, &built);
    remove_scratch_dir(&dir);
}

#[test]
fn deep_recursion_is_copied_back_to_main() {
    require_perf!();
    let dir = scratch_dir("rec-deep");
    let exe = build_c(&["rec_deep.c"], NO_FP, &dir, "rec_deep");
    let out = dir.join("default.lpt");
    assert!(launch(&out, &[], &exe, &["400", "300"]).status.success());
    let share = share_reaching_main(&out, &exe, "deep_leaf");
    assert!(share > 0.99, "only {share} of deep samples reach main");
    // perf's default 8 KiB copy could not.
    let out8 = dir.join("8k.lpt");
    assert!(
        launch(&out8, &["--stack-size", "8192"], &exe, &["300", "300"])
            .status
            .success()
    );
    assert_eq!(share_reaching_main(&out8, &exe, "deep_leaf"), 0.0);
    remove_scratch_dir(&dir);
}

#[test]
fn a_chosen_ring_size_limits_stack_copies_and_says_so() {
    require_perf!();
    let dir = scratch_dir("rec-ring");
    let exe = build_c(&["rec_deep.c"], NO_FP, &dir, "rec_deep");
    // 4 MiB holds 32 whole 64 KiB copies: stacks are complete.
    let out = dir.join("4m.lpt");
    let result = launch(&out, &["--ring-size", "4M"], &exe, &["300", "300"]);
    assert_success(&result);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!stderr.contains("stack copies limited"), "{stderr}");
    let share = share_reaching_main(&out, &exe, "deep_leaf");
    assert!(share > 0.99, "only {share} of deep samples reach main");
    // 1 MiB does not: copies of 31,744 bytes, said in a warning that names
    // the option, and written in the trace's header.
    let out1 = dir.join("1m.lpt");
    let result = launch(&out1, &["--ring-size", "1M"], &exe, &["300", "300"]);
    assert_success(&result);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("stack copies limited to 31744 bytes") && stderr.contains("--ring-size"),
        "{stderr}"
    );
    let (reader, _) = load_complete(&out1);
    assert_eq!(reader.header().sampling.stack_size, 31744);
    assert_eq!(share_reaching_main(&out1, &exe, "deep_leaf"), 0.0);
    // Below the smallest ring: a one-line error, and no trace.
    let tiny = dir.join("tiny.lpt");
    let result = launch(&tiny, &["--ring-size", "16K"], &exe, &["300", "300"]);
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("32K"), "{stderr}");
    assert!(!tiny.exists());
    remove_scratch_dir(&dir);
}

#[test]
fn large_stack_frame_is_copied_back_to_main() {
    require_perf!();
    let dir = scratch_dir("rec-bigframe");
    let exe = build_c(&["rec_bigframe.c"], NO_FP, &dir, "rec_bigframe");
    let out = dir.join("t.lpt");
    assert!(launch(&out, &[], &exe, &["400"]).status.success());
    let share = share_reaching_main(&out, &exe, "frame_leaf");
    assert!(share > 0.99, "only {share} of samples reach main");
    remove_scratch_dir(&dir);
}

#[test]
fn thread_churn_fork_and_exec_leave_a_finished_trace() {
    require_perf!();
    let dir = scratch_dir("rec-churn");
    let churn = build_c(&["rec_churn.c"], NO_FP, &dir, "rec_churn");
    let threads = build_threads(&dir);
    let out = dir.join("t.lpt");
    let result = launch(
        &out,
        &[],
        &churn,
        &["1000", "exec", threads.to_str().unwrap(), "300"],
    );
    // The exec'd program's exit status is the command's.
    assert_exit_code(&result, 7);
    let (reader, records) = load_complete(&out);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    let pid = root_pid(&reader);

    let started = records
        .iter()
        .filter(|r| matches!(r, Record::Thread(t) if t.event == ThreadEvent::Start && t.pid == pid))
        .count();
    assert!(started >= 1000 + 2, "only {started} thread starts");
    let exited = records
        .iter()
        .filter(|r| matches!(r, Record::Thread(t) if t.event == ThreadEvent::Exit))
        .count();
    assert!(exited >= 1000, "only {exited} thread exits");

    let child = records
        .iter()
        .find_map(|r| match r {
            Record::Process(p) if p.event == ProcessEvent::Fork => Some(p.clone()),
            _ => None,
        })
        .expect("the forked child");
    assert_eq!(child.parent, Some(pid));
    assert!(
        samples(&records).iter().any(|s| s.pid == child.pid),
        "no samples from the forked child"
    );
    // The child runs its parent's program with its parent's arguments,
    // and the analysis says so, though the fork's record names neither;
    // the parent's later exec does not rename it.
    let profile = lrnprof_analyzer::analyze(
        &out,
        &lrnprof_analyzer::AnalyzeOptions::default(),
        &lrnprof_analyzer::NoProgress,
    )
    .unwrap();
    let forked = profile
        .processes
        .iter()
        .find(|p| p.pid == child.pid.0)
        .expect("the forked child in the profile");
    assert_eq!(
        forked.command,
        [
            churn.to_str().unwrap(),
            "1000",
            "exec",
            threads.to_str().unwrap(),
            "300"
        ],
        "{forked:?}"
    );
    assert_eq!(forked.executable.as_deref(), churn.to_str(), "{forked:?}");

    let exec_time = records
        .iter()
        .find_map(|r| match r {
            Record::Process(p)
                if p.event == ProcessEvent::Exec
                    && p.pid == pid
                    && p.time > reader.header().start_time
                    && p.executable.as_deref() == threads.to_str() =>
            {
                Some(p.time)
            }
            _ => None,
        })
        .expect("the exec of rec_threads");
    assert!(
        images(&records)
            .iter()
            .any(|m| m.pid == pid && Path::new(&m.path) == threads && m.time >= exec_time),
        "the exec'd program's image"
    );
    let exit = records
        .iter()
        .find_map(|r| match r {
            Record::Process(p) if p.pid == pid => match p.event {
                ProcessEvent::Exit { code } => Some(code),
                _ => None,
            },
            _ => None,
        })
        .expect("the command's exit");
    assert_eq!(exit, Some(7));
    remove_scratch_dir(&dir);
}

#[test]
fn short_lived_processes_keep_their_vdso() {
    require_perf!();
    let dir = scratch_dir("rec-short-vdso");
    let out = dir.join("t.lpt");
    // Most of these are gone before the recorder reads their mappings.
    let result = launch(
        &out,
        &["--embed", "none"],
        Path::new("/bin/sh"),
        &[
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do /bin/true; done",
        ],
    );
    assert_success(&result);
    let (_, records) = load_complete(&out);
    let vdsos: Vec<_> = images(&records)
        .into_iter()
        .filter(|m| m.kind == ImageKind::Vdso)
        .collect();
    // The shell and its twenty children.
    assert!(vdsos.len() >= 21, "{} vDSO mappings", vdsos.len());
    let ids: std::collections::BTreeSet<_> = vdsos.iter().map(|m| m.build_id.clone()).collect();
    // One vDSO, named by its build id in every process: none without.
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(ids.iter().all(Option::is_some), "{ids:?}");
    remove_scratch_dir(&dir);
}

#[test]
fn a_command_that_leaves_a_process_running_says_so() {
    use std::os::unix::ffi::OsStrExt;
    require_perf!();
    let dir = scratch_dir("rec-left-running");
    let fifo = dir.join("fifo");
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // Safety: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let out = dir.join("t.lpt");
    // The shell exits at once; cat waits for a writer of the FIFO, which
    // the test opens once the recording has ended (cat holds none of the
    // recorder's output pipes, whose end the test waits for).
    let script = format!("cat {} > /dev/null 2>&1 & exit 0", fifo.display());
    let result = launch(
        &out,
        &["--embed", "none"],
        Path::new("/bin/sh"),
        &["-c", &script],
    );
    drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    assert_success(&result);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains(
            "warning: the command exited, but 1 process it started still runs, recorded only \
             until then: "
        ) && stderr.contains("; to record on, attach with --pid "),
        "{stderr}"
    );
    // A command whose children have all exited gets no such warning.
    let result = launch(
        &out,
        &["--embed", "none"],
        Path::new("/bin/sh"),
        &["-c", "/bin/true & wait"],
    );
    assert_success(&result);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!stderr.contains("warning"), "{stderr}");
    remove_scratch_dir(&dir);
}

#[test]
fn many_busy_threads_lose_nothing_at_1khz() {
    require_perf!();
    // Without root the recorder cannot run above the target's priority,
    // and 48 busy threads on a small machine starve it.
    if !is_root() {
        skip!("needs root (CAP_SYS_NICE) to favour the recorder's threads");
    }
    let dir = scratch_dir("rec-many");
    let exe = build_threads(&dir);
    let out = dir.join("t.lpt");
    let result = launch(&out, &["--embed", "none"], &exe, &["1000", "48"]);
    assert_exit_code(&result, 7);
    let (reader, records) = load(&out);
    // Includes: no Lost records and a summary saying 0 lost.
    assert_complete(&reader, &records);
    assert_samples_plausible(&records);
    let names = thread_names(&records);
    assert!(names.iter().any(|n| n == "worker-48"), "{names:?}");
    remove_scratch_dir(&dir);
}

#[test]
fn cpu_clock_by_default_and_cycles_on_request() {
    require_perf!();
    let dir = scratch_dir("rec-event");
    let exe = build_threads(&dir);
    let out = dir.join("clock.lpt");
    let result = launch(&out, &["--embed", "none"], &exe, &["100"]);
    assert_exit_code(&result, 7);
    let (reader, records) = load_complete(&out);
    assert_eq!(reader.header().sampling.event, SampleEvent::CpuClock);
    assert!(samples(&records)
        .iter()
        .all(|s| s.kind == SampleKind::CpuTime));

    // Where the machine has a cycle counter the trace says cycles; where it
    // has none (most virtual machines), the recorder says what to do and
    // leaves no file.
    let out = dir.join("cycles.lpt");
    let result = launch(
        &out,
        &["--embed", "none", "--event", "cycles"],
        &exe,
        &["100"],
    );
    let stderr = String::from_utf8_lossy(&result.stderr);
    if result.status.code() == Some(7) {
        let (reader, records) = load_complete(&out);
        assert_eq!(reader.header().sampling.event, SampleEvent::Cycles);
        let all = samples(&records);
        assert!(!all.is_empty());
        assert!(all.iter().all(|s| s.kind == SampleKind::Cycles));
    } else {
        assert_exit_code(&result, 2);
        assert!(
            stderr.contains("cycle counter") && stderr.contains("--event cpu-clock"),
            "{stderr}"
        );
        assert!(!out.exists(), "no trace is left after a startup error");
    }
    remove_scratch_dir(&dir);
}
