//! The result of an analysis: unique stacks, locations and functions, in
//! first-seen order so that output is deterministic.

mod build;
mod values;

pub(crate) use build::{BlockSample, BlockStack, ProfileBuilder, UnwoundBlock};
pub use values::ValueKind;
pub(crate) use values::{amounts, kinds_of, primary, Amounts, HeapScale, SampleAmounts};

pub use crate::timeline::EventCounts;
use lrnprof_format::{BuildId, Pid, Tid, Timestamp, TraceHeader};
use serde::Serialize;

/// Everything the output writers and `info` read.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The trace header.
    pub header: TraceHeader,
    /// The trace's file name (without directories), for profile titles.
    pub trace_name: String,
    /// Every thread of the trace, ordered by (pid, tid).
    pub threads: Vec<ThreadProfile>,
    /// Every process of the trace, ordered by pid.
    pub processes: Vec<ProcessInfo>,
    /// Every image of the trace, in first-mapped order.
    pub images: Vec<ImageInfo>,
    /// Unique (name, file) functions, in first-seen order.
    pub functions: Vec<Function>,
    /// Unique code locations, in first-seen order.
    pub locations: Vec<Location>,
    /// Unique (thread, stack) pairs, in first-seen order.
    pub stacks: Vec<Stack>,
    /// The values every stack and thread carries, in this order: pprof's
    /// sample types. Which there are follows from what was recorded (CPU
    /// samples, allocations, syscalls, context switches).
    pub value_kinds: Vec<ValueKind>,
    /// The value the user asked views to show
    /// ([`AnalyzeOptions::value`](crate::AnalyzeOptions::value)), if any.
    pub selected: Option<ValueKind>,
    /// Per thread (same index as `threads`), the selected samples in time
    /// order, consecutive samples with the same stack merged (unless
    /// [`AnalyzeOptions::every_sample`](crate::AnalyzeOptions::every_sample)); their
    /// weights are amounts of [`sequence_value`](Self::sequence_value).
    /// Empty unless
    /// [`AnalyzeOptions::keep_sequences`](crate::AnalyzeOptions::keep_sequences).
    pub sequences: Vec<Vec<SequenceEntry>>,
    /// Totals.
    pub stats: Stats,
    /// Things the user should know (lost data, missing images).
    pub warnings: Vec<String>,
}

/// A process.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Command line, when recorded.
    pub command: Vec<String>,
    /// Executable path, when recorded.
    pub executable: Option<String>,
    /// Its name: its main thread's last known name, else its executable's
    /// file name.
    pub name: Option<String>,
    /// Its cgroup (container, systemd unit), when recorded.
    pub cgroup: Option<String>,
    /// It ran 32-bit code (an i386 process on x86-64): some of its samples
    /// are flagged `ABI_32`.
    pub abi32: bool,
    /// Samples (events of every kind) of its threads kept by the filter.
    pub samples: u64,
}

/// A thread.
#[derive(Debug, Clone)]
pub struct ThreadProfile {
    /// Its process.
    pub pid: Pid,
    /// Thread id.
    pub tid: Tid,
    /// Last known name, if any.
    pub name: Option<String>,
    /// Its names with when it got them, in time order, where it had more
    /// than one (see [`ThreadProfile::name_at`]).
    pub names: Vec<(lrnprof_format::Timestamp, String)>,
    /// Samples of this thread in the trace.
    pub trace_samples: u64,
    /// Samples (events of every kind) kept by the filter.
    pub samples: u64,
    /// Totals of the kept samples, one per [`Profile::value_kinds`].
    pub values: Vec<u64>,
    /// Kept samples that unwound to the thread's root.
    pub root_samples: u64,
    /// Sampling ticks at which the thread was idle and not sampled (macOS).
    pub idle_ticks: u64,
}

impl ThreadProfile {
    /// The name it had at `time`.
    pub fn name_at(&self, time: lrnprof_format::Timestamp) -> Option<&String> {
        crate::timeline::name_at(&self.names, self.name.as_ref(), time)
    }

