//! Running one command and measuring what it and its children cost.
//!
//! CPU time comes from `wait4(2)`: the rusage of a reaped child includes the
//! children it reaped itself, so `perf record -- CMD` reports perf plus CMD,
//! which is exactly "target + profiler". Peak memory of the command's own
//! process (not its children) is polled from `/proc/PID/status` `VmHWM`:
//! `ru_maxrss` is the largest of the whole tree, and it also counts the
//! address space the child had before `exec` (with `vfork`-style spawning,
//! this harness's own), so it is useless here.

use crate::error::BenchError;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// What one run of a command cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// User CPU time of the command and its reaped children, in seconds.
    pub user_s: f64,
    /// System CPU time of the command and its reaped children, in seconds.
    pub sys_s: f64,
    /// Wall time from spawn to exit, in seconds.
    pub wall_s: f64,
    /// Peak resident set of the command's own process, in KiB (`VmHWM`, the
    /// last value polled, every 5 ms, before it exited; 0 if it exited before
    /// the first poll).
    pub peak_rss_kib: u64,
}

impl Measured {
    /// User plus system CPU time, in seconds.
    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

/// How often `VmHWM` is read. The exit itself is waited for through a
/// pidfd where the kernel has them (Linux 5.3), so wall time ends when the
/// command does; elsewhere a reap may lag the exit by this much.
const POLL: Duration = Duration::from_millis(5);

/// Run `cmd` to completion with its standard error going to `stderr_path`
/// (read back for the error message if it fails) and measure it.
///
/// The caller sets standard input and output. The run fails if the command
/// exits with a code not in `ok_codes`, dies of a signal, or is still running
/// after `timeout` (it is then killed).
pub fn measure(
    cmd: &mut Command,
    stderr_path: &Path,
    timeout: Duration,
    ok_codes: &[i32],
) -> Result<Measured, BenchError> {
    let line = command_line(cmd);
    let stderr = File::create(stderr_path)
        .map_err(|e| BenchError::io(format!("create {}", stderr_path.display()), e))?;
    let start = Instant::now();
    let child = cmd
        .stderr(stderr)
        .spawn()
        .map_err(|e| BenchError::io(format!("start `{line}`"), e))?;
    let ok = |s: ExitStatus| s.code().is_some_and(|c| ok_codes.contains(&c));
    wait_measured(child, &line, start, stderr_path, timeout, &ok)
}

/// Wait for `child` (started at `start` as `line`, its standard error
/// going to `stderr_path`) to exit and measure it as [`measure`] does; for
/// a command that the caller stops itself (a profiler sent SIGINT). `ok`
/// tells which ends are a success.
pub fn wait_measured(
    mut child: std::process::Child,
    line: &str,
    start: Instant,
    stderr_path: &Path,
    timeout: Duration,
    ok: &dyn Fn(ExitStatus) -> bool,
) -> Result<Measured, BenchError> {
    let pid = child.id() as libc::pid_t;
    let exited = sys::ExitWatch::open(pid);
    let mut peak_rss_kib = 0;
    let mut killed = false;
    let (status, usage) = loop {
        if let Some(done) =
            sys::wait4_nohang(pid).map_err(|e| BenchError::io(format!("wait for `{line}`"), e))?
        {
            break done;
        }
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            peak_rss_kib = parse_vmhwm_kib(&text).unwrap_or(0).max(peak_rss_kib);
        }
        if !killed && start.elapsed() > timeout {
            // The child is not reaped yet, so its pid cannot have been reused.
            let _ = child.kill();
            killed = true;
        }
        exited.wait(POLL);
    };
    let wall_s = start.elapsed().as_secs_f64();
    let status = ExitStatus::from_raw(status);
    if killed || !ok(status) {
        let stderr = std::fs::read_to_string(stderr_path).unwrap_or_default();
        return Err(BenchError::CommandFailed {
            command: line.to_string(),
            status: if killed {
                format!("killed after the {} s timeout", timeout.as_secs())
            } else {
                status.to_string()
            },
            stderr,
        });
    }
    Ok(Measured {
        user_s: timeval_s(usage.ru_utime),
        sys_s: timeval_s(usage.ru_stime),
        wall_s,
        peak_rss_kib,
    })
}

/// The command as a shell-like line, for messages, with the environment
/// variables it sets first.
pub fn command_line(cmd: &Command) -> String {
    let env = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())));
    env.chain(
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned()),
    )
    .collect::<Vec<_>>()
    .join(" ")
}

