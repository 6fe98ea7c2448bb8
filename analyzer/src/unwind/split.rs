//! Images whose `.eh_frame` leaves code to `.debug_frame`.
//!
//! framehop reads one unwind table per module: `.eh_frame` where there is
//! one, `.debug_frame` only where there is not. A Go program that links C
//! code (cgo, linked by the system linker) has both: the C compiler's
//! `.eh_frame` for the C code, and Go's `.debug_frame` for all Go code,
//! which that `.eh_frame` does not describe. Read as one module, every Go
//! function was unwound by frame pointer alone, and stacks stopped where Go
//! assembly uses the frame pointer register for data (`crypto/sha256`).
//!
//! Such an image becomes several framehop modules over adjacent address
//! ranges of its mapping: the ranges only `.debug_frame` describes each get
//! a module that reads `.debug_frame`, the rest a module that reads
//! `.eh_frame` as before. Where both tables describe a function,
//! `.eh_frame` is used, as framehop does for a whole image. Code built
//! without unwind tables (musl's libc) gets its `.debug_frame` from its
//! instructions ([`lrnprof_image::code_debug_frame`]) and is split alike.

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use lrnprof_image::fde_ranges;
use std::ops::Range;

/// Most `.debug_frame`-only ranges an image is split at: each becomes a
/// framehop module that indexes the whole `.debug_frame`. An image past
/// this is read from `.eh_frame` alone, as framehop would.
const MAX_RANGES: usize = 16;

/// Where in an image the unwind tables are.
pub(crate) struct Tables<'a> {
    pub eh_frame: &'a [u8],
    pub eh_frame_svma: u64,
    pub text_svma: Option<u64>,
    pub got_svma: Option<u64>,
    pub debug_frame: &'a [u8],
}

/// The SVMA ranges, sorted, that `.debug_frame` describes and `.eh_frame`
/// does not: FDEs of `.debug_frame` that no FDE of `.eh_frame` overlaps,
/// joined where no `.eh_frame` FDE lies between them. Empty where there are
/// none, where either table is malformed, or past [`MAX_RANGES`].
pub(crate) fn debug_frame_only(tables: &Tables<'_>) -> Vec<Range<u64>> {
    let mut bases = BaseAddresses::default().set_eh_frame(tables.eh_frame_svma);
    if let Some(text) = tables.text_svma {
        bases = bases.set_text(text);
    }
    if let Some(got) = tables.got_svma {
        bases = bases.set_got(got);
    }
    let mut eh_frame = EhFrame::new(tables.eh_frame, LittleEndian);
    eh_frame.set_address_size(8);
    let mut debug_frame = DebugFrame::new(tables.debug_frame, LittleEndian);
    debug_frame.set_address_size(8);
    let (Some(eh), Some(debug)) = (
        fde_ranges(&eh_frame, &bases),
        fde_ranges(&debug_frame, &BaseAddresses::default()),
    ) else {
        return Vec::new();
    };
    let only = only_in_debug(eh, debug);
    if only.len() > MAX_RANGES {
        return Vec::new();
    }
    only
}

/// The ranges of `debug` that no range of `eh` overlaps, joined where no
/// range of `eh` overlaps the gap between them. Both sorted by start.
fn only_in_debug(eh: Vec<Range<u64>>, debug: Vec<Range<u64>>) -> Vec<Range<u64>> {
    let covered = Covered::new(eh);
    let mut only: Vec<Range<u64>> = Vec::new();
    for d in debug.into_iter().filter(|d| !covered.overlaps(d)) {
        match only.last_mut() {
            Some(last) if d.start <= last.end || !covered.overlaps(&(last.end..d.start)) => {
                last.end = last.end.max(d.end);
            }
            _ => only.push(d),
        }
    }
    only
}

/// The code `.eh_frame` describes: its FDE ranges sorted by start, with the
/// greatest end up to each, for overlap tests.
struct Covered {
    starts: Vec<u64>,
    max_end: Vec<u64>,
}

