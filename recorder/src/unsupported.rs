//! Platforms without a sampling backend.

use crate::{RecordError, RecordOptions, RecordSummary, Reporter, StopToken};

/// Always fails: there is no backend for this operating system.
pub(crate) fn record(
    _options: &RecordOptions,
    _stop: &StopToken,
    _reporter: &dyn Reporter,
) -> Result<RecordSummary, RecordError> {
    Err(RecordError::Unsupported(
        "lrnprof-rec records on Linux and macOS only".into(),
    ))
}
