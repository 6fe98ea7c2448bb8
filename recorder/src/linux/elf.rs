//! Build ids of ELF images: the GNU build-id note, found through the
//! program headers so only a few hundred bytes of a file are read.

use lrnprof_format::BuildId;
use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_NOTE: u32 = 4;
const NT_GNU_BUILD_ID: u32 = 3;
/// Bound on what a note segment may make us read.
const MAX_NOTES_LEN: u64 = 1 << 16;

/// Where the program headers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ElfInfo {
    is_64: bool,
    phoff: u64,
    phentsize: u64,
    phnum: u64,
}

fn le_u16(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?).into())
}

fn le_u32(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?).into())
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parse the ELF file header (little-endian ELF32 or ELF64 only).
fn parse_elf_header(b: &[u8]) -> Option<ElfInfo> {
    if b.get(..4)? != b"\x7fELF" || *b.get(5)? != 1 {
        return None;
    }
    match *b.get(4)? {
        2 => Some(ElfInfo {
            is_64: true,
            phoff: le_u64(b, 0x20)?,
            phentsize: le_u16(b, 0x36)?,
            phnum: le_u16(b, 0x38)?,
        }),
        1 => Some(ElfInfo {
            is_64: false,
            phoff: le_u32(b, 0x1c)?,
            phentsize: le_u16(b, 0x2a)?,
            phnum: le_u16(b, 0x2c)?,
        }),
        _ => None,
    }
}

/// (file offset, size) of each `PT_NOTE` segment in the program headers.
fn note_segments(info: &ElfInfo, phdrs: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for i in 0..info.phnum as usize {
        let at = i * info.phentsize as usize;
        let Some(p_type) = le_u32(phdrs, at) else {
            break;
        };
        if p_type as u32 != PT_NOTE {
            continue;
        }
        let range = if info.is_64 {
            le_u64(phdrs, at + 8).zip(le_u64(phdrs, at + 32))
        } else {
            le_u32(phdrs, at + 4).zip(le_u32(phdrs, at + 16))
        };
        if let Some(r) = range {
            out.push(r);
        }
    }
    out
}

/// The descriptor of the first `NT_GNU_BUILD_ID` note named `GNU`.
fn find_gnu_build_id(notes: &[u8]) -> Option<&[u8]> {
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    let mut at = 0usize;
    while at + 12 <= notes.len() {
        let namesz = le_u32(notes, at)? as usize;
        let descsz = le_u32(notes, at + 4)? as usize;
        let kind = le_u32(notes, at + 8)? as u32;
        let name_at = at + 12;
        let desc_at = name_at.checked_add(align4(namesz)?)?;
        let next = desc_at.checked_add(align4(descsz)?)?;
        let name = notes.get(name_at..name_at + namesz)?;
        let desc = notes.get(desc_at..desc_at.checked_add(descsz)?)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc);
        }
        at = next;
    }
    None
}

/// Find the build id of an ELF image, reading through `read_at(offset, len)`.
fn build_id_with(read_at: impl Fn(u64, u64) -> Option<Vec<u8>>) -> Option<BuildId> {
    let header = read_at(0, 64)?;
    let info = parse_elf_header(&header)?;
    if info.phnum == 0 || info.phentsize == 0 || info.phnum * info.phentsize > MAX_NOTES_LEN {
        return None;
    }
    let phdrs = read_at(info.phoff, info.phnum * info.phentsize)?;
    note_segments(&info, &phdrs)
        .into_iter()
        .filter(|&(_, size)| size <= MAX_NOTES_LEN)
        .find_map(|(offset, size)| {
            let notes = read_at(offset, size)?;
            find_gnu_build_id(&notes).map(|id| BuildId(id.to_vec()))
        })
}

/// Build id of an ELF image held in memory (e.g. the vDSO).
pub(crate) fn build_id_of_bytes(bytes: &[u8]) -> Option<BuildId> {
    build_id_with(|offset, len| {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        bytes.get(start..end).map(<[u8]>::to_vec)
    })
}

/// Build id of an ELF file on disk; `None` if it has none or is unreadable.
pub(crate) fn build_id_of_file(path: &Path) -> Option<BuildId> {
    let file = std::fs::File::open(path).ok()?;
    build_id_with(|offset, len| {
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image: header, one PT_NOTE program header, one note.
    #[rustfmt::skip]
    fn tiny_elf(note_name: &[u8; 4], kind: u32) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;                                        // ELFCLASS64
        b[5] = 1;                                        // little endian
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());  // e_phnum
        let mut ph = vec![0u8; 56];
        ph[..4].copy_from_slice(&PT_NOTE.to_le_bytes());     // p_type
        ph[8..16].copy_from_slice(&120u64.to_le_bytes());    // p_offset
        ph[32..40].copy_from_slice(&20u64.to_le_bytes());    // p_filesz
        b.extend(ph);
        b.extend(4u32.to_le_bytes());                        // namesz
        b.extend(4u32.to_le_bytes());                        // descsz
        b.extend(kind.to_le_bytes());                        // type
        b.extend(note_name);                                 // name
        b.extend([0xde, 0xad, 0xbe, 0xef]);                  // desc: the id
        b
    }

    #[test]
    fn finds_the_gnu_build_id() {
        let id = build_id_of_bytes(&tiny_elf(b"GNU\0", NT_GNU_BUILD_ID)).unwrap();
        assert_eq!(id.to_hex(), "deadbeef");
    }

    #[test]
    fn ignores_other_notes() {
        assert_eq!(build_id_of_bytes(&tiny_elf(b"GNU\0", 1)), None);
        assert_eq!(
            build_id_of_bytes(&tiny_elf(b"Go\0\0", NT_GNU_BUILD_ID)),
            None
        );
    }

    #[test]
    fn rejects_non_elf_and_truncated_input() {
        assert_eq!(build_id_of_bytes(b"not an elf file at all"), None);
        let elf = tiny_elf(b"GNU\0", NT_GNU_BUILD_ID);
        assert_eq!(build_id_of_bytes(&elf[..130]), None);
    }

    #[test]
    fn note_lengths_cannot_overflow() {
        let mut notes = u32::MAX.to_le_bytes().to_vec();
        notes.extend(u32::MAX.to_le_bytes());
        notes.extend(3u32.to_le_bytes());
        assert_eq!(find_gnu_build_id(&notes), None);
    }
}
