//! What a recording tells its caller while it runs: status and warnings,
//! through the [`Reporter`] the caller passes to [`record`](crate::record).
//! The library itself never prints or draws.

use crate::sink::LiveStats;
use crate::summary::human_bytes;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receives status and warnings while a recording runs.
///
/// Both methods are called on the thread that called
/// [`record`](crate::record), which also drains the kernel's sample
/// buffers: return quickly. A terminal can block a write (Ctrl-S, a slow
/// connection); `lrnprof-rec` hands status lines to a thread of its own
/// that draws them.
pub trait Reporter {
    /// Counts so far: once when sampling starts, then about twice a
    /// second while it runs.
    fn status(&self, status: &RecordStatus);

    /// Something the user should know about the recording, which goes on.
    fn warning(&self, warning: &RecordWarning);
}

/// A [`Reporter`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReporter;

impl Reporter for NoReporter {
    fn status(&self, _status: &RecordStatus) {}
    fn warning(&self, _warning: &RecordWarning) {}
}

/// A recording's counts so far. `Display` writes
/// `2.5 s, 2451 samples, 0 lost, 1.2 MiB written`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordStatus {
    /// Time since sampling started.
    pub elapsed: Duration,
    /// Samples written to the trace.
    pub samples: u64,
    /// Samples the kernel or the recorder dropped.
    pub lost: u64,
    /// Distinct threads seen.
    pub threads: u64,
    /// Bytes written to the trace file.
    pub bytes_written: u64,
}

impl fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.1} s, {} samples, {} lost, {} written",
            self.elapsed.as_secs_f64(),
            self.samples,
            self.lost,
            human_bytes(self.bytes_written)
        )
    }
}

/// Above this rate, the software CPU clock gets a warning
/// ([`RecordWarning::FastSoftwareClock`]).
pub const FAST_SOFTWARE_CLOCK_HZ: u32 = 20_000;

