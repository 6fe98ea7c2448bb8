//! The side-by-side run: every workload without a profiler, under
//! `perf record`, under samply (when given) and under `lrnprof-rec`, then
//! analysis of the traces.

use crate::error::BenchError;
use crate::folded::parse_folded;
use crate::measure::{command_line, frame_cache_dir, measure, Measured};
use crate::perf_text::{parse_perf_script, parse_perf_stats, StackCompleteness};
use crate::workloads::{self, Workload};
use lrnprof_format::{Record, TraceReader};
use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the comparison runs and where.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// The repository root (for `tests/fixtures/` and `benches/workloads/`).
    pub repo: PathBuf,
    /// Scratch directory for built workloads, traces and logs.
    pub work_dir: PathBuf,
    /// Rounds of every measurement; figures are medians over them.
    pub runs: usize,
    /// Multiplies every workload's amount of work (1.0: about 1.5 s each).
    pub scale: f64,
    /// The `perf` binary.
    pub perf: PathBuf,
    /// The `lrnprof-rec` binary.
    pub rec: PathBuf,
    /// The `lrnprof-analyze` binary.
    pub analyze: PathBuf,
    /// The samply binary, if samply is to be measured too.
    pub samply: Option<PathBuf>,
    /// Another `lrnprof-rec` (say, built from an earlier commit) measured
    /// in the same rounds with its defaults, for a before/after comparison.
    pub baseline: Option<PathBuf>,
    /// The usual sampling rate, in Hz.
    pub freq: u32,
    /// The high sampling rate, for lost samples, in Hz.
    pub high_freq: u32,
    /// Only workloads with these names (all when empty).
    pub only: Vec<String>,
    /// Longest a single command may run.
    pub timeout: Duration,
}

/// Who samples the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Profiler {
    /// Nobody: the baseline.
    None,
    /// `perf record -g`: kernel frame-pointer callchains, no stack copies.
    PerfFp,
    /// `perf record --call-graph dwarf`: 8 KiB stack copies.
    PerfDwarf,
    /// `lrnprof-rec` with its defaults.
    Lrnprof,
    /// `lrnprof-rec --embed none`: no symbol or unwind tables carried in
    /// the trace, so no work after sampling stops.
    LrnprofNoEmbed,
    /// Another `lrnprof-rec` with its defaults (`--baseline`).
    LrnprofBaseline,
    /// `samply record --save-only`: stack copies like perf's DWARF mode,
    /// unwound and symbolicated when the recording ends.
    Samply,
}

/// A profiler at a sampling rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Setup {
    /// Who samples.
    pub profiler: Profiler,
    /// Samples per second (0 for [`Profiler::None`]).
    pub freq: u32,
}

impl fmt::Display for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.profiler {
            Profiler::None => return f.write_str("no profiler"),
            Profiler::PerfFp => "perf -g",
            Profiler::PerfDwarf => "perf dwarf",
            Profiler::Lrnprof => "lrnprof",
            Profiler::LrnprofNoEmbed => "lrnprof --embed none",
            Profiler::LrnprofBaseline => "baseline lrnprof",
            Profiler::Samply => "samply",
        };
        write!(f, "{name} @ {} Hz", self.freq)
    }
}

/// What a trace holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceFacts {
    /// File size, in bytes.
    pub bytes: u64,
    /// Samples in the file.
    pub samples: u64,
    /// Samples dropped by the kernel or the recorder.
    pub lost: u64,
    /// Bytes of blocks holding only embedded image data (lrnprof's
    /// `Record::Blob`s: symbol and unwind tables), 0 for perf.
    pub embedded_bytes: u64,
}

impl TraceFacts {
    /// Trace bytes per sample.
    pub fn bytes_per_sample(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.bytes as f64 / self.samples as f64)
    }

    /// Trace bytes per sample, not counting embedded image data.
    pub fn sample_bytes_per_sample(&self) -> Option<f64> {
        (self.samples > 0).then(|| (self.bytes - self.embedded_bytes) as f64 / self.samples as f64)
    }

    /// Lost samples as a percentage of all samples taken.
    pub fn lost_pct(&self) -> Option<f64> {
        crate::stats::percent(self.lost as f64, (self.samples + self.lost) as f64)
    }
}

