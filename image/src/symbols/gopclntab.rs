//! Function names and unwind rules from a Go binary's `.gopclntab`, the
//! table the Go runtime itself uses to name frames and walk stacks: kept
//! in binaries stripped of their symbol table and DWARF (`go build
//! -ldflags=-s -w`), where it is the only source of either.
//!
//! Read are the header, the function table (entry offset and `_func`
//! offset of each function, then the end of the last) and of each
//! `_func` its name offset into the name table, its stack-pointer table
//! ([`go_debug_frame`] makes CFI of it) and its flag byte, in the layout
//! of Go 1.18 and later (magic `0xfffffff0`, and `0xfffffff1` from Go 1.20
//! on, which moved the flag byte and nothing else read here). Older
//! layouts give nothing.
//!
//! The `objfile` reader of Go's own tools (`debug/gosym`) reads the same
//! words.

use super::Symbol;
use crate::cfi_write::{advance, entry, fde_header, push_sleb, push_uleb, X86_64_CIE};
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
    let Some((data, text)) = pclntab(obj) else {
        return Vec::new();
    };
    parse(data, obj.is_little_endian(), text).unwrap_or_default()
}

/// Whether `obj` has a `.gopclntab` that names any function.
pub(super) fn has_go_functions<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> bool {
    obj.section_by_name(".gopclntab").is_some() && !go_function_symbols(obj).is_empty()
}

/// `.text`'s SVMA and size, if known.
type TextRange = Option<(u64, u64)>;

/// `.gopclntab`'s bytes and `.text`'s SVMA and size.
fn pclntab<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Option<(&'data [u8], TextRange)> {
    let data = obj.section_by_name(".gopclntab")?.data().ok()?;
    let text = obj
        .section_by_name(".text")
        .map(|t| (t.address(), t.size()));
    Some((data, text))
}

/// A `.gopclntab` of the Go 1.18 layout or later, as far as it is read.
struct Table<'a> {
    data: &'a [u8],
    little_endian: bool,
    /// The layout's magic number.
    magic: u32,
    /// Functions.
    nfunc: usize,
    /// SVMA that function entry offsets count from.
    text_start: u64,
    /// Offsets in `data` of the name table, the pc-value tables and the
    /// function table.
    names: usize,
    pctab: usize,
    functab: usize,
    /// Bytes per step of a pc-value table's pc deltas.
    quantum: u64,
}

/// One function: its entry and end (offsets from the text start) and
/// where its `_func` is in the table.
struct Func {
    entry: u32,
    end: u32,
    func: usize,
}

