//! The system-wide comparison: what recording the whole machine costs two
//! busy, unrelated programs, with `lrnprof-rec --all` against
//! `perf record -a -g` (frame pointers) and `perf record -a --call-graph
//! dwarf` (stack copies, like lrnprof), and whether short-lived processes
//! are named in the profile.
//!
//! Each round runs the two fixed-work programs side by side (`deep_work`,
//! C with 40 KiB deep stacks and no frame pointers, and `python3` running
//! `cpu_heavy.py`) with no profiler, then under each profiler in turn, so
//! every setup sees the same machine load. A profiler is started first and
//! the programs only once it records (perf: started with its events
//! disabled and enabled through its control FIFO, which acknowledges;
//! lrnprof: once its trace holds a sample), and it is stopped with SIGINT
//! once both programs exited. The programs' CPU time and the profiler's
//! own (from `wait4`, including what it does before and after, such as
//! perf's build-id pass and lrnprof's embedding) are reported separately
//! and together, as overhead over the programs alone in the same round.
//!
//! Then, once per profiler, a shell loop starts 200 short programs (each
//! burns 5 ms of CPU under its own name, `sl-001` ... `sl-200`) while the
//! profiler records, and the profile's process names are counted.

use crate::cli::build_c_program;
use crate::compare::{json_of, lrnprof_facts, output_of, perf_facts, TraceFacts};
use crate::error::BenchError;
use crate::measure::{command_line, frame_cache_dir, measure, wait_measured, Measured};
use crate::stats::{median, paired, paired_overheads, Paired};
use crate::workloads::{prepare, Workload};
use lrnprof_format::{Record, TraceReader};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What the system-wide comparison runs and where.
#[derive(Debug, Clone)]
pub struct SystemBenchOptions {
    /// The repository root (for `benches/workloads/` and the fixtures).
    pub repo: PathBuf,
    /// Scratch directory for programs, traces and logs.
    pub work_dir: PathBuf,
    /// Rounds; figures are medians over them.
    pub runs: usize,
    /// Multiplies the programs' work (1.0: about 1.5 CPU-seconds each).
    pub scale: f64,
    /// Sampling rate per CPU, Hz.
    pub freq: u32,
    /// The `lrnprof-rec` binary.
    pub rec: PathBuf,
    /// Another `lrnprof-rec` (e.g. built from an earlier commit), measured
    /// in the same rounds.
    pub baseline_rec: Option<PathBuf>,
    /// Leave out `perf record -a --call-graph dwarf` (the slowest setup).
    pub skip_perf_dwarf: bool,
    /// Leave out `lrnprof-rec --all --no-cache`.
    pub skip_no_cache: bool,
    /// The `lrnprof-analyze` binary.
    pub analyze: PathBuf,
    /// The `perf` binary.
    pub perf: PathBuf,
    /// Short-lived programs started in the short-lived phase.
    pub short_programs: usize,
    /// CPU time each short-lived program burns, ms.
    pub short_ms: u32,
    /// Longest a single command may run, and a profiler may take to start.
    pub timeout: Duration,
}

/// Who records the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemSetup {
    /// Nobody: the baseline.
    Alone,
    /// `perf record -a -g`: kernel frame-pointer callchains, no stack copies.
    PerfFp,
    /// `perf record -a --call-graph dwarf`: 8 KiB stack copies.
    PerfDwarf,
    /// `lrnprof-rec --all`: registers and stack copies (64 KiB by default),
    /// with a frame cache of the benchmark's own, empty before the first
    /// round (so later rounds find what earlier ones resolved, as repeated
    /// recordings on one machine do).
    Lrnprof,
    /// `lrnprof-rec --all --no-cache`: every round resolves all of its
    /// frames, as a first recording on a machine does.
    LrnprofNoCache,
    /// `lrnprof-rec --all` of the baseline binary.
    BaselineLrnprof,
}

impl SystemSetup {
    /// Whether it records with `lrnprof-rec`.
    fn is_lrnprof(self) -> bool {
        matches!(
            self,
            SystemSetup::Lrnprof | SystemSetup::LrnprofNoCache | SystemSetup::BaselineLrnprof
        )
    }

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            SystemSetup::Alone => "no profiler",
            SystemSetup::PerfFp => "perf record -a -g",
            SystemSetup::PerfDwarf => "perf record -a --call-graph dwarf",
            SystemSetup::Lrnprof => "lrnprof-rec --all",
            SystemSetup::LrnprofNoCache => "lrnprof-rec --all --no-cache",
            SystemSetup::BaselineLrnprof => "baseline lrnprof-rec --all",
        }
    }
}

