//! Naming an address of an image: its function levels, innermost
//! (inlined) first, with file and line from DWARF (through addr2line),
//! else the symbol holding it. The recorder resolves the addresses of a
//! trace this way when it builds a [frame table](crate::FrameTable), the
//! analyzer when it has the image's data: both give the same names.

use crate::demangle::demangle;
use crate::symbols::{symbol_at, Symbol};
use gimli::ReaderOffset;
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

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
}

impl<'a, R: gimli::Reader> Resolver<'a, R> {
    /// A resolver over `symbols` (a table of
    /// [`symbol_table`](crate::symbol_table)) and `dwarf`, the image's
    /// DWARF sections if it has them (a `Dwarf` that addr2line cannot use
    /// counts as none).
    pub fn new(symbols: &'a [Symbol], dwarf: Option<gimli::Dwarf<R>>) -> Resolver<'a, R> {
        let dwarf = dwarf.and_then(|d| addr2line::Context::from_dwarf(d).ok());
        Resolver { symbols, dwarf }
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
        let mut lines = self.lookup_dwarf(svma);
        if !inline && lines.len() > 1 {
            lines.drain(..lines.len() - 1);
        }
        let sym = self.symbol_name(svma);
        match lines.last_mut() {
            Some(outer) if outer.function.is_empty() => {
                outer.function = sym.unwrap_or_default();
                if outer.function.is_empty() {
                    lines.clear();
                }
            }
            Some(_) => {}
            None => {
                if let Some(name) = sym {
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
    /// empty).
    fn lookup_dwarf(&self, svma: u64) -> Vec<FrameLine> {
        let Some(ctx) = &self.dwarf else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let Ok(mut frames) = ctx.find_frames(svma).skip_all_loads() else {
            return out;
        };
        while let Ok(Some(frame)) = frames.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| {
                    let raw = f.raw_name().ok()?;
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
        out
    }

    /// The demangled name of the symbol holding `svma`.
    fn symbol_name(&self, svma: u64) -> Option<String> {
        symbol_at(self.symbols, svma).map(|s| demangle(&s.name))
    }
}

/// For lookup addresses of one [`Resolver`], the stretch of addresses
/// around each that [`Resolver::lookup`] names exactly as it names that
/// one: what the frame cache keeps, so that an address first seen in a
/// later recording is named without the image's DWARF when an earlier
/// one named an address beside it.
///
/// A stretch ends wherever anything the lookup reads could change: a
/// symbol's start or end; with DWARF, where a unit's address ranges
/// begin or end, where any entry of the address's unit
/// (functions, inlined calls, blocks) begins or ends, and at each row of
/// the line programs there. addr2line finds functions, inlined calls and
/// rows by binary searches over those bounds, so between two of them
/// every search takes the same path. Where the unit cannot be told (more
/// than one unit's ranges hold the address, DWARF that does not read),
/// the stretch is the address alone.
pub struct Spans<'r, 'a, R: gimli::Reader> {
    resolver: &'r Resolver<'a, R>,
    /// The address ranges of every unit, read on first use; `None`
    /// inside when they cannot be told.
    units: Option<Option<UnitRanges>>,
    /// Per unit (offset in `.debug_info`): the sorted bounds of its
    /// entries' address ranges, `None` when they do not read.
    entries: HashMap<u64, Option<Vec<u64>>>,
}

/// Where the units are: from each bound on (sorted), which units' ranges
/// hold the addresses up to the next.
struct UnitRanges {
    bounds: Vec<u64>,
    holders: Vec<Holder>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Nothing,
    /// The unit at this offset, alone.
    Sole(u64),
    Several,
}

impl UnitRanges {
    /// Of `(begin, end, unit offset)` ranges.
    fn new(ranges: &[(u64, u64, u64)]) -> UnitRanges {
        let mut events: Vec<(u64, bool, u64)> = ranges
            .iter()
            .filter(|r| r.0 < r.1)
            .flat_map(|&(b, e, u)| [(b, true, u), (e, false, u)])
            .collect();
        events.sort_unstable();
        let mut open: HashMap<u64, usize> = HashMap::new();
        let (mut bounds, mut holders) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < events.len() {
            let at = events[i].0;
            while i < events.len() && events[i].0 == at {
                let (_, begins, unit) = events[i];
                let n = open.entry(unit).or_default();
                if begins {
                    *n += 1;
                } else {
                    *n -= 1;
                    if *n == 0 {
                        open.remove(&unit);
                    }
                }
                i += 1;
            }
            let mut units = open.keys();
            let holder = match (units.next(), units.next()) {
                (None, _) => Holder::Nothing,
                (Some(&u), None) => Holder::Sole(u),
                _ => Holder::Several,
            };
            bounds.push(at);
            holders.push(holder);
        }
        UnitRanges { bounds, holders }
    }

    /// Which units hold `svma`.
    fn holder(&self, svma: u64) -> Holder {
        let i = self.bounds.partition_point(|&b| b <= svma);
        i.checked_sub(1)
            .map_or(Holder::Nothing, |i| self.holders[i])
    }
}

/// The stretch around one address being narrowed: `lo..hi` holds it.
struct Narrowing {
    at: u64,
    lo: u64,
    hi: u64,
}

impl Narrowing {
    fn new(at: u64) -> Narrowing {
        Narrowing {
            at,
            lo: 0,
            hi: u64::MAX,
        }
    }

    /// A bound where the lookup may change.
    fn bound(&mut self, b: u64) {
        if b <= self.at {
            self.lo = self.lo.max(b);
        } else {
            self.hi = self.hi.min(b);
        }
    }

    /// The nearest of `sorted` bounds on either side.
    fn bounds(&mut self, sorted: &[u64]) {
        let i = sorted.partition_point(|&b| b <= self.at);
        if let Some(&b) = i.checked_sub(1).and_then(|i| sorted.get(i)) {
            self.bound(b);
        }
        if let Some(&b) = sorted.get(i) {
            self.bound(b);
        }
    }
}

impl<'r, 'a, R: gimli::Reader> Spans<'r, 'a, R> {
    /// Stretches of `resolver`'s lookups.
    pub fn new(resolver: &'r Resolver<'a, R>) -> Spans<'r, 'a, R> {
        Spans {
            resolver,
            units: None,
            entries: HashMap::new(),
        }
    }

    /// The addresses around `svma` that [`Resolver::lookup`] names as it
    /// names `svma` (with or without inline levels): at least `svma`.
    pub fn around(&mut self, svma: u64) -> Range<u64> {
        let alone = svma..svma.saturating_add(1);
        let mut n = Narrowing::new(svma);
        let symbols = self.resolver.symbols;
        let i = symbols.partition_point(|s| s.svma <= svma);
        if let Some(s) = i.checked_sub(1).map(|i| &symbols[i]) {
            n.bound(s.svma);
            if s.size > 0 {
                n.bound(s.svma.saturating_add(s.size));
            }
        }
        if let Some(s) = symbols.get(i) {
            n.bound(s.svma);
        }
        if let Some(ctx) = &self.resolver.dwarf {
            // The unit the lookup reads (the first whose ranges hold
            // `svma` and that has a function or a row there).
            let Some(unit) = ctx.find_dwarf_and_unit(svma).skip_all_loads() else {
                return alone;
            };
            let Some(offset) = unit.header.debug_info_offset().map(|o| o.0.into_u64()) else {
                return alone;
            };
            let units = self.units.get_or_insert_with(|| unit_ranges(unit.dwarf));
            let Some(units) = units else {
                return alone;
            };
            // Held by that unit alone.
            if units.holder(svma) != Holder::Sole(offset) {
                return alone;
            }
            n.bounds(&units.bounds);
            let entries = self
                .entries
                .entry(offset)
                .or_insert_with(|| entry_bounds(unit));
            let Some(entries) = entries else {
                return alone;
            };
            n.bounds(entries);
            // Rows last, over what is left: a function's rows only.
            let Ok(rows) = ctx.find_location_range(n.lo, n.hi) else {
                return alone;
            };
            for (begin, len, _) in rows {
                n.bound(begin);
                n.bound(begin.saturating_add(len));
            }
        }
        n.lo..n.hi
    }

    /// The stretches of the whole function (the symbol) holding `svma`,
    /// each with its levels ([`Resolver::lookup`] with inline levels), by
    /// address: sampled instruction pointers move within a function from
    /// one recording to the next. Only the stretch around `svma` when no
    /// symbol with a size holds it, the symbol is larger than
    /// [`MAX_FUNCTION_BYTES`], or past [`MAX_FUNCTION_STRETCHES`].
    pub fn function(&mut self, svma: u64) -> Vec<(Range<u64>, Vec<FrameLine>)> {
        let resolver = self.resolver;
        let alone = |s: &mut Self| (s.around(svma), resolver.lookup(svma, true));
        let Some(sym) = symbol_at(resolver.symbols, svma).filter(|s| s.size > 0) else {
            return vec![alone(self)];
        };
        let end = sym.svma.saturating_add(sym.size);
        if end - sym.svma > MAX_FUNCTION_BYTES {
            return vec![alone(self)];
        }
        let mut out = Vec::new();
        let mut at = sym.svma;
        while at < end {
            if out.len() == MAX_FUNCTION_STRETCHES {
                out.retain(|(r, _): &(Range<u64>, _)| r.end <= svma || r.start > svma);
                out.push(alone(self));
                out.sort_by_key(|(r, _)| r.start);
                break;
            }
            let span = self.around(at);
            let lines = resolver.lookup(at, true);
            at = span.end;
            out.push((span, lines));
        }
        out
    }
}

/// Most bytes of a function whose every stretch
/// [`Spans::function`] finds.
const MAX_FUNCTION_BYTES: u64 = 256 << 10;

/// Most stretches [`Spans::function`] finds in one function.
const MAX_FUNCTION_STRETCHES: usize = 4096;

/// The address ranges of every compilation unit of `dwarf`, as addr2line
/// takes them: the unit's `DW_AT_ranges`, else `.debug_aranges`, else its
/// low and high pc. A unit whose entries do not read (hidden, see
/// [`hide_units`](crate::hide_units)) counts with its `.debug_aranges`
/// ranges; `None` when it has none there, or a section does not read.
fn unit_ranges<R: gimli::Reader>(dwarf: &gimli::Dwarf<R>) -> Option<UnitRanges> {
    let mut aranges: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut headers = dwarf.debug_aranges.headers();
    while let Some(header) = headers.next().ok()? {
        let unit = header.debug_info_offset().0.into_u64();
        let listed = aranges.entry(unit).or_default();
        let mut entries = header.entries();
        while let Some(e) = entries.next().ok()? {
            if e.length() != 0 {
                listed.push((e.range().begin, e.range().end));
            }
        }
    }
    let mut ranges = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().ok()? {
        if matches!(
            header.type_(),
            gimli::UnitType::Type { .. } | gimli::UnitType::SplitType { .. }
        ) {
            continue;
        }
        let offset = header.debug_info_offset()?.0.into_u64();
        let listed = aranges.get(&offset);
        let Ok(unit) = dwarf.unit(header) else {
            // Not read by addr2line either; its ranges as listed.
            ranges.extend(listed?.iter().map(|&(b, e)| (b, e, offset)));
            continue;
        };
        let own_ranges = {
            let mut root = unit.entries();
            root.next_dfs().ok()??.has_attr(gimli::DW_AT_ranges)
        };
        match listed {
            Some(listed) if !own_ranges && !listed.is_empty() => {
                ranges.extend(listed.iter().map(|&(b, e)| (b, e, offset)));
            }
            _ => {
                let mut own = dwarf.unit_ranges(&unit).ok()?;
                while let Some(r) = own.next().ok()? {
                    ranges.push((r.begin, r.end, offset));
                }
            }
        }
    }
    Some(UnitRanges::new(&ranges))
}

/// The bounds of the address ranges of every entry of `unit`, sorted;
/// `None` when an entry does not read.
fn entry_bounds<R: gimli::Reader>(unit: gimli::UnitRef<'_, R>) -> Option<Vec<u64>> {
    let mut bounds = Vec::new();
    let mut cursor = unit.entries();
    while let Some(entry) = cursor.next_dfs().ok()? {
        if entry.has_attr(gimli::DW_AT_low_pc)
            || entry.has_attr(gimli::DW_AT_high_pc)
            || entry.has_attr(gimli::DW_AT_ranges)
        {
            let mut ranges = unit.die_ranges(entry).ok()?;
            while let Some(r) = ranges.next().ok()? {
                bounds.extend([r.begin, r.end]);
            }
        }
    }
    bounds.sort_unstable();
    bounds.dedup();
    Some(bounds)
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
    }

    #[test]
    fn without_dwarf_spans_are_the_symbols() {
        let symbols = vec![
            Symbol::new(0x1000, 0x10, "a"),
            Symbol::new(0x1008, 0x10, "b"),
            Symbol::new(0x2000, 0, "c"),
            Symbol::new(0x3000, 0x10, "d"),
        ];
        let r: Resolver<EndianSlice<RunTimeEndian>> = Resolver::new(&symbols, None);
        let mut spans = Spans::new(&r);
        assert_eq!(spans.around(0x1004), 0x1000..0x1008);
        assert_eq!(spans.around(0x1010), 0x1008..0x1018);
        assert_eq!(spans.around(0x1800), 0x1018..0x2000);
        assert_eq!(spans.around(0x2fff), 0x2000..0x3000);
        assert_eq!(spans.around(0x3010), 0x3010..u64::MAX);
        assert_eq!(spans.around(0x10), 0..0x1000);
    }

    /// Sections by name, with their bytes.
    type Sections = Vec<(String, Vec<u8>)>;

    /// This test binary's symbols, sections and `.text` addresses.
    fn own_parts() -> (Vec<Symbol>, Sections, Range<u64>) {
        use object::{Object, ObjectSection};
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let sections = obj
            .sections()
            .filter_map(|s| {
                Some((
                    s.name().ok()?.to_string(),
                    s.uncompressed_data().ok()?.into_owned(),
                ))
            })
            .collect();
        let text = obj.section_by_name(".text").unwrap();
        let text = text.address()..text.address() + text.size();
        (crate::symbols_of_object(&obj), sections, text)
    }

    fn own_dwarf(
        sections: &[(String, Vec<u8>)],
    ) -> Option<gimli::Dwarf<EndianSlice<'_, RunTimeEndian>>> {
        load_dwarf(|name| {
            let data = sections
                .iter()
                .find(|(n, _)| n == name)
                .map_or(&[][..], |(_, d)| &d[..]);
            EndianSlice::new(data, RunTimeEndian::Little)
        })
    }

    /// Across this test binary (optimized dependencies with inlined
    /// calls, from its own DWARF), every address of a stretch is named as
    /// the address it was found for.
    #[test]
    fn every_address_of_a_span_is_named_alike() {
        let (symbols, sections, text) = own_parts();
        let r = Resolver::new(&symbols, own_dwarf(&sections));
        assert!(r.has_dwarf(), "the test binary has DWARF");
        let mut spans = Spans::new(&r);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let (mut wide, mut inlined) = (0, 0);
        let tries = 1000;
        for _ in 0..tries {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = text.start + seed % (text.end - text.start);
            let span = spans.around(at);
            assert!(span.contains(&at), "{at:#x} outside {span:x?}");
            let lines = r.lookup(at, true);
            if span.end - span.start > 1 {
                wide += 1;
            }
            if lines.len() > 1 {
                inlined += 1;
            }
            // Every address of a short span; of a long one, 64 across it.
            let len = span.end.min(text.end.max(at + 1)) - span.start;
            let step = (len / 64).max(1);
            let probes = (span.start..span.start + len)
                .step_by(step as usize)
                .chain([span.start + len - 1]);
            for p in probes {
                assert_eq!(
                    r.lookup(p, true),
                    lines,
                    "{p:#x} in {span:x?}, found for {at:#x}"
                );
            }
        }
        // Not the address alone most of the time, and inlined calls met.
        assert!(
            wide * 2 > tries,
            "{wide} of {tries} spans wider than one address"
        );
        assert!(inlined > 0, "no inlined call met");
    }

    /// The stretches of a whole function cover its symbol, one after the
    /// other, each named as its addresses are.
    #[test]
    fn a_function_is_covered_by_its_stretches() {
        let (symbols, sections, text) = own_parts();
        let r = Resolver::new(&symbols, own_dwarf(&sections));
        let mut spans = Spans::new(&r);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let (mut functions, mut several) = (0, 0);
        for _ in 0..200 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = text.start + seed % (text.end - text.start);
            let stretches = spans.function(at);
            assert!(stretches.iter().any(|(s, _)| s.contains(&at)), "{at:#x}");
            let Some(sym) = symbol_at(&symbols, at).filter(|s| s.size > 0) else {
                continue;
            };
            if sym.size > MAX_FUNCTION_BYTES || stretches.len() >= MAX_FUNCTION_STRETCHES {
                continue;
            }
            functions += 1;
            several += usize::from(stretches.len() > 1);
            assert_eq!(stretches[0].0.start, sym.svma);
            assert_eq!(stretches.last().unwrap().0.end, sym.svma + sym.size);
            for w in stretches.windows(2) {
                assert_eq!(w[0].0.end, w[1].0.start);
            }
            for (span, lines) in &stretches {
                let mid = span.start + (span.end - span.start) / 2;
                for p in [span.start, mid, span.end - 1] {
                    assert_eq!(&r.lookup(p, true), lines, "{p:#x} in {span:x?}");
                }
            }
        }
        assert!(
            functions > 100 && several > 50,
            "{functions} functions, {several} with several stretches"
        );
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
