//! `lrnprof-rec`: record a process into an `.lpt` trace.
//!
//! The library records; this binary owns the process: flags, Ctrl-C and
//! SIGTERM (`signals`), stderr and the status line (`terminal`), and the
//! exit code.

mod signals;
mod terminal;

use anyhow::Result;
use clap::Parser;
use lrnprof_recorder::{
    record, CpuEvent, EmbedLevel, HeapOptions, RecordOptions, StopToken, TargetSpec,
    DEFAULT_FREQUENCY_HZ, DEFAULT_HEAP_INTERVAL, DEFAULT_STACK_SIZE,
};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Sample a running process (--pid) or a command (after --) into a trace
/// that lrnprof-analyze reads, here or on another machine.
#[derive(Parser, Debug)]
#[command(name = "lrnprof-rec", version, about)]
#[command(
    override_usage = "lrnprof-rec --pid PID [OPTIONS]\n       lrnprof-rec [OPTIONS] -- CMD [ARGS]..."
)]
struct Args {
    /// Attach to this running process (and the threads and children it creates).
    #[arg(long, conflicts_with = "command")]
    pid: Option<u32>,

    /// The trace file to write.
    #[arg(long, short, default_value = "trace.lpt")]
    out: PathBuf,

    /// Samples per second per running thread.
    #[arg(long, short = 'F', default_value_t = DEFAULT_FREQUENCY_HZ)]
    freq: u32,

    /// What triggers a sample: cpu-clock (time on CPU, weights in ns, works
    /// everywhere) or cycles (the hardware cycle counter, weights in cycles;
    /// most virtual machines have none). Linux only.
    #[arg(long, short = 'e', default_value = "cpu-clock", value_parser = clap::value_parser!(CpuEvent))]
    event: CpuEvent,

    /// Take CPU samples (on by default, also with --heap); off records only
    /// the other events asked for. Linux only.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    cpu: String,

    /// Also sample allocations (malloc, new, ...) of the launched command
    /// and its children, with their stacks, for alloc_space/inuse_space
    /// profiles. Launched commands only (not --pid). Linux only.
    #[arg(long)]
    heap: bool,

    /// Mean bytes allocated between two sampled allocations (exponentially
    /// distributed, as in tcmalloc); 1 records every allocation. Suffixes
    /// K, M, G (KiB, MiB, GiB).
    #[arg(long, value_name = "BYTES", requires = "heap", value_parser = parse_bytes,
          default_value_t = DEFAULT_HEAP_INTERVAL)]
    heap_rate: u64,

    /// Stop after this many seconds (default: until the target exits or Ctrl-C).
    #[arg(long, short)]
    duration: Option<f64>,

    /// Most bytes of user stack copied per sample (at most 65528 on Linux).
    #[arg(long, default_value_t = DEFAULT_STACK_SIZE)]
    stack_size: u32,

    /// Also record the kernel's frame-pointer callchain of each sample, so
    /// stacks deeper than the stack copy can still be followed.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    callchain: String,

    /// What to embed of each image the samples touched, so the trace can be
    /// analyzed where the binaries do not exist: none, unwind (unwind
    /// tables), symbols (unwind tables and symbol tables) or debug (also
    /// DWARF, for file:line and inline frames).
    #[arg(long, default_value = "symbols", value_parser = clap::value_parser!(EmbedLevel))]
    embed: EmbedLevel,

    /// The command to launch and record, after `--`.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            // Library errors are complete one-line messages; do not repeat their causes.
            eprintln!("lrnprof-rec: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode> {
    let target = match (args.pid, args.command.is_empty()) {
        (Some(pid), _) => TargetSpec::Pid(pid),
        (None, false) => TargetSpec::Command(args.command),
        (None, true) => anyhow::bail!("give --pid PID or a command after --, see --help"),
    };
    let duration = match args.duration {
        Some(d) if !(d.is_finite() && d > 0.0) => {
            anyhow::bail!("--duration must be a positive number of seconds, got {d}")
        }
        Some(d) => Some(Duration::from_secs_f64(d)),
        None => None,
    };
    let launched = matches!(target, TargetSpec::Command(_));
    let options = RecordOptions {
        target,
        out: args.out,
        frequency_hz: args.freq,
        event: args.event,
        cpu: args.cpu == "on",
        heap: args.heap.then_some(HeapOptions {
            mean_interval: args.heap_rate,
        }),
        duration,
        stack_size: args.stack_size,
        kernel_callchain: args.callchain == "on",
        embed: args.embed,
    };
    if cfg!(target_os = "linux") {
        raise_open_file_limit();
    }
    let token = StopToken::new();
    signals::handle_with(token.clone(), launched)
        .map_err(|e| anyhow::anyhow!("cannot catch Ctrl-C and SIGTERM: {e}"))?;
    let terminal = terminal::Terminal::start(std::io::stderr().is_terminal());
    let recorded = record(&options, &token, &terminal);
    // The status line is cleared before the summary or the error.
    drop(terminal);
    let summary = recorded?;
    eprintln!("{summary}");
    Ok(match summary.target_exit {
        Some(exit) => ExitCode::from(exit.shell_code().clamp(0, 255) as u8),
        None => ExitCode::SUCCESS,
    })
}

/// `4096`, `512K`, `1M`, `2G` (powers of 1024), at least 1.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            format!("{s:?} is not a number of bytes of at least 1 (e.g. 4096, 512K, 1M)")
        })
}

/// Raise the soft limit of open files to the hard limit: attaching on
/// Linux opens one event per (thread, CPU). Launched commands inherit it,
/// as they always have.
fn raise_open_file_limit() {
    // Safety: getrlimit/setrlimit read and write a valid rlimit struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("1"), Ok(1));
        assert_eq!(parse_bytes("512K"), Ok(512 * 1024));
        assert_eq!(parse_bytes("2m"), Ok(2 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        for bad in ["0", "", "K", "1.5M", "-1", "99999999999999999999G"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
