//! Micro-benchmark of the analyzer on a real trace: unwinding and
//! symbolicating every sample of a deep-stack program, per sample.
//!
//! Setup records `benches/workloads/deep_work.c` (300 frames, ~40 KiB of
//! stack per sample) with `lrnprof-rec`, so it needs root (or a permissive
//! `perf_event_paranoid`), `cc` and a release `lrnprof-rec` next to this
//! bench binary's directory (`cargo build --release -p lrnprof-recorder`) or
//! in `LRNPROF_REC`. Without them it prints why and measures nothing.
//!
//! The analyzer's public API analyzes whole traces, so the figure is the
//! time per sample of `analyze` (decode + unwind + symbolicate each unique
//! address once + aggregate). Isolated "unwind one sample" and "symbolicate
//! one address, cold and warm" benches need the analyzer to export its
//! unwinder and symbolicator.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lrnprof_analyzer::{analyze, AnalyzeOptions, NoProgress};
use std::path::{Path, PathBuf};
use std::process::Command;

fn recorder() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LRNPROF_REC") {
        return Some(p.into());
    }
    // This bench runs from <target>/release/deps/.
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("lrnprof-rec");
    candidate.is_file().then_some(candidate)
}

/// Build the workload and record it; `Err` says why not.
fn record(dir: &Path) -> Result<PathBuf, String> {
    let rec = recorder().ok_or(
        "no lrnprof-rec next to the bench or in LRNPROF_REC: cargo build --release -p lrnprof-recorder",
    )?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/deep_work.c");
    let exe = dir.join("deep_work");
    let cc = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !cc.success() {
        return Err(format!("cc {} failed", source.display()));
    }
    let trace = dir.join("deep_work.lpt");
    let out = Command::new(&rec)
        .args(["--freq", "1000", "--out"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .arg("60000")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", rec.display()))?;
    if !out.status.success() {
        return Err(format!(
            "lrnprof-rec failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(trace)
}

fn analyze_trace(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("lrnprof-bench-analyze-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "analyze bench skipped: cannot create {}: {e}",
            dir.display()
        );
        return;
    }
    let trace = match record(&dir) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("analyze bench skipped: {e}");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    };
    let one_job = AnalyzeOptions {
        jobs: 1,
        ..AnalyzeOptions::default()
    };
    let samples = match analyze(&trace, &one_job, &NoProgress) {
        Ok(p) => p.stats.trace_samples,
        Err(e) => {
            eprintln!("analyze bench skipped: the trace does not analyze: {e}");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    };
    let mut g = c.benchmark_group("analyze_deep_work");
    g.sample_size(10);
    g.throughput(Throughput::Elements(samples));
    for (name, jobs) in [("jobs_1", 1), ("all_cores", 0)] {
        let options = AnalyzeOptions {
            jobs,
            ..AnalyzeOptions::default()
        };
        g.bench_function(name, |b| {
            b.iter(|| analyze(&trace, &options, &NoProgress).expect("analyze"))
        });
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, analyze_trace);
criterion_main!(benches);
