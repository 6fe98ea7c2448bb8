//! Symbolicating every unique frame of an analysis once, in parallel.

use super::{DwarfSections, FrameLine, JitMap, Symbolizer};
use crate::image::LoadedImage;
use crate::options::Progress;
use crate::pipeline::FrameKey;
use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use lrnprof_image::fde_ranges;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::OnceLock;

/// A frame's function levels (innermost first) and whether it was resolved.
pub(crate) type Resolved = (Vec<FrameLine>, bool);

/// Symbolicate every unique frame once. Returns, per frame, its function
/// levels (innermost first) and whether it was resolved.
pub(crate) fn symbolicate(
    frames: &[FrameKey],
    images: &[LoadedImage],
    jit_maps: &HashMap<u32, JitMap>,
    kernel: Option<&JitMap>,
    inline: bool,
    progress: &dyn Progress,
) -> Vec<Resolved> {
    // Frames outside images form the group `None`.
    let mut by_image: HashMap<Option<u32>, Vec<usize>> = HashMap::new();
    for (i, f) in frames.iter().enumerate() {
        by_image.entry(f.image()).or_default().push(i);
    }
    let mut groups: Vec<(Option<u32>, Vec<usize>)> = by_image.into_iter().collect();
    groups.sort_by_key(|g| g.0);
    // Split big images so that one large executable still uses every worker.
    let per_chunk = (frames.len() / rayon::current_num_threads().max(1)).max(512);
    let work: Vec<(Option<u32>, &[usize])> = groups
        .iter()
        .flat_map(|(img, idx)| idx.chunks(per_chunk).map(move |c| (*img, c)))
        .collect();
    // DWARF copied once per image, shared by that image's chunks.
    // Only the DWARF units that hold the image's addresses are parsed, and
    // none when the trace's frame table has all of them.
    let dwarf: HashMap<u32, DwarfSections> = groups
        .par_iter()
        .filter_map(|(img, idx)| {
            let img = (*img)?;
            let data = images[img as usize].data.as_ref()?;
            let mut svmas: Vec<u64> = idx
                .iter()
                .filter_map(|&i| match frames[i] {
                    FrameKey::Image { svma, .. } => Some(svma.0),
                    _ => None,
                })
                .collect();
            svmas.sort_unstable();
            // The recording machine resolved every one of them with the
            // same files (same build id): its frame table answers them all,
            // and the image's DWARF need not be read at all.
            if data
                .frames
                .as_ref()
                .is_some_and(|t| svmas.iter().all(|&s| t.get(s).is_some()))
            {
                return None;
            }
            let sections =
                std::panic::catch_unwind(|| DwarfSections::for_addresses(data, Some(&svmas)))
                    .ok()??;
            Some((img, sections))
        })
        .collect();
    // Where each image's functions start, worked out only for an image
    // with a frame that nothing names, shared by its chunks.
    let starts: HashMap<u32, OnceLock<Vec<Range<u64>>>> = groups
        .iter()
        .filter_map(|(img, _)| Some(((*img)?, OnceLock::new())))
        .collect();
    let total = work.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<Vec<(usize, Resolved)>> = work
        .par_iter()
        .map(|(img, idx)| {
            let out = match img {
                None => idx
                    .iter()
                    .map(|&i| (i, resolve_outside(frames[i], jit_maps, kernel)))
                    .collect(),
                Some(img) => {
                    let image = &images[*img as usize];
                    let symbolizer = image.data.as_ref().and_then(|d| {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            Symbolizer::new(d, dwarf.get(img))
                        }))
                        .ok()
                    });
                    let starts = || {
                        starts[img]
                            .get_or_init(|| {
                                image.data.as_ref().map_or_else(Vec::new, fde_ranges_of)
                            })
                            .as_slice()
                    };
                    idx.iter()
                        .map(|&i| {
                            let r =
                                resolve_in(image, symbolizer.as_ref(), &starts, frames[i], inline);
                            (i, r)
                        })
                        .collect()
                }
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

/// A frame outside every image: named by its process's JIT map (or for
/// a kernel frame, the kernel's symbols), else shown as its address.
fn resolve_outside(
    frame: FrameKey,
    jit_maps: &HashMap<u32, JitMap>,
    kernel: Option<&JitMap>,
) -> Resolved {
    if let FrameKey::Kernel { avma } = frame {
        return match kernel.and_then(|k| k.lookup(avma)) {
            Some(n) => (vec![line(n.to_string())], true),
            None => (vec![line(format!("[kernel] {:#x}", avma.0))], false),
        };
    }
    let FrameKey::Outside { pid, avma } = frame else {
        return (vec![line(format!("{:#x}", frame.address()))], false);
    };
    match jit_maps.get(&pid.0).and_then(|m| m.lookup(avma)) {
        Some(n) => (vec![line(n.to_string())], true),
        None => (vec![line(format!("{:#x}", avma.0))], false),
    }
}

/// A frame in `image`: named by its symbolizer, else shown as
/// `IMAGE+OFFSET` (from the image's base for an SVMA, which is the
/// `__TEXT` address on Mach-O and 0 on ELF; the file offset when the image
/// has no data). The offset is that of the function's start where an
/// unwind entry of the image (`starts()`: their ranges, sorted) holds
/// the address: a function that no symbol names (a stripped library's
/// static functions) is then one function, not one per address sampled.
fn resolve_in<'a>(
    image: &LoadedImage,
    symbolizer: Option<&Symbolizer>,
    starts: &dyn Fn() -> &'a [Range<u64>],
    frame: FrameKey,
    inline: bool,
) -> Resolved {
    let offset = match frame {
        FrameKey::Image { svma, .. } => {
            // Debug info may come from an untrusted trace: a panic in the
            // DWARF readers leaves the frame unresolved.
            let lines = symbolizer
                .and_then(|s| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        s.lookup(svma, inline)
                    }))
                    .ok()
                })
                .unwrap_or_default();
            if !lines.is_empty() {
                return (lines, true);
            }
            let base = image.data.as_ref().map_or(0, |d| d.base_svma);
            function_start(starts(), svma.0)
                .unwrap_or(svma.0)
                .wrapping_sub(base)
        }
        FrameKey::Unresolved { offset, .. } => offset.0,
        FrameKey::Outside { avma, .. } | FrameKey::Kernel { avma } => avma.0,
    };
    (
        vec![line(format!("{}+{offset:#x}", image.short_name()))],
        false,
    )
}

