//! What `lrnprof-rec` does on SIGINT and SIGTERM: an attached recording
//! stops; a launched command gets the first signal (unless the terminal
//! already delivered the Ctrl-C to it) and dies of the second.

use super::support::{assert_exit_code, load, rec_command};
use lrnprof_format::{ProcessEvent, Record};
use lrnprof_tests::{remove_scratch_dir, require_perf, scratch_dir};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// Failure bound of every wait.
const PATIENCE: Duration = Duration::from_secs(30);

fn send(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

fn wait_for_file(path: &Path, recorder: &mut Child) {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        if let Some(status) = recorder.try_wait().unwrap() {
            panic!("the recorder exited ({status}) before {}", path.display());
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_signal_from_outside_reaches_the_command_and_a_second_one_kills_it() {
    require_perf!();
    let dir = scratch_dir("rec-second-signal");
    let out = dir.join("t.lpt");
    let (ready, got_int) = (dir.join("ready"), dir.join("got-int"));
    // Survives SIGINT (noting it) and would run for ever.
    let script = format!(
        "trap 'touch {}' INT; touch {}; while :; do sleep 1; done",
        got_int.display(),
        ready.display()
    );
    let mut recorder = rec_command(&out)
        .args(["--embed", "none", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut recorder);
    // Not from a terminal: passed on, and recording goes on.
    send("-INT", recorder.id());
    wait_for_file(&got_int, &mut recorder);
    send("-TERM", recorder.id());
    let result = recorder.wait_with_output().unwrap();
    // The shell died of SIGKILL: 128 + 9.
    assert_exit_code(&result, 137);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("(stopped by SIGTERM)"), "{stderr}");
    // The first signal's fate is said, and what a second one does.
    assert!(
        stderr.contains(
            "lrnprof-rec: SIGINT passed on to the command; recording until it exits \
             (a second SIGINT or SIGTERM kills it)"
        ),
        "{stderr}"
    );
    let (reader, records) = load(&out);
    assert!(reader.report().finished);
    assert!(records.iter().any(|r| matches!(r, Record::Process(p)
        if p.event == (ProcessEvent::Exit { code: Some(137) }))));
    remove_scratch_dir(&dir);
}

#[test]
fn sigint_stops_an_attached_recording_and_leaves_the_process_running() {
    require_perf!();
    let dir = scratch_dir("rec-attach-sigint");
    let out = dir.join("t.lpt");
    let mut victim = Command::new("sleep").arg("60").spawn().unwrap();
    let recorder = rec_command(&out)
        .args(["--embed", "none", "--pid", &victim.id().to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The header is written once the recorder catches signals.
    lrnprof_tests::wait_until("the recorder writes the trace header", || {
        std::fs::metadata(&out).is_ok_and(|m| m.len() > 0)
    });
    send("-INT", recorder.id());
    let result = recorder.wait_with_output().unwrap();
    let still_running = victim.try_wait().unwrap().is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    assert_exit_code(&result, 0);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("(stopped by SIGINT)"), "{stderr}");
    assert!(still_running, "the attached process was stopped");
    assert!(load(&out).0.report().finished);
    remove_scratch_dir(&dir);
}

/// A pseudo-terminal whose slave becomes a child's controlling terminal.
struct Pty {
    master: File,
    slave: File,
}

fn open_pty() -> Pty {
    // Safety: standard pty allocation; every result is checked and the
    // name buffer is large enough and NUL-terminated by ptsname_r.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = <File as std::os::fd::FromRawFd>::from_raw_fd(fd);
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(name)
            .unwrap();
        Pty { master, slave }
    }
}

/// Everything written to the terminal, as it arrives.
fn read_terminal(mut master: File) -> Receiver<Vec<u8>> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // Ends with EIO once the recorder and its child closed the slave.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Append what arrives to `seen` until it contains `text`.
fn wait_for_output(rx: &Receiver<Vec<u8>>, seen: &mut String, text: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !seen.contains(text) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            Err(e) => panic!("no {text:?} on the terminal ({e}): {seen:?}"),
        }
    }
}

#[test]
fn ctrl_c_on_the_terminal_stops_the_command_and_the_recording() {
    require_perf!();
    let dir = scratch_dir("rec-ctrl-c");
    let out = dir.join("t.lpt");
    let pty = open_pty();
    let mut command = rec_command(&out);
    command
        .args(["--embed", "none", "--", "sleep", "60"])
        .stdin(pty.slave.try_clone().unwrap())
        .stdout(Stdio::null())
        .stderr(pty.slave.try_clone().unwrap());
    // Safety: setsid and ioctl are async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            // A session of its own, with the pty as controlling terminal
            // and its process group in the foreground, as in a shell.
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let recorder = command.spawn().unwrap();
    // Only the recorder and its child hold the slave now, so reading the
    // master ends when they are gone.
    drop(command);
    drop(pty.slave);
    let mut master = pty.master;
    let output = read_terminal(master.try_clone().unwrap());
    let mut seen = String::new();
    // The status line (`0.0 s, 0 samples, 0 lost, 0 B written`): stderr
    // is a terminal and sampling has started.
    wait_for_output(&output, &mut seen, " written");
    master.write_all(b"\x03").unwrap();
    let status = recorder.wait_with_output().unwrap().status;
    wait_for_output(&output, &mut seen, "lrnprof-rec: wrote");
    // sleep died of SIGINT (128 + 2), which ended the recording; the
    // recorder did not stop on its own Ctrl-C.
    assert_eq!(status.code(), Some(130), "{seen}");
    assert!(seen.contains("(target exited)"), "{seen:?}");
    assert!(load(&out).0.report().finished);
    remove_scratch_dir(&dir);
}
