//! An image's `.eh_frame` cut down to what a trace can reach: the FDEs an
//! unwinder picks for the addresses the trace refers to, every other FDE
//! turned into filler that compresses to almost nothing.
//!
//! Entries stay at their offsets, so every CIE pointer and pc-relative
//! pointer stays valid without being rewritten. Each run of dropped FDEs
//! becomes one filler FDE spanning the run: the run's first FDE with its
//! length covering the whole run, its CIE pointer, initial address and
//! augmentation data as they were, a zero address range (so it covers no
//! address), and zeros (`DW_CFA_nop`) for the rest. A zero length would
//! end the section, so none is written.
//!
//! The analyzer makes an `.eh_frame_hdr` for the section (a trace carries
//! none), and its unwinder (framehop) takes, for a lookup address, the FDE
//! with the greatest initial address at or below it: its rule if it covers
//! the address, the rule for code no FDE covers if not. (Below every FDE
//! the header's search takes the first, which does not cover it either.)
//! The cut section is checked to give the same outcome as the whole one
//! for every lookup address, telling "below every FDE" apart from "not
//! covered" as if no header were made, which is stricter than needed;
//! anything unusual (pointer encodings other than absolute or pc-relative,
//! FDEs sharing the initial address a lookup picks, entries that do not
//! parse) keeps the section whole.

use gimli::{
    BaseAddresses, CieOrFde, EhFrame, EhFrameOffset, EndianSlice, LittleEndian, Reader,
    UnwindSection,
};

/// An `.eh_frame` cut by [`cut_eh_frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutEhFrame {
    /// The section's new bytes, as long as the old.
    pub bytes: Vec<u8>,
    /// FDEs kept as they were.
    pub kept: usize,
    /// FDEs turned into filler.
    pub dropped: usize,
}

/// One CIE or FDE of the section, by where its bytes are.
struct Entry {
    offset: usize,
    end: usize,
    /// 4, or 12 for the 64-bit format.
    header: usize,
    fde: Option<FdeAt>,
}

/// What a filler needs of an FDE.
struct FdeAt {
    start: u64,
    len: u64,
    /// Bytes of its initial address (and of its address range).
    address_size: usize,
    /// Whether its CIE has augmentation data ('z'), so it has too.
    augmented: bool,
}

/// Where an unwinder's lookup of an address ends, through an index of
/// FDEs (initial address, address range, offset) sorted by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// No FDE starts at or below it.
    NoFde,
    /// The FDE picked does not cover it.
    Uncovered,
    /// The FDE at this offset covers it.
    Covered(usize),
    /// Several FDEs start at the picked address.
    Ambiguous,
}

type Index = Vec<(u64, u64, usize)>;

fn outcome(index: &Index, address: u64) -> Outcome {
    let i = index.partition_point(|&(start, _, _)| start <= address);
    let Some(last) = i.checked_sub(1) else {
        return Outcome::NoFde;
    };
    let (start, len, offset) = index[last];
    if last > 0 && index[last - 1].0 == start {
        return Outcome::Ambiguous;
    }
    if address - start < len {
        Outcome::Covered(offset)
    } else {
        Outcome::Uncovered
    }
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

/// The section's entries up to its terminator (or end).
fn entries(
    section: &EhFrame<EndianSlice<'_, LittleEndian>>,
    data: &[u8],
    bases: &BaseAddresses,
) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    let mut offset = 0usize;
    while offset < data.len() {
        let malformed = |what: &str| format!("malformed entry at offset {offset:#x}: {what}");
        let len = read_u32(data, offset).ok_or_else(|| malformed("truncated length"))?;
        if len == 0 {
            break;
        }
        let (header, len) = match len {
            0xffff_ffff => (
                12,
                read_u64(data, offset + 4).ok_or_else(|| malformed("truncated length"))?,
            ),
            0xffff_fff0.. => return Err(malformed("reserved length")),
            len => (4, u64::from(len)),
        };
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| (offset + header).checked_add(len))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| malformed("past the end of the section"))?;
        // The CIE id / CIE pointer of `.eh_frame` is 4 bytes in both formats.
        let id = read_u32(data, offset + header);
        let fde = match id.ok_or_else(|| malformed("truncated"))? {
            0 => None,
            _ => {
                let fde = section
                    .fde_from_offset(bases, EhFrameOffset(offset), |s, b, o| {
                        s.cie_from_offset(b, o)
                    })
                    .map_err(|e| malformed(&e.to_string()))?;
                let encoding = fde
                    .cie()
                    .fde_address_encoding()
                    .unwrap_or(gimli::DW_EH_PE_absptr)
                    .0;
                // Absolute or pc-relative only: then the initial address
                // depends on the entry's bytes and offset alone.
                if encoding & 0xf0 != 0 && encoding & 0xf0 != 0x10 {
                    return Err(malformed(&format!("pointer encoding {encoding:#x}")));
                }
                let address_size = match encoding & 0x0f {
                    0x00 | 0x04 | 0x0c => 8,
                    0x02 | 0x0a => 2,
                    0x03 | 0x0b => 4,
                    _ => return Err(malformed(&format!("pointer encoding {encoding:#x}"))),
                };
                Some(FdeAt {
                    start: fde.initial_address(),
                    len: fde.len(),
                    address_size,
                    augmented: fde.cie().augmentation().is_some(),
                })
            }
        };
        out.push(Entry {
            offset,
            end,
            header,
            fde,
        });
        offset = end;
    }
    Ok(out)
}

