//! The macOS backend: Mach thread sampling from outside the target.
//!
//! macOS has no `perf_event_open`. A sampling thread wakes at the requested
//! rate, lists the target's threads (`task_threads`), skips those whose CPU
//! time did not move since their last sample (they are not suspended), and
//! for each of the others: `thread_suspend`, `thread_get_state`, a copy of
//! the live stack with `mach_vm_read_overwrite`, `thread_resume`. Images come
//! from dyld's `dyld_all_image_infos` (through `task_info(TASK_DYLD_INFO)`)
//! and the Mach-O headers read from the target's memory; the unwind
//! sections of dyld-shared-cache images, which have no file of their own,
//! are copied into the trace the first time a sample touches them, and the
//! files of other touched images when recording ends (`--embed`). The logic
//! above the Mach calls lives in `crate::macho`, where it is unit-tested on
//! any host.
//!
//! Recording needs the target's task port (`task_for_pid`): root, or a
//! recorder signed with the debugger entitlement, and a target that is not
//! protected (System Integrity Protection, hardened runtime without
//! `get-task-allow`).

#[cfg(target_arch = "aarch64")]
mod regs_aarch64;
#[cfg(target_arch = "x86_64")]
mod regs_x86_64;
mod sampler;
mod sys;

#[cfg(target_arch = "aarch64")]
use regs_aarch64 as regs_native;
#[cfg(target_arch = "x86_64")]
use regs_x86_64 as regs_native;

use crate::error::RecordError;
use crate::host;
use crate::options::{CpuEvent, RecordOptions, TargetSpec};
use crate::report::{RecordWarning, Reporter, StatusTicker};
use crate::sink::{Identity, OutputFile, Sink};
use crate::stop::{Deadline, StopReason, StopToken, Wakeup};
use crate::summary::{RecordSummary, TargetExit};
use lrnprof_format::{
    Clock, Endian, EventSettings, Pid, ProcessEvent, ProcessRecord, Record, SampleEvent,
    SamplingSettings, Target, Timestamp, TraceHeader,
};
use sampler::Sampler;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The highest sampling rate accepted: each sample suspends a thread, so
/// faster rates mostly measure the recorder.
const MAX_FREQUENCY_HZ: u32 = 10_000;
/// Records the sampling thread may queue ahead of the writer thread.
const SINK_CAPACITY: usize = 4096;
/// How often the main thread checks the stop token, deadline and exit.
const POLL: Duration = Duration::from_millis(20);

/// What `task_for_pid` needs, for the error message.
const TASK_FOR_PID_ADVICE: &str = "task_for_pid was refused: macOS gives another process's task \
    port only to root or to a program signed with the com.apple.security.cs.debugger \
    entitlement, and never for system processes protected by System Integrity Protection or \
    for programs built with the hardened runtime unless they carry \
    com.apple.security.get-task-allow; run lrnprof-rec with sudo, or sign it with that \
    entitlement (see docs/macos.md)";

/// The target once we hold its task port.
struct Attached {
    pid: u32,
    task: sys::Port,
    launched: bool,
    target: Target,
    command: Vec<String>,
}

/// Record on macOS.
pub(crate) fn record(
    options: &RecordOptions,
    token: &StopToken,
    reporter: &dyn Reporter,
) -> Result<RecordSummary, RecordError> {
    if options.syscalls.is_some() || options.off_cpu.is_some() || !options.cpu {
        return Err(RecordError::Unsupported(
            "syscall tracing and off-CPU recording use Linux's tracepoints and context-switch \
             events; on macOS only CPU samples are recorded"
                .into(),
        ));
    }
    if options.target == TargetSpec::System || options.kernel {
        return Err(RecordError::Unsupported(
            "system-wide recording (--all) and kernel frames (--kernel) use Linux's per-CPU perf \
             events; on macOS record one process (--pid or a command)"
                .into(),
        ));
    }
    if options.event == CpuEvent::Cycles {
        return Err(RecordError::InvalidOption(
            "the macOS backend samples with a timer; --event cycles is Linux only".into(),
        ));
    }
    if options.heap.is_some() {
        return Err(RecordError::Unsupported(
            "--heap is Linux only: on macOS, DYLD_INSERT_LIBRARIES is ignored by \
             hardened-runtime and platform binaries, and lrnprof cannot test it (docs/macos.md)"
                .into(),
        ));
    }
    if !options.cpu {
        return Err(RecordError::InvalidOption(
            "the macOS backend records CPU samples only; --cpu off is Linux only".into(),
        ));
    }
    if options.frequency_hz > MAX_FREQUENCY_HZ {
        return Err(RecordError::InvalidOption(format!(
            "sampling frequency {} Hz is above the macOS backend's limit of {MAX_FREQUENCY_HZ} Hz",
            options.frequency_hz
        )));
    }
    let output = OutputFile::create(&options.out)?;
    let target = attach(&options.target)?;
    let clock = sys::MachClock::new();
    let start_time = Timestamp(clock.now_ns());
    let header = TraceHeader {
        arch: regs_native::ARCH,
        os: lrnprof_format::Os::MacOs,
        endian: Endian::Little,
        pointer_size: 8,
        page_size: host::page_size(),
        clock: Clock::MachAbsolute,
        sampling: SamplingSettings {
            event: SampleEvent::Timer,
            frequency_hz: options.frequency_hz,
            stack_size: crate::macho::effective_stack_size(options.stack_size),
            kernel_callchain: false,
            include_kernel: false,
        },
        recorder: host::RECORDER_NAME.to_string(),
        start_wall_ns: host::wall_clock_ns(),
        start_time,
        target: target.target.clone(),
        hostname: host::hostname(),
        events: EventSettings {
            cpu: true,
            ..EventSettings::default()
        },
    };
    start(options, output, &header, target, clock, token, reporter)
}

