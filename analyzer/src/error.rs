//! The analyzer's error type.

use std::path::PathBuf;

/// Everything that can make an analysis fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalyzeError {
    /// The trace could not be opened or its header is unreadable.
    #[error("cannot read trace {path}: {source}")]
    Trace {
        /// The trace file.
        path: PathBuf,
        /// What the format reader said.
        source: lrnprof_format::FormatError,
    },
    /// The trace holds no readable block at all.
    #[error("trace {path} holds no readable records ({detail})")]
    Empty {
        /// The trace file.
        path: PathBuf,
        /// Why: what the reader skipped.
        detail: String,
    },
    /// Writing an output file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// The i/o error.
        source: std::io::Error,
    },
    /// Writing to stdout (`-o -`, reports) failed.
    #[error("cannot write to standard output: {0}")]
    Stdout(#[source] std::io::Error),
    /// Writing a trace (strip, pack) failed.
    #[error("cannot write trace {path}: {source}")]
    WriteTrace {
        /// The output trace.
        path: PathBuf,
        /// What the format writer said.
        source: lrnprof_format::FormatError,
    },
    /// A `--symbols` directory does not exist.
    #[error("symbols directory {0} does not exist or is not a directory")]
    SymbolsDir(PathBuf),
    /// `--debuginfod` cannot be used here.
    #[error("--debuginfod: {0}")]
    Debuginfod(String),
    /// `--value` names a value the trace did not record.
    #[error(
        "the trace has no {value} values: it recorded {recorded}; pick one of those with --value"
    )]
    ValueNotRecorded {
        /// The value asked for.
        value: String,
        /// The values the trace has, comma-separated.
        recorded: String,
    },
    /// `syscalls` was asked of a trace recorded without them.
    #[error("the trace has no syscall events: record with `lrnprof-rec --syscalls`")]
    NoSyscalls,
    /// A syscall filter names no syscall or class of the trace's architecture.
    #[error("--syscall: {0}")]
    SyscallFilter(String),
    /// A filter matched nothing.
    #[error("no samples left after filtering ({0}); run `lrnprof-analyze info` to see the trace's processes, threads and time range")]
    NothingSelected(String),
    /// The worker thread pool could not be built.
    #[error("cannot start {jobs} worker threads: {message}")]
    ThreadPool {
        /// Requested number of workers.
        jobs: usize,
        /// The error.
        message: String,
    },
    /// `pack` was asked to run on a trace from another machine or with
    /// `--offline`.
    #[error("{0}")]
    Pack(String),
}
