//! What a finished recording did: the summary `record` returns.

use crate::stop::StopReason;
use std::fmt;
use std::time::Duration;

/// How the recorded command ended (launch mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetExit {
    /// It exited with this status.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

impl TargetExit {
    /// The exit code a shell would report: the status, or 128 + signal.
    pub fn shell_code(&self) -> i32 {
        match *self {
            TargetExit::Code(c) => c,
            TargetExit::Signal(s) => 128 + s,
        }
    }
}

/// What a finished recording did. `Display` prints the short summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// The trace file.
    pub out: std::path::PathBuf,
    /// How long sampling ran.
    pub duration: Duration,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Samples written.
    pub samples: u64,
    /// Samples the kernel or recorder dropped.
    pub lost: u64,
    /// Distinct threads seen.
    pub threads: u64,
    /// Image mappings recorded.
    pub images: u64,
    /// Size of the trace file, in bytes.
    pub trace_bytes: u64,
    /// Bytes the embedded unwind/symbol data adds to the trace file.
    pub embedded_bytes: u64,
    /// Code addresses the recorder named for the trace's frame tables
    /// (`docs/recorder.md`, "The frame table").
    pub frame_addresses: u64,
    /// How many of `frame_addresses` the frame cache had kept from
    /// earlier recordings.
    pub frame_addresses_cached: u64,
    /// How the launched command ended; `None` when attached by pid.
    pub target_exit: Option<TargetExit>,
    /// Whether every system call's stack was recorded (`--syscalls`
    /// without `--syscall-stack-every`): a program that makes calls by
    /// the million a second floods the recorder, and the advice on lost
    /// events names what lightens that.
    pub syscall_stack_every_call: bool,
    /// The recorder's own CPU time ([`own_cpu`]) when the recording
    /// stopped, before it finished the trace (named code addresses,
    /// embedded image data).
    pub cpu_while_recording: Option<Duration>,
}

/// CPU time this process has used: every thread of it, not its children
/// (a recorded command).
pub fn own_cpu() -> Option<Duration> {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

impl RecordSummary {
    /// Assemble the summary from what the writer thread reported.
    pub(crate) fn new(
        out: &std::path::Path,
        totals: &crate::sink::SinkTotals,
        duration: Duration,
        stop_reason: StopReason,
        target_exit: Option<TargetExit>,
    ) -> RecordSummary {
        RecordSummary {
            out: out.to_owned(),
            duration,
            stop_reason,
            samples: totals.summary.samples,
            lost: totals.summary.lost,
            threads: totals.summary.threads,
            images: totals.summary.images,
            trace_bytes: totals.trace_bytes,
            embedded_bytes: totals.blob_file_bytes,
            frame_addresses: totals.frames_named.addresses,
            frame_addresses_cached: totals.frames_named.from_cache,
            target_exit,
            syscall_stack_every_call: false,
            cpu_while_recording: totals.cpu_while_recording,
        }
    }
}

/// The name of the signals that stop a recording, as `kill -l` gives
/// them (the numbers are the same on Linux and macOS).
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        _ => return None,
    })
}

