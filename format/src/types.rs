//! Typed ids, the trace header and the small enums every record uses.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A process id on the recording machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pid(pub u32);

/// A thread id on the recording machine (Linux tid, or a Mach thread id
/// truncated to 32 bits on macOS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Tid(pub u32);

/// A point in time on the trace clock, in nanoseconds (see [`Clock`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

/// Byte offset of a block from the start of the trace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlockOffset(pub u64);

/// An image's identity: the ELF GNU build id note, or the Mach-O `LC_UUID`;
/// for an ELF image with neither a GNU nor a Go build id note, an id made
/// from its content ([`CONTENT_ID_PREFIX`]).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BuildId(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// The first bytes of a content id: an ELF image without a build id note
/// is identified by these 4 bytes and the first 16 bytes of the SHA-256 of
/// its whole file (20 bytes, as long as a GNU build id).
pub const CONTENT_ID_PREFIX: [u8; 4] = *b"LRNc";

impl BuildId {
    /// Whether this id was made from the image's content (see
    /// [`CONTENT_ID_PREFIX`]) rather than read from a note: no debug file
    /// or debuginfod server knows it.
    pub fn is_content_id(&self) -> bool {
        self.0.len() == 20 && self.0.starts_with(&CONTENT_ID_PREFIX)
    }

    /// Lowercase hex, the spelling `file`, `readelf -n` and debuginfod use.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(self.0.len() * 2);
        for b in &self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

impl fmt::Debug for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BuildId({})", self.to_hex())
    }
}

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The instruction set of the recorded process. Picks the unwinder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Arch {
    /// x86-64 (AMD64).
    X86_64,
    /// AArch64 (arm64).
    Aarch64,
}

/// The operating system the trace was recorded on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Os {
    /// Linux, recorded with `perf_event_open`.
    Linux,
    /// macOS, recorded with the Mach thread APIs.
    MacOs,
}

/// Byte order of the recorded process's memory (stack snapshots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Endian {
    /// Little endian (every platform lrnprof records today).
    Little,
    /// Big endian.
    Big,
}

/// The clock that all [`Timestamp`]s of a trace are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Clock {
    /// Linux `CLOCK_MONOTONIC`, in nanoseconds (what perf uses with `use_clockid`).
    Monotonic,
    /// macOS `mach_absolute_time`, converted to nanoseconds.
    MachAbsolute,
}

/// The event that triggers a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SampleEvent {
    /// The hardware cycle counter, sampled at a frequency.
    Cycles,
    /// The kernel's software CPU clock (`PERF_COUNT_SW_CPU_CLOCK`): on-CPU time.
    CpuClock,
    /// A timer that samples running threads from outside (the macOS backend).
    Timer,
}

/// How the recorder sampled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplingSettings {
    /// The event that triggered samples.
    pub event: SampleEvent,
    /// Requested samples per second per thread (after clamping to what the
    /// kernel allows).
    pub frequency_hz: u32,
    /// The most bytes of user stack copied per sample.
    pub stack_size: u32,
    /// Whether samples also carry a kernel-provided frame-pointer callchain.
    pub kernel_callchain: bool,
    /// Whether kernel-mode execution was sampled (off by default).
    pub include_kernel: bool,
}

/// What the recorder was pointed at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// Attached to already running processes.
    Attach {
        /// The processes attached to.
        pids: Vec<Pid>,
    },
    /// Launched a command.
    Launch {
        /// The command and its arguments.
        command: Vec<String>,
        /// The pid of the launched process.
        pid: Pid,
    },
    /// Every process on the machine (system-wide recording, version 2).
    System,
}

/// Which kinds of event a recording captured besides its settings in
/// [`SamplingSettings`] (version 2; a version-1 trace reads as CPU samples
/// only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSettings {
    /// Whether CPU samples (timer or counter, see [`SamplingSettings`]) were
    /// taken. `false` when only other events were recorded.
    pub cpu: bool,
    /// Allocation sampling, when on.
    pub heap: Option<HeapSettings>,
    /// System call tracing, when on.
    pub syscalls: Option<SyscallSettings>,
    /// Off-CPU (context switch) recording, when on.
    pub off_cpu: Option<OffCpuSettings>,
}

/// How allocations were sampled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeapSettings {
    /// Mean bytes allocated between two samples (exponentially distributed
    /// intervals); 1 means every allocation was recorded.
    pub mean_interval: u64,
}

/// How system calls were traced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallSettings {
    /// The syscall numbers traced; empty means all.
    pub filter: Vec<u32>,
    /// The most bytes of user stack copied at a syscall's entry (0: none).
    pub stack_size: u32,
    /// A stack is copied for one call in this many (1: every call). Counts,
    /// errors and durations always cover every call.
    pub stack_every: u32,
}

/// How context switches were recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffCpuSettings {
    /// The most bytes of user stack copied at a switch-out.
    pub stack_size: u32,
}

/// What the analyzer must know before it reads the first record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Architecture of the recorded processes.
    pub arch: Arch,
    /// Operating system of the recording machine.
    pub os: Os,
    /// Byte order of stack snapshots.
    pub endian: Endian,
    /// Pointer size of the recorded processes, in bytes (8).
    pub pointer_size: u8,
    /// Page size of the recording machine, in bytes.
    pub page_size: u32,
    /// Clock of every timestamp in the trace.
    pub clock: Clock,
    /// How samples were taken.
    pub sampling: SamplingSettings,
    /// Name and version of the program that wrote the trace, e.g. `lrnprof-rec 0.1.0`.
    pub recorder: String,
    /// Wall-clock time when recording started, in nanoseconds since the Unix epoch.
    pub start_wall_ns: u64,
    /// The trace clock's reading when recording started.
    pub start_time: Timestamp,
    /// What was recorded.
    pub target: Target,
    /// Host name of the recording machine (empty if unknown).
    pub hostname: String,
    /// Which kinds of event were recorded (version 2).
    pub events: EventSettings,
}

impl TraceHeader {
    /// A fixed header for tests and examples: x86_64 Linux, 1 kHz CPU clock.
    pub fn example() -> TraceHeader {
        TraceHeader {
            arch: Arch::X86_64,
            os: Os::Linux,
            endian: Endian::Little,
            pointer_size: 8,
            page_size: 4096,
            clock: Clock::Monotonic,
            sampling: SamplingSettings {
                event: SampleEvent::CpuClock,
                frequency_hz: 1000,
                stack_size: 65536,
                kernel_callchain: false,
                include_kernel: false,
            },
            recorder: "lrnprof-format example".to_string(),
            start_wall_ns: 0,
            start_time: Timestamp(0),
            target: Target::Launch {
                command: vec!["example".to_string()],
                pid: Pid(1),
            },
            hostname: String::new(),
            events: EventSettings {
                cpu: true,
                ..EventSettings::default()
            },
        }
    }
}
