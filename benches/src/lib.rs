//! Benchmarks of lrnprof and the side-by-side comparison with `perf`.
//!
//! The `compare` binary runs the same workloads without a profiler, under
//! `perf record` (frame pointers and DWARF) and under `lrnprof-rec`, then
//! analyzes the traces with `perf report` and `lrnprof-analyze`, and prints
//! medians and ratios to the baseline of the same run. This library holds its
//! pieces: measuring a command's CPU time and peak memory ([`measure`]),
//! parsing `perf` output ([`parse_perf_stats`], [`parse_perf_script`]) and
//! medians ([`median`]). With `--heap` it runs the heap comparison instead
//! ([`run_heap`]): an allocation-heavy program alone, under
//! `lrnprof-rec --heap` and under heaptrack. The `syscalls` binary compares
//! syscall tracing with strace and perf trace ([`run_syscalls`]); the
//! `system` binary compares system-wide recording with `perf record -a`
//! ([`run_system`]).
//!
//! ```
//! use lrnprof_benches::{median, parse_perf_script};
//! let listing = "app 7 1.0: 1 cpu-clock:\n\t 401 main+0x1 (/app)\n\t 402 _start+0x2 (/app)\n";
//! assert_eq!(parse_perf_script(listing).root_pct(), Some(100.0));
//! assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
//! ```

#![deny(missing_docs)]

pub mod cli;
mod compare;
mod error;
mod folded;
mod heap;
mod measure;
mod perf_text;
mod report;
mod scale;
mod stats;
pub mod synthetic;
mod syscall_bench;
mod system_bench;
mod workloads;

pub use compare::{
    run, Analysis, CompareOptions, Comparison, Profiler, RunFacts, Setup, TraceFacts,
    WorkloadResult,
};
pub use error::BenchError;
pub use folded::parse_folded;
pub use heap::{
    heap_markdown, parse_program_cpu, run_heap, HeapCompareOptions, HeapComparison, HeapRun,
    HeapSetup,
};
pub use measure::{command_line, measure, parse_vmhwm_kib, wait_measured, Measured};
pub use perf_text::{
    parse_perf_script, parse_perf_stats, PerfStats, StackCompleteness, ROOT_FUNCTIONS,
};
pub use report::{machine_description, markdown};
pub use scale::{run_scale, scale_markdown, Analyzer, ScaleOptions, ScaleReport, ScaleRow};
pub use stats::{median, paired_overheads, percent};
pub use syscall_bench::{
    run_syscalls, syscall_markdown, SyscallBenchOptions, SyscallComparison, SyscallSetup,
};
pub use system_bench::{
    run_system, system_markdown, ShortLived, SystemBenchOptions, SystemComparison, SystemRound,
    SystemSetup, SystemSetupRuns,
};
pub use workloads::{prepare as prepare_workloads, pseudo_text, Workload};
