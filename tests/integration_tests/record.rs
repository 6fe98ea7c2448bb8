//! End-to-end tests of `lrnprof-rec` on Linux: build the C fixtures in
//! `tests/fixtures/rec_*.c`, record them by launching and by attaching,
//! and check the traces with `TraceReader`. Tests that need
//! `perf_event_open` skip with a message when it is not permitted.
//!
//! Submodules: `launch_attach` (threads, images, deep stacks, fork and
//! exec), `embedding` (image data in the trace, offline analysis, JIT perf
//! maps), `lifecycle` (startup errors, permissions, `--duration`, `--freq`,
//! signals); `support` holds the helpers they share.

mod embedding;
mod launch_attach;
mod lifecycle;
mod support;
