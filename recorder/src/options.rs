//! What to record and how: a plain options struct, filled by the binary's
//! flags or by any other caller.

use lrnprof_image::EmbedLevel;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// What to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// Attach to the running process with this pid (all its threads, and
    /// the threads and child processes it creates while recorded).
    Pid(u32),
    /// Launch this command (program then arguments) and record it from its
    /// first instruction; its exit status becomes the recording's.
    Command(Vec<OsString>),
    /// Every process on the machine (Linux): one event per CPU rather
    /// than per thread, processes that start, exec and exit meanwhile
    /// followed through the kernel's records. Runs until the duration
    /// passes or the caller stops it. The recorder leaves itself out.
    System,
}

/// What triggers a CPU sample.
///
/// The CPU clock is the default: its weights are time (ns on CPU), the
/// same unit on every machine and in every view, and it works where no
/// hardware counter is exposed (most virtual machines). Cycles measure work
/// rather than time (a slowed-down or waiting core shows fewer); their
/// weights are cycles, and the analyzer labels them so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuEvent {
    /// The kernel's software CPU clock (`cpu-clock`), weights in ns.
    #[default]
    CpuClock,
    /// The hardware cycle counter (`cycles`), weights in cycles. Recording
    /// fails with advice where there is none.
    Cycles,
}

impl std::str::FromStr for CpuEvent {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu-clock" => Ok(CpuEvent::CpuClock),
            "cycles" => Ok(CpuEvent::Cycles),
            other => Err(format!("unknown event {other:?}: use cpu-clock or cycles")),
        }
    }
}

/// Allocation sampling (`lrnprof-rec --heap`): the launched command gets
/// an allocator wrapper preloaded that samples allocations by bytes and
/// hands them to the recorder through shared memory. Linux only, and only
/// for launched commands: a running process cannot be made to load it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapOptions {
    /// Mean bytes allocated between two sampled allocations (the gaps are
    /// exponentially distributed, as in tcmalloc and jemalloc); 1 records
    /// every allocation.
    pub mean_interval: u64,
}

/// The default mean bytes between two sampled allocations: 512 KiB, as
/// tcmalloc and Go sample.
pub const DEFAULT_HEAP_INTERVAL: u64 = 512 * 1024;

impl Default for HeapOptions {
    fn default() -> Self {
        HeapOptions {
            mean_interval: DEFAULT_HEAP_INTERVAL,
        }
    }
}

/// How to trace system calls (Linux): every call of the target's threads
/// through the kernel's `raw_syscalls` tracepoints, with its number,
/// arguments, return value and duration, and the user stack at its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallOptions {
    /// Syscall names and classes to trace (`write`, `openat`, `%file`,
    /// `network`; see `lrnprof_format::resolve_syscall_filter`); empty for
    /// every syscall. The kernel drops the others before they cost anything.
    pub filter: Vec<String>,
    /// The most bytes of user stack copied at a call's entry (0: none;
    /// the registers, and the callchain if asked for, are still recorded).
    /// The copy is made in the traced thread, inside every call: its size
    /// is most of what tracing costs.
    pub stack_size: u32,
    /// Also the kernel's frame-pointer callchain at each entry, to follow
    /// stacks deeper than the copy in code built with frame pointers
    /// (about a third more per call; [`RecordOptions::kernel_callchain`]
    /// is for CPU samples and switch-outs).
    pub callchain: bool,
    /// Record a call as a sample (stack, arguments, return value) at one
    /// call in this many per (thread, syscall), its first call included
    /// (1: every call). Above 1, counts, errors and durations of every
    /// call are tallied in the kernel by BPF programs (root or CAP_BPF and
    /// CAP_PERFMON; not system-wide).
    pub stack_every: u32,
}

/// The default most bytes of user stack copied at each syscall's entry:
/// enough to unwind out of the libc wrapper into the calling functions.
/// The copy is made inside every call; a copy that reaches past the end
/// of the stack's mapping (as larger ones do near the top of a thread's
/// stack) costs a page fault each time, several times the cost of the
/// whole tracepoint (see docs/benchmarks.md).
pub const DEFAULT_SYSCALL_STACK_SIZE: u32 = 1024;

/// The default most bytes of user stack copied at each switch-out:
/// switches are rarer than syscalls, so deeper stacks are affordable.
pub const DEFAULT_OFF_CPU_STACK_SIZE: u32 = 16384;

impl Default for SyscallOptions {
    fn default() -> Self {
        SyscallOptions {
            filter: Vec::new(),
            stack_size: DEFAULT_SYSCALL_STACK_SIZE,
            callchain: false,
            stack_every: 1,
        }
    }
}

