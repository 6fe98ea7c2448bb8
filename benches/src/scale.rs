//! The analyzer at scale: analysis speed and peak memory of one analyzer
//! binary against a baseline binary, on the same traces in the same run,
//! plus `perf report` on the same workload, and a byte-for-byte comparison
//! of both analyzers' outputs.
//!
//! Traces are recorded once per run at a high rate from workloads with a
//! fixed amount of work, at two lengths (the long one `long_factor` times
//! the work), so that "memory does not grow with the trace" can be checked.

use crate::compare::gunzip;
use crate::error::BenchError;
use crate::measure::{frame_cache_dir, measure, Measured};
use crate::stats::{median, paired, paired_ratios, Paired};
use lrnprof_format::{Record, TraceReader};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the scaling run measures and where.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// The repository root (for `benches/workloads/`).
    pub repo: PathBuf,
    /// Scratch directory for built workloads, traces and outputs.
    pub work_dir: PathBuf,
    /// The `lrnprof-rec` binary.
    pub rec: PathBuf,
    /// The analyzer under test.
    pub analyze: PathBuf,
    /// The baseline analyzer (e.g. built from an earlier commit).
    pub baseline: Option<PathBuf>,
    /// The `perf` binary (for `perf report` on the python workload).
    pub perf: PathBuf,
    /// The python interpreter of the python workload.
    pub python: PathBuf,
    /// Rounds of every measurement; figures are medians.
    pub runs: usize,
    /// Work of the long traces relative to the short ones.
    pub long_factor: u32,
    /// Units of `deep_threads` work in a short trace (about 1 ms of CPU
    /// per thread each).
    pub deep_units: u32,
    /// Rounds of `cpu_heavy.py` in a short trace.
    pub python_rounds: u32,
    /// Longest a single command may run.
    pub timeout: Duration,
}

/// One analysis setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analyzer {
    /// The baseline binary.
    Baseline,
    /// The binary under test.
    Current,
    /// `perf report --stdio` of a perf.data file of the same workload.
    PerfReport,
    /// Not an analyzer: a trivially parallel loop on `jobs` threads, whose
    /// wall-time speedup from two threads is what the machine allows in
    /// the same round for work that waits on its own results (see
    /// [`parallel_loop`]).
    ParallelLoop,
    /// Not an analyzer: the same loop keeping the multiplier busy (see
    /// [`LoopKind::Throughput`]), whose speedup is what two vCPUs gain when
    /// they share one physical core.
    ThroughputLoop,
    /// Not an analyzer: the same loop reading and writing memory at random
    /// (see [`LoopKind::Memory`]), whose speedup is what two threads gain
    /// at the moment when both wait on memory, as an analysis does.
    MemoryLoop,
}

/// The work of a reference loop's item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopKind {
    /// One chain of dependent multiplications: each waits for the one
    /// before, so a core has room for a second thread. Two vCPUs gain about
    /// 2× from it whether or not they are hyperthreads of one core.
    Latency,
    /// Eight independent chains: the multiplier is busy every cycle, so
    /// two hyperthreads of one core should gain little where two cores
    /// gain 2× (the same chains in a C program gained 1.25× at times on
    /// this project's VM, and 1.8–2.35× at others).
    Throughput,
    /// Random reads and writes over a 16 MiB buffer per thread: the two
    /// threads share the last-level cache and the memory bus (and, on a
    /// VM, the host's), as two analysis workers do. The same steps in a C
    /// program gained 1.3–1.9× from a second thread on this project's VM
    /// within minutes, where the loops above gained 2×.
    Memory,
}

impl Analyzer {
    /// The reference loop this setup runs, if it is one.
    fn loop_kind(self) -> Option<LoopKind> {
        match self {
            Analyzer::ParallelLoop => Some(LoopKind::Latency),
            Analyzer::ThroughputLoop => Some(LoopKind::Throughput),
            Analyzer::MemoryLoop => Some(LoopKind::Memory),
            _ => None,
        }
    }
}

/// Measurements of one trace under one analyzer and job count.
#[derive(Debug, Clone)]
pub struct ScaleRow {
    /// Workload and length, e.g. `deep_threads x10`.
    pub trace: String,
    /// Samples in the trace.
    pub samples: u64,
    /// Who analyzed it.
    pub analyzer: Analyzer,
    /// `--jobs`.
    pub jobs: usize,
    /// One measurement per round.
    pub runs: Vec<Measured>,
}

