//! End-to-end tests of lrnprof: one test binary, one module per area.

mod analyze;
mod format;
mod macos;
mod record;
