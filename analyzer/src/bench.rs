//! Hooks for lrnprof's own benchmarks (`benches/`): the inner steps of an
//! analysis, unwinding one sample and symbolicating one address, timed on
//! a real trace. Not a stable API: it follows the analyzer's internals.

use crate::address::Svma;
use crate::error::AnalyzeError;
use crate::options::{AnalyzeOptions, NoProgress};
use crate::pipeline::{open, prepare, FrameKey, Prepared};
use crate::symbolicate::{DwarfSections, Symbolizer};
use crate::unwind::ArchCache;
use lrnprof_format::{Record, Sample};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// At most this many samples are kept: enough to cycle through, bounded.
const MAX_SAMPLES: usize = 20_000;

/// A trace prepared for timing its inner steps: images loaded, unwinders
/// built, samples decoded, and the distinct addresses its samples unwind to.
pub struct BenchTrace {
    prepared: Prepared,
    samples: Vec<Sample>,
    /// Distinct frames inside images that have data (image, lookup
    /// address), in first-seen order.
    frames: Vec<(u32, Svma)>,
}

/// A per-worker unwind cache, as the analyzer keeps one per worker.
pub struct BenchUnwindCache(ArchCache);

impl BenchTrace {
    /// Open and prepare `path`; fails like [`analyze`](crate::analyze) would.
    pub fn open(path: &Path) -> Result<BenchTrace, AnalyzeError> {
        let options = AnalyzeOptions::default();
        let reader = open(path, &options)?;
        let prepared = prepare(&reader, &options, &NoProgress, &|_| {});
        let samples: Vec<Sample> = reader
            .records()
            .filter_map(|r| match r {
                Ok(Record::Sample(s)) => Some(s),
                _ => None,
            })
            .take(MAX_SAMPLES)
            .collect();
        let mut cache = ArchCache::new(prepared.arch);
        let mut seen = HashSet::new();
        let mut frames = Vec::new();
        for s in &samples {
            let unwound = prepared.unwind(&mut cache, s);
            for f in prepared.frame_keys(s, &unwound.frames) {
                // Keyed by SVMA only where the image has data.
                if let FrameKey::Image { image, svma } = f {
                    if seen.insert((image, svma)) {
                        frames.push((image, svma));
                    }
                }
            }
        }
        Ok(BenchTrace {
            prepared,
            samples,
            frames,
        })
    }

    /// Samples available to [`unwind_sample`](Self::unwind_sample).
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// Distinct addresses available to the symbolication hooks.
    pub fn address_count(&self) -> usize {
        self.frames.len()
    }

    /// A fresh unwind cache.
    pub fn unwind_cache(&self) -> BenchUnwindCache {
        BenchUnwindCache(ArchCache::new(self.prepared.arch))
    }

    /// Unwind sample `i` (modulo the count); returns its number of frames.
    pub fn unwind_sample(&self, cache: &mut BenchUnwindCache, i: usize) -> usize {
        let s = &self.samples[i % self.samples.len().max(1)];
        self.prepared.unwind(&mut cache.0, s).frames.len()
    }

    /// Symbolicate address `i` (modulo the count) cold: load its image's
    /// DWARF and build the symbolizer first, as for the first address of
    /// an image. Returns the number of function levels found.
    pub fn symbolicate_cold(&self, i: usize) -> usize {
        let Some((image, svma)) = self.frame(i) else {
            return 0;
        };
        let Some(data) = self.prepared.images[image as usize].data.as_ref() else {
            return 0;
        };
        let dwarf = DwarfSections::for_addresses(data, Some(&[svma.0]));
        Symbolizer::new(data, dwarf.as_ref())
            .lookup(svma, true)
            .len()
    }

    /// Run `f` with a function that symbolicates address `i` warm: every
    /// image's symbolizer is built once, before `f` runs.
    pub fn with_warm_symbolizers<R>(
        &self,
        f: impl FnOnce(&mut dyn FnMut(usize) -> usize) -> R,
    ) -> R {
        let dwarf: HashMap<u32, Option<DwarfSections>> = self
            .frames
            .iter()
            .map(|&(image, _)| image)
            .collect::<HashSet<_>>()
            .into_iter()
            .filter_map(|img| {
                let data = self.prepared.images[img as usize].data.as_ref()?;
                let mut svmas: Vec<u64> = self
                    .frames
                    .iter()
                    .filter(|&&(i, _)| i == img)
                    .map(|&(_, svma)| svma.0)
                    .collect();
                svmas.sort_unstable();
                Some((img, DwarfSections::for_addresses(data, Some(&svmas))))
            })
            .collect();
        let symbolizers: HashMap<u32, Symbolizer<'_>> = dwarf
            .iter()
            .filter_map(|(img, d)| {
                let data = self.prepared.images[*img as usize].data.as_ref()?;
                Some((*img, Symbolizer::new(data, d.as_ref())))
            })
            .collect();
        let mut lookup = |i: usize| {
            self.frame(i)
                .and_then(|(image, svma)| Some(symbolizers.get(&image)?.lookup(svma, true).len()))
                .unwrap_or(0)
        };
        f(&mut lookup)
    }

    fn frame(&self, i: usize) -> Option<(u32, Svma)> {
        (!self.frames.is_empty()).then(|| self.frames[i % self.frames.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_that_is_not_there_is_an_error() {
        assert!(BenchTrace::open(Path::new("/nonexistent/trace.lpt")).is_err());
    }
}
