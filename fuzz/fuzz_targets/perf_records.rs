//! The recorder's handling of perf ring-buffer bytes: the draining
//! thread's compaction of stack copies, then the writer thread's record
//! parser, on a layout chosen by the input's first 9 bytes. Checks that
//! compaction makes progress and changes no parsed sample.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    lrnprof_recorder::fuzz::perf_records(data);
});
