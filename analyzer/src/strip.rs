//! `lrnprof-analyze strip`: a copy of a trace in which every sample keeps
//! its unwound frames (`Sample::frames`) but no stack bytes, so it holds no
//! raw process memory and is smaller. The analyzer reads it like any other.

use crate::error::AnalyzeError;
use crate::options::{AnalyzeOptions, Progress};
use crate::pipeline::{open, pool, prepare};
use crate::timeline::chunk_blocks;
use crate::unwind::ArchCache;
use crate::write_file::write_atomically;
use lrnprof_format::{Record, SampleFlags, StackSnapshot, TraceWriter, WriterOptions};
use rayon::prelude::*;
use std::path::Path;

/// What [`strip`] did.
#[derive(Debug, Clone, Default)]
pub struct StripReport {
    /// Samples rewritten.
    pub samples: u64,
    /// Stack bytes dropped (before compression).
    pub stack_bytes: u64,
    /// Size of the input trace, bytes.
    pub input_bytes: u64,
    /// Size of the stripped trace, bytes.
    pub output_bytes: u64,
    /// Warnings of the analysis (missing images: their frames may be short).
    pub warnings: Vec<String>,
}

/// Unwind every sample of `input` and write `output` with frames instead of
/// stack copies. Image data is found as for [`analyze`](crate::analyze).
pub fn strip(
    input: &Path,
    output: &Path,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<StripReport, AnalyzeError> {
    let reader = open(input, options)?;
    let pool = pool(options.jobs)?;
    let mut report = StripReport {
        input_bytes: reader.len(),
        ..Default::default()
    };
    let result = pool.install(|| {
        let prepared = prepare(&reader, options, progress, &|b| reader.data().release(b));
        report.warnings = prepared.warnings.clone();
        write_atomically(output, |out| {
            let mut w = TraceWriter::new(out, reader.header(), WriterOptions::default())
                .map_err(std::io::Error::other)?;
            let blocks = reader.blocks();
            let mut done = 0;
            for chunk in blocks.chunks(chunk_blocks()) {
                let records: Vec<Record> = chunk
                    .par_iter()
                    .flat_map_iter(|b| reader.decode_block(b).unwrap_or_default())
                    .collect();
                let records: Vec<Record> = records
                    .into_par_iter()
                    .map_init(
                        || ArchCache::new(prepared.arch),
                        |cache, r| match r {
                            Record::Sample(mut s) => {
                                let unwound = prepared.unwind(cache, &s);
                                s.frames = unwound.frames;
                                // So that the copy counts it as reaching
                                // the root, as the original did, whatever
                                // the outermost frame is named.
                                if unwound.clean {
                                    s.flags = s.flags.with(SampleFlags::REACHED_ROOT);
                                }
                                s.stack = StackSnapshot::default();
                                s.kernel_callchain = Vec::new();
                                Record::Sample(s)
                            }
                            other => other,
                        },
                    )
                    .collect();
                for r in records {
                    if let Record::Sample(_) = &r {
                        report.samples += 1;
                    }
                    w.write(&r).map_err(std::io::Error::other)?;
                }
                done += chunk.len() as u64;
                progress.update("stripping", done, blocks.len() as u64);
            }
            w.finish().map_err(std::io::Error::other)?;
            Ok(())
        })?;
        report.stack_bytes = prepared
            .timeline
            .threads
            .values()
            .map(|t| t.stack_bytes)
            .sum();
        Ok::<(), AnalyzeError>(())
    });
    progress.finish();
    result?;
    report.output_bytes = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    Ok(report)
}
