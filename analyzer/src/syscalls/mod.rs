//! `lrnprof-analyze syscalls`: what the traced system calls did, like
//! `strace -c` (calls, errors, time per syscall) and per call site: the
//! first frame of the entry's stack outside the C library and the vDSO,
//! that is the function that called the libc wrapper, with its file:line
//! when debug info has it. Calls far slower than their call site's usual
//! duration are listed.
//!
//! Counts, errors and durations come from every recorded entry and exit
//! (exact unless the trace lost events, which the report says); call
//! sites come from unwinding each entry's stack copy. When only one call
//! in N was recorded (`lrnprof-rec --syscall-stack-every N`), counts,
//! errors and durations per syscall come from the kernel's tallies and
//! stay exact; call sites, errno names and slow calls come from the
//! recorded calls, each standing for the exact calls of its thread and
//! syscall over the recorded ones ([`crate::tallies`]). A time range
//! selects tallies by the end of their period (about a second).

mod render;

use crate::error::AnalyzeError;
use crate::options::{AnalyzeOptions, Progress};
use crate::outcomes::Outcome;
use crate::pipeline::{for_each_sample_chunk, open, pool, prepare, FrameKey, Prepared, TraceBytes};
use crate::symbolicate::symbolicate;
use crate::tallies::CallCounts;
use crate::unwind::ArchCache;
use lrnprof_format::{
    errno_name, is_syscall_error, resolve_known_syscalls, resolve_syscall_filter,
    syscall_filter_words, syscall_name, Pid, SampleDetail, SampleFlags, SampleKind, SyscallAbi,
    Tid, Timestamp, TraceReader,
};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Options of [`syscall_report`].
#[derive(Debug, Clone)]
pub struct SyscallReportOptions {
    /// Image data, workers, and which threads and time range to keep
    /// ([`AnalyzeOptions::filter`]).
    pub analyze: AnalyzeOptions,
    /// Syscall names and classes to keep (`write`, `%file`, `network`);
    /// empty for all.
    pub syscalls: Vec<String>,
    /// A call is unusually slow when it takes this many times its call
    /// site's median duration (for the same syscall) or more...
    pub slow_factor: f64,
    /// ...and at least this many nanoseconds more than that median.
    pub slow_min_excess_ns: u64,
    /// The most slow calls listed per syscall (the slowest relative to
    /// their median first).
    pub slow_limit: usize,
}

impl Default for SyscallReportOptions {
    fn default() -> Self {
        SyscallReportOptions {
            analyze: AnalyzeOptions::default(),
            syscalls: Vec::new(),
            slow_factor: 10.0,
            slow_min_excess_ns: 1_000_000,
            slow_limit: 10,
        }
    }
}

/// What the traced system calls did.
#[derive(Debug, Clone, Serialize)]
pub struct SyscallReport {
    /// Per syscall, the most time first.
    pub syscalls: Vec<SyscallStats>,
    /// All kept calls.
    pub calls: u64,
    /// Of which failed.
    pub errors: u64,
    /// Their total duration, ns.
    pub total_ns: u64,
    /// Events the kernel or recorder dropped: when not 0, counts are lower
    /// bounds and some durations run to the next entry of their thread.
    pub lost: u64,
    /// One call in this many per thread and syscall was recorded with its
    /// stack (1: every call). Above 1, the per-syscall figures are exact
    /// (counted in the kernel) and call sites, errno names and slow calls
    /// are estimated from the recorded calls.
    pub stack_every: u32,
    /// Things the user should know (lost events, missing images).
    pub warnings: Vec<String>,
}

/// One syscall's calls.
#[derive(Debug, Clone, Serialize)]
pub struct SyscallStats {
    /// Its name (`syscall_NR` when its numbering has none); for calls of
    /// 32-bit processes followed by the numbering, as in `write (i386)`.
    pub syscall: String,
    /// Its number in the numbering of the processes that made the calls.
    pub nr: u32,
    /// That numbering: the trace architecture's (`x86_64`, `aarch64`), or
    /// its 32-bit processes' (`i386`, `arm`).
    pub abi: &'static str,
    /// Calls.
    pub calls: u64,
    /// Calls that returned an error (`-4095..=-1`).
    pub errors: u64,
    /// Errors per errno name (`ENOENT`, or `E<number>`).
    pub errnos: BTreeMap<String, u64>,
    /// Calls whose return was not recorded (the thread exited in the call,
    /// as `exit_group` always does, or recording ended); their duration
    /// runs until then.
    pub unfinished: u64,
    /// Total duration, ns.
    pub total_ns: u64,
    /// Mean duration, ns.
    pub avg_ns: u64,
    /// Longest call, ns.
    pub max_ns: u64,
    /// Share of all kept calls' time, percent.
    pub time_pct: f64,
    /// Call sites and slow calls come from one recorded call in this many
    /// per thread and syscall (1: every call); the counts above are exact
    /// either way.
    pub stack_every: u32,
    /// Where the calls were made, the most time first.
    pub call_sites: Vec<SiteStats>,
    /// Calls far slower than their call site's median.
    pub slow_calls: Vec<SlowCall>,
}

