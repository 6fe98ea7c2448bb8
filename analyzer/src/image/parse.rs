//! Reading an image file (ELF or Mach-O) through `object`.

use super::{Deflated, FileBytes, ImageData, MadeRules, Section, SectionBytes, Segment, Symbols};
use lrnprof_image::{canonical_section_name, section_role, SectionRole};
use object::read::macho::MachHeader as _;
use object::{Object, ObjectSection, ObjectSegment};
use std::sync::Arc;

/// An image file parsed into [`ImageData`], with what identifies it.
pub(crate) struct ParsedFile {
    pub data: ImageData,
    pub build_id: Option<Vec<u8>>,
    pub debuglink: Option<String>,
    /// The CRC-32 its `.gnu_debuglink` gives for the debug file.
    pub debuglink_crc: Option<u32>,
    /// The supplementary debug file (`dwz -m`) its `.gnu_debugaltlink`
    /// or `.debug_sup` names, with the id that file answers to.
    pub altlink: Option<(Vec<u8>, Vec<u8>)>,
    /// As a supplementary file, the id it answers to (its build id, or
    /// its own `.debug_sup` checksum).
    pub supplementary_id: Option<Vec<u8>>,
}

/// The ELF-style name the analyzer uses for a section of a file, or `None`
/// for sections it never reads as sections (symbol tables go through
/// object's symbol API).
fn wanted_name(name: &str, macho: bool) -> Option<String> {
    let name = canonical_section_name(name, macho);
    match section_role(&name) {
        None | Some(SectionRole::Symbols) => None,
        Some(_) => Some(name.into_owned()),
    }
}

/// Deflate can shrink data at most about 1032 times: a section claiming
/// more is corrupt (and must not make us allocate what it claims).
const MAX_INFLATE_RATIO: u64 = 1032;

/// A compressed section of `file`: zlib, what ELF debug sections use, is
/// left compressed until read ([`Deflated`]), and then goes through
/// zlib-rs: inflating a large library's debug info is a fixed cost of
/// every analysis that reads it, and zlib-rs does it in about half the
/// time of the miniz_oxide path `object` takes. Other formats (zstd) are
/// decompressed now, through `object`.
fn compressed<'d, S: ObjectSection<'d>>(sec: &S, file: &Arc<FileBytes>) -> Option<Section> {
    let c = sec.compressed_data().ok()?;
    let section = |bytes, deflated| Section {
        svma: sec.address(),
        size: sec.size(),
        bytes,
        deflated,
    };
    if c.format != object::CompressionFormat::Zlib {
        let d = c.decompress().ok()?.into_owned();
        return Some(section(SectionBytes::whole(Arc::new(d)), None));
    }
    if c.uncompressed_size > (c.data.len() as u64).saturating_mul(MAX_INFLATE_RATIO) + 64 {
        return None;
    }
    let size = usize::try_from(c.uncompressed_size).ok()?;
    // `c.data` lies inside `file`'s bytes.
    let offset = (c.data.as_ptr() as usize).checked_sub(file.as_ptr() as usize)?;
    let stream = SectionBytes::slice(file, offset as u64, c.data.len() as u64)?;
    if size == 0 {
        return Some(section(SectionBytes::whole(Arc::new(Vec::new())), None));
    }
    Some(section(
        SectionBytes::whole(Arc::new(Vec::new())),
        Some(Deflated { stream, size }),
    ))
}

/// Parse `bytes` as an ELF or Mach-O image. Section bytes point into
/// `bytes` (compressed debug sections are decompressed into new buffers).
pub(crate) fn parse_file(bytes: Arc<Vec<u8>>) -> Result<ParsedFile, String> {
    parse_bytes(Arc::new(FileBytes::Shared(bytes)))
}

