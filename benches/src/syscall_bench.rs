//! The syscall-tracing comparison: one program making N `write(2)` calls,
//! run without a tracer, under `lrnprof-rec --syscalls` (with and without
//! CPU samples, and with a stack at one call in 64 per thread and syscall,
//! the rest counted in the kernel), `strace -c -f`, `perf trace -s` and `perf record` of the
//! same two tracepoints without stacks (the floor of the kernel mechanism
//! lrnprof uses), every setup once per
//! round in turn, so all see the same machine load. Reports medians and
//! what each tracer adds to the program's wall time, as a ratio to what
//! strace adds.

use crate::cli::build_c_program;
use crate::error::BenchError;
use crate::measure::{frame_cache_dir, measure, Measured};
use crate::stats::median;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What the syscall comparison runs.
#[derive(Debug, Clone)]
pub struct SyscallBenchOptions {
    /// The repository root (for `benches/workloads/write_loop.c`).
    pub repo: PathBuf,
    /// Scratch directory for the workload, traces and logs.
    pub work_dir: PathBuf,
    /// Rounds; figures are medians.
    pub runs: usize,
    /// `write(2)` calls per run.
    pub calls: u64,
    /// The `lrnprof-rec` binary.
    pub rec: PathBuf,
    /// The `strace` binary (skipped when missing).
    pub strace: PathBuf,
    /// The `perf` binary (skipped when missing).
    pub perf: PathBuf,
    /// Longest a single run may take.
    pub timeout: Duration,
}

/// One tracer setup and its runs.
#[derive(Debug, Clone)]
pub struct SyscallSetup {
    /// Its name in the table.
    pub name: String,
    /// The command line, with `WORKLOAD` for the program.
    pub command: String,
    /// Every round's cost.
    pub runs: Vec<Measured>,
}

impl SyscallSetup {
    /// Median wall time, s.
    pub fn wall_s(&self) -> f64 {
        median(&self.runs.iter().map(|m| m.wall_s).collect::<Vec<_>>()).unwrap_or(0.0)
    }

    /// Median CPU time (tracer and program), s.
    pub fn cpu_s(&self) -> f64 {
        median(&self.runs.iter().map(|m| m.cpu_s()).collect::<Vec<_>>()).unwrap_or(0.0)
    }
}

/// The setups, the baseline first.
#[derive(Debug, Clone)]
pub struct SyscallComparison {
    /// `write(2)` calls per run.
    pub calls: u64,
    /// Every setup, the baseline (no tracer) first.
    pub setups: Vec<SyscallSetup>,
    /// Setups left out, and why.
    pub notes: Vec<String>,
}

