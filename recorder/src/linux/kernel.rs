//! What the analyzer needs to name kernel frames: the kernel's symbol
//! table (`/proc/kallsyms`, module symbols included) and its build id
//! (`/sys/kernel/notes`). Runs on the writer thread at the end of a
//! `--kernel` recording.

use crate::report::RecordWarning;
use lrnprof_format::{Blob, BlobKind, BuildId};
use lrnprof_image::{split_blob, MAX_BLOB_PART};
use std::collections::HashSet;

const KALLSYMS: &str = "/proc/kallsyms";
const KPTR_RESTRICT: &str = "/proc/sys/kernel/kptr_restrict";
const NOTES: &str = "/sys/kernel/notes";

/// Whether `/proc/kallsyms` hides its addresses from us (every address
/// printed as zero: `kernel.kptr_restrict`), or cannot be read.
pub(crate) fn addresses_hidden() -> bool {
    match std::fs::read_to_string(KALLSYMS) {
        Ok(text) => parse_symbols(&text).is_empty(),
        Err(_) => true,
    }
}

/// The warning for hidden kernel addresses.
pub(crate) fn hidden_warning() -> RecordWarning {
    RecordWarning::KernelAddressesHidden {
        kptr_restrict: super::procfs::read_sysctl(KPTR_RESTRICT),
    }
}

/// The `KernelSymbols` blobs naming the kernel addresses `touched`: the
/// symbol containing each address and the one after it (which bounds
/// it), as `/proc/kallsyms` lines, keyed by the kernel's build id (empty
/// if unknown). A warning instead when the addresses are hidden.
pub(crate) fn symbol_blobs(touched: &HashSet<u64>, warnings: &mut Vec<RecordWarning>) -> Vec<Blob> {
    let text = std::fs::read_to_string(KALLSYMS).unwrap_or_default();
    let symbols = parse_symbols(&text);
    if symbols.is_empty() {
        warnings.push(hidden_warning());
        return Vec::new();
    }
    let table = table_for(&symbols, touched);
    let build_id = std::fs::read(NOTES)
        .ok()
        .and_then(|notes| gnu_build_id(&notes))
        .unwrap_or_default();
    // Left uncompressed: the block holding it is compressed.
    split_blob(
        &BuildId(build_id),
        BlobKind::KernelSymbols,
        false,
        table.into_bytes(),
        MAX_BLOB_PART,
    )
}

/// One symbol line of `/proc/kallsyms`: its address and the whole line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SymbolLine<'a> {
    address: u64,
    line: &'a str,
}

/// The code symbols (types `t`, `T`, `w`, `W`) of a `/proc/kallsyms`
/// text with a non-zero address, sorted by address. Empty when the kernel
/// hides addresses (all zero).
fn parse_symbols(text: &str) -> Vec<SymbolLine<'_>> {
    let mut symbols: Vec<SymbolLine> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let address = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            fields.next()?;
            (address != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                .then_some(SymbolLine { address, line })
        })
        .collect();
    symbols.sort_by_key(|s| s.address);
    symbols
}

/// The lines of `symbols` (sorted) that name `touched` addresses: each
/// address's symbol and the next one, in address order.
fn table_for(symbols: &[SymbolLine<'_>], touched: &HashSet<u64>) -> String {
    let mut keep = vec![false; symbols.len()];
    for &address in touched {
        let i = symbols.partition_point(|s| s.address <= address);
        if let Some(containing) = i.checked_sub(1) {
            keep[containing] = true;
            if let Some(next) = keep.get_mut(i) {
                *next = true;
            }
        }
    }
    let mut table = String::new();
    for (s, _) in symbols.iter().zip(&keep).filter(|(_, &k)| k) {
        table.push_str(s.line);
        table.push('\n');
    }
    table
}

/// The `NT_GNU_BUILD_ID` descriptor in a sequence of ELF notes (4-byte
/// aligned, native endian, as `/sys/kernel/notes` holds them).
fn gnu_build_id(notes: &[u8]) -> Option<Vec<u8>> {
    let word = |at: usize| -> Option<usize> {
        let b = notes.get(at..at + 4)?;
        Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let align = |n: usize| n.checked_add(3).map(|n| n & !3);
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at)?, word(at + 4)?, word(at + 8)?);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(align(namesz)?)?;
        let end = desc_at.checked_add(align(descsz)?)?;
        let name = notes.get(name_at..name_at.checked_add(namesz)?)?;
        // NT_GNU_BUILD_ID is 3 in the "GNU" namespace.
        if kind == 3 && name == b"GNU\0" {
            return notes
                .get(desc_at..desc_at.checked_add(descsz)?)
                .map(<[u8]>::to_vec);
        }
        at = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS_TEXT: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 t do_one
ffffffff81001000 D some_data
ffffffff81002000 T ksys_write
ffffffff81003000 T vfs_write
ffffffffc0001000 t ext4_thing\t[ext4]
";

    #[test]
    fn touched_addresses_keep_their_symbol_and_the_next() {
        let symbols = parse_symbols(KALLSYMS_TEXT);
        assert_eq!(symbols.len(), 5, "data symbols dropped");
        let touched: HashSet<u64> = [0xffff_ffff_8100_2010].into_iter().collect();
        assert_eq!(
            table_for(&symbols, &touched),
            "ffffffff81002000 T ksys_write\nffffffff81003000 T vfs_write\n"
        );
        let touched: HashSet<u64> = [0xffff_ffff_c000_1004, 0x10].into_iter().collect();
        assert_eq!(
            table_for(&symbols, &touched),
            "ffffffffc0001000 t ext4_thing\t[ext4]\n",
            "module symbols keep their suffix; addresses below every symbol name nothing"
        );
    }

    #[test]
    fn hidden_addresses_leave_no_symbols() {
        let hidden = "0000000000000000 T _stext\n0000000000000000 t do_one\n";
        assert!(parse_symbols(hidden).is_empty());
        assert!(parse_symbols("garbage\n\n").is_empty());
    }

    #[rustfmt::skip]
    #[test]
    fn build_id_is_found_among_notes() {
        let mut notes = Vec::new();
        notes.extend(6u32.to_ne_bytes());            // namesz "Linux\0"
        notes.extend(4u32.to_ne_bytes());            // descsz
        notes.extend(0x100u32.to_ne_bytes());        // type
        notes.extend(b"Linux\0\0\0");                // name, padded to 8
        notes.extend([1, 2, 3, 4]);                  // desc
        notes.extend(4u32.to_ne_bytes());            // namesz "GNU\0"
        notes.extend(5u32.to_ne_bytes());            // descsz
        notes.extend(3u32.to_ne_bytes());            // NT_GNU_BUILD_ID
        notes.extend(b"GNU\0");                      // name
        notes.extend([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0, 0]); // desc, padded
        assert_eq!(gnu_build_id(&notes), Some(vec![0xaa, 0xbb, 0xcc, 0xdd, 0xee]));
        assert_eq!(gnu_build_id(&notes[..30]), None);
        assert_eq!(gnu_build_id(&[0xff; 64]), None);
    }
}
