//! MiniDebugInfo: the `.gnu_debugdata` section Fedora, RHEL and their
//! derivatives add to the binaries and libraries they ship stripped. It
//! holds an xz-compressed ELF file whose symbol table names the local
//! functions (those `.dynsym` lacks), so that a stack through a static
//! function is named without the debuginfo package.

use super::{function_symbols, Symbol};
use object::{Object, ObjectSection, ReadRef};

/// The section's name.
pub const MINI_DEBUG_INFO_SECTION: &str = ".gnu_debugdata";

/// Most bytes the section may decompress to: the symbol table of the
/// largest library is a few MiB.
const MAX_BYTES: usize = 64 << 20;

/// A writer that refuses to grow past [`MAX_BYTES`] (the decompressed
/// size is whatever the data says).
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_BYTES {
            return Err(std::io::Error::other("MiniDebugInfo larger than its bound"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The function symbols (with the end of their section, as
/// [`function_symbols`] gives them) of the ELF file `section`, the bytes
/// of a `.gnu_debugdata` section, holds; none if it is not xz data holding
/// an ELF file, or decompresses past its bound.
pub fn mini_debug_info_symbols(section: &[u8]) -> Vec<(Symbol, u64)> {
    if section.is_empty() {
        return Vec::new();
    }
    // The decoder is meant to fail cleanly on corrupt data; should it
    // panic instead, the section is taken as corrupt all the same.
    let decoded = std::panic::catch_unwind(|| {
        let mut out = Bounded(Vec::new());
        lzma_rs::xz_decompress(&mut &section[..], &mut out).map(|()| out.0)
    });
    let Ok(Ok(bytes)) = decoded else {
        return Vec::new();
    };
    match object::File::parse(&bytes[..]) {
        Ok(inner) if inner.format() == object::BinaryFormat::Elf => {
            function_symbols(&inner).collect()
        }
        _ => Vec::new(),
    }
}

/// [`mini_debug_info_symbols`] of `obj`'s `.gnu_debugdata`, if it has one.
pub(super) fn symbols_of<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Vec<(Symbol, u64)> {
    match obj.section_by_name(MINI_DEBUG_INFO_SECTION) {
        Some(s) => s.data().map(mini_debug_info_symbols).unwrap_or_default(),
        None => Vec::new(),
    }
}

/// Whether `obj` has a `.gnu_debugdata` section with bytes.
pub(super) fn has<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> bool {
    obj.section_by_name(MINI_DEBUG_INFO_SECTION)
        .is_some_and(|s| s.data().is_ok_and(|d| !d.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_xz_holding_an_elf_file_gives_no_symbols() {
        assert!(mini_debug_info_symbols(b"").is_empty());
        assert!(mini_debug_info_symbols(b"\xfd7zXZ\0 truncated").is_empty());
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut &b"not an ELF file"[..], &mut xz).unwrap();
        assert!(mini_debug_info_symbols(&xz).is_empty());
    }

    /// Every single-byte corruption of a small stream gives no symbols
    /// (and returns).
    #[test]
    fn corrupt_streams_give_no_symbols() {
        let mut xz = Vec::new();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        lzma_rs::xz_compress(&mut &data[..], &mut xz).unwrap();
        for i in 0..xz.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = xz.clone();
                bad[i] ^= flip;
                assert!(mini_debug_info_symbols(&bad).is_empty());
            }
            assert!(mini_debug_info_symbols(&xz[..i]).is_empty());
        }
    }

    #[test]
    fn the_symbols_of_the_compressed_file_are_read() {
        // This test binary, compressed, stands for the ELF file the
        // section holds.
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let direct: Vec<(Symbol, u64)> = function_symbols(&obj).collect();
        assert!(!direct.is_empty());
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut &bytes[..], &mut xz).unwrap();
        assert_eq!(mini_debug_info_symbols(&xz), direct);
    }
}
