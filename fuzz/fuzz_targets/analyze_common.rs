//! What the `analyze` targets share: the whole analyzer, offline, on a
//! trace file, and every writer on its profile.

use lrnprof_analyzer::{analyze, AnalyzeOptions, NoProgress, OutputFormat};
use std::io::Write;
use std::sync::Once;

/// libFuzzer's panic hook aborts on every panic, even one that is caught.
/// The analyzer catches the unwinder's panics on purpose (a crafted trace
/// can lead framehop into arithmetic that overflows where overflow checks
/// are on, as they are here; release builds wrap and the read fails), so
/// a panic raised in framehop's code is left to that catch. Any other
/// panic still aborts, and one from framehop that nothing caught still
/// ends the run.
fn tolerate_caught_unwinder_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_unwinder = info
                .location()
                .is_some_and(|l| l.file().contains("/framehop-"));
            if !in_unwinder {
                fuzzer_hook(info);
            }
        }));
    });
}

/// Write `data` as a trace and analyze it as `lrnprof-analyze` would, then
/// write the profile in every format. Errors are the expected outcome of
/// most inputs; only panics and hangs are findings.
pub fn analyze_bytes(data: &[u8]) {
    tolerate_caught_unwinder_panics();
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
