//! Entry points of the fuzz targets in `fuzz/`: the recorder's parsers of
//! bytes it does not control, reachable from outside the crate. Not a
//! stable API: it follows the recorder's internals.

/// Parse `data` as the Mach-O header and load commands the macOS backend
/// reads at an image's load address in the target, and check what it
/// yields. Built on every host, like the parser.
pub fn macho_load_commands(data: &[u8]) {
    crate::macho::fuzz_load_commands(data);
}

/// Treat `data` as a perf ring-buffer drain: its first 9 bytes choose the
/// record layout (`sample_type`, user register count), the rest is records.
/// Compact the samples' stack copies as the draining thread does, parse
/// every record as the writer thread does, and check that compaction
/// changes no parsed sample.
#[cfg(target_os = "linux")]
pub fn perf_records(data: &[u8]) {
    crate::native::fuzz_records(data);
}