    /// Names it had before its last one during the recording, oldest
    /// first.
    pub fn earlier_names(&self) -> Vec<String> {
        crate::timeline::earlier_names(&self.names, self.name.as_ref())
    }

    /// Name used as the root frame: `NAME-TID`, or `tid-TID` if unnamed.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{n}-{}", self.tid.0),
            None => format!("tid-{}", self.tid.0),
        }
    }
}

/// An image and where its data came from.
#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    /// Path recorded in the trace.
    pub path: String,
    /// Build id (hex), when recorded.
    pub build_id: Option<String>,
    /// Where unwind data came from: a path, `embedded in trace`, or `missing`.
    pub unwind_data: String,
    /// Where symbols came from: a path, `embedded in trace`, or `missing`.
    pub symbol_data: String,
    /// Whether debug info (file/line, inline frames) was found: DWARF, or
    /// the frame table the recorder embedded.
    pub has_debug_info: bool,
    /// Why data is missing or a local file was refused.
    pub notes: Vec<String>,
    /// Frames that fell into this image.
    pub frames: u64,
    /// Anonymous executable memory (JIT code), which has no data of its
    /// own: its frames are named from the process's JIT map and counted
    /// under no image.
    pub jit: bool,
    /// Its id was made from its content (no build id note): lrnprof's own,
    /// which no other tool knows (see `BuildId::is_content_id`).
    #[serde(skip)]
    pub content_id: bool,
}

/// A function (for inlined code, the inlined function).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Function {
    /// Demangled name, or `image+0xOFFSET` / `0xADDR` when unknown.
    pub name: String,
    /// Source file, when known.
    pub file: Option<String>,
    /// The lowest source line sampled in it, when known.
    pub first_line: Option<u32>,
}

/// One level of a location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocationLine {
    /// Index into [`Profile::functions`].
    pub function: u32,
    /// Source line, when known.
    pub line: Option<u32>,
}

/// A code address and what is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// Index into [`Profile::images`], `None` for addresses outside any image.
    pub image: Option<u32>,
    /// The lookup address (return addresses already moved back by one
    /// byte): the SVMA within an image whose data was found, the file
    /// offset within an image without data, the AVMA outside images.
    pub address: u64,
    /// Function levels, innermost (inlined) first; never empty.
    pub lines: Vec<LocationLine>,
    /// Whether symbolication failed (the name is `image+0xOFFSET`/`0xADDR`).
    pub unknown: bool,
}

/// A unique stack of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// Index into [`Profile::threads`].
    pub thread: u32,
    /// Indexes into [`Profile::locations`], leaf first.
    pub locations: Vec<u32>,
    /// Number of samples (events of every kind).
    pub samples: u64,
    /// Totals, one per [`Profile::value_kinds`].
    pub values: Vec<u64>,
    /// Samples with this stack that reached the thread's root.
    pub root_samples: u64,
    /// Of `samples`, those of each kind of event, by
    /// [`EventKind::index`]; [`ValueKind::event_kind`] says which a value
    /// counts.
    pub kind_samples: [u64; EventKind::COUNT],
}

/// A run of consecutive samples of one thread with the same stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceEntry {
    /// Index into [`Profile::stacks`].
    pub stack: u32,
    /// Time of the first sample of the run.
    pub time: Timestamp,
    /// Time of the last sample of the run.
    pub last_time: Timestamp,
    /// Number of samples merged.
    pub samples: u64,
    /// Sum of their amounts of [`Profile::sequence_value`].
    pub weight: u64,
}

