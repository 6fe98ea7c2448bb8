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
mod convert;
mod heap;
mod images;
mod launch;
mod parse;
mod procfs;
mod regs;
mod ring;
mod sys;

use crate::error::RecordError;
use crate::report::{RecordWarning, Reporter, StatusTicker};
use crate::sink::{OutputFile, Sink, SinkSender};
use crate::stop::{Deadline, StopReason, StopToken};
use crate::{host, CpuEvent, RecordOptions, RecordSummary, TargetExit, TargetSpec};
use attr::{AttrSettings, EventKind};
use convert::{Converter, Initial, RawMsg};
use heap::{Escape, HeapEvent, HeapSession};
use lrnprof_format::{
    Clock, Endian, EventSettings, HeapSettings, Os, Pid, SampleEvent, SampleKind, SamplingSettings,
    Target, Timestamp, TraceHeader,
};
pub(crate) use parse::fuzz_records;
use parse::Layout;
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use sys::RingMap;

#[cfg(target_arch = "x86_64")]
const NATIVE_REGS: regs::ArchRegs = regs::X86_64;
#[cfg(target_arch = "aarch64")]
const NATIVE_REGS: regs::ArchRegs = regs::AARCH64;

/// Largest ring buffer data area per CPU, in pages (16 MiB with 4 KiB
/// pages: a quarter second of 1 kHz samples with 64 KiB stack copies).
const MAX_RING_PAGES: usize = 4096;
/// Smallest we accept when the locked-memory limit is low.
const MIN_RING_PAGES: usize = 8;
/// Messages the writer thread may lag behind; with chunks of at most
/// [`MAX_CHUNK`] this bounds the memory in flight.
const CHANNEL_CAPACITY: usize = 32;
/// Bytes of records per message at most (one record may exceed it).
const MAX_CHUNK: usize = 1 << 20;
/// Longest wait between drains.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Longest wait between drains with allocation sampling: its ring is
/// polled, not waited on, and a full ring makes allocating threads wait.
const HEAP_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Drains of the allocation sampler's ring per round at most, so a
/// program that allocates without pause cannot hold the loop.
const HEAP_DRAINS_PER_ROUND: usize = 4;
/// With allocation sampling, records are held back this much longer
/// before they are put in time order and written: a sampler's thread can
/// be descheduled between reading the clock and writing its record.
const HEAP_HOLD_NS: u64 = 200_000_000;

/// The opened events and their ring buffers.
struct Events {
    attr: sys::PerfEventAttr,
    cpus: Vec<u32>,
    ring_pages: usize,
    page_size: usize,
    /// Per CPU (same order as `cpus`): the event owning the ring buffer.
    leaders: Vec<Option<(OwnedFd, RingMap)>>,
    others: Vec<OwnedFd>,
    tids: HashSet<u32>,
}

impl Events {
    /// Open the events of one thread on every CPU.
    fn open_thread(&mut self, tid: u32) -> io::Result<()> {
        let mut opened = Vec::new();
        for &cpu in &self.cpus {
            opened.push(sys::perf_event_open(&self.attr, tid as i32, cpu as i32)?);
        }
        for (i, fd) in opened.into_iter().enumerate() {
            match &self.leaders[i] {
                Some((leader, _)) => {
                    sys::perf_set_output(&fd, leader)?;
                    self.others.push(fd);
                }
                None => {
                    let ring = self.map_ring(&fd)?;
                    self.leaders[i] = Some((fd, ring));
                }
            }
        }
        self.tids.insert(tid);
        Ok(())
    }

