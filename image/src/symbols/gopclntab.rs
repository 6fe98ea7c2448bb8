//! Function names from a Go binary's `.gopclntab`, the table the Go
//! runtime itself uses to name frames: kept in binaries stripped of their
//! symbol table and DWARF (`go build -ldflags=-s -w`), where it is the
//! only source of names.
//!
//! Read are the header, the function table (entry offset and `_func`
//! offset of each function, then the end of the last) and each `_func`'s
//! name offset into the name table, in the layout of Go 1.18 and later
//! (magic `0xfffffff0`, and `0xfffffff1` from Go 1.20 on, whose layout of
//! these parts is the same). Older layouts give no symbols.
//!
//! The `objfile` reader of Go's own tools (`debug/gosym`) reads the same
//! words.

use super::Symbol;
use object::{Object, ObjectSection, ReadRef};

/// Magic numbers of the Go 1.18 and Go 1.20 layouts.
const MAGIC_GO118: u32 = 0xffff_fff0;
const MAGIC_GO120: u32 = 0xffff_fff1;

/// Bound on the functions read: a corrupt count must not make us
/// allocate what it claims (a large Go binary has about 100,000).
const MAX_FUNCTIONS: usize = 1 << 22;

/// Function symbols of the Go binary `obj`, each with the end of `.text`
/// (sized: the next function's entry ends each); empty where it has no
/// `.gopclntab` of a known layout or the table is corrupt.
pub(super) fn go_function_symbols<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Vec<(Symbol, u64)> {
    let Some(table) = obj.section_by_name(".gopclntab") else {
        return Vec::new();
    };
    let Ok(data) = table.data() else {
        return Vec::new();
    };
    let text = obj
        .section_by_name(".text")
        .map(|t| (t.address(), t.size()));
    parse(data, obj.is_little_endian(), text).unwrap_or_default()
}

/// Whether `obj` has a `.gopclntab` that names any function.
pub(super) fn has_go_functions<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> bool {
    obj.section_by_name(".gopclntab").is_some() && !go_function_symbols(obj).is_empty()
}

/// The functions of `data`, a `.gopclntab`; `text` is `.text`'s SVMA and
/// size, for a table whose text start is not filled in (position
/// independent binaries).
fn parse(data: &[u8], little_endian: bool, text: Option<(u64, u64)>) -> Option<Vec<(Symbol, u64)>> {
    let u32_at = |at: usize| -> Option<u32> {
        let b: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if little_endian {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let magic = u32_at(0)?;
    if magic != MAGIC_GO118 && magic != MAGIC_GO120 {
        return None;
    }
    let ptr_size = usize::from(*data.get(7)?);
    if ptr_size != 4 && ptr_size != 8 {
        return None;
    }
    // Header words after the first 8 bytes: functions, files, text start,
    // then offsets of the name table, the compilation unit table, the
    // file table, the pc tables and the function table.
    let word = |i: usize| -> Option<u64> {
        let at = 8usize.checked_add(i.checked_mul(ptr_size)?)?;
        if ptr_size == 8 {
            let b: [u8; 8] = data.get(at..at.checked_add(8)?)?.try_into().ok()?;
            Some(if little_endian {
                u64::from_le_bytes(b)
            } else {
                u64::from_be_bytes(b)
            })
        } else {
            u32_at(at).map(u64::from)
        }
    };
    let nfunc = usize::try_from(word(0)?).ok()?;
    if nfunc > MAX_FUNCTIONS {
        return None;
    }
    let text_start = match word(2)? {
        0 => text?.0,
        start => start,
    };
    let text_end = text.map_or(u64::MAX, |(start, size)| start.saturating_add(size));
    let names = usize::try_from(word(3)?).ok()?;
    let functab = usize::try_from(word(7)?).ok()?;
    // nfunc (entry offset, _func offset) pairs of u32, then the end's
    // entry offset.
    let field = |i: usize| u32_at(functab.checked_add(i.checked_mul(4)?)?);
    let mut symbols = Vec::with_capacity(nfunc);
    for f in 0..nfunc {
        let entry = field(2 * f)?;
        let func = usize::try_from(field(2 * f + 1)?).ok()?;
        let next = field(2 * f + 2)?;
        // A `_func` begins with its entry offset, then its name's offset.
        let name_off = usize::try_from(u32_at(functab.checked_add(func)?.checked_add(4)?)?).ok()?;
        let name = data.get(names.checked_add(name_off)?..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if name.is_empty() || next <= entry {
            continue;
        }
        let svma = text_start.checked_add(u64::from(entry))?;
        let symbol = Symbol::new(svma, u64::from(next - entry), name);
        symbols.push((symbol, text_end));
    }
    Some(symbols)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Go 1.18-layout table (little endian, 8-byte words) of `funcs`:
    /// (entry offset from text start, name), ending at `end`.
    fn table(text_start: u64, funcs: &[(u32, &str)], end: u32) -> Vec<u8> {
        let header = 8 + 8 * 8;
        let mut names = Vec::new();
        let mut name_offs = Vec::new();
        for (_, n) in funcs {
            name_offs.push(names.len() as u32);
            names.extend(n.as_bytes());
            names.push(0);
        }
        let names_at = header;
        let functab_at = names_at + names.len();
        let pairs = 4 * (2 * funcs.len() + 1);
        let mut out = MAGIC_GO118.to_le_bytes().to_vec();
        out.extend([0, 0, 1, 8]);
        for w in [
            funcs.len() as u64,
            0,
            text_start,
            names_at as u64,
            0,
            0,
            0,
            functab_at as u64,
        ] {
            out.extend(w.to_le_bytes());
        }
        out.extend(&names);
        for (i, (entry, _)) in funcs.iter().enumerate() {
            out.extend(entry.to_le_bytes());
            // `_func`s follow the function table: 8 bytes each.
            out.extend(((pairs + 8 * i) as u32).to_le_bytes());
        }
        out.extend(end.to_le_bytes());
        for (i, (entry, _)) in funcs.iter().enumerate() {
            out.extend(entry.to_le_bytes());
            out.extend(name_offs[i].to_le_bytes());
        }
        out
    }

    #[test]
    fn names_and_sizes_come_from_the_function_table() {
        let t = table(
            0x40_1000,
            &[(0, "runtime.text"), (0x40, "main.main")],
            0x100,
        );
        let got = parse(&t, true, None).unwrap();
        let want = vec![
            (Symbol::new(0x40_1000, 0x40, "runtime.text"), u64::MAX),
            (Symbol::new(0x40_1040, 0xc0, "main.main"), u64::MAX),
        ];
        assert_eq!(got, want);
        // A table without its text start takes `.text`'s.
        let t = table(0, &[(0x10, "main.f")], 0x20);
        let got = parse(&t, true, Some((0x2000, 0x100))).unwrap();
        assert_eq!(got, vec![(Symbol::new(0x2010, 0x10, "main.f"), 0x2100)]);
    }

    #[test]
    fn other_layouts_and_corrupt_tables_give_nothing() {
        let mut t = table(0x1000, &[(0, "main.main")], 0x10);
        t[0] = 0xfb; // Go 1.2's magic
        assert_eq!(parse(&t, true, None), None);
        let t = table(0x1000, &[(0, "main.main")], 0x10);
        for len in 0..t.len() {
            assert_eq!(parse(&t[..len], true, None), None, "cut at {len}");
        }
        for i in 0..t.len() {
            let mut b = t.clone();
            b[i] ^= 0xff;
            let _ = parse(&b, true, None);
        }
    }
}
