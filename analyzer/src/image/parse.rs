//! Reading an image file (ELF or Mach-O) through `object`.

use super::plt::{plt_symbols, PltTables};
use super::{ImageData, Section, SectionBytes, Segment, Symbol};
use lrnprof_image::{canonical_section_name, section_role, SectionRole};
use object::read::macho::MachHeader as _;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use std::sync::Arc;

/// An image file parsed into [`ImageData`], with what identifies it.
pub(crate) struct ParsedFile {
    pub data: ImageData,
    pub build_id: Option<Vec<u8>>,
    pub debuglink: Option<String>,
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

/// The bytes of a compressed section. zlib, what ELF debug sections use,
/// goes through zlib-rs: inflating a large library's debug info is a
/// fixed cost of every analysis, and zlib-rs does it in about half the
/// time of the miniz_oxide path `object` takes. Other formats (zstd) go
/// through `object`.
fn inflate<'d, S: ObjectSection<'d>>(sec: &S) -> Option<Vec<u8>> {
    let c = sec.compressed_data().ok()?;
    if c.format != object::CompressionFormat::Zlib {
        return c.decompress().ok().map(|d| d.into_owned());
    }
    if c.uncompressed_size > (c.data.len() as u64).saturating_mul(MAX_INFLATE_RATIO) + 64 {
        return None;
    }
    let size = usize::try_from(c.uncompressed_size).ok()?;
    let mut out = Vec::new();
    out.try_reserve_exact(size).ok()?;
    out.resize(size, 0);
    let (done, rc) = zlib_rs::decompress_slice(&mut out, c.data, zlib_rs::InflateConfig::default());
    (rc == zlib_rs::ReturnCode::Ok && done.len() == size).then_some(out)
}

/// Parse `bytes` as an ELF or Mach-O image. Section bytes point into
/// `bytes` (compressed debug sections are decompressed into new buffers).
pub(crate) fn parse_file(bytes: Arc<Vec<u8>>) -> Result<ParsedFile, String> {
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
                    Section {
                        svma: seg.address(),
                        size: seg.size(),
                        bytes: b,
                    },
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
            || crate::symbolicate::unused_dwarf(&key)
        {
            // Nothing reads it: do not inflate it.
            continue;
        }
        let plain = sec
            .compressed_file_range()
            .is_ok_and(|r| r.format == object::CompressionFormat::None);
        let bytes = match (plain, sec.file_range()) {
            (true, Some((off, len))) => SectionBytes::slice(&bytes, off, len),
            (true, None) => Some(SectionBytes::whole(Arc::new(Vec::new()))), // NOBITS
            (false, _) => inflate(&sec).map(|d| SectionBytes::whole(Arc::new(d))),
        };
        if let Some(b) = bytes {
            data.sections.insert(
                key,
                Section {
                    svma: sec.address(),
                    size: sec.size(),
                    bytes: b,
                },
            );
        }
    }
    let elf = obj.format() == object::BinaryFormat::Elf;
    // ELF symbols without a type in a section: code labels, see
    // `symbol_table`.
    let labels: Vec<Symbol> = obj
        .symbols()
        .filter(|s| {
            elf && s.kind() == SymbolKind::Unknown
                && matches!(s.section(), object::SymbolSection::Section(_))
                && s.address() != 0
        })
        .filter_map(|s| {
            let name = s.name().ok().filter(|n| super::is_code_label_name(n))?;
            Some(Symbol {
                svma: s.address(),
                size: s.size(),
                name: name.to_string(),
            })
        })
        .collect();
    // (symbol, end of its section)
    let mut symbols: Vec<(Symbol, u64)> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
        .filter_map(|s| {
            let section = s.section_index().and_then(|i| obj.section_by_index(i).ok());
            let end = section.as_ref().map_or(u64::MAX, |sec| {
                sec.address().saturating_add(sec.size().max(1))
            });
            // Only symbols inside their section: Mach-O's
            // `__mh_execute_header` marks the header, before `__text`, and
            // would otherwise cover every address of a stripped binary.
            if section.is_some_and(|sec| s.address() < sec.address() || s.address() >= end) {
                return None;
            }
            let mut name = s.name().ok()?;
            if macho {
                // Mach-O C symbols carry a leading underscore.
                name = name.strip_prefix('_').unwrap_or(name);
            }
            (!name.is_empty()).then(|| {
                let sym = Symbol {
                    svma: s.address(),
                    size: s.size(),
                    name: name.to_string(),
                };
                (sym, end)
            })
        })
        .collect();
    if elf {
        // Sized: the end of their section is not needed.
        symbols.extend(plt_symbols_of(&obj).into_iter().map(|s| (s, u64::MAX)));
    }
    let text = data.section(".text").map(|t| (t.svma, t.size));
    data.symbols = super::symbol_table(symbols, labels, text);
    let build_id = match obj.build_id() {
        Ok(Some(id)) => Some(id.to_vec()),
        _ => obj.mach_uuid().ok().flatten().map(|u| u.to_vec()),
    };
    let debuglink = obj
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _crc)| String::from_utf8_lossy(name).into_owned());
    Ok(ParsedFile {
        data,
        build_id,
        debuglink,
    })
}

/// `NAME@plt` symbols of an ELF file (see `plt.rs`).
fn plt_symbols_of(obj: &object::File) -> Vec<Symbol> {
    let range = |name| obj.section_by_name(name).map(|s| (s.address(), s.size()));
    let bytes = |name| {
        obj.section_by_name(name)
            .and_then(|s| s.data().ok())
            .unwrap_or_default()
    };
    plt_symbols(&PltTables {
        plt: range(".plt"),
        plt_sec: range(".plt.sec"),
        rela_plt: bytes(".rela.plt"),
        dynsym: bytes(".dynsym"),
        dynstr: bytes(".dynstr"),
        little_endian: obj.is_little_endian(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
