//! Symbolicating every unique frame of an analysis once, in parallel.

use super::{DwarfSections, FrameLine, JitMap, Symbolizer};
use crate::image::LoadedImage;
use crate::options::Progress;
use crate::pipeline::{FrameKey, NO_IMAGE};
use rayon::prelude::*;
use std::collections::HashMap;

/// A frame's function levels (innermost first) and whether it was resolved.
pub(crate) type Resolved = (Vec<FrameLine>, bool);

/// Symbolicate every unique frame once. Returns, per frame, its function
/// levels (innermost first) and whether it was resolved.
pub(crate) fn symbolicate(
    frames: &[FrameKey],
    images: &[LoadedImage],
    jit_maps: &HashMap<u32, JitMap>,
    inline: bool,
    progress: &dyn Progress,
) -> Vec<Resolved> {
    let mut by_image: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, f) in frames.iter().enumerate() {
        by_image.entry(f.image).or_default().push(i);
    }
    let mut groups: Vec<(u32, Vec<usize>)> = by_image.into_iter().collect();
    groups.sort_by_key(|g| g.0);
    // Split big images so that one large executable still uses every worker.
    let per_chunk = (frames.len() / rayon::current_num_threads().max(1)).max(512);
    let work: Vec<(u32, &[usize])> = groups
        .iter()
        .flat_map(|(img, idx)| idx.chunks(per_chunk).map(move |c| (*img, c)))
        .collect();
    // DWARF copied once per image, shared by that image's chunks.
    let dwarf: HashMap<u32, DwarfSections> = groups
        .par_iter()
        .filter(|(img, _)| *img != NO_IMAGE)
        .filter_map(|(img, _)| {
            let data = images[*img as usize].data.as_ref()?;
            let sections = std::panic::catch_unwind(|| DwarfSections::new(data)).ok()??;
            Some((*img, sections))
        })
        .collect();
    let total = work.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<Vec<(usize, Resolved)>> = work
        .par_iter()
        .map(|(img, idx)| {
            let out = if *img == NO_IMAGE {
                idx.iter()
                    .map(|&i| {
                        let f = frames[i];
                        let name = jit_maps.get(&f.pid).and_then(|m| m.lookup(f.addr));
                        (
                            i,
                            match name {
                                Some(n) => (vec![line(n.to_string())], true),
                                None => (vec![line(format!("{:#x}", f.addr))], false),
                            },
                        )
                    })
                    .collect()
            } else {
                let image = &images[*img as usize];
                // Debug info may come from an untrusted trace: a panic in
                // the DWARF readers leaves the frames unresolved.
                let guard = |f: &dyn Fn() -> Vec<FrameLine>| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_default()
                };
                let symbolizer = image.data.as_ref().and_then(|d| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        Symbolizer::new(d, dwarf.get(img))
                    }))
                    .ok()
                });
                idx.iter()
                    .map(|&i| {
                        let f = frames[i];
                        let lines = symbolizer
                            .as_ref()
                            .map(|s| guard(&|| s.lookup(f.addr, inline)))
                            .unwrap_or_default();
                        (
                            i,
                            if lines.is_empty() {
                                let base = image.data.as_ref().map_or(0, |d| d.base_svma);
                                let off = f.addr.wrapping_sub(base);
                                (
                                    vec![line(format!("{}+{off:#x}", image.short_name()))],
                                    false,
                                )
                            } else {
                                (lines, true)
                            },
                        )
                    })
                    .collect()
            };
            let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            progress.update("symbolicating", d, total);
            out
        })
        .collect();
    let mut lines = vec![(Vec::new(), false); frames.len()];
    for (i, l) in results.into_iter().flatten() {
        lines[i] = l;
    }
    lines
}

fn line(function: String) -> FrameLine {
    FrameLine {
        function,
        file: None,
        line: None,
    }
}