/// The index an unwinder builds of `section`: every FDE, parsed as
/// framehop parses them.
fn index_of(
    section: &EhFrame<EndianSlice<'_, LittleEndian>>,
    bases: &BaseAddresses,
) -> Result<Index, String> {
    let mut index = Vec::new();
    let mut iter = section.entries(bases);
    while let Some(entry) = iter.next().map_err(|e| e.to_string())? {
        if let CieOrFde::Fde(partial) = entry {
            let fde = partial
                .parse(|s, b, o| s.cie_from_offset(b, o))
                .map_err(|e| e.to_string())?;
            index.push((fde.initial_address(), fde.len(), fde.offset()));
        }
    }
    index.sort_by_key(|&(start, _, _)| start);
    Ok(index)
}

fn eh_frame(data: &[u8]) -> EhFrame<EndianSlice<'_, LittleEndian>> {
    let mut section = EhFrame::new(data, LittleEndian);
    section.set_address_size(8);
    section
}

/// `.eh_frame` bytes `data` of a little-endian 64-bit image, at SVMA
/// `svma`, with only the FDEs that an unwinder picks for `lookups` (SVMAs:
/// instruction pointers as they are, return addresses minus one), others
/// turned into filler (see the module's documentation). Errors, saying
/// why, when the section should travel whole.
pub fn cut_eh_frame(data: &[u8], svma: u64, lookups: &[u64]) -> Result<CutEhFrame, String> {
    let bases = BaseAddresses::default().set_eh_frame(svma);
    let whole = eh_frame(data);
    let list = entries(&whole, data, &bases)?;
    let mut index: Index = list
        .iter()
        .filter_map(|e| e.fde.as_ref().map(|f| (f.start, f.len, e.offset)))
        .collect();
    index.sort_by_key(|&(start, _, _)| start);
    let mut lookups = lookups.to_vec();
    lookups.sort_unstable();
    lookups.dedup();
    // Keep the FDE picked for each lookup, whether it covers it or not, so
    // the cut section picks the same one.
    let mut keep = std::collections::HashSet::new();
    let mut outcomes = Vec::with_capacity(lookups.len());
    for &a in &lookups {
        let o = outcome(&index, a);
        match o {
            Outcome::Ambiguous => {
                return Err(format!(
                    "several FDEs start where address {a:#x} is looked up"
                ))
            }
            Outcome::Covered(offset) => {
                keep.insert(offset);
            }
            Outcome::Uncovered => {
                let i = index.partition_point(|&(start, _, _)| start <= a) - 1;
                keep.insert(index[i].2);
            }
            Outcome::NoFde => {}
        }
        outcomes.push(o);
    }
    let dropped = |e: &Entry| e.fde.is_some() && !keep.contains(&e.offset);
    let mut bytes = data.to_vec();
    let mut i = 0;
    while i < list.len() {
        if !dropped(&list[i]) {
            i += 1;
            continue;
        }
        let mut last = i;
        while last + 1 < list.len() && dropped(&list[last + 1]) {
            last += 1;
        }
        fill(&mut bytes, data, &list[i], list[last].end)?;
        i = last + 1;
    }
    // The check: the cut section, indexed as the unwinder indexes it,
    // gives every lookup the outcome the whole one does.
    let cut_index = index_of(&eh_frame(&bytes), &bases)
        .map_err(|e| format!("the cut section does not parse: {e}"))?;
    for (&a, &o) in lookups.iter().zip(&outcomes) {
        let cut = outcome(&cut_index, a);
        if cut != o {
            return Err(format!(
                "address {a:#x} is looked up as {cut:?} in the cut section, as {o:?} in the whole one"
            ));
        }
    }
    let fdes = index.len();
    Ok(CutEhFrame {
        bytes,
        kept: keep.len(),
        dropped: fdes - keep.len(),
    })
}