/// One measured run of a workload under a setup.
#[derive(Debug, Clone, Copy)]
pub struct RunFacts {
    /// Its cost.
    pub measured: Measured,
    /// Its trace, for profiled runs.
    pub trace: Option<TraceFacts>,
    /// The recorder's own CPU time, in seconds, as lrnprof-rec reports it
    /// (its process alone, not the program it recorded).
    pub recorder_cpu_s: Option<f64>,
}

/// Who analyzes a trace, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Analysis {
    /// `perf report --stdio` of the DWARF trace.
    PerfReport,
    /// `lrnprof-analyze --format pprof --jobs 1`.
    LrnprofOneJob,
    /// `lrnprof-analyze --format pprof` on every core.
    LrnprofAllJobs,
}

impl fmt::Display for Analysis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Analysis::PerfReport => "perf report --stdio",
            Analysis::LrnprofOneJob => "lrnprof-analyze --jobs 1",
            Analysis::LrnprofAllJobs => "lrnprof-analyze (all cores)",
        })
    }
}

/// Everything measured on one workload.
#[derive(Debug, Clone)]
pub struct WorkloadResult {
    /// The workload.
    pub workload: Workload,
    /// Per setup, per round: the run, or `None` if it failed.
    pub runs: BTreeMap<Setup, Vec<Option<RunFacts>>>,
    /// Per setup at the usual rate: how many stacks reached the thread root,
    /// in percent, from the last round's trace.
    pub root_pct: BTreeMap<Setup, f64>,
    /// What `lrnprof-analyze info` itself says of the same lrnprof trace, in
    /// percent (its own notion of a thread's root).
    pub lrnprof_claimed_root_pct: Option<f64>,
    /// Per analysis of the last round's trace at the high rate: the samples
    /// analyzed and one measurement per round.
    pub analysis: BTreeMap<Analysis, (u64, Vec<Measured>)>,
    /// What went wrong, one line each.
    pub errors: Vec<String>,
}

/// The whole comparison.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The options it ran with.
    pub options: CompareOptions,
    /// One result per workload.
    pub workloads: Vec<WorkloadResult>,
    /// Each profiler's fixed cost: `true` (an empty program) run under it at
    /// the usual rate, one measurement per round.
    pub fixed_cost: BTreeMap<Setup, Vec<Measured>>,
    /// Tools or workloads that were missing, one line each.
    pub notes: Vec<String>,
    /// Whether `perf` could be used.
    pub have_perf: bool,
    /// Whether `lrnprof-rec` and `lrnprof-analyze` could be used.
    pub have_lrnprof: bool,
}

/// Run the comparison, printing progress to `progress`.
pub fn run(options: &CompareOptions, progress: &mut dyn Write) -> Result<Comparison, BenchError> {
    std::fs::create_dir_all(&options.work_dir)
        .map_err(|e| BenchError::io(format!("create {}", options.work_dir.display()), e))?;
    let mut notes = Vec::new();
    let have_perf = check_perf(options, &mut notes);
    let have_samply = check_samply(options, &mut notes);
    let have_baseline = options.baseline.as_ref().is_some_and(|rec| {
        check_file(
            rec,
            "the baseline lrnprof-rec",
            "give the path of an lrnprof-rec binary",
            &mut notes,
        )
    });
    let have_lrnprof = check_file(
        &options.rec,
        "lrnprof-rec",
        "build it with `cargo build --release -p lrnprof-recorder`",
        &mut notes,
    ) & check_file(
        &options.analyze,
        "lrnprof-analyze",
        "build it with `cargo build --release -p lrnprof-analyzer`",
        &mut notes,
    );
    let (mut list, workload_notes) =
        workloads::prepare(&options.repo, &options.work_dir, options.scale)?;
    notes.extend(workload_notes);
    if !options.only.is_empty() {
        list.retain(|w| options.only.contains(&w.name));
    }
    let empty = Workload {
        name: "empty".into(),
        what: "`true`: nothing to sample, only the profiler's start-up and shut-down".into(),
        argv: vec!["true".into()],
        fixed_work: true,
        ok_exit_codes: vec![0],
    };
    let mut fixed_cost: BTreeMap<Setup, Vec<Measured>> = BTreeMap::new();
    let log = options.work_dir.join("empty.stderr");
    let usable = Usable {
        perf: have_perf,
        lrnprof: have_lrnprof,
        samply: have_samply,
        baseline: have_baseline,
    };
    for setup in setups(&empty, options, usable)
        .into_iter()
        .filter(|s| s.freq == options.freq || s.profiler == Profiler::None)
    {
        for _ in 0..options.runs {
            match run_one(options, &empty, setup, &log) {
                Ok(r) => fixed_cost.entry(setup).or_default().push(r.measured),
                Err(e) => notes.push(format!("fixed cost of {setup}: {e}")),
            }
        }
        if let Some(m) = fixed_cost.get(&setup).and_then(|v| v.last()) {
            let _ = writeln!(progress, "[empty] {setup}: {:.3} s CPU", m.cpu_s());
        }
    }
    let mut results = Vec::new();
    for w in list {
        let setups = setups(&w, options, usable);
        results.push(run_workload(options, w, &setups, progress));
    }
    Ok(Comparison {
        options: options.clone(),
        workloads: results,
        fixed_cost,
        notes,
        have_perf,
        have_lrnprof,
    })
}

