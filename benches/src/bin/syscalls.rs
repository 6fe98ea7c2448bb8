//! `syscalls`: lrnprof's syscall tracing side by side with strace and perf
//! trace on 400,000 `write(2)` calls.
//!
//! ```text
//! cargo build --release -p lrnprof-recorder
//! cargo run --release -p lrnprof-benches --bin syscalls [-- --runs 5 --markdown out.md]
//! ```

use clap::Parser;
use lrnprof_benches::cli::{beside_this_program, emit_markdown, repo_root};
use lrnprof_benches::{run_syscalls, syscall_markdown, SyscallBenchOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Measure what syscall tracing adds to a program's wall time: no tracer,
/// lrnprof-rec --syscalls, strace -c -f and perf trace -s, interleaved in
/// every round. Needs root (tracepoints) and tracefs mounted.
#[derive(Parser, Debug)]
#[command(name = "syscalls", version, about)]
struct Args {
    /// Rounds (figures are medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// write(2) calls per run.
    #[arg(long, default_value_t = 400_000)]
    calls: u64,
    /// The lrnprof-rec binary (default: next to this program).
    #[arg(long)]
    rec: Option<PathBuf>,
    /// The strace binary.
    #[arg(long, default_value = "/usr/bin/strace")]
    strace: PathBuf,
    /// The perf binary.
    #[arg(long, default_value = "/usr/bin/perf")]
    perf: PathBuf,
    /// Also write the markdown table to this file.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let repo = repo_root();
    let rec = args
        .rec
        .unwrap_or_else(|| beside_this_program("lrnprof-rec"));
    if !rec.exists() {
        eprintln!(
            "syscalls: {} not found: cargo build --release -p lrnprof-recorder",
            rec.display()
        );
        return ExitCode::FAILURE;
    }
    let work_dir =
        std::env::temp_dir().join(format!("lrnprof-syscall-bench-{}", std::process::id()));
    let options = SyscallBenchOptions {
        repo: repo.clone(),
        work_dir: work_dir.clone(),
        runs: args.runs,
        calls: args.calls,
        rec,
        strace: args.strace,
        perf: args.perf,
        timeout: Duration::from_secs(600),
    };
    let result = run_syscalls(&options);
    let _ = std::fs::remove_dir_all(&work_dir);
    let written =
        result.and_then(|c| emit_markdown(&syscall_markdown(&c, &repo), args.markdown.as_deref()));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("syscalls: error: {e}");
            ExitCode::FAILURE
        }
    }
}