/// One round of one setup.
#[derive(Debug, Clone)]
pub struct SystemRound {
    /// CPU time of the two programs together, s.
    pub programs_cpu_s: f64,
    /// Wall time until both programs exited, s.
    pub programs_wall_s: f64,
    /// The profiler's own cost, from start to exit.
    pub profiler: Option<Measured>,
    /// Size, samples and lost samples of what it wrote.
    pub facts: Option<TraceFacts>,
}

/// A setup and its rounds.
#[derive(Debug, Clone)]
pub struct SystemSetupRuns {
    /// Which.
    pub setup: SystemSetup,
    /// The profiler's command line (empty for the baseline).
    pub command: String,
    /// One per round.
    pub rounds: Vec<SystemRound>,
}

impl SystemSetupRuns {
    /// Median of `f` over the rounds.
    fn median_of(&self, f: impl Fn(&SystemRound) -> Option<f64>) -> Option<f64> {
        median(&self.rounds.iter().filter_map(f).collect::<Vec<_>>())
    }
}

/// What one profiler made of the short-lived programs.
#[derive(Debug, Clone)]
pub struct ShortLived {
    /// Which profiler.
    pub setup: SystemSetup,
    /// Programs started.
    pub started: usize,
    /// Of them, named in the profile (with at least one sample).
    pub named: usize,
    /// Of the named, those with their command line (lrnprof only).
    pub with_command: Option<usize>,
    /// Samples lost in that recording.
    pub lost: u64,
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct SystemComparison {
    /// Sampling rate per CPU, Hz.
    pub freq: u32,
    /// The two programs: name and what it is.
    pub programs: Vec<(String, String)>,
    /// Every setup, the baseline first.
    pub setups: Vec<SystemSetupRuns>,
    /// The short-lived phase, per profiler.
    pub short: Vec<ShortLived>,
    /// Setups left out, and why.
    pub notes: Vec<String>,
}

/// A profiler that records while the programs run.
struct Running {
    child: Child,
    line: String,
    start: Instant,
    log: PathBuf,
}

/// Build the programs and run every setup `options.runs` times, then the
/// short-lived phase.
pub fn run_system(o: &SystemBenchOptions) -> Result<SystemComparison, BenchError> {
    std::fs::create_dir_all(&o.work_dir)
        .map_err(|e| BenchError::io(format!("create {}", o.work_dir.display()), e))?;
    let (workloads, mut notes) = prepare(&o.repo, &o.work_dir, o.scale)?;
    let programs: Vec<Workload> = ["deep_work", "python3"]
        .iter()
        .filter_map(|n| workloads.iter().find(|w| w.name == *n).cloned())
        .collect();
    if programs.len() != 2 {
        return Err(BenchError::ToolMissing {
            tool: "deep_work and python3",
            path: o.work_dir.clone(),
            hint: "needs cc and /usr/bin/python3 (apt-get install gcc python3)",
        });
    }
    let short_dir = build_short_programs(o)?;
    let mut setups = vec![SystemSetup::Alone];
    if o.perf.exists() {
        setups.push(SystemSetup::PerfFp);
        if !o.skip_perf_dwarf {
            setups.push(SystemSetup::PerfDwarf);
        }
    } else {
        notes.push(format!("perf: {} not found", o.perf.display()));
    }
    setups.push(SystemSetup::Lrnprof);
    if !o.skip_no_cache {
        setups.push(SystemSetup::LrnprofNoCache);
    }
    match &o.baseline_rec {
        Some(rec) if rec.exists() => setups.push(SystemSetup::BaselineLrnprof),
        Some(rec) => notes.push(format!("baseline lrnprof-rec: {} not found", rec.display())),
        None => {}
    }
    let mut results: Vec<SystemSetupRuns> = setups
        .iter()
        .map(|&setup| SystemSetupRuns {
            setup,
            command: profiler_command(o, setup, &output_path(o, setup))
                .map(|c| command_line(&c))
                .unwrap_or_default(),
            rounds: Vec::new(),
        })
        .collect();
    for _ in 0..o.runs.max(1) {
        for r in &mut results {
            r.rounds.push(round(o, r.setup, &programs)?);
        }
    }
    let mut short = Vec::new();
    for setup in [SystemSetup::PerfFp, SystemSetup::Lrnprof] {
        if o.short_programs > 0 && setups.contains(&setup) {
            short.push(short_lived(o, setup, &short_dir)?);
        }
    }
    Ok(SystemComparison {
        freq: o.freq,
        programs: programs
            .iter()
            .map(|w| (w.name.clone(), w.what.clone()))
            .collect(),
        setups: results,
        short,
        notes,
    })
}

/// Where a setup writes.
fn output_path(o: &SystemBenchOptions, setup: SystemSetup) -> PathBuf {
    match setup {
        s if s.is_lrnprof() => o.work_dir.join("all.lpt"),
        _ => o.work_dir.join("perf.data"),
    }
}

/// The profiler's command, writing to `out`; `None` for the baseline.
fn profiler_command(o: &SystemBenchOptions, setup: SystemSetup, out: &Path) -> Option<Command> {
    let freq = o.freq.to_string();
    let mut c = match setup {
        SystemSetup::Alone => return None,
        SystemSetup::PerfFp | SystemSetup::PerfDwarf => {
            let mut c = Command::new(&o.perf);
            c.args(["record", "-q", "-a", "-F", &freq]);
            c.args(if setup == SystemSetup::PerfFp {
                &["-g"][..]
            } else {
                &["--call-graph", "dwarf"][..]
            });
            // Events start disabled and are enabled through the control
            // FIFO, which acknowledges: recording has begun.
            c.args(["-D", "-1", "--control"]);
            c.arg(format!(
                "fifo:{},{}",
                o.work_dir.join("ctl.fifo").display(),
                o.work_dir.join("ack.fifo").display()
            ));
            c.arg("-o");
            c
        }
        SystemSetup::Lrnprof | SystemSetup::LrnprofNoCache | SystemSetup::BaselineLrnprof => {
            let rec = match setup {
                SystemSetup::BaselineLrnprof => o.baseline_rec.as_ref()?,
                _ => &o.rec,
            };
            let mut c = Command::new(rec);
            // Through the environment: a baseline built before the cache
            // existed ignores it.
            let baseline = setup == SystemSetup::BaselineLrnprof;
            c.env("LRNPROF_CACHE_DIR", frame_cache_dir(&o.work_dir, baseline));
            c.args(["--all", "-F", &freq]);
            if setup == SystemSetup::LrnprofNoCache {
                c.arg("--no-cache");
            }
            c.arg("--out");
            c
        }
    };
    c.arg(out);
    Some(c)
}

/// One round of `setup`: start the profiler, run both programs side by
/// side, stop the profiler.
fn round(
    o: &SystemBenchOptions,
    setup: SystemSetup,
    programs: &[Workload],
) -> Result<SystemRound, BenchError> {
    let out = output_path(o, setup);
    let _ = std::fs::remove_file(&out);
    let running = start_profiler(o, setup, &out)?;
    let ran = run_programs(o, programs);
    let profiler = match running {
        Some(r) => Some(stop_profiler(o, r)?),
        None => None,
    };
    let ran = ran?;
    let facts = match setup {
        SystemSetup::Alone => None,
        s if s.is_lrnprof() => Some(lrnprof_facts(&out)?),
        _ => Some(perf_facts(&o.perf, &out)?),
    };
    Ok(SystemRound {
        programs_cpu_s: ran.iter().map(Measured::cpu_s).sum(),
        programs_wall_s: ran.iter().map(|m| m.wall_s).fold(0.0, f64::max),
        profiler,
        facts,
    })
}

/// Both programs at once, each measured.
fn run_programs(
    o: &SystemBenchOptions,
    programs: &[Workload],
) -> Result<Vec<Measured>, BenchError> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = programs
            .iter()
            .map(|w| {
                let log = o.work_dir.join(format!("{}.stderr", w.name));
                scope.spawn(move || {
                    let mut c = w.command();
                    c.stdin(Stdio::null()).stdout(Stdio::null());
                    measure(&mut c, &log, o.timeout, &w.ok_exit_codes)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(BenchError::Internal("a program's thread panicked")))
            })
            .collect()
    })
}