fn check_file(path: &Path, tool: &str, hint: &str, notes: &mut Vec<String>) -> bool {
    let ok = path.is_file();
    if !ok {
        notes.push(format!(
            "{tool} not found at {}: {hint}; its rows are left out",
            path.display()
        ));
    }
    ok
}

/// Whether `samply record` works here (when asked for); says why not in
/// `notes`.
fn check_samply(options: &CompareOptions, notes: &mut Vec<String>) -> bool {
    let Some(samply) = &options.samply else {
        return false;
    };
    if !check_file(
        samply,
        "samply",
        "build it with `cargo install samply --locked`",
        notes,
    ) {
        return false;
    }
    let out = options.work_dir.join("samply-check.json.gz");
    let mut cmd = Command::new(samply);
    cmd.args(["record", "--save-only", "-o"]).arg(&out);
    records_here(
        cmd,
        &out,
        "samply",
        "it needs /proc/sys/kernel/perf_event_paranoid at 1 or lower",
        notes,
    )
}

/// Which profilers can run here.
#[derive(Debug, Clone, Copy)]
struct Usable {
    perf: bool,
    lrnprof: bool,
    samply: bool,
    baseline: bool,
}

/// Whether `perf record` works here; says why not in `notes`.
fn check_perf(options: &CompareOptions, notes: &mut Vec<String>) -> bool {
    if !check_file(
        &options.perf,
        "perf",
        "install it (Debian: apt-get install linux-perf)",
        notes,
    ) {
        return false;
    }
    let out = options.work_dir.join("perf-check.data");
    let mut cmd = Command::new(&options.perf);
    cmd.args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(&out);
    records_here(
        cmd,
        &out,
        "perf",
        "run as root or lower /proc/sys/kernel/perf_event_paranoid",
        notes,
    )
}

