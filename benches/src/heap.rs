//! The heap comparison: an allocation-heavy program alone, under
//! `lrnprof-rec --heap` (at the default sampling rate, with and without CPU
//! sampling), under `lrnprof-rec` without `--heap` (what CPU sampling alone
//! costs), and under heaptrack, which records every allocation.
//!
//! The program (`benches/workloads/alloc_heavy.c`) prints its own CPU time
//! at exit, so the cost a profiler adds inside it is told apart from the
//! profiler's own processes (the recorder, heaptrack's interpreter), which
//! `wait4` counts too.

use crate::error::BenchError;
use crate::measure::{frame_cache_dir, measure, Measured};
use crate::stats::{median, paired_overheads};
use lrnprof_format::{Record, SampleKind, TraceReader};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the heap comparison runs and where.
#[derive(Debug, Clone)]
pub struct HeapCompareOptions {
    /// The repository root (for `benches/workloads/`).
    pub repo: PathBuf,
    /// Scratch directory for the program, traces and logs.
    pub work_dir: PathBuf,
    /// Rounds; figures are medians over them.
    pub runs: usize,
    /// Multiplies the program's work (1.0: ten million allocations).
    pub scale: f64,
    /// The `lrnprof-rec` binary.
    pub rec: PathBuf,
    /// The `heaptrack` script.
    pub heaptrack: PathBuf,
    /// Another `lrnprof-rec` whose `--heap` runs in the same rounds (a
    /// before/after comparison), if any.
    pub baseline_rec: Option<PathBuf>,
    /// CPU sampling rate of the lrnprof setups that sample the CPU, Hz.
    pub freq: u32,
    /// Longest a single command may run.
    pub timeout: Duration,
}

/// Who watches the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HeapSetup {
    /// Nobody: the baseline.
    Alone,
    /// `lrnprof-rec --heap`: allocations sampled at the default rate, and
    /// CPU samples (the default).
    LrnprofHeap,
    /// `lrnprof-rec --heap --no-cpu`: allocations only.
    LrnprofHeapOnly,
    /// `lrnprof-rec`: CPU samples only, for the share of the above that
    /// is CPU sampling.
    LrnprofCpuOnly,
    /// `heaptrack`: every allocation, unwound in the process.
    Heaptrack,
    /// `--heap` (with CPU samples) of the baseline `lrnprof-rec`.
    BaselineHeap,
}

impl HeapSetup {
    /// Every setup, in table order.
    pub const ALL: [HeapSetup; 6] = [
        HeapSetup::Alone,
        HeapSetup::BaselineHeap,
        HeapSetup::LrnprofHeap,
        HeapSetup::LrnprofHeapOnly,
        HeapSetup::LrnprofCpuOnly,
        HeapSetup::Heaptrack,
    ];

    /// The setup's name in tables.
    pub fn name(self) -> &'static str {
        match self {
            HeapSetup::Alone => "no profiler",
            HeapSetup::LrnprofHeap => "lrnprof-rec --heap",
            HeapSetup::LrnprofHeapOnly => "lrnprof-rec --heap --no-cpu",
            HeapSetup::LrnprofCpuOnly => "lrnprof-rec (CPU only)",
            HeapSetup::Heaptrack => "heaptrack",
            HeapSetup::BaselineHeap => "baseline lrnprof-rec --heap",
        }
    }
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct HeapRun {
    /// The program's own CPU time (user + system), in seconds, as it
    /// reported it.
    pub program_cpu_s: f64,
    /// The program's voluntary context switches: it never blocks by
    /// itself, so these are waits a profiler made it do.
    pub program_waits: u64,
    /// The program's involuntary context switches (preempted).
    pub program_preempted: u64,
    /// The whole command: program and profiler.
    pub measured: Measured,
    /// Bytes of the profiler's output file.
    pub output_bytes: u64,
    /// Sampled allocations in a lrnprof trace.
    pub allocation_samples: u64,
}

/// The whole heap comparison.
#[derive(Debug, Clone)]
pub struct HeapComparison {
    /// The options it ran with.
    pub options: HeapCompareOptions,
    /// Per setup, one entry per round (`None`: that run failed).
    pub runs: BTreeMap<HeapSetup, Vec<Option<HeapRun>>>,
    /// Allocations the program makes.
    pub allocations: u64,
    /// What was missing or failed, one line each.
    pub notes: Vec<String>,
}

/// The `cpu_seconds S` line the program prints to standard error.
pub fn parse_program_cpu(stderr: &str) -> Option<f64> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("cpu_seconds "))
        .and_then(|v| v.trim().parse().ok())
}