/// Start `setup`'s profiler writing to `out` and return once it records;
/// `None` for the baseline.
fn start_profiler(
    o: &SystemBenchOptions,
    setup: SystemSetup,
    out: &Path,
) -> Result<Option<Running>, BenchError> {
    let Some(mut cmd) = profiler_command(o, setup, out) else {
        return Ok(None);
    };
    let line = command_line(&cmd);
    let log = o.work_dir.join("profiler.stderr");
    let stderr =
        File::create(&log).map_err(|e| BenchError::io(format!("create {}", log.display()), e))?;
    // perf's FIFOs, opened here read-write first: neither side's open then
    // waits for the other.
    let fifos = match setup {
        SystemSetup::PerfFp | SystemSetup::PerfDwarf => Some(control_fifos(o)?),
        _ => None,
    };
    let start = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| BenchError::io(format!("start `{line}`"), e))?;
    let mut running = Running {
        child,
        line,
        start,
        log,
    };
    let ready = match fifos {
        Some((mut ctl, mut ack)) => ctl
            .write_all(b"enable\n")
            .map_err(|e| BenchError::io("write to perf's control FIFO", e))
            .and_then(|()| {
                let mut said = Vec::new();
                wait_while_running(o, &mut running, "perf's ack", || {
                    let mut buf = [0u8; 64];
                    if let Ok(n) = ack.read(&mut buf) {
                        said.extend_from_slice(&buf[..n]);
                    }
                    String::from_utf8_lossy(&said).contains("ack")
                })
            }),
        None => {
            // Something to sample until the trace shows the events are on.
            let probe = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()
                .map_err(|e| BenchError::io("start a busy loop", e));
            probe.and_then(|mut probe| {
                let ready = wait_while_running(o, &mut running, "a sample in the trace", || {
                    TraceReader::open(out).is_ok_and(|r| {
                        r.records()
                            .flatten()
                            .any(|r| matches!(r, Record::Sample(_)))
                    })
                });
                let _ = probe.kill();
                let _ = probe.wait();
                ready
            })
        }
    };
    if let Err(e) = ready {
        let _ = running.child.kill();
        let _ = running.child.wait();
        return Err(e);
    }
    Ok(Some(running))
}

