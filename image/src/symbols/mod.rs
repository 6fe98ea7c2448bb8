//! Symbol tables: which function (or code label) holds an SVMA, built the
//! same way from a whole image file ([`symbols_of_object`]), from symbol
//! tables embedded as raw sections ([`parse_elf64_symbols`],
//! [`plt_symbols`], [`symbol_table`]) and from a binary and its separate
//! debug file ([`merge_symbols`]); a stripped binary's MiniDebugInfo
//! ([`mini_debug_info_symbols`]) joins its own symbols. The recorder resolves addresses with
//! these at the end of a recording and the analyzer with them afterwards,
//! so both name a frame alike.

mod elf64;
mod gopclntab;
mod minidebuginfo;
mod plt;

pub use elf64::parse_elf64_symbols;
pub use gopclntab::go_debug_frame;
pub use minidebuginfo::{mini_debug_info_symbols, MINI_DEBUG_INFO_SECTION};
pub use plt::{plt_symbols, PltTables};

use object::{Object, ObjectSection, ObjectSymbol, ReadRef, SymbolKind};

/// A function symbol (from `.symtab`, `.dynsym`, the Mach-O symbol table,
/// a PLT stub) or a code label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Symbol {
    /// Its address in the file.
    pub svma: u64,
    /// Bytes it covers; 0 when unknown (the symbol then reaches the next
    /// one, see [`symbol_table`]).
    pub size: u64,
    /// The name as the file has it (mangled).
    pub name: String,
}

impl Symbol {
    /// A symbol at `svma` of `size` bytes (0: unknown) named `name`.
    pub fn new(svma: u64, size: u64, name: impl Into<String>) -> Symbol {
        Symbol {
            svma,
            size,
            name: name.into(),
        }
    }
}

/// Give each symbol without a size (ELF `_init`, Mach-O symbols) one that
/// reaches the next symbol or the end of its section, whichever is first,
/// so a lookup never names an address of a later section (`.plt`) after
/// it. `symbols` are sorted by address; `section_ends[i]` is the end SVMA
/// of the section holding `symbols[i]`, `u64::MAX` if unknown (the symbol
/// then stays unbounded).
pub fn bound_sizeless(symbols: &mut [Symbol], section_ends: &[u64]) {
    for i in 0..symbols.len() {
        let end = section_ends.get(i).copied().unwrap_or(u64::MAX);
        if symbols[i].size != 0 || end == u64::MAX {
            continue;
        }
        let next = symbols.get(i + 1).map_or(u64::MAX, |s| s.svma);
        symbols[i].size = next.min(end).saturating_sub(symbols[i].svma);
    }
}

/// Whether a symbol without a type (ELF `STT_NOTYPE`) may name code: not
/// an assembler-local label (`.L...`) nor an AArch64/ARM mapping symbol
/// (`$x`, `$d`), which mark instruction/data runs inside functions.
pub fn is_code_label_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('$') && !name.starts_with(".L")
}

/// The lookup table of an image, sorted by SVMA with sizes bounded (see
/// [`bound_sizeless`]), from
/// - `functions`: function symbols (and synthesized `NAME@plt` ones), each
///   with the end SVMA of its section (`u64::MAX` if unknown);
/// - `labels`: symbols without a type in the image, such as the entry code
///   of the dynamic loader (`_start`, `_dl_start_user`: assembly labels
///   that every thread's outermost frame passes through). A label counts
///   only inside `text` (the `.text` SVMA and size) and where no function
///   symbol starts or reaches, so it never renames a function's code.
pub fn symbol_table(
    mut functions: Vec<(Symbol, u64)>,
    labels: Vec<Symbol>,
    text: Option<(u64, u64)>,
) -> Vec<Symbol> {
    // Unstable sorts give what stable ones would: elements that compare
    // equal are equal in every field. They need no buffer.
    functions.sort_unstable();
    let covered = |svma: u64| {
        let i = functions.partition_point(|(f, _)| f.svma <= svma);
        functions[..i]
            .last()
            .is_some_and(|(f, _)| f.svma == svma || svma - f.svma < f.size)
    };
    let mut kept: Vec<(Symbol, u64)> = match text {
        Some((start, size)) => labels
            .into_iter()
            .filter(|l| l.svma >= start && l.svma - start < size && !covered(l.svma))
            .map(|l| (l, start.saturating_add(size)))
            .collect(),
        None => Vec::new(),
    };
    functions.append(&mut kept);
    functions.sort_unstable();
    functions.dedup_by(|a, b| a.0.svma == b.0.svma);
    let (mut symbols, ends): (Vec<Symbol>, Vec<u64>) = functions.into_iter().unzip();
    bound_sizeless(&mut symbols, &ends);
    symbols
}

