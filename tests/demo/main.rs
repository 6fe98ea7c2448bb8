//! `lrnprof-demo`: builds the bundled demo program (`tests/demo/demo.c`),
//! records it with the recorder library, analyzes the trace into pprof,
//! folded and speedscope files, and says where they are and how to open them.
//!
//! Run it with `cargo run --release -p lrnprof-tests --bin lrnprof-demo`
//! [-- SECONDS]. Everything goes to `target/lrnprof-demo/`.

use anyhow::{bail, Context, Result};
use lrnprof_analyzer::{analyze, write_atomically, AnalyzeOptions, NoProgress, OutputFormat};
use lrnprof_recorder::{
    record, RecordOptions, RecordStatus, RecordWarning, Reporter, StopToken, TargetSpec,
};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lrnprof-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The recorder's status on a terminal's last line, and its warnings.
struct Log {
    status_line: bool,
}

impl Reporter for Log {
    fn status(&self, status: &RecordStatus) {
        if self.status_line {
            eprint!("\r\x1b[Krecording: {status}");
        }
    }

    fn warning(&self, warning: &RecordWarning) {
        self.clear();
        eprintln!("warning: {warning}");
    }
}

impl Log {
    fn clear(&self) {
        if self.status_line {
            eprint!("\r\x1b[K");
        }
    }
}

fn run() -> Result<()> {
    let seconds: f64 = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .with_context(|| format!("{s:?} is not a number of seconds"))?,
        None => 3.0,
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("tests/ has no parent directory")?
        .to_path_buf();
    let out_dir = root.join("target/lrnprof-demo");
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;

    // 1. Build the demo program, optimized and without frame pointers, so
    //    unwinding needs the DWARF CFI that only offline analysis can afford.
    let exe = out_dir.join("demo");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(root.join("tests/demo/demo.c"))
        .status()
        .with_context(|| format!("cannot run the C compiler {cc:?}: install gcc or set CC"))?;
    if !status.success() {
        bail!("{cc} failed to build tests/demo/demo.c");
    }

    // 2. Record it.
    let trace = out_dir.join("demo.lpt");
    eprintln!("recording {} for {seconds} s ...", exe.display());
    let log = Log {
        status_line: std::io::stderr().is_terminal(),
    };
    let recorded = record(
        &RecordOptions {
            target: TargetSpec::Command(vec![exe.into_os_string(), seconds.to_string().into()]),
            out: trace.clone(),
            ..Default::default()
        },
        // The demo program ends by itself: nothing needs to stop it.
        &StopToken::new(),
        &log,
    );
    log.clear();
    let summary = recorded?;
    eprintln!("{summary}");

    // 3. Analyze once, write every format (each sample kept in time
    // order: what speedscope and the Firefox Profiler read).
    let options = AnalyzeOptions {
        keep_sequences: true,
        every_sample: true,
        ..Default::default()
    };
    let profile = analyze(&trace, &options, &NoProgress)?;
    let mut written: Vec<(OutputFormat, PathBuf)> = Vec::new();
    for format in OutputFormat::ALL {
        let path = out_dir.join(format!("demo.{}", format.extension()));
        write_atomically(&path, |w| format.writer().write(&profile, w))?;
        written.push((format, path));
    }
    let stats = &profile.stats;
    eprintln!(
        "analyzed {} samples: {:.1}% unwound to the thread root, {:.1}% unknown frames",
        stats.samples,
        stats.root_pct(),
        stats.unknown_pct()
    );

    // 4. Where things are and how to open them.
    println!("\ntrace: {}", trace.display());
    for (format, path) in &written {
        let path = path.display();
        match format {
            OutputFormat::Pprof => println!(
                "pprof: {path}\n  open with: go tool pprof -http=localhost:8080 {path}"
            ),
            OutputFormat::Folded => println!(
                "folded stacks: {path}\n  open with: flamegraph.pl {path} > demo.svg (or inferno-flamegraph)"
            ),
            OutputFormat::Speedscope => println!(
                "speedscope: {path}\n  open with: https://www.speedscope.app (drop the file in) or npx speedscope {path}"
            ),
            OutputFormat::Svg => println!("flame graph: {path}\n  open with: any web browser"),
            OutputFormat::Firefox => println!(
                "Firefox Profiler: {path}\n  open with: https://profiler.firefox.com (\"Load a profile from file\")"
            ),
            OutputFormat::Script => println!(
                "perf script text: {path}\n  read by: inferno-collapse-perf, speedscope, the Firefox Profiler, FlameScope"
            ),
        }
    }
    println!(
        "what is in the trace: cargo run --release -p lrnprof-analyzer -- info {}",
        trace.display()
    );
    Ok(())
}