/// A call site: the first frame outside libc and the vDSO.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CallSite {
    /// The calling function (innermost inline level), or `image+0xOFFSET`.
    pub function: String,
    /// Its source file, when debug info has it.
    pub file: Option<String>,
    /// The line of the call, when debug info has it.
    pub line: Option<u32>,
}

/// One syscall's calls from one call site.
#[derive(Debug, Clone, Serialize)]
pub struct SiteStats {
    /// Where.
    #[serde(flatten)]
    pub site: CallSite,
    /// Calls (with one call in N recorded: the recorded ones, each
    /// standing for its thread and syscall's exact calls over its recorded
    /// ones).
    pub calls: u64,
    /// Calls that failed (estimated likewise).
    pub errors: u64,
    /// Total duration, ns (with one call in N recorded: the syscall's exact
    /// time shared among its sites in proportion to their recorded time).
    pub total_ns: u64,
    /// Median duration of the recorded calls, ns (with one call in N,
    /// these include writing their sample).
    pub median_ns: u64,
    /// Longest recorded call, ns.
    pub max_ns: u64,
}

/// A call far slower than its call site's usual.
#[derive(Debug, Clone, Serialize)]
pub struct SlowCall {
    /// When it was made, seconds since the recording started.
    pub time_s: f64,
    /// The process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// How long it took, ns.
    pub duration_ns: u64,
    /// Its call site's median for this syscall, ns.
    pub median_ns: u64,
    /// Where.
    #[serde(flatten)]
    pub site: CallSite,
}

/// A syscall: its number, and whether a 32-bit process made it (then
/// the number is in that numbering).
type Nr = (bool, u32);

/// The syscalls a `--syscall` filter keeps, in the trace architecture's
/// numbering and in its 32-bit processes'.
struct Keep {
    all: bool,
    native: Vec<u32>,
    abi32: Vec<u32>,
}

impl Keep {
    /// A word may name a syscall or class of either numbering (`mmap2`
    /// is only i386's); one that names nothing in both is an error.
    fn new(arch: lrnprof_format::Arch, words: &[String]) -> Result<Keep, AnalyzeError> {
        let abi32 = SyscallAbi::of(arch, true);
        let split = || syscall_filter_words(words.iter().map(String::as_str));
        for word in split() {
            if let Err(e) = resolve_syscall_filter(arch, [word]) {
                if resolve_syscall_filter(abi32, [word]).is_err() {
                    return Err(AnalyzeError::SyscallFilter(e.to_string()));
                }
            }
        }
        Ok(Keep {
            all: split().next().is_none(),
            native: resolve_known_syscalls(arch, split()),
            abi32: resolve_known_syscalls(abi32, split()),
        })
    }

    fn keeps(&self, (abi32, nr): Nr) -> bool {
        let list = if abi32 { &self.abi32 } else { &self.native };
        self.all || list.binary_search(&nr).is_ok()
    }

    fn is_all(&self) -> bool {
        self.all
    }
}

/// One call as collected: its syscall, where and what became of it.
struct Call {
    nr: Nr,
    site: Option<FrameKey>,
    pid: Pid,
    tid: Tid,
    time: Timestamp,
    duration_ns: u64,
    /// The return value, when the exit was recorded.
    ret: Option<i64>,
    /// How many calls it stands for (1 unless only some were recorded).
    weight: f64,
}

