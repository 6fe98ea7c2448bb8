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
//!
//! Each `.debug_frame` module gets a `.debug_frame` of the FDEs in its own
//! range ([`cut_debug_frame`]), so the indexes framehop builds add up to one
//! of the whole section however many ranges there are. A program's code
//! without CFI lies in many separate stretches between functions with it
//! (Node.js: 24, the hand-written assembly of libgmp: 21), and the rules
//! for all of them must be read alike whether they come from the file (all
//! its functions) or from a trace (those it reaches), or the same trace
//! gives other stacks on another machine.

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use lrnprof_image::{fde_ranges, for_each_fde};
use std::collections::HashMap;
use std::ops::Range;

/// Most `.debug_frame`-only ranges an image is split at: each becomes a
/// framehop module of its own, between two that read `.eh_frame`. An image
/// past this is read from `.eh_frame` alone, as framehop would.
const MAX_RANGES: usize = 4096;

/// Where in an image the unwind tables are.
pub(crate) struct Tables<'a> {
    pub eh_frame: &'a [u8],
    /// What `.eh_frame`'s pointers are read with.
    pub eh_frame_bases: gimli::BaseAddresses,
    pub debug_frame: &'a [u8],
}

/// The SVMA ranges, sorted, that `.debug_frame` describes and `.eh_frame`
/// does not: FDEs of `.debug_frame` that no FDE of `.eh_frame` overlaps,
/// joined where no `.eh_frame` FDE lies between them. Empty where there are
/// none, where either table is malformed, or past [`MAX_RANGES`].
pub(crate) fn debug_frame_only(tables: &Tables<'_>) -> Vec<Range<u64>> {
    let mut eh_frame = EhFrame::new(tables.eh_frame, LittleEndian);
    eh_frame.set_address_size(8);
    let mut debug_frame = DebugFrame::new(tables.debug_frame, LittleEndian);
    debug_frame.set_address_size(8);
    let (Some(eh), Some(debug)) = (
        fde_ranges(&eh_frame, &tables.eh_frame_bases),
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

/// `.debug_frame` `section` cut into one section per range of `only`
/// (sorted, not overlapping): the FDEs that start in the range, after the
/// CIEs they use, their CIE pointers set to where those now are. `None`
/// where the section does not parse, or where the cut sections would take
/// more than twice its size and [`CUT_SLACK`]: each range copies the CIEs
/// it uses, and a malformed trace's section could have every range use one
/// huge CIE.
pub(crate) fn cut_debug_frame(section: &[u8], only: &[Range<u64>]) -> Option<Vec<Vec<u8>>> {
    let mut debug_frame = DebugFrame::new(section, LittleEndian);
    debug_frame.set_address_size(8);
    let bases = BaseAddresses::default();
    // Per range: (offset of the CIE, offset of the FDE) in `section`.
    let mut fdes: Vec<Vec<(usize, usize)>> = vec![Vec::new(); only.len()];
    for_each_fde(&debug_frame, &bases, |fde| {
        let start = fde.initial_address();
        let i = only.partition_point(|r| r.end <= start);
        if only.get(i).is_some_and(|r| r.contains(&start)) {
            fdes[i].push((fde.cie().offset(), fde.offset()));
        }
    })?;
    let mut budget = section.len().saturating_mul(2).saturating_add(CUT_SLACK);
    fdes.into_iter()
        .map(|fdes| {
            let mut out = Vec::new();
            let mut cies: HashMap<usize, usize> = HashMap::new();
            for &(cie, _) in &fdes {
                if let std::collections::hash_map::Entry::Vacant(e) = cies.entry(cie) {
                    e.insert(out.len());
                    out.extend_from_slice(section.get(entry_range(section, cie)?)?);
                }
            }
            for (cie, fde) in fdes {
                let at = out.len();
                out.extend_from_slice(section.get(entry_range(section, fde)?)?);
                let new = *cies.get(&cie)?;
                // The CIE pointer follows the length: 4 bytes of it in
                // 32-bit DWARF, 12 (0xffffffff and 8) in 64-bit.
                if out.get(at..at + 4)? == [0xff; 4] {
                    out.get_mut(at + 12..at + 20)?
                        .copy_from_slice(&(new as u64).to_le_bytes());
                } else {
                    out.get_mut(at + 4..at + 8)?
                        .copy_from_slice(&u32::try_from(new).ok()?.to_le_bytes());
                }
            }
            budget = budget.checked_sub(out.len())?;
            Some(out)
        })
        .collect()
}

/// Bytes the sections [`cut_debug_frame`] makes may take beyond twice the
/// section's: the CIEs copied into each of many ranges.
const CUT_SLACK: usize = 64 << 10;

/// The bytes of the entry at `at` of a `.debug_frame`, its length field
/// included.
fn entry_range(section: &[u8], at: usize) -> Option<Range<usize>> {
    let u32_at = |i: usize| {
        let b = section.get(i..i.checked_add(4)?)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    };
    let (header, length) = match u32_at(at)? {
        u32::MAX => {
            let b = section.get(at.checked_add(4)?..at.checked_add(12)?)?;
            (
                12,
                usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()?,
            )
        }
        length => (4, length as usize),
    };
    let end = at.checked_add(header)?.checked_add(length)?;
    (end <= section.len()).then_some(at..end)
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
/// (AVMA range, the index in `only` of the range whose module reads
/// `.debug_frame`, or `None` for one that reads `.eh_frame`), in order,
/// covering `avma` without gaps. `bias` is AVMA minus SVMA.
pub(crate) fn segments(
    avma: Range<u64>,
    only: &[Range<u64>],
    bias: u64,
) -> Vec<(Range<u64>, Option<usize>)> {
    let mut out = Vec::new();
    let mut at = avma.start;
    for (i, r) in only.iter().enumerate() {
        let start = r.start.wrapping_add(bias).clamp(at, avma.end);
        let end = r.end.wrapping_add(bias).clamp(start, avma.end);
        if start == end {
            continue;
        }
        if at < start {
            out.push((at..start, None));
        }
        out.push((start..end, Some(i)));
        at = end;
    }
    if at < avma.end || out.is_empty() {
        out.push((at..avma.end, None));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{CieOrFde, UnwindSection};

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
            eh_frame_bases: BaseAddresses::default(),
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
                (0x1000..0x1100, None),
                (0x1100..0x1200, Some(0)),
                (0x1200..0x1400, None),
                (0x1400..0x1500, Some(1)),
                (0x1500..0x9000, None),
            ]
        );
        // Ranges outside the mapping are dropped; one reaching its end ends it.
        let seg = segments(0x11000..0x12000, &[0..0x10, 0x10f00..0x15000], 0x1000);
        assert_eq!(
            seg,
            vec![(0x11000..0x11f00, None), (0x11f00..0x12000, Some(1))]
        );
        assert_eq!(
            segments(0x1000..0x2000, &[], 0),
            vec![(0x1000..0x2000, None)]
        );
    }

    /// A `.debug_frame` entry: 32-bit DWARF length, then `id` and `body`.
    fn entry(out: &mut Vec<u8>, id: u32, body: &[u8]) {
        out.extend_from_slice(&(4 + body.len() as u32).to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(body);
    }

    /// A version 1 CIE (no augmentation, code alignment 1, data alignment
    /// -8, return address register 16) with `initial` instructions.
    fn cie(out: &mut Vec<u8>, initial: &[u8]) -> u32 {
        let at = out.len() as u32;
        let mut body = vec![1, 0, 1, 0x78, 16];
        body.extend_from_slice(initial);
        while (body.len() + 8) % 8 != 0 {
            body.push(0); // DW_CFA_nop
        }
        entry(out, u32::MAX, &body);
        at
    }

    /// An FDE of `cie` for `start..start + len`, with `instructions`.
    fn fde(out: &mut Vec<u8>, cie: u32, start: u64, len: u64, instructions: &[u8]) {
        let mut body = Vec::new();
        body.extend_from_slice(&start.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(instructions);
        while (body.len() + 8) % 8 != 0 {
            body.push(0);
        }
        entry(out, cie, &body);
    }

    /// (start, CFA offset from rsp) of each FDE of a cut section, as gimli
    /// reads it.
    fn read(section: &[u8]) -> Vec<(u64, i64)> {
        let mut debug_frame = DebugFrame::new(section, LittleEndian);
        debug_frame.set_address_size(8);
        let bases = BaseAddresses::default();
        let mut ctx = gimli::UnwindContext::new();
        let mut out = Vec::new();
        let mut entries = debug_frame.entries(&bases);
        while let Some(entry) = entries.next().unwrap() {
            if let CieOrFde::Fde(partial) = entry {
                let fde = partial.parse(DebugFrame::cie_from_offset).unwrap();
                let row = fde
                    .unwind_info_for_address(&debug_frame, &bases, &mut ctx, fde.initial_address())
                    .unwrap();
                let gimli::CfaRule::RegisterAndOffset { offset, .. } = *row.cfa() else {
                    panic!("{:?}", row.cfa());
                };
                out.push((fde.initial_address(), offset));
            }
        }
        out
    }

    #[test]
    fn each_range_gets_its_own_fdes_after_the_cies_they_use() {
        // Two CIEs (CFA rsp+8 and rsp+16), FDEs of both, out of order.
        let mut section = Vec::new();
        let a = cie(&mut section, &[0x0c, 7, 8]); // DW_CFA_def_cfa rsp, 8
        let b = cie(&mut section, &[0x0c, 7, 16]);
        fde(&mut section, a, 0x3000, 0x10, &[]);
        fde(&mut section, b, 0x1000, 0x10, &[]);
        fde(&mut section, a, 0x1010, 0x10, &[0x0e, 24]); // DW_CFA_def_cfa_offset 24
        fde(&mut section, b, 0x5000, 0x10, &[]);
        let only = [0x1000..0x1020, 0x3000..0x3010, 0x4000..0x4010];
        let cut = cut_debug_frame(&section, &only).unwrap();
        assert_eq!(cut.len(), 3);
        assert_eq!(read(&cut[0]), [(0x1000, 16), (0x1010, 24)]);
        assert_eq!(read(&cut[1]), [(0x3000, 8)]);
        assert!(cut[2].is_empty());
        // One CIE each where only one is used.
        let one = [only[1].clone()];
        let cut = cut_debug_frame(&section, &one).unwrap();
        assert_eq!(cut[0].len(), (b - a) as usize + 24);
        // Truncated: no cut.
        assert!(cut_debug_frame(&section[..section.len() - 1], &only).is_none());
    }

    /// A 64-bit DWARF entry: 0xffffffff, the length in 8 bytes, `id` in 8.
    fn entry64(out: &mut Vec<u8>, id: u64, body: &[u8]) {
        out.extend_from_slice(&[0xff; 4]);
        out.extend_from_slice(&(8 + body.len() as u64).to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(body);
    }

    #[test]
    fn cies_after_their_fdes_and_64_bit_entries_are_cut_alike() {
        // A 32-bit FDE (24 bytes) before its CIE, at 24.
        let mut section = Vec::new();
        fde(&mut section, 24, 0x2000, 0x10, &[]);
        assert_eq!(section.len(), 24);
        cie(&mut section, &[0x0c, 7, 24]);
        // Then a 64-bit version 4 CIE (address size 8) and its FDE.
        let cie64 = section.len() as u64;
        let mut cie_body = vec![4, 0, 8, 0, 1, 0x78, 16, 0x0c, 7, 40];
        while (cie_body.len() + 20) % 8 != 0 {
            cie_body.push(0);
        }
        entry64(&mut section, u64::MAX, &cie_body);
        let mut fde_body = Vec::new();
        fde_body.extend_from_slice(&0x4000u64.to_le_bytes());
        fde_body.extend_from_slice(&0x10u64.to_le_bytes());
        while (fde_body.len() + 20) % 8 != 0 {
            fde_body.push(0);
        }
        entry64(&mut section, cie64, &fde_body);
        assert_eq!(read(&section), [(0x2000, 24), (0x4000, 40)]);
        let cut = cut_debug_frame(&section, &[0x2000..0x2010, 0x4000..0x4010]).unwrap();
        assert_eq!(read(&cut[0]), [(0x2000, 24)]);
        assert_eq!(read(&cut[1]), [(0x4000, 40)]);
    }

    #[test]
    fn one_huge_cie_used_by_many_ranges_is_not_copied_into_each() {
        let mut section = Vec::new();
        let a = cie(&mut section, &[0x0c, 7, 8]);
        let mut nops = vec![0x0c, 7, 8];
        nops.resize(256 << 10, 0); // DW_CFA_nop
        let huge = cie(&mut section, &nops);
        let only: Vec<Range<u64>> = (0..8u64)
            .map(|i| 0x1000 * (i + 1)..0x1000 * (i + 1) + 0x10)
            .collect();
        for r in &only {
            fde(&mut section, huge, r.start, 0x10, &[]);
        }
        assert!(cut_debug_frame(&section, &only).is_none());
        // A few copies of a small one are no matter.
        let mut small = Vec::new();
        let a2 = cie(&mut small, &[0x0c, 7, 8]);
        assert_eq!(a, a2);
        for r in &only {
            fde(&mut small, a2, r.start, 0x10, &[]);
        }
        assert_eq!(cut_debug_frame(&small, &only).unwrap().len(), 8);
    }
}