    /// Map a ring buffer, halving its size while the kernel refuses.
    fn map_ring(&mut self, fd: &OwnedFd) -> io::Result<RingMap> {
        loop {
            match RingMap::new(fd, self.page_size, self.ring_pages) {
                Ok(r) => return Ok(r),
                Err(e)
                    if self.ring_pages > MIN_RING_PAGES
                        && matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOMEM)) =>
                {
                    self.ring_pages /= 2;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn all_fds(&self) -> impl Iterator<Item = &OwnedFd> {
        self.leaders
            .iter()
            .flatten()
            .map(|(fd, _)| fd)
            .chain(self.others.iter())
    }
}

/// Record on Linux.
pub(crate) fn record(
    options: &RecordOptions,
    token: &StopToken,
    reporter: &dyn Reporter,
) -> Result<RecordSummary, RecordError> {
    let stack_size = attr::valid_stack_size(options.stack_size);
    let (frequency_hz, clamped) = attr::clamp_frequency(
        options.frequency_hz,
        procfs::read_sysctl("/proc/sys/kernel/perf_event_max_sample_rate"),
    );
    if clamped {
        reporter.warning(&RecordWarning::FrequencyClamped {
            requested_hz: options.frequency_hz,
            used_hz: frequency_hz,
        });
    }
    if let TargetSpec::Pid(pid) = options.target {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() || procfs::has_exited(pid) {
            return Err(RecordError::NoSuchProcess { pid });
        }
    }
    let out = OutputFile::create(&options.out)?;
    // Requests on the token interrupt the wait for samples.
    let wake = Arc::new(sys::eventfd()?);
    let waker = Arc::clone(&wake);
    let _wake_guard = token.wake_with(Arc::new(move || sys::eventfd_add(&waker)));
    let deadline = Deadline::start(options.duration);
    let page_size = host::page_size() as usize;
    let plan = attr::plan_ring(
        page_size,
        MAX_RING_PAGES,
        sys::geteuid() == 0,
        procfs::read_sysctl("/proc/sys/kernel/perf_event_mlock_kb"),
        stack_size,
    );
    let stack_size = plan.stack_size;
    // Allocation samples copy as much stack as CPU samples.
    let mut heap = match &options.heap {
        Some(h) => Some(HeapSession::new(h, stack_size)?),
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
        TargetSpec::Pid(_) => None,
    };
    // Why the program's allocations may escape the sampler, said before it runs.
    let escape = match (&heap, &launched) {
        (Some(_), Some(l)) => heap::check_program(&l.path).map(|e| (l.path.clone(), e)),
        _ => None,
    };
    // Before attaching (opening events for thousands of busy threads must
    // not wait for CPU) but after the fork, so a launched command keeps
    // its normal priority.
    let priority = sys::raise_thread_priority();
    let pid = match (&options.target, &launched) {
        (_, Some(l)) => l.pid,
        (TargetSpec::Pid(p), None) => *p,
        (TargetSpec::Command(_), None) => unreachable!("launched above"),
    };
    let settings = AttrSettings {
        event: match (options.cpu, options.event) {
            (false, _) => EventKind::Tracking,
            (true, CpuEvent::CpuClock) => EventKind::CpuClock,
            (true, CpuEvent::Cycles) => EventKind::Cycles,
        },
        frequency_hz,
        stack_size,
        callchain: options.kernel_callchain,
        enable_on_exec: launched.is_some(),
        build_id: true,
        regs_mask: NATIVE_REGS.mask,
        wakeup_bytes: (plan.pages * page_size / 4) as u32,
    };
    let (mut events, settings) = open_first(pid, settings, page_size, plan.pages)?;
    // Before any event is enabled: the existing threads and images are
    // recorded at this time, and every sample must come after them.
    let start_time = sys::monotonic_ns();
    if launched.is_none() {
        attach_all_threads(&mut events, pid)?;
        for fd in events.all_fds() {
            sys::perf_enable(fd).map_err(|e| RecordError::Sys {
                what: "enabling the sampling events".into(),
                source: e,
            })?;
        }
    }
    // Only now, so a startup error stays the only thing reported.
    if plan.stack_limited {
        reporter.warning(&RecordWarning::StackSizeLimited {
            bytes: plan.stack_size,
        });
    }
    if let Some((program, escape)) = &escape {
        reporter.warning(&RecordWarning::HeapNotSampled {
            program: program.display().to_string(),
            reason: escape.reason(),
        });
    }
    if let Some(l) = launched.as_mut() {
        l.release()?;
    }
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
                EventKind::CpuClock | EventKind::Tracking => SampleEvent::CpuClock,
            },
            frequency_hz,
            stack_size,
            kernel_callchain: settings.callchain,
            include_kernel: false,
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
                pid: Pid(pid),
            },
        },
        hostname: host::hostname(),
        events: EventSettings {
            cpu: options.cpu,
            heap: options.heap.map(|h| HeapSettings {
                mean_interval: h.mean_interval,
            }),
            ..EventSettings::default()
        },
    };
    let sample_kind = match settings.event {
        EventKind::Cycles => SampleKind::Cycles,
        EventKind::CpuClock | EventKind::Tracking => SampleKind::CpuTime,
    };
    let layout = settings.layout();
    let mut converter = Converter::new(layout, NATIVE_REGS, sample_kind, options.embed);
    if heap.is_some() {
        let explained = matches!(
            escape,
            Some((_, Escape::StaticallyLinked | Escape::OwnMalloc))
        );
        converter = converter.with_heap(explained);
    }
    let sink = Sink::start(out, &header, converter, CHANNEL_CAPACITY)?;
    let sender = sink.sender();
    let command = match &header.target {
        Target::Launch { command, .. } => Some(command.clone()),
        Target::Attach { .. } | Target::System => None,
    };
    let mut tids: Vec<u32> = events.tids.iter().copied().collect();
    tids.sort_unstable();
    let sent = sender.send(RawMsg::Initial(Initial {
        time: start_time,
        pid,
        tids,
        launched: command,
    }));
    let mut control = Control {
        token,
        deadline: &deadline,
        wake: &wake,
        ticker: StatusTicker::new(sink.stats(), deadline.started()),
        reporter,
    };
    let outcome = sent.and_then(|()| {
        sample_loop(
            &mut events,
            &layout,
            &sender,
            &mut control,
            heap.as_mut(),
            pid,
            launched.as_ref().map(|l| l.pid),
        )
    });
    // Stop sampling before the last drain, so nothing is cut in half.
    for fd in events.all_fds() {
        let _ = sys::perf_disable(fd);
    }
    if let Some(h) = &heap {
        h.stop();
    }
    let drained = drain_all(&mut events, &layout, &sender, heap.as_mut(), true);
    drop(priority);
    let end = sys::monotonic_ns();
    drop(sender);
    // A failed writer (disk full) is the root cause of any sending error.
    let totals = sink.finish(Timestamp(end))?;
    for warning in &totals.warnings {
        reporter.warning(warning);
    }
    let (reason, target_exit) = outcome?;
    drained?;
    Ok(RecordSummary::new(
        &options.out,
        &totals,
        deadline.started().elapsed(),
        reason,
        target_exit,
    ))
}

