//! End-to-end tests of lrnprof: one test binary, one module per area.

mod analyze;
#[cfg(target_os = "linux")]
mod heap;
mod macos;
mod record;
