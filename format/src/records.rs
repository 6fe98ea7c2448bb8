//! The records a trace is made of.

use crate::types::{BuildId, Pid, Tid, Timestamp};
use serde::{Deserialize, Serialize};

/// One entry of a trace body. Records are ordered by time within a block, and
/// blocks by time within a file, except [`Record::Blob`] and
/// [`Record::Summary`], which may come last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A process appeared, exec'd or exited.
    Process(ProcessRecord),
    /// A thread appeared, was renamed or exited.
    Thread(ThreadRecord),
    /// An image (file, vDSO, JIT region) was mapped into a process.
    ImageMap(ImageMapRecord),
    /// A range of a process's address space was unmapped.
    ImageUnmap(ImageUnmapRecord),
    /// A sample.
    Sample(Sample),
    /// Samples or events the kernel or recorder dropped.
    Lost(LostRecord),
    /// Bytes the analyzer may need later, keyed by build id.
    Blob(Blob),
    /// Totals written when recording ended cleanly.
    Summary(Summary),
    /// A thread was found not running at sampling ticks (and was not stopped).
    Idle(IdleRecord),
    /// A sampled allocation was freed (version 2).
    Free(FreeRecord),
    /// A system call returned (version 2); its entry is a [`Sample`] with
    /// [`SampleDetail::Syscall`].
    SyscallExit(SyscallExitRecord),
    /// A thread was scheduled back in after an off-CPU sample (version 2).
    SwitchIn(SwitchInRecord),
    /// One thread's calls of one syscall over a period, counted in the
    /// kernel when only some calls are recorded as samples (version 3).
    SyscallTally(SyscallTallyRecord),
}

impl Record {
    /// The record's time, if it has one (blobs and summaries do not).
    pub fn time(&self) -> Option<Timestamp> {
        match self {
            Record::Process(r) => Some(r.time),
            Record::Thread(r) => Some(r.time),
            Record::ImageMap(r) => Some(r.time),
            Record::ImageUnmap(r) => Some(r.time),
            Record::Sample(r) => Some(r.time),
            Record::Lost(r) => Some(r.time),
            Record::Idle(r) => Some(r.time),
            Record::Free(r) => Some(r.time),
            Record::SyscallExit(r) => Some(r.time),
            Record::SwitchIn(r) => Some(r.time),
            Record::SyscallTally(r) => Some(r.time),
            Record::Blob(_) | Record::Summary(_) => None,
        }
    }
}

/// What happened to a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessEvent {
    /// The process already existed when recording started.
    Existing,
    /// The process was forked from `parent`.
    Fork,
    /// The process replaced its program image (`execve`); images mapped
    /// before this time are gone.
    Exec,
    /// The process exited; `code` is the exit status or `128 + signal` if known.
    Exit {
        /// Exit status, when known.
        code: Option<i32>,
    },
}

/// A process event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// When it happened.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// Its parent, when known.
    pub parent: Option<Pid>,
    /// What happened.
    pub event: ProcessEvent,
    /// Command line (argv), when known; empty for exits.
    pub command: Vec<String>,
    /// Path of the executable, when known.
    pub executable: Option<String>,
    /// The process's control group (the unified hierarchy's path, as in
    /// `/proc/PID/cgroup`), which names its container; `None` if unknown
    /// (version 2).
    pub cgroup: Option<String>,
}

/// What happened to a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThreadEvent {
    /// The thread already existed when recording started.
    Existing,
    /// The thread was created during the recording.
    Start,
    /// The thread got a new name (see [`ThreadRecord::name`]).
    Rename,
    /// The thread exited.
    Exit,
}

/// A thread event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRecord {
    /// When it happened.
    pub time: Timestamp,
    /// The process the thread belongs to.
    pub pid: Pid,
    /// The thread.
    pub tid: Tid,
    /// What happened.
    pub event: ThreadEvent,
    /// The thread's name at that time, when known.
    pub name: Option<String>,
}