impl Covered {
    fn new(ranges: Vec<Range<u64>>) -> Covered {
        let starts = ranges.iter().map(|r| r.start).collect();
        let max_end = ranges
            .iter()
            .scan(0, |max, r| {
                *max = r.end.max(*max);
                Some(*max)
            })
            .collect();
        Covered { starts, max_end }
    }

    /// Whether a range of `.eh_frame` overlaps `r`.
    fn overlaps(&self, r: &Range<u64>) -> bool {
        let before_end = self.starts.partition_point(|&s| s < r.end);
        before_end > 0 && self.max_end[before_end - 1] > r.start
    }
}

/// A mapping's address range cut at the `.debug_frame`-only ranges:
/// (AVMA range, whether its module reads `.debug_frame`), in order,
/// covering `avma` without gaps. `bias` is AVMA minus SVMA.
pub(crate) fn segments(
    avma: Range<u64>,
    only: &[Range<u64>],
    bias: u64,
) -> Vec<(Range<u64>, bool)> {
    let mut out = Vec::new();
    let mut at = avma.start;
    for r in only {
        let start = r.start.wrapping_add(bias).clamp(at, avma.end);
        let end = r.end.wrapping_add(bias).clamp(start, avma.end);
        if start == end {
            continue;
        }
        if at < start {
            out.push((at..start, false));
        }
        out.push((start..end, true));
        at = end;
    }
    if at < avma.end || out.is_empty() {
        out.push((at..avma.end, false));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_counts_any_eh_frame_range_reaching_in() {
        let c = Covered::new(vec![0..100, 10..20, 200..300]);
        assert!(
            c.overlaps(&(50..60)),
            "inside the first, past the nested one"
        );
        assert!(!c.overlaps(&(100..200)));
        assert!(c.overlaps(&(150..201)));
        assert!(!c.overlaps(&(300..400)));
        assert!(!Covered::new(Vec::new()).overlaps(&(0..10)));
    }

    #[test]
    fn debug_frame_only_code_is_found_and_joined_across_gaps_without_eh_frame() {
        // Go code at 0x1000.., C code at 0x100.. and 0x9000.. (cgo).
        let eh = vec![0x100..0x180, 0x9000..0x9100];
        let debug = vec![
            0x1000..0x1100,
            0x1100..0x1200,
            0x1300..0x1400,
            0x9080..0x90a0,
        ];
        assert_eq!(only_in_debug(eh, debug), vec![0x1000..0x1400]);
        // An `.eh_frame` function between two of them splits the range.
        let eh = vec![0x1200..0x1280, 0x2000..0x2010];
        let debug = vec![0x1000..0x1100, 0x1300..0x1400];
        assert_eq!(
            only_in_debug(eh, debug),
            vec![0x1000..0x1100, 0x1300..0x1400]
        );
        // Both describing the same code: none.
        let same = vec![0x10..0x20, 0x20..0x30];
        assert_eq!(only_in_debug(same.clone(), same), Vec::<Range<u64>>::new());
    }

    #[test]
    fn malformed_tables_give_no_ranges() {
        let tables = Tables {
            eh_frame: &[],
            eh_frame_svma: 0,
            text_svma: None,
            got_svma: None,
            debug_frame: &[0x10, 0, 0, 0, 1, 2, 3],
        };
        assert!(debug_frame_only(&tables).is_empty());
    }

    #[test]
    fn segments_cover_the_mapping_in_order() {
        let seg = segments(0x1000..0x9000, &[0x100..0x200, 0x400..0x500], 0x1000);
        assert_eq!(
            seg,
            vec![
                (0x1000..0x1100, false),
                (0x1100..0x1200, true),
                (0x1200..0x1400, false),
                (0x1400..0x1500, true),
                (0x1500..0x9000, false),
            ]
        );
        // Ranges outside the mapping are dropped; one reaching its end ends it.
        let seg = segments(0x11000..0x12000, &[0..0x10, 0x10f00..0x15000], 0x1000);
        assert_eq!(
            seg,
            vec![(0x11000..0x11f00, false), (0x11f00..0x12000, true)]
        );
        assert_eq!(
            segments(0x1000..0x2000, &[], 0),
            vec![(0x1000..0x2000, false)]
        );
    }
}
