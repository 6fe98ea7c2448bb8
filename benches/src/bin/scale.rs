//! `scale`: the analyzer's speed and peak memory against a baseline
//! analyzer binary, on traces of two lengths recorded in the same run, and
//! `perf report` on the same python workload.
//!
//! ```text
//! cargo build --release -p lrnprof-recorder -p lrnprof-analyzer
//! cargo run --release -p lrnprof-benches --bin scale -- --baseline /path/to/old/lrnprof-analyze
//! ```

use anyhow::Context as _;
use clap::Parser;
use lrnprof_benches::{run_scale, scale_markdown, ScaleOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Measure lrnprof-analyze at scale: samples per CPU-second, wall time with
/// one and two jobs, peak memory for a short and a long trace, against a
/// baseline binary and perf report, and compare outputs byte for byte.
#[derive(Parser, Debug)]
#[command(name = "scale", version, about)]
struct Args {
    /// A baseline lrnprof-analyze (e.g. built from an earlier commit).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Rounds of every measurement (figures are medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Work of the long traces relative to the short ones.
    #[arg(long, default_value_t = 10)]
    long_factor: u32,
    /// deep_threads units in a short trace (about 1 ms of CPU per thread each).
    #[arg(long, default_value_t = 1000)]
    deep_units: u32,
    /// cpu_heavy.py rounds in a short trace.
    #[arg(long, default_value_t = 1500)]
    python_rounds: u32,
    /// The python interpreter of the python workload.
    #[arg(long, default_value = "/usr/bin/python3")]
    python: PathBuf,
    /// The perf binary.
    #[arg(long, default_value = "/usr/bin/perf")]
    perf: PathBuf,
    /// The lrnprof-rec binary (default: next to this program).
    #[arg(long)]
    rec: Option<PathBuf>,
    /// The lrnprof-analyze under test (default: next to this program).
    #[arg(long)]
    analyze: Option<PathBuf>,
    /// Scratch directory (default: a new one under the temp dir, removed after).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Also write the markdown tables to this file.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("scale: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `Ok(false)` when outputs differed from the baseline's.
fn run(args: Args) -> anyhow::Result<bool> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    let exe_dir = std::env::current_exe()
        .context("locating this program")?
        .parent()
        .context("this program has no directory")?
        .to_owned();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("benches/ has no parent")?
        .to_owned();
    let work_dir = args.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("lrnprof-scale-{}", std::process::id()))
    });
    let options = ScaleOptions {
        repo,
        work_dir: work_dir.clone(),
        rec: args.rec.unwrap_or_else(|| exe_dir.join("lrnprof-rec")),
        analyze: args
            .analyze
            .unwrap_or_else(|| exe_dir.join("lrnprof-analyze")),
        baseline: args.baseline,
        perf: args.perf,
        python: args.python,
        runs: args.runs,
        long_factor: args.long_factor.max(1),
        deep_units: args.deep_units,
        python_rounds: args.python_rounds,
        timeout: Duration::from_secs(1800),
    };
    let report = run_scale(&options, &mut std::io::stderr())?;
    let text = scale_markdown(&report, &options);
    println!("{text}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    Ok(report.differences.is_empty())
}
