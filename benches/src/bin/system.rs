//! `system`: lrnprof's system-wide recording side by side with
//! `perf record -a`, on two busy programs and 200 short-lived ones.
//!
//! ```text
//! cargo build --release -p lrnprof-recorder -p lrnprof-analyzer
//! cargo run --release -p lrnprof-benches --bin system [-- --runs 5 --markdown out.md]
//! ```

use clap::Parser;
use lrnprof_benches::cli::{beside_this_program, emit_markdown, repo_root};
use lrnprof_benches::{run_system, system_markdown, SystemBenchOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Measure what recording the whole machine costs two busy programs
/// (lrnprof-rec --all, perf record -a -g, perf record -a --call-graph
/// dwarf; interleaved in every round), and how many short-lived processes
/// the profile names. Needs root (or perf_event_paranoid -1).
#[derive(Parser, Debug)]
#[command(name = "system", version, about)]
struct Args {
    /// Rounds (figures are medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Multiplies the programs' work (1.0: about 1.5 CPU-seconds each).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Sampling rate per CPU, Hz.
    #[arg(long, default_value_t = 1000)]
    freq: u32,
    /// Short-lived programs to start (0: no short-lived phase).
    #[arg(long, default_value_t = 200)]
    short_programs: usize,
    /// CPU time each short-lived program burns, ms.
    #[arg(long, default_value_t = 5)]
    short_ms: u32,
    /// The lrnprof-rec binary (default: next to this program).
    #[arg(long)]
    rec: Option<PathBuf>,
    /// Another lrnprof-rec (e.g. built from an earlier commit), measured in
    /// the same rounds as a setup of its own.
    #[arg(long, value_name = "REC")]
    baseline: Option<PathBuf>,
    /// Leave out `perf record -a --call-graph dwarf`.
    #[arg(long)]
    no_perf_dwarf: bool,
    /// Leave out `lrnprof-rec --all --no-cache` (every round resolving all
    /// of its frames; the `lrnprof-rec --all` setup keeps a frame cache
    /// from round to round).
    #[arg(long)]
    no_cache_setup: bool,
    /// The lrnprof-analyze binary (default: next to this program).
    #[arg(long)]
    analyze: Option<PathBuf>,
    /// The perf binary.
    #[arg(long, default_value = "/usr/bin/perf")]
    perf: PathBuf,
    /// Also write the markdown to this file.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rec = args
        .rec
        .unwrap_or_else(|| beside_this_program("lrnprof-rec"));
    let analyze = args
        .analyze
        .unwrap_or_else(|| beside_this_program("lrnprof-analyze"));
    for (tool, package) in [(&rec, "lrnprof-recorder"), (&analyze, "lrnprof-analyzer")] {
        if !tool.exists() {
            eprintln!(
                "system: {} not found: cargo build --release -p {package}",
                tool.display()
            );
            return ExitCode::FAILURE;
        }
    }
    let work_dir =
        std::env::temp_dir().join(format!("lrnprof-system-bench-{}", std::process::id()));
    let options = SystemBenchOptions {
        repo: repo_root(),
        work_dir: work_dir.clone(),
        runs: args.runs,
        scale: args.scale,
        freq: args.freq,
        rec,
        baseline_rec: args.baseline,
        skip_perf_dwarf: args.no_perf_dwarf,
        skip_no_cache: args.no_cache_setup,
        analyze,
        perf: args.perf,
        short_programs: args.short_programs,
        short_ms: args.short_ms,
        timeout: Duration::from_secs(600),
    };
    let result = run_system(&options);
    let _ = std::fs::remove_dir_all(&work_dir);
    match result.and_then(|c| emit_markdown(&system_markdown(&c), args.markdown.as_deref())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("system: error: {e}");
            ExitCode::FAILURE
        }
    }
}