/// How to record off-CPU time (Linux): at every switch-out of a target
/// thread, its user registers and stack; at its next switch-in, the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffCpuOptions {
    /// The most bytes of user stack copied at a switch-out.
    pub stack_size: u32,
}

impl Default for OffCpuOptions {
    fn default() -> Self {
        OffCpuOptions {
            stack_size: DEFAULT_OFF_CPU_STACK_SIZE,
        }
    }
}

/// How to record. Build one with `..Default::default()`:
///
/// ```
/// use lrnprof_recorder::{RecordOptions, TargetSpec};
/// let options = RecordOptions {
///     target: TargetSpec::Pid(4242),
///     frequency_hz: 500,
///     ..Default::default()
/// };
/// assert_eq!(options.out.to_str(), Some("trace.lpt"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOptions {
    /// What to record.
    pub target: TargetSpec,
    /// The trace file to write.
    pub out: PathBuf,
    /// Samples per second per running thread. Clamped (with a warning) to
    /// what the kernel allows.
    pub frequency_hz: u32,
    /// Take CPU samples (the default); off, only the events asked for below
    /// are recorded (threads, processes and images are followed either way).
    pub cpu: bool,
    /// What triggers a CPU sample.
    pub event: CpuEvent,
    /// Sample allocations too; `None`: no allocation sampling.
    pub heap: Option<HeapOptions>,
    /// Stop after this long; `None` records until the target exits or the
    /// caller stops the recording through its [`StopToken`](crate::StopToken).
    pub duration: Option<Duration>,
    /// The most bytes of user stack copied per sample (rounded down to a
    /// multiple of 8 and capped by the kernel's limit). Only the live part
    /// is stored.
    pub stack_size: u32,
    /// Bytes of each CPU's ring buffer, the memory the kernel writes
    /// samples into (Linux): rounded down to a power of two pages, from
    /// [`MIN_RING_SIZE`] (eight pages) to [`MAX_RING_SIZE`]. `None`: 16 MiB as root, else what
    /// `kernel.perf_event_mlock_kb` lets a user lock. The kernel reserves
    /// a sample's whole stack size in it, so stack copies are limited
    /// (with a warning) to what lets a ring hold 32 samples.
    pub ring_size: Option<u64>,
    /// Also ask the kernel for the user frame-pointer callchain of each
    /// sample, so stacks can be continued where the stack copy ends.
    pub kernel_callchain: bool,
    /// Also sample kernel code (Linux): the kernel part of each CPU
    /// sample's callchain is kept (kernel frames at the leaf end of its
    /// stack) and the kernel's symbol table is embedded at the end, so
    /// kernel frames are named on any machine. Needs
    /// `kernel.perf_event_paranoid` 1 or lower (or root / `CAP_PERFMON`).
    pub kernel: bool,
    /// What of each image samples touched to embed in the trace at the
    /// end, so it can be analyzed where the images do not exist.
    pub embed: EmbedLevel,
    /// Where frame tables (what the trace's addresses resolved to) are
    /// kept between recordings, by build id, so that a later recording of
    /// the same images resolves only addresses not seen before (Linux);
    /// `None`: every recording resolves all of its addresses. The command
    /// line uses [`FrameCache::default_root`](lrnprof_image::FrameCache::default_root).
    pub cache_dir: Option<PathBuf>,
    /// Also trace system calls (Linux).
    pub syscalls: Option<SyscallOptions>,
    /// Also record off-CPU time (Linux).
    pub off_cpu: Option<OffCpuOptions>,
}

/// The smallest [`RecordOptions::ring_size`]: eight pages of 4 KiB.
pub const MIN_RING_SIZE: u64 = 32 << 10;

/// The largest [`RecordOptions::ring_size`]; a larger one is held to it.
pub const MAX_RING_SIZE: u64 = 1 << 30;

/// The default samples per second.
pub const DEFAULT_FREQUENCY_HZ: u32 = 1000;

/// The default most bytes of user stack copied per sample: the largest the
/// Linux kernel allows, because deep recursion and big frames need it, and
/// only the live part of each copy is stored.
pub const DEFAULT_STACK_SIZE: u32 = 65528;

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            target: TargetSpec::Command(Vec::new()),
            out: PathBuf::from("trace.lpt"),
            frequency_hz: DEFAULT_FREQUENCY_HZ,
            cpu: true,
            event: CpuEvent::default(),
            heap: None,
            duration: None,
            stack_size: DEFAULT_STACK_SIZE,
            ring_size: None,
            kernel_callchain: true,
            kernel: false,
            embed: EmbedLevel::default(),
            cache_dir: None,
            syscalls: None,
            off_cpu: None,
        }
    }
}