/// Build the workload and run every setup `options.runs` times.
pub fn run_syscalls(options: &SyscallBenchOptions) -> Result<SyscallComparison, BenchError> {
    std::fs::create_dir_all(&options.work_dir)
        .map_err(|e| BenchError::io(format!("create {}", options.work_dir.display()), e))?;
    let exe = options.work_dir.join("write_loop");
    let source = options.repo.join("benches/workloads/write_loop.c");
    build_c_program(&source, &exe)?;
    let trace = options.work_dir.join("t.lpt");
    let calls = options.calls.to_string();
    let rec = |extra: &[&str]| {
        let mut v: Vec<String> = vec![options.rec.display().to_string(), "--out".into()];
        v.push(trace.display().to_string());
        v.extend(extra.iter().map(|s| s.to_string()));
        v.push("--".into());
        v
    };
    let mut candidates: Vec<(&str, Vec<String>)> = vec![
        ("no tracer", Vec::new()),
        (
            "lrnprof-rec --syscalls --no-cpu",
            rec(&["--syscalls", "--no-cpu"]),
        ),
        (
            "lrnprof-rec --syscalls (+ CPU samples)",
            rec(&["--syscalls"]),
        ),
        (
            "lrnprof-rec --syscalls --no-cpu --syscall-stack-every 64",
            rec(&["--syscalls", "--no-cpu", "--syscall-stack-every", "64"]),
        ),
    ];
    let mut notes = Vec::new();
    let devnull = "/dev/null".to_string();
    for (name, tool, args) in [
        ("strace -c -f", &options.strace, vec!["-c", "-f", "-o"]),
        ("perf trace -s", &options.perf, vec!["trace", "-s", "-o"]),
    ] {
        if tool.exists() {
            let mut v = vec![tool.display().to_string()];
            v.extend(args.iter().map(|s| s.to_string()));
            v.push(devnull.clone());
            v.push("--".into());
            candidates.push((name, v));
        } else {
            notes.push(format!("{name}: {} not found", tool.display()));
        }
    }
    // The floor of the mechanism lrnprof uses: the kernel writing one perf
    // sample per tracepoint hit, with no stack, registers or tool work.
    if options.perf.exists() {
        let data = options.work_dir.join("perf.data").display().to_string();
        let mut v = vec![options.perf.display().to_string()];
        v.extend(
            [
                "record",
                "-q",
                "-e",
                "raw_syscalls:sys_enter",
                "-e",
                "raw_syscalls:sys_exit",
                "-o",
            ]
            .map(String::from),
        );
        v.push(data);
        v.push("--".into());
        candidates.push(("perf record, both tracepoints, no stacks", v));
    }
    let mut setups: Vec<SyscallSetup> = candidates
        .iter()
        .map(|(name, prefix)| SyscallSetup {
            name: name.to_string(),
            command: prefix
                .iter()
                .cloned()
                .chain(["WORKLOAD".to_string(), calls.clone()])
                .collect::<Vec<_>>()
                .join(" "),
            runs: Vec::new(),
        })
        .collect();
    let log = options.work_dir.join("stderr.log");
    for _ in 0..options.runs.max(1) {
        for (setup, (_, prefix)) in setups.iter_mut().zip(&candidates) {
            let mut argv: Vec<String> = prefix.clone();
            argv.push(exe.display().to_string());
            argv.push(calls.clone());
            let mut cmd = Command::new(&argv[0]);
            cmd.env(
                "LRNPROF_CACHE_DIR",
                frame_cache_dir(&options.work_dir, false),
            );
            cmd.args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            setup
                .runs
                .push(measure(&mut cmd, &log, options.timeout, &[0])?);
        }
    }
    Ok(SyscallComparison {
        calls: options.calls,
        setups,
        notes,
    })
}

/// What `setup` adds to the baseline's median wall time, s.
fn added_wall(c: &SyscallComparison, setup: &SyscallSetup) -> f64 {
    setup.wall_s() - c.setups[0].wall_s()
}

/// The comparison as a markdown table.
pub fn syscall_markdown(c: &SyscallComparison, repo: &Path) -> String {
    let mut o = String::new();
    let strace = c.setups.iter().find(|s| s.name.starts_with("strace"));
    let _ = writeln!(
        o,
        "{} `write(2)` calls, medians of {} rounds (setups interleaved in each round).\n",
        c.calls,
        c.setups[0].runs.len()
    );
    let _ = writeln!(
        o,
        "| setup | wall s | added wall s | added / strace's added | CPU s (tracer + program) | ns added per call |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|");
    for s in &c.setups {
        let added = added_wall(c, s);
        let ratio = strace
            .map(|t| added_wall(c, t))
            .filter(|t| *t > 0.0)
            .map_or("-".to_string(), |t| format!("{:.3}", added / t));
        let _ = writeln!(
            o,
            "| {} | {:.3} | {:.3} | {} | {:.3} | {:.0} |",
            s.name,
            s.wall_s(),
            added,
            ratio,
            s.cpu_s(),
            added * 1e9 / c.calls.max(1) as f64
        );
    }
    let _ = writeln!(o);
    for s in &c.setups {
        let _ = writeln!(o, "- {}: `{}`", s.name, s.command);
    }
    for n in &c.notes {
        let _ = writeln!(o, "- left out: {n}");
    }
    let _ = writeln!(
        o,
        "\n(workload: `{}`)",
        repo.join("benches/workloads/write_loop.c").display()
    );
    o
}