/// Whether the recording command `record` (writing `out`, removed after)
/// records `true` here; says why not in `notes`, with `hint`, leaving
/// `tool`'s rows out.
fn records_here(
    mut record: Command,
    out: &Path,
    tool: &str,
    hint: &str,
    notes: &mut Vec<String>,
) -> bool {
    let ran = record
        .args(["--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output();
    let _ = std::fs::remove_file(out);
    match ran {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            notes.push(format!(
                "{tool} record does not work here ({}): {}; {tool} rows are left out ({hint})",
                o.status,
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            ));
            false
        }
        Err(e) => {
            notes.push(format!(
                "cannot run {}: {e}; {tool} rows are left out",
                record.get_program().to_string_lossy()
            ));
            false
        }
    }
}

fn setups(w: &Workload, o: &CompareOptions, usable: Usable) -> Vec<Setup> {
    let mut s = Vec::new();
    if w.fixed_work {
        s.push(Setup {
            profiler: Profiler::None,
            freq: 0,
        });
    }
    for (freq, profilers) in [
        (
            o.freq,
            &[
                Profiler::PerfFp,
                Profiler::PerfDwarf,
                Profiler::Lrnprof,
                Profiler::LrnprofNoEmbed,
                Profiler::LrnprofBaseline,
                Profiler::Samply,
            ][..],
        ),
        (
            o.high_freq,
            &[
                Profiler::PerfFp,
                Profiler::PerfDwarf,
                Profiler::Lrnprof,
                Profiler::LrnprofNoEmbed,
                Profiler::LrnprofBaseline,
                Profiler::Samply,
            ][..],
        ),
    ] {
        for &profiler in profilers {
            let usable = match profiler {
                Profiler::None => true,
                Profiler::PerfFp | Profiler::PerfDwarf => usable.perf,
                Profiler::Lrnprof => usable.lrnprof,
                // Only where overhead is measured.
                Profiler::LrnprofNoEmbed => usable.lrnprof && w.fixed_work,
                Profiler::LrnprofBaseline => usable.baseline && w.fixed_work,
                Profiler::Samply => usable.samply && w.fixed_work,
            };
            if usable {
                s.push(Setup { profiler, freq });
            }
        }
    }
    s
}

fn trace_path(o: &CompareOptions, w: &Workload, setup: Setup) -> PathBuf {
    let kind = match setup.profiler {
        Profiler::None => "none.data",
        Profiler::PerfFp => "perf-fp.data",
        Profiler::PerfDwarf => "perf-dwarf.data",
        Profiler::Lrnprof => "lrnprof.lpt",
        Profiler::LrnprofNoEmbed => "lrnprof-noembed.lpt",
        Profiler::LrnprofBaseline => "lrnprof-baseline.lpt",
        Profiler::Samply => "samply.json.gz",
    };
    o.work_dir.join(format!("{}-{}-{kind}", w.name, setup.freq))
}

fn run_workload(
    o: &CompareOptions,
    w: Workload,
    setups: &[Setup],
    progress: &mut dyn Write,
) -> WorkloadResult {
    let mut result = WorkloadResult {
        workload: w,
        runs: setups.iter().map(|s| (*s, Vec::new())).collect(),
        root_pct: BTreeMap::new(),
        lrnprof_claimed_root_pct: None,
        analysis: BTreeMap::new(),
        errors: Vec::new(),
    };
    let w = result.workload.clone();
    let log = o.work_dir.join(format!("{}.stderr", w.name));
    for round in 0..o.runs {
        // Rotate the order each round so no setup always runs first, right
        // after the build or after the noisiest neighbour.
        let mut order = setups.to_vec();
        order.rotate_left(round % setups.len().max(1));
        for setup in order {
            let outcome = run_one(o, &w, setup, &log);
            let line = match &outcome {
                Ok(r) => format!(
                    "{:.2} s CPU, {:.2} s wall",
                    r.measured.cpu_s(),
                    r.measured.wall_s
                ),
                Err(e) => format!("failed: {e}"),
            };
            let _ = writeln!(
                progress,
                "[{}] round {}/{} {setup}: {line}",
                w.name,
                round + 1,
                o.runs
            );
            if let Err(e) = &outcome {
                result.errors.push(format!("{setup}: {e}"));
            }
            result.runs.entry(setup).or_default().push(outcome.ok());
        }
    }
    // Stack completeness and analysis cost, on the last round's traces at the
    // usual rate.
    for profiler in [Profiler::PerfFp, Profiler::PerfDwarf, Profiler::Lrnprof] {
        let setup = Setup {
            profiler,
            freq: o.freq,
        };
        if !setups.contains(&setup) {
            continue;
        }
        let trace = trace_path(o, &w, setup);
        if profiler == Profiler::Lrnprof {
            match lrnprof_root_pct(o, &trace) {
                Ok(p) => result.lrnprof_claimed_root_pct = Some(p),
                Err(e) => result.errors.push(format!("lrnprof-analyze info: {e}")),
            }
        }
        let counted = match profiler {
            Profiler::Lrnprof => lrnprof_completeness(o, &trace),
            _ => perf_completeness(o, &trace),
        };
        let pct = counted.and_then(|c| {
            c.root_pct().ok_or_else(|| BenchError::BadOutput {
                tool: "stack listing",
                message: format!("no samples listed for {}", trace.display()),
            })
        });
        match pct {
            Ok(p) => {
                result.root_pct.insert(setup, p);
            }
            Err(e) => result.errors.push(format!("completeness of {setup}: {e}")),
        }
    }
    for analysis in [
        Analysis::PerfReport,
        Analysis::LrnprofOneJob,
        Analysis::LrnprofAllJobs,
    ] {
        let profiler = match analysis {
            Analysis::PerfReport => Profiler::PerfDwarf,
            Analysis::LrnprofOneJob | Analysis::LrnprofAllJobs => Profiler::Lrnprof,
        };
        // The high-rate traces: ten times the samples, so per-sample work
        // outweighs each tool's fixed start-up cost (reading debug info).
        let setup = Setup {
            profiler,
            freq: o.high_freq,
        };
        let Some(samples) = last_samples(&result, setup) else {
            continue;
        };
        let trace = trace_path(o, &w, setup);
        let mut measured = Vec::new();
        for round in 0..o.runs {
            match analyze_once(o, analysis, &trace, &log) {
                Ok(m) => {
                    let _ = writeln!(
                        progress,
                        "[{}] round {}/{} {analysis} of {samples} samples: {:.2} s CPU, {:.2} s wall",
                        w.name,
                        round + 1,
                        o.runs,
                        m.cpu_s(),
                        m.wall_s
                    );
                    measured.push(m);
                }
                Err(e) => {
                    result.errors.push(format!("{analysis}: {e}"));
                    break;
                }
            }
        }
        result.analysis.insert(analysis, (samples, measured));
    }
    result
}

/// Samples in the last round's trace of `setup`, if that run worked.
fn last_samples(r: &WorkloadResult, setup: Setup) -> Option<u64> {
    let last = r.runs.get(&setup)?.last()?.as_ref()?;
    last.trace.map(|t| t.samples)
}

fn run_one(
    o: &CompareOptions,
    w: &Workload,
    setup: Setup,
    log: &Path,
) -> Result<RunFacts, BenchError> {
    let trace = trace_path(o, w, setup);
    let _ = std::fs::remove_file(&trace);
    let freq = setup.freq.to_string();
    let mut cmd = match setup.profiler {
        Profiler::None => w.command(),
        Profiler::PerfFp | Profiler::PerfDwarf => {
            let mut c = Command::new(&o.perf);
            c.args(["record", "-q", "-e", "cpu-clock:u", "-F", &freq]);
            c.args(if setup.profiler == Profiler::PerfFp {
                &["-g"][..]
            } else {
                &["--call-graph", "dwarf"][..]
            });
            c.arg("-o").arg(&trace).arg("--").args(&w.argv);
            c
        }
        Profiler::Lrnprof | Profiler::LrnprofNoEmbed | Profiler::LrnprofBaseline => {
            let rec = match setup.profiler {
                Profiler::LrnprofBaseline => o
                    .baseline
                    .as_ref()
                    .ok_or(BenchError::Internal("a baseline setup without a baseline"))?,
                _ => &o.rec,
            };
            let mut c = Command::new(rec);
            let baseline = setup.profiler == Profiler::LrnprofBaseline;
            c.env("LRNPROF_CACHE_DIR", frame_cache_dir(&o.work_dir, baseline));
            if setup.profiler == Profiler::LrnprofNoEmbed {
                c.args(["--embed", "none"]);
            }
            c.args(["--freq", &freq, "--out"])
                .arg(&trace)
                .arg("--")
                .args(&w.argv);
            c
        }
        Profiler::Samply => {
            let samply = o
                .samply
                .as_ref()
                .ok_or(BenchError::Internal("a samply setup without samply"))?;
            let mut c = Command::new(samply);
            c.args(["record", "--save-only", "--rate", &freq, "-o"])
                .arg(&trace)
                .arg("--")
                .args(&w.argv);
            c
        }
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let measured = measure(&mut cmd, log, o.timeout, &w.ok_exit_codes)?;
    let trace = match setup.profiler {
        Profiler::None => None,
        Profiler::PerfFp | Profiler::PerfDwarf => Some(perf_facts(&o.perf, &trace)?),
        Profiler::Lrnprof | Profiler::LrnprofNoEmbed | Profiler::LrnprofBaseline => {
            Some(lrnprof_facts(&trace)?)
        }
        Profiler::Samply => Some(samply_facts(&trace)?),
    };
    let recorder_cpu_s = match setup.profiler {
        Profiler::Lrnprof | Profiler::LrnprofNoEmbed | Profiler::LrnprofBaseline => {
            std::fs::read_to_string(log)
                .ok()
                .and_then(|text| recorder_cpu(&text))
        }
        _ => None,
    };
    Ok(RunFacts {
        measured,
        trace,
        recorder_cpu_s,
    })
}

/// Size and samples of a samply profile (gzipped JSON in the Firefox
/// profiler's processed format: each thread's `samples.length`). samply
/// reports no lost samples.
fn samply_facts(path: &Path) -> Result<TraceFacts, BenchError> {
    let bytes = std::fs::metadata(path)
        .map_err(|e| BenchError::io(format!("stat {}", path.display()), e))?
        .len();
    let gzipped =
        std::fs::read(path).map_err(|e| BenchError::io(format!("read {}", path.display()), e))?;
    let bad = |message: String| BenchError::BadOutput {
        tool: "samply",
        message,
    };
    let json = gunzip(&gzipped).map_err(|e| bad(e.to_string()))?;
    let profile: serde_json::Value =
        serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?;
    Ok(TraceFacts {
        bytes,
        samples: samply_samples(&profile),
        lost: 0,
        embedded_bytes: 0,
    })
}

/// `data` inflated from gzip.
pub(crate) fn gunzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(data), &mut out)?;
    Ok(out)
}