/// `1 sample`, `2 samples`.
fn counted(n: impl Into<u64>, one: &str, many: &str) -> String {
    match n.into() {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

impl fmt::Display for RecordSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.stop_reason {
            StopReason::TargetExited => "target exited".to_string(),
            StopReason::Signal(s) => match signal_name(s) {
                Some(name) => format!("stopped by {name}"),
                None => format!("stopped by signal {s}"),
            },
            StopReason::Duration => "duration reached".to_string(),
            StopReason::Stopped => "stopped".to_string(),
        };
        writeln!(
            f,
            "lrnprof-rec: recorded {:.1} s ({why}): {}, {}, {}, {} lost",
            self.duration.as_secs_f64(),
            counted(self.samples, "sample", "samples"),
            counted(self.threads, "thread", "threads"),
            counted(self.images, "image", "images"),
            self.lost
        )?;
        let per_sample = self
            .trace_bytes
            .saturating_sub(self.embedded_bytes)
            .checked_div(self.samples)
            .map(|b| format!(", {b} bytes/sample"))
            .unwrap_or_default();
        write!(
            f,
            "lrnprof-rec: wrote {} ({}{per_sample}",
            self.out.display(),
            human_bytes(self.trace_bytes)
        )?;
        if self.embedded_bytes > 0 {
            write!(
                f,
                ", {} of it embedded image data",
                human_bytes(self.embedded_bytes)
            )?;
        }
        write!(f, ")")?;
        if self.frame_addresses > 0 {
            write!(
                f,
                "\nlrnprof-rec: named {} for the trace, {} of them kept in the frame cache",
                counted(self.frame_addresses, "code address", "code addresses"),
                self.frame_addresses_cached
            )?;
        }
        if self.lost > 0 {
            let syscalls = if self.syscall_stack_every_call {
                "take the stack of one system call in N (--syscall-stack-every 16: counts, \
                 errors and durations stay exact), trace fewer calls (--syscall-filter) or copy \
                 less at each (--syscall-stack-size), "
            } else {
                ""
            };
            write!(
                f,
                "\nlrnprof-rec: {} samples were lost because the recorder could not keep up: \
                 {syscalls}lower --freq or --stack-size, or run as root (larger buffers, and the \
                 recorder's threads at a higher priority than the target's)",
                self.lost
            )?;
        }
        Ok(())
    }
}

/// `1.5 MiB`-style sizes.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary of 10 samples, nothing lost, no frame addresses named.
    fn summary() -> RecordSummary {
        RecordSummary {
            out: "t.lpt".into(),
            duration: Duration::from_secs(1),
            stop_reason: StopReason::Duration,
            samples: 10,
            lost: 0,
            threads: 1,
            images: 2,
            trace_bytes: 4096,
            embedded_bytes: 1024,
            frame_addresses: 0,
            frame_addresses_cached: 0,
            target_exit: None,
            syscall_stack_every_call: false,
            cpu_while_recording: None,
        }
    }

    #[test]
    fn counts_of_one_are_singular() {
        assert!(summary()
            .to_string()
            .starts_with("lrnprof-rec: recorded 1.0 s (duration reached): 10 samples, 1 thread, 2 images, 0 lost"));
    }

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    /// The frame-table line says how much the frame cache had kept, and
    /// is left out when nothing was named.
    #[test]
    fn frame_addresses_are_shown_when_named() {
        let mut summary = summary();
        assert!(!summary.to_string().contains("code addresses"));
        (summary.frame_addresses, summary.frame_addresses_cached) = (120, 100);
        assert!(summary
            .to_string()
            .ends_with("lrnprof-rec: named 120 code addresses for the trace, 100 of them kept in the frame cache"));
    }

    /// Lost events get advice; with every syscall's stack recorded, it
    /// names the syscall options first.
    #[test]
    fn lost_events_get_advice_for_what_was_recorded() {
        let mut summary = summary();
        assert!(!summary.to_string().contains("could not keep up"));
        summary.lost = 5;
        let cpu = summary.to_string();
        assert!(cpu.contains("5 samples were lost"), "{cpu}");
        assert!(cpu.contains("lower --freq or --stack-size"), "{cpu}");
        assert!(!cpu.contains("--syscall-stack-every"), "{cpu}");
        summary.syscall_stack_every_call = true;
        let syscalls = summary.to_string();
        assert!(syscalls.contains("--syscall-stack-every 16"), "{syscalls}");
        assert!(syscalls.contains("--syscall-filter"), "{syscalls}");
    }

    /// A recording stopped by a signal names it.
    #[test]
    fn the_stopping_signal_is_named() {
        let mut summary = summary();
        let stopped = |s: &RecordSummary| s.to_string().lines().next().unwrap().to_string();
        summary.stop_reason = StopReason::Signal(libc::SIGINT);
        assert!(stopped(&summary).contains("(stopped by SIGINT)"));
        summary.stop_reason = StopReason::Signal(libc::SIGTERM);
        assert!(stopped(&summary).contains("(stopped by SIGTERM)"));
        summary.stop_reason = StopReason::Signal(libc::SIGUSR1);
        let other = stopped(&summary);
        assert!(
            other.contains(&format!("(stopped by signal {})", libc::SIGUSR1)),
            "{other}"
        );
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(TargetExit::Code(3).shell_code(), 3);
        assert_eq!(TargetExit::Signal(9).shell_code(), 137);
    }
}
