//! ELF symbol tables embedded as raw sections (`.symtab`/`.strtab` or
//! `.dynsym`/`.dynstr`) without the rest of the file, read through object's
//! raw `Elf64_Sym` in the image's byte order.

use super::Symbol;
use object::elf::{Sym64, SHN_UNDEF, STT_FUNC, STT_GNU_IFUNC};
use object::read::elf::Sym as _;
use object::read::StringTable;
use object::Endianness;

/// Function symbols of a 64-bit ELF symbol table `syms` with string table
/// `strs`. Entries that are not defined functions or whose name cannot be
/// read are skipped; a partial entry at the end is ignored.
pub(crate) fn parse_elf64_symbols(syms: &[u8], strs: &[u8], little_endian: bool) -> Vec<Symbol> {
    let endian = if little_endian {
        Endianness::Little
    } else {
        Endianness::Big
    };
    let count = syms.len() / std::mem::size_of::<Sym64<Endianness>>();
    let Ok((table, _)) = object::pod::slice_from_bytes::<Sym64<Endianness>>(syms, count) else {
        return Vec::new();
    };
    let strings = StringTable::new(strs, 0, strs.len() as u64);
    table
        .iter()
        .filter(|sym| matches!(sym.st_type(), STT_FUNC | STT_GNU_IFUNC))
        .filter(|sym| sym.st_shndx(endian) != SHN_UNDEF && sym.st_value(endian) != 0)
        .filter_map(|sym| {
            let name = sym.name(endian, strings).ok()?;
            (!name.is_empty()).then(|| Symbol {
                svma: sym.st_value(endian),
                size: sym.st_size(endian),
                name: String::from_utf8_lossy(name).into_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const SYMS: [u8; 96] = [
        // null symbol
        0,0,0,0, 0, 0, 0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // "main": name 1, STB_GLOBAL|STT_FUNC, shndx 14, value 0x1130, size 0x20
        1,0,0,0, 0x12, 0, 14,0, 0x30,0x11,0,0,0,0,0,0, 0x20,0,0,0,0,0,0,0,
        // "data": name 6, STT_OBJECT, skipped
        6,0,0,0, 0x11, 0, 20,0, 0x00,0x40,0,0,0,0,0,0, 8,0,0,0,0,0,0,0,
        // "puts": name 11, STT_FUNC, shndx 0 (undefined), skipped
        11,0,0,0, 0x12, 0, 0,0, 0x50,0x11,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
    ];

    fn main_symbol() -> Vec<Symbol> {
        vec![Symbol {
            svma: 0x1130,
            size: 0x20,
            name: "main".into(),
        }]
    }

    #[test]
    fn defined_functions_only() {
        let strs = b"\0main\0data\0puts\0";
        assert_eq!(parse_elf64_symbols(&SYMS, strs, true), main_symbol());
        // A partial entry at the end is ignored.
        let mut longer = SYMS.to_vec();
        longer.extend_from_slice(&[0x12; 10]);
        assert_eq!(parse_elf64_symbols(&longer, strs, true), main_symbol());
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
        let strs = b"\0main\0data\0puts\0";
        assert_eq!(parse_elf64_symbols(&syms, strs, false), main_symbol());
    }

    #[test]
    fn names_outside_the_string_table_are_skipped() {
        assert!(parse_elf64_symbols(&SYMS, b"\0ma", true).is_empty());
        assert!(parse_elf64_symbols(&SYMS, b"", true).is_empty());
        assert!(parse_elf64_symbols(&SYMS[..23], b"\0main\0", true).is_empty());
    }
}
