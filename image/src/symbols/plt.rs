//! Names for PLT stubs (`lib_entry@plt`): the linker writes no symbols for
//! them, yet a sample can stop in one (a program calling a small library
//! function in a loop spends a fair share of its time in the stub's
//! jump). Like `perf`, the names are derived from `.rela.plt`: its i-th
//! relocation is the i-th stub's GOT slot, and its symbol (in `.dynsym`)
//! names the function the stub jumps to.

use super::Symbol;

/// Bytes of one PLT stub (x86_64, and AArch64 without BTI/PAC).
const STUB: u64 = 16;
/// Bytes of an ELF64 `Rela` entry: r_offset u64, r_info u64, r_addend i64.
const RELA_SIZE: usize = 24;
/// Bytes of an ELF64 `Sym` entry: st_name u32, st_info u8, st_other u8,
/// st_shndx u16, st_value u64, st_size u64.
const SYM_SIZE: usize = 24;

/// Where an image's PLT lies, and the tables that name its stubs.
#[derive(Debug, Default)]
pub struct PltTables<'a> {
    /// `.plt`: (SVMA, size). A header (16 bytes on x86_64, 32 on AArch64)
    /// precedes the stubs.
    pub plt: Option<(u64, u64)>,
    /// `.plt.sec` (x86_64 with CET): (SVMA, size); the stubs code jumps
    /// through when `.plt` holds only the lazy-binding entries.
    pub plt_sec: Option<(u64, u64)>,
    /// `.rela.plt` bytes (ELF64 `Rela` entries).
    pub rela_plt: &'a [u8],
    /// `.dynsym` bytes (ELF64 `Sym` entries).
    pub dynsym: &'a [u8],
    /// `.dynstr` bytes.
    pub dynstr: &'a [u8],
    /// Byte order of the tables.
    pub little_endian: bool,
}

