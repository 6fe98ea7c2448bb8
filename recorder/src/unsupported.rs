//! Platforms without a sampling backend.

use crate::{RecordError, RecordOptions, RecordSummary};

/// Always fails: there is no backend for this operating system.
pub(crate) fn record(_options: &RecordOptions) -> Result<RecordSummary, RecordError> {
    Err(RecordError::Unsupported(
        "lrnprof-rec records on Linux and macOS only".into(),
    ))
}
