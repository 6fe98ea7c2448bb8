//! ELF symbol tables embedded as raw sections (`.symtab`/`.strtab` or
//! `.dynsym`/`.dynstr`) without the rest of the file, read through object's
//! raw `Elf64_Sym` in the image's byte order.

use super::Symbol;
use object::elf::{Sym64, SHN_LORESERVE, SHN_UNDEF, STT_FUNC, STT_GNU_IFUNC, STT_NOTYPE};
use object::read::elf::Sym as _;
use object::read::StringTable;
use object::Endianness;

/// Function symbols, and code-label candidates (typeless symbols in a
/// section, see `symbol_table`), of a 64-bit ELF symbol table `syms` with
/// string table `strs`. Entries that are neither, or whose name cannot be
/// read, are skipped; a partial entry at the end is ignored.
pub fn parse_elf64_symbols(
    syms: &[u8],
    strs: &[u8],
    little_endian: bool,
) -> (Vec<Symbol>, Vec<Symbol>) {
    let endian = if little_endian {
        Endianness::Little
    } else {
        Endianness::Big
    };
    let count = syms.len() / std::mem::size_of::<Sym64<Endianness>>();
    let Ok((table, _)) = object::pod::slice_from_bytes::<Sym64<Endianness>>(syms, count) else {
        return (Vec::new(), Vec::new());
    };
    let strings = StringTable::new(strs, 0, strs.len() as u64);
    let mut functions = Vec::new();
    let mut labels = Vec::new();
    for sym in table {
        let shndx = sym.st_shndx(endian);
        let in_section = shndx != SHN_UNDEF && shndx < SHN_LORESERVE;
        let function = matches!(sym.st_type(), STT_FUNC | STT_GNU_IFUNC) && shndx != SHN_UNDEF;
        let label = sym.st_type() == STT_NOTYPE && in_section;
        if !(function || label) || sym.st_value(endian) == 0 {
            continue;
        }
        let Ok(name) = sym.name(endian, strings) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let symbol = Symbol {
            svma: sym.st_value(endian),
            size: sym.st_size(endian),
            name: String::from_utf8_lossy(name).into_owned(),
        };
        if function {
            functions.push(symbol);
        } else if super::is_code_label_name(&symbol.name) {
            labels.push(symbol);
        }
    }
    (functions, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const SYMS: [u8; 168] = [
        // null symbol
        0,0,0,0, 0, 0, 0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "main": name 1, STB_GLOBAL|STT_FUNC, shndx 14, value 0x1130, size 0x20
        1,0,0,0, 0x12, 0, 14,0, 0x30,0x11,0,0,0,0,0,0, 0x20,0,0,0,0,0,0,0,
        // "data": name 6, STT_OBJECT, skipped
        6,0,0,0, 0x11, 0, 20,0, 0x00,0x40,0,0,0,0,0,0, 8,0,0,0,0,0,0,0,
        // "puts": name 11, STT_FUNC, shndx 0 (undefined), skipped
        11,0,0,0, 0x12, 0, 0,0, 0x50,0x11,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "_start": name 16, STB_LOCAL|STT_NOTYPE, shndx 14, value 0x1100, size 0: a label
        16,0,0,0, 0x00, 0, 14,0, 0x00,0x11,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "$x": name 23, STT_NOTYPE, shndx 14: an AArch64 mapping symbol, skipped
        23,0,0,0, 0x00, 0, 14,0, 0x40,0x11,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "_end": name 26, STT_NOTYPE, SHN_ABS (0xfff1): no section, skipped
        26,0,0,0, 0x10, 0, 0xf1,0xff, 0x00,0x50,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
    ];

    const STRS: &[u8] = b"\0main\0data\0puts\0_start\0$x\0_end\0";

    fn expected() -> (Vec<Symbol>, Vec<Symbol>) {
        (
            vec![Symbol {
                svma: 0x1130,
                size: 0x20,
                name: "main".into(),
            }],
            vec![Symbol {
                svma: 0x1100,
                size: 0,
                name: "_start".into(),
            }],
        )
    }

    #[test]
    fn defined_functions_and_labels() {
        assert_eq!(parse_elf64_symbols(&SYMS, STRS, true), expected());
        // A partial entry at the end is ignored.
        let mut longer = SYMS.to_vec();
        longer.extend_from_slice(&[0x12; 10]);
        assert_eq!(parse_elf64_symbols(&longer, STRS, true), expected());
    }

    /// Every field, `st_shndx` included, is read in the image's byte order.
    #[test]
    fn big_endian_tables() {
        let mut syms = SYMS.to_vec();
        for entry in syms.chunks_exact_mut(24) {
            for (at, len) in [(0, 4), (6, 2), (8, 8), (16, 8)] {
                entry[at..at + len].reverse();
            }
        }
        assert_eq!(parse_elf64_symbols(&syms, STRS, false), expected());
    }

    #[test]
    fn names_outside_the_string_table_are_skipped() {
        let none = (Vec::new(), Vec::new());
        assert_eq!(parse_elf64_symbols(&SYMS, b"\0ma", true), none);
        assert_eq!(parse_elf64_symbols(&SYMS, b"", true), none);
        assert_eq!(parse_elf64_symbols(&SYMS[..23], b"\0main\0", true), none);
    }
}