/// A `NAME@plt` symbol, sized one stub, for each stub whose relocation
/// names a symbol. Nothing when the sections' sizes do not match the
/// relocation count (another stub size or layout): no name is better than
/// a wrong one.
pub fn plt_symbols(t: &PltTables) -> Vec<Symbol> {
    // The tables are byte slices at any alignment: read fields by hand.
    let u32_at = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if t.little_endian {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    if t.rela_plt.is_empty() || !t.rela_plt.len().is_multiple_of(RELA_SIZE) {
        return Vec::new();
    }
    let count = (t.rela_plt.len() / RELA_SIZE) as u64;
    // r_info's high half (bytes 12..16 little-endian, 8..12 big-endian)
    // is the symbol index.
    let symbol_index = |rela: &[u8]| {
        u32_at(if t.little_endian {
            &rela[12..16]
        } else {
            &rela[8..12]
        }) as usize
    };
    let name_of = |index: usize| {
        let sym = t.dynsym.get(index * SYM_SIZE..(index + 1) * SYM_SIZE)?;
        let rest = t.dynstr.get(u32_at(sym) as usize..)?;
        let name = &rest[..rest.iter().position(|&b| b == 0)?];
        (index != 0 && !name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
    };
    let stubs_at = |(svma, size): (u64, u64), header: u64| {
        (size == header + count * STUB).then_some(svma + header)
    };
    // The stubs' starting SVMAs: `.plt.sec` and the lazy ones in `.plt`
    // after its 16-byte header, or `.plt` alone after a 16- or 32-byte
    // header.
    let mut tables = Vec::new();
    if let Some(sec) = t.plt_sec.and_then(|s| stubs_at(s, 0)) {
        tables.push(sec);
        tables.extend(t.plt.and_then(|p| stubs_at(p, 16)));
    } else if let Some(plt) = t.plt {
        tables.extend(stubs_at(plt, 16).or_else(|| stubs_at(plt, 32)));
    }
    let mut out = Vec::new();
    for (i, rela) in t.rela_plt.chunks_exact(RELA_SIZE).enumerate() {
        let Some(name) = name_of(symbol_index(rela)) else {
            continue;
        };
        let name = format!("{name}@plt");
        for start in &tables {
            out.push(Symbol {
                svma: start + i as u64 * STUB,
                size: STUB,
                name: name.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.dynsym`: the null symbol, then `puts` (name 1) and `lib_entry`
    /// (name 6), both undefined functions.
    #[rustfmt::skip]
    const DYNSYM: [u8; 72] = [
        // null symbol
        0,0,0,0, 0, 0, 0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // st_name 1, STB_GLOBAL|STT_FUNC, st_other 0, SHN_UNDEF, value 0, size 0
        1,0,0,0, 0x12, 0, 0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
        // st_name 6
        6,0,0,0, 0x12, 0, 0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
    ];
    const DYNSTR: &[u8] = b"\0puts\0lib_entry\0";

    /// `.rela.plt`: slots for symbol 2, an IRELATIVE slot without a
    /// symbol, and symbol 1.
    #[rustfmt::skip]
    const RELA_PLT: [u8; 72] = [
        // r_offset 0x4000, r_info: symbol 2, R_X86_64_JUMP_SLOT (7), addend 0
        0,0x40,0,0,0,0,0,0, 7,0,0,0, 2,0,0,0, 0,0,0,0,0,0,0,0,
        // r_offset 0x4008, r_info: symbol 0, R_X86_64_IRELATIVE (37)
        8,0x40,0,0,0,0,0,0, 37,0,0,0, 0,0,0,0, 0,0,0,0,0,0,0,0,
        // r_offset 0x4010, r_info: symbol 1, R_X86_64_JUMP_SLOT
        0x10,0x40,0,0,0,0,0,0, 7,0,0,0, 1,0,0,0, 0,0,0,0,0,0,0,0,
    ];

    fn tables(plt: Option<(u64, u64)>, plt_sec: Option<(u64, u64)>) -> PltTables<'static> {
        PltTables {
            plt,
            plt_sec,
            rela_plt: &RELA_PLT,
            dynsym: &DYNSYM,
            dynstr: DYNSTR,
            little_endian: true,
        }
    }

    fn named(symbols: &[Symbol]) -> Vec<(u64, &str)> {
        symbols.iter().map(|s| (s.svma, s.name.as_str())).collect()
    }

    #[test]
    fn stubs_follow_the_plt_header_in_relocation_order() {
        // x86_64 (GNU ld, lld): a 16-byte header and three stubs.
        let x86 = plt_symbols(&tables(Some((0x1020, 0x40)), None));
        assert_eq!(
            named(&x86),
            [(0x1030, "lib_entry@plt"), (0x1050, "puts@plt")]
        );
        assert!(x86.iter().all(|s| s.size == 16));
        // AArch64: a 32-byte header.
        let arm = plt_symbols(&tables(Some((0x500, 0x50)), None));
        assert_eq!(named(&arm), [(0x520, "lib_entry@plt"), (0x540, "puts@plt")]);
    }

    #[test]
    fn cet_stubs_in_plt_sec_and_plt() {
        let both = plt_symbols(&tables(Some((0x1020, 0x40)), Some((0x1060, 0x30))));
        assert_eq!(
            named(&both),
            [
                (0x1060, "lib_entry@plt"),
                (0x1030, "lib_entry@plt"),
                (0x1080, "puts@plt"),
                (0x1050, "puts@plt"),
            ]
        );
    }

    #[test]
    fn sizes_that_do_not_match_give_no_names() {
        // More stubs than relocations, or 24-byte ones (AArch64 BTI): not
        // this layout.
        assert!(plt_symbols(&tables(Some((0x1020, 0x60)), None)).is_empty());
        assert!(plt_symbols(&tables(Some((0x1020, 0x68)), None)).is_empty());
        assert!(plt_symbols(&tables(None, None)).is_empty());
        // Truncated or garbage tables.
        let mut t = tables(Some((0x1020, 0x40)), None);
        t.rela_plt = &RELA_PLT[..50];
        assert!(plt_symbols(&t).is_empty());
        t.rela_plt = &RELA_PLT;
        t.dynsym = &DYNSYM[..24];
        assert!(plt_symbols(&t).is_empty());
    }
}
