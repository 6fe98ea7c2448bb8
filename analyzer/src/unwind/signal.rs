//! Signal frames: unwinding from a signal handler back into the code the
//! signal interrupted.
//!
//! A handler returns to a trampoline that calls `rt_sigreturn` (glibc's
//! `__restore_rt` on x86-64), and the kernel has saved the interrupted
//! registers in a `ucontext` on the stack where that return lands. The
//! trampoline's unwind entry says so (its CIE's augmentation has `S`) with
//! rules framehop does not evaluate (DWARF expressions): a walk would stop
//! there, or follow the frame pointer past the interrupted function. The
//! walk asks [`Trampolines`] first, for every return address, whether it
//! is a trampoline's and, if so, reads the saved registers itself and
//! goes on from the interrupted instruction.
//!
//! Trampolines are found through each image's `.eh_frame`, which the
//! trace embeds, so a trace analyzed elsewhere finds them too. A process
//! generation's are looked up at its first walk, each image's once per
//! analysis: a pass over the entries' headers, and gimli only for the few
//! FDEs of signal-frame CIEs (on a python3 trace, 0.5 % of the analysis
//! for all its images). A walk then checks each return address against a
//! range or two.

use crate::image::{LoadedImage, SectionBytes};
use crate::timeline::Mapping;
use gimli::{
    BaseAddresses, CieOrFde, EhFrame, EhFrameOffset, EndianSlice, RunTimeEndian, UnwindSection,
};
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// One image's signal trampolines, searched for on first use, and its
/// Go stack switches ([`super::go`]), where a walk ends.
pub(crate) struct ImageTrampolines {
    /// `.eh_frame` and its SVMA, `.text`'s SVMA.
    eh_frame: Option<(SectionBytes, u64, u64)>,
    little_endian: bool,
    /// SVMA ranges of the FDEs whose CIE marks a signal frame.
    found: OnceLock<Vec<Range<u64>>>,
    /// SVMA ranges of the Go runtime's stack-switching functions.
    go_switches: Vec<Range<u64>>,
}

impl ImageTrampolines {
    pub fn of(image: &LoadedImage) -> ImageTrampolines {
        let data = image.data.as_ref();
        let eh_frame = data.and_then(|d| {
            let s = d.section(".eh_frame").filter(|s| !s.bytes.is_empty())?;
            let text = d.section(".text").map_or(0, |t| t.svma);
            Some((s.bytes.clone(), s.svma, text))
        });
        ImageTrampolines {
            eh_frame,
            little_endian: data.is_none_or(|d| d.little_endian),
            found: OnceLock::new(),
            go_switches: data.map_or_else(Vec::new, super::go::stack_switches),
        }
    }

    fn svma_ranges(&self) -> &[Range<u64>] {
        self.found.get_or_init(|| match &self.eh_frame {
            Some((bytes, svma, text)) => signal_fdes(bytes, *svma, *text, self.little_endian),
            None => Vec::new(),
        })
    }
}

/// SVMA ranges of the FDEs of `eh_frame` (at `svma`; `.text` at `text`)
/// whose CIE has the `S` augmentation. Entries that do not parse are
/// skipped.
fn signal_fdes(eh_frame: &[u8], svma: u64, text: u64, little_endian: bool) -> Vec<Range<u64>> {
    let endian = if little_endian {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let section = EhFrame::new(eh_frame, endian);
    let bases = BaseAddresses::default().set_eh_frame(svma).set_text(text);
    let parse = |offset: usize| {
        let fde = section
            .fde_from_offset(&bases, EhFrameOffset(offset), |s, b, o| {
                s.cie_from_offset(b, o)
            })
            .ok()?;
        fde.is_signal_trampoline()
            .then(|| fde.initial_address()..fde.end_address())
    };
    match signal_fde_offsets(eh_frame, little_endian) {
        Some(offsets) => offsets.into_iter().filter_map(parse).collect(),
        // Entries of the 64-bit format: gimli reads them all.
        None => {
            let mut found = Vec::new();
            let mut entries = section.entries(&bases);
            while let Ok(Some(entry)) = entries.next() {
                if let CieOrFde::Fde(partial) = entry {
                    let fde = partial.parse(|s: &EhFrame<EndianSlice<'_, RunTimeEndian>>, b, o| {
                        s.cie_from_offset(b, o)
                    });
                    if let Some(fde) = fde.ok().filter(|f| f.is_signal_trampoline()) {
                        found.push(fde.initial_address()..fde.end_address());
                    }
                }
            }
            found
        }
    }
}