/// Something that did not stop the recording but that the user should
/// know. `Display` writes one line that says what to do, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordWarning {
    /// The sampling frequency was above what the kernel allows
    /// (`kernel.perf_event_max_sample_rate`) and was lowered.
    FrequencyClamped {
        /// Samples per second asked for.
        requested_hz: u32,
        /// Samples per second used.
        used_hz: u32,
    },
    /// The software CPU clock samples faster than [`FAST_SOFTWARE_CLOCK_HZ`]:
    /// the kernel does not lower its rate when taking samples uses up most
    /// of the CPU (as it does for hardware counters), so the target can
    /// run many times slower.
    FastSoftwareClock {
        /// Samples per second used.
        hz: u32,
    },
    /// A stack size asked for is more than the kernel copies per event
    /// (just under 64 KiB on Linux): the most it copies is used.
    StackSizeCapped {
        /// The option (`--stack-size`, `--off-cpu-stack-size`,
        /// `--syscall-stack-size`).
        option: &'static str,
        /// Bytes asked for.
        requested: u32,
        /// Bytes copied at most.
        used: u32,
    },
    /// Stack copies are smaller than asked for, so that each perf ring
    /// buffer holds 32 samples (the kernel reserves a whole copy per
    /// sample).
    StackSizeLimited {
        /// The most bytes of stack copied per sample.
        bytes: u32,
        /// Bytes of each CPU's ring buffer.
        ring_bytes: u64,
        /// Whether the ring has the size the user chose
        /// ([`RecordOptions::ring_size`](crate::RecordOptions::ring_size));
        /// else `kernel.perf_event_mlock_kb` held it smaller.
        chosen: bool,
    },
    /// An image's data could not be embedded; the analyzer needs the file
    /// (with the same build id) where the trace is analyzed.
    NotEmbedded {
        /// The image's path (as mapped in the target).
        path: String,
        /// Why not.
        reason: String,
    },
    /// Records from the kernel did not parse and were skipped.
    MalformedRecords {
        /// How many.
        count: u64,
    },
    /// An image's frame table (the names, inline frames and file:line of
    /// the trace's addresses in it) was not made or not made whole: those
    /// frames are named from its symbol table only where the trace is
    /// analyzed without the image's debug info.
    FrameTableIncomplete {
        /// The image's path (as mapped in the target).
        path: String,
        /// What was left out, and why.
        reason: String,
    },
    /// Stack copies ended at pages their thread had never touched, and
    /// reading those pages from the target (which lets later copies go
    /// through) failed: stacks of such threads may stop short.
    StackPagesUnread {
        /// Samples whose stack copy was cut short.
        samples: u64,
        /// Why reading failed.
        reason: String,
    },
    /// Allocations of the launched program will not all be recorded
    /// (`--heap`). `Display` writes the program, then `reason`.
    HeapNotSampled {
        /// The program.
        program: String,
        /// What happens and why (`is statically linked: ...`).
        reason: String,
    },
    /// The recording ended with no allocation recorded (`--heap`).
    HeapNothingRecorded {
        /// What is known of why.
        reason: String,
    },
    /// Processes of the recording ran 32-bit code (`--heap`): the 64-bit
    /// allocation sampler cannot be loaded into them.
    Heap32Bit {
        /// Their pids and names, if known.
        processes: Vec<(u32, Option<String>)>,
    },
    /// The allocation sampler's shared ring stopped being readable (a
    /// process was killed while writing to it): allocations after that
    /// point are missing.
    HeapRingBroken,
    /// Frame tables resolved during this recording could not be kept in
    /// the frame cache (`--cache-dir`): the trace is whole, later
    /// recordings resolve those addresses again.
    FrameCacheNotUpdated {
        /// The cache directory and what failed.
        reason: String,
    },
    /// Kernel frames were asked for but `/proc/kallsyms` shows no
    /// addresses to this user (`kernel.kptr_restrict`): kernel frames are
    /// recorded but can only be shown as addresses.
    KernelAddressesHidden {
        /// `kernel.kptr_restrict`, if readable.
        kptr_restrict: Option<i64>,
    },
    /// The launched command exited while processes it started still run
    /// (a daemon, a background job): they were recorded until then.
    StillRunning {
        /// Their pids and names, if known.
        processes: Vec<(u32, Option<String>)>,
    },
    /// `--syscall-filter` chose the calls of 32-bit processes (i386 on
    /// x86-64) by the recorder's 64-bit syscall numbers, which are other
    /// calls in their numbering.
    SyscallFilter32Bit {
        /// Their pids and names, if known.
        processes: Vec<(u32, Option<String>)>,
    },
    /// `--pid` named a thread of another process (a thread id, as `top -H`
    /// shows): the whole process is recorded.
    ThreadOfProcess {
        /// The thread id given.
        tid: u32,
        /// Its process.
        pid: u32,
        /// The process's name, if known.
        name: Option<String>,
    },
}