/// The symbol table ([`symbol_table`]) of an ELF or Mach-O file: its
/// function symbols (`.symtab` and `.dynsym`, or the Mach-O symbol table,
/// without Mach-O's leading underscore), `NAME@plt` stubs of an ELF file,
/// the ELF code labels in `.text`, and the functions of a Go binary's
/// `.gopclntab` when it has no `.symtab` (built with `-ldflags=-s`).
pub fn symbols_of_object<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> Vec<Symbol> {
    let labels: Vec<Symbol> = code_labels(obj).collect();
    let mut functions: Vec<(Symbol, u64)> = function_symbols(obj).collect();
    let text = if obj.format() == object::BinaryFormat::Elf {
        // Sized: the end of their section is not needed.
        functions.extend(plt_symbols_of(obj).into_iter().map(|s| (s, u64::MAX)));
        // A stripped binary's local functions, where it carries them.
        functions.extend(minidebuginfo::symbols_of(obj));
        if obj.section_by_name(".symtab").is_none() {
            functions.extend(gopclntab::go_function_symbols(obj));
        }
        text_range(obj)
    } else {
        None
    };
    symbol_table(functions, labels, text)
}

/// Whether [`symbols_of_object`] of `obj` has any symbol, found without
/// building the table: a function symbol, a PLT stub, or (with neither)
/// a code label inside `.text`, which [`symbol_table`] then keeps.
pub fn object_has_symbols<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> bool {
    if function_symbols(obj).next().is_some() {
        return true;
    }
    if obj.format() != object::BinaryFormat::Elf {
        return false;
    }
    if !plt_symbols_of(obj).is_empty() || minidebuginfo::has(obj) {
        return true;
    }
    if obj.section_by_name(".symtab").is_none() && gopclntab::has_go_functions(obj) {
        return true;
    }
    text_range(obj).is_some_and(|(start, size)| {
        code_labels(obj).any(|l| l.svma >= start && l.svma - start < size)
    })
}

/// `.text`'s SVMA and size.
fn text_range<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> Option<(u64, u64)> {
    obj.section_by_name(".text")
        .map(|t| (t.address(), t.size()))
}

/// ELF symbols without a type in a section: code labels, see
/// [`symbol_table`]. None for Mach-O.
fn code_labels<'data, 'f, R: ReadRef<'data>>(
    obj: &'f object::File<'data, R>,
) -> impl Iterator<Item = Symbol> + use<'data, 'f, R> {
    let elf = obj.format() == object::BinaryFormat::Elf;
    obj.symbols()
        .filter(move |s| {
            elf && s.kind() == SymbolKind::Unknown
                && matches!(s.section(), object::SymbolSection::Section(_))
                && s.address() != 0
        })
        .filter_map(|s| {
            let name = s.name().ok().filter(|n| is_code_label_name(n))?;
            Some(Symbol {
                svma: s.address(),
                size: s.size(),
                name: name.to_string(),
            })
        })
}