/// What kind of memory an image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ImageKind {
    /// A file mapped from disk (executable or shared library).
    File,
    /// The kernel's virtual dynamic shared object: no file, its bytes live
    /// only in the process (and in a [`Blob`] if the recorder embedded them).
    Vdso,
    /// Anonymous executable memory, typically JIT-compiled code.
    Anonymous,
    /// An image from the macOS dyld shared cache: no standalone file.
    SharedCache,
}

/// An image mapped into a process's address space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMapRecord {
    /// When it was mapped (the recording's start for images already mapped).
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// First mapped address (AVMA).
    pub start: u64,
    /// One past the last mapped address (AVMA).
    pub end: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub file_offset: u64,
    /// Path as the process sees it (for the vDSO, `[vdso]`).
    pub path: String,
    /// Build id or Mach-O UUID, when known.
    pub build_id: Option<BuildId>,
    /// What kind of image.
    pub kind: ImageKind,
    /// Whether the mapping is executable.
    pub executable: bool,
}

/// An address range unmapped from a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUnmapRecord {
    /// When it was unmapped.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// First unmapped address (AVMA).
    pub start: u64,
    /// One past the last unmapped address (AVMA).
    pub end: u64,
}

/// What a sample measures; its [`Sample::weight`] is in this kind's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SampleKind {
    /// On-CPU time; weight in nanoseconds.
    CpuTime,
    /// CPU cycles; weight in cycles.
    Cycles,
    /// Wall-clock time of a thread that may be off-CPU; weight in nanoseconds.
    WallTime,
    /// Bytes allocated; weight in bytes.
    Allocation,
    /// A system call's entry; weight is a count (1). See
    /// [`SampleDetail::Syscall`] and [`SyscallExitRecord`].
    Syscall,
    /// A thread switched out (version 2). The off-CPU time runs from the
    /// sample's time to the thread's next [`SwitchInRecord`] (or its exit,
    /// or the end of the recording); `weight` is 0 as written.
    OffCpu,
}

/// Bits of [`Sample::flags`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SampleFlags(pub u32);

impl SampleFlags {
    /// The stack copy ended below the thread's stack top, at a page the
    /// thread had never touched (the kernel copies without faulting pages
    /// in), so the copy holds only the innermost frames.
    pub const STACK_CUT_SHORT: SampleFlags = SampleFlags(1);
    /// In a stripped trace: when stripped, the sample's unwinding reached
    /// the thread's root (its [`Sample::frames`] are complete).
    pub const REACHED_ROOT: SampleFlags = SampleFlags(2);
    /// The sampled thread ran 32-bit code: on an x86-64 trace an i386
    /// process (registers, stack words and addresses are 32-bit, in the
    /// low halves of the trace's 64-bit fields), on an AArch64 trace an
    /// AArch32 one.
    pub const ABI_32: SampleFlags = SampleFlags(4);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: SampleFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These bits and those of `other`.
    #[must_use]
    pub fn with(self, other: SampleFlags) -> SampleFlags {
        SampleFlags(self.0 | other.0)
    }
}

/// What a sample's event was about, beyond its kind and weight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SampleDetail {
    /// Nothing more (CPU samples).
    #[default]
    None,
    /// A sampled allocation of [`Sample::weight`] bytes at `address`; a
    /// later [`FreeRecord`] with the same pid and address frees it.
    Allocation {
        /// AVMA of the allocated block.
        address: u64,
    },
    /// A system call's entry.
    Syscall {
        /// The syscall number of the trace's architecture.
        nr: u32,
        /// The six raw argument registers.
        args: [u64; 6],
    },
    /// A switch-out.
    OffCpu {
        /// The thread was still runnable (preempted), rather than blocked.
        preempted: bool,
    },
}

/// The user registers needed to start unwinding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Regs {
    /// x86-64 registers.
    X86_64(RegsX86_64),
    /// AArch64 registers.
    Aarch64(RegsAarch64),
}

