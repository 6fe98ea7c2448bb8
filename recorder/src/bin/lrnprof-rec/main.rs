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
    own_cpu, record, CpuEvent, EmbedLevel, FrameCache, HeapOptions, OffCpuOptions, RecordOptions,
    StopToken, SyscallOptions, TargetSpec, DEFAULT_FREQUENCY_HZ, DEFAULT_HEAP_INTERVAL,
    DEFAULT_OFF_CPU_STACK_SIZE, DEFAULT_STACK_SIZE, DEFAULT_SYSCALL_STACK_SIZE, MAX_RING_SIZE,
    MIN_RING_SIZE,
};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Sample a running process (--pid) or a command (after --) into a trace
/// that lrnprof-analyze reads, here or on another machine.
#[derive(Parser, Debug)]
#[command(name = "lrnprof-rec", version, about)]
#[command(
    override_usage = "lrnprof-rec --pid PID [OPTIONS]\n       lrnprof-rec [OPTIONS] -- CMD [ARGS]...\n       lrnprof-rec --all [--duration SECS] [OPTIONS]"
)]
struct Args {
    /// Attach to this running process (and the threads and children it creates);
    /// a thread id stands for its process.
    #[arg(long, conflicts_with = "command")]
    pid: Option<u32>,

    /// Record every process on the machine (Linux; needs root, CAP_PERFMON
    /// or kernel.perf_event_paranoid 0), until --duration or Ctrl-C.
    #[arg(long, conflicts_with_all = ["pid", "command"])]
    all: bool,

    /// Also sample kernel code: kernel frames at the leaf end of each
    /// stack, named offline from the kernel symbols embedded in the trace
    /// (Linux; needs kernel.perf_event_paranoid 1 or lower, or root).
    #[arg(long)]
    kernel: bool,

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

    /// Memory of each CPU's ring buffer, which the kernel writes samples
    /// into (Linux): rounded down to a power of two, 32K to 1G.
    /// Suffixes K, M, G. Stack copies are limited so that a ring holds 32
    /// samples [default: 16M as root, else what
    /// kernel.perf_event_mlock_kb allows]
    #[arg(long, value_name = "BYTES", value_parser = parse_ring_size)]
    ring_size: Option<u64>,

    /// Also record the kernel's frame-pointer callchain of each CPU sample
    /// and switch-out, so stacks deeper than the stack copy can still be
    /// followed (syscalls: --syscall-callchain).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    callchain: String,

    /// What to embed of each image the samples touched, so the trace can be
    /// analyzed where the binaries do not exist: none, unwind (unwind
    /// tables), symbols (unwind tables and symbol tables) or debug (also
    /// DWARF, for file:line and inline frames).
    #[arg(long, default_value = "symbols", value_parser = clap::value_parser!(EmbedLevel))]
    embed: EmbedLevel,

    /// Where to keep what each image's addresses resolved to (by build
    /// id), so later recordings of the same programs resolve only new
    /// addresses and finish sooner (Linux) [default: $XDG_CACHE_HOME/lrnprof
    /// or ~/.cache/lrnprof]
    #[arg(long, value_name = "DIR", env = "LRNPROF_CACHE_DIR")]
    cache_dir: Option<PathBuf>,

    /// Neither read nor write the cache: resolve every address anew
    /// (wins over --cache-dir and LRNPROF_CACHE_DIR).
    #[arg(long)]
    no_cache: bool,

    /// Do not take CPU samples (record only --heap, --syscalls and/or
    /// --off-cpu).
    #[arg(long)]
    no_cpu: bool,

    /// Trace every system call of the target's threads (Linux, through the
    /// kernel's tracepoints; needs root or CAP_PERFMON): number, arguments,
    /// return value, duration, and the stack at entry.
    #[arg(long)]
    syscalls: bool,

    /// Trace only these syscalls: names and classes, comma-separated
    /// (write,openat,%network; classes file, network, process, memory,
    /// signal, ipc). Implies --syscalls.
    #[arg(long, value_name = "LIST")]
    syscall_filter: Vec<String>,

    /// Most bytes of user stack copied at each syscall's entry (0: none,
    /// registers and the frame-pointer callchain only).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_SYSCALL_STACK_SIZE)]
    syscall_stack_size: u32,

