//! Micro-benchmark of the analyzer on a real trace: unwinding and
//! symbolicating every sample of a deep-stack program, per sample.
//!
//! Setup records `benches/workloads/deep_work.c` (300 frames, ~40 KiB of
//! stack per sample) with `lrnprof-rec`, so it needs root (or a permissive
//! `perf_event_paranoid`), `cc` and a release `lrnprof-rec` next to this
//! bench binary's directory (`cargo build --release -p lrnprof-recorder`) or
//! in `LRNPROF_REC`. Without them it prints why and measures nothing.
//!
//! `analyze_deep_work` times whole analyses per sample (decode + unwind +
//! symbolicate each unique address once + aggregate). `unwind_one_sample`
//! and `symbolicate_one_address` time the inner steps on the same trace
//! through the analyzer's benchmark hooks (`lrnprof_analyzer::bench`):
//! unwinding one 300-frame sample with a warm per-worker cache, and
//! looking up one address cold (the image's DWARF loaded first, as for the
//! first address of an image) and warm.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lrnprof_analyzer::bench::BenchTrace;
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
    inner_steps(c, &trace);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Unwinding one sample and symbolicating one address, cycling through the
/// trace's samples and distinct addresses.
fn inner_steps(c: &mut Criterion, trace: &Path) {
    let bench = match BenchTrace::open(trace) {
        Ok(b) if b.sample_count() > 0 && b.address_count() > 0 => b,
        Ok(_) => {
            eprintln!("inner-step benches skipped: the trace has no samples or addresses");
            return;
        }
        Err(e) => {
            eprintln!("inner-step benches skipped: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("unwind_one_sample");
    g.throughput(Throughput::Elements(1));
    let mut cache = bench.unwind_cache();
    let mut i = 0;
    g.bench_function("deep_work_300_frames", |b| {
        b.iter(|| {
            i += 1;
            bench.unwind_sample(&mut cache, i)
        })
    });
    g.finish();

    let mut g = c.benchmark_group("symbolicate_one_address");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    let mut i = 0;
    g.bench_function("cold", |b| {
        b.iter(|| {
            i += 1;
            bench.symbolicate_cold(i)
        })
    });
    g.sample_size(100);
    bench.with_warm_symbolizers(|lookup| {
        let mut i = 0;
        g.bench_function("warm", |b| {
            b.iter(|| {
                i += 1;
                lookup(i)
            })
        });
    });
    g.finish();
}

criterion_group!(benches, analyze_trace);
criterion_main!(benches);
