//! The Linux backend: `perf_event_open` with user register and user stack
//! sampling.
//!
//! One event per (thread, online CPU) with `inherit`, so threads and
//! processes created later are followed; on each CPU every event's records
//! are redirected into one ring buffer. This thread only drains the ring
//! buffers (dropping the dead part of stack copies) and hands the bytes to
//! the writer thread, which parses, orders and writes them
//! ([`convert`]).

mod attr;
mod bpf;
mod convert;
mod events;
mod execwatch;
mod heap;
mod images;
mod kernel;
mod launch;
mod layouts;
mod pace;
mod parse;
mod procfs;
mod regs;
mod replica;
mod ring;
mod spaces;
mod sys;
mod system;
mod touched;
mod tracefs;
mod untouched;
mod urgency;

use crate::error::RecordError;
use crate::report::{RecordWarning, Reporter, StatusTicker};
use crate::sink::{OutputFile, Sink, SinkSender};
use crate::stop::{Deadline, StopReason, StopToken};
use crate::{host, CpuEvent, RecordOptions, RecordSummary, TargetExit, TargetSpec};
use attr::{AttrSettings, EventKind, EventSpec, Role};
use bpf::{CounterPlan, SyscallCounter};
use convert::{ConvertSettings, Converter, Initial, RawMsg, SystemWide};
use events::{Events, OpenError};
use heap::{Escape, HeapEvent, HeapSession};
use lrnprof_format::syscall_number;
use lrnprof_format::{
    resolve_syscall_filter, Clock, Endian, EventSettings, HeapSettings, OffCpuSettings, Os, Pid,
    SampleEvent, SampleKind, SamplingSettings, SyscallSettings, Target, Timestamp, TraceHeader,
};
use lrnprof_image::FrameCache;
pub(crate) use parse::fuzz_records;
use parse::Layouts;
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicI32;
use std::sync::Arc;
use std::time::Duration;
use tracefs::SyscallPayloads;
use urgency::Urgency;

#[cfg(target_arch = "x86_64")]
const NATIVE_REGS: regs::ArchRegs = regs::X86_64;
#[cfg(target_arch = "aarch64")]
const NATIVE_REGS: regs::ArchRegs = regs::AARCH64;

/// The ring buffer data area per CPU unless the user chooses, in pages
/// (16 MiB with 4 KiB pages: a quarter second of 1 kHz samples with 64
/// KiB stack copies).
const DEFAULT_RING_PAGES: usize = 4096;
/// Messages the writer thread may lag behind; with chunks of at most
/// [`MAX_CHUNK`] this bounds the memory in flight.
const CHANNEL_CAPACITY: usize = 32;
/// Bytes of records per message at most (one record may exceed it).
const MAX_CHUNK: usize = 1 << 20;
/// Longest wait between drains with allocation sampling: its ring is
/// polled, not waited on, and a full ring makes allocating threads wait.
/// Not shorter than [`pace::SHORT`]: every drain wakes the recorder's
/// threads, which on a busy machine run on the program's core and evict
/// its caches (at 10 ms benches' alloc_heavy was preempted 15-20% more
/// often, docs/benchmarks.md). The 2 MiB ring holds about 50 ms of that
/// program's records, the busiest allocator we measured, which never
/// waited for room at 20 ms.
const HEAP_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How often the syscall tallies are read: the time resolution of counts
/// with --syscall-stack-every above 1.
const TALLY_INTERVAL: Duration = Duration::from_secs(1);
/// Drains of the allocation sampler's ring per round at most, so a
/// program that allocates without pause cannot hold the loop.
const HEAP_DRAINS_PER_ROUND: usize = 4;
/// With allocation sampling, records are held back this much longer
/// before they are put in time order and written: a sampler's thread can
/// be descheduled between reading the clock and writing its record.
const HEAP_HOLD_NS: u64 = 200_000_000;

