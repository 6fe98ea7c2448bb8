//! The recorder's error type.

use std::path::PathBuf;

/// Everything that can stop a recording from starting or finishing.
///
/// Messages are one line and say what the user can do about them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The options cannot work together or are out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// No process has the given pid.
    #[error("no process with pid {pid}: check the pid (it may have exited)")]
    NoSuchProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// The process exists but may not be recorded by this user.
    #[error("not permitted to record pid {pid}: {advice}")]
    PermissionDenied {
        /// The pid asked for.
        pid: u32,
        /// Which restriction applies and how to lift it.
        advice: String,
    },
    /// System-wide recording (or kernel sampling) is not allowed for this
    /// user.
    #[error("not permitted to record {what}: {advice}")]
    SystemDenied {
        /// What was refused (`the whole system`, `kernel code`).
        what: String,
        /// Which restriction applies and how to lift it.
        advice: String,
    },
    /// The command to launch does not exist.
    #[error("command not found: {command} (check the name or give a path)")]
    CommandNotFound {
        /// The program as given.
        command: String,
    },
    /// The command exists but cannot be executed.
    #[error("cannot execute {command}: {source}")]
    CommandNotExecutable {
        /// The program as given.
        command: String,
        /// Why `execve` failed.
        source: std::io::Error,
    },
    /// The trace file cannot be created or written.
    #[error("cannot write trace file {}: {source} (choose another --out path)", path.display())]
    Output {
        /// The trace path.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The kernel or platform cannot sample as needed.
    #[error("sampling is not supported here: {0}")]
    Unsupported(String),
    /// The kernel's tracepoints (syscall tracing) cannot be used: tracefs is
    /// not mounted or readable, or the kernel lacks the tracepoints.
    #[error("cannot trace system calls: {0}")]
    Tracing(String),
    /// A system call failed unexpectedly.
    #[error("{what} failed: {source}")]
    Sys {
        /// Which call and on what.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Encoding or writing the trace failed.
    #[error("writing the trace failed: {0}")]
    Format(#[from] lrnprof_format::FormatError),
    /// A recorder thread died unexpectedly.
    #[error("internal error: {0}")]
    Internal(String),
    /// Bytes read from a macOS process (Mach-O header and load commands, the
    /// dyld image list, a thread state) do not parse.
    #[error("malformed {what} at offset {offset}: {reason}")]
    MalformedMachO {
        /// Which structure.
        what: &'static str,
        /// Byte offset of the problem within that structure.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
}

impl RecordError {
    /// A [`RecordError::Sys`] from the last OS error.
    pub(crate) fn last_os(what: impl Into<String>) -> RecordError {
        RecordError::Sys {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}