/// Offsets of the FDEs whose CIE has an `S` in its augmentation string,
/// from the entries' headers alone: each entry's length and CIE id or
/// pointer, and each CIE's augmentation. `None` at an entry of the 64-bit
/// format. The walk stops at the terminator or at an entry that would
/// run past the end.
fn signal_fde_offsets(eh_frame: &[u8], little_endian: bool) -> Option<Vec<usize>> {
    let word = |at: usize| -> Option<u32> {
        let b: [u8; 4] = eh_frame.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if little_endian {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let mut signal_cies = Vec::new();
    let mut fdes = Vec::new();
    let mut at = 0usize;
    while let Some(len) = word(at) {
        if len == 0 {
            break;
        }
        if len == u32::MAX {
            return None;
        }
        let Some(end) = (at + 4)
            .checked_add(len as usize)
            .filter(|&e| e <= eh_frame.len())
        else {
            break;
        };
        match word(at + 4) {
            // A CIE: version byte, then the augmentation string.
            Some(0) => {
                let aug = eh_frame.get(at + 9..end).unwrap_or_default();
                let aug = &aug[..aug.iter().position(|&b| b == 0).unwrap_or(aug.len())];
                if aug.contains(&b'S') {
                    signal_cies.push(at);
                }
            }
            // An FDE: its CIE is this many bytes before the pointer.
            Some(pointer) => {
                if let Some(cie) = (at + 4).checked_sub(pointer as usize) {
                    fdes.push((at, cie));
                }
            }
            None => break,
        }
        at = end;
    }
    Some(
        fdes.into_iter()
            .filter(|(_, cie)| signal_cies.contains(cie))
            .map(|(fde, _)| fde)
            .collect(),
    )
}

/// An executable mapping: its AVMA range, AVMA minus SVMA, and its
/// image's trampolines.
type MappedImage = (Range<u64>, u64, Arc<ImageTrampolines>);

/// The signal trampolines and Go stack switches of one process
/// generation's executable mappings.
#[derive(Clone)]
pub(crate) struct Trampolines {
    mappings: Arc<[MappedImage]>,
    /// AVMA ranges of the trampolines, found at the first lookup.
    avma: Arc<OnceLock<Vec<Range<u64>>>>,
    /// AVMA ranges of the Go stack switches.
    go_switches: Arc<[Range<u64>]>,
}

impl Trampolines {
    /// For `mappings`; `image` gives each image's (shared) trampolines.
    pub fn new(
        mappings: &[Mapping],
        images: &[LoadedImage],
        image: impl Fn(u32) -> Arc<ImageTrampolines>,
    ) -> Trampolines {
        let mappings: Arc<[MappedImage]> = mappings
            .iter()
            .filter(|m| m.executable)
            .filter_map(|m| {
                let data = images.get(m.image as usize)?.data.as_ref()?;
                Some((m.start..m.end, data.bias(m), image(m.image)))
            })
            .collect();
        let go_switches = avma_ranges(&mappings, |i| &i.go_switches).into();
        Trampolines {
            mappings,
            avma: Arc::default(),
            go_switches,
        }
    }

    /// The AVMA ranges of the trampolines, for [`returns_into`]: found at
    /// the first call.
    pub fn ranges(&self) -> &[Range<u64>] {
        self.avma
            .get_or_init(|| avma_ranges(&self.mappings, ImageTrampolines::svma_ranges))
    }

    /// The AVMA ranges of the Go stack switches, for
    /// [`in_switch`](super::go::in_switch).
    pub fn go_switches(&self) -> &[Range<u64>] {
        &self.go_switches
    }
}

/// The AVMA ranges, within its mappings, of each image's SVMA `ranges`.
fn avma_ranges(
    mappings: &[MappedImage],
    ranges: impl Fn(&ImageTrampolines) -> &[Range<u64>],
) -> Vec<Range<u64>> {
    let mut all = Vec::new();
    for (avma, bias, image) in mappings {
        for r in ranges(image) {
            let start = r.start.wrapping_add(*bias).max(avma.start);
            let end = r.end.wrapping_add(*bias).min(avma.end);
            if start < end {
                all.push(start..end);
            }
        }
    }
    all
}

/// Whether a function returning to `ra` returns into one of the
/// trampolines at `ranges` (an unwinder looks `ra - 1` up, as for any
/// return address: the trampoline's entry starts a byte early for that).
pub(crate) fn returns_into(ranges: &[Range<u64>], ra: u64) -> bool {
    let at = ra.wrapping_sub(1);
    ranges.iter().any(|r| r.contains(&at))
}

/// Where an x86-64 Linux signal frame's `ucontext` (at the stack pointer
/// once the handler returned) keeps the interrupted `rbp`, `rsp` and
/// `rip`: `uc_mcontext.gregs` starts after `uc_flags`, `uc_link` and
/// `uc_stack` (40 bytes), and those are its entries 10, 15 and 16.
pub(crate) const X86_64_UCONTEXT_BP_SP_IP: [u64; 3] = [40 + 10 * 8, 40 + 15 * 8, 40 + 16 * 8];

/// Where an AArch64 Linux signal frame (`struct rt_sigframe`, at the stack
/// pointer once the handler returned) keeps the interrupted `x29`, `x30`,
/// `sp` and `pc`: after `siginfo` (128 bytes), `ucontext`'s `uc_mcontext`
/// starts at 304 (after `uc_flags`, `uc_link`, `uc_stack`, `uc_sigmask`
/// and padding to glibc's 1024-bit sigset, aligned to 16), and in it
/// `fault_address`, then `regs[0..31]`, `sp`, `pc`. Offsets as the
/// kernel's uapi headers (`asm/sigcontext.h`, `asm/ucontext.h`) lay them
/// out, computed with `offsetof` over Debian's arm64 headers.
pub(crate) const AARCH64_SIGFRAME_FP_LR_SP_PC: [u64; 4] = [
    304 + 8 + 29 * 8,
    304 + 8 + 30 * 8,
    304 + 8 + 31 * 8,
    304 + 8 + 32 * 8,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// An `.eh_frame` of two CIEs, the second with augmentation `aug`
    /// ("zRS": a signal frame), and one FDE of each with absolute 8-byte
    /// addresses: 0x2000..0x2010 of the first, 0x3000..0x3008 of the
    /// second.
    #[rustfmt::skip]
    fn eh_frame(aug: &[u8]) -> Vec<u8> {
        let cie = |aug: &[u8]| {
            let mut body = vec![0, 0, 0, 0, 1];   // CIE id, version 1
            body.extend(aug);
            body.push(0);                            // end of augmentation
            body.extend([1, 0x78, 16]);              // code 1, data -8, ra 16
            body.push(1);                            // augmentation data length
            body.push(0);                            // R: DW_EH_PE_absptr
            while !(body.len() + 4).is_multiple_of(8) {
                body.push(0);                        // DW_CFA_nop
            }
            let mut e = (body.len() as u32).to_le_bytes().to_vec();
            e.extend(body);
            e
        };
        let fde = |cie_at: usize, here: usize, start: u64, len: u64| {
            let mut body = ((here + 4 - cie_at) as u32).to_le_bytes().to_vec();
            body.extend(start.to_le_bytes());
            body.extend(len.to_le_bytes());
            body.push(0);                            // augmentation data length
            while !(body.len() + 4).is_multiple_of(8) {
                body.push(0);
            }
            let mut e = (body.len() as u32).to_le_bytes().to_vec();
            e.extend(body);
            e
        };
        let mut s = cie(b"zR");
        let plain_cie = 0;
        let signal_cie = s.len();
        s.extend(cie(aug));
        let at = s.len();
        s.extend(fde(plain_cie, at, 0x2000, 0x10));
        let at = s.len();
        s.extend(fde(signal_cie, at, 0x3000, 8));
        s.extend([0, 0, 0, 0]);
        s
    }

    #[test]
    fn finds_the_fdes_of_signal_frame_cies() {
        let eh_frame = eh_frame(b"zRS");
        assert_eq!(
            signal_fdes(&eh_frame, 0x1000, 0, true),
            vec![0x3000..0x3008]
        );
    }

    #[test]
    fn the_header_pass_finds_the_signal_fdes_or_leaves_64_bit_entries_to_gimli() {
        let eh_frame = eh_frame(b"zRS");
        let offsets = signal_fde_offsets(&eh_frame, true).unwrap();
        assert_eq!(offsets.len(), 1);
        // The FDE it found starts at 0x3000 (after its length and CIE
        // pointer).
        let at = offsets[0] + 8;
        assert_eq!(eh_frame[at..at + 8], 0x3000u64.to_le_bytes());
        let mut wide = vec![0xff; 4];
        wide.extend(&eh_frame);
        assert_eq!(signal_fde_offsets(&wide, true), None);
        // Cut anywhere, no panic and nothing past the cut.
        for len in 0..eh_frame.len() {
            let _ = signal_fdes(&eh_frame[..len], 0x1000, 0, true);
        }
    }

    #[test]
    fn aarch64_signal_frame_offsets_are_the_kernel_s() {
        // offsetof(struct rt_sigframe, uc.uc_mcontext.regs[29]) and the
        // rest, printed by a C program over the arm64 uapi headers.
        assert_eq!(AARCH64_SIGFRAME_FP_LR_SP_PC, [544, 552, 560, 568]);
    }

    #[test]
    fn images_without_signal_frames_or_with_garbage_have_none() {
        assert!(signal_fdes(&eh_frame(b"zR"), 0x1000, 0, true).is_empty());
        assert!(signal_fdes(b"not an eh_frame at all", 0x1000, 0, true).is_empty());
        assert!(signal_fdes(&[], 0x1000, 0, true).is_empty());
    }
}
