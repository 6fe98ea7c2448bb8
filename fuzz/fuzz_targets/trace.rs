//! A whole trace file: header, index or forward scan, every record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lrnprof_format::TraceReader;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = TraceReader::new(data) {
        let _ = reader.report().lost_bytes();
        for record in reader.records() {
            let _ = record;
        }
    }
});
