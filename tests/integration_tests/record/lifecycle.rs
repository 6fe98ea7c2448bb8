//! How a recording starts and ends: startup errors and permissions,
//! `--duration`, `--freq` clamping, and the recorder killed or signalled.

use super::support::{
    assert_exit_code, assert_samples_plausible, build_threads, has_child_running, load, os, rec,
    rec_command, recorder_for_nobody, root_pid, samples, wait_for_a_readable_sample,
};
use lrnprof_format::{ProcessEvent, Record, Target};
use lrnprof_tests::{
    has_program, is_root, remove_scratch_dir, require_perf, scratch_dir, skip, wait_until,
};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[test]
fn sigkilled_recorder_leaves_a_readable_unfinished_trace() {
    require_perf!();
    let dir = scratch_dir("rec-sigkill");
    let exe = build_threads(&dir);
    let out = dir.join("t.lpt");
    let mut recorder = rec_command(&out)
        .arg("--")
        .arg(&exe)
        .arg("30000")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_a_readable_sample(&out);
    recorder.kill().unwrap();
    recorder.wait().unwrap();
    let (reader, records) = load(&out);
    // The fixture survives its recorder; stop it.
    let Target::Launch { pid, .. } = reader.header().target else {
        panic!("launched")
    };
    let _ = Command::new("kill").arg(pid.0.to_string()).status();
    assert!(
        !reader.report().finished,
        "a killed recorder wrote a footer"
    );
    assert!(!records.iter().any(|r| matches!(r, Record::Summary(_))));
    assert!(!samples(&records).is_empty(), "no whole block was readable");
    assert_samples_plausible(&records);
    remove_scratch_dir(&dir);
}

