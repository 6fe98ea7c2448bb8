//! lrnprof's recorder: samples native processes and writes `.lpt` traces.
//!
//! At each sample the recorder captures only what cannot be recovered later:
//! the thread's user registers, a copy of the live part of its user stack,
//! the time and the thread. It also records which images (executables,
//! shared libraries, the vDSO, JIT regions) are mapped where, with their
//! build ids, and threads and processes coming and going. It never unwinds
//! or symbolicates while sampling; `lrnprof-analyze` does that later,
//! possibly on another machine.
//!
//! Call [`record`] with [`RecordOptions`], a [`StopToken`] and a
//! [`Reporter`]. It returns when the target exits, the duration passes, or
//! the caller stops it through the token, and the trace is then finished.
//! The caller must be allowed to trace the target (see
//! [`RecordError::PermissionDenied`]).
//!
//! The library has no process-wide side effects: it installs no signal
//! handler, prints nothing and draws nothing. Status and warnings go to the
//! [`Reporter`]; what to do on Ctrl-C is the caller's choice, made through
//! the [`StopToken`] (stop, pass a signal on to a launched command, kill
//! it). Attaching to a process with many threads opens one file per thread
//! and CPU: a caller may want to raise its open-file limit first, as
//! `lrnprof-rec` does.
//!
//! ```no_run
//! use lrnprof_recorder::{
//!     record, RecordOptions, RecordStatus, RecordWarning, Reporter, StopToken, TargetSpec,
//! };
//! use std::time::Duration;
//!
//! struct Log;
//! impl Reporter for Log {
//!     fn status(&self, status: &RecordStatus) {
//!         eprintln!("recording: {status}");
//!     }
//!     fn warning(&self, warning: &RecordWarning) {
//!         eprintln!("warning: {warning}");
//!     }
//! }
//!
//! let token = StopToken::new();
//! let stopper = token.clone();
//! std::thread::spawn(move || {
//!     std::thread::sleep(Duration::from_secs(10)); // or: wait for the user
//!     stopper.stop();
//! });
//! let summary = record(
//!     &RecordOptions {
//!         target: TargetSpec::Command(vec!["./server".into(), "--port".into(), "8080".into()]),
//!         out: "server.lpt".into(),
//!         ..Default::default()
//!     },
//!     &token,
//!     &Log,
//! )?;
//! eprintln!("{summary}");
//! # Ok::<(), lrnprof_recorder::RecordError>(())
//! ```
//!
//! # Backends
//!
//! Each platform backend is a module declared once below, gated on the
//! target OS, and exposes the same function:
//!
//! ```text
//! pub(crate) fn record(options: &RecordOptions, stop: &StopToken, reporter: &dyn Reporter)
//!     -> Result<RecordSummary, RecordError>
//! ```
//!
//! Backends share the writer thread (`sink`: a bounded channel into a
//! `TraceWriter`, counting what the summary shows), the stop handling
//! (`stop`: the token and the duration), the status reports (`report`)
//! and the summary (`summary`).

#![deny(missing_docs)]

mod error;
#[doc(hidden)]
pub mod fuzz;
mod host;
mod macho;
mod options;
mod report;
mod sink;
mod stop;
mod summary;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as native;

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as native;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod unsupported;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
use unsupported as native;

pub use error::RecordError;
pub use lrnprof_image::{EmbedLevel, FrameCache};
pub use options::{
    CpuEvent, HeapOptions, OffCpuOptions, RecordOptions, SyscallOptions, TargetSpec,
    DEFAULT_FREQUENCY_HZ, DEFAULT_HEAP_INTERVAL, DEFAULT_OFF_CPU_STACK_SIZE, DEFAULT_STACK_SIZE,
    DEFAULT_SYSCALL_STACK_SIZE, MAX_RING_SIZE, MIN_RING_SIZE,
};
pub use report::{NoReporter, RecordStatus, RecordWarning, Reporter, FAST_SOFTWARE_CLOCK_HZ};
pub use stop::{StopReason, StopRequest, StopToken};
pub use summary::{own_cpu, RecordSummary, TargetExit};

/// Record `options.target` into `options.out` until it exits, the duration
/// passes, or `stop` is stopped. Status and warnings go to `reporter`.
///
/// On a startup error (no such process, missing command, unwritable
/// output, sampling not permitted or not supported) no trace file is left
/// behind. Once recording has started, the file is always a readable trace;
/// it is marked finished only when this function returns `Ok`.
pub fn record(
    options: &RecordOptions,
    stop: &StopToken,
    reporter: &dyn Reporter,
) -> Result<RecordSummary, RecordError> {
    if let TargetSpec::Command(c) = &options.target {
        if c.is_empty() {
            return Err(RecordError::InvalidOption(
                "no command to launch and no --pid given".into(),
            ));
        }
    }
    if options.frequency_hz == 0 {
        return Err(RecordError::InvalidOption(
            "the sampling frequency must be at least 1 Hz".into(),
        ));
    }
    if let Some(heap) = &options.heap {
        let running = match options.target {
            TargetSpec::Pid(_) => Some("a running process (--pid)"),
            TargetSpec::System => Some("the processes of a system-wide recording (--all)"),
            TargetSpec::Command(_) => None,
        };
        if let Some(running) = running {
            return Err(RecordError::InvalidOption(format!(
                "--heap needs a command to launch: the allocation sampler is loaded when a \
                 program starts, and {running} cannot be made to load it"
            )));
        }
        if heap.mean_interval == 0 {
            return Err(RecordError::InvalidOption(
                "--heap-rate must be at least 1 byte (1 records every allocation)".into(),
            ));
        }
    }
    if !options.cpu
        && options.heap.is_none()
        && options.syscalls.is_none()
        && options.off_cpu.is_none()
    {
        return Err(RecordError::InvalidOption(
            "nothing to record: CPU sampling is off and neither allocations, syscalls nor \
             off-CPU time were asked for"
                .into(),
        ));
    }
    if let Some(s) = &options.syscalls {
        if s.stack_every == 0 {
            return Err(RecordError::InvalidOption(
                "--syscall-stack-every must be at least 1".into(),
            ));
        }
        if s.stack_every > 1 && options.target == TargetSpec::System {
            return Err(RecordError::InvalidOption(
                "--syscall-stack-every above 1 follows the recorded processes only; it cannot \
                 be used with --all yet (use --syscall-stack-every 1)"
                    .into(),
            ));
        }
    }
    native::record(options, stop, reporter)
}