/// Open the first thread's events, falling back from hardware cycles to
/// the software CPU clock and from build-id MMAP2 records to plain ones.
fn open_first(
    pid: u32,
    settings: AttrSettings,
    page_size: usize,
    ring_pages: usize,
) -> Result<(Events, AttrSettings), RecordError> {
    // Build-id MMAP2 records need Linux 5.12: older kernels get plain ones.
    let candidates = [(settings.event, true), (settings.event, false)];
    let cpus = procfs::online_cpus(sys::cpu_count());
    let mut last_err = None;
    for (event, build_id) in candidates {
        let s = AttrSettings {
            event,
            build_id,
            ..settings
        };
        let mut events = Events {
            attr: s.attr(),
            leaders: (0..cpus.len()).map(|_| None).collect(),
            cpus: cpus.clone(),
            ring_pages,
            page_size,
            others: Vec::new(),
            tids: HashSet::new(),
        };
        match events.open_thread(pid) {
            Ok(()) => return Ok((events, s)),
            Err(e) => match e.raw_os_error() {
                Some(libc::ESRCH) => return Err(RecordError::NoSuchProcess { pid }),
                Some(libc::EACCES | libc::EPERM) => return Err(permission_denied(pid)),
                _ => last_err = Some(e),
            },
        }
    }
    let e = last_err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::ENOSYS));
    Err(RecordError::Unsupported(match settings.event {
        EventKind::Tracking => format!(
            "perf_event_open failed for the event that follows threads and images ({e}); the \
             kernel needs CONFIG_PERF_EVENTS, and containers must allow the perf_event_open syscall"
        ),
        EventKind::Cycles => format!(
            "the hardware cycle counter cannot be sampled here ({e}); virtual machines often \
             do not expose it: record with --event cpu-clock"
        ),
        EventKind::CpuClock => format!(
            "perf_event_open failed for the cpu-clock event ({e}); the kernel needs \
             CONFIG_PERF_EVENTS, and containers must allow the perf_event_open syscall"
        ),
    }))
}