/// Record on Linux.
pub(crate) fn record(
    options: &RecordOptions,
    token: &StopToken,
    reporter: &dyn Reporter,
) -> Result<RecordSummary, RecordError> {
    let (frequency_hz, clamped) = attr::clamp_frequency(
        options.frequency_hz,
        procfs::read_sysctl("/proc/sys/kernel/perf_event_max_sample_rate"),
    );
    // --kernel keeps kernel frames in CPU samples and switch-outs: with
    // neither recorded it has nothing to keep.
    let kernel_frames = options.kernel && (options.cpu || options.off_cpu.is_some());
    // A thread id (as `top -H` shows) stands for its process: samples,
    // images and names are the process's.
    let whole_process;
    let options = match options.target {
        TargetSpec::Pid(tid) => match procfs::thread_group(tid) {
            Some(pid) if pid != tid => {
                reporter.warning(&RecordWarning::ThreadOfProcess {
                    tid,
                    pid,
                    name: procfs::thread_name(pid, pid),
                });
                whole_process = RecordOptions {
                    target: TargetSpec::Pid(pid),
                    ..options.clone()
                };
                &whole_process
            }
            _ => options,
        },
        _ => options,
    };
    if let TargetSpec::Pid(pid) = options.target {
        if procfs::has_exited(pid) {
            return Err(RecordError::NoSuchProcess { pid });
        }
        if !kernel_frames && procfs::is_kernel_thread(pid) {
            let name = procfs::thread_name(pid, pid).unwrap_or_default();
            return Err(RecordError::InvalidOption(format!(
                "pid {pid} ({name}) is a kernel thread, which runs no user code: add --kernel \
                 to sample its kernel stacks"
            )));
        }
    }
    // Before anything starts: a missing tracefs is reported alone.
    let mut plan = plan_events(options)?;
    // So is a kernel that refuses the syscall counting programs.
    let mut counter = match &plan.counter {
        Some(c) => Some(SyscallCounter::start(c, sys::monotonic_ns())?),
        None => None,
    };
    if clamped && options.cpu {
        reporter.warning(&RecordWarning::FrequencyClamped {
            requested_hz: options.frequency_hz,
            used_hz: frequency_hz,
        });
    }
    if options.cpu
        && options.event == CpuEvent::CpuClock
        && frequency_hz > crate::report::FAST_SOFTWARE_CLOCK_HZ
    {
        reporter.warning(&RecordWarning::FastSoftwareClock { hz: frequency_hz });
    }
    let asked = [
        ("--stack-size", Some(options.stack_size)),
        (
            "--off-cpu-stack-size",
            options.off_cpu.as_ref().map(|o| o.stack_size),
        ),
        (
            "--syscall-stack-size",
            options.syscalls.as_ref().map(|s| s.stack_size),
        ),
    ];
    for (option, requested) in asked {
        if let Some(requested) = requested.filter(|&r| r > attr::MAX_STACK_SIZE) {
            reporter.warning(&RecordWarning::StackSizeCapped {
                option,
                requested,
                used: attr::MAX_STACK_SIZE,
            });
        }
    }
    let out = OutputFile::create(&options.out)?;
    // Requests on the token interrupt the wait for samples.
    let wake = Arc::new(sys::eventfd()?);
    let waker = Arc::clone(&wake);
    let _wake_guard = token.wake_with(Arc::new(move || sys::eventfd_add(&waker)));
    let deadline = Deadline::start(options.duration);
    let system = options.target == TargetSpec::System;
    let page_size = host::page_size() as usize;
    // Allocation samples copy as much stack as CPU samples (their copies
    // go through the sampler's ring, but one limit keeps both alike).
    let heap_stack = match options.heap {
        Some(_) => attr::valid_stack_size(options.stack_size),
        None => 0,
    };
    let largest_stack = plan
        .specs
        .iter()
        .map(|s| s.stack_size)
        .chain([heap_stack])
        .max()
        .unwrap_or(0);
    let ring = attr::plan_ring(
        page_size,
        DEFAULT_RING_PAGES,
        options.ring_size,
        sys::geteuid() == 0,
        procfs::read_sysctl("/proc/sys/kernel/perf_event_mlock_kb"),
        largest_stack,
    );
    for spec in &mut plan.specs {
        spec.stack_size = spec.stack_size.min(ring.stack_size);
    }
    let heap_stack = heap_stack.min(ring.stack_size);
    let mut heap = match &options.heap {
        Some(h) => Some(HeapSession::new(h, heap_stack)?),
        None => None,
    };
    let extras = match &heap {
        Some(h) => launch::Extras {
            env: h.environment(std::env::var_os("LD_PRELOAD")),
            inherit_fd: Some(h.fd()),
        },
        None => launch::Extras::default(),
    };
    let mut launched = match &options.target {
        TargetSpec::Command(cmd) => Some(launch::spawn_waiting(cmd, &extras)?),
        TargetSpec::Pid(_) | TargetSpec::System => None,
    };
    // Why the program's allocations may escape the sampler, said before it runs.
    let escape = match (&heap, &launched) {
        (Some(_), Some(l)) => heap::check_program(&l.path).map(|e| (l.path.clone(), e)),
        _ => None,
    };
    // Raised before attaching (opening events for thousands of busy
    // threads must not wait for CPU) but after the fork, so a launched
    // command keeps its normal priority; lowered once the rings keep up.
    let writer_thread = Arc::new(AtomicI32::new(0));
    // System-wide the recorder shares every CPU with busy programs; its
    // threads stay raised there (at normal priority the programs measured
    // slower: docs/benchmarks.md, "Re-run after the recorder's threads
    // became adaptive").
    let mut urgency = Urgency::new(Arc::clone(&writer_thread), system);
    // The process recorded (`None`: every process).
    let pid = match (&options.target, &launched) {
        (_, Some(l)) => Some(l.pid),
        (TargetSpec::Pid(p), None) => Some(*p),
        (TargetSpec::System, None) => None,
        (TargetSpec::Command(_), None) => unreachable!("launched above"),
    };
    let settings = AttrSettings {
        event: match options.event {
            CpuEvent::CpuClock => EventKind::CpuClock,
            CpuEvent::Cycles => EventKind::Cycles,
        },
        frequency_hz,
        enable_on_exec: launched.is_some(),
        build_id: true,
        regs_mask: NATIVE_REGS.mask,
        wakeup_bytes: ring.wakeup_bytes(page_size),
        system,
        kernel: kernel_frames,
    };
    let mut events = match pid {
        Some(pid) => open_first(pid, settings, &plan.specs, page_size, ring.pages)?,
        None => system::open(settings, &plan.specs, page_size, ring.pages)?,
    };
    // Before any event is enabled: the existing threads and images are
    // recorded at this time, and every sample must come after them.
    let start_time = sys::monotonic_ns();
    if launched.is_none() {
        if let Some(pid) = pid {
            attach_all_threads(&mut events, pid)?;
        }
        for fd in events.switch_order(true) {
            sys::perf_enable(fd).map_err(|e| RecordError::Sys {
                what: "enabling the sampling events".into(),
                source: e,
            })?;
        }
    }
    // Only now, so a startup error stays the only thing reported.
    if ring.stack_limited {
        reporter.warning(&RecordWarning::StackSizeLimited {
            bytes: ring.stack_size,
            ring_bytes: (ring.pages * page_size) as u64,
            chosen: ring.bound == attr::RingBound::Chosen,
        });
    }
    if let Some((program, escape)) = &escape {
        reporter.warning(&RecordWarning::HeapNotSampled {
            program: program.display().to_string(),
            reason: escape.reason(),
        });
    }
    if settings.kernel && kernel::addresses_hidden() {
        reporter.warning(&kernel::hidden_warning());
    }
    if let (Some(counter), Some(pid)) = (&counter, pid) {
        counter.add_target(pid, launched.is_some())?;
    }
    if let Some(l) = launched.as_mut() {
        l.release()?;
    }
    let stack_of = |role| {
        plan.specs
            .iter()
            .find(|s| s.role == role)
            .map_or(0, |s| s.stack_size)
    };
    let header = TraceHeader {
        arch: NATIVE_REGS.arch,
        os: Os::Linux,
        endian: Endian::Little,
        pointer_size: 8,
        page_size: page_size as u32,
        clock: Clock::Monotonic,
        sampling: SamplingSettings {
            event: match settings.event {
                EventKind::Cycles => SampleEvent::Cycles,
                EventKind::CpuClock => SampleEvent::CpuClock,
            },
            frequency_hz,
            // The CPU samples' copy, or with --no-cpu the allocations'.
            stack_size: stack_of(Role::Cpu).max(heap_stack),
            kernel_callchain: options.cpu && options.kernel_callchain,
            include_kernel: settings.kernel,
        },
        recorder: host::RECORDER_NAME.to_string(),
        start_wall_ns: host::wall_clock_ns(),
        start_time: Timestamp(start_time),
        target: match &options.target {
            TargetSpec::Pid(p) => Target::Attach {
                pids: vec![Pid(*p)],
            },
            TargetSpec::Command(c) => Target::Launch {
                command: c.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
                pid: Pid(pid.unwrap_or_default()),
            },
            TargetSpec::System => Target::System,
        },
        hostname: host::hostname(),
        events: EventSettings {
            cpu: options.cpu,
            heap: options.heap.map(|h| HeapSettings {
                mean_interval: h.mean_interval,
            }),
            syscalls: plan.syscalls.map(|s| SyscallSettings {
                stack_size: stack_of(Role::SyscallEnter),
                ..s
            }),
            off_cpu: options.off_cpu.as_ref().map(|_| OffCpuSettings {
                stack_size: stack_of(Role::Switch),
            }),
        },
    };
    let sample_kind = match settings.event {
        EventKind::Cycles => SampleKind::Cycles,
        EventKind::CpuClock => SampleKind::CpuTime,
    };
    let layouts = events.layouts().clone();
    let mut converter = Converter::new(ConvertSettings {
        layouts: layouts.clone(),
        regs: NATIVE_REGS,
        sample_kind,
        payloads: plan.payloads,
        embed: options.embed,
        stack_sizes: plan.specs.iter().map(|s| (s.role, s.stack_size)).collect(),
        page_size: page_size as u64,
    });
    if options
        .syscalls
        .as_ref()
        .is_some_and(|sc| !sc.filter.is_empty())
    {
        converter = converter.with_syscall_filter();
    }
    if heap.is_some() {
        let explained = matches!(
            escape,
            Some((
                _,
                Escape::StaticallyLinked | Escape::ThirtyTwoBit | Escape::OwnMalloc
            ))
        );
        converter = converter.with_heap(explained);
    }
    converter = converter.with_frame_cache(options.cache_dir.as_deref().map(FrameCache::new));
    let pace = pace::Pace::waking(Arc::clone(&wake));
    // Short waits from the start: the writer sees the threads only later.
    pace.hurry(sys::monotonic_ns());
    converter = converter.with_pace(pace.clone());
    if system || settings.kernel {
        converter = converter.with_system(SystemWide::new(std::process::id(), settings.kernel));
    }
    // Best effort: without the kernel's process events (no CAP_NET_ADMIN,
    // no connector), command lines are read from /proc when an exec is
    // handled, as before.
    if let Ok(watch) = execwatch::ExecWatch::start(pid) {
        converter = converter.with_exec_watch(watch);
    }
    let chunk_pool = ring::ChunkPool::default();
    let keeper = RefCell::new(ring::Keeper::new(NATIVE_REGS.sp_index));
    converter = converter
        .with_chunk_pool(chunk_pool.clone())
        .with_writer_thread(writer_thread);
    let sink = Sink::start(out, &header, converter, CHANNEL_CAPACITY)?;
    let sender = sink.sender();
    let command = match &header.target {
        Target::Launch { command, .. } => Some(command.clone()),
        Target::Attach { .. } | Target::System => None,
    };
    let sent = match pid {
        Some(pid) => sender.send(RawMsg::Initial(Initial {
            time: start_time,
            pid,
            tids: events.tids(),
            launched: command,
        })),
        None => system::send_existing(&sender, start_time),
    };
    let mut control = Control {
        token,
        deadline: &deadline,
        wake: &wake,
        ticker: StatusTicker::new(sink.stats(), deadline.started()),
        reporter,
        counter: counter.as_mut(),
        urgency: &mut urgency,
        pace: &pace,
    };
    let outcome = sent.and_then(|()| {
        sample_loop(
            &mut events,
            &layouts,
            Outlet {
                sender: &sender,
                pool: &chunk_pool,
                keeper: &keeper,
            },
            &mut control,
            heap.as_mut(),
            pid,
            launched.as_ref().map(|l| l.pid),
        )
    });
    drop(control);
    // The last counts before sampling stops: calls sampled after them are
    // counted from their samples.
    let tallied = match counter.as_mut() {
        Some(c) => send_tallies(c, &sender),
        None => Ok(()),
    };
    let closing = counter.map(SyscallCounter::close);
    // Stop sampling before the last drain, so nothing is cut in half.
    for fd in events.switch_order(false) {
        let _ = sys::perf_disable(fd);
    }
    if let Some(h) = &heap {
        h.stop();
    }
    let outlet = Outlet {
        sender: &sender,
        pool: &chunk_pool,
        keeper: &keeper,
    };
    let drained = drain_all(&mut events, &layouts, &outlet, heap.as_mut(), true);
    drop(urgency);
    let end = sys::monotonic_ns();
    // How long sampling ran: not the finishing of the trace after it.
    let duration = deadline.started().elapsed();
    drop(sender);
    // A failed writer (disk full) is the root cause of any sending error.
    let totals = sink.finish(Timestamp(end))?;
    for warning in &totals.warnings {
        reporter.warning(warning);
    }
    if let Some(closing) = closing {
        // Closing file descriptors does not fail in a way to report.
        let _ = closing.join();
    }
    let (reason, target_exit) = outcome?;
    tallied?;
    drained?;
    let mut summary = RecordSummary::new(&options.out, &totals, duration, reason, target_exit);
    summary.syscall_stack_every_call = options
        .syscalls
        .as_ref()
        .is_some_and(|s| s.stack_every <= 1);
    Ok(summary)
}