/// Turn the bytes from entry `first` (an FDE) to `end` into one filler FDE.
fn fill(bytes: &mut [u8], data: &[u8], first: &Entry, end: usize) -> Result<(), String> {
    let fde = first.fde.as_ref().expect("only FDEs are dropped");
    let at = first.offset;
    let body = (end - at - first.header) as u64;
    if first.header == 4 {
        let body = u32::try_from(body)
            .ok()
            .filter(|&b| b < 0xffff_fff0)
            .ok_or_else(|| {
                format!("dropped FDEs from offset {at:#x} span too much for one 32-bit entry")
            })?;
        bytes[at..at + 4].copy_from_slice(&body.to_le_bytes());
    } else {
        bytes[at + 4..at + 12].copy_from_slice(&body.to_le_bytes());
    }
    let range = at + first.header + 4 + fde.address_size;
    let mut rest = range + fde.address_size;
    if rest > first.end {
        return Err(format!("malformed FDE at offset {at:#x}"));
    }
    bytes[range..rest].fill(0);
    if fde.augmented {
        let mut r = EndianSlice::new(&data[rest..first.end], LittleEndian);
        let len = r
            .read_uleb128()
            .ok()
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| format!("malformed FDE augmentation at offset {at:#x}"))?;
        rest = first.end - r.len();
        rest = rest
            .checked_add(len)
            .filter(|&r| r <= first.end)
            .ok_or_else(|| format!("malformed FDE augmentation at offset {at:#x}"))?;
    }
    bytes[rest..end].fill(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection};

    /// What an unwinder gets for `address` from `section` (at SVMA
    /// `svma`): the unwind row of the FDE its index picks, or why none.
    fn rule(section: &[u8], svma: u64, address: u64) -> String {
        let bases = BaseAddresses::default().set_eh_frame(svma);
        let eh = eh_frame(section);
        let index = index_of(&eh, &bases).unwrap();
        match outcome(&index, address) {
            Outcome::Covered(offset) => {
                let fde = eh
                    .fde_from_offset(&bases, EhFrameOffset(offset), |s, b, o| {
                        s.cie_from_offset(b, o)
                    })
                    .unwrap();
                let mut ctx = gimli::UnwindContext::new();
                let row = fde.unwind_info_for_address(&eh, &bases, &mut ctx, address);
                format!(
                    "{:?}",
                    row.map(|r| (r.cfa().clone(), r.registers().cloned().collect::<Vec<_>>()))
                )
            }
            other => format!("{other:?}"),
        }
    }

    /// The FDEs of `section` that cover some address, by offset.
    fn covering(section: &[u8], svma: u64) -> Vec<usize> {
        let bases = BaseAddresses::default().set_eh_frame(svma);
        let mut offsets: Vec<usize> = index_of(&eh_frame(section), &bases)
            .unwrap()
            .into_iter()
            .filter(|&(_, len, _)| len > 0)
            .map(|(_, _, offset)| offset)
            .collect();
        offsets.sort_unstable();
        offsets
    }

    /// This test binary's `.eh_frame` (Rust: CIEs with 'zR' and, for
    /// functions that unwind on panic, 'zPLR'): cut to every fifth FDE's
    /// middle and a few ends, the lookups unwind as with the whole section
    /// and the other FDEs cover nothing.
    #[test]
    fn a_real_eh_frame_cut_unwinds_the_lookups_alike() {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&bytes[..]).unwrap();
        if file.format() != object::BinaryFormat::Elf {
            return;
        }
        let section = file.section_by_name(".eh_frame").unwrap();
        let (data, svma) = (section.data().unwrap(), section.address());
        let bases = BaseAddresses::default().set_eh_frame(svma);
        let index = index_of(&eh_frame(data), &bases).unwrap();
        assert!(index.len() > 100, "{} FDEs", index.len());
        let mut lookups: Vec<u64> = index
            .iter()
            .step_by(5)
            .filter(|&&(_, len, _)| len > 0)
            .map(|&(start, len, _)| start + len / 2)
            .collect();
        lookups.extend(index.iter().step_by(11).map(|&(start, len, _)| start + len));
        lookups.push(index[0].0.saturating_sub(1));
        let cut = cut_eh_frame(data, svma, &lookups).unwrap();
        assert_eq!(cut.bytes.len(), data.len());
        assert!(cut.kept > 0 && cut.dropped > cut.kept, "{cut:?}");
        assert_eq!(cut.kept + cut.dropped, index.len());
        for &a in &lookups {
            assert_eq!(rule(&cut.bytes, svma, a), rule(data, svma, a), "at {a:#x}");
        }
        // Kept FDEs are the only ones covering anything now.
        let kept = covering(&cut.bytes, svma);
        assert_eq!(kept.len(), cut.kept);
        for &(start, len, offset) in &index {
            if !kept.contains(&offset) && len > 0 {
                assert_ne!(
                    rule(&cut.bytes, svma, start),
                    rule(data, svma, start),
                    "dropped FDE at offset {offset:#x}"
                );
            }
        }
        // A trace reaching few FDEs carries few more bytes than those.
        let packed = |b: &[u8]| zstd::bulk::compress(b, 3).unwrap().len();
        let few: Vec<u64> = index
            .iter()
            .step_by(50)
            .map(|&(start, _, _)| start)
            .collect();
        let sparse = cut_eh_frame(data, svma, &few).unwrap();
        assert!(
            packed(&sparse.bytes) * 10 < packed(data),
            "{} of {}",
            packed(&sparse.bytes),
            packed(data)
        );
        // No lookups: every FDE dropped, the section still parses.
        let none = cut_eh_frame(data, svma, &[]).unwrap();
        assert_eq!((none.kept, none.dropped), (0, index.len()));
        assert!(covering(&none.bytes, svma).is_empty());
    }

    const SVMA: u64 = 0x40_0000;

    /// Hand-made `.eh_frame` sections.
    #[derive(Default)]
    struct Section {
        bytes: Vec<u8>,
    }

    impl Section {
        /// A CIE whose FDEs' addresses use `encoding`, with a personality
        /// routine and LSDA pointers when `personality`; in the 64-bit
        /// format if `wide`. Returns its offset.
        fn cie(&mut self, wide: bool, encoding: u8, personality: bool) -> usize {
            let mut body = Vec::new();
            body.push(1); // version
            if personality {
                body.extend(b"zPLR\0");
            } else {
                body.extend(b"zR\0");
            }
            body.extend([1, 0x78, 16]); // code align 1, data align -8, ra 16
            if personality {
                // P: udata4 routine address; L: pc-relative sdata4; R.
                body.extend([7, 0x03, 0x78, 0x56, 0x34, 0x12, 0x1b, encoding]);
            } else {
                body.extend([1, encoding]);
            }
            // def_cfa rsp+8; rip at cfa-8.
            body.extend([0x0c, 7, 8, 0x90, 1]);
            self.entry(wide, 0, body)
        }

        /// An FDE of the CIE at `cie` for `[start, start + len)`.
        fn fde(&mut self, wide: bool, cie: usize, start: u64, len: u32, lsda: bool) -> usize {
            let at = self.bytes.len();
            let header = if wide { 12 } else { 4 };
            let pointer_field = at + header;
            let address_field = pointer_field + 4;
            let pc = (start as i64 - (SVMA + address_field as u64) as i64) as i32;
            let mut body = Vec::new();
            body.extend(pc.to_le_bytes());
            body.extend(len.to_le_bytes());
            if lsda {
                body.extend([4, 0x10, 0, 0, 0]);
            } else {
                body.push(0);
            }
            // advance 1; def_cfa_offset 16; advance 3; def_cfa_offset 24.
            body.extend([0x41, 0x0e, 16, 0x43, 0x0e, 24]);
            self.entry(wide, (pointer_field - cie) as u32, body)
        }

        fn entry(&mut self, wide: bool, id: u32, mut body: Vec<u8>) -> usize {
            let at = self.bytes.len();
            let header = if wide { 12 } else { 4 };
            while !(header + 4 + body.len()).is_multiple_of(8) {
                body.push(0); // DW_CFA_nop
            }
            let len = (4 + body.len()) as u64;
            if wide {
                self.bytes.extend(0xffff_ffffu32.to_le_bytes());
                self.bytes.extend(len.to_le_bytes());
            } else {
                self.bytes.extend((len as u32).to_le_bytes());
            }
            self.bytes.extend(id.to_le_bytes());
            self.bytes.extend(body);
            at
        }

        fn end(mut self) -> Vec<u8> {
            self.bytes.extend([0; 4]);
            self.bytes
        }
    }

    /// 32- and 64-bit entries, 'zR' and 'zPLR' CIEs: runs of dropped
    /// FDEs become one filler each, CIEs and kept FDEs stay as they were.
    #[test]
    fn hand_made_sections_cut_by_runs() {
        let mut s = Section::default();
        let a = s.cie(false, 0x1b, false);
        let f: Vec<usize> = (0..4)
            .map(|i| s.fde(false, a, 0x1000 + 0x100 * i, 0x100, false))
            .collect();
        let b = s.cie(true, 0x1b, true);
        let g: Vec<usize> = (0..3)
            .map(|i| s.fde(true, b, 0x2000 + 0x100 * i, 0x100, true))
            .collect();
        let data = s.end();
        let lookups = [0x1150, 0x2101, 0x0fff];
        let cut = cut_eh_frame(&data, SVMA, &lookups).unwrap();
        assert_eq!((cut.kept, cut.dropped), (2, 5));
        for a in lookups
            .into_iter()
            .chain([0x1000, 0x1250, 0x2000, 0x2204, 0x5000])
        {
            let (whole, now) = (rule(&data, SVMA, a), rule(&cut.bytes, SVMA, a));
            if lookups.contains(&a) {
                assert_eq!(now, whole, "at {a:#x}");
                if a != 0x0fff {
                    assert!(now.starts_with("Ok"), "{now}");
                }
            } else if a < 0x5000 {
                assert_ne!(now, whole, "at {a:#x}");
            }
        }
        assert_eq!(covering(&cut.bytes, SVMA), [f[1], g[1]]);
        // One filler for f[2] and f[3]: the entry at f[3] is gone.
        let bases = BaseAddresses::default().set_eh_frame(SVMA);
        let offsets: Vec<usize> = index_of(&eh_frame(&cut.bytes), &bases)
            .unwrap()
            .iter()
            .map(|e| e.2)
            .collect();
        assert!(!offsets.contains(&f[3]) && offsets.contains(&f[2]));
        assert!(offsets.contains(&g[0]) && offsets.contains(&g[2]));
        // Kept entries and CIEs, byte for byte.
        assert_eq!(cut.bytes[a..f[0]], data[a..f[0]]);
        assert_eq!(cut.bytes[f[1]..f[2]], data[f[1]..f[2]]);
        assert_eq!(cut.bytes[b..g[0]], data[b..g[0]]);
        assert_eq!(cut.bytes[g[1]..g[2]], data[g[1]..g[2]]);
        // The filler of f[2..4]: no pc range, nops after its augmentation.
        assert!(cut.bytes[f[2] + 16..b].iter().all(|&x| x == 0));
    }

    /// Anything unusual keeps the section whole, saying why.
    #[test]
    fn unusual_sections_stay_whole() {
        // Data-relative addresses depend on more than the entry's bytes.
        let mut s = Section::default();
        let a = s.cie(false, 0x3b, false);
        s.fde(false, a, 0x1000, 0x100, false);
        let err = cut_eh_frame(&s.end(), SVMA, &[0x1000]).unwrap_err();
        assert!(err.starts_with("malformed entry at offset 0x18"), "{err}");
        let mut s = Section::default();
        let a = s.cie(false, 0x0d, false); // sdata8... as uleb: variable size
        s.fde(false, a, 0x1000, 0x100, false);
        assert!(cut_eh_frame(&s.end(), SVMA, &[0x1000]).is_err());
        // Two FDEs starting where a lookup lands.
        let mut s = Section::default();
        let a = s.cie(false, 0x1b, false);
        s.fde(false, a, 0x1000, 0x100, false);
        s.fde(false, a, 0x1000, 0x80, false);
        let data = s.end();
        let err = cut_eh_frame(&data, SVMA, &[0x1010]).unwrap_err();
        assert!(err.contains("several FDEs"), "{err}");
        // ...but below them they are no matter.
        assert!(cut_eh_frame(&data, SVMA, &[0x0fff]).is_ok());
        // Truncated, or an entry past the end.
        let err = cut_eh_frame(&data[..data.len() - 6], SVMA, &[0x1010]).unwrap_err();
        assert!(err.contains("malformed entry"), "{err}");
        let mut long = data.clone();
        long[0] = 0xf0;
        assert!(cut_eh_frame(&long, SVMA, &[0x1010]).is_err());
        assert!(cut_eh_frame(&[1, 2], SVMA, &[0x1010]).is_err());
        // An empty section (or only a terminator) has nothing to cut.
        let empty = cut_eh_frame(&[0; 4], SVMA, &[0x1010]).unwrap();
        assert_eq!((empty.kept, empty.dropped, empty.bytes.len()), (0, 0, 4));
    }
}