fn permission_denied(pid: u32) -> RecordError {
    RecordError::PermissionDenied {
        pid,
        advice: attr::permission_advice(
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
            .filter(|t| !events.tids.contains(t))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        for tid in new {
            match events.open_thread(tid) {
                Ok(()) => {}
                // The thread exited meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    return Err(RecordError::Unsupported(format!(
                        "too many threads to attach to ({} so far, one file per thread and CPU): \
                         raise the open-file limit (ulimit -n)",
                        events.tids.len()
                    )))
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                    return Err(permission_denied(pid))
                }
                Err(e) => {
                    return Err(RecordError::Sys {
                        what: format!("perf_event_open for thread {tid}"),
                        source: e,
                    })
                }
            }
        }
    }
    Ok(())
}

/// Drain every ring buffer once, and the allocation sampler's ring;
/// `last`: the recording is over. Returns whether anything was drained.
fn drain_all(
    events: &mut Events,
    layout: &Layout,
    sender: &SinkSender<RawMsg>,
    heap: Option<&mut HeapSession>,
    last: bool,
) -> Result<bool, RecordError> {
    let round = sys::monotonic_ns();
    let mut any = false;
    let mut scratch = Vec::new();
    for (_, ring) in events.leaders.iter_mut().flatten() {
        scratch.clear();
        if ring.drain(&mut scratch) > 0 {
            let mut pos = 0;
            while pos < scratch.len() {
                let mut chunk = Vec::with_capacity((scratch.len() - pos).min(MAX_CHUNK));
                pos += ring::compact_samples(layout, &scratch[pos..], &mut chunk, MAX_CHUNK);
                sender.send(RawMsg::Chunk(chunk))?;
            }
            any = true;
        }
    }
    let mut round = Some(round);
    if let Some(heap) = heap {
        round = round.map(|r| r.saturating_sub(HEAP_HOLD_NS));
        let mut more = true;
        for _ in 0..HEAP_DRAINS_PER_ROUND {
            let mut batch: Vec<HeapEvent> = Vec::new();
            more = heap.drain(&mut batch, sys::monotonic_ns(), last);
            if !batch.is_empty() {
                any = true;
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
    Ok(any)
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
}

/// Drain until a stop condition; returns why and how a launched child ended.
fn sample_loop(
    events: &mut Events,
    layout: &Layout,
    sender: &SinkSender<RawMsg>,
    control: &mut Control<'_>,
    mut heap: Option<&mut HeapSession>,
    pid: u32,
    child: Option<u32>,
) -> Result<(StopReason, Option<TargetExit>), RecordError> {
    let poll_interval = if heap.is_some() {
        HEAP_POLL_INTERVAL
    } else {
        POLL_INTERVAL
    };
    let mut fds: Vec<i32> = events
        .leaders
        .iter()
        .flatten()
        .map(|(fd, _)| fd.as_raw_fd())
        .collect();
    let wake_index = fds.len();
    fds.push(control.wake.as_raw_fd());
    loop {
        drain_all(events, layout, sender, heap.as_deref_mut(), false)?;
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
        } else if procfs::has_exited(pid) {
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
        let mut rings = ready.iter().filter(|&&(i, _)| i != wake_index).peekable();
        if !woken && rings.peek().is_some() && rings.all(|&(_, hup)| hup) {
            // Hung up (the thread owning the buffer exited): poll would
            // return at once from now on, so pace the loop.
            std::thread::sleep(timeout.min(Duration::from_millis(20)));
        }
    }
}
