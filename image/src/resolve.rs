//! Naming an address of an image: its function levels, innermost
//! (inlined) first, with file and line from DWARF (through addr2line),
//! else the symbol holding it. The recorder resolves the addresses of a
//! trace this way when it builds a [frame table](crate::FrameTable), the
//! analyzer when it has the image's data: both give the same names.

use crate::demangle::demangle;
use crate::symbols::{symbol_at, Symbol};
use addr2line::{LookupContinuation, LookupResult, SplitDwarfLoad};
use std::borrow::Cow;
use std::sync::Arc;

/// One function level of a location, innermost first when inlined.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameLine {
    /// Demangled function name.
    pub function: String,
    /// Source file, when DWARF line info was found.
    pub file: Option<String>,
    /// Source line, when DWARF line info was found.
    pub line: Option<u32>,
}

/// Most inline levels kept for one address (a guard against malformed
/// DWARF).
const MAX_LEVELS: usize = 257;

/// Resolves SVMAs of one image from its symbol table and, if it has any,
/// its DWARF. `R` is the gimli reader of the DWARF sections (a borrowed
/// slice, or shared bytes when several threads resolve the same image).
pub struct Resolver<'a, R: gimli::Reader> {
    symbols: &'a [Symbol],
    dwarf: Option<addr2line::Context<R>>,
    split: Option<Box<SplitLoader<'a, R>>>,
}

/// What gives a unit's split DWARF (see [`SplitDwarf`](crate::SplitDwarf)).
type SplitLoader<'a, R> = dyn Fn(&SplitDwarfLoad<R>) -> Option<Arc<gimli::Dwarf<R>>> + 'a;

impl<'a, R: gimli::Reader> Resolver<'a, R> {
    /// A resolver over `symbols` (a table of
    /// [`symbol_table`](crate::symbol_table)) and `dwarf`, the image's
    /// DWARF sections if it has them (a `Dwarf` that addr2line cannot use
    /// counts as none).
    pub fn new(symbols: &'a [Symbol], dwarf: Option<gimli::Dwarf<R>>) -> Resolver<'a, R> {
        let dwarf = dwarf.and_then(|d| addr2line::Context::from_dwarf(d).ok());
        Resolver {
            symbols,
            dwarf,
            split: None,
        }
    }

    /// Units whose DWARF is split (`-gsplit-dwarf`) get their functions
    /// and inline frames from what `load` gives (typically
    /// [`SplitDwarf::load`](crate::SplitDwarf::load)); without it, or where
    /// it gives `None`, only their line tables and the symbol table are
    /// used.
    pub fn with_split_dwarf(
        mut self,
        load: impl Fn(&SplitDwarfLoad<R>) -> Option<Arc<gimli::Dwarf<R>>> + 'a,
    ) -> Resolver<'a, R> {
        self.split = Some(Box::new(load));
        self
    }

    /// Whether DWARF is used.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Function levels at `svma` (a lookup address: return addresses
    /// already moved back by one), innermost first; only the outermost
    /// one without `inline`; empty if nothing is known. DWARF gives the
    /// levels with their files and lines; the symbol table names the
    /// outermost level when DWARF has no name for it, or the address when
    /// DWARF knows nothing of it.
    pub fn lookup(&self, svma: u64, inline: bool) -> Vec<FrameLine> {
        let (mut lines, outer_mangled) = self.lookup_dwarf(svma);
        if !inline && lines.len() > 1 {
            lines.drain(..lines.len() - 1);
        }
        let sym = self.symbol_name(svma);
        match lines.last_mut() {
            Some(outer) if outer.function.is_empty() => {
                outer.function = sym.map(|(name, _)| name).unwrap_or_default();
                if outer.function.is_empty() {
                    lines.clear();
                }
            }
            // DWARF of line tables only (rustc's `debug =
            // "line-tables-only"`, clang's `-gline-tables-only`) names a
            // function without its linkage name: `{async_fn#0}` where the
            // symbol is `app::work::{{closure}}`, `run` for
            // `Server::run(int)`. The symbol's name says which one, where
            // it is a name of that function (not an alias of folded code).
            Some(outer) if !outer_mangled => {
                if let Some((name, true)) = sym {
                    if same_function(&name, &outer.function) {
                        outer.function = without_clone_suffix(&name).to_string();
                    }
                }
            }
            Some(_) => {}
            None => {
                if let Some((name, _)) = sym {
                    lines.push(FrameLine {
                        function: name,
                        file: None,
                        line: None,
                    });
                }
            }
        }
        lines.retain(|l| !l.function.is_empty());
        lines
    }