impl fmt::Display for RecordWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordWarning::StackSizeCapped {
                option,
                requested,
                used,
            } => write!(
                f,
                "{option} {requested} is more than the kernel copies per event; copying up to \
                 {used} bytes"
            ),
            RecordWarning::FrequencyClamped {
                requested_hz,
                used_hz,
            } => write!(
                f,
                "{requested_hz} Hz is above kernel.perf_event_max_sample_rate; \
                 sampling at {used_hz} Hz"
            ),
            RecordWarning::StackSizeLimited {
                bytes,
                ring_bytes,
                chosen: true,
            } => write!(
                f,
                "stack copies limited to {bytes} bytes so that a ring buffer of {} holds 32 \
                 samples; a larger --ring-size allows deeper stacks",
                human_bytes(*ring_bytes)
            ),
            RecordWarning::StackSizeLimited {
                bytes,
                ring_bytes,
                chosen: false,
            } => write!(
                f,
                "stack copies limited to {bytes} bytes so that a ring buffer of {} (what \
                 kernel.perf_event_mlock_kb allows) holds 32 samples; deeper stacks need root \
                 or a higher limit",
                human_bytes(*ring_bytes)
            ),
            RecordWarning::FastSoftwareClock { hz } => write!(
                f,
                "{hz} Hz on the software clock (cpu-clock) can slow the target many times over: \
                 the kernel does not lower that rate when sampling takes most of the CPU (on a \
                 test machine a python loop ran 2x slower at 30000 Hz, 5x at 40000, over 1000x \
                 at 100000, as under perf record); at {FAST_SOFTWARE_CLOCK_HZ} Hz or less the \
                 cost grows only in proportion to the rate"
            ),
            RecordWarning::NotEmbedded { path, reason } => {
                write!(f, "not embedding {path}: {reason}")
            }
            RecordWarning::MalformedRecords { count } => write!(
                f,
                "{count} perf records could not be parsed and were skipped"
            ),
            RecordWarning::FrameTableIncomplete { path, reason } => {
                write!(f, "frame table of {path}: {reason}")
            }
            RecordWarning::StackPagesUnread { samples, reason } => write!(
                f,
                "{samples} stack copies stopped at stack pages their thread never touched, \
                 and reading those pages from the target failed ({reason}); their stacks may \
                 stop short: record as root or with CAP_SYS_PTRACE"
            ),
            RecordWarning::HeapNotSampled { program, reason } => write!(f, "{program} {reason}"),
            RecordWarning::HeapNothingRecorded { reason } => {
                write!(f, "no allocation was recorded: {reason}")
            }
            RecordWarning::HeapRingBroken => write!(
                f,
                "the allocation sampler's shared memory stopped being readable (a process was \
                 killed while writing to it): later allocations and frees are missing"
            ),
            RecordWarning::FrameCacheNotUpdated { reason } => write!(
                f,
                "the frame cache was not updated ({reason}); the trace is complete, but later \
                 recordings will resolve these frames again: choose a writable --cache-dir, \
                 or --no-cache"
            ),
            RecordWarning::KernelAddressesHidden { kptr_restrict } => {
                let setting = kptr_restrict.map_or(String::new(), |k| format!(" is {k}"));
                write!(
                    f,
                    "the kernel hides its symbol addresses (kernel.kptr_restrict{setting}): kernel \
                     frames will show as bare addresses; record as root with kptr_restrict 1 or \
                     lower, or lower it with `sudo sysctl kernel.kptr_restrict=0`"
                )
            }
            RecordWarning::SyscallFilter32Bit { processes } => write!(
                f,
                "{} 32-bit code: --syscall-filter chose its calls by their 64-bit numbers, \
                 which are other calls in a 32-bit process (the trace names those it kept \
                 as they are); record without --syscall-filter and choose calls with \
                 `lrnprof-analyze syscalls --syscall`",
                named_running(processes)
            ),
            RecordWarning::Heap32Bit { processes } => write!(
                f,
                "{} 32-bit code: its allocations are not recorded (the allocation sampler \
                 is a 64-bit library, which a 32-bit process cannot load)",
                named_running(processes)
            ),
            RecordWarning::StillRunning { processes } => {
                const SHOWN: usize = 3;
                let named: Vec<String> = processes
                    .iter()
                    .take(SHOWN)
                    .map(|(pid, name)| named_process(*pid, name.as_deref()))
                    .collect();
                let more = match processes.len().saturating_sub(SHOWN) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                let (count, verb) = match processes.len() {
                    1 => ("1 process".to_string(), "runs"),
                    n => (format!("{n} processes"), "run"),
                };
                let attach = processes.first().map_or(String::new(), |(pid, _)| {
                    format!("; to record on, attach with --pid {pid}")
                });
                write!(
                    f,
                    "the command exited, but {count} it started still {verb}, recorded only \
                     until then: {}{more}{attach}",
                    named.join(", "),
                )
            }
            RecordWarning::ThreadOfProcess { tid, pid, name } => {
                let name = name.as_ref().map_or(String::new(), |n| format!(" ({n})"));
                write!(
                    f,
                    "{tid} is a thread of process {pid}{name}: recording the whole process"
                )
            }
        }
    }
}

/// How often [`Reporter::status`] is called.
const STATUS_INTERVAL: Duration = Duration::from_millis(500);

/// Calls [`Reporter::status`] from a backend's loop at the status interval.
pub(crate) struct StatusTicker {
    stats: Arc<LiveStats>,
    started: Instant,
    next: Instant,
}

impl StatusTicker {
    /// A ticker whose first [`tick`](Self::tick) reports at once.
    pub fn new(stats: Arc<LiveStats>, started: Instant) -> StatusTicker {
        StatusTicker {
            stats,
            started,
            next: Instant::now(),
        }
    }