/// The `context_switches VOLUNTARY INVOLUNTARY` line the program prints to
/// standard error.
pub fn parse_program_switches(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("context_switches "))?;
    let mut words = line.split_whitespace().map(|w| w.parse().ok());
    Some((words.next()??, words.next()??))
}

/// Run the heap comparison, printing progress to `progress`.
pub fn run_heap(
    options: &HeapCompareOptions,
    progress: &mut dyn Write,
) -> Result<HeapComparison, BenchError> {
    std::fs::create_dir_all(&options.work_dir)
        .map_err(|e| BenchError::io(format!("create {}", options.work_dir.display()), e))?;
    let program = build_program(options)?;
    let rounds = ((10.0 * options.scale).round() as u64).max(1);
    let mut notes = Vec::new();
    let mut setups = vec![HeapSetup::Alone];
    if options.rec.is_file() {
        setups.extend([
            HeapSetup::LrnprofHeap,
            HeapSetup::LrnprofHeapOnly,
            HeapSetup::LrnprofCpuOnly,
        ]);
    } else {
        notes.push(format!(
            "lrnprof-rec not found at {}: build it with `cargo build --release -p \
             lrnprof-recorder`; its rows are left out",
            options.rec.display()
        ));
    }
    match &options.baseline_rec {
        Some(rec) if rec.is_file() => setups.push(HeapSetup::BaselineHeap),
        Some(rec) => notes.push(format!(
            "baseline lrnprof-rec not found at {}; its row is left out",
            rec.display()
        )),
        None => {}
    }
    if options.heaptrack.is_file() {
        setups.push(HeapSetup::Heaptrack);
    } else {
        notes.push(format!(
            "heaptrack not found at {} (Debian: apt-get install heaptrack); its row is left out",
            options.heaptrack.display()
        ));
    }
    let mut runs: BTreeMap<HeapSetup, Vec<Option<HeapRun>>> = BTreeMap::new();
    for round in 0..options.runs {
        let mut order = setups.clone();
        let n = order.len();
        order.rotate_left(round % n);
        for setup in order {
            let outcome = run_one(options, &program, rounds, setup);
            let line = match &outcome {
                Ok(r) => format!(
                    "program {:.2} s CPU ({} waits, {} preempted), all {:.2} s CPU, {:.2} s wall",
                    r.program_cpu_s,
                    r.program_waits,
                    r.program_preempted,
                    r.measured.cpu_s(),
                    r.measured.wall_s
                ),
                Err(e) => {
                    notes.push(format!("{}: {e}", setup.name()));
                    format!("failed: {e}")
                }
            };
            let _ = writeln!(
                progress,
                "[alloc_heavy] round {}/{} {}: {line}",
                round + 1,
                options.runs,
                setup.name()
            );
            runs.entry(setup).or_default().push(outcome.ok());
        }
    }
    Ok(HeapComparison {
        options: options.clone(),
        runs,
        allocations: rounds * 1_000_000,
        notes,
    })
}

