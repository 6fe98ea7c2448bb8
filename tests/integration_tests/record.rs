//! End-to-end tests of `lrnprof-rec` on Linux: build the C fixtures in
//! `tests/fixtures/rec_*.c`, record them by launching and by attaching,
//! and check the traces with `TraceReader`. Tests that need
//! `perf_event_open` skip with a message when it is not permitted.
//!
//! Submodules: `launch_attach` (threads, images, deep stacks, fork and
//! exec), `embedding` (image data in the trace, offline analysis, JIT perf
//! maps), `lifecycle` (startup errors, permissions, `--duration`, `--freq`,
//! SIGKILL and SIGTERM), `signals` (Ctrl-C on a terminal and from outside,
//! second signals, attached recordings), `as_library` (the library in a
//! program that keeps its own signal handler), `syscalls` (`--syscalls`
//! and `--off-cpu` against strace, call sites, threads, a killed target,
//! permissions), `system` (`--all` and `--kernel`: processes started
//! outside the recorder, exec, short-lived processes, kernel frames named
//! offline, permissions); `support` holds the helpers they share.

mod as_library;
mod embedding;
mod launch_attach;
mod lifecycle;
#[cfg(target_os = "linux")]
mod signals;
mod support;
#[cfg(target_os = "linux")]
mod syscalls;
#[cfg(target_os = "linux")]
mod system;
