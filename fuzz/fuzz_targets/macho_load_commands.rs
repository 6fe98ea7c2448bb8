//! The macOS backend's reader of a Mach-O header and load commands, as read
//! from a target task's memory (the reader is built on every host).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    lrnprof_recorder::fuzz::macho_load_commands(data);
});