fn timeval_s(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

/// The `VmHWM` (peak resident set) line of `/proc/PID/status`, in KiB.
pub fn parse_vmhwm_kib(status: &str) -> Option<u64> {
    let rest = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let mut words = rest.split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some(value)
}

mod sys {
    use std::time::Duration;

    /// Waits for a child's exit with a bound: through its pidfd, which
    /// turns readable the moment it exits, or by sleeping where there is
    /// none. Polling alone put every wall time on a 5 ms grid: a 30 ms
    /// analysis measured 30 or 35 ms, 2.5 ms too long on average.
    pub(super) struct ExitWatch(pub(super) Option<std::os::fd::OwnedFd>);

    impl ExitWatch {
        pub(super) fn open(pid: libc::pid_t) -> ExitWatch {
            #[cfg(target_os = "linux")]
            {
                // Safety: pidfd_open takes a pid and flags and returns a
                // new file descriptor or -1.
                let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
                if fd >= 0 {
                    use std::os::fd::FromRawFd;
                    // Safety: the descriptor was just opened and is owned
                    // by nothing else.
                    return ExitWatch(Some(unsafe {
                        std::os::fd::OwnedFd::from_raw_fd(fd as i32)
                    }));
                }
            }
            let _ = pid;
            ExitWatch(None)
        }

        /// Return once the child has exited, or after `most`.
        pub(super) fn wait(&self, most: Duration) {
            let Some(fd) = &self.0 else {
                std::thread::sleep(most);
                return;
            };
            use std::os::fd::AsRawFd;
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // Safety: one valid pollfd for the duration of the call. An
            // interrupted or failed poll only returns early: the caller
            // looks at the child again either way.
            unsafe { libc::poll(&mut p, 1, most.as_millis() as libc::c_int) };
        }
    }

    /// `wait4(pid, WNOHANG)`: `None` while the child runs, else its raw
    /// wait status and resource usage (including its reaped children).
    pub(super) fn wait4_nohang(pid: libc::pid_t) -> std::io::Result<Option<(i32, libc::rusage)>> {
        loop {
            let mut status = 0;
            // Safety: rusage is a plain C struct of integers; all-zero is valid.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // Safety: both out-pointers are valid for writes during the call.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
            match r {
                0 => return Ok(None),
                r if r == pid => return Ok(Some((status, usage))),
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// The frame cache (`LRNPROF_CACHE_DIR`) of a benchmark's `lrnprof-rec`
/// under `work_dir`: the benchmark's own, empty at its start. A baseline
/// recorder's is apart: a recorder removes the entries of other cache
/// layouts, so two builds sharing one would leave each other cold.
pub fn frame_cache_dir(work_dir: &Path, baseline: bool) -> PathBuf {
    work_dir.join(if baseline {
        "frame-cache-baseline"
    } else {
        "frame-cache"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmhwm_is_read_in_kib() {
        let status = "Name:\tcat\nVmPeak:\t    9000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vmhwm_kib(status), Some(1234));
        assert_eq!(parse_vmhwm_kib("Name:\tzombie\nState:\tZ\n"), None);
        assert_eq!(parse_vmhwm_kib("VmHWM:\t 12 MB\n"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    // Reaped through `wait4` below, as `wait_measured` reaps.
    #[allow(clippy::zombie_processes)]
    fn the_exit_is_seen_when_it_happens() {
        let mut child = Command::new("sleep").arg("600").spawn().expect("run sleep");
        let pid = child.id() as libc::pid_t;
        let watch = sys::ExitWatch::open(pid);
        assert!(
            watch.0.is_some(),
            "pidfd_open failed: {}",
            std::io::Error::last_os_error()
        );
        // A bound of zero returns at once; the child still runs.
        watch.wait(Duration::ZERO);
        assert!(sys::wait4_nohang(pid).unwrap().is_none());
        child.kill().unwrap();
        // Returns on the exit, not after the bound (a wait that only slept
        // would hold this test for ten minutes).
        watch.wait(Duration::from_secs(600));
        assert!(sys::wait4_nohang(pid).unwrap().is_some());
    }

    #[test]
    fn measures_cpu_time_of_grandchildren() {
        // sh reaps the busy loop child, so its CPU time must be included.
        let dir = std::env::temp_dir();
        let err = dir.join(format!("lrnprof-bench-measure-{}", std::process::id()));
        let m = measure(
            Command::new("sh").args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done & wait",
            ]),
            &err,
            Duration::from_secs(60),
            &[0],
        )
        .unwrap();
        let _ = std::fs::remove_file(&err);
        assert!(m.cpu_s() > 0.01, "{m:?}");
        assert!(m.wall_s > 0.0, "{m:?}");
    }

    #[test]
    fn peak_rss_is_the_commands_own() {
        // dd touches its whole 64 MiB buffer on every read, for a while.
        let err = std::env::temp_dir().join(format!("lrnprof-bench-rss-{}", std::process::id()));
        let m = measure(
            Command::new("dd").args(["if=/dev/zero", "of=/dev/null", "bs=64M", "count=40"]),
            &err,
            Duration::from_secs(60),
            &[0],
        )
        .unwrap();
        let _ = std::fs::remove_file(&err);
        assert!(m.peak_rss_kib >= 60 * 1024, "{m:?}");
        assert!(m.peak_rss_kib < 1024 * 1024, "{m:?}");
    }

    #[test]
    fn expected_nonzero_exit_is_success() {
        let err = std::env::temp_dir().join(format!("lrnprof-bench-ok7-{}", std::process::id()));
        let r = measure(
            Command::new("sh").args(["-c", "exit 7"]),
            &err,
            Duration::from_secs(60),
            &[0, 7],
        );
        let _ = std::fs::remove_file(&err);
        assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn failure_reports_status_and_stderr() {
        let err = std::env::temp_dir().join(format!("lrnprof-bench-fail-{}", std::process::id()));
        let e = measure(
            Command::new("sh").args(["-c", "echo boom >&2; exit 3"]),
            &err,
            Duration::from_secs(60),
            &[0],
        )
        .unwrap_err();
        let _ = std::fs::remove_file(&err);
        let msg = e.to_string();
        assert!(
            msg.contains("exit status: 3") && msg.contains("boom"),
            "{msg}"
        );
    }
}
