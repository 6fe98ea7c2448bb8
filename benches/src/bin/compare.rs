//! `compare`: lrnprof side by side with `perf` on the same workloads.
//!
//! ```text
//! cargo build --release -p lrnprof-recorder -p lrnprof-analyzer
//! cargo run --release -p lrnprof-benches --bin compare [-- --runs 5 --scale 4 --markdown out.md]
//! cargo run --release -p lrnprof-benches --bin compare -- --heap   # vs heaptrack
//! ```

use anyhow::Context as _;
use clap::Parser;
use lrnprof_benches::{heap_markdown, markdown, run_heap, CompareOptions, HeapCompareOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Measure lrnprof against `perf record` / `perf report`: CPU overhead, trace
/// bytes per sample, lost samples, unwind completeness, analysis cost and
/// peak memory, as medians of several rounds. Needs root (or a permissive
/// perf_event_paranoid). Takes a few minutes with the defaults.
#[derive(Parser, Debug)]
#[command(name = "compare", version, about)]
struct Args {
    /// Rounds of every measurement (figures are medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Multiply each workload's work (1 is about 1.5 CPU-seconds each).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Longer, steadier run: 5 rounds of 4 times the work (overrides --runs and --scale).
    #[arg(long)]
    long: bool,
    /// The usual sampling rate, Hz.
    #[arg(long, default_value_t = 1000)]
    freq: u32,
    /// The high sampling rate for lost samples, Hz.
    #[arg(long, default_value_t = 10000)]
    high_freq: u32,
    /// Only this workload (repeatable): rec_deep, rec_threads, deep_work, python3, xz.
    #[arg(long = "workload", value_name = "NAME")]
    only: Vec<String>,
    /// The perf binary.
    #[arg(long, default_value = "/usr/bin/perf")]
    perf: PathBuf,
    /// The lrnprof-rec binary (default: next to this program).
    #[arg(long)]
    rec: Option<PathBuf>,
    /// The lrnprof-analyze binary (default: next to this program).
    #[arg(long)]
    analyze: Option<PathBuf>,
    /// Also measure samply (`cargo install samply --locked`; it needs
    /// /proc/sys/kernel/perf_event_paranoid at 1 or lower): its binary.
    #[arg(long, value_name = "SAMPLY")]
    samply: Option<PathBuf>,
    /// Another lrnprof-rec (say, built from an earlier commit) measured in
    /// the same rounds with its defaults, for a before/after comparison.
    #[arg(long, value_name = "REC")]
    baseline: Option<PathBuf>,
    /// Scratch directory for workloads and traces (default: a new one under the temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Also write the markdown tables to this file.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Keep the scratch directory (traces, logs) instead of deleting it.
    #[arg(long)]
    keep: bool,
    /// Run the heap comparison instead: an allocation-heavy program alone,
    /// under lrnprof-rec --heap and under heaptrack.
    #[arg(long)]
    heap: bool,
    /// The heaptrack script (for --heap).
    #[arg(long, default_value = "/usr/bin/heaptrack")]
    heaptrack: PathBuf,
    /// Another lrnprof-rec (say, built from an earlier commit) whose --heap
    /// runs in the same rounds, for a before/after comparison (for --heap).
    #[arg(long, value_name = "REC")]
    heap_baseline: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compare: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(args.scale > 0.0, "--scale must be positive");
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
        std::env::temp_dir().join(format!("lrnprof-compare-{}", std::process::id()))
    });
    let (runs, scale) = if args.long {
        (5, 4.0)
    } else {
        (args.runs, args.scale)
    };
    let rec = args.rec.unwrap_or_else(|| exe_dir.join("lrnprof-rec"));
    if args.heap {
        let options = HeapCompareOptions {
            repo,
            work_dir: work_dir.clone(),
            runs,
            scale,
            rec,
            heaptrack: args.heaptrack,
            baseline_rec: args.heap_baseline,
            freq: args.freq,
            timeout: Duration::from_secs(600),
        };
        let comparison = run_heap(&options, &mut std::io::stderr())?;
        let text = heap_markdown(&comparison);
        println!("{text}");
        if let Some(path) = &args.markdown {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
        }
        if args.work_dir.is_none() && !args.keep {
            let _ = std::fs::remove_dir_all(&work_dir);
        }
        return Ok(());
    }
    let options = CompareOptions {
        repo,
        work_dir: work_dir.clone(),
        runs,
        scale,
        perf: args.perf,
        rec,
        analyze: args
            .analyze
            .unwrap_or_else(|| exe_dir.join("lrnprof-analyze")),
        samply: args.samply,
        baseline: args.baseline,
        freq: args.freq,
        high_freq: args.high_freq,
        only: args.only,
        timeout: Duration::from_secs(600),
    };
    let comparison = lrnprof_benches::run(&options, &mut std::io::stderr())?;
    let text = markdown(&comparison);
    println!("{text}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.keep {
        eprintln!("compare: traces and logs kept in {}", work_dir.display());
    } else if args.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    Ok(())
}