impl Regs {
    /// The instruction pointer / program counter.
    pub fn ip(&self) -> u64 {
        match self {
            Regs::X86_64(r) => r.ip,
            Regs::Aarch64(r) => r.pc,
        }
    }

    /// The stack pointer.
    pub fn sp(&self) -> u64 {
        match self {
            Regs::X86_64(r) => r.sp,
            Regs::Aarch64(r) => r.sp,
        }
    }
}

/// x86-64 user registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegsX86_64 {
    /// `rip`.
    pub ip: u64,
    /// `rsp`.
    pub sp: u64,
    /// `rbp`.
    pub bp: u64,
}

/// AArch64 user registers (pointer-authentication bits already stripped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegsAarch64 {
    /// `pc`.
    pub pc: u64,
    /// `sp`.
    pub sp: u64,
    /// `x29`, the frame pointer.
    pub fp: u64,
    /// `x30`, the link register.
    pub lr: u64,
}

/// A copy of the live part of a thread's user stack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackSnapshot {
    /// AVMA of `bytes[0]` (normally the stack pointer).
    pub start: u64,
    /// The copied bytes, from `start` upwards.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

impl StackSnapshot {
    /// One past the AVMA of the last copied byte.
    pub fn end(&self) -> u64 {
        self.start.wrapping_add(self.bytes.len() as u64)
    }
}

/// One sample of one thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When it was taken.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// The thread.
    pub tid: Tid,
    /// The CPU it ran on, when known.
    pub cpu: Option<u32>,
    /// What the sample measures.
    pub kind: SampleKind,
    /// How much of `kind` this sample stands for (ns for time, bytes for allocations).
    pub weight: u64,
    /// User registers at the sample.
    pub regs: Regs,
    /// The live user stack; empty in stripped traces.
    pub stack: StackSnapshot,
    /// A kernel-provided user callchain (frame-pointer walk), innermost first,
    /// when the recorder asked for one; empty otherwise.
    pub kernel_callchain: Vec<u64>,
    /// Frames already unwound (stripped traces): the instruction pointer then
    /// return addresses, innermost first. Empty in raw traces.
    pub frames: Vec<u64>,
    /// Kernel-mode frames (AVMAs in the kernel), innermost first, when the
    /// recorder kept them; empty otherwise (version 2).
    pub kernel_frames: Vec<u64>,
    /// See [`SampleFlags`] (version 2).
    pub flags: SampleFlags,
    /// What the event was about (version 2).
    pub detail: SampleDetail,
}

/// Where events were dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LostSource {
    /// The kernel's ring buffer was full (any event kind).
    #[default]
    Kernel,
    /// The recorder could not keep up and dropped what it had read.
    Recorder,
    /// The allocation sampler in the target dropped events (allocations
    /// and frees) because the recorder did not take them in time.
    HeapSampler,
}

/// Samples or events that were dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRecord {
    /// When the loss was noticed.
    pub time: Timestamp,
    /// The process, when known.
    pub pid: Option<Pid>,
    /// The thread, when known.
    pub tid: Option<Tid>,
    /// How many samples or events were dropped.
    pub count: u64,
    /// Where they were dropped (version 2; version-1 losses read as
    /// [`LostSource::Kernel`]).
    pub source: LostSource,
}

/// A sampled allocation was freed (or given back by `realloc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeRecord {
    /// When.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// The freeing thread.
    pub tid: Tid,
    /// AVMA of the freed block, as in the allocation's [`SampleDetail::Allocation`].
    pub address: u64,
}

/// A system call returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallExitRecord {
    /// When it returned.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// The thread; its previous syscall entry of the same `nr` is the call.
    pub tid: Tid,
    /// The syscall number.
    pub nr: u32,
    /// The raw return value (`-errno` on failure on Linux).
    pub ret: i64,
}