impl ScaleRow {
    fn median_of(&self, f: impl Fn(&Measured) -> f64) -> Option<f64> {
        median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
    /// Median CPU seconds.
    pub fn cpu_s(&self) -> Option<f64> {
        self.median_of(Measured::cpu_s)
    }
    /// Median wall seconds.
    pub fn wall_s(&self) -> Option<f64> {
        self.median_of(|m| m.wall_s)
    }
    /// Median peak resident set, MiB.
    pub fn peak_mib(&self) -> Option<f64> {
        self.median_of(|m| m.peak_rss_kib as f64 / 1024.0)
    }
    /// Samples per CPU-second (median CPU time).
    pub fn samples_per_cpu_s(&self) -> Option<f64> {
        self.cpu_s()
            .filter(|c| *c > 0.0)
            .map(|c| self.samples as f64 / c)
    }
}

impl ScaleReport {
    /// The row of `trace` analyzed by `analyzer` with `jobs` jobs.
    fn row(&self, trace: &str, analyzer: Analyzer, jobs: usize) -> Option<&ScaleRow> {
        self.rows
            .iter()
            .find(|x| x.trace == trace && x.analyzer == analyzer && x.jobs == jobs)
    }

    /// The traces, in the order of their rows.
    fn traces(&self) -> Vec<&str> {
        let mut traces: Vec<&str> = self.rows.iter().map(|x| x.trace.as_str()).collect();
        traces.dedup();
        traces
    }
}

/// Everything one scaling run found.
#[derive(Debug, Clone, Default)]
pub struct ScaleReport {
    /// One row per trace, analyzer and job count.
    pub rows: Vec<ScaleRow>,
    /// Output comparisons that differed (empty: byte-identical).
    pub differences: Vec<String>,
    /// Outputs compared.
    pub compared: usize,
    /// What could not be run, one line each.
    pub notes: Vec<String>,
}

struct Trace {
    name: String,
    path: PathBuf,
    samples: u64,
    /// perf.data of the same workload, and how many samples it holds.
    perf_data: Option<(PathBuf, u64)>,
}

/// Record the traces, then measure and compare.
pub fn run_scale(o: &ScaleOptions, progress: &mut dyn Write) -> Result<ScaleReport, BenchError> {
    std::fs::create_dir_all(&o.work_dir)
        .map_err(|e| BenchError::io(format!("create {}", o.work_dir.display()), e))?;
    let mut report = ScaleReport::default();
    let traces = record_traces(o, &mut report, progress)?;
    let log = o.work_dir.join("analyze.stderr");
    for t in &traces {
        let mut setups = vec![
            (Analyzer::ParallelLoop, 1),
            (Analyzer::ParallelLoop, 2),
            (Analyzer::ThroughputLoop, 1),
            (Analyzer::ThroughputLoop, 2),
            (Analyzer::MemoryLoop, 1),
            (Analyzer::MemoryLoop, 2),
            (Analyzer::Current, 1),
            (Analyzer::Current, 2),
        ];
        if o.baseline.is_some() {
            setups.splice(6..6, [(Analyzer::Baseline, 1), (Analyzer::Baseline, 2)]);
        }
        let mut rows: Vec<ScaleRow> = setups
            .iter()
            .map(|&(analyzer, jobs)| ScaleRow {
                trace: t.name.clone(),
                samples: t.samples,
                analyzer,
                jobs,
                runs: Vec::new(),
            })
            .collect();
        if let Some((_, perf_samples)) = &t.perf_data {
            rows.push(ScaleRow {
                trace: t.name.clone(),
                samples: *perf_samples,
                analyzer: Analyzer::PerfReport,
                jobs: 1,
                runs: Vec::new(),
            });
        }
        // Rounds interleave the setups, so that load from elsewhere hits
        // them alike, and each round starts one setup later: the first
        // analysis after the reference loops ran up to 1.9× the CPU of the
        // same binary later in the round (python x1, 2026-11-26), which
        // with a fixed order always fell on the same setup.
        let n_rows = rows.len();
        for round in 0..o.runs {
            for row in rotated(&mut rows, round % n_rows.max(1)) {
                if let Some(kind) = row.analyzer.loop_kind() {
                    let m = parallel_loop(kind, row.jobs)?;
                    let _ = writeln!(
                        progress,
                        "[{}] round {}/{} {kind:?} loop on {} threads: {:.3} s CPU, {:.3} s wall",
                        t.name,
                        round + 1,
                        o.runs,
                        row.jobs,
                        m.cpu_s(),
                        m.wall_s
                    );
                    row.runs.push(m);
                    continue;
                }
                let mut cmd = match row.analyzer {
                    Analyzer::PerfReport => {
                        let mut c = Command::new(&o.perf);
                        c.args(["report", "--stdio", "-i"])
                            .arg(&t.perf_data.as_ref().expect("perf rows have data").0);
                        c
                    }
                    a => {
                        let bin = if a == Analyzer::Baseline {
                            o.baseline.as_ref().expect("baseline rows have a binary")
                        } else {
                            &o.analyze
                        };
                        let mut c = Command::new(bin);
                        c.arg(&t.path)
                            .args(["--format", "pprof", "--jobs", &row.jobs.to_string(), "-o"])
                            .arg(o.work_dir.join("out.pb.gz"));
                        c
                    }
                };
                cmd.stdin(Stdio::null()).stdout(Stdio::null());
                // Run once untimed, then timed: an analysis right after
                // another took 0.90x the CPU of one after a two-thread
                // busy loop or after 0.3 s idle (python x1, 12 rounds
                // each), and the setups of a round follow different work.
                // A failure shows in the timed run.
                let _ = measure(&mut cmd, &log, o.timeout, &[0]);
                match measure(&mut cmd, &log, o.timeout, &[0]) {
                    Ok(m) => {
                        let _ = writeln!(
                            progress,
                            "[{}] round {}/{} {:?} jobs {}: {:.3} s CPU, {:.3} s wall, {:.1} MiB",
                            t.name,
                            round + 1,
                            o.runs,
                            row.analyzer,
                            row.jobs,
                            m.cpu_s(),
                            m.wall_s,
                            m.peak_rss_kib as f64 / 1024.0
                        );
                        row.runs.push(m);
                    }
                    Err(e) => report.notes.push(format!(
                        "{} {:?} jobs {}: {e}",
                        t.name, row.analyzer, row.jobs
                    )),
                }
            }
        }
        report.rows.extend(rows);
        if let Some(base) = &o.baseline {
            compare_outputs(o, base, t, &mut report)?;
        }
    }
    Ok(report)
}

/// The items of `rows` in order from index `start`, wrapping around.
fn rotated<T>(rows: &mut [T], start: usize) -> impl Iterator<Item = &mut T> {
    let (head, tail) = rows.split_at_mut(start.min(rows.len()));
    tail.iter_mut().chain(head.iter_mut())
}

/// The summary's ratios taken within each round, then their median: on a
/// machine whose speed drifts from round to round, a ratio of two medians
/// can hide what every round shows.
fn paired_table(s: &mut String, r: &ScaleReport) {
    let find = |trace: &str, a: Analyzer, jobs: usize| r.row(trace, a, jobs);
    // Per round: the ratio of `a`'s to `b`'s value, summed up (below 1:
    // the rounds `a` took less).
    let paired = |a: Option<&ScaleRow>,
                  b: Option<&ScaleRow>,
                  value: &dyn Fn(&ScaleRow, &Measured) -> f64|
     -> Option<Paired> {
        let values = |row: &ScaleRow| row.runs.iter().map(|m| value(row, m)).collect::<Vec<f64>>();
        paired(&paired_ratios(&values(a?), &values(b?)), 1.0)
    };
    let show = |p: Option<Paired>| {
        p.map_or("-".to_string(), |p| match p.interval {
            Some((lo, hi)) => format!("{:.2}× ({lo:.2}–{hi:.2})", p.median),
            None => format!("{:.2}×", p.median),
        })
    };
    let show_below = |p: Option<Paired>| {
        p.map_or("-".to_string(), |p| {
            format!("{:.2}× ({} of {} below 1)", p.median, p.below, p.rounds)
        })
    };
    let cpu = |_: &ScaleRow, m: &Measured| m.cpu_s();
    let wall = |_: &ScaleRow, m: &Measured| m.wall_s;
    let throughput = |row: &ScaleRow, m: &Measured| {
        let c = m.cpu_s();
        if c > 0.0 {
            row.samples as f64 / c
        } else {
            f64::NAN
        }
    };
    let _ = writeln!(
        s,
        "\nPaired by round (each ratio taken within a round, then the median; in parentheses where \
         the median lies with 95 % confidence, from 6 rounds on):\n\n| trace | CPU, current / baseline (1 job; rounds below 1) | wall, 1 job / 2 jobs (current) | the same, parallel loop | the same, throughput loop | the same, memory loop | current / perf report, samples per CPU-s |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- |");
    for t in r.traces() {
        let cur1 = find(t, Analyzer::Current, 1);
        let _ = writeln!(
            s,
            "| {t} | {} | {} | {} | {} | {} | {} |",
            show_below(paired(cur1, find(t, Analyzer::Baseline, 1), &cpu)),
            show(paired(cur1, find(t, Analyzer::Current, 2), &wall)),
            show(paired(
                find(t, Analyzer::ParallelLoop, 1),
                find(t, Analyzer::ParallelLoop, 2),
                &wall
            )),
            show(paired(
                find(t, Analyzer::ThroughputLoop, 1),
                find(t, Analyzer::ThroughputLoop, 2),
                &wall
            )),
            show(paired(
                find(t, Analyzer::MemoryLoop, 1),
                find(t, Analyzer::MemoryLoop, 2),
                &wall
            )),
            show(paired(cur1, find(t, Analyzer::PerfReport, 1), &throughput)),
        );
    }
}

/// Items of [`parallel_loop`]'s work, each about 2 ms of one core.
const LOOP_ITEMS: u64 = 200;

/// Run a trivially parallel loop (independent integer work per item, no
/// memory traffic, no shared data but a counter) on `threads` threads, each
/// taking the next item when done with one, as rayon's workers do: its wall
/// time with two threads against one is the most parallel work of `kind`
/// gains on this machine at the moment (the vCPUs' sharing, other load).
/// CPU time is this process's during the loop.
pub fn parallel_loop(kind: LoopKind, threads: usize) -> Result<Measured, BenchError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(0);
    // Each thread's buffer, written before the clock starts (its page
    // faults are no part of the loop).
    let mut buffers: Vec<Vec<u32>> = (0..threads.max(1))
        .map(|t| match kind {
            LoopKind::Memory => memory_buffer(t as u32),
            LoopKind::Latency | LoopKind::Throughput => Vec::new(),
        })
        .collect();
    let before = self_cpu();
    let start = std::time::Instant::now();
    let sum = std::thread::scope(|scope| {
        let next = &next;
        let workers: Vec<_> = buffers
            .iter_mut()
            .map(|buffer| {
                scope.spawn(move || {
                    let mut sum = 0u64;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= LOOP_ITEMS {
                            return sum;
                        }
                        sum = sum.wrapping_add(match kind {
                            LoopKind::Latency => latency_item(i),
                            LoopKind::Throughput => throughput_item(i),
                            LoopKind::Memory => memory_item(i, buffer),
                        });
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join())
            .try_fold(0u64, |acc, r| r.map(|v| acc.wrapping_add(v)))
    });
    let wall_s = start.elapsed().as_secs_f64();
    let after = self_cpu();
    let sum = sum.map_err(|_| {
        BenchError::io(
            "run the parallel loop",
            std::io::Error::other("a loop thread panicked".to_string()),
        )
    })?;
    std::hint::black_box(sum);
    Ok(Measured {
        user_s: after.0 - before.0,
        sys_s: after.1 - before.1,
        wall_s,
        peak_rss_kib: 0,
    })
}

/// One item of [`LoopKind::Latency`] work: a chain of dependent steps.
fn latency_item(i: u64) -> u64 {
    let mut x = i;
    for _ in 0..1_000_000 {
        x = lcg_step(x);
    }
    x
}

/// One item of [`LoopKind::Throughput`] work: eight independent chains,
/// on one core about 1.3 times as long as a [`latency_item`].
fn throughput_item(i: u64) -> u64 {
    let mut x: [u64; 8] = std::array::from_fn(|k| i.wrapping_add(k as u64));
    for _ in 0..400_000 {
        for v in &mut x {
            *v = lcg_step(*v);
        }
        // Keep the chains apart: vectorized, they would not be the
        // multiplier's work this loop is meant to measure.
        x = std::hint::black_box(x);
    }
    x.iter().fold(0, |a, v| a ^ v)
}

/// Words of a thread's [`LoopKind::Memory`] buffer: 16 MiB, a working set
/// past the per-core caches like an analysis worker's.
const MEMORY_WORDS: usize = 4 << 20;

/// A [`LoopKind::Memory`] buffer, every word written.
fn memory_buffer(seed: u32) -> Vec<u32> {
    (0..MEMORY_WORDS as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

/// One item of [`LoopKind::Memory`] work: walk a stretch of `buffer` in
/// order, each step also reading a word at a place the stretch's word
/// chooses and writing the stretch back, about 2 ms on one core. The
/// reads do not wait on one another (as a pointer chase would), so they
/// keep the memory bus busy: an analysis streams bytes and looks up
/// tables more than it chases pointers.
fn memory_item(i: u64, buffer: &mut [u32]) -> u64 {
    let mask = buffer.len().saturating_sub(1);
    let salt = (i as usize).wrapping_mul(0x9E37_79B9);
    let mut sum = i;
    let mut at = salt & mask;
    for _ in 0..250_000 {
        let word = buffer[at];
        let other = (word as usize ^ salt) & mask;
        sum = sum.wrapping_add(u64::from(buffer[other]));
        buffer[at] = word.wrapping_add(sum as u32);
        at = (at + 1) & mask;
    }
    sum
}

fn lcg_step(x: u64) -> u64 {
    let x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    x ^ (x >> 29)
}

/// User and system CPU seconds of this process so far.
fn self_cpu() -> (f64, f64) {
    // Safety: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // Safety: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(u.ru_utime), s(u.ru_stime))
}

fn record_traces(
    o: &ScaleOptions,
    report: &mut ScaleReport,
    progress: &mut dyn Write,
) -> Result<Vec<Trace>, BenchError> {
    let deep = o.work_dir.join("deep_threads");
    let source = o.repo.join("benches/workloads/deep_threads.c");
    let cc = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .args(["-O2", "-fomit-frame-pointer", "-g", "-pthread", "-o"])
        .arg(&deep)
        .arg(&source)
        .output()
        .map_err(|e| BenchError::io("run cc (install gcc)".to_string(), e))?;
    if !cc.status.success() {
        return Err(BenchError::CommandFailed {
            command: format!("cc {}", source.display()),
            status: cc.status.to_string(),
            stderr: String::from_utf8_lossy(&cc.stderr).into_owned(),
        });
    }
    let script = o.repo.join("benches/workloads/cpu_heavy.py");
    let mut traces = Vec::new();
    for (factor, label) in [(1, "x1"), (o.long_factor, "long")] {
        let label = if label == "long" {
            format!("x{factor}")
        } else {
            label.to_string()
        };
        let deep_argv: Vec<OsString> = vec![
            deep.clone().into(),
            (o.deep_units * factor).to_string().into(),
        ];
        let name = format!("deep_threads {label}");
        let path = o.work_dir.join(format!("deep_threads-{label}.lpt"));
        record(o, &deep_argv, 10_000, &path, progress)?;
        traces.push(Trace {
            samples: count_samples(&path)?,
            name,
            path,
            perf_data: None,
        });
        if !o.python.is_file() {
            report.notes.push(format!(
                "python workload left out: {} does not exist",
                o.python.display()
            ));
            continue;
        }
        let py_argv: Vec<OsString> = vec![
            o.python.clone().into(),
            script.clone().into(),
            (o.python_rounds * factor).to_string().into(),
        ];
        let name = format!("python3 {label}");
        let path = o.work_dir.join(format!("python3-{label}.lpt"));
        record(o, &py_argv, 4_000, &path, progress)?;
        // perf report on the short trace's workload only: it is the
        // reference, not the subject.
        let perf_data = (factor == 1)
            .then(|| perf_record(o, &py_argv, report, progress))
            .flatten();
        traces.push(Trace {
            samples: count_samples(&path)?,
            name,
            path,
            perf_data,
        });
    }
    Ok(traces)
}

fn record(
    o: &ScaleOptions,
    argv: &[OsString],
    freq: u32,
    trace: &Path,
    progress: &mut dyn Write,
) -> Result<(), BenchError> {
    let _ = writeln!(progress, "recording {} at {freq} Hz", trace.display());
    let mut c = Command::new(&o.rec);
    c.env("LRNPROF_CACHE_DIR", frame_cache_dir(&o.work_dir, false));
    c.args(["--freq", &freq.to_string(), "--out"])
        .arg(trace)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    measure(&mut c, &o.work_dir.join("rec.stderr"), o.timeout, &[0])?;
    Ok(())
}

/// `perf record --call-graph dwarf` of the workload, at 4 kHz like the
/// lrnprof trace, and its sample count; `None` (with a note) where perf
/// cannot record.
fn perf_record(
    o: &ScaleOptions,
    argv: &[OsString],
    report: &mut ScaleReport,
    progress: &mut dyn Write,
) -> Option<(PathBuf, u64)> {
    let data = o.work_dir.join("python3-x1.perf.data");
    let _ = writeln!(progress, "perf record {}", data.display());
    let mut c = Command::new(&o.perf);
    c.args(["record", "-q", "-e", "cpu-clock:u", "-F", "4000"])
        .args(["--call-graph", "dwarf", "-o"])
        .arg(&data)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Err(e) = measure(&mut c, &o.work_dir.join("perf.stderr"), o.timeout, &[0]) {
        report.notes.push(format!(
            "perf report rows left out: perf record failed: {e}"
        ));
        return None;
    }
    // One line per sample; printing only the thread id needs no unwinding.
    let samples = Command::new(&o.perf)
        .args(["script", "-F", "tid", "-i"])
        .arg(&data)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| out.stdout.iter().filter(|&&b| b == b'\n').count() as u64);
    match samples {
        Some(n) => Some((data, n)),
        None => {
            report
                .notes
                .push("perf report rows left out: perf script could not count the samples".into());
            None
        }
    }
}

fn count_samples(trace: &Path) -> Result<u64, BenchError> {
    let bad = |source| BenchError::Trace {
        path: trace.to_owned(),
        source,
    };
    let reader = TraceReader::open(trace).map_err(bad)?;
    let mut n = 0;
    for block in reader.blocks() {
        n += reader
            .decode_block(block)
            .map_err(bad)?
            .iter()
            .filter(|r| matches!(r, Record::Sample(_)))
            .count() as u64;
    }
    Ok(n)
}

/// Run both analyzers in every output format (and `info --json`), with
/// one and two jobs, and compare the bytes; pprof's after gunzip, so that
/// a baseline with another deflate implementation compares by content.
fn compare_outputs(
    o: &ScaleOptions,
    base: &Path,
    t: &Trace,
    report: &mut ScaleReport,
) -> Result<(), BenchError> {
    let out = |who: &str, what: &str| o.work_dir.join(format!("cmp-{who}.{what}"));
    let run = |bin: &Path, args: &[&str], to: &Path| -> Result<Vec<u8>, BenchError> {
        let _ = std::fs::remove_file(to);
        let status = Command::new(bin)
            .arg(&t.path)
            .args(args)
            .arg("-o")
            .arg(to)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| BenchError::io(format!("run {}", bin.display()), e))?;
        Ok(if status.success() {
            std::fs::read(to).map_err(|e| BenchError::io(format!("read {}", to.display()), e))?
        } else {
            format!("failed: {status}").into_bytes()
        })
    };
    for format in ["pprof", "folded", "speedscope", "svg", "firefox"] {
        for jobs in ["1", "2"] {
            let args = ["--format", format, "--jobs", jobs];
            let a = run(base, &args, &out("base", format))?;
            let b = run(&o.analyze, &args, &out("current", format))?;
            let (a, b) = if format == "pprof" {
                (gunzip_output(a), gunzip_output(b))
            } else {
                (a, b)
            };
            report.compared += 1;
            if a != b {
                report
                    .differences
                    .push(format!("{}: --format {format} --jobs {jobs}", t.name));
            }
        }
    }
    let info = |bin: &Path| -> Result<Vec<u8>, BenchError> {
        Command::new(bin)
            .args(["info", "--json"])
            .arg(&t.path)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map(|o| o.stdout)
            .map_err(|e| BenchError::io(format!("run {} info", bin.display()), e))
    };
    report.compared += 1;
    if info(base)? != info(&o.analyze)? {
        report.differences.push(format!("{}: info --json", t.name));
    }
    Ok(())
}

/// `data` inflated from gzip, or `data` itself where it is not gzip (a
/// failed run's message), or why it does not inflate.
fn gunzip_output(data: Vec<u8>) -> Vec<u8> {
    if !data.starts_with(&[0x1f, 0x8b]) {
        return data;
    }
    gunzip(&data).unwrap_or_else(|e| format!("gzip data that does not inflate: {e}").into_bytes())
}

/// The report as markdown tables.
pub fn scale_markdown(r: &ScaleReport, o: &ScaleOptions) -> String {
    let mut s = String::new();
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    let _ = writeln!(
        s,
        "Medians of {} rounds, setups interleaved within each round.\n",
        o.runs
    );
    let _ = writeln!(
        s,
        "| trace | samples | analyzer | jobs | CPU s | wall s | samples / CPU-s | peak RSS MiB |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    for row in &r.rows {
        let who = match row.analyzer {
            Analyzer::Baseline => "baseline",
            Analyzer::Current => "current",
            Analyzer::PerfReport => "perf report",
            Analyzer::ParallelLoop => "parallel loop",
            Analyzer::ThroughputLoop => "throughput loop",
            Analyzer::MemoryLoop => "memory loop",
        };
        let _ = writeln!(
            s,
            "| {} | {} | {who} | {} | {} | {} | {} | {} |",
            row.trace,
            row.samples,
            row.jobs,
            f(row.cpu_s(), 3),
            f(row.wall_s(), 3),
            if row.analyzer.loop_kind().is_some() {
                "-".to_string()
            } else {
                f(row.samples_per_cpu_s(), 0)
            },
            if row.analyzer.loop_kind().is_some() {
                "-".to_string()
            } else {
                f(row.peak_mib(), 1)
            }
        );
    }
    let find = |trace: &str, a: Analyzer, jobs: usize| r.row(trace, a, jobs);
    let _ = writeln!(
        s,
        "\n| trace | samples/CPU-s, current / baseline (1 job) | wall, 1 job / 2 jobs (current) | the same, parallel loop | the same, throughput loop (the machine's cap) | the same, memory loop | peak RSS MiB, current 1 job / 2 jobs | current / perf report, samples per CPU-s |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    for t in r.traces() {
        let cur1 = find(t, Analyzer::Current, 1);
        let cur2 = find(t, Analyzer::Current, 2);
        let base1 = find(t, Analyzer::Baseline, 1);
        let perf = find(t, Analyzer::PerfReport, 1);
        let loop1 = find(t, Analyzer::ParallelLoop, 1);
        let loop2 = find(t, Analyzer::ParallelLoop, 2);
        let busy1 = find(t, Analyzer::ThroughputLoop, 1);
        let busy2 = find(t, Analyzer::ThroughputLoop, 2);
        let memory1 = find(t, Analyzer::MemoryLoop, 1);
        let memory2 = find(t, Analyzer::MemoryLoop, 2);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {t} | {} | {} | {} | {} | {} | {} / {} | {} |",
            ratio(
                cur1.and_then(ScaleRow::samples_per_cpu_s),
                base1.and_then(ScaleRow::samples_per_cpu_s)
            ),
            ratio(
                cur1.and_then(ScaleRow::wall_s),
                cur2.and_then(ScaleRow::wall_s)
            ),
            ratio(
                loop1.and_then(ScaleRow::wall_s),
                loop2.and_then(ScaleRow::wall_s)
            ),
            ratio(
                busy1.and_then(ScaleRow::wall_s),
                busy2.and_then(ScaleRow::wall_s)
            ),
            ratio(
                memory1.and_then(ScaleRow::wall_s),
                memory2.and_then(ScaleRow::wall_s)
            ),
            f(cur1.and_then(ScaleRow::peak_mib), 1),
            f(cur2.and_then(ScaleRow::peak_mib), 1),
            ratio(
                cur1.and_then(ScaleRow::samples_per_cpu_s),
                perf.and_then(ScaleRow::samples_per_cpu_s)
            ),
        );
    }
    paired_table(&mut s, r);
    if o.baseline.is_some() {
        let _ = writeln!(
            s,
            "\nOutputs compared byte for byte (pprof decompressed, folded, speedscope, svg, firefox with 1 and 2 jobs, info --json): {}, {} differing{}",
            r.compared,
            r.differences.len(),
            if r.differences.is_empty() {
                String::new()
            } else {
                format!(": {}", r.differences.join("; "))
            }
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "\nNote: {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(analyzer: Analyzer, jobs: usize, samples: u64, cpu_wall: &[(f64, f64)]) -> ScaleRow {
        ScaleRow {
            trace: "t".into(),
            samples,
            analyzer,
            jobs,
            runs: cpu_wall
                .iter()
                .map(|&(cpu, wall)| Measured {
                    user_s: cpu,
                    sys_s: 0.0,
                    wall_s: wall,
                    peak_rss_kib: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn a_memory_item_reads_and_writes_its_buffer() {
        let mut a: Vec<u32> = (0..1024).collect();
        let mut b = a.clone();
        let (x, y) = (memory_item(7, &mut a), memory_item(7, &mut b));
        assert_eq!((x, &a), (y, &b), "the same work from the same start");
        assert_ne!(a, (0..1024).collect::<Vec<u32>>(), "words written");
        assert_ne!(memory_item(7, &mut a), x, "what it read changed");
        // An empty buffer is no panic (the loop never runs on one).
        let _ = memory_item(0, &mut [0]);
    }

    #[test]
    fn rounds_start_one_setup_later_each() {
        let mut v = [0, 1, 2, 3];
        let order = |v: &mut [i32], start| rotated(v, start).map(|x| *x).collect::<Vec<_>>();
        assert_eq!(order(&mut v, 0), [0, 1, 2, 3]);
        assert_eq!(order(&mut v, 1), [1, 2, 3, 0]);
        assert_eq!(order(&mut v, 3), [3, 0, 1, 2]);
        assert_eq!(order(&mut [], 0), Vec::<i32>::new());
    }

    /// Each round's ratio, then the median: a baseline that is slower in
    /// every round is shown so even when the medians of the rows are equal.
    #[test]
    fn paired_ratios_are_taken_within_rounds() {
        let r = ScaleReport {
            rows: vec![
                row(
                    Analyzer::Baseline,
                    1,
                    100,
                    &[(1.0, 1.0), (2.0, 2.0), (4.0, 4.0)],
                ),
                row(
                    Analyzer::Current,
                    1,
                    100,
                    &[(0.5, 1.0), (1.0, 1.0), (2.0, 2.0)],
                ),
                row(
                    Analyzer::Current,
                    2,
                    100,
                    &[(0.5, 0.5), (1.0, 0.5), (2.0, 1.25)],
                ),
                row(
                    Analyzer::PerfReport,
                    1,
                    10,
                    &[(2.0, 2.0), (4.0, 4.0), (8.0, 8.0)],
                ),
                row(
                    Analyzer::ThroughputLoop,
                    1,
                    0,
                    &[(1.0, 1.0), (1.0, 1.0), (1.0, 1.0)],
                ),
                row(
                    Analyzer::ThroughputLoop,
                    2,
                    0,
                    &[(1.0, 0.8), (1.0, 0.5), (1.0, 1.0)],
                ),
            ],
            ..ScaleReport::default()
        };
        let mut s = String::new();
        paired_table(&mut s, &r);
        let line = s.lines().last().unwrap();
        assert_eq!(
            line, "| t | 0.50× (3 of 3 below 1) | 2.00× | - | 1.25× | - | 40.00× |",
            "{s}"
        );
    }

    /// From six rounds on, a speedup comes with the interval its median
    /// lies in with 95 % confidence (here the smallest and largest ratio).
    #[test]
    fn six_rounds_give_the_speedup_an_interval() {
        let one: Vec<(f64, f64)> = (0..6).map(|_| (1.0, 1.0)).collect();
        let two: Vec<(f64, f64)> = [0.5, 0.55, 0.6, 0.625, 0.65, 0.8]
            .iter()
            .map(|&w| (1.0, w))
            .collect();
        let r = ScaleReport {
            rows: vec![
                row(Analyzer::Current, 1, 100, &one),
                row(Analyzer::Current, 2, 100, &two),
            ],
            ..ScaleReport::default()
        };
        let mut s = String::new();
        paired_table(&mut s, &r);
        let line = s.lines().last().unwrap();
        // Ratios 2.00, 1.82, 1.67, 1.60, 1.54, 1.25: median 1.63.
        assert_eq!(line, "| t | - | 1.63× (1.25–2.00) | - | - | - | - |", "{s}");
    }
}