/// Analyze the system calls recorded in the trace at `path`.
pub fn syscall_report(
    path: &Path,
    options: &SyscallReportOptions,
    progress: &dyn Progress,
) -> Result<SyscallReport, AnalyzeError> {
    let reader = open(path, &options.analyze)?;
    if reader.header().events.syscalls.is_none() {
        return Err(AnalyzeError::NoSyscalls);
    }
    let arch = reader.header().arch;
    let keep_nrs = Keep::new(arch, &options.syscalls)?;
    let pool = pool(options.analyze.jobs)?;
    let report = pool.install(|| {
        let prepared = prepare(&reader, &options.analyze, progress, &|b| {
            reader.data().release(b)
        });
        let mut calls = collect(&reader, &prepared, options, &keep_nrs, progress);
        let tallied = tallied(&prepared, options, &keep_nrs);
        for c in &mut calls {
            c.weight = prepared.timeline.tallies.weight(&(c.pid, c.tid, c.nr.1));
        }
        build(prepared, calls, tallied, options, progress)
    });
    progress.finish();
    if report.calls == 0 && (!keep_nrs.is_all() || options.analyze.filter != Default::default()) {
        let mut what = options.analyze.filter.describe();
        if !options.syscalls.is_empty() {
            what = format!("{what}, syscalls {}", options.syscalls.join(","));
        }
        return Err(AnalyzeError::NothingSelected(what));
    }
    Ok(report)
}

/// Every kept syscall entry with its outcome and call-site frame.
fn collect(
    reader: &TraceReader<TraceBytes>,
    prepared: &Prepared,
    options: &SyscallReportOptions,
    keep_nrs: &Keep,
    progress: &dyn Progress,
) -> Vec<Call> {
    let total = reader.blocks().len() as u64;
    let mut calls = Vec::new();
    let keep = |s: &lrnprof_format::Sample| match s.detail {
        SampleDetail::Syscall { nr, .. } => {
            s.kind == SampleKind::Syscall
                && keep_nrs.keeps((s.flags.contains(SampleFlags::ABI_32), nr))
                && prepared.selected(&options.analyze.filter, s)
        }
        _ => false,
    };
    for_each_sample_chunk(reader, keep, |samples, done| {
        let chunk: Vec<Call> = samples
            .par_iter()
            .map_init(
                || ArchCache::new(prepared.arch),
                |cache, s| {
                    let unwound = prepared.unwind(cache, s);
                    let keys = prepared.frame_keys(s, &unwound.frames);
                    let outcome = prepared
                        .timeline
                        .outcomes
                        .get(&(s.pid, s.tid, s.time, s.kind));
                    let (duration_ns, ret) = match outcome {
                        Some(Outcome::Returned { duration_ns, ret }) => (*duration_ns, Some(*ret)),
                        Some(o) => (o.duration_ns(), None),
                        None => (0, None),
                    };
                    Call {
                        nr: match s.detail {
                            SampleDetail::Syscall { nr, .. } => {
                                (s.flags.contains(SampleFlags::ABI_32), nr)
                            }
                            _ => unreachable!("only syscall entries are kept"),
                        },
                        site: call_site(prepared, &keys),
                        pid: s.pid,
                        tid: s.tid,
                        time: s.time,
                        duration_ns,
                        ret,
                        weight: 1.0,
                    }
                },
            )
            .collect();
        calls.extend(chunk);
        progress.update("unwinding", done, total);
    });
    calls
}

/// Per syscall, what the selected tallies counted beyond the recorded
/// calls (their calls minus their recorded calls, and so on). A tally's
/// calls are a 32-bit process's when any of its samples were.
fn tallied(
    prepared: &Prepared,
    options: &SyscallReportOptions,
    keep_nrs: &Keep,
) -> BTreeMap<Nr, CallCounts> {
    let filter = &options.analyze.filter;
    let abi32 = |pid: Pid| {
        prepared
            .timeline
            .processes
            .get(&pid)
            .is_some_and(|p| p.abi32)
    };
    let selected = prepared.timeline.tallies.selected(|pid, tid, nr, time| {
        keep_nrs.keeps((abi32(pid), nr)) && prepared.selected_at(filter, pid, tid, time)
    });
    let mut out: BTreeMap<Nr, CallCounts> = BTreeMap::new();
    for ((pid, _, nr), t) in selected {
        let o = out.entry((abi32(pid), nr)).or_default();
        o.calls += t.calls.saturating_sub(t.sampled_calls);
        o.finished += t.finished.saturating_sub(t.sampled_finished);
        o.errors += t.errors.saturating_sub(t.sampled_errors);
        o.total_ns += t.total_ns.saturating_sub(t.sampled_ns);
        o.max_ns = o.max_ns.max(t.max_ns);
    }
    out
}

/// The first frame outside the C library, the dynamic loader and the
/// vDSO: the code that asked for the syscall. When unwinding never left
/// them, the outermost frame found.
fn call_site(prepared: &Prepared, keys: &[FrameKey]) -> Option<FrameKey> {
    keys.iter()
        .find(|k| {
            k.image()
                .is_none_or(|i| !is_system_wrapper(&prepared.images[i as usize].key.path))
        })
        .or(keys.last())
        .copied()
}