/// The events a recording opens, before the ring buffers are planned.
struct EventPlan {
    /// The first one tracks the target (mmap, comm, fork and exit records).
    specs: Vec<EventSpec>,
    /// What the header says of the syscalls (its stack size is the
    /// requested one, which the ring plan may lower).
    syscalls: Option<SyscallSettings>,
    /// Where the syscall tracepoints keep number, arguments and return.
    payloads: Option<SyscallPayloads>,
    /// With a stack at one call in N: the kernel programs that count.
    counter: Option<CounterPlan>,
}

/// The events `options` ask for. Syscalls need the tracepoints' ids and
/// payload layouts from tracefs, and the filter's names resolved.
fn plan_events(options: &RecordOptions) -> Result<EventPlan, RecordError> {
    let mut specs = Vec::new();
    if options.cpu {
        specs.push(EventSpec {
            // Kernel frames come in the callchain.
            callchain: options.kernel_callchain || options.kernel,
            ..EventSpec::new(Role::Cpu, options.stack_size)
        });
    }
    let mut syscalls = None;
    let mut payloads = None;
    let mut counter = None;
    if let Some(sc) = &options.syscalls {
        let numbers =
            resolve_syscall_filter(NATIVE_REGS.arch, sc.filter.iter().map(|s| s.as_str()))
                .map_err(|e| RecordError::InvalidOption(format!("--syscall-filter: {e}")))?;
        if numbers.is_empty() && !sc.filter.is_empty() {
            return Err(RecordError::InvalidOption(
                "--syscall-filter names no syscall of this architecture".into(),
            ));
        }
        let root = tracefs::find()?;
        let enter = tracefs::tracepoint(&root, "raw_syscalls", "sys_enter")?;
        let exit = tracefs::tracepoint(&root, "raw_syscalls", "sys_exit")?;
        payloads = Some(
            SyscallPayloads::from_fields(&enter.fields, &exit.fields).ok_or_else(|| {
                RecordError::Tracing(
                    "the raw_syscalls tracepoints lay out their data in a way this recorder \
                     does not know (no 8-byte id, args or ret field)"
                        .into(),
                )
            })?,
        );
        let filter = attr::syscall_filter(&numbers);
        if sc.stack_every > 1 {
            let number = |name| syscall_number(NATIVE_REGS.arch, name).unwrap_or(u32::MAX);
            counter = Some(CounterPlan {
                enter: enter.clone(),
                exit: exit.clone(),
                fork: tracefs::tracepoint(&root, "sched", "sched_process_fork")?,
                every: sc.stack_every,
                execve: [number("execve"), number("execveat")],
                filter: numbers.clone(),
            });
        }
        specs.push(EventSpec {
            tracepoint: enter.id,
            filter: filter.clone(),
            callchain: sc.callchain,
            ..EventSpec::new(Role::SyscallEnter, sc.stack_size)
        });
        specs.push(EventSpec {
            tracepoint: exit.id,
            filter,
            ..EventSpec::new(Role::SyscallExit, 0)
        });
        syscalls = Some(SyscallSettings {
            filter: numbers,
            stack_size: attr::valid_stack_size(sc.stack_size),
            stack_every: sc.stack_every,
        });
    }
    if let Some(off) = &options.off_cpu {
        specs.push(EventSpec {
            callchain: options.kernel_callchain || options.kernel,
            ..EventSpec::new(Role::Switch, off.stack_size)
        });
    }
    if specs.is_empty() {
        // Allocations only (`--heap --no-cpu`): an event that never samples
        // still follows the threads, processes and images they need.
        specs.push(EventSpec::new(Role::Tracking, 0));
    }
    if let Some(first) = specs.first_mut() {
        first.tracking = true;
    }
    Ok(EventPlan {
        specs,
        syscalls,
        payloads,
        counter,
    })
}

