//! An `.eh_frame_hdr` for an `.eh_frame` that comes without one.
//!
//! A recorder leaves `.eh_frame_hdr` out of a trace (it is an index of
//! `.eh_frame` and compresses badly). Given `.eh_frame` alone, framehop
//! indexes its FDEs itself, and that index answers one lookup differently
//! from the header's binary search: an address below the first FDE. The
//! header's search finds the first FDE, which does not cover the address,
//! and framehop uses its rule for code no FDE covers (on x86-64: the
//! return address at the stack pointer, for a leaf). Its own index finds
//! none, and framehop follows the frame pointer instead. So a sample in
//! `_init`, below every FDE of its image, was unwound one way from the
//! file and another from the trace. With a header made here from the
//! FDEs, framehop searches alike in both.

use gimli::{BaseAddresses, EhFrame, LittleEndian};
use lrnprof_image::for_each_fde;

/// `DW_EH_PE_pcrel | DW_EH_PE_sdata4`.
const PCREL_SDATA4: u8 = 0x1b;
/// `DW_EH_PE_udata4`.
const UDATA4: u8 = 0x03;
/// `DW_EH_PE_datarel | DW_EH_PE_sdata4`.
const DATAREL_SDATA4: u8 = 0x3b;

/// An `.eh_frame_hdr` for `eh_frame` (at `eh_frame_svma`, its pointers
/// read with `bases`), placed at that same address (only its offsets to
/// code and FDEs matter): version 1, a sorted table of (start, FDE) with
/// 4-byte offsets from the header, as linkers write it. `None` where
/// `eh_frame` does not parse or an offset does not fit in 4 bytes.
pub(crate) fn eh_frame_hdr(
    eh_frame: &[u8],
    eh_frame_svma: u64,
    bases: &BaseAddresses,
) -> Option<Vec<u8>> {
    let mut section = EhFrame::new(eh_frame, LittleEndian);
    section.set_address_size(8);
    let hdr_svma = eh_frame_svma;
    let offset = |to: u64| i32::try_from(to.wrapping_sub(hdr_svma) as i64).ok();
    let mut fdes: Vec<(u64, usize)> = Vec::new();
    for_each_fde(&section, bases, |fde| {
        fdes.push((fde.initial_address(), fde.offset()))
    })?;
    let mut rows: Vec<(u64, i32, i32)> = Vec::with_capacity(fdes.len());
    for (start, at) in fdes {
        let fde_svma = eh_frame_svma.checked_add(at as u64)?;
        rows.push((start, offset(start)?, offset(fde_svma)?));
    }
    // FDEs sharing a start (code folded by a linker): the first, so that
    // the search does not pick one by where it lands.
    rows.sort_by_key(|&(start, ..)| start);
    rows.dedup_by_key(|&mut (start, ..)| start);
    let mut out = vec![1, PCREL_SDATA4, UDATA4, DATAREL_SDATA4];
    // `.eh_frame`'s address, from the field's own (4 bytes in).
    out.extend_from_slice(&offset(eh_frame_svma.wrapping_sub(4))?.to_le_bytes());
    out.extend_from_slice(&u32::try_from(rows.len()).ok()?.to_le_bytes());
    for (_, start, fde) in rows {
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&fde.to_le_bytes());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{EhFrameHdr, Pointer, UnwindSection};

    /// An `.eh_frame` with one CIE and an FDE per (start, length), with
    /// pc-relative 4-byte addresses (augmentation "zR", encoding 0x1b).
    fn eh_frame(svma: u64, fdes: &[(u64, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        // CIE: length, id 0, version 1, "zR", code 1, data -8, ra 16,
        // augmentation length 1, encoding 0x1b, def_cfa rsp+8, padding.
        let cie = [
            0u8, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 7, 8, 0, 0, 0, 0,
        ];
        out.extend_from_slice(&(cie.len() as u32).to_le_bytes());
        out.extend_from_slice(&cie);
        for &(start, len) in fdes {
            let at = out.len();
            // length 20: CIE pointer, start, length, augmentation length,
            // 7 bytes of padding (DW_CFA_nop).
            out.extend_from_slice(&20u32.to_le_bytes());
            out.extend_from_slice(&((at + 4) as u32).to_le_bytes());
            let field = svma + out.len() as u64;
            out.extend_from_slice(&(start.wrapping_sub(field) as i32).to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&[0; 8]);
        }
        out
    }

    #[test]
    fn the_header_finds_each_fde_and_the_first_below_them_all() {
        let svma = 0x3000;
        // Out of address order, as a cut `.eh_frame` may be.
        let section = eh_frame(svma, &[(0x1200, 0x10), (0x1100, 0x20), (0x1400, 8)]);
        let hdr =
            eh_frame_hdr(&section, svma, &BaseAddresses::default().set_eh_frame(svma)).unwrap();
        let bases = BaseAddresses::default()
            .set_eh_frame(svma)
            .set_eh_frame_hdr(svma);
        let parsed = EhFrameHdr::new(&hdr, LittleEndian)
            .parse(&bases, 8)
            .unwrap();
        let table = parsed.table().unwrap();
        let mut eh = EhFrame::new(&section, LittleEndian);
        eh.set_address_size(8);
        let start_at = |address: u64| {
            let ptr = table.lookup(address, &bases).unwrap();
            let offset = table.pointer_to_offset(ptr).unwrap();
            eh.fde_from_offset(&bases, offset, EhFrame::cie_from_offset)
                .unwrap()
                .initial_address()
        };
        assert_eq!(start_at(0x1100), 0x1100);
        assert_eq!(start_at(0x1210), 0x1200);
        assert_eq!(start_at(0x1500), 0x1400);
        // Below every FDE: the first, as in a linker's header.
        assert_eq!(start_at(0x1000), 0x1100);
        assert_eq!(parsed.eh_frame_ptr(), Pointer::Direct(svma));
        // Not an `.eh_frame`: none.
        assert_eq!(
            eh_frame_hdr(&[7, 0, 0, 0, 1], svma, &BaseAddresses::default()),
            None
        );
    }

    #[test]
    fn fdes_sharing_a_start_give_the_first() {
        let svma = 0x3000;
        let section = eh_frame(svma, &[(0x1100, 0x20), (0x1100, 0x10)]);
        let hdr =
            eh_frame_hdr(&section, svma, &BaseAddresses::default().set_eh_frame(svma)).unwrap();
        // One row: the first FDE (after the CIE, at 24).
        assert_eq!(u32::from_le_bytes(hdr[8..12].try_into().unwrap()), 1);
        assert_eq!(i32::from_le_bytes(hdr[16..20].try_into().unwrap()), 24);
    }
}
