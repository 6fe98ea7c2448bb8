//! Plain option structs of the analyzer (no clap here: the binary maps its
//! flags onto these).

use crate::profile::ValueKind;
use lrnprof_format::{Pid, Tid};
use std::path::PathBuf;

/// Which samples to keep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampleFilter {
    /// Keep only this process.
    pub pid: Option<Pid>,
    /// Keep only this thread.
    pub tid: Option<Tid>,
    /// Keep only threads whose (last known) name is exactly this.
    pub thread_name: Option<String>,
    /// Keep only processes whose name (their main thread's last known name)
    /// is exactly this, and threads named so in other processes.
    pub comm: Option<String>,
    /// Keep only processes whose recorded cgroup path contains this text.
    pub cgroup: Option<String>,
    /// Keep samples taken at or after this many seconds from the start of the
    /// recording.
    pub from_secs: Option<f64>,
    /// Keep samples taken before this many seconds from the start of the
    /// recording.
    pub to_secs: Option<f64>,
}

impl SampleFilter {
    /// A human description of the active filters, for error messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = self.pid {
            parts.push(format!("--pid {}", p.0));
        }
        if let Some(t) = self.tid {
            parts.push(format!("--tid {}", t.0));
        }
        if let Some(n) = &self.thread_name {
            parts.push(format!("--thread-name {n:?}"));
        }
        if let Some(n) = &self.comm {
            parts.push(format!("--comm {n:?}"));
        }
        if let Some(c) = &self.cgroup {
            parts.push(format!("--cgroup {c:?}"));
        }
        if let Some(f) = self.from_secs {
            parts.push(format!("--from {f}"));
        }
        if let Some(t) = self.to_secs {
            parts.push(format!("--to {t}"));
        }
        if parts.is_empty() {
            return "no filter".to_string();
        }
        let mut text = parts.join(" ");
        if let (Some(from), Some(to)) = (self.from_secs, self.to_secs) {
            if from >= to {
                text.push_str(": --from must be less than --to");
            }
        }
        text
    }
}

/// Which samples to keep by the functions on their stacks, once unwound
/// and named. A name matches when it contains the text (as `top` shows
/// it: demangled, or `image+0xOFFSET` when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackFilter {
    /// Keep only samples with a function on their stack whose name
    /// contains one of these (none: every sample).
    pub focus: Vec<String>,
    /// Drop samples with a function on their stack whose name contains
    /// one of these.
    pub ignore: Vec<String>,
}

impl StackFilter {
    /// Whether it keeps every sample.
    pub fn is_empty(&self) -> bool {
        self.focus.is_empty() && self.ignore.is_empty()
    }

    /// A human description, for error messages.
    pub fn describe(&self) -> String {
        let focus = self.focus.iter().map(|f| format!("--focus {f:?}"));
        let ignore = self.ignore.iter().map(|i| format!("--ignore {i:?}"));
        focus.chain(ignore).collect::<Vec<_>>().join(" ")
    }
}

/// Options of [`analyze`](crate::analyze).
#[derive(Debug, Clone, Default)]
pub struct AnalyzeOptions {
    /// Extra directories searched for images and debug files (by file name,
    /// by `.build-id/xx/rest.debug` layout, and for `NAME.dSYM` bundles).
    pub symbols_dirs: Vec<PathBuf>,
    /// Worker threads; 0 means one per CPU. At most [`crate::MAX_JOBS`].
    pub jobs: usize,
    /// Which samples to keep.
    pub filter: SampleFilter,
    /// Which samples to keep by the functions on their stacks.
    pub stacks: StackFilter,
    /// Do not expand inlined functions into their own frames.
    pub no_inline: bool,
    /// Never read a local file: use only what the trace embeds.
    pub offline: bool,
    /// Fetch the debug files of images whose DWARF is not here from the
    /// debuginfod servers in `$DEBUGINFOD_URLS` (through elfutils'
    /// `debuginfod-find`, which caches them).
    pub debuginfod: bool,
    /// Keep each thread's sample sequence (needed for speedscope output;
    /// memory grows with runs of distinct consecutive stacks).
    pub keep_sequences: bool,
    /// With `keep_sequences`, one entry per sample rather than per run of
    /// consecutive samples with the same stack: each sample's own time
    /// and weight, for timelines (Firefox Profiler output). Memory grows
    /// with the number of samples.
    pub every_sample: bool,
    /// The value views show (`--value`): `None` for each view's default
    /// (sample counts in folded output, CPU time or cycles elsewhere, or
    /// the primary value of a trace without CPU samples). The trace must
    /// have recorded it.
    pub value: Option<ValueKind>,
}

/// Receives progress while an analysis runs. Implementations must be cheap:
/// they are called from worker threads.
pub trait Progress: Sync {
    /// `done` of `total` units of the current `stage` are finished.
    fn update(&self, stage: &str, done: u64, total: u64);
    /// The analysis finished (clear any progress display).
    fn finish(&self) {}
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&self, _stage: &str, _done: u64, _total: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_time_range_is_said_to_be_one() {
        let filter = |from, to| SampleFilter {
            from_secs: from,
            to_secs: to,
            ..Default::default()
        };
        assert_eq!(filter(None, None).describe(), "no filter");
        assert_eq!(filter(Some(1.0), Some(2.0)).describe(), "--from 1 --to 2");
        assert_eq!(
            filter(Some(5.0), Some(2.0)).describe(),
            "--from 5 --to 2: --from must be less than --to"
        );
    }
}
