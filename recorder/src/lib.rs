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
//! Call [`record`] with [`RecordOptions`]; it returns when the target exits,
//! the duration passes, or the process gets SIGINT / SIGTERM, and the trace
//! is then finished. The caller must be allowed to trace the target (see
//! [`RecordError::PermissionDenied`]).
//!
//! ```no_run
//! use lrnprof_recorder::{record, RecordOptions, TargetSpec};
//! let summary = record(&RecordOptions {
//!     target: TargetSpec::Command(vec!["./server".into(), "--port".into(), "8080".into()]),
//!     out: "server.lpt".into(),
//!     ..Default::default()
//! })?;
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
//! pub(crate) fn record(options: &RecordOptions) -> Result<RecordSummary, RecordError>
//! ```
//!
//! Backends share the writer thread (`sink`: a bounded channel into a
//! `TraceWriter`, counting what the summary shows), the stop handling
//! (`stop`: SIGINT / SIGTERM / duration) and the status line and summary
//! (`status`).

#![deny(missing_docs)]

mod error;
#[doc(hidden)]
pub mod fuzz;
mod host;
mod macho;
mod options;
mod sink;
mod status;
mod stop;

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
pub use lrnprof_image::EmbedLevel;
pub use options::{RecordOptions, TargetSpec, DEFAULT_FREQUENCY_HZ, DEFAULT_STACK_SIZE};
pub use status::{RecordSummary, TargetExit};
pub use stop::StopReason;

/// Record `options.target` into `options.out` until it exits, the duration
/// passes, or this process gets SIGINT / SIGTERM.
///
/// On a startup error (no such process, missing command, unwritable
/// output, sampling not permitted or not supported) no trace file is left
/// behind. Once recording has started, the file is always a readable trace;
/// it is marked finished only when this function returns `Ok`.
pub fn record(options: &RecordOptions) -> Result<RecordSummary, RecordError> {
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
    native::record(options)
}
