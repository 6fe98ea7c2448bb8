//! The whole analyzer on an untrusted trace: timeline, embedded data,
//! unwinding, symbolication and all three writers. Offline, so no local
//! file is read and a run depends only on the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "analyze_common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    common::analyze_bytes(data);
});
