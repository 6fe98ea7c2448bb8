//! End-to-end tests of lrnprof: one test binary, one module per area.

mod analyze;
mod macos;
mod record;
