//! The harness's one error type.

use std::path::PathBuf;

/// Why a benchmark step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path or command.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A measured command exited unsuccessfully.
    #[error("`{command}` failed ({status}){}", stderr_tail(.stderr))]
    CommandFailed {
        /// The command line.
        command: String,
        /// How it ended, e.g. `exit status 1`.
        status: String,
        /// The last lines of its standard error.
        stderr: String,
    },
    /// A tool the harness needs is not installed or not built.
    #[error("{tool} not found at {}: {hint}", .path.display())]
    ToolMissing {
        /// The tool's name.
        tool: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// How to get it.
        hint: &'static str,
    },
    /// A tool's output did not look as expected.
    #[error("cannot read the output of {tool}: {message}")]
    BadOutput {
        /// The tool.
        tool: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A trace could not be read.
    #[error("cannot read trace {}: {source}", .path.display())]
    Trace {
        /// The trace file.
        path: PathBuf,
        /// The format error.
        source: lrnprof_format::FormatError,
    },
    /// The harness itself went wrong (a worker thread panicked).
    #[error("benchmark harness error: {0}")]
    Internal(&'static str),
}

fn stderr_tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.join(" / "))
    }
}

impl BenchError {
    /// An [`BenchError::Io`] with context.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::Io {
            what: what.into(),
            source,
        }
    }
}