/// Totals of an analysis.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Samples in the trace.
    pub trace_samples: u64,
    /// Samples kept by the filter and analyzed.
    pub samples: u64,
    /// Analyzed samples that unwound to the thread's root.
    pub root_samples: u64,
    /// Frames in analyzed samples (inline levels not counted).
    pub frames: u64,
    /// Of which could not be symbolicated.
    pub unknown_frames: u64,
    /// Samples that used the kernel callchain beyond the stack copy.
    pub kernel_callchain_samples: u64,
    /// Samples that came already unwound (stripped trace).
    pub presymbolized_samples: u64,
    /// Analyzed samples whose stack copy was cut short at a stack page
    /// their thread had never touched (the recorder then read those pages,
    /// so that later copies of the thread go through).
    pub cut_short_samples: u64,
    /// Of those, the ones that still reached the thread's root (through
    /// the kernel's frame-pointer callchain).
    pub cut_short_root_samples: u64,
    /// Analyzed samples whose stack is deeper than their stack copy: the
    /// walk stopped at a read past the copy's end, short of the root.
    pub past_copy_samples: u64,
    /// Analyzed samples whose stack stops short of the root in JIT code
    /// (anonymous executable memory), whose callers only frame pointers
    /// lead to.
    pub jit_end_samples: u64,
    /// Analyzed samples whose stack stops short of the root in unnamed
    /// code outside every mapped file (JIT code without a JIT map, or an
    /// address that is not code).
    pub unnamed_end_samples: u64,
    /// Analyzed samples whose leaf is JIT code that nothing names
    /// (anonymous executable memory, or code outside every mapped file,
    /// that no JIT map covers).
    pub unnamed_jit_samples: u64,
    /// Samples lost by the kernel or recorder.
    pub lost_samples: u64,
    /// Time from the first to the last record, in ns.
    pub duration_ns: u64,
    /// Size of the trace file, in bytes.
    pub trace_bytes: u64,
    /// Bytes of stack copies in the trace (before compression).
    pub stack_bytes: u64,
    /// Whether the trace was finished cleanly by its recorder.
    pub finished: bool,
    /// Events in the trace per kind (whatever the filter kept).
    pub events: EventCounts,
    /// Analyzed samples per kind of event, and how many reached the root:
    /// events of different kinds have stack copies of different sizes
    /// (a system call's is 1 KiB by default), so the share of all samples
    /// alone can mislead.
    pub root_by_kind: RootsByKind,
}

/// Samples of one kind of event and how many reached their thread's root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KindRoots {
    /// Analyzed samples of the kind.
    pub samples: u64,
    /// Of those, the ones that reached the thread's root.
    pub root_samples: u64,
}

/// [`KindRoots`] for each kind of event ([`Stats::root_by_kind`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RootsByKind {
    /// CPU samples (clock, timer or cycles).
    pub cpu: KindRoots,
    /// Sampled allocations.
    pub allocations: KindRoots,
    /// System call entries.
    pub syscalls: KindRoots,
    /// Off-CPU switch-outs.
    pub off_cpu: KindRoots,
}

/// The kinds of event a trace's samples are, as [`RootsByKind`] and
/// [`Stack::kind_samples`] count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// CPU samples (clock, timer or cycles).
    Cpu,
    /// Sampled allocations.
    Allocations,
    /// System call entries.
    Syscalls,
    /// Off-CPU switch-outs.
    OffCpu,
}

impl EventKind {
    /// The number of kinds.
    pub const COUNT: usize = 4;

    /// Every kind, in [`index`](Self::index) order.
    pub const ALL: [EventKind; EventKind::COUNT] = [
        EventKind::Cpu,
        EventKind::Allocations,
        EventKind::Syscalls,
        EventKind::OffCpu,
    ];

    /// The kind of a sample of `kind`.
    pub fn of_sample(kind: lrnprof_format::SampleKind) -> EventKind {
        use lrnprof_format::SampleKind::*;
        match kind {
            CpuTime | Cycles | WallTime => EventKind::Cpu,
            Allocation => EventKind::Allocations,
            Syscall => EventKind::Syscalls,
            OffCpu => EventKind::OffCpu,
        }
    }

    /// Its place in per-kind arrays ([`Stack::kind_samples`]).
    pub fn index(self) -> usize {
        self as usize
    }
}

