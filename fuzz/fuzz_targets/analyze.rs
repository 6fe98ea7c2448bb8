//! The whole analyzer on an untrusted trace: timeline, embedded data,
//! unwinding, symbolication and all three writers. Offline, so no local
//! file is read and a run depends only on the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lrnprof_analyzer::{analyze, AnalyzeOptions, NoProgress, OutputFormat};
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    // The analyzer opens traces by path: one scratch file per fuzzing process.
    let path = std::env::temp_dir().join(format!("lrnprof-fuzz-{}.lpt", std::process::id()));
    let Ok(mut file) = std::fs::File::create(&path) else {
        return;
    };
    if file.write_all(data).is_err() {
        return;
    }
    drop(file);
    let options = AnalyzeOptions {
        jobs: 1,
        offline: true,
        keep_sequences: true,
        every_sample: true,
        ..AnalyzeOptions::default()
    };
    if let Ok(profile) = analyze(&path, &options, &NoProgress) {
        for format in [
            OutputFormat::Pprof,
            OutputFormat::Folded,
            OutputFormat::Speedscope,
            OutputFormat::Svg,
            OutputFormat::Firefox,
        ] {
            let mut out = Vec::new();
            let _ = format.writer().write(&profile, &mut out);
        }
    }
});