/// Whether an image holds syscall wrappers rather than the code that
/// calls them: the C library (glibc, musl), its threads library, the
/// dynamic loader, the vDSO.
fn is_system_wrapper(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    [
        "libc.so",
        "libc-",
        "libpthread",
        "ld-linux",
        "ld-musl",
        "libc.musl",
        "linux-vdso",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || name == "[vdso]"
}

/// Symbolicate the call sites and add everything up.
fn build(
    prepared: Prepared,
    calls: Vec<Call>,
    tallied: BTreeMap<Nr, CallCounts>,
    options: &SyscallReportOptions,
    progress: &dyn Progress,
) -> SyscallReport {
    // Each distinct frame symbolicated once.
    let mut frames: Vec<FrameKey> = Vec::new();
    let mut frame_ids: HashMap<FrameKey, usize> = HashMap::new();
    for c in &calls {
        if let Some(k) = c.site {
            frame_ids.entry(k).or_insert_with(|| {
                frames.push(k);
                frames.len() - 1
            });
        }
    }
    let resolved = symbolicate(
        &frames,
        &prepared.images,
        &prepared.jit_maps,
        prepared.kernel_symbols.as_ref(),
        !options.analyze.no_inline,
        progress,
    );
    let unknown = CallSite {
        function: "(no stack)".into(),
        file: None,
        line: None,
    };
    let sites: Vec<CallSite> = resolved
        .into_iter()
        .map(|(lines, _)| match lines.into_iter().next() {
            Some(l) => CallSite {
                function: l.function,
                file: l.file,
                line: l.line,
            },
            None => unknown.clone(),
        })
        .collect();
    let site_of = |c: &Call| c.site.map_or(&unknown, |k| &sites[frame_ids[&k]]).clone();

    let arch = prepared.timeline.header.arch;
    let start = prepared.timeline.header.start_time;
    let mut per_nr: BTreeMap<Nr, Vec<&Call>> = BTreeMap::new();
    for c in &calls {
        per_nr.entry(c.nr).or_default().push(c);
    }
    for &nr in tallied.keys() {
        per_nr.entry(nr).or_default();
    }
    let none = CallCounts::default();
    let stack_every = prepared
        .timeline
        .header
        .events
        .syscalls
        .as_ref()
        .map_or(1, |s| s.stack_every.max(1));
    let grand_total: u64 = calls.iter().map(|c| c.duration_ns).sum::<u64>()
        + tallied.values().map(|t| t.total_ns).sum::<u64>();
    let mut syscalls: Vec<SyscallStats> = per_nr
        .into_iter()
        .map(|(nr, calls)| {
            let extra = tallied.get(&nr).unwrap_or(&none);
            let mut stats = syscall_stats(arch, nr, &calls, extra, grand_total);
            stats.stack_every = stack_every;
            let mut by_site: BTreeMap<CallSite, Vec<&Call>> = BTreeMap::new();
            for c in &calls {
                by_site.entry(site_of(c)).or_default().push(c);
            }
            let mut slow = Vec::new();
            for (site, calls) in by_site {
                let mut durations: Vec<u64> = calls.iter().map(|c| c.duration_ns).collect();
                durations.sort_unstable();
                let median = durations[durations.len() / 2];
                let threshold = (median as f64 * options.slow_factor)
                    .max((median + options.slow_min_excess_ns) as f64);
                for c in calls.iter().filter(|c| c.duration_ns as f64 >= threshold) {
                    slow.push(SlowCall {
                        time_s: c.time.0.saturating_sub(start.0) as f64 / 1e9,
                        pid: c.pid.0,
                        tid: c.tid.0,
                        duration_ns: c.duration_ns,
                        median_ns: median,
                        site: site.clone(),
                    });
                }
                stats.call_sites.push(SiteStats {
                    site,
                    calls: calls.iter().map(|c| c.weight).sum::<f64>().round() as u64,
                    errors: calls
                        .iter()
                        .filter(|c| failed(c))
                        .map(|c| c.weight)
                        .sum::<f64>()
                        .round() as u64,
                    total_ns: calls
                        .iter()
                        .map(|c| c.weight * c.duration_ns as f64)
                        .sum::<f64>()
                        .round() as u64,
                    median_ns: median,
                    max_ns: durations.last().copied().unwrap_or(0),
                });
            }
            if !extra.is_empty() {
                // Recorded calls last longer than the others (the sample is
                // written inside them): their sites share the exact time in
                // proportion to their recorded time instead.
                let sampled: u64 = stats.call_sites.iter().map(|s| s.total_ns).sum();
                for site in &mut stats.call_sites {
                    site.total_ns = (stats.total_ns as f64 * site.total_ns as f64
                        / sampled.max(1) as f64)
                        .round() as u64;
                }
            }
            stats
                .call_sites
                .sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.site.cmp(&b.site)));
            // The slowest relative to their site's median first.
            slow.sort_by(|a, b| {
                let ratio = |s: &SlowCall| s.duration_ns as f64 / s.median_ns.max(1) as f64;
                ratio(b)
                    .total_cmp(&ratio(a))
                    .then(a.time_s.total_cmp(&b.time_s))
            });
            slow.truncate(options.slow_limit);
            stats.slow_calls = slow;
            stats
        })
        .collect();
    syscalls.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then(b.calls.cmp(&a.calls))
            .then(a.syscall.cmp(&b.syscall))
    });
    let lost = prepared.timeline.lost;
    let mut warnings = prepared.warnings;
    if lost > 0 {
        warnings.push(format!(
            "{lost} events were lost while recording: counts are lower bounds, and a call \
             whose return was lost runs until its thread's next call"
        ));
    }
    if stack_every > 1 {
        warnings.push(format!(
            "one call in {stack_every} per thread and syscall was recorded: counts, errors \
             and times per syscall are exact, call sites, errno names and slow calls are \
             estimated from the recorded calls"
        ));
    }
    SyscallReport {
        calls: syscalls.iter().map(|s| s.calls).sum(),
        errors: syscalls.iter().map(|s| s.errors).sum(),
        total_ns: grand_total,
        syscalls,
        lost,
        stack_every,
        warnings,
    }
}