/// Samples in a processed profile, over every thread of every process.
fn samply_samples(profile: &serde_json::Value) -> u64 {
    let threads = profile["threads"].as_array().into_iter().flatten();
    let nested = profile["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(samply_samples);
    threads
        .map(|t| t["samples"]["length"].as_u64().unwrap_or(0))
        .sum::<u64>()
        + nested.sum::<u64>()
}

/// The recorder's own CPU seconds from lrnprof-rec's summary line
/// `lrnprof-rec: recorder CPU 0.650 s, ...`.
pub fn recorder_cpu(stderr: &str) -> Option<f64> {
    stderr.lines().find_map(|line| {
        let rest = line.strip_prefix("lrnprof-rec: recorder CPU ")?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Run a command that must succeed and parse its standard output as JSON.
pub(crate) fn json_of(
    cmd: &mut Command,
    tool: &'static str,
) -> Result<serde_json::Value, BenchError> {
    let text = output_of(cmd, tool)?;
    serde_json::from_str(&text).map_err(|e| BenchError::BadOutput {
        tool,
        message: e.to_string(),
    })
}

/// Run a command that must succeed and return its standard output.
pub(crate) fn output_of(cmd: &mut Command, tool: &'static str) -> Result<String, BenchError> {
    let line = command_line(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| BenchError::io(format!("run `{line}`"), e))?;
    if !out.status.success() {
        return Err(BenchError::CommandFailed {
            command: line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    String::from_utf8(out.stdout).map_err(|_| BenchError::BadOutput {
        tool,
        message: "not UTF-8".into(),
    })
}

/// Size, samples and lost samples of a perf.data file. The kernel counts a
/// dropped sample both in `LOST_SAMPLES` and in a `PERF_RECORD_LOST` record,
/// so the larger of the two totals is taken, not their sum.
pub(crate) fn perf_facts(perf: &Path, data: &Path) -> Result<TraceFacts, BenchError> {
    let bytes = file_len(data)?;
    let stats_text = output_of(
        Command::new(perf)
            .args(["report", "--stats", "-i"])
            .arg(data),
        "perf report --stats",
    )?;
    let stats = parse_perf_stats(&stats_text).ok_or_else(|| BenchError::BadOutput {
        tool: "perf report --stats",
        message: format!("no SAMPLE count for {}", data.display()),
    })?;
    let script = output_of(
        Command::new(perf)
            .args(["script", "-F", "tid", "--show-lost-events", "-i"])
            .arg(data),
        "perf script",
    )?;
    let lost_records = parse_perf_script(&script).lost_events;
    Ok(TraceFacts {
        bytes,
        samples: stats.samples,
        lost: stats.lost_samples.max(lost_records),
        embedded_bytes: 0,
    })
}

/// Size, samples and lost samples of an .lpt trace, read with the format
/// crate (independent of the analyzer).
pub(crate) fn lrnprof_facts(trace: &Path) -> Result<TraceFacts, BenchError> {
    let bad = |source| BenchError::Trace {
        path: trace.to_owned(),
        source,
    };
    let reader = TraceReader::open(trace).map_err(bad)?;
    let mut facts = TraceFacts {
        bytes: reader.len(),
        samples: 0,
        lost: 0,
        embedded_bytes: 0,
    };
    for block in reader.blocks() {
        let records = reader.decode_block(block).map_err(bad)?;
        let mut only_blobs = !records.is_empty();
        for record in &records {
            match record {
                Record::Sample(_) => facts.samples += 1,
                Record::Lost(l) => facts.lost += l.count,
                _ => {}
            }
            only_blobs &= matches!(record, Record::Blob(_));
        }
        if only_blobs {
            facts.embedded_bytes += block.header.total_len();
        }
    }
    Ok(facts)
}

fn file_len(path: &Path) -> Result<u64, BenchError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| BenchError::io(format!("stat {}", path.display()), e))
}

fn perf_completeness(o: &CompareOptions, data: &Path) -> Result<StackCompleteness, BenchError> {
    let text = output_of(
        Command::new(&o.perf)
            .args(["script", "--no-inline", "-i"])
            .arg(data),
        "perf script",
    )?;
    Ok(parse_perf_script(&text))
}

/// Stacks of an lrnprof trace judged by the rule used for perf's: folded
/// output, any frame a root function.
fn lrnprof_completeness(o: &CompareOptions, trace: &Path) -> Result<StackCompleteness, BenchError> {
    let text = output_of(
        Command::new(&o.analyze)
            .arg(trace)
            .args(["--format", "folded", "-o", "-"]),
        "lrnprof-analyze --format folded",
    )?;
    Ok(parse_folded(&text))
}

/// `unwound_to_root_pct` of `lrnprof-analyze info --json`.
fn lrnprof_root_pct(o: &CompareOptions, trace: &Path) -> Result<f64, BenchError> {
    let json = json_of(
        Command::new(&o.analyze).args(["info", "--json"]).arg(trace),
        "lrnprof-analyze info",
    )?;
    json.get("unwound_to_root_pct")
        .and_then(|v| v.as_f64())
        .ok_or_else(|| BenchError::BadOutput {
            tool: "lrnprof-analyze info",
            message: "no numeric `unwound_to_root_pct` field".into(),
        })
}

fn analyze_once(
    o: &CompareOptions,
    analysis: Analysis,
    trace: &Path,
    log: &Path,
) -> Result<Measured, BenchError> {
    let mut cmd = match analysis {
        Analysis::PerfReport => {
            let mut c = Command::new(&o.perf);
            c.args(["report", "--stdio", "-i"]).arg(trace);
            c
        }
        Analysis::LrnprofOneJob | Analysis::LrnprofAllJobs => {
            let jobs = if analysis == Analysis::LrnprofOneJob {
                "1"
            } else {
                "0"
            };
            let mut c = Command::new(&o.analyze);
            c.arg(trace)
                .args(["--format", "pprof", "--jobs", jobs, "-o"])
                .arg(trace.with_extension("pb.gz"));
            c
        }
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    measure(&mut cmd, log, o.timeout, &[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_cpu_is_read_from_the_summary() {
        let stderr = "lrnprof-rec: recorded 4.0 s (target exited): 10 samples\n\
                      lrnprof-rec: recorder CPU 0.650 s, 65000.0 µs per sample\n";
        assert_eq!(recorder_cpu(stderr), Some(0.65));
        assert_eq!(recorder_cpu("lrnprof-rec: wrote t.lpt"), None);
    }

    #[test]
    fn gzip_data_inflates_and_other_data_does_not() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"{\"threads\": []}").unwrap();
        let gzipped = gz.finish().unwrap();
        assert_eq!(gunzip(&gzipped).unwrap(), b"{\"threads\": []}");
        assert!(gunzip(b"not gzip").is_err());
    }

    #[test]
    fn samply_samples_are_counted_over_threads_and_processes() {
        let profile = serde_json::json!({
            "threads": [
                {"samples": {"length": 3}},
                {"samples": {"length": 4}},
                {"name": "no samples table"}
            ],
            "processes": [
                {"threads": [{"samples": {"length": 5}}], "processes": []}
            ]
        });
        assert_eq!(samply_samples(&profile), 12);
        assert_eq!(samply_samples(&serde_json::json!({})), 0);
    }
}