    /// The levels DWARF gives for `svma`, innermost first (names may be
    /// empty), and whether the outermost one's name is a mangled linkage
    /// name.
    fn lookup_dwarf(&self, svma: u64) -> (Vec<FrameLine>, bool) {
        let Some(ctx) = &self.dwarf else {
            return (Vec::new(), false);
        };
        let mut out = Vec::new();
        let mut mangled = false;
        let mut lookup = ctx.find_frames(svma);
        let frames = loop {
            match lookup {
                LookupResult::Output(frames) => break frames,
                LookupResult::Load { load, continuation } => {
                    let split = self.split.as_ref().and_then(|f| f(&load));
                    lookup = continuation.resume(split);
                }
            }
        };
        let Ok(mut frames) = frames else {
            return (out, false);
        };
        while let Ok(Some(frame)) = frames.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| {
                    let raw = f.raw_name().ok()?;
                    mangled = is_mangled(&raw);
                    Some(
                        addr2line::demangle_auto(Cow::Owned(raw.into_owned()), f.language)
                            .into_owned(),
                    )
                })
                .unwrap_or_default();
            let (file, line) = match &frame.location {
                Some(l) => (l.file.map(str::to_string), l.line),
                None => (None, None),
            };
            out.push(FrameLine {
                function,
                file,
                line,
            });
            if out.len() >= MAX_LEVELS {
                break;
            }
        }
        (out, mangled)
    }

    /// The demangled name of the symbol holding `svma`, or where none
    /// does, of the one starting right after it. A return address planted
    /// at a function's first byte (a signal handler's return into glibc's
    /// `__restore_rt`, `makecontext`'s into `__start_context`) is looked up
    /// at the byte before, in the padding outside every function: it is
    /// named after the function it returns into. (A call's own return
    /// address minus one is in the function that called.)
    /// Also whether the symbol's name is mangled.
    fn symbol_name(&self, svma: u64) -> Option<(String, bool)> {
        let at = symbol_at(self.symbols, svma).or_else(|| {
            let next = svma.checked_add(1)?;
            symbol_at(self.symbols, next).filter(|s| s.svma == next)
        });
        at.map(|s| (demangle(&s.name), is_mangled(&s.name)))
    }
}

/// Whether the demangled `symbol` names the function DWARF calls `bare`:
/// their last path components agree, without generic arguments and
/// parameters; closures and async blocks (`{{closure}}`, `{closure#0}`,
/// `{async_fn#0}`) agree with one another.
fn same_function(symbol: &str, bare: &str) -> bool {
    fn last(name: &str) -> String {
        let name = name.split('(').next().unwrap_or(name);
        let mut depth = 0u32;
        let flat: String = name
            .chars()
            .filter(|&c| {
                match c {
                    '<' => depth += 1,
                    '>' => depth = depth.saturating_sub(1),
                    _ => return depth == 0,
                }
                false
            })
            .collect();
        flat.rsplit("::").next().unwrap_or("").to_string()
    }
    let (a, b) = (last(symbol), last(bare));
    !a.is_empty() && (a == b || (a.starts_with('{') && b.starts_with('{')))
}

/// `name` without a trailing ` [clone .cold]` (gcc's part of the same
/// function, which DWARF names as the function).
fn without_clone_suffix(name: &str) -> &str {
    name.find(" [clone ").map_or(name, |i| &name[..i])
}

/// Whether `name` is a C++ (Itanium) or Rust (legacy or v0) mangled name.
fn is_mangled(name: &str) -> bool {
    name.starts_with("_Z") || name.starts_with("_R")
}

/// `lines`, all levels of one address as [`Resolver::lookup`] gives them
/// with inline levels, as it gives them with `inline` (without: only the
/// outermost level).
pub fn project_inline(lines: &[FrameLine], inline: bool) -> Vec<FrameLine> {
    if inline {
        lines.to_vec()
    } else {
        lines.last().cloned().into_iter().collect()
    }
}

