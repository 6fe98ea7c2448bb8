//! The recorder's error type.

use std::io::Read;
use std::path::{Path, PathBuf};

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

/// Why starting an existing `program` failed with ENOENT: the interpreter its
/// `#!` line names, or a binary's dynamic loader, does not exist.
pub(crate) fn missing_interpreter(program: &Path) -> String {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    interpreter_message(&head[..n])
}

fn interpreter_message(head: &[u8]) -> String {
    match head.strip_prefix(b"#!") {
        Some(rest) => {
            let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            let interpreter = line.split_whitespace().next().unwrap_or_default();
            format!("the interpreter its #! line names, {interpreter}, does not exist")
        }
        None => "its dynamic loader (the program interpreter it names) does not exist: \
                 was it built for another system or C library?"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interpreter_is_named() {
        assert_eq!(
            interpreter_message(b"#!/opt/py/bin/python3 -u\nprint(1)\n"),
            "the interpreter its #! line names, /opt/py/bin/python3, does not exist"
        );
        assert_eq!(
            interpreter_message(b"#! /bin/zsh\n"),
            "the interpreter its #! line names, /bin/zsh, does not exist"
        );
        assert!(interpreter_message(b"\x7fELF\x02").contains("dynamic loader"));
    }
}
