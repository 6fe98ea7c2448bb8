//! lrnprof-analyzer: turns an lrnprof trace (`.lpt`) into profiles.
//!
//! [`analyze`] reads a trace, rebuilds each process's image map over time,
//! unwinds every sample from its registers and stack copy with framehop
//! (DWARF CFI, `__unwind_info`, frame pointers, and the kernel callchain
//! where the copy ends), symbolicates each unique address once with
//! addr2line (inline frames, demangling) or symbol tables, and aggregates
//! unique stacks into a [`Profile`]. Output writers ([`ProfileWriter`])
//! turn a profile into pprof, folded stacks, speedscope JSON, a flame
//! graph SVG or Firefox Profiler JSON; [`TopReport`] and [`DiffReport`] are tables of
//! the hottest functions and of what changed between two profiles.
//!
//! Image data comes, in order of preference, from `--symbols` directories
//! and the recorded path (only when the build id matches), the usual debug
//! file places, and data embedded in the trace. The caller picks the
//! worker count; the output is the same for any count.
//!
//! ```no_run
//! use lrnprof_analyzer::{analyze, AnalyzeOptions, NoProgress, OutputFormat};
//! let profile = analyze("trace.lpt".as_ref(), &AnalyzeOptions::default(), &NoProgress)?;
//! let mut out = Vec::new();
//! OutputFormat::Folded.writer().write(&profile, &mut out)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod address;
mod analyze;
#[doc(hidden)]
pub mod bench;
mod blobs;
mod diff;
mod error;
mod image;
mod info;
mod kept;
mod options;
mod ordered;
mod outcomes;
mod output;
mod pack;
mod pipeline;
mod profile;
mod strip;
mod symbolicate;
mod syscalls;
mod tallies;
mod timeline;
mod top;
mod units;
mod unwind;
mod write_file;

pub use analyze::{analyze, analyze_in};
pub use diff::{write_diff_svg, DiffReport, DiffRow};
pub use error::AnalyzeError;
pub use info::{ThreadInfo, TraceInfo, ValueTotal};
pub use options::{AnalyzeOptions, NoProgress, Progress, SampleFilter, StackFilter};
pub use output::{
    FirefoxWriter, FoldedWriter, OutputFormat, PprofWriter, ProfileWriter, SpeedscopeWriter,
    SvgWriter,
};
pub use pack::{pack, PackOptions, PackReport};
pub use pipeline::{pool, MAX_JOBS};
pub use profile::{
    EventCounts, EventKind, Function, ImageInfo, KindRoots, Location, LocationLine, ProcessInfo,
    Profile, RootsByKind, SequenceEntry, Stack, Stats, ThreadProfile, ValueKind,
};
pub use strip::{strip, StripReport};
pub use symbolicate::FrameLine;
pub use syscalls::{
    syscall_report, CallSite, SiteStats, SlowCall, SyscallReport, SyscallReportOptions,
    SyscallStats,
};
pub use top::{TopOptions, TopOrder, TopReport, TopRow};
#[cfg(unix)]
pub use write_file::remove_unfinished_output;
pub use write_file::{default_output_path, write_atomically};