/// Take the task port of the process to record, launching it first (held
/// before its first instruction) if asked to.
fn attach(spec: &TargetSpec) -> Result<Attached, RecordError> {
    match spec {
        TargetSpec::Pid(pid) => {
            let pid = *pid;
            if pid == std::process::id() {
                // The sampler would suspend itself.
                return Err(RecordError::InvalidOption(
                    "lrnprof-rec cannot record itself: give another pid".into(),
                ));
            }
            if !sys::process_exists(pid) {
                return Err(RecordError::NoSuchProcess { pid });
            }
            let task = sys::task_for(pid).map_err(|_| RecordError::PermissionDenied {
                pid,
                advice: TASK_FOR_PID_ADVICE.into(),
            })?;
            Ok(Attached {
                pid,
                task,
                launched: false,
                target: Target::Attach {
                    pids: vec![Pid(pid)],
                },
                command: Vec::new(),
            })
        }
        TargetSpec::System => Err(RecordError::Unsupported(
            "system-wide recording is Linux only".into(),
        )),
        TargetSpec::Command(command) => {
            let pid = sys::spawn_suspended(command)?;
            let task = match sys::task_for(pid) {
                Ok(task) => task,
                Err(_) => {
                    let _ = sys::kill_child(pid);
                    return Err(RecordError::PermissionDenied {
                        pid,
                        advice: TASK_FOR_PID_ADVICE.into(),
                    });
                }
            };
            let command: Vec<String> = command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            Ok(Attached {
                pid,
                task,
                launched: true,
                target: Target::Launch {
                    command: command.clone(),
                    pid: Pid(pid),
                },
                command,
            })
        }
    }
}