/// The DWARF sections of an image for a [`Resolver`], from `section`,
/// which gives the bytes of a section by its canonical name (`.debug_info`)
/// as a gimli reader (an empty one when the image lacks it).
pub fn load_dwarf<R, F>(mut section: F) -> Option<gimli::Dwarf<R>>
where
    R: gimli::Reader,
    F: FnMut(&'static str) -> R,
{
    gimli::Dwarf::load(|id| -> Result<R, gimli::Error> { Ok(section(id.name())) }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{EndianSlice, RunTimeEndian};

    /// A symbol replaces DWARF's bare name only where it names the same
    /// function.
    #[test]
    fn symbols_that_name_a_bare_dwarf_function() {
        assert!(same_function("app::Server::run(long)", "run"));
        assert!(same_function(
            "tok::hash_chain::{{closure}}",
            "{async_fn#0}"
        ));
        assert!(same_function(
            "<core::ops::range::Range<u64> as core::iter::traits::iterator::Iterator>::fold",
            "fold<core::ops::range::Range<u64>, u64>"
        ));
        assert!(same_function("ns::f<int>(int)", "f<int>"));
        assert!(same_function("ns::bar() [clone .cold]", "bar"));
        // Folded code, named by another function's symbol.
        assert!(!same_function("app::other", "crunch"));
        assert!(!same_function("", "crunch"));
        assert_eq!(without_clone_suffix("ns::bar() [clone .cold]"), "ns::bar()");
        assert_eq!(without_clone_suffix("ns::bar()"), "ns::bar()");
    }

    #[test]
    fn without_dwarf_symbols_name_addresses() {
        let symbols = vec![
            Symbol::new(0x1000, 0x10, "_ZN4core3fmt5write17h0123456789abcdefE"),
            Symbol::new(0x2000, 0x10, "main"),
        ];
        let r: Resolver<EndianSlice<RunTimeEndian>> = Resolver::new(&symbols, None);
        assert!(!r.has_dwarf());
        assert_eq!(r.lookup(0x1004, true)[0].function, "core::fmt::write");
        assert_eq!(r.lookup(0x2000, false)[0].function, "main");
        assert!(r.lookup(0x1800, true).is_empty());
        // The byte before a function, outside every symbol: a return
        // address planted at the function's start, looked up a byte back.
        assert_eq!(r.lookup(0x1fff, true)[0].function, "main");
        // The last byte of a function stays its own.
        assert_eq!(r.lookup(0x100f, true)[0].function, "core::fmt::write");
        assert!(r.lookup(0x1ffe, true).is_empty());
    }

    /// This test binary's own DWARF: this function is found, with its file.
    #[test]
    // Looked up by name in the symbol table: never inlined into the harness.
    #[inline(never)]
    fn dwarf_gives_files_and_lines() {
        use object::{Object, ObjectSection, ObjectSymbol};
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let endian = RunTimeEndian::Little;
        let sections: Vec<(String, Cow<[u8]>)> = obj
            .sections()
            .filter_map(|s| Some((s.name().ok()?.to_string(), s.uncompressed_data().ok()?)))
            .collect();
        let dwarf = load_dwarf(|name| {
            let data = sections
                .iter()
                .find(|(n, _)| n == name)
                .map_or(&[][..], |(_, d)| &d[..]);
            EndianSlice::new(data, endian)
        });
        let symbols = crate::symbols_of_object(&obj);
        let r = Resolver::new(&symbols, dwarf);
        let me = obj
            .symbols()
            .find(|s| {
                s.name()
                    .is_ok_and(|n| n.contains("dwarf_gives_files_and_lines"))
            })
            .unwrap();
        let lines = r.lookup(me.address(), true);
        let outer = lines.last().expect("this function is known");
        assert!(
            outer.function.ends_with("dwarf_gives_files_and_lines"),
            "{lines:?}"
        );
        if r.has_dwarf() {
            assert!(outer
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("resolve.rs")));
        }
        assert_eq!(project_inline(&lines, false), vec![outer.clone()]);
        assert_eq!(project_inline(&lines, true), lines);
    }
}