/// Open the first thread's events, falling back from build-id MMAP2
/// records to plain ones. The first thread is the main one, or, once that
/// has ended (`pthread_exit`) while others run, the first of the others
/// that is still there.
fn open_first(
    pid: u32,
    settings: AttrSettings,
    specs: &[EventSpec],
    page_size: usize,
    ring_pages: usize,
) -> Result<Events, RecordError> {
    let others = || {
        procfs::list_tasks(pid)
            .unwrap_or_default()
            .into_iter()
            .filter(move |&tid| tid != pid)
    };
    for tid in std::iter::once(pid).chain(others()) {
        match open_first_thread(pid, tid, settings, specs, page_size, ring_pages) {
            Err(RecordError::NoSuchProcess { .. }) => continue,
            opened => return opened,
        }
    }
    Err(RecordError::NoSuchProcess { pid })
}

/// [`open_first`] on thread `tid` of process `pid`.
fn open_first_thread(
    pid: u32,
    tid: u32,
    settings: AttrSettings,
    specs: &[EventSpec],
    page_size: usize,
    ring_pages: usize,
) -> Result<Events, RecordError> {
    let open = |events: &mut Events| events.open_thread(tid);
    open_events(settings, specs, page_size, ring_pages, open, |e| {
        match e.error.raw_os_error() {
            Some(libc::ESRCH) => Some(RecordError::NoSuchProcess { pid }),
            Some(libc::EACCES | libc::EPERM) if settings.kernel && e.role == Role::Cpu => {
                Some(system::denied(false))
            }
            Some(libc::EACCES | libc::EPERM) => Some(permission_denied(e.role, pid)),
            _ => None,
        }
    })
}

