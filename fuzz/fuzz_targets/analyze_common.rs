//! What the `analyze` targets share: the whole analyzer, offline, on a
//! trace file, and every writer on its profile.

use lrnprof_analyzer::{analyze, AnalyzeOptions, NoProgress, OutputFormat};
use std::io::Write;

/// Write `data` as a trace and analyze it as `lrnprof-analyze` would, then
/// write the profile in every format. Errors are the expected outcome of
/// most inputs; only panics and hangs are findings.
pub fn analyze_bytes(data: &[u8]) {
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
        for format in OutputFormat::ALL {
            let mut out = Vec::new();
            let _ = format.writer().write(&profile, &mut out);
        }
    }
}