/// Start the writer and the sampler, let a launched target run, and wait
/// for the end.
fn start(
    options: &RecordOptions,
    output: OutputFile,
    header: &TraceHeader,
    target: Attached,
    clock: sys::MachClock,
    token: &StopToken,
    reporter: &dyn Reporter,
) -> Result<RecordSummary, RecordError> {
    let Attached {
        pid,
        task,
        launched,
        command,
        ..
    } = target;
    let sink = match Sink::start(output, header, Identity, SINK_CAPACITY) {
        Ok(s) => s,
        Err(e) => {
            if launched {
                let _ = sys::kill_child(pid);
            }
            return Err(e);
        }
    };
    let deadline = Deadline::start(options.duration);
    let mut ticker = StatusTicker::new(sink.stats(), deadline.started());
    // Requests on the token cut the wait between checks short.
    let wakeup = Arc::new(Wakeup::default());
    let waker = Arc::clone(&wakeup);
    let _wake_guard = token.wake_with(Arc::new(move || waker.wake()));
    let tx = sink.sender();
    let first = tx.send(Record::Process(ProcessRecord {
        time: Timestamp(clock.now_ns()),
        pid: Pid(pid),
        parent: None,
        event: if launched {
            ProcessEvent::Exec
        } else {
            ProcessEvent::Existing
        },
        command,
        executable: sys::executable_path(pid),
        cgroup: None,
    }));
    if let Err(e) = first {
        // Never leave a launched command suspended behind us.
        if launched {
            let _ = sys::kill_child(pid);
        }
        return Err(e);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let gone = Arc::new(AtomicBool::new(false));
    let sampler = Sampler::new(
        task,
        Pid(pid),
        clock,
        options.frequency_hz,
        options.stack_size,
        options.embed,
    );
    let thread = {
        let (tx, stop, gone) = (tx.clone(), Arc::clone(&stop), Arc::clone(&gone));
        std::thread::Builder::new()
            .name("lrnprof-sampler".into())
            .spawn(move || sampler.run(tx, stop, gone))
    };
    let thread = match thread {
        Ok(thread) => thread,
        Err(source) => {
            if launched {
                let _ = sys::kill_child(pid);
            }
            return Err(RecordError::Sys {
                what: "starting the sampling thread".into(),
                source,
            });
        }
    };
    // The sampler is running: from here on, nothing the target does is missed.
    if launched {
        if let Err(e) = sys::resume_process(pid) {
            stop.store(true, Ordering::Relaxed);
            let _ = sys::kill_child(pid);
            let _ = thread.join();
            return Err(e);
        }
    }

    let (reason, exit) = loop {
        ticker.tick(reporter);
        let (request, signals) = token.take();
        if launched {
            // Not reaped yet (that ends the loop), so the pid is still our child's.
            for signal in signals {
                sys::signal(pid, signal);
            }
        }
        if let Some(request) = request {
            let exit = if launched && request.kill_target {
                sys::kill_child(pid).and_then(exit_from)
            } else {
                None
            };
            break (request.reason(), exit);
        }
        if deadline.passed() {
            break (StopReason::Duration, None);
        }
        if launched {
            if let Some(exit) = exit_of(pid) {
                break (StopReason::TargetExited, Some(exit));
            }
        } else if gone.load(Ordering::Relaxed) || !sys::process_exists(pid) {
            break (StopReason::TargetExited, None);
        }
        if thread.is_finished() {
            // The task died (or the sampler failed): a launched child's
            // status follows shortly.
            let exit = if launched { wait_briefly(pid) } else { None };
            break (StopReason::TargetExited, exit);
        }
        wakeup.sleep(ticker.timeout(deadline.timeout(POLL)));
    };
    stop.store(true, Ordering::Relaxed);
    let sampled = thread
        .join()
        .map_err(|_| RecordError::Internal("the sampling thread panicked".into()))?;
    let end = Timestamp(clock.now_ns());
    // How long sampling ran, and what it cost, before the images are
    // embedded here (not on the writer thread, as on Linux).
    let duration = deadline.started().elapsed();
    let cpu_while_recording = crate::summary::own_cpu();
    if reason == StopReason::TargetExited {
        let code = exit.map(|e| e.shell_code());
        tx.send(Record::Process(ProcessRecord {
            time: end,
            pid: Pid(pid),
            parent: None,
            event: ProcessEvent::Exit { code },
            command: Vec::new(),
            executable: None,
            cgroup: None,
        }))?;
    }
    // Embed the files of the images samples touched, now that nothing is
    // being sampled. Problems are warnings: the analysis machine can still
    // provide the files.
    if let Ok(totals) = &sampled {
        for file in &totals.files {
            let mut blobs = Vec::new();
            match crate::macho::embed_file(file, &mut blobs) {
                Ok(()) => {
                    for blob in blobs {
                        tx.send(blob)?;
                    }
                }
                Err(e) => {
                    // embed_file's reasons start with the path.
                    let prefix = format!("{}: ", file.path);
                    reporter.warning(&RecordWarning::NotEmbedded {
                        path: file.path.clone(),
                        reason: e.strip_prefix(&prefix).unwrap_or(&e).to_string(),
                    });
                }
            }
        }
    }
    drop(tx);
    // A sampler error is reported after the trace is finished, so what was
    // recorded stays readable.
    let finished = sink.finish(end);
    sampled?;
    let totals = finished?;
    for warning in &totals.warnings {
        reporter.warning(warning);
    }
    let mut summary = RecordSummary::new(&options.out, &totals, duration, reason, exit);
    summary.cpu_while_recording = cpu_while_recording;
    Ok(summary)
}

/// How our child `pid` ended, if it has.
fn exit_of(pid: u32) -> Option<TargetExit> {
    sys::try_wait(pid).and_then(exit_from)
}

fn exit_from(status: (Option<i32>, Option<i32>)) -> Option<TargetExit> {
    match status {
        (Some(code), _) => Some(TargetExit::Code(code)),
        (None, Some(signal)) => Some(TargetExit::Signal(signal)),
        (None, None) => None,
    }
}

/// [`exit_of`], waiting up to a second for the status to arrive.
fn wait_briefly(pid: u32) -> Option<TargetExit> {
    for _ in 0..50 {
        if let Some(exit) = exit_of(pid) {
            return Some(exit);
        }
        std::thread::sleep(POLL);
    }
    None
}