/// The SVMA ranges of the FDEs of an ELF image's `.eh_frame` and
/// `.debug_frame`, sorted by start: where its functions start. Empty for
/// Mach-O (whose code its symbols name) and where the tables do not parse.
fn fde_ranges_of(data: &crate::image::ImageData) -> Vec<Range<u64>> {
    if data.is_macho || !data.little_endian {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let Some(s) = data.section(".eh_frame").filter(|s| !s.bytes.is_empty()) {
        let mut eh_frame = EhFrame::new(&s.bytes, LittleEndian);
        eh_frame.set_address_size(8);
        out.extend(fde_ranges(&eh_frame, &data.eh_frame_bases(s.svma)).unwrap_or_default());
    }
    if let Some(bytes) = data.section(".debug_frame").and_then(|s| s.read()) {
        let mut debug_frame = DebugFrame::new(&bytes, LittleEndian);
        debug_frame.set_address_size(8);
        out.extend(fde_ranges(&debug_frame, &BaseAddresses::default()).unwrap_or_default());
    }
    out.sort_by_key(|r| r.start);
    out
}

/// The start of the range of `ranges` (sorted by start) that holds
/// `svma`: the last one starting at or below it, if it reaches it.
fn function_start(ranges: &[Range<u64>], svma: u64) -> Option<u64> {
    let below = ranges.partition_point(|r| r.start <= svma);
    ranges[..below]
        .last()
        .filter(|r| r.contains(&svma))
        .map(|r| r.start)
}

fn line(function: String) -> FrameLine {
    FrameLine {
        function,
        file: None,
        line: None,
    }
}
