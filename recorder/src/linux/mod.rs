//! The Linux backend: `perf_event_open` with user register and user stack
//! sampling.

use crate::{RecordError, RecordOptions, RecordSummary};

/// Record on Linux.
pub(crate) fn record(_options: &RecordOptions) -> Result<RecordSummary, RecordError> {
    Err(RecordError::Unsupported(
        "the Linux backend is being written".into(),
    ))
}