#[test]
fn sigterm_reaches_the_launched_command() {
    require_perf!();
    let dir = scratch_dir("rec-sigterm");
    let out = dir.join("t.lpt");
    let recorder = rec_command(&out)
        .args(["--", "sleep", "30"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The recorder catches SIGTERM before it launches the command, and
    // passes it on once the command runs: wait until `sleep` runs.
    wait_until("the recorder's command running", || {
        has_child_running(recorder.id(), "sleep")
    });
    let status = Command::new("kill")
        .args(["-TERM", &recorder.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let result = recorder.wait_with_output().unwrap();
    // sleep died of SIGTERM: 128 + 15, like a shell reports it.
    assert_exit_code(&result, 143);
    let (reader, records) = load(&out);
    assert!(reader.report().finished);
    assert!(records.iter().any(|r| matches!(r, Record::Process(p)
        if p.event == (ProcessEvent::Exit { code: Some(143) }))));
    remove_scratch_dir(&dir);
}

#[test]
fn a_stderr_that_cannot_be_written_does_not_end_the_recording() {
    require_perf!();
    let dir = scratch_dir("rec-stderr-lost");
    let exe = build_threads(&dir);
    let out = dir.join("t.lpt");
    // A pipe whose reader has gone (`lrnprof-rec ... 2>&1 | head -1`),
    // and a full disk: the summary cannot be written either way.
    let stderrs: Vec<(&str, Stdio)> = if cfg!(target_os = "linux") {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        vec![("closed pipe", Stdio::piped()), ("/dev/full", full.into())]
    } else {
        vec![("closed pipe", Stdio::piped())]
    };
    for (what, stderr) in stderrs {
        let mut recorder = rec_command(&out)
            .arg("--")
            .arg(&exe)
            .arg("200")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        drop(recorder.stderr.take());
        let status = recorder.wait().unwrap();
        // rec_threads exits with 7, which the recorder passes on.
        assert_eq!(status.code(), Some(7), "stderr {what}: {status}");
        let (reader, records) = load(&out);
        assert!(reader.report().finished, "stderr {what}: not finished");
        assert!(!samples(&records).is_empty(), "stderr {what}: no samples");
    }
    remove_scratch_dir(&dir);
}

/// Run the recorder expecting failure: a one-line error mentioning
/// `expect`, a non-zero exit, and no trace file.
fn assert_fails_cleanly(args: &[&OsStr], out: &Path, expect: &str) {
    let result = rec(args);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success(), "succeeded: {stderr}");
    assert!(stderr.contains(expect), "expected {expect:?} in {stderr:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr:?}");
    assert!(!out.exists(), "a trace file was left behind");
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the messages checked are the Linux backend's"
)]
fn startup_errors_are_one_line_and_leave_no_file() {
    let dir = scratch_dir("rec-errors");
    let out = dir.join("t.lpt");
    let o = out.as_os_str();
    // Pids above pid_max (at most 2^22) never exist.
    assert_fails_cleanly(
        &[os("--pid"), os("99999999"), os("--out"), o],
        &out,
        "no process with pid 99999999",
    );
    assert_fails_cleanly(
        &[os("--out"), o, os("--"), os("lrnprof-no-such-command")],
        &out,
        "command not found: lrnprof-no-such-command",
    );
    let not_exec = dir.join("data.txt");
    std::fs::write(&not_exec, "not a program").unwrap();
    assert_fails_cleanly(
        &[os("--out"), o, os("--"), not_exec.as_os_str()],
        &out,
        "cannot execute",
    );
    // A directory, and programs whose interpreter does not exist: they
    // were found, so not "command not found".
    assert_fails_cleanly(
        &[os("--out"), o, os("--"), dir.as_os_str()],
        &out,
        "Is a directory",
    );
    let script = dir.join("script.sh");
    std::fs::write(&script, "#!/lrnprof/no/such/shell -e\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert_fails_cleanly(
        &[os("--out"), o, os("--"), script.as_os_str()],
        &out,
        "the interpreter its #! line names, /lrnprof/no/such/shell, does not exist",
    );
    let bad_out: PathBuf = dir.join("no-such-dir/t.lpt");
    assert_fails_cleanly(
        &[os("--out"), bad_out.as_os_str(), os("--"), os("true")],
        &bad_out,
        "cannot write trace file",
    );
    assert_fails_cleanly(&[os("--out"), o], &out, "give --pid PID or a command");
    assert_fails_cleanly(
        &[
            os("--out"),
            o,
            os("--duration"),
            os("1e300"),
            os("--"),
            os("true"),
        ],
        &out,
        "--duration 1e300 is too long",
    );
    // A trace already at the path (an earlier recording) stays as it was.
    std::fs::write(&out, b"earlier").unwrap();
    let result = rec(&[os("--out"), o, os("--"), os("lrnprof-no-such-command")]);
    assert!(!result.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"earlier");
    remove_scratch_dir(&dir);
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "kernel threads are Linux's")]
fn attaching_to_a_kernel_thread_asks_for_kernel() {
    // Pid 2 is kthreadd, the parent of every kernel thread, unless this
    // runs in a PID namespace, where no kernel thread is visible.
    if std::fs::read_to_string("/proc/2/comm").ok().as_deref() != Some("kthreadd\n") {
        skip!("pid 2 is not kthreadd here (a PID namespace?)");
    }
    let dir = scratch_dir("rec-kthread");
    let out = dir.join("t.lpt");
    assert_fails_cleanly(
        &[os("--pid"), os("2"), os("--out"), out.as_os_str()],
        &out,
        "pid 2 (kthreadd) is a kernel thread, which runs no user code: add --kernel",
    );
    remove_scratch_dir(&dir);
}

#[test]
fn another_users_process_is_refused_with_advice() {
    // Needs root to run the recorder as an unprivileged user.
    if !cfg!(target_os = "linux") || !is_root() || !has_program("runuser") {
        skip!("needs Linux, root and runuser to act as the user nobody");
    }
    let dir = scratch_dir("rec-perm");
    let rec_copy = recorder_for_nobody(&dir);
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let out = dir.join("t.lpt");
    let result = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&rec_copy)
        .arg("--pid")
        .arg(victim.id().to_string())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let _ = victim.kill();
    let _ = victim.wait();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not permitted to record pid"), "{stderr}");
    assert!(stderr.contains("belongs to uid 0"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!out.exists());
    remove_scratch_dir(&dir);
}

#[test]
fn duration_stops_recording_and_leaves_the_command_running() {
    require_perf!();
    let dir = scratch_dir("rec-duration");
    let out = dir.join("t.lpt");
    let go = dir.join("go");
    let done = dir.join("done");
    // The command cannot finish before the test says so.
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; touch {}",
        go.display(),
        done.display()
    );
    // The command inherits the recorder's stdout and stderr, so wait for
    // the recorder's exit, not for its pipes to close.
    let log = dir.join("stderr.txt");
    let status = rec_command(&out)
        .args(["--duration", "0.5", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("duration reached"), "{stderr}");
    assert!(!done.exists(), "the command finished before it was told to");
    let (reader, records) = load(&out);
    assert!(reader.report().finished);
    // The launched shell did not exit (its `sleep` children do).
    let shell = root_pid(&reader);
    assert!(!records.iter().any(|r| matches!(r, Record::Process(p)
        if p.pid == shell && matches!(p.event, ProcessEvent::Exit { .. }))));
    // The command was not killed: told to, it finishes.
    std::fs::write(&go, "").unwrap();
    wait_until("the command finishing when told to", || done.exists());
    remove_scratch_dir(&dir);
}

/// `lrnprof-rec --freq HZ` of `true` into `out`, without embedded data.
fn rec_true_at(out: &std::path::Path, hz: &str) -> std::process::Output {
    rec(&[
        os("--out"),
        out.as_os_str(),
        os("--freq"),
        os(hz),
        os("--embed"),
        os("none"),
        os("--"),
        os("true"),
    ])
}

/// `kernel.perf_event_max_sample_rate`: the kernel lowers it after slow
/// sampling interrupts.
fn max_sample_rate() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn frequency_above_the_kernel_maximum_is_clamped() {
    require_perf!();
    let max = max_sample_rate();
    let dir = scratch_dir("rec-freq");
    let out = dir.join("t.lpt");
    let too_high = (max + 1).to_string();
    let result = rec_true_at(&out, &too_high);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(stderr.contains("perf_event_max_sample_rate"), "{stderr}");
    let (reader, _) = load(&out);
    assert_eq!(reader.header().sampling.frequency_hz, max);
    remove_scratch_dir(&dir);
}

/// The software clock above 20 kHz gets a warning: the kernel does not
/// lower its rate when sampling takes most of the CPU.
#[test]
fn a_fast_software_clock_is_warned_about() {
    require_perf!();
    // The kernel may have lowered its maximum (after slow sampling
    // interrupts): the rate above 20 kHz is what it allows.
    let max = max_sample_rate();
    let fast = 30_000.min(max);
    if fast <= 20_000 {
        skip!("kernel.perf_event_max_sample_rate is {max}: no rate above 20 kHz");
    }
    let dir = scratch_dir("rec-fast-clock");
    let out = dir.join("t.lpt");
    let fast = fast.to_string();
    for (hz, warned) in [(fast.as_str(), true), ("20000", false)] {
        let result = rec_true_at(&out, hz);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(result.status.success(), "{stderr}");
        assert_eq!(
            stderr.contains(&format!(
                "warning: {hz} Hz on the software clock (cpu-clock) can slow the target"
            )),
            warned,
            "{stderr}"
        );
    }
    remove_scratch_dir(&dir);
}
