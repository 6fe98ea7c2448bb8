//! `lrnprof-analyze`: thin command-line front end of lrnprof-analyzer.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use lrnprof_analyzer::{
    analyze, analyze_in, default_output_path, pack, pool, strip, syscall_report, write_atomically,
    write_diff_svg, AnalyzeOptions, DiffReport, OutputFormat, PackOptions, Profile, Progress,
    SampleFilter, StackFilter, SyscallReportOptions, TopOptions, TopOrder, TopReport, TraceInfo,
    ValueKind,
};
use lrnprof_format::{Pid, Tid};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::Instant;

/// `eprintln!` that does not panic: a message that cannot be shown (stderr
/// on a full disk, a closed pipe) must not stop the analysis or turn a
/// written result into a failure.
macro_rules! say {
    ($($arg:tt)*) => {
        to_stderr(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// Analyze an lrnprof trace: unwind, symbolicate, write pprof, folded, speedscope, a flame
/// graph SVG or a Firefox Profiler profile; or show the hottest functions (top) or what
/// changed between two traces (diff).
#[derive(Parser, Debug)]
#[command(
    name = "lrnprof-analyze",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The hottest functions, as a table: self and total share of the value shown, samples.
    Top {
        /// The trace (`-`: read it from standard input).
        trace: PathBuf,
        /// Show this many functions (0: all).
        #[arg(short = 'n', value_name = "N", default_value_t = 20)]
        n: usize,
        /// Sort by self (where the value is spent) or total (with callees).
        #[arg(long, value_enum, default_value_t = By::SelfValue)]
        by: By,
        #[command(flatten)]
        view: ViewArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Which functions got slower or faster from BASE to NEW (shares of each trace's
    /// total): a table, and a differential flame graph SVG.
    Diff {
        /// The trace before the change.
        base: PathBuf,
        /// The trace after it.
        new: PathBuf,
        /// Show this many functions (0: all).
        #[arg(short = 'n', value_name = "N", default_value_t = 20)]
        n: usize,
        /// The differential flame graph (default: NEW.diff.svg).
        #[arg(long, short = 'o', value_name = "OUT")]
        output: Option<PathBuf>,
        /// Open the flame graph in the browser once written.
        #[arg(long)]
        open: bool,
        #[command(flatten)]
        view: ViewArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Show what a trace holds: processes, threads, images and where their data comes from.
    Info {
        /// The trace (`-`: read it from standard input).
        trace: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Write a copy of a trace whose samples keep their unwound frames but no
    /// stack bytes (no raw process memory; smaller; analyzed like any trace).
    Strip {
        /// The trace (`-`: read it from standard input).
        trace: PathBuf,
        /// The stripped trace to write.
        #[arg(long, short = 'o', value_name = "OUT")]
        output: PathBuf,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Summarize the system calls of a trace recorded with `lrnprof-rec
    /// --syscalls`, like `strace -c`, with the call site (function and
    /// file:line) of each, their errors, and unusually slow calls.
    Syscalls {
        /// The trace (`-`: read it from standard input).
        trace: PathBuf,
        /// Print JSON: an array of syscalls with their calls, errors,
        /// total_ns, call sites and slow calls.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print CSV: one row per syscall (with --sites: per syscall and call site).
        #[arg(long)]
        csv: bool,
        /// With --csv: one row per syscall and call site.
        #[arg(long, requires = "csv")]
        sites: bool,
        /// Only these syscalls: names and classes, comma-separated
        /// (openat,read,%file; classes file, network, process, memory, signal, ipc).
        #[arg(long = "syscall", value_name = "LIST")]
        syscalls: Vec<String>,
        /// A call is unusually slow at this many times its call site's median.
        #[arg(long, value_name = "FACTOR", default_value_t = 10.0)]
        slow_factor: f64,
        #[command(flatten)]
        select: SelectArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Embed the recorded images' unwind sections and symbols in a trace, so it
    /// can be analyzed where the binaries do not exist. Run on the recording machine.
    Pack {
        /// The trace.
        trace: PathBuf,
        /// Where to write the packed trace (default: replace TRACE).
        #[arg(long, short = 'o', value_name = "OUT")]
        output: Option<PathBuf>,
        /// Also embed DWARF debug info (source lines and inline frames).
        #[arg(long)]
        debug: bool,
        /// Pack even if this machine's host name differs from the recording's.
        #[arg(long)]
        any_host: bool,
    },
}

#[derive(Args, Debug)]
struct CommonArgs {
    /// Directory with image or debug files (searched by name, .build-id layout, NAME.dSYM). Repeatable.
    #[arg(long = "symbols", value_name = "DIR")]
    symbols: Vec<PathBuf>,
    /// Worker threads (default: one per CPU; at most 1024).
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    jobs: usize,
    /// Never read local files: use only data embedded in the trace.
    #[arg(long, conflicts_with = "debuginfod")]
    offline: bool,
    /// Fetch the debug files of images whose DWARF is not here, by build id, from the
    /// debuginfod servers in $DEBUGINFOD_URLS (through elfutils' debuginfod-find, which caches
    /// them).
    #[arg(long)]
    debuginfod: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The trace to analyze (`-`: read it from standard input; then give -o).
    #[arg(required = true)]
    trace: Option<PathBuf>,
    /// Output format (default: the one -o's name ends in: .pb.gz, .folded,
    /// .speedscope.json, .svg, .firefox.json, .script.txt; else pprof).
    #[arg(long, short = 'f', value_enum)]
    format: Option<Format>,
    /// Output file, `-` for stdout (default: TRACE.pb.gz / .folded / .speedscope.json / .svg /
    /// .firefox.json / .script.txt).
    #[arg(long, short = 'o', value_name = "OUT")]
    output: Option<PathBuf>,
    /// Open the result in the browser once written (the flame graph itself; the viewer's
    /// page for speedscope and Firefox Profiler files).
    #[arg(long)]
    open: bool,
    #[command(flatten)]
    view: ViewArgs,
    #[command(flatten)]
    common: CommonArgs,
}

/// Which threads and time range to keep.
#[derive(Args, Debug)]
struct SelectArgs {
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// Only this thread.
    #[arg(long)]
    tid: Option<u32>,
    /// Only threads with this name (while they had it: a thread renamed
    /// during the recording is selected by each name for its time).
    #[arg(long, value_name = "NAME")]
    thread_name: Option<String>,
    /// Only processes with this name (their main thread's, as `ps -o comm`
    /// shows it), and threads with this name.
    #[arg(long, value_name = "NAME")]
    comm: Option<String>,
    /// Only processes whose cgroup path contains this text (a container id,
    /// a systemd unit): system-wide recordings record each process's cgroup.
    #[arg(long, value_name = "TEXT")]
    cgroup: Option<String>,
    /// Only events at or after this many seconds into the recording.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    from: Option<f64>,
    /// Only events before this many seconds into the recording.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    to: Option<f64>,
}

impl SelectArgs {
    fn filter(&self) -> SampleFilter {
        SampleFilter {
            pid: self.pid.map(Pid),
            tid: self.tid.map(Tid),
            thread_name: self.thread_name.clone(),
            comm: self.comm.clone(),
            cgroup: self.cgroup.clone(),
            from_secs: self.from,
            to_secs: self.to,
        }
    }
}

/// Which samples, and which value of them, a view shows.
#[derive(Args, Debug)]
struct ViewArgs {
    #[command(flatten)]
    select: SelectArgs,
    /// Do not show inlined functions as their own frames.
    #[arg(long)]
    no_inline: bool,
    /// The value to show: samples, cpu, cycles, alloc_objects, alloc_space,
    /// inuse_objects, inuse_space, syscalls, syscall_time or off_cpu (pprof:
    /// the default sample type; all recorded values are written). Default:
    /// sample counts in folded output, CPU time (or cycles) elsewhere, or the
    /// trace's main value when it has no CPU samples.
    #[arg(long, value_name = "NAME", value_parser = parse_value)]
    value: Option<ValueKind>,
    /// Only samples with a function on their stack whose name contains this
    /// text (as `top` shows names). Repeatable: any of them.
    #[arg(long, value_name = "TEXT")]
    focus: Vec<String>,
    /// Leave out samples with a function on their stack whose name contains
    /// this text. Repeatable.
    #[arg(long, value_name = "TEXT")]
    ignore: Vec<String>,
}

impl ViewArgs {
    /// Analysis options with these filters and value.
    fn options(&self, common: &CommonArgs) -> AnalyzeOptions {
        let mut opts = options(common);
        opts.filter = self.select.filter();
        opts.stacks = StackFilter {
            focus: self.focus.clone(),
            ignore: self.ignore.clone(),
        };
        opts.no_inline = self.no_inline;
        opts.value = self.value;
        opts
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum By {
    #[value(name = "self")]
    SelfValue,
    Total,
}

/// Seconds into the recording: a finite number, 0 or more (`nan` parsed
/// as a float and selected every sample).
fn parse_secs(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err("expected seconds into the recording: a number, 0 or more".to_string()),
    }
}

fn parse_value(name: &str) -> Result<ValueKind, String> {
    ValueKind::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = ValueKind::ALL.iter().map(|k| k.name()).collect();
        format!(
            "unknown value {name:?}; the values are {}",
            names.join(", ")
        )
    })
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// Gzipped profile.proto, for `go tool pprof` and Pyroscope (the default)
    Pprof,
    /// One line per stack, for flamegraph.pl and inferno (also `collapsed`)
    #[value(alias = "collapsed")]
    Folded,
    /// JSON for speedscope.app
    Speedscope,
    /// An interactive flame graph for a web browser (also `flamegraph`)
    #[value(alias = "flamegraph")]
    Svg,
    /// JSON for the Firefox Profiler (profiler.firefox.com)
    Firefox,
    /// Every sample as `perf script` prints it, for the tools that read that (also `perf-script`)
    #[value(alias = "perf-script")]
    Script,
}

impl From<Format> for OutputFormat {
    fn from(f: Format) -> OutputFormat {
        match f {
            Format::Pprof => OutputFormat::Pprof,
            Format::Folded => OutputFormat::Folded,
            Format::Speedscope => OutputFormat::Speedscope,
            Format::Svg => OutputFormat::Svg,
            Format::Firefox => OutputFormat::Firefox,
            Format::Script => OutputFormat::Script,
        }
    }
}

/// A one-line progress display on a terminal stderr; silent otherwise.
struct TermProgress {
    enabled: bool,
    last: Mutex<(String, u64)>,
}

impl Progress for TermProgress {
    fn update(&self, stage: &str, done: u64, total: u64) {
        if !self.enabled || total == 0 {
            return;
        }
        let pct = done * 100 / total;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.0 == stage && last.1 == pct {
            return;
        }
        *last = (stage.to_string(), pct);
        let bar = "#".repeat((pct / 5) as usize);
        to_stderr(&format!("\r{stage:<14} [{bar:<20}] {pct:>3}%"));
    }
    fn finish(&self) {
        if self.enabled {
            to_stderr(&format!("\r{:60}\r", ""));
        }
    }
}

fn options(common: &CommonArgs) -> AnalyzeOptions {
    AnalyzeOptions {
        symbols_dirs: common.symbols.clone(),
        jobs: common.jobs,
        offline: common.offline,
        debuginfod: common.debuginfod,
        ..Default::default()
    }
}

fn run(cli: Cli) -> Result<()> {
    let started = Instant::now();
    let progress = TermProgress {
        enabled: std::io::stderr().is_terminal(),
        last: Mutex::new((String::new(), 0)),
    };
    match cli.command {
        Some(Command::Top {
            trace,
            n,
            by,
            view,
            common,
        }) => {
            let profile = analyze(&trace, &view.options(&common), &progress)?;
            warn(&profile);
            let by = match by {
                By::SelfValue => TopOrder::SelfValue,
                By::Total => TopOrder::Total,
            };
            print_out(&TopReport::new(&profile, &TopOptions { limit: n, by }).to_text())
        }
        Some(Command::Diff {
            base,
            new,
            n,
            output,
            open,
            view,
            common,
        }) => {
            let (out, defaulted) = output_path(output, &[&base, &new], "diff.svg")?;
            let mut opts = view.options(&common);
            let base_profile = analyze(&base, &opts, &progress)?;
            warn(&base_profile);
            let kind = base_profile
                .shown_value()
                .context("the base trace recorded no value to compare")?;
            // The same value of both: the new trace must have recorded it.
            opts.value = Some(kind);
            let new_profile = analyze(&new, &opts, &progress)?;
            warn(&new_profile);
            print_out(&DiffReport::new(&base_profile, &new_profile, kind, n).to_text())?;
            let write = write_atomically(&out, |w| {
                write_diff_svg(&base_profile, &new_profile, kind, w)
            });
            explain_default_output(write, defaulted)?;
            say!("differential flame graph -> {}", out.display());
            if open {
                open_result(&out, OutputFormat::Svg);
            }
            Ok(())
        }
        Some(Command::Info {
            trace,
            json,
            common,
        }) => {
            let profile = analyze(&trace, &options(&common), &progress)?;
            let info = TraceInfo::new(&profile);
            if json {
                print_out(&(serde_json::to_string_pretty(&info)? + "\n"))
            } else {
                print_out(&info.to_text())
            }
        }
        Some(Command::Strip {
            trace,
            output,
            common,
        }) => {
            let r = strip(&trace, &output, &options(&common), &progress)?;
            for w in &r.warnings {
                say!("warning: {w}");
            }
            say!(
                "{} samples stripped of {} stack bytes: {} -> {} bytes, {:.2} s -> {}",
                r.samples,
                r.stack_bytes,
                r.input_bytes,
                r.output_bytes,
                started.elapsed().as_secs_f64(),
                output.display()
            );
            Ok(())
        }
        Some(Command::Syscalls {
            trace,
            json,
            csv,
            sites,
            syscalls,
            slow_factor,
            select,
            common,
        }) => {
            if !(slow_factor.is_finite() && slow_factor >= 1.0) {
                anyhow::bail!("--slow-factor must be a number of at least 1, got {slow_factor}");
            }
            let mut analyze = options(&common);
            analyze.filter = select.filter();
            let report = syscall_report(
                &trace,
                &SyscallReportOptions {
                    analyze,
                    syscalls,
                    slow_factor,
                    ..Default::default()
                },
                &progress,
            )?;
            for w in &report.warnings {
                say!("warning: {w}");
            }
            print_out(&if json {
                serde_json::to_string_pretty(&report.syscalls)? + "\n"
            } else if csv && sites {
                report.to_sites_csv()
            } else if csv {
                report.to_csv()
            } else {
                report.to_text()
            })
        }
        Some(Command::Pack {
            trace,
            output,
            debug,
            any_host,
        }) => {
            let out = output.unwrap_or_else(|| trace.clone());
            let r = pack(&trace, &out, &PackOptions { debug, any_host })?;
            for e in &r.embedded {
                say!("embedded {e}");
            }
            for s in &r.skipped {
                say!("warning: not embedded: {s}");
            }
            say!(
                "{} images and maps embedded, {} bytes added, {:.2} s -> {}",
                r.embedded.len(),
                r.bytes,
                started.elapsed().as_secs_f64(),
                out.display()
            );
            Ok(())
        }
        None => {
            let args = cli.run;
            let trace = args.trace.context("missing TRACE argument")?;
            let format = OutputFormat::from(format_for(args.format, args.output.as_deref())?);
            let mut opts = args.view.options(&args.common);
            format.configure(&mut opts);
            // One pool for the analysis and the output's writing (pprof
            // compresses on the workers).
            let (out, defaulted) = output_path(args.output, &[&trace], format.extension())?;
            let pool = pool(opts.jobs)?;
            let profile = analyze_in(&pool, &trace, &opts, &progress)?;
            warn(&profile);
            let write =
                pool.install(|| write_atomically(&out, |w| format.writer().write(&profile, w)));
            explain_default_output(write, defaulted)?;
            let s = &profile.stats;
            let to_stdout = out.as_os_str() == "-";
            // One write: stderr is unbuffered, and the line written piece
            // by piece took 18 system calls (and could interleave with
            // another program's output).
            let by_kind = s
                .root_by_kind_text()
                .map(|k| format!(" ({k})"))
                .unwrap_or_default();
            let line = format!(
                "{} samples, {:.1}% unwound to root{by_kind}, {:.1}% unknown frames, {:.2} s{}\n",
                s.samples,
                s.root_pct(),
                s.unknown_pct(),
                started.elapsed().as_secs_f64(),
                if to_stdout {
                    String::new()
                } else {
                    format!(" -> {}", out.display())
                }
            );
            to_stderr(&line);
            if args.open && !to_stdout {
                open_result(&out, format);
            }
            // The process exits next: freeing the profile's many small
            // allocations one by one would only cost time (about 1 % of a
            // short analysis).
            std::mem::forget(profile);
            Ok(())
        }
    }
}

/// The format an output file's name says, if it says one: each format's
/// default file's extension, and a few other names for it. `Err` for a
/// name that says JSON but not whose.
fn format_of_name(path: &Path) -> Result<Option<Format>, ()> {
    const OTHER_NAMES: [(&str, Format); 3] = [
        ("pb", Format::Pprof),
        ("pprof", Format::Pprof),
        ("collapsed", Format::Folded),
    ];
    let Some(name) = path.file_name() else {
        return Ok(None);
    };
    let name = name.to_string_lossy().to_lowercase();
    let ends = |ext: &str| name.strip_suffix(ext).is_some_and(|n| n.ends_with('.'));
    let defaults = Format::value_variants()
        .iter()
        .map(|&f| (OutputFormat::from(f).extension(), f));
    match defaults.chain(OTHER_NAMES).find(|&(ext, _)| ends(ext)) {
        Some((_, f)) => Ok(Some(f)),
        None if ends("json") => Err(()),
        None => Ok(None),
    }
}

/// The output format: `given`, else the one `output`'s name says, else
/// pprof. A given format that the name contradicts is used, with a warning.
fn format_for(given: Option<Format>, output: Option<&Path>) -> Result<Format> {
    let Some(out) = output else {
        return Ok(given.unwrap_or(Format::Pprof));
    };
    match (given, format_of_name(out)) {
        (Some(f), Ok(Some(named))) if f != named => {
            say!(
                "warning: writing {} to {}, whose name says {}",
                format_name(f),
                out.display(),
                format_name(named)
            );
            Ok(f)
        }
        (Some(f), _) => Ok(f),
        (None, Ok(named)) => Ok(named.unwrap_or(Format::Pprof)),
        (None, Err(())) => anyhow::bail!(
            "{} says JSON but not which: give --format speedscope or --format firefox \
             (or name it .speedscope.json or .firefox.json)",
            out.display()
        ),
    }
}

fn format_name(f: Format) -> String {
    f.to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string())
}

/// `lrnprof-analyze pprof T` (as `go tool pprof` and `perf report` are
/// spelled) makes clap say that "T" cannot be used as a subcommand. When
/// the first argument names an output format and is no file, say how to
/// ask for that format instead.
fn format_used_as_command(e: &clap::Error) -> Option<String> {
    if matches!(
        e.kind(),
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
    ) {
        return None;
    }
    let first = std::env::args_os().nth(1)?;
    let name = first.to_str()?;
    let format = Format::from_str(name, true).ok()?;
    if Path::new(&first).exists() {
        return None;
    }
    let default = matches!(format, Format::Pprof)
        .then_some(" (pprof is the default)")
        .unwrap_or_default();
    Some(format!(
        "`{name}` is an output format, not a command: lrnprof-analyze --format {name} TRACE{default}"
    ))
}

/// Two positional arguments make clap read the second as a subcommand
/// ("the subcommand 'b.lpt' cannot be used with '<TRACE>'"): say what
/// lrnprof-analyze takes instead.
fn second_trace_hint(e: &clap::Error) -> Option<&'static str> {
    (e.kind() == clap::error::ErrorKind::ArgumentConflict
        && e.to_string().contains("cannot be used with '<TRACE>'"))
    .then_some(
        "tip: lrnprof-analyze takes one trace, after its options; a command \
         (top, diff, info, strip, syscalls, pack) comes first, and diff compares two traces",
    )
}

/// Where an output of `traces` goes: `given`, else next to the last of
/// them (then `true`). A trace read from standard input has no place next
/// to it, and an output never replaces one of its traces.
fn output_path(given: Option<PathBuf>, traces: &[&Path], ext: &str) -> Result<(PathBuf, bool)> {
    let trace = traces.last().expect("an output has a trace");
    match given {
        Some(out) if traces.iter().any(|t| is_same_file(&out, t)) => anyhow::bail!(
            "-o {} is a trace being analyzed: writing the output there would replace it; choose another file",
            out.display()
        ),
        Some(out) => Ok((out, false)),
        None if *trace == Path::new("-") => anyhow::bail!(
            "the trace comes from standard input: say where the output goes with -o FILE (-o - for standard output)"
        ),
        // A pipe, a FIFO, /dev/stdin (even on a file), a shell's <(...):
        // what lies next to it is no place for an output
        // (/dev/stdin.pb.gz in /dev).
        None if !is_in_a_directory(trace) => anyhow::bail!(
            "the trace {} has no directory to write the output next to (a pipe, /dev/stdin, <(...)): say where the output goes with -o FILE (-o - for standard output)",
            trace.display()
        ),
        None => Ok((default_output_path(trace, ext), true)),
    }
}

/// Whether `trace` is a file of a directory an output can go to: not a
/// pipe or FIFO, not reached through `/dev` or `/proc` (`/dev/stdin`,
/// `/dev/fd/63`).
fn is_in_a_directory(trace: &Path) -> bool {
    let absolute = std::path::absolute(trace).unwrap_or_else(|_| trace.to_path_buf());
    let special = ["/dev", "/proc"].iter().any(|d| absolute.starts_with(d));
    !special && std::fs::metadata(trace).is_ok_and(|m| m.is_file())
}

/// Whether `a` and `b` name the same existing file (links included).
fn is_same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.is_file() && a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        a.canonicalize()
            .is_ok_and(|a| b.canonicalize().is_ok_and(|b| a == b))
    }
}

/// A failure to write the output at its default place (next to the
/// trace: a read-only directory, `<(...)`) says how to put it elsewhere.
fn explain_default_output(
    write: Result<(), lrnprof_analyzer::AnalyzeError>,
    defaulted: bool,
) -> Result<()> {
    match write {
        Err(e) if defaulted => Err(anyhow::anyhow!(
            "{e} (the output goes next to the trace unless -o FILE says otherwise)"
        )),
        other => Ok(other?),
    }
}

/// Writes `text` to stderr in one call, ignoring failure (see `say!`).
fn to_stderr(text: &str) {
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Writes a report to stdout; a failure (a full disk, a closed pipe) is an
/// error, not a panic.
fn print_out(text: &str) -> Result<()> {
    write_atomically(Path::new("-"), |w| w.write_all(text.as_bytes()))?;
    Ok(())
}

/// Whether `e` comes from writing to a reader that went away, as
/// `lrnprof-analyze top T | head` does: not worth a message.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn warn(profile: &Profile) {
    for w in &profile.warnings {
        say!("warning: {w}");
    }
}

/// Show `path` (written in `format`) in the user's browser, as the desktop
/// opens links (`open` on macOS, `xdg-open` elsewhere), spawned and left
/// running. Never an error: where there is no display or no opener, say
/// where the file is and how to look at it.
fn open_result(path: &Path, format: OutputFormat) {
    let shown = path.display();
    // What to open, and what the user does there.
    let (target, then) = match format {
        OutputFormat::Svg => (shown.to_string(), String::new()),
        OutputFormat::Firefox => (
            "https://profiler.firefox.com/".to_string(),
            format!(" and load {shown} there (\"Load a profile from file\")"),
        ),
        OutputFormat::Speedscope => (
            "https://www.speedscope.app/".to_string(),
            format!(" and drop {shown} on the page"),
        ),
        OutputFormat::Pprof => {
            say!("to look at it: go tool pprof -http=: {shown}");
            return;
        }
        OutputFormat::Folded | OutputFormat::Script => {
            say!("this output is text, nothing to open: {shown}");
            return;
        }
    };
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    // Without a display xdg-open would start a text-mode browser, if any.
    let display = cfg!(target_os = "macos")
        || std::env::var_os("DISPLAY").is_some_and(|d| !d.is_empty())
        || std::env::var_os("WAYLAND_DISPLAY").is_some_and(|d| !d.is_empty());
    let spawned = display
        && Process::new(opener)
            .arg(&target)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .is_ok();
    if spawned {
        say!("opening {target} with {opener}{then}");
    } else {
        let why = if display {
            format!("no {opener} here")
        } else {
            "no display".to_string()
        };
        say!("{why}: open {target} in a browser{then}");
    }
}

/// Keep glibc from handing memory back to the kernel between blocks.
///
/// By default glibc serves allocations above 128 KiB with their own
/// `mmap` and returns the free top of every thread's arena to the kernel
/// past 128 KiB. The workers decode and unwind a block at a time into
/// buffers of that size, freed on the thread that aggregates them: with
/// two or more jobs every block's buffers were mapped and faulted in
/// again, a third more CPU time, most of it in the kernel (deep-stack
/// trace, 447,000 samples, `--jobs 2`: 0.22 s of system time, wall 0.56 s;
/// with these settings 0.05 s and 0.44 s, for 12 MiB more peak memory).
/// Process-wide, so it is done here in the binary, not in the library.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // glibc's largest mmap threshold on 64-bit hosts is 32 MiB; both calls
    // only tune, so a refusal (0) changes nothing and is not an error.
    // Safety: mallopt takes two integers and has no other precondition.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// On SIGINT and SIGTERM, remove the output being written (its temporary
/// file), then die of the signal as without a handler.
#[cfg(unix)]
fn remove_output_when_interrupted() {
    extern "C" fn on_signal(signal: libc::c_int) {
        lrnprof_analyzer::remove_unfinished_output();
        // Safety: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // Safety: the handler makes only async-signal-safe calls. A
        // refusal leaves the default, which only leaves a temporary file.
        // A signal ignored from the start (a background job of a shell,
        // nohup) stays ignored.
        unsafe {
            let before = libc::signal(signal, on_signal as *const () as libc::sighandler_t);
            if before == libc::SIG_IGN {
                libc::signal(signal, libc::SIG_IGN);
            }
        }
    }
}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    keep_freed_memory();
    #[cfg(unix)]
    remove_output_when_interrupted();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if let Some(hint) = format_used_as_command(&e) {
                say!("lrnprof-analyze: error: {hint}");
                return ExitCode::from(2);
            }
            if let Some(tip) = second_trace_hint(&e) {
                to_stderr(&e.render().to_string());
                say!("\n{tip}");
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader has what it wanted; there is no one left to tell.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Library errors are complete one-line messages: no cause chain.
            say!("lrnprof-analyze: error: {e}");
            ExitCode::FAILURE
        }
    }
}