/// Function symbols, each with the end of its section.
fn function_symbols<'data, 'f, R: ReadRef<'data>>(
    obj: &'f object::File<'data, R>,
) -> impl Iterator<Item = (Symbol, u64)> + use<'data, 'f, R> {
    let macho = obj.format() == object::BinaryFormat::MachO;
    obj.symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
        .filter_map(move |s| {
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
}

/// `NAME@plt` symbols of an ELF file (see [`plt_symbols`]).
pub(crate) fn plt_symbols_of<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
) -> Vec<Symbol> {
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

/// Add the symbols of an image's separate debug file (`from`, a table of
/// [`symbols_of_object`]) to those of the image (`into`): the debug file
/// keeps the full symbol table (local functions, the dynamic loader's
/// entry labels) that a stripped binary lost. At an address both have,
/// the smaller symbol (then the first by name) wins.
pub fn merge_symbols(into: &mut Vec<Symbol>, from: Vec<Symbol>) {
    if into.is_empty() {
        *into = from;
    } else if !from.is_empty() {
        into.extend(from);
        // As in `symbol_table`: the same order as a stable sort.
        into.sort_unstable();
        into.dedup_by(|a, b| a.svma == b.svma);
    }
}

/// The symbol of `symbols` (a table of [`symbol_table`]) holding `svma`.
pub fn symbol_at(symbols: &[Symbol], svma: u64) -> Option<&Symbol> {
    let i = symbols.partition_point(|s| s.svma <= svma).checked_sub(1)?;
    let s = &symbols[i];
    (s.size == 0 || svma - s.svma < s.size).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizeless_symbols_end_at_the_next_symbol_or_their_section() {
        // `_init` at 0x1000 has no size and its section `.init` ends at
        // 0x1020; `.plt` follows at 0x1020 and has no symbols; `main` has
        // a size; the last one's section is unknown.
        let mut syms = vec![
            Symbol::new(0x1000, 0, "a"),
            Symbol::new(0x1100, 0x40, "b"),
            Symbol::new(0x1200, 0, "c"),
            Symbol::new(0x5000, 0, "d"),
        ];
        bound_sizeless(&mut syms, &[0x1020, 0x2000, 0x2000, u64::MAX]);
        let sizes: Vec<u64> = syms.iter().map(|s| s.size).collect();
        assert_eq!(sizes, vec![0x20, 0x40, 0xe00, 0]);
    }

    #[test]
    fn labels_name_only_code_no_function_covers() {
        // The dynamic loader's layout: `_start` and `_dl_start_user` are
        // labels between sized functions of .text (0x1000..0x2000);
        // `inner` is a label inside `f`, `_etext` marks the end of .text,
        // `__bss_start` lies outside it.
        let functions = vec![
            (Symbol::new(0x1800, 0x40, "g"), 0x2000),
            (Symbol::new(0x1000, 0x100, "f"), 0x2000),
        ];
        let labels = vec![
            Symbol::new(0x1400, 0, "_start"),
            Symbol::new(0x1408, 0, "_dl_start_user"),
            Symbol::new(0x1010, 0, "inner"),
            Symbol::new(0x1800, 0, "g_alias"),
            Symbol::new(0x2000, 0, "_etext"),
            Symbol::new(0x3000, 0, "__bss_start"),
        ];
        let table = symbol_table(functions.clone(), labels.clone(), Some((0x1000, 0x1000)));
        let got: Vec<(u64, u64, &str)> = table
            .iter()
            .map(|s| (s.svma, s.size, s.name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x100, "f"),
                (0x1400, 0x8, "_start"),
                (0x1408, 0x3f8, "_dl_start_user"),
                (0x1800, 0x40, "g"),
            ]
        );
        // Without a known .text, labels are not used.
        assert_eq!(symbol_table(functions, labels, None).len(), 2);
        assert!(is_code_label_name("_start"));
        assert!(!is_code_label_name("$x") && !is_code_label_name(".L42"));
        assert_eq!(symbol_at(&table, 0x1404).unwrap().name, "_start");
        assert_eq!(symbol_at(&table, 0x1840), None);
        assert_eq!(symbol_at(&table, 0xfff), None);
    }

    #[test]
    fn debug_file_symbols_join_the_binarys() {
        let mut binary = vec![Symbol::new(0x1000, 0x10, "puts")];
        merge_symbols(
            &mut binary,
            vec![
                Symbol::new(0x1000, 0x10, "_IO_puts"),
                Symbol::new(0x2000, 8, "local"),
            ],
        );
        let names: Vec<&str> = binary.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["_IO_puts", "local"]);
        let mut empty = Vec::new();
        merge_symbols(&mut empty, vec![Symbol::new(1, 1, "x")]);
        assert_eq!(empty.len(), 1);
    }

    /// This test binary, read whole: its own functions are found (this
    /// one kept out of line, so that it has a symbol in release builds).
    #[test]
    #[inline(never)]
    fn symbols_of_a_real_image() {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let table = symbols_of_object(&obj);
        assert!(table.windows(2).all(|w| w[0].svma < w[1].svma));
        assert!(
            table
                .iter()
                .any(|s| s.name.contains("symbols_of_a_real_image")),
            "{} symbols",
            table.len()
        );
    }

    /// `object_has_symbols` says whether `symbols_of_object` finds any,
    /// on this test binary and on the ELF files of the system's usual
    /// directories (stripped binaries, shared libraries, debug files).
    #[test]
    fn whether_a_file_has_symbols_is_known_without_the_table() {
        let mut files = vec![std::env::current_exe().unwrap()];
        for dir in [
            "/usr/bin",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
        ] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            files.extend(paths.into_iter().filter(|p| p.is_file()).take(80));
        }
        let (mut with, mut without) = (0, 0);
        for path in files {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let Ok(obj) = object::File::parse(&bytes[..]) else {
                continue;
            };
            let has = !symbols_of_object(&obj).is_empty();
            assert_eq!(object_has_symbols(&obj), has, "{}", path.display());
            if has {
                with += 1;
            } else {
                without += 1;
            }
        }
        assert!(with > 0, "no file with symbols among {without} read");
    }
}