fn failed(c: &Call) -> bool {
    c.ret.is_some_and(is_syscall_error)
}

/// Totals of one syscall's calls (call sites and slow calls left empty):
/// the recorded `calls` and what the tallies counted beyond them
/// (`extra`).
fn syscall_stats(
    arch: lrnprof_format::Arch,
    (abi32, nr): Nr,
    calls: &[&Call],
    extra: &CallCounts,
    grand_total: u64,
) -> SyscallStats {
    let mut errnos = BTreeMap::new();
    for c in calls.iter().filter(|c| failed(c)) {
        let errno = c.ret.map_or(0, |r| r.unsigned_abs() as u32);
        let name = errno_name(errno).map_or_else(|| format!("E{errno}"), str::to_string);
        *errnos.entry(name).or_insert(0) += 1;
    }
    let errors = errnos.values().sum::<u64>() + extra.errors;
    let errnos = scale_counts(errnos, errors);
    let total_ns: u64 = calls.iter().map(|c| c.duration_ns).sum::<u64>() + extra.total_ns;
    let n = calls.len() as u64 + extra.calls;
    let finished = calls.iter().filter(|c| c.ret.is_some()).count() as u64 + extra.finished;
    let abi = SyscallAbi::of(arch, abi32);
    let mut syscall = syscall_name(abi, nr).map_or_else(|| format!("syscall_{nr}"), str::to_string);
    if abi.is_32() {
        syscall = format!("{syscall} ({})", abi.name());
    }
    SyscallStats {
        syscall,
        nr,
        abi: abi.name(),
        calls: n,
        errors,
        errnos,
        unfinished: n.saturating_sub(finished),
        total_ns,
        avg_ns: total_ns.checked_div(n).unwrap_or(0),
        max_ns: calls
            .iter()
            .map(|c| c.duration_ns)
            .max()
            .unwrap_or(0)
            .max(extra.max_ns),
        time_pct: if grand_total == 0 {
            0.0
        } else {
            100.0 * total_ns as f64 / grand_total as f64
        },
        stack_every: 1,
        call_sites: Vec::new(),
        slow_calls: Vec::new(),
    }
}

/// `counts` (errno names of the recorded calls) scaled to add up to
/// `total` (the exact errors); the rounding remainder goes to the
/// largest. Errors no recorded call shows are `(not recorded)`.
fn scale_counts(counts: BTreeMap<String, u64>, total: u64) -> BTreeMap<String, u64> {
    let seen: u64 = counts.values().sum();
    if seen == total {
        return counts;
    }
    if seen == 0 {
        return BTreeMap::from([("(not recorded)".to_string(), total)]);
    }
    let factor = total as f64 / seen as f64;
    let mut out: BTreeMap<String, u64> = counts
        .iter()
        .map(|(k, &v)| (k.clone(), (v as f64 * factor).floor() as u64))
        .collect();
    let rest = total.saturating_sub(out.values().sum());
    if let Some((k, _)) = counts.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) {
        *out.entry(k.clone()).or_default() += rest;
    }
    out
}

#[cfg(test)]
mod tests;