/// Events of `specs` on every online CPU, opened by `open`. Build-id
/// MMAP2 records need Linux 5.12: older kernels get plain ones. An error
/// that `fatal` turns into the recorder's error is not retried.
fn open_events(
    settings: AttrSettings,
    specs: &[EventSpec],
    page_size: usize,
    ring_pages: usize,
    open: impl Fn(&mut Events) -> Result<(), OpenError>,
    fatal: impl Fn(&OpenError) -> Option<RecordError>,
) -> Result<Events, RecordError> {
    let cpus = procfs::online_cpus(sys::cpu_count());
    let mut last_err = None;
    for build_id in [true, false] {
        let s = AttrSettings {
            build_id,
            ..settings
        };
        let mut events = Events::new(s, specs, cpus.clone(), ring_pages, page_size);
        match open(&mut events) {
            Ok(()) => return Ok(events),
            Err(e) => match fatal(&e) {
                Some(error) => return Err(error),
                None => last_err = Some(e),
            },
        }
    }
    Err(open_failure(settings, last_err))
}

/// The error for events that would not open for a reason other than
/// permissions or a missing process.
fn open_failure(settings: AttrSettings, last_err: Option<OpenError>) -> RecordError {
    let OpenError { role, error: e } = last_err.unwrap_or(OpenError {
        role: Role::Cpu,
        error: io::Error::from_raw_os_error(libc::ENOSYS),
    });
    match role {
        Role::Cpu => RecordError::Unsupported(match settings.event {
            EventKind::Cycles => format!(
                "the hardware cycle counter cannot be sampled here ({e}); virtual machines often \
                 do not expose it: record with --event cpu-clock"
            ),
            EventKind::CpuClock => format!(
                "perf_event_open failed for the cpu-clock event ({e}); the kernel needs \
                 CONFIG_PERF_EVENTS, and containers must allow the perf_event_open syscall"
            ),
        }),
        Role::SyscallEnter | Role::SyscallExit => RecordError::Tracing(format!(
            "the kernel refused a raw_syscalls tracepoint event ({e}); it needs \
             CONFIG_FTRACE_SYSCALLS and a perf_event_open that allows tracepoints"
        )),
        Role::Tracking => RecordError::Unsupported(format!(
            "perf_event_open failed for the event that follows threads and images ({e}); the \
             kernel needs CONFIG_PERF_EVENTS, and containers must allow the perf_event_open syscall"
        )),
        Role::Switch => RecordError::Unsupported(format!(
            "the context-switch event cannot be opened ({e}); off-CPU recording needs Linux 4.3 \
             or later"
        )),
    }
}