impl<'a> Table<'a> {
    /// `text` is `.text`'s SVMA and size, for a table whose text start is
    /// not filled in (position independent binaries).
    fn parse(data: &'a [u8], little_endian: bool, text: Option<(u64, u64)>) -> Option<Table<'a>> {
        let mut t = Table {
            data,
            little_endian,
            magic: 0,
            nfunc: 0,
            text_start: 0,
            names: 0,
            pctab: 0,
            functab: 0,
            quantum: 1,
        };
        let magic = t.u32_at(0)?;
        if magic != MAGIC_GO118 && magic != MAGIC_GO120 {
            return None;
        }
        t.quantum = u64::from(*data.get(6)?).max(1);
        let ptr_size = usize::from(*data.get(7)?);
        if ptr_size != 4 && ptr_size != 8 {
            return None;
        }
        // Header words after the first 8 bytes: functions, files, text
        // start, then offsets of the name table, the compilation unit
        // table, the file table, the pc tables and the function table.
        let word = |i: usize| -> Option<u64> {
            let at = 8usize.checked_add(i.checked_mul(ptr_size)?)?;
            if ptr_size == 8 {
                let lo = u64::from(t.u32_at(at)?);
                let hi = u64::from(t.u32_at(at + 4)?);
                Some(if little_endian {
                    lo | hi << 32
                } else {
                    hi | lo << 32
                })
            } else {
                t.u32_at(at).map(u64::from)
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
        let names = usize::try_from(word(3)?).ok()?;
        let pctab = usize::try_from(word(6)?).ok()?;
        let functab = usize::try_from(word(7)?).ok()?;
        Some(Table {
            magic,
            nfunc,
            text_start,
            names,
            pctab,
            functab,
            ..t
        })
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        let b: [u8; 4] = self.data.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if self.little_endian {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }

    /// Function `f`: the function table holds nfunc (entry offset,
    /// `_func` offset) pairs of u32, then the end's entry offset.
    fn func(&self, f: usize) -> Option<Func> {
        let field = |i: usize| self.u32_at(self.functab.checked_add(i.checked_mul(4)?)?);
        let entry = field(2 * f)?;
        let func = self
            .functab
            .checked_add(usize::try_from(field(2 * f + 1)?).ok()?)?;
        let end = field(2 * f + 2)?;
        Some(Func { entry, end, func })
    }

    /// A `_func`'s name: the second u32 of the `_func` is its offset in
    /// the name table.
    fn name(&self, f: &Func) -> Option<&'a str> {
        let off = usize::try_from(self.u32_at(f.func.checked_add(4)?)?).ok()?;
        let name = self.data.get(self.names.checked_add(off)?..)?;
        std::str::from_utf8(&name[..name.iter().position(|&b| b == 0)?]).ok()
    }

    /// Whether a `_func` is marked as the outermost frame of a stack
    /// (`runtime.goexit`, `runtime.mstart`, ...): bit 0 of its flag byte,
    /// after nine u32 fields and the function id byte (ten u32 fields from
    /// Go 1.20 on, which added the start line).
    fn is_top_frame(&self, f: &Func) -> bool {
        let at = if self.magic == MAGIC_GO118 { 37 } else { 41 };
        f.func
            .checked_add(at)
            .and_then(|at| self.data.get(at))
            .is_some_and(|flag| flag & 1 != 0)
    }

    /// A `_func`'s stack-pointer table: (value, end offset from the text
    /// start) runs from its entry on. The value is how far the stack
    /// pointer is below where it was at the entry, the return address
    /// not counted. Its offset in the pc tables is the `_func`'s fifth
    /// u32 (after entry, name, argument size and deferreturn).
    fn sp_deltas(&self, f: &Func) -> Option<Vec<(i64, u32)>> {
        let at = self.u32_at(f.func.checked_add(16)?)?;
        let start = self.pctab.checked_add(usize::try_from(at).ok()?)?;
        let mut p = self.data.get(start..)?;
        let (mut pc, mut value) = (u64::from(f.entry), -1i64);
        let mut runs = Vec::new();
        loop {
            let (delta, n) = uvarint(p)?;
            if delta == 0 && !runs.is_empty() {
                break;
            }
            p = &p[n..];
            // Zigzag: the low bit is the sign.
            let delta = if delta & 1 == 0 {
                (delta >> 1) as i64
            } else {
                !((delta >> 1) as i64)
            };
            value = value.checked_add(delta)?;
            let (step, n) = uvarint(p)?;
            p = &p[n..];
            pc = pc.checked_add(step.checked_mul(self.quantum)?)?;
            let end = u32::try_from(pc).ok()?;
            if end > f.end || runs.len() > MAX_RUNS {
                return None;
            }
            runs.push((value, end));
        }
        Some(runs)
    }
}

/// Bound on the runs of one function's stack-pointer table.
const MAX_RUNS: usize = 1 << 16;

/// A little-endian base-128 number and its length in bytes.
fn uvarint(p: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &b) in p.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// The functions of `data`, a `.gopclntab` (see [`Table::parse`]).
fn parse(data: &[u8], little_endian: bool, text: Option<(u64, u64)>) -> Option<Vec<(Symbol, u64)>> {
    let t = Table::parse(data, little_endian, text)?;
    let text_end = text.map_or(u64::MAX, |(start, size)| start.saturating_add(size));
    let mut symbols = Vec::with_capacity(t.nfunc);
    for f in 0..t.nfunc {
        let func = t.func(f)?;
        let name = t.name(&func)?;
        if name.is_empty() || func.end <= func.entry {
            continue;
        }
        let svma = t.text_start.checked_add(u64::from(func.entry))?;
        let symbol = Symbol::new(svma, u64::from(func.end - func.entry), name);
        symbols.push((symbol, text_end));
    }
    Some(symbols)
}

/// A `.debug_frame` for an x86-64 or AArch64 Go binary that has no unwind
/// tables (built with `-ldflags=-s -w`), made from the stack-pointer
/// tables of its `.gopclntab` as Go's linker makes the `.debug_frame` of a
/// binary it does not strip. x86-64: a CIE whose frame address is
/// `rsp + 8` with the return address just below it, and per function the
/// frame address's offset from `rsp` at every instruction. AArch64: the
/// frame address is `sp` plus what the function took of the stack; while
/// it has taken none the return address is in `x30`, then at the bottom
/// of its frame (where Go's prologue stores it). Only the functions
/// holding one of `svmas` (sorted), or all with `None`. `None` if `obj` is
/// no such binary.
pub fn go_debug_frame<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
    svmas: Option<&[u64]>,
) -> Option<Vec<u8>> {
    let arm = match obj.architecture() {
        object::Architecture::X86_64 => false,
        object::Architecture::Aarch64 => true,
        _ => return None,
    };
    if !obj.is_little_endian()
        || obj.section_by_name(".eh_frame").is_some()
        || obj.section_by_name(".debug_frame").is_some()
    {
        return None;
    }
    let (data, text) = pclntab(obj)?;
    let t = Table::parse(data, true, text)?;
    // CIE: version 3, no augmentation, code alignment 1, then
    // x86-64: data alignment -8, return address in column 16 (rip);
    // DW_CFA_def_cfa rsp+8, DW_CFA_offset rip at cfa-8.
    // AArch64: data alignment -4, return address in column 30 (x30);
    // DW_CFA_def_cfa sp+0, DW_CFA_same_value x30, DW_CFA_val_offset sp
    // is cfa+0.
    let cie: &[u8] = if arm {
        &[
            0xff, 0xff, 0xff, 0xff, 3, 0, 1, 0x7c, 30, 0x0c, 31, 0, 0x08, 30, 0x14, 31, 0,
        ]
    } else {
        X86_64_CIE
    };
    let mut out = Vec::new();
    entry(&mut out, cie);
    let mut program = Vec::new();
    for f in 0..t.nfunc {
        let Some(func) = t.func(f) else { break };
        if func.end <= func.entry {
            continue;
        }
        let start = t.text_start.saturating_add(u64::from(func.entry));
        let end = t.text_start.saturating_add(u64::from(func.end));
        if let Some(svmas) = svmas {
            let i = svmas.partition_point(|&s| s < start);
            if svmas.get(i).is_none_or(|&s| s >= end) {
                continue;
            }
        }
        let Some(runs) = t.sp_deltas(&func) else {
            continue;
        };
        // The function's code ends with its last run, before any padding
        // up to the next function.
        let Some(&(_, last)) = runs.last() else {
            continue;
        };
        fde_header(&mut program, 0, start, u64::from(last - func.entry));
        // Go marks the return address of the outermost frames undefined
        // where it is in a register, so that unwinders stop there.
        let top = arm && t.is_top_frame(&func);
        let mut pc = u64::from(func.entry);
        let data_align = if arm { -4 } else { -8 };
        for (value, run_end) in runs {
            // The frame address's offset from the stack pointer (x86-64:
            // the return address counted too).
            let offset = if arm { value } else { value + 8 };
            if arm {
                if top {
                    // DW_CFA_undefined x30.
                    program.extend([0x07, 30]);
                } else if value > 0 {
                    // DW_CFA_offset_extended_sf x30 at cfa - value.
                    program.extend([0x11, 30]);
                    push_sleb(&mut program, -value / data_align);
                } else {
                    // DW_CFA_same_value x30: the frame is given back.
                    program.extend([0x08, 30]);
                }
            }
            if offset >= 0 {
                // DW_CFA_def_cfa_offset.
                program.push(0x0e);
                push_uleb(&mut program, offset as u64);
            } else {
                // DW_CFA_def_cfa_offset_sf, factored by the data alignment.
                program.push(0x13);
                push_sleb(&mut program, offset / data_align);
            }
            let step = u64::from(run_end) - pc;
            pc = u64::from(run_end);
            if run_end >= last {
                break;
            }
            advance(&mut program, step);
        }
        entry(&mut out, &program);
    }
    Some(out)
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
    fn pc_value_tables_read_base_128_numbers() {
        assert_eq!(uvarint(&[0x05]), Some((5, 1)));
        assert_eq!(uvarint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(uvarint(&[0x80]), None);
        assert_eq!(uvarint(&[0xff; 11]), None);
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
            // The stack-pointer tables of whatever the flip left.
            if let Some(table) = Table::parse(&b, true, None) {
                for f in 0..table.nfunc.min(4) {
                    if let Some(func) = table.func(f) {
                        let _ = table.sp_deltas(&func);
                    }
                }
            }
        }
    }
}