/// [`parse_file`] of a file's bytes however they are held.
pub(crate) fn parse_bytes(bytes: Arc<FileBytes>) -> Result<ParsedFile, String> {
    let obj = object::File::parse(&bytes[..]).map_err(|e| format!("not a usable image: {e}"))?;
    let macho = matches!(obj.format(), object::BinaryFormat::MachO);
    // A dSYM companion (Mach-O file type MH_DSYM) keeps the section table of
    // its binary but none of the code or unwind bytes: use only its DWARF.
    let filetype = match &obj {
        object::File::MachO32(f) => Some(f.macho_header().filetype(f.endian())),
        object::File::MachO64(f) => Some(f.macho_header().filetype(f.endian())),
        _ => None,
    };
    let dsym = filetype == Some(object::macho::MH_DSYM);
    let mut data = ImageData {
        is_macho: macho,
        little_endian: obj.is_little_endian(),
        ..Default::default()
    };
    for seg in obj.segments() {
        let (file_offset, file_size) = seg.file_range();
        let name = seg.name().ok().flatten().unwrap_or("");
        if macho && name == "__TEXT" && !dsym {
            data.base_svma = seg.address();
            if let Some(b) = SectionBytes::slice(&bytes, file_offset, file_size) {
                data.sections.insert(
                    "__TEXT".into(),
                    Section::plain(seg.address(), seg.size(), b),
                );
            }
        }
        if file_size > 0 {
            let executable = match seg.flags() {
                object::SegmentFlags::Elf { p_flags } => Some(p_flags & object::elf::PF_X != 0),
                object::SegmentFlags::MachO { initprot, .. } => {
                    Some(initprot & object::macho::VM_PROT_EXECUTE != 0)
                }
                _ => None,
            };
            data.segments.push(Segment {
                file_offset,
                file_size,
                svma: seg.address(),
                executable,
            });
        }
    }
    for sec in obj.sections() {
        let Ok(name) = sec.name() else { continue };
        let Some(key) = wanted_name(name, macho) else {
            continue;
        };
        if data.sections.contains_key(&key)
            || (dsym && !key.starts_with(".debug_"))
            || lrnprof_image::unused_dwarf(&key)
        {
            // Nothing reads it: do not inflate it.
            continue;
        }
        let plain = sec
            .compressed_file_range()
            .is_ok_and(|r| r.format == object::CompressionFormat::None);
        let plain_section = |b| Section::plain(sec.address(), sec.size(), b);
        let section = match (plain, sec.file_range()) {
            (true, Some((off, len))) => SectionBytes::slice(&bytes, off, len).map(plain_section),
            // NOBITS
            (true, None) => Some(plain_section(SectionBytes::whole(Arc::new(Vec::new())))),
            (false, _) => compressed(&sec, &bytes),
        };
        if let Some(section) = section {
            data.sections.insert(key, section);
        }
    }
    // A stripped Go binary has no unwind table: its stack-pointer tables
    // give one.
    if !data.sections.contains_key(".eh_frame") && !data.sections.contains_key(".debug_frame") {
        if let Some(made) = lrnprof_image::go_debug_frame(&obj, None) {
            let size = made.len() as u64;
            data.made_rules = Some(MadeRules::GoTables);
            data.sections.insert(
                ".debug_frame".into(),
                Section::plain(0, size, SectionBytes::whole(Arc::new(made))),
            );
        }
    }
    // Code without CFI (musl's libc): rules made from its instructions,
    // after the image's own `.debug_frame`, which the split between
    // `.eh_frame` and `.debug_frame` reads.
    if let Some(made) = lrnprof_image::code_debug_frame(&obj, None) {
        let size = made.len() as u64;
        data.made_rules = Some(MadeRules::Instructions {
            functions: fdes_after_last_cie(&made),
        });
        data.sections.insert(
            ".debug_frame".into(),
            Section::plain(0, size, SectionBytes::whole(Arc::new(made))),
        );
    }
    data.symbols = Symbols::of_file(bytes.clone());
    // object finds a GNU note through the section headers too (separate
    // debug files); the recorder's reading of the program headers also
    // finds Go's build ID, which Go binaries have instead.
    let build_id = match obj.build_id() {
        Ok(Some(id)) => Some(id.to_vec()),
        _ => lrnprof_image::build_id_of_bytes(&bytes).map(|id| id.0),
    };
    let link = obj.gnu_debuglink().ok().flatten();
    let debuglink = link.map(|(name, _)| String::from_utf8_lossy(name).into_owned());
    let debuglink_crc = link.map(|(_, crc)| crc);
    let altlink = lrnprof_image::supplementary_link(&obj);
    let supplementary_id = lrnprof_image::supplementary_id(&obj);
    Ok(ParsedFile {
        data,
        build_id,
        debuglink,
        debuglink_crc,
        altlink,
        supplementary_id,
    })
}

/// The FDEs of a `.debug_frame` after its last CIE: those
/// [`lrnprof_image::code_debug_frame`] made, which follow the image's own
/// entries under a CIE of their own.
pub(super) fn fdes_after_last_cie(section: &[u8]) -> usize {
    let word = |at: usize| {
        let b = section.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    };
    let (mut at, mut fdes) = (0usize, 0);
    // 32-bit DWARF only: `code_debug_frame` writes no other.
    while let (Some(length), Some(id)) = (word(at), word(at + 4)) {
        if length == 0 || length == u32::MAX {
            break;
        }
        if id == u32::MAX {
            fdes = 0;
        } else {
            fdes += 1;
        }
        let Some(next) = at.checked_add(4 + length as usize) else {
            break;
        };
        at = next;
    }
    fdes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fdes_after_the_last_cie_are_counted() {
        // (length, id) and `length - 4` bytes of body each.
        let entry = |id: u32, body: usize| {
            let mut e = ((4 + body) as u32).to_le_bytes().to_vec();
            e.extend(id.to_le_bytes());
            e.extend(vec![0u8; body]);
            e
        };
        let (cie, fde) = (u32::MAX, 0);
        let section: Vec<u8> = [
            entry(cie, 12),
            entry(fde, 20),
            entry(cie, 12),
            entry(fde, 20),
            entry(fde, 28),
        ]
        .concat();
        assert_eq!(fdes_after_last_cie(&section), 2);
        // Cut anywhere, or a length past the end: no panic, entries
        // counted as far as they can be read.
        for end in 0..section.len() {
            assert!(fdes_after_last_cie(&section[..end]) <= 2);
        }
        let mut huge = section.clone();
        huge[..4].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
        assert_eq!(fdes_after_last_cie(&huge), 0);
    }

    #[test]
    fn section_names_are_normalized() {
        assert_eq!(wanted_name("__text", true).as_deref(), Some(".text"));
        assert_eq!(
            wanted_name("__debug_info", true).as_deref(),
            Some(".debug_info")
        );
        assert_eq!(
            wanted_name("__unwind_info", true).as_deref(),
            Some("__unwind_info")
        );
        assert_eq!(
            wanted_name(".zdebug_line", false).as_deref(),
            Some(".debug_line")
        );
        assert_eq!(wanted_name(".data", false), None);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_file(Arc::new(b"not an image".to_vec())).is_err());
    }
}