fn permission_denied(role: Role, pid: u32) -> RecordError {
    RecordError::PermissionDenied {
        pid,
        advice: attr::permission_advice(
            role,
            procfs::read_sysctl("/proc/sys/kernel/perf_event_paranoid"),
            sys::geteuid(),
            procfs::owner_uid(pid),
        ),
    }
}

/// Attach to every thread of `pid`, rescanning until no new thread shows
/// up (threads created after their creator was attached are inherited).
fn attach_all_threads(events: &mut Events, pid: u32) -> Result<(), RecordError> {
    for _ in 0..100 {
        let tids = procfs::list_tasks(pid).map_err(|_| RecordError::NoSuchProcess { pid })?;
        let new: Vec<u32> = tids
            .into_iter()
            .filter(|&t| !events.has_thread(t))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        for tid in new {
            match events.open_thread(tid) {
                Ok(()) => {}
                // The thread exited meanwhile.
                Err(e) if e.error.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) if e.error.raw_os_error() == Some(libc::EMFILE) => {
                    return Err(RecordError::Unsupported(format!(
                        "too many threads to attach to ({} so far, one file per thread, CPU and \
                         event): raise the open-file limit (ulimit -n)",
                        events.tids().len()
                    )))
                }
                Err(e) if matches!(e.error.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                    return Err(permission_denied(e.role, pid))
                }
                Err(e) => {
                    return Err(RecordError::Sys {
                        what: format!("perf_event_open for thread {tid}"),
                        source: e.error,
                    })
                }
            }
        }
    }
    Ok(())
}

/// Where drained records go: the writer thread, and the chunk buffers it
/// hands back; with what the draining thread keeps of each thread's stack
/// copies, to send only what changed.
#[derive(Clone, Copy)]
struct Outlet<'a> {
    sender: &'a SinkSender<RawMsg>,
    pool: &'a ring::ChunkPool,
    keeper: &'a RefCell<ring::Keeper>,
}

/// What a drain found.
struct Drained {
    /// A ring was more full than it should be between drains (see
    /// `urgency`).
    behind: bool,
    /// How full the fullest kernel ring was, 0 to 1.
    fullest: f64,
}