/// One thread's calls of one syscall from `from` to `time`, counted in
/// the kernel (version 3), when [`crate::SyscallSettings::stack_every`] is
/// above 1: only some calls are then recorded as a [`Sample`] and
/// [`SyscallExitRecord`] ("sampled" below), the tallies count every call.
///
/// A call is counted when it enters, its return (`finished`, errors,
/// durations) when it returns. Calls the kernel could not tally are always
/// recorded as samples, so a thread's exact calls of `nr` are the sum of
/// its tallies' `calls`, plus its recorded calls of `nr`, minus the sum of
/// `sampled_calls`; errors, finished calls and time likewise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallTallyRecord {
    /// End of the period (when the recorder read the counts).
    pub time: Timestamp,
    /// Start of the period: the previous tally of this thread and syscall,
    /// or the start of recording.
    pub from: Timestamp,
    /// The process.
    pub pid: Pid,
    /// The thread.
    pub tid: Tid,
    /// The syscall number.
    pub nr: u32,
    /// Calls entered in the period.
    pub calls: u64,
    /// Calls that returned in the period.
    pub finished: u64,
    /// Of which failed (returned `-4095..=-1`).
    pub errors: u64,
    /// Total duration of the calls that returned, ns.
    pub total_ns: u64,
    /// Longest call of this thread and syscall since its first tally, ns
    /// (not only of the period).
    pub max_ns: u64,
    /// Of `calls`, those recorded as samples.
    pub sampled_calls: u64,
    /// Of `finished`, those recorded as samples.
    pub sampled_finished: u64,
    /// Of `errors`, those recorded as samples.
    pub sampled_errors: u64,
    /// Of `total_ns`, the part of the calls recorded as samples, ns.
    pub sampled_ns: u64,
}

/// A thread was scheduled back in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchInRecord {
    /// When it ran again.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// The thread.
    pub tid: Tid,
}

/// Sampling ticks at which a thread was found idle.
///
/// Backends that sample from outside (macOS) skip threads that used no CPU
/// time since their last sample, without stopping them. Rather than a
/// record per tick, a thread's idle ticks are summed and written when it is
/// next sampled, when it exits, and when recording ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleRecord {
    /// When the last of the counted ticks happened.
    pub time: Timestamp,
    /// The process.
    pub pid: Pid,
    /// The thread.
    pub tid: Tid,
    /// Ticks at which the thread was idle since its previous idle record.
    pub ticks: u64,
}

/// What an embedded [`Blob`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlobKind {
    /// One section of the image, e.g. `.eh_frame`, `__unwind_info`, `.symtab`.
    Section {
        /// Section name as in the image.
        name: String,
        /// The section's address in the file (SVMA).
        svma: u64,
    },
    /// The whole image file (small images such as the vDSO).
    Image,
    /// A `perf-PID.map` JIT symbol file of process `pid`.
    JitMap {
        /// The process the map belongs to.
        pid: Pid,
    },
    /// The kernel's symbol table in `/proc/kallsyms` text form (modules'
    /// symbols included, with their `[module]` suffix), keyed by the
    /// kernel's build id (version 2).
    KernelSymbols,
    /// A table lrnprof derived from the image, `name` saying which; its
    /// bytes are specified in `docs/format.md` (version 2).
    Table {
        /// Which table.
        name: String,
    },
}

/// Bytes carried in the trace so it can be analyzed where the recorded
/// binaries do not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    /// The image these bytes belong to (for JIT maps, an empty id).
    pub build_id: BuildId,
    /// What the bytes are.
    pub kind: BlobKind,
    /// Whether `data` is zstd-compressed on its own (on top of block compression).
    pub compressed: bool,
    /// Where `data` starts in the whole blob: data larger than a block is
    /// split into several records with the same `build_id` and `kind`.
    pub offset: u64,
    /// Length of the whole blob (of all parts, as stored: compressed if `compressed`).
    pub total_len: u64,
    /// The bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Totals written by a recorder that stopped cleanly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// When recording ended.
    pub end_time: Timestamp,
    /// Samples written.
    pub samples: u64,
    /// Samples the kernel or recorder dropped.
    pub lost: u64,
    /// Distinct threads seen.
    pub threads: u64,
    /// Image mappings seen.
    pub images: u64,
}