    /// Also take the kernel's frame-pointer callchain at each syscall entry
    /// (stacks deeper than the copy, in code with frame pointers; costs
    /// about a third more per call).
    #[arg(long)]
    syscall_callchain: bool,

    /// Record a syscall's stack (and arguments, return value and duration
    /// as a sample) at one call in N per thread and syscall, the first
    /// included; counts, errors and durations stay exact for every call,
    /// counted in the kernel by a small BPF program (needs root or CAP_BPF
    /// and CAP_PERFMON). Call sites are then estimated from the samples.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    syscall_stack_every: u32,

    /// Record off-CPU time (Linux; needs root or CAP_PERFMON): the stack
    /// at each switch-out of a target thread and how long until it runs again.
    #[arg(long)]
    off_cpu: bool,

    /// Most bytes of user stack copied at each switch-out.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_OFF_CPU_STACK_SIZE)]
    off_cpu_stack_size: u32,

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
            terminal::say(&format!("lrnprof-rec: error: {e}"));
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode> {
    let target = match (args.pid, args.command.is_empty()) {
        _ if args.all => TargetSpec::System,
        (Some(pid), _) => TargetSpec::Pid(pid),
        (None, false) => TargetSpec::Command(args.command),
        (None, true) => {
            anyhow::bail!("give --pid PID or a command after -- (or --all), see --help")
        }
    };
    let duration = match args.duration {
        Some(d) if !(d.is_finite() && d > 0.0) => {
            anyhow::bail!("--duration must be a positive number of seconds, got {d}")
        }
        Some(d) => Some(Duration::try_from_secs_f64(d).map_err(|_| {
            anyhow::anyhow!("--duration {d:e} is too long; leave it out to record until the end")
        })?),
        None => None,
    };
    let launched = matches!(target, TargetSpec::Command(_));
    let options = RecordOptions {
        target,
        out: args.out,
        frequency_hz: args.freq,
        event: args.event,
        heap: args.heap.then_some(HeapOptions {
            mean_interval: args.heap_rate,
        }),
        duration,
        stack_size: args.stack_size,
        ring_size: args.ring_size,
        kernel_callchain: args.callchain == "on",
        kernel: args.kernel,
        embed: args.embed,
        cache_dir: if args.no_cache {
            None
        } else {
            args.cache_dir.or_else(FrameCache::default_root)
        },
        cpu: !args.no_cpu,
        syscalls: (args.syscalls || !args.syscall_filter.is_empty()).then_some(SyscallOptions {
            filter: args.syscall_filter,
            stack_size: args.syscall_stack_size,
            callchain: args.syscall_callchain,
            stack_every: args.syscall_stack_every,
        }),
        off_cpu: args.off_cpu.then_some(OffCpuOptions {
            stack_size: args.off_cpu_stack_size,
        }),
    };
    if cfg!(target_os = "linux") {
        raise_open_file_limit();
    }
    let token = StopToken::new();
    let terminal = terminal::Terminal::start(std::io::stderr().is_terminal());
    signals::handle_with(token.clone(), launched, terminal.lines())
        .map_err(|e| anyhow::anyhow!("cannot catch Ctrl-C and SIGTERM: {e}"))?;
    let recorded = record(&options, &token, &terminal);
    // The status line is cleared before the summary or the error.
    drop(terminal);
    let summary = recorded?;
    terminal::say(&summary.to_string());
    if let Some(cpu) = own_cpu() {
        terminal::say(&cpu_line(cpu, summary.cpu_while_recording, summary.samples));
    }
    if summary.samples > 0 {
        terminal::say(&format!(
            "lrnprof-rec: to see the profile: {}",
            view_command(&summary.out, has_display())
        ));
    }
    Ok(match summary.target_exit {
        Some(exit) => ExitCode::from(exit.shell_code().clamp(0, 255) as u8),
        None => ExitCode::SUCCESS,
    })
}

/// What recording cost the recorder itself, start and end included, and,
/// where known, how much of it the recording took (the per-sample cost)
/// and how much finishing the trace after it (naming code addresses and
/// embedding image data, which a large program's images make long).
fn cpu_line(cpu: Duration, while_recording: Option<Duration>, samples: u64) -> String {
    let per_sample = |cpu: Duration| {
        format!(
            "{:.1} µs per sample",
            cpu.as_secs_f64() * 1e6 / samples as f64
        )
    };
    let total = cpu.as_secs_f64();
    match while_recording.filter(|&w| w <= cpu) {
        _ if samples == 0 => format!("lrnprof-rec: recorder CPU {total:.3} s"),
        None => format!("lrnprof-rec: recorder CPU {total:.3} s, {}", per_sample(cpu)),
        Some(during) => format!(
            "lrnprof-rec: recorder CPU {total:.3} s: {:.3} s while recording ({}), {:.3} s after it, \
             naming code and embedding image data",
            during.as_secs_f64(),
            per_sample(during),
            (cpu - during).as_secs_f64()
        ),
    }
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

fn parse_ring_size(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if bytes < MIN_RING_SIZE {
        return Err(format!(
            "{s:?} is smaller than the smallest ring buffer, {}K (e.g. 1M, 16M)",
            MIN_RING_SIZE >> 10
        ));
    }
    if bytes > MAX_RING_SIZE {
        return Err(format!(
            "{s:?} is larger than the largest ring buffer, {}G per CPU (e.g. 16M, 64M)",
            MAX_RING_SIZE >> 30
        ));
    }
    Ok(bytes)
}

/// The one command that shows a profile of `trace`: its flame graph in the
/// browser where there is a display, else (a server, over ssh) the table
/// of its hottest functions in the terminal.
fn view_command(trace: &Path, display: bool) -> String {
    let trace = shell_quote(&trace.display().to_string());
    if display {
        format!("lrnprof-analyze {trace} --format svg --open")
    } else {
        format!("lrnprof-analyze top {trace}")
    }
}

/// Whether a browser can be shown: a graphical session on Linux, a Mac
/// not reached over ssh.
fn has_display() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if cfg!(target_os = "macos") {
        !set("SSH_CONNECTION")
    } else {
        set("DISPLAY") || set("WAYLAND_DISPLAY")
    }
}

/// `s` as one word for a POSIX shell.
fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./-+:,@%=".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
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
    fn the_recorder_cpu_line_gives_time_per_sample() {
        assert_eq!(
            cpu_line(Duration::from_millis(650), None, 25_000),
            "lrnprof-rec: recorder CPU 0.650 s, 26.0 µs per sample"
        );
        assert_eq!(
            cpu_line(Duration::from_millis(20), None, 0),
            "lrnprof-rec: recorder CPU 0.020 s"
        );
        // A large program's images: most of it after the recording.
        assert_eq!(
            cpu_line(
                Duration::from_millis(406),
                Some(Duration::from_millis(90)),
                450
            ),
            "lrnprof-rec: recorder CPU 0.406 s: 0.090 s while recording (200.0 µs per \
             sample), 0.316 s after it, naming code and embedding image data"
        );
        assert!(own_cpu().is_some());
    }

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

    #[test]
    fn ring_sizes_run_from_32k_to_1g() {
        assert_eq!(parse_ring_size("32K"), Ok(32 << 10));
        assert_eq!(parse_ring_size("4M"), Ok(4 << 20));
        let small = parse_ring_size("16K").unwrap_err();
        assert!(small.contains("32K"), "{small}");
        assert_eq!(parse_ring_size("1G"), Ok(1 << 30));
        let large = parse_ring_size("2G").unwrap_err();
        assert!(large.contains("1G"), "{large}");
        assert!(parse_ring_size("1.5M").is_err());
    }

    #[test]
    fn view_command_fits_the_machine_and_the_shell() {
        let trace = Path::new("runs/trace.lpt");
        assert_eq!(
            view_command(trace, true),
            "lrnprof-analyze runs/trace.lpt --format svg --open"
        );
        assert_eq!(
            view_command(trace, false),
            "lrnprof-analyze top runs/trace.lpt"
        );
        assert_eq!(
            view_command(Path::new("my trace's.lpt"), false),
            r"lrnprof-analyze top 'my trace'\''s.lpt'"
        );
    }
}