/// Drain every ring buffer once, and the allocation sampler's ring;
/// `last`: the recording is over.
fn drain_all(
    events: &mut Events,
    layouts: &Layouts,
    outlet: &Outlet<'_>,
    heap: Option<&mut HeapSession>,
    last: bool,
) -> Result<Drained, RecordError> {
    let Outlet {
        sender,
        pool,
        keeper,
    } = *outlet;
    let mut keeper = keeper.borrow_mut();
    let round = sys::monotonic_ns();
    let mut behind = false;
    let mut fullest: f64 = 0.0;
    // Records are compacted straight from the ring into chunks of about
    // MAX_CHUNK bytes: each live byte is copied once here.
    let mut wrapped = Vec::new();
    let mut chunk = ring::Chunk::default();
    let mut sent = Ok(());
    for ring in events.rings() {
        // Room for what is there (stack copies before compaction: more
        // than enough), or one chunk.
        let pending = ring.pending();
        let size = ring.data_size();
        behind |= urgency::behind(pending, size, urgency::kernel_ring_fraction(size));
        fullest = fullest.max(pending as f64 / size.max(1) as f64);
        let room = pending.min(MAX_CHUNK);
        ring.drain_records(&mut wrapped, |rec| {
            if chunk.bytes.capacity() == 0 {
                chunk.bytes = pool.take(room + rec.len());
            }
            chunk.push_record(layouts, rec, pool, Some(&mut keeper));
            if chunk.len() >= MAX_CHUNK && sent.is_ok() {
                sent = sender.send(RawMsg::Chunk(std::mem::take(&mut chunk)));
            }
        });
        std::mem::replace(&mut sent, Ok(()))?;
        if !chunk.is_empty() {
            sender.send(RawMsg::Chunk(std::mem::take(&mut chunk)))?;
        }
    }
    let mut round = Some(round);
    if let Some(heap) = heap {
        behind |= heap.behind();
        round = round.map(|r| r.saturating_sub(HEAP_HOLD_NS));
        let mut more = true;
        for _ in 0..HEAP_DRAINS_PER_ROUND {
            let mut batch: Vec<HeapEvent> = Vec::new();
            more = heap.drain(&mut batch, sys::monotonic_ns(), last);
            if !batch.is_empty() {
                sender.send(RawMsg::Heap(batch))?;
            }
            if !more {
                break;
            }
        }
        if more {
            // Older records may still be in the ring: nothing is done yet.
            round = None;
        }
    }
    if let Some(round) = round {
        sender.send(RawMsg::Round(round))?;
    }
    Ok(Drained { behind, fullest })
}

/// Read what the syscall counting programs counted and send it to the
/// writer. After a drain: the tallies' time is later than its round.
fn send_tallies(
    counter: &mut SyscallCounter,
    sender: &SinkSender<RawMsg>,
) -> Result<(), RecordError> {
    let tallies = counter.read(sys::monotonic_ns())?;
    if tallies.is_empty() {
        return Ok(());
    }
    sender.send(RawMsg::Tallies(tallies))
}

fn decode_wait_status(status: i32) -> TargetExit {
    if libc::WIFSIGNALED(status) {
        TargetExit::Signal(libc::WTERMSIG(status))
    } else {
        TargetExit::Code(libc::WEXITSTATUS(status))
    }
}

/// What the sampling loop answers to besides the target: the caller's
/// token, the duration, and the status reports.
struct Control<'a> {
    token: &'a StopToken,
    deadline: &'a Deadline,
    /// Readable when the token has a new request.
    wake: &'a OwnedFd,
    ticker: StatusTicker,
    reporter: &'a dyn Reporter,
    /// With a stack at one call in N: the kernel's counts, read every
    /// [`TALLY_INTERVAL`].
    counter: Option<&'a mut SyscallCounter>,
    /// The recorder's threads' priority, raised while the rings fill.
    urgency: &'a mut Urgency,
    /// How long to wait between drains.
    pace: &'a pace::Pace,
}

/// How the sampling loop learns that an attached process has ended.
struct TargetEnd {
    pid: u32,
    /// The process's pidfd, and its index among the polled descriptors.
    pidfd: Option<(OwnedFd, usize)>,
    /// The pidfd polled readable.
    ended: bool,
    /// Without a pidfd: when `/proc` was last read.
    checked_at: Option<std::time::Instant>,
}

impl TargetEnd {
    /// Note whether `ready`, what poll said of the descriptors from index
    /// `first` on, has the pidfd readable.
    fn saw(&mut self, ready: &[(usize, bool)], first: usize) {
        if let Some(&(_, index)) = self.pidfd.as_ref() {
            self.ended |= ready.iter().any(|&(i, _)| i + first == index);
        }
    }

    fn has_ended(&mut self) -> bool {
        if self.pidfd.is_some() {
            return self.ended;
        }
        if self.checked_at.is_some_and(|at| at.elapsed() < pace::SHORT) {
            return false;
        }
        self.checked_at = Some(std::time::Instant::now());
        procfs::has_exited(self.pid)
    }
}