impl RootsByKind {
    /// Count `samples` of `kind`, `root_samples` of them at the root.
    pub(crate) fn add(&mut self, kind: EventKind, samples: u64, root_samples: u64) {
        let k = match kind {
            EventKind::Cpu => &mut self.cpu,
            EventKind::Allocations => &mut self.allocations,
            EventKind::Syscalls => &mut self.syscalls,
            EventKind::OffCpu => &mut self.off_cpu,
        };
        k.samples += samples;
        k.root_samples += root_samples;
    }

    /// Each kind with samples, with its name as `info` says it.
    pub fn kinds(&self) -> impl Iterator<Item = (&'static str, KindRoots)> {
        [
            ("CPU samples", self.cpu),
            ("allocations", self.allocations),
            ("system calls", self.syscalls),
            ("switch-outs", self.off_cpu),
        ]
        .into_iter()
        .filter(|(_, k)| k.samples > 0)
    }
}

impl Stats {
    fn pct(n: u64, d: u64) -> f64 {
        if d == 0 {
            0.0
        } else {
            100.0 * n as f64 / d as f64
        }
    }
    /// Percentage of analyzed samples that reached the root.
    pub fn root_pct(&self) -> f64 {
        Self::pct(self.root_samples, self.samples)
    }
    /// Where the samples are of more than one kind of event, the share of
    /// each kind that reached the root: "CPU samples 100.0%, system calls
    /// 2.3%".
    pub fn root_by_kind_text(&self) -> Option<String> {
        let kinds: Vec<String> = self
            .root_by_kind
            .kinds()
            .map(|(name, k)| format!("{name} {:.1}%", Self::pct(k.root_samples, k.samples)))
            .collect();
        (kinds.len() > 1).then(|| kinds.join(", "))
    }
    /// Percentage of frames that could not be symbolicated.
    pub fn unknown_pct(&self) -> f64 {
        Self::pct(self.unknown_frames, self.frames)
    }
}

impl Profile {
    /// Where `kind` is in [`value_kinds`](Self::value_kinds), if the
    /// profile has it.
    pub fn value_index(&self, kind: ValueKind) -> Option<usize> {
        self.value_kinds.iter().position(|&k| k == kind)
    }

    /// The total of `kind` in `stack` (0 if the profile has no such value).
    pub fn value(&self, stack: &Stack, kind: ValueKind) -> u64 {
        self.value_index(kind).map_or(0, |i| stack.values[i])
    }

    /// Totals of the whole profile, one per [`value_kinds`](Self::value_kinds).
    pub fn totals(&self) -> Vec<u64> {
        let mut totals = vec![0u64; self.value_kinds.len()];
        for s in &self.stacks {
            for (t, v) in totals.iter_mut().zip(&s.values) {
                *t = t.saturating_add(*v);
            }
        }
        totals
    }

    /// The value a view shows when none is selected: time on CPU (or
    /// cycles) for CPU samples, else memory in use, syscall time, off-CPU
    /// time; `None` for a profile without values.
    pub fn primary_value(&self) -> Option<ValueKind> {
        primary(&self.value_kinds)
    }

    /// The value views show: the selected one, else the primary one.
    pub fn shown_value(&self) -> Option<ValueKind> {
        self.selected.or_else(|| self.primary_value())
    }

    /// The value [`sequences`](Self::sequences) weigh.
    pub fn sequence_value(&self) -> Option<ValueKind> {
        self.shown_value()
    }

    /// Names of a stack from root to leaf, inline levels expanded (each
    /// location's lines reversed), without the thread.
    pub fn stack_names(&self, stack: &Stack) -> Vec<&str> {
        let mut out = Vec::with_capacity(stack.locations.len());
        for &loc in stack.locations.iter().rev() {
            for l in self.locations[loc as usize].lines.iter().rev() {
                out.push(self.functions[l.function as usize].name.as_str());
            }
        }
        out
    }
}

/// Hex of a build id, for JSON.
pub(crate) fn hex(id: &Option<BuildId>) -> Option<String> {
    id.as_ref().map(BuildId::to_hex)
}
