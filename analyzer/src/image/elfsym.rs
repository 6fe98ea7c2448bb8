//! Raw ELF symbol tables, for images whose `.symtab`/`.strtab` (or
//! `.dynsym`/`.dynstr`) travel as embedded sections without the rest of the
//! file.

use super::Symbol;

const STT_NOTYPE: u8 = 0;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
/// Section indexes from here on are special (`SHN_ABS`, ...), not sections.
const SHN_LORESERVE: u16 = 0xff00;

/// Function symbols, and code-label candidates (typeless symbols in a
/// section, see `symbol_table`), of a 64-bit ELF symbol table `syms` with
/// string table `strs`. Malformed entries are skipped.
pub(crate) fn parse_elf64_symbols(
    syms: &[u8],
    strs: &[u8],
    little_endian: bool,
) -> (Vec<Symbol>, Vec<Symbol>) {
    let u32_at = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if little_endian {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let u64_at = |b: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        if little_endian {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let mut out = Vec::new();
    let mut labels = Vec::new();
    // Elf64_Sym: st_name u32, st_info u8, st_other u8, st_shndx u16,
    // st_value u64, st_size u64.
    for entry in syms.chunks_exact(24) {
        let kind = entry[4] & 0xf;
        let shndx = u16::from_le_bytes([entry[6], entry[7]]);
        let label = kind == STT_NOTYPE && shndx != 0 && shndx < SHN_LORESERVE;
        if !(label || ((kind == STT_FUNC || kind == STT_GNU_IFUNC) && shndx != 0)) {
            continue;
        }
        let value = u64_at(&entry[8..]);
        let size = u64_at(&entry[16..]);
        let name_off = u32_at(entry) as usize;
        let Some(rest) = strs.get(name_off..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        let name = String::from_utf8_lossy(&rest[..end]).into_owned();
        if value == 0 || name.is_empty() {
            continue;
        }
        let symbol = Symbol {
            svma: value,
            size,
            name,
        };
        if !label {
            out.push(symbol);
        } else if super::is_code_label_name(&symbol.name) {
            labels.push(symbol);
        }
    }
    (out, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const SYMS: [u8; 144] = [
        // null symbol
        0,0,0,0, 0, 0, 0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "main": name 1, STB_GLOBAL|STT_FUNC, shndx 14, value 0x1130, size 0x20
        1,0,0,0, 0x12, 0, 14,0, 0x30,0x11,0,0,0,0,0,0, 0x20,0,0,0,0,0,0,0,
        // "data": name 6, STT_OBJECT, skipped
        6,0,0,0, 0x11, 0, 20,0, 0x00,0x40,0,0,0,0,0,0, 8,0,0,0,0,0,0,0,
        // "_start": name 11, STB_LOCAL|STT_NOTYPE, shndx 14, value 0x1100, size 0: a label
        11,0,0,0, 0x00, 0, 14,0, 0x00,0x11,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "$x": name 18, STT_NOTYPE, shndx 14: an AArch64 mapping symbol, skipped
        18,0,0,0, 0x00, 0, 14,0, 0x40,0x11,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "_end": name 21, STT_NOTYPE, SHN_ABS (0xfff1): no section, skipped
        21,0,0,0, 0x10, 0, 0xf1,0xff, 0x00,0x50,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
    ];

    #[test]
    fn functions_and_labels() {
        let strs = b"\0main\0data\0_start\0$x\0_end\0";
        let (syms, labels) = parse_elf64_symbols(&SYMS, strs, true);
        assert_eq!(
            syms,
            vec![Symbol {
                svma: 0x1130,
                size: 0x20,
                name: "main".into()
            }]
        );
        assert_eq!(
            labels,
            vec![Symbol {
                svma: 0x1100,
                size: 0,
                name: "_start".into()
            }]
        );
    }
}

/// Name of the embedded text table of an image's segments and sections
/// that `lrnprof_recorder::embed` writes: one `segment FILE_OFFSET
/// FILE_SIZE SVMA MEM_SIZE` or `section NAME SVMA SIZE` line per entry,
/// numbers in lowercase hex without `0x`.
pub(crate) const EMBEDDED_LAYOUT: &str = ".lrnprof.layout";

/// Segments and (name, SVMA, size) of sections from an embedded layout
/// table. Lines that do not parse are skipped.
pub(crate) fn parse_layout(text: &str) -> (Vec<super::Segment>, Vec<(String, u64, u64)>) {
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let mut segments = Vec::new();
    let mut sections = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["segment", off, size, svma, _mem] => {
                if let (Some(file_offset), Some(file_size), Some(svma)) =
                    (hex(off), hex(size), hex(svma))
                {
                    if file_size > 0 {
                        segments.push(super::Segment {
                            file_offset,
                            file_size,
                            svma,
                            executable: None,
                        });
                    }
                }
            }
            ["section", name, svma, size] => {
                if let (Some(svma), Some(size)) = (hex(svma), hex(size)) {
                    sections.push((name.to_string(), svma, size));
                }
            }
            _ => {}
        }
    }
    (segments, sections)
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn layout_table() {
        let (segs, secs) = parse_layout(
            "segment 0 628 0 628\nsegment 1000 1c5 1000 1c5\nsection .text 1040 113\nbad line\nsection .got 3fd8 28\n",
        );
        assert_eq!(
            segs,
            vec![
                crate::image::Segment {
                    file_offset: 0,
                    file_size: 0x628,
                    svma: 0,
                    executable: None,
                },
                crate::image::Segment {
                    file_offset: 0x1000,
                    file_size: 0x1c5,
                    svma: 0x1000,
                    executable: None,
                },
            ]
        );
        assert_eq!(
            secs,
            vec![
                (".text".into(), 0x1040, 0x113),
                (".got".into(), 0x3fd8, 0x28)
            ]
        );
    }
}