/// Drain until a stop condition; returns why and how a launched child ended.
fn sample_loop(
    events: &mut Events,
    layouts: &Layouts,
    outlet: Outlet<'_>,
    control: &mut Control<'_>,
    mut heap: Option<&mut HeapSession>,
    pid: Option<u32>,
    child: Option<u32>,
) -> Result<(StopReason, Option<TargetExit>), RecordError> {
    let mut tallied_at = std::time::Instant::now();
    let sender = outlet.sender;
    let mut fds: Vec<i32> = events.ring_fds().map(|fd| fd.as_raw_fd()).collect();
    let ring_count = fds.len();
    let wake_index = ring_count;
    fds.push(control.wake.as_raw_fd());
    // An attached process's end: polled with the rings where the kernel
    // offers it, so that no round has to read `/proc` (about 8 µs for a
    // busy process); else `/proc` once per short interval.
    let mut target = pid.filter(|_| child.is_none()).map(|pid| {
        let pidfd = sys::pidfd_open(pid).ok().map(|fd| {
            fds.push(fd.as_raw_fd());
            (fd, fds.len() - 1)
        });
        TargetEnd {
            pid,
            pidfd,
            ended: false,
            checked_at: None,
        }
    });
    // A launched command's end wakes the loop too (it is reaped below).
    let child_fd = child.and_then(|child| sys::pidfd_open(child).ok());
    if let Some(fd) = &child_fd {
        fds.push(fd.as_raw_fd());
    }
    // The longest wait asked for before the last drain.
    let mut waited = pace::SHORT;
    let mut drained_at = std::time::Instant::now();
    loop {
        let drained = drain_all(events, layouts, &outlet, heap.as_deref_mut(), false)?;
        control.urgency.drained(drained.behind, waited);
        let since = drained_at.elapsed();
        drained_at = std::time::Instant::now();
        if let Some(c) = control.counter.as_deref_mut() {
            if tallied_at.elapsed() >= TALLY_INTERVAL {
                tallied_at = std::time::Instant::now();
                send_tallies(c, sender)?;
            }
        }
        control.ticker.tick(control.reporter);
        if let Some(child) = child {
            if let Some(status) = sys::try_wait(child).map_err(|e| RecordError::Sys {
                what: "waitpid".into(),
                source: e,
            })? {
                let exit = decode_wait_status(status);
                sender.send(RawMsg::Exited {
                    pid: child,
                    time: sys::monotonic_ns(),
                    code: exit.shell_code(),
                })?;
                return Ok((StopReason::TargetExited, Some(exit)));
            }
        } else if target.as_mut().is_some_and(TargetEnd::has_ended) {
            return Ok((StopReason::TargetExited, None));
        }
        let (request, signals) = control.token.take();
        if let Some(child) = child {
            // Not reaped yet (checked above), so the pid is still our child's.
            for signal in signals {
                let _ = sys::kill(child, signal);
            }
        }
        if let Some(request) = request {
            return match child {
                Some(child) if request.kill_target => {
                    let _ = sys::kill(child, libc::SIGKILL);
                    let exit = sys::wait(child).ok().map(decode_wait_status);
                    if let Some(exit) = exit {
                        sender.send(RawMsg::Exited {
                            pid: child,
                            time: sys::monotonic_ns(),
                            code: exit.shell_code(),
                        })?;
                    }
                    Ok((request.reason(), exit))
                }
                _ => Ok((request.reason(), None)),
            };
        }
        if control.deadline.passed() {
            return Ok((StopReason::Duration, None));
        }
        let poll_interval = if heap.is_some() {
            HEAP_POLL_INTERVAL
        } else if child.is_some() && child_fd.is_none() {
            // Only a round notices that the command exited.
            pace::SHORT
        } else {
            control
                .pace
                .interval(sys::monotonic_ns(), drained.fullest, since)
        };
        waited = poll_interval;
        let timeout = control
            .ticker
            .timeout(control.deadline.timeout(poll_interval));
        let ready =
            sys::poll_readable(&fds, timeout.as_millis() as i32).map_err(|e| RecordError::Sys {
                what: "poll".into(),
                source: e,
            })?;
        let woken = ready.iter().any(|&(i, _)| i == wake_index);
        if woken {
            sys::eventfd_reset(control.wake);
        }
        if let Some(t) = target.as_mut() {
            t.saw(&ready, 0);
        }
        if !ready.is_empty() && ready.iter().all(|&(i, hup)| i < ring_count && hup) {
            // Only hung-up rings (every task they followed has exited):
            // poll would return at once from now on. Wait on the other
            // descriptors instead, to pace the loop; the target's pidfd
            // turns readable just after its rings hang up, and ends the
            // recording at once.
            let others = &fds[ring_count..];
            let pause = timeout.min(Duration::from_millis(20));
            let ready = sys::poll_readable(others, pause.as_millis() as i32).map_err(|e| {
                RecordError::Sys {
                    what: "poll".into(),
                    source: e,
                }
            })?;
            if let Some(t) = target.as_mut() {
                t.saw(&ready, ring_count);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn without_pidfd(pid: u32) -> TargetEnd {
        TargetEnd {
            pid,
            pidfd: None,
            ended: false,
            checked_at: None,
        }
    }

    #[test]
    fn an_attached_process_ends_by_its_pidfd_or_proc() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        // Reaped: gone from /proc, read at once the first time.
        assert!(without_pidfd(pid).has_ended());
        // This process runs; /proc is read at most once per poll interval.
        let mut running = without_pidfd(std::process::id());
        assert!(!running.has_ended());
        running.pid = pid;
        assert!(!running.has_ended(), "read /proc again within the interval");
        running.checked_at = Some(std::time::Instant::now() - pace::SHORT);
        assert!(running.has_ended());
        // With a pidfd, only what poll said counts.
        let mut polled = TargetEnd {
            pidfd: Some((sys::eventfd().unwrap(), 3)),
            ..without_pidfd(pid)
        };
        assert!(!polled.has_ended());
        polled.ended = true;
        assert!(polled.has_ended());
    }
}