fn build_program(options: &HeapCompareOptions) -> Result<PathBuf, BenchError> {
    let source = options.repo.join("benches/workloads/alloc_heavy.c");
    let exe = options.work_dir.join("alloc_heavy");
    let out = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(&source)
        .output()
        .map_err(|e| BenchError::io("run cc (install gcc or set CC)".to_string(), e))?;
    if !out.status.success() {
        return Err(BenchError::CommandFailed {
            command: format!("cc -O2 -g {}", source.display()),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(exe)
}

fn run_one(
    o: &HeapCompareOptions,
    program: &Path,
    rounds: u64,
    setup: HeapSetup,
) -> Result<HeapRun, BenchError> {
    let output = o.work_dir.join(match setup {
        HeapSetup::Alone => "none",
        HeapSetup::LrnprofHeap => "heap.lpt",
        HeapSetup::LrnprofHeapOnly => "heap-only.lpt",
        HeapSetup::LrnprofCpuOnly => "cpu-only.lpt",
        HeapSetup::Heaptrack => "heaptrack",
        HeapSetup::BaselineHeap => "baseline-heap.lpt",
    });
    let rounds = rounds.to_string();
    let freq = o.freq.to_string();
    let lrnprof_with = |rec: &Path, baseline: bool, extra: &[&str]| {
        let mut c = Command::new(rec);
        c.env("LRNPROF_CACHE_DIR", frame_cache_dir(&o.work_dir, baseline));
        c.args(extra)
            .args(["--freq", &freq, "--out"])
            .arg(&output)
            .arg("--")
            .arg(program)
            .arg(&rounds);
        c
    };
    let lrnprof = |extra: &[&str]| lrnprof_with(&o.rec, false, extra);
    let mut cmd = match setup {
        HeapSetup::Alone => {
            let mut c = Command::new(program);
            c.arg(&rounds);
            c
        }
        HeapSetup::LrnprofHeap => lrnprof(&["--heap"]),
        HeapSetup::LrnprofHeapOnly => lrnprof(&["--heap", "--no-cpu"]),
        HeapSetup::LrnprofCpuOnly => lrnprof(&[]),
        HeapSetup::BaselineHeap => {
            let rec = o.baseline_rec.as_deref().unwrap_or(&o.rec);
            lrnprof_with(rec, true, &["--heap"])
        }
        HeapSetup::Heaptrack => {
            let mut c = Command::new(&o.heaptrack);
            c.arg("-o").arg(&output).arg(program).arg(&rounds);
            c
        }
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let log = o.work_dir.join("alloc_heavy.stderr");
    let measured = measure(&mut cmd, &log, o.timeout, &[0])?;
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let program_cpu_s = parse_program_cpu(&stderr).ok_or_else(|| BenchError::BadOutput {
        tool: "alloc_heavy",
        message: "no `cpu_seconds` line on its standard error".into(),
    })?;
    let (program_waits, program_preempted) =
        parse_program_switches(&stderr).ok_or_else(|| BenchError::BadOutput {
            tool: "alloc_heavy",
            message: "no `context_switches` line on its standard error".into(),
        })?;
    let (output_bytes, allocation_samples) = match setup {
        HeapSetup::Alone => (0, 0),
        HeapSetup::Heaptrack => (heaptrack_bytes(&output), 0),
        _ => lrnprof_trace(&output)?,
    };
    Ok(HeapRun {
        program_cpu_s,
        program_waits,
        program_preempted,
        measured,
        output_bytes,
        allocation_samples,
    })
}

/// heaptrack names its file after the `-o` prefix plus a compression suffix.
fn heaptrack_bytes(prefix: &Path) -> u64 {
    let dir = prefix.parent().unwrap_or(Path::new("."));
    let name = prefix.file_name().map(|n| n.to_string_lossy().into_owned());
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            name.as_ref()
                .is_some_and(|p| n.starts_with(&format!("{p}.")))
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

/// A lrnprof trace's size and its allocation samples.
fn lrnprof_trace(path: &Path) -> Result<(u64, u64), BenchError> {
    let bad = |source| BenchError::Trace {
        path: path.to_owned(),
        source,
    };
    let reader = TraceReader::open(path).map_err(bad)?;
    let mut samples = 0;
    for block in reader.blocks() {
        for record in reader.decode_block(block).map_err(bad)? {
            if matches!(&record, Record::Sample(s) if s.kind == SampleKind::Allocation) {
                samples += 1;
            }
        }
    }
    Ok((reader.len(), samples))
}

fn column(c: &HeapComparison, setup: HeapSetup, f: impl Fn(&HeapRun) -> f64) -> Vec<f64> {
    c.runs
        .get(&setup)
        .map(|v| v.iter().map(|r| r.as_ref().map_or(f64::NAN, &f)).collect())
        .unwrap_or_default()
}

/// Median of `f` over the rounds of `setup`, relative to the baseline's in
/// the same round, as a factor (1.10: 10% more).
fn ratio(c: &HeapComparison, setup: HeapSetup, f: impl Fn(&HeapRun) -> f64 + Copy) -> Option<f64> {
    let base = column(c, HeapSetup::Alone, f);
    let other = column(c, setup, f);
    median(&paired_overheads(&base, &other)).map(|pct| 1.0 + pct / 100.0)
}

/// The heap comparison as markdown.
pub fn heap_markdown(c: &HeapComparison) -> String {
    let mut out = String::new();
    let o = &c.options;
    let _ = writeln!(
        out,
        "`alloc_heavy` ({} million allocations of 16 to 4096 bytes, 4096 live), {} rounds, \
         CPU sampling at {} Hz where on; medians, ratios paired per round with the program alone.\n",
        c.allocations / 1_000_000,
        o.runs,
        o.freq
    );
    let _ = writeln!(
        out,
        "| setup | program CPU | × alone | all CPU (program + profiler) | × alone | wall | × alone | output | allocation samples | program waits / preempted |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for setup in HeapSetup::ALL {
        if !c.runs.contains_key(&setup) {
            continue;
        }
        let m = |f: fn(&HeapRun) -> f64| median(&column(c, setup, f));
        let x = |f: fn(&HeapRun) -> f64| {
            if setup == HeapSetup::Alone {
                "1".to_string()
            } else {
                ratio(c, setup, f).map_or("—".into(), |r| format!("{r:.2}"))
            }
        };
        let secs = |v: Option<f64>| v.map_or("—".into(), |v| format!("{v:.2} s"));
        let output = m(|r| r.output_bytes as f64)
            .filter(|&b| b > 0.0)
            .map_or("—".into(), |b| {
                format!("{:.1} MiB", b / (1024.0 * 1024.0))
            });
        let samples = m(|r| r.allocation_samples as f64)
            .filter(|&n| n > 0.0)
            .map_or("—".into(), |n| format!("{n:.0}"));
        let switches = match (
            m(|r| r.program_waits as f64),
            m(|r| r.program_preempted as f64),
        ) {
            (Some(w), Some(p)) => format!("{w:.0} / {p:.0}"),
            _ => "—".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {output} | {samples} | {switches} |",
            setup.name(),
            secs(m(|r| r.program_cpu_s)),
            x(|r| r.program_cpu_s),
            secs(m(|r| r.measured.cpu_s())),
            x(|r| r.measured.cpu_s()),
            secs(m(|r| r.measured.wall_s)),
            x(|r| r.measured.wall_s),
        );
    }
    let _ = writeln!(
        out,
        "\nProgram waits and preempted: the program's voluntary and involuntary context \
         switches (medians). It never blocks by itself, so a voluntary switch is a wait a \
         profiler made it do (lrnprof's sampler sleeping on a full ring)."
    );
    for n in &c.notes {
        let _ = writeln!(out, "\nNote: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_cpu_line_is_found_among_others() {
        let stderr = "heaptrack output will be written to x\ncpu_seconds 1.250000\nbye\n";
        assert_eq!(parse_program_cpu(stderr), Some(1.25));
        assert_eq!(parse_program_cpu("nothing\n"), None);
    }

    #[test]
    fn the_programs_switches_are_found() {
        let stderr = "cpu_seconds 1.25\ncontext_switches 3 170\n";
        assert_eq!(parse_program_switches(stderr), Some((3, 170)));
        assert_eq!(parse_program_switches("context_switches 3\n"), None);
        assert_eq!(parse_program_switches("nothing\n"), None);
    }

    fn run(program: f64, all: f64) -> Option<HeapRun> {
        Some(HeapRun {
            program_cpu_s: program,
            program_waits: 1,
            program_preempted: 100,
            measured: Measured {
                user_s: all,
                sys_s: 0.0,
                wall_s: all,
                peak_rss_kib: 0,
            },
            output_bytes: 2 << 20,
            allocation_samples: 100,
        })
    }

    #[test]
    fn ratios_pair_rounds_and_the_table_has_a_row_per_setup() {
        let c = HeapComparison {
            options: HeapCompareOptions {
                repo: PathBuf::new(),
                work_dir: PathBuf::new(),
                runs: 2,
                scale: 1.0,
                rec: PathBuf::new(),
                heaptrack: PathBuf::new(),
                baseline_rec: None,
                freq: 1000,
                timeout: Duration::from_secs(1),
            },
            runs: BTreeMap::from([
                (HeapSetup::Alone, vec![run(1.0, 1.0), run(2.0, 2.0)]),
                (HeapSetup::LrnprofHeap, vec![run(1.1, 1.5), run(2.2, 3.0)]),
                (HeapSetup::Heaptrack, vec![None, run(6.0, 8.0)]),
            ]),
            allocations: 10_000_000,
            notes: vec!["heaptrack: failed once".into()],
        };
        let program = ratio(&c, HeapSetup::LrnprofHeap, |r| r.program_cpu_s).unwrap();
        assert!((program - 1.1).abs() < 1e-9, "{program}");
        assert_eq!(
            ratio(&c, HeapSetup::Heaptrack, |r| r.program_cpu_s),
            Some(3.0)
        );
        let text = heap_markdown(&c);
        assert!(
            text.contains("| lrnprof-rec --heap | 1.65 s | 1.10 |"),
            "{text}"
        );
        assert!(text.contains("| heaptrack | 6.00 s | 3.00 |"), "{text}");
        assert!(text.contains("| 100 | 1 / 100 |"), "{text}");
        assert!(!text.contains("--no-cpu"), "{text}");
        assert!(text.contains("Note: heaptrack: failed once"), "{text}");
    }
}