/// Make perf's control and acknowledgement FIFOs and open both
/// read-write, non-blocking.
fn control_fifos(o: &SystemBenchOptions) -> Result<(File, File), BenchError> {
    let mut opened = Vec::new();
    for name in ["ctl.fifo", "ack.fifo"] {
        let path = o.work_dir.join(name);
        let _ = std::fs::remove_file(&path);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| BenchError::Internal("a FIFO path holds a NUL byte"))?;
        // Safety: c_path is a valid NUL-terminated string.
        if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(BenchError::io(format!("mkfifo {}", path.display()), e));
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| BenchError::io(format!("open {}", path.display()), e))?;
        opened.push(f);
    }
    let ack = opened.pop().expect("two FIFOs");
    let ctl = opened.pop().expect("two FIFOs");
    Ok((ctl, ack))
}

/// Poll `done` every 10 ms until it holds; fails if the profiler exits
/// first or `o.timeout` passes.
fn wait_while_running(
    o: &SystemBenchOptions,
    running: &mut Running,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + o.timeout;
    loop {
        if done() {
            return Ok(());
        }
        let exited = running
            .child
            .try_wait()
            .map_err(|e| BenchError::io(format!("wait for `{}`", running.line), e))?;
        if exited.is_some() || Instant::now() > deadline {
            return Err(BenchError::CommandFailed {
                command: running.line.clone(),
                status: match exited {
                    Some(s) => format!("{s} before {what}"),
                    None => format!("no {what} after {} s", o.timeout.as_secs()),
                },
                stderr: std::fs::read_to_string(&running.log).unwrap_or_default(),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stop the profiler with SIGINT, as Ctrl-C would, and measure it. perf
/// writes its data and then dies of the signal it got, as a shell expects.
fn stop_profiler(o: &SystemBenchOptions, r: Running) -> Result<Measured, BenchError> {
    // Safety: kill sends a signal to our child, which has not been reaped.
    unsafe { libc::kill(r.child.id() as libc::pid_t, libc::SIGINT) };
    let ok = |s: ExitStatus| s.code() == Some(0) || s.signal() == Some(libc::SIGINT);
    wait_measured(r.child, &r.line, r.start, &r.log, o.timeout, &ok)
}

/// Build `short_burn` and link it under `o.short_programs` names.
fn build_short_programs(o: &SystemBenchOptions) -> Result<PathBuf, BenchError> {
    let exe = o.work_dir.join("short_burn");
    build_c_program(&o.repo.join("benches/workloads/short_burn.c"), &exe)?;
    let dir = o.work_dir.join("short");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| BenchError::io(format!("create {}", dir.display()), e))?;
    for i in 1..=o.short_programs {
        let link = dir.join(short_name(i));
        std::fs::hard_link(&exe, &link)
            .map_err(|e| BenchError::io(format!("link {}", link.display()), e))?;
    }
    Ok(dir)
}

/// The name of short-lived program `i`.
fn short_name(i: usize) -> String {
    format!("sl-{i:03}")
}

/// Record while a shell loop runs every short-lived program once, and
/// count the names in the profile.
fn short_lived(
    o: &SystemBenchOptions,
    setup: SystemSetup,
    dir: &Path,
) -> Result<ShortLived, BenchError> {
    let out = output_path(o, setup);
    let _ = std::fs::remove_file(&out);
    let running = start_profiler(o, setup, &out)?.ok_or(BenchError::Internal(
        "the short-lived phase needs a profiler",
    ))?;
    let ms = o.short_ms.to_string();
    let script = format!("for f in {}/sl-*; do \"$f\" {ms}; done", dir.display());
    let log = o.work_dir.join("short.stderr");
    let ran = measure(
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null()),
        &log,
        o.timeout,
        &[0],
    );
    stop_profiler(o, running)?;
    ran?;
    let expected: BTreeSet<String> = (1..=o.short_programs).map(short_name).collect();
    match setup {
        SystemSetup::Lrnprof => {
            let info = json_of(
                Command::new(&o.analyze).args(["info", "--json"]).arg(&out),
                "lrnprof-analyze info --json",
            )?;
            let named: Vec<&serde_json::Value> = info["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["samples"].as_u64().is_some_and(|n| n > 0))
                .filter(|p| p["name"].as_str().is_some_and(|n| expected.contains(n)))
                .collect();
            let names: BTreeSet<&str> = named.iter().filter_map(|p| p["name"].as_str()).collect();
            let with_command = named
                .iter()
                .filter(|p| p["command"].as_array().is_some_and(|c| !c.is_empty()))
                .count();
            Ok(ShortLived {
                setup,
                started: o.short_programs,
                named: names.len(),
                with_command: Some(with_command),
                lost: lrnprof_facts(&out)?.lost,
            })
        }
        _ => {
            let script = output_of(
                Command::new(&o.perf)
                    .args(["script", "-F", "comm", "-i"])
                    .arg(&out),
                "perf script",
            )?;
            let names: BTreeSet<&str> = script
                .lines()
                .map(str::trim)
                .filter(|l| expected.contains(*l))
                .collect();
            Ok(ShortLived {
                setup,
                started: o.short_programs,
                named: names.len(),
                with_command: None,
                lost: perf_facts(&o.perf, &out)?.lost,
            })
        }
    }
}

/// Per-round overheads of `s` over the baseline in percent: the programs'
/// CPU (and the profiler's, with `with_profiler`) over the programs' CPU
/// alone in the same round.
fn round_overheads(base: &SystemSetupRuns, s: &SystemSetupRuns, with_profiler: bool) -> Vec<f64> {
    let alone: Vec<f64> = base.rounds.iter().map(|r| r.programs_cpu_s).collect();
    let profiled: Vec<f64> = s
        .rounds
        .iter()
        .map(|r| {
            r.programs_cpu_s
                + if with_profiler {
                    r.profiler.map_or(0.0, |p| p.cpu_s())
                } else {
                    0.0
                }
        })
        .collect();
    paired_overheads(&alone, &profiled)
}

/// Overhead of `s` over the baseline in points, paired by round: the
/// median of [`round_overheads`].
fn overhead(base: &SystemSetupRuns, s: &SystemSetupRuns, with_profiler: bool) -> Option<f64> {
    median(&round_overheads(base, s, with_profiler))
}

/// `a`'s total overhead minus `b`'s in the same round, in points, over
/// the rounds (below: rounds where `a` cost less): pairing by round takes
/// out what the machine's load did to that round.
fn paired_difference(
    base: &SystemSetupRuns,
    a: &SystemSetupRuns,
    b: &SystemSetupRuns,
) -> Option<Paired> {
    let differences: Vec<f64> = round_overheads(base, a, true)
        .iter()
        .zip(round_overheads(base, b, true))
        .map(|(a, b)| a - b)
        .collect();
    paired(&differences, 0.0)
}

/// The comparison as markdown.
pub fn system_markdown(c: &SystemComparison) -> String {
    let mut o = String::new();
    let rounds = c.setups.first().map_or(0, |s| s.rounds.len());
    let _ = writeln!(
        o,
        "Two busy programs side by side, {} Hz per CPU, medians of {rounds} rounds \
         (setups interleaved in each round):\n",
        c.freq
    );
    for (name, what) in &c.programs {
        let _ = writeln!(o, "- `{name}`: {what}");
    }
    let _ = writeln!(
        o,
        "\n| setup | programs' CPU s | programs slowed by % | profiler CPU s | \
         total overhead % | wall s | samples | lost % | output MiB |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base = &c.setups[0];
    let fmt =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    for s in &c.setups {
        let is_base = s.setup == SystemSetup::Alone;
        let facts = |f: fn(&TraceFacts) -> f64| s.median_of(|r| r.facts.as_ref().map(f));
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.setup.name(),
            fmt(s.median_of(|r| Some(r.programs_cpu_s)), 2),
            fmt((!is_base).then(|| overhead(base, s, false)).flatten(), 1),
            fmt(s.median_of(|r| r.profiler.map(|p| p.cpu_s())), 2),
            fmt((!is_base).then(|| overhead(base, s, true)).flatten(), 1),
            fmt(s.median_of(|r| Some(r.programs_wall_s)), 2),
            fmt(facts(|f| f.samples as f64), 0),
            fmt(
                s.median_of(|r| r.facts.as_ref().and_then(|f| f.lost_pct())),
                2
            ),
            fmt(facts(|f| f.bytes as f64 / (1024.0 * 1024.0)), 2),
        );
    }
    let find = |setup| c.setups.iter().find(|s| s.setup == setup);
    for (a, b) in [
        (SystemSetup::Lrnprof, SystemSetup::PerfFp),
        (SystemSetup::LrnprofNoCache, SystemSetup::PerfFp),
        (SystemSetup::BaselineLrnprof, SystemSetup::PerfFp),
        (SystemSetup::Lrnprof, SystemSetup::BaselineLrnprof),
    ] {
        let (Some(sa), Some(sb)) = (find(a), find(b)) else {
            continue;
        };
        if let (Some(oa), Some(ob)) = (overhead(base, sa, true), overhead(base, sb, true)) {
            let _ = write!(
                o,
                "\n{} minus {}: {:+.1} points of total overhead (difference of medians)",
                a.name(),
                b.name(),
                oa - ob
            );
            if let Some(d) = paired_difference(base, sa, sb) {
                let _ = write!(o, "; paired by round {:+.1} points (median", d.median);
                if let Some((lo, hi)) = d.interval {
                    let _ = write!(o, ", 95 % interval {lo:+.1} to {hi:+.1}");
                }
                let _ = write!(o, "), lower in {} of {} rounds", d.below, d.rounds);
            }
            let _ = writeln!(o, ".");
        }
    }
    if !c.short.is_empty() {
        let _ = writeln!(
            o,
            "\nShort-lived processes (a shell loop starting each program once while recording):\n"
        );
        let _ = writeln!(
            o,
            "| profiler | started | named in the profile | with command line | lost |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|");
        for s in &c.short {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                s.setup.name(),
                s.started,
                s.named,
                s.with_command.map_or("-".into(), |n| n.to_string()),
                s.lost
            );
        }
    }
    let _ = writeln!(o);
    for s in c.setups.iter().filter(|s| !s.command.is_empty()) {
        let _ = writeln!(o, "- {}: `{}`", s.setup.name(), s.command);
    }
    for n in &c.notes {
        let _ = writeln!(o, "- left out: {n}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(cpu_s: f64) -> Measured {
        Measured {
            user_s: cpu_s,
            sys_s: 0.0,
            wall_s: cpu_s,
            peak_rss_kib: 0,
        }
    }

    fn runs(setup: SystemSetup, rounds: &[(f64, Option<f64>)]) -> SystemSetupRuns {
        SystemSetupRuns {
            setup,
            command: if setup == SystemSetup::Alone {
                String::new()
            } else {
                format!("{} ...", setup.name())
            },
            rounds: rounds
                .iter()
                .map(|&(programs, profiler)| SystemRound {
                    programs_cpu_s: programs,
                    programs_wall_s: programs / 2.0,
                    profiler: profiler.map(measured),
                    facts: profiler.map(|_| TraceFacts {
                        bytes: 1 << 20,
                        samples: 999,
                        lost: 1,
                        embedded_bytes: 0,
                    }),
                })
                .collect(),
        }
    }

    #[test]
    fn overhead_pairs_rounds_and_counts_the_profiler_when_asked() {
        let base = runs(SystemSetup::Alone, &[(2.0, None), (4.0, None)]);
        let perf = runs(SystemSetup::PerfFp, &[(2.2, Some(0.2)), (4.0, Some(0.4))]);
        // Programs alone: +10% and 0%: median 5%.
        assert!((overhead(&base, &perf, false).unwrap() - 5.0).abs() < 1e-9);
        // With the profiler: +20% and +10%: median 15%.
        assert!((overhead(&base, &perf, true).unwrap() - 15.0).abs() < 1e-9);
    }

    #[test]
    fn paired_difference_takes_the_median_of_per_round_differences() {
        let base = runs(SystemSetup::Alone, &[(2.0, None), (2.0, None), (4.0, None)]);
        // Total overheads: perf 10, 20, 5; lrnprof 5, 30, 10.
        let perf = runs(
            SystemSetup::PerfFp,
            &[(2.0, Some(0.2)), (2.0, Some(0.4)), (4.0, Some(0.2))],
        );
        let lrn = runs(
            SystemSetup::Lrnprof,
            &[(2.0, Some(0.1)), (2.0, Some(0.6)), (4.0, Some(0.4))],
        );
        let d = paired_difference(&base, &lrn, &perf).unwrap();
        // Differences -5, +10, +5: median +5, lower in one round of three;
        // too few rounds for a 95 % interval.
        assert!((d.median - 5.0).abs() < 1e-9, "{}", d.median);
        assert_eq!((d.below, d.rounds), (1, 3));
        assert_eq!(d.interval, None);
    }

    #[test]
    fn markdown_compares_lrnprof_with_perf_and_lists_short_lived() {
        let c = SystemComparison {
            freq: 1000,
            programs: vec![("deep_work".into(), "C".into())],
            setups: vec![
                runs(SystemSetup::Alone, &[(2.0, None)]),
                runs(SystemSetup::PerfFp, &[(2.0, Some(0.2))]),
                runs(SystemSetup::Lrnprof, &[(2.1, Some(0.3))]),
                runs(SystemSetup::LrnprofNoCache, &[(2.1, Some(0.4))]),
            ],
            short: vec![ShortLived {
                setup: SystemSetup::Lrnprof,
                started: 200,
                named: 199,
                with_command: Some(150),
                lost: 0,
            }],
            notes: vec!["perf: missing".into()],
        };
        let md = system_markdown(&c);
        assert!(
            md.contains("| perf record -a -g | 2.00 | 0.0 | 0.20 | 10.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| lrnprof-rec --all | 2.10 | 5.0 | 0.30 | 20.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| lrnprof-rec --all --no-cache | 2.10 | 5.0 | 0.40 | 25.0 |"),
            "{md}"
        );
        assert!(md.contains("| 0.10 | 1.00 |"), "lost % and MiB: {md}");
        assert!(md.contains("+10.0 points"), "{md}");
        assert!(
            md.contains("lrnprof-rec --all --no-cache minus perf record -a -g: +15.0 points"),
            "{md}"
        );
        assert!(
            md.contains("paired by round +10.0 points (median), lower in 0 of 1 rounds"),
            "{md}"
        );
        assert!(
            md.contains("| lrnprof-rec --all | 200 | 199 | 150 | 0 |"),
            "{md}"
        );
        assert!(md.contains("- left out: perf: missing"), "{md}");
    }
}