    /// Report the counts if the interval has passed.
    pub fn tick(&mut self, reporter: &dyn Reporter) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + STATUS_INTERVAL;
        reporter.status(&RecordStatus {
            elapsed: now - self.started,
            samples: self.stats.samples.load(Ordering::Relaxed),
            lost: self.stats.lost.load(Ordering::Relaxed),
            threads: self.stats.threads.load(Ordering::Relaxed),
            bytes_written: self.stats.bytes_written.load(Ordering::Relaxed),
        });
    }

    /// How long until the next report is due, at most `max`.
    pub fn timeout(&self, max: Duration) -> Duration {
        self.next.saturating_duration_since(Instant::now()).min(max)
    }
}

/// "NAME (pid PID)", or "pid PID" where the name is not known.
fn named_process(pid: u32, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("{n} (pid {pid})"),
        None => format!("pid {pid}"),
    }
}

/// "NAME (pid PID), ... runs" / "run": processes as a warning's subject.
fn named_running(processes: &[(u32, Option<String>)]) -> String {
    let named: Vec<String> = processes
        .iter()
        .map(|(pid, name)| named_process(*pid, name.as_deref()))
        .collect();
    let verb = if processes.len() == 1 { "runs" } else { "run" };
    format!("{} {verb}", named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Collect(RefCell<Vec<RecordStatus>>);

    impl Reporter for Collect {
        fn status(&self, status: &RecordStatus) {
            self.0.borrow_mut().push(status.clone());
        }
        fn warning(&self, _warning: &RecordWarning) {}
    }

    #[test]
    fn status_is_reported_at_once_then_at_the_interval() {
        let stats = Arc::new(LiveStats::default());
        stats.samples.store(7, Ordering::Relaxed);
        stats.bytes_written.store(1536, Ordering::Relaxed);
        let mut ticker = StatusTicker::new(Arc::clone(&stats), Instant::now());
        let collect = Collect::default();
        ticker.tick(&collect);
        ticker.tick(&collect);
        let seen = collect.0.borrow();
        assert_eq!(seen.len(), 1, "reported twice within the interval");
        assert_eq!(seen[0].samples, 7);
        assert!(seen[0]
            .to_string()
            .ends_with("s, 7 samples, 0 lost, 1.5 KiB written"));
        assert!(ticker.timeout(Duration::from_secs(10)) <= STATUS_INTERVAL);
    }

    #[test]
    fn warnings_read_as_one_line() {
        let w = RecordWarning::StackSizeCapped {
            option: "--stack-size",
            requested: 100_000,
            used: 65_528,
        };
        assert_eq!(
            w.to_string(),
            "--stack-size 100000 is more than the kernel copies per event; copying up to 65528 \
             bytes"
        );
        let w = RecordWarning::FrequencyClamped {
            requested_hz: 200_000,
            used_hz: 100_000,
        };
        assert_eq!(
            w.to_string(),
            "200000 Hz is above kernel.perf_event_max_sample_rate; sampling at 100000 Hz"
        );
        let w = RecordWarning::FastSoftwareClock { hz: 40_000 };
        assert!(
            w.to_string()
                .starts_with("40000 Hz on the software clock (cpu-clock) can slow the target"),
            "{w}"
        );
        assert!(
            w.to_string()
                .ends_with("at 20000 Hz or less the cost grows only in proportion to the rate"),
            "{w}"
        );
        let w = RecordWarning::NotEmbedded {
            path: "/lib/x.so".into(),
            reason: "the file is gone or changed".into(),
        };
        assert_eq!(
            w.to_string(),
            "not embedding /lib/x.so: the file is gone or changed"
        );
        let w = RecordWarning::StackSizeLimited {
            bytes: 15360,
            ring_bytes: 512 << 10,
            chosen: false,
        };
        assert_eq!(
            w.to_string(),
            "stack copies limited to 15360 bytes so that a ring buffer of 512.0 KiB (what \
             kernel.perf_event_mlock_kb allows) holds 32 samples; deeper stacks need root or a \
             higher limit"
        );
        let w = RecordWarning::StackSizeLimited {
            bytes: 31744,
            ring_bytes: 1 << 20,
            chosen: true,
        };
        assert_eq!(
            w.to_string(),
            "stack copies limited to 31744 bytes so that a ring buffer of 1.0 MiB holds 32 \
             samples; a larger --ring-size allows deeper stacks"
        );
    }
}
