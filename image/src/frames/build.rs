//! Building an image's frame table from its file: the addresses a trace
//! can need, each resolved once as the analyzer would resolve it with the
//! same files (the image's symbol table merged with its separate debug
//! file's, and the DWARF of whichever of the two has it).

use super::cache::{FrameCache, NameSource};
use super::FrameTable;
use crate::debug_file::{
    alt_file_candidates, debug_file_candidates, supplementary_id, supplementary_link,
};
use crate::layout::Layout;
use crate::resolve::{load_dwarf, FrameLine, Resolver};
use crate::sections::{canonical_section_name, DEBUG_SECTION_PREFIX};
use crate::source::FileSource;
use crate::split_dwarf::{SplitDwarf, SplitPlaces};
use crate::symbols::{merge_symbols, symbols_of_object};
use crate::units::{hide_units, inflate_zlib, units_to_hide, unused_dwarf};
use crate::ImageError;
use gimli::{EndianSlice, RunTimeEndian};
use lrnprof_format::BuildId;
use object::{CompressionFormat, Object, ObjectSection, ReadCache, ReadRef, SectionKind};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;

/// Most bytes of DWARF sections (decompressed) read to build one image's
/// table, which the recorder holds in memory while it resolves: past it
/// the image gets no table (its symbol tables still name its frames).
pub const MAX_DWARF_BYTES: u64 = 512 << 20;

/// What to build a frame table of.
#[derive(Debug)]
pub struct FrameRequest<'a> {
    /// The image file (for instance kept open since the image was mapped).
    pub file: File,
    /// The image's path as the process mapped it: where `.gnu_debuglink`
    /// names are looked for.
    pub path: &'a str,
    /// The image's build id; a debug file is used only if it has the same.
    pub build_id: &'a BuildId,
    /// The addresses to resolve, as offsets in the file: instruction
    /// pointers as they are, return addresses minus one (inside their
    /// call instruction). In order of importance: when the table would
    /// exceed `max_bytes`, the last ones are left out.
    pub file_offsets: &'a [u64],
    /// Most bytes of table.
    pub max_bytes: usize,
    /// Roots besides `/` under which to look for debug files.
    pub debug_roots: &'a [PathBuf],
    /// When neither the image nor a debug file has DWARF, build the table
    /// from the image's symbol tables alone (what the analyzer names such
    /// an image's addresses with), instead of giving `Ok(None)`.
    pub symbols_alone: bool,
    /// Where addresses resolved before are taken from, and those resolved
    /// now are kept; `None`: resolve every address from the files.
    pub cache: Option<&'a FrameCache>,
}

/// A table built by [`frame_table_for_file`].
#[derive(Debug, Clone)]
pub struct FrameTableBuilt {
    /// Its bytes ([`FrameTable::to_bytes`]).
    pub bytes: Vec<u8>,
    /// Addresses in the table.
    pub addresses: usize,
    /// Addresses left out to stay within `max_bytes`.
    pub left_out: usize,
    /// The separate debug file that was read, if any.
    pub debug_file: Option<PathBuf>,
    /// Addresses in the table taken from the cache.
    pub from_cache: usize,
    /// Whether the DWARF was read as the cache kept it, inflated.
    pub dwarf_from_cache: bool,
    /// Why the cache could not be updated, if it could not.
    pub cache_error: Option<String>,
    /// Units of split DWARF (`-gsplit-dwarf`) whose `.dwo` file (or
    /// `.dwp` package) was not found, and where the first of them was
    /// looked for first: their addresses are named without inline frames.
    pub split_dwarf_missing: Option<(usize, Option<PathBuf>)>,
    /// The supplementary debug file (`dwz -m`) the DWARF refers to, as its
    /// `.gnu_debugaltlink` names it, when no file with the build id the
    /// link gives was found (or it was larger than [`MAX_DWARF_BYTES`]):
    /// the names and inline functions it holds are missing.
    pub alt_file_missing: Option<PathBuf>,
}

/// The DWARF sections of a parsed file that are `wanted`, by canonical
/// name (`.debug_info`), inflated, without the empty ones, those without
/// bytes in the file and compressed ones that do not inflate.
fn dwarf_sections<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
    wanted: &HashSet<&str>,
) -> HashMap<String, Cow<'data, [u8]>> {
    obj.sections()
        .filter(|s| s.kind() != SectionKind::UninitializedData)
        .filter_map(|s| {
            let name = canonical_section_name(s.name().ok()?, false);
            if !wanted.contains(name.as_ref()) {
                return None;
            }
            let data = section_bytes(&s)?;
            (!data.is_empty()).then(|| (name.into_owned(), data))
        })
        .collect()
}

/// A section's bytes, inflated if compressed: zlib (what ELF files use)
/// by [`inflate_zlib`], anything else by `object`.
fn section_bytes<'data>(s: &impl ObjectSection<'data>) -> Option<Cow<'data, [u8]>> {
    let compressed = s.compressed_data().ok()?;
    match compressed.format {
        CompressionFormat::None => Some(Cow::Borrowed(compressed.data)),
        CompressionFormat::Zlib => {
            let size = usize::try_from(compressed.uncompressed_size).ok()?;
            inflate_zlib(compressed.data, size).map(Cow::Owned)
        }
        _ => compressed.decompress().ok(),
    }
}

/// Bytes of the DWARF sections of `obj`, decompressed.
fn dwarf_size<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> u64 {
    obj.sections()
        .filter(|s| s.kind() != SectionKind::UninitializedData)
        .filter(|s| {
            s.name()
                .is_ok_and(|n| canonical_section_name(n, false).starts_with(DEBUG_SECTION_PREFIX))
        })
        .map(|s| {
            s.compressed_file_range()
                .map_or(s.size(), |r| r.uncompressed_size)
        })
        .sum()
}

/// Whether `obj` has DWARF debug info (a `.debug_info` with bytes).
fn has_dwarf<'data, R: ReadRef<'data>>(obj: &object::File<'data, R>) -> bool {
    obj.sections().any(|s| {
        s.kind() != SectionKind::UninitializedData
            && s.size() > 0
            && s.name()
                .is_ok_and(|n| canonical_section_name(n, false) == ".debug_info")
    })
}

/// Build the frame table of the image `request.file`: each of
/// `request.file_offsets` resolved to its inline levels with file and
/// line, or its symbol. The DWARF is the image's own or, when it has none,
/// that of its separate debug file (same build id, see
/// [`debug_file_candidates`]), whose symbol table then joins the image's.
/// `Ok(None)` when neither has DWARF: the image's symbol tables, embedded
/// as sections, name its frames just as well; unless
/// `request.symbols_alone`, then the table is built from them. With
/// `request.cache`, addresses kept there are taken from it (the same
/// lines), the others resolved and added to it; the files' DWARF and
/// symbols are not read when there are none. Errors if the image cannot
/// be parsed or its DWARF is larger than [`MAX_DWARF_BYTES`]; a cache
/// that cannot be written is not an error (see
/// [`FrameTableBuilt::cache_error`]).
pub fn frame_table_for_file(
    request: FrameRequest<'_>,
) -> Result<Option<FrameTableBuilt>, ImageError> {
    Ok(build_table(request, true)?.map(|(built, _)| built))
}

/// [`frame_table_for_file`], and how many units were hidden; `hide` lets
/// addr2line parse only the units that hold a requested address (the
/// table is the same either way).
fn build_table(
    request: FrameRequest<'_>,
    hide: bool,
) -> Result<Option<(FrameTableBuilt, usize)>, ImageError> {
    let FrameRequest {
        file,
        path,
        build_id,
        file_offsets,
        max_bytes,
        debug_roots,
        symbols_alone,
        cache,
    } = request;
    let not_an_image = |e: object::Error| ImageError::NotAnImage(e.to_string());
    // Mapped (see `FileSource`); where that fails, read through the cache,
    // which reads only the headers and symbol tables, and read again
    // whole below if it has DWARF and is small: most of it is read then.
    let first = FileSource::mapped_or_cached(&file);
    let whole;
    let mut image = object::File::parse(&first).map_err(not_an_image)?;
    let own_dwarf = has_dwarf(&image);
    let found = if own_dwarf {
        None
    } else {
        match find_debug_file(&image, path, build_id, debug_roots) {
            Some(found) => Some(found),
            None if symbols_alone => None,
            None => return Ok(None),
        }
    };
    let source = match (own_dwarf, &found) {
        (true, _) => NameSource::OwnDwarf,
        (false, Some(_)) => NameSource::DebugFile,
        (false, None) => NameSource::Symbols {
            tables: symbol_tables_key(&image),
        },
    };
    let keeping = cache.map(|cache| Keeping {
        cache,
        id: build_id,
        source,
    });
    let wanted = svmas(&Layout::of(&image), file_offsets);
    let kept = cache.map_or_else(FrameTable::default, |c| c.load(build_id, source));
    let mut misses: Vec<u64> = wanted
        .iter()
        .copied()
        .filter(|&s| kept.get(s).is_none())
        .collect();
    let debug_file = found.as_ref().map(|(p, _)| p.clone());
    if misses.is_empty() {
        // Every address was resolved before: no DWARF, no symbols.
        let (entries, left_out) = assemble(&wanted, max_bytes, |svma| {
            kept.get(svma)
                .map(<[FrameLine]>::to_vec)
                .unwrap_or_default()
        });
        // The cache keeps only names resolved with every part of the DWARF.
        let dwarf = !source.is_symbols();
        let built = finish(
            entries, left_out, debug_file, dwarf, &kept, None, keeping, None,
        );
        return Ok(Some((built, 0)));
    }
    if own_dwarf && matches!(first, FileSource::Cached(_)) {
        whole = FileSource::of(&file);
        image = object::File::parse(&whole).map_err(not_an_image)?;
    }
    // DWARF an earlier recording inflated is read as it was kept. (The
    // files are still mapped: their symbol names are read in place.)
    let kept_sections = cache
        .filter(|_| own_dwarf || found.is_some())
        .and_then(|c| c.load_sections(build_id, source));
    let debug_cache = found.as_ref().map(|(_, f)| FileSource::of(f));
    let debug = match &debug_cache {
        Some(c) => Some(object::File::parse(c).map_err(not_an_image)?),
        None => None,
    };
    let endian = if image.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    // As the analyzer merges an image with its debug file: the debug
    // file's symbols join the image's, its DWARF sections fill in those
    // the image lacks.
    let mut symbols = symbols_of_object(&image);
    if let Some(d) = &debug {
        merge_symbols(&mut symbols, symbols_of_object(d));
    }
    let mut sections_error = None;
    // The DWARF sections the resolver reads (only those are inflated).
    let mut names = HashSet::new();
    let _ = load_dwarf(|name| {
        if !unused_dwarf(name) {
            names.insert(name);
        }
        EndianSlice::new(&[][..], endian)
    });
    // The supplementary file `dwz -m` made, where the DWARF refers to one
    // (Debian's and Fedora's debug packages): the names and inline
    // functions the debug files of a package share are there.
    let dwarf_file = debug.as_ref().unwrap_or(&image);
    let dwarf_path = debug_file.as_deref().unwrap_or(std::path::Path::new(path));
    // Only DWARF refers to it: a stripped image keeps its
    // `.gnu_debugaltlink` (Debian's coreutils, most of Fedora), and without
    // DWARF to read, the file it names is not missed.
    let alt_link = (!source.is_symbols())
        .then(|| supplementary_link(dwarf_file))
        .flatten()
        .map(|(name, id)| (String::from_utf8_lossy(&name).into_owned(), id));
    let alt = alt_link
        .as_ref()
        .and_then(|(name, id)| find_alt_file(dwarf_path, name, id, debug_roots));
    let alt_cache = alt.as_ref().map(FileSource::of);
    let alt_file = match &alt_cache {
        Some(c) => object::File::parse(c).ok(),
        None => None,
    };
    let alt_sections = alt_file
        .as_ref()
        .filter(|f| dwarf_size(f) <= MAX_DWARF_BYTES)
        .map(|f| dwarf_sections(f, &names));
    let alt_missing = match (&alt_link, &alt_sections) {
        (Some((name, _)), None) => Some(PathBuf::from(name)),
        _ => None,
    };
    let mut sections: HashMap<String, Cow<'_, [u8]>> = match &kept_sections {
        Some(kept) => kept
            .iter()
            .map(|(name, data)| (name.to_string(), Cow::Borrowed(data)))
            .collect(),
        None => {
            let bytes = dwarf_size(&image) + debug.as_ref().map_or(0, dwarf_size);
            if bytes > MAX_DWARF_BYTES {
                return Err(ImageError::DwarfTooLarge {
                    bytes,
                    max: MAX_DWARF_BYTES,
                });
            }
            let mut sections = dwarf_sections(&image, &names);
            if let Some(d) = &debug {
                for (name, data) in dwarf_sections(d, &names) {
                    sections.entry(name).or_insert(data);
                }
            }
            // Kept when some were inflated: the next recording reads them
            // as they are.
            if let Some(cache) =
                cache.filter(|_| sections.values().any(|d| matches!(d, Cow::Owned(_))))
            {
                let mut list: Vec<(&str, &[u8])> =
                    sections.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
                list.sort_unstable();
                sections_error = cache
                    .store_sections(build_id, source, &list)
                    .err()
                    .map(|e| format!("{}: {e}", cache.dir().display()));
            }
            sections
        }
    };
    // As the analyzer does: units that hold none of the addresses to
    // resolve are hidden from addr2line, which then parses only the
    // others.
    misses.sort_unstable();
    let get = |name: &str| sections.get(name).map_or(&[][..], |d| &d[..]);
    let hidden = if hide {
        units_to_hide(
            get(".debug_info"),
            get(".debug_abbrev"),
            get(".debug_aranges"),
            endian,
            &misses,
        )
    } else {
        None
    };
    let mut hidden_units = 0;
    if let (Some(hidden), Some(info)) = (hidden, sections.get_mut(".debug_info")) {
        if hide_units(info.to_mut(), &hidden) {
            hidden_units = hidden.len();
        }
    }
    // With symbols alone, no DWARF, as the analyzer resolves such an image.
    let mut dwarf = (own_dwarf || debug.is_some())
        .then(|| {
            load_dwarf(|name| {
                EndianSlice::new(sections.get(name).map_or(&[][..], |d| &d[..]), endian)
            })
        })
        .flatten();
    if let (Some(dwarf), Some(alt)) = (&mut dwarf, &alt_sections) {
        let _ = dwarf.load_sup(|id| -> Result<_, gimli::Error> {
            Ok(EndianSlice::new(
                alt.get(id.name()).map_or(&[][..], |d| &d[..]),
                endian,
            ))
        });
    }
    // Split DWARF: by each unit's `.dwo` path, and beside the image and
    // its debug file.
    let split = SplitDwarf::new(SplitPlaces {
        files: std::iter::once(PathBuf::from(path))
            .chain(debug_file.clone())
            .collect(),
        dirs: Vec::new(),
        roots: debug_roots.to_vec(),
    });
    let resolver = Resolver::new(&symbols, dwarf).with_split_dwarf(|load| {
        split.load(load, |bytes, range| EndianSlice::new(&bytes[range], endian))
    });
    let (entries, left_out) = assemble(&wanted, max_bytes, |svma| match kept.get(svma) {
        Some(lines) => lines.to_vec(),
        None => resolver.lookup(svma, true),
    });
    let split_dwarf_missing = split
        .missing()
        .map(|(units, first)| (units, first.map(PathBuf::from)));
    // Names resolved without a unit's `.dwo` or without the supplementary
    // file are not kept: a later recording that finds them resolves them
    // again.
    let complete = split_dwarf_missing.is_none() && alt_missing.is_none();
    let keeping = keeping.filter(|_| complete);
    let mut built = finish(
        entries,
        left_out,
        debug_file,
        !source.is_symbols() && complete,
        &kept,
        Some(&misses),
        keeping,
        sections_error,
    );
    built.dwarf_from_cache = kept_sections.is_some();
    built.split_dwarf_missing = split_dwarf_missing;
    built.alt_file_missing = alt_missing;
    Ok(Some((built, hidden_units)))
}

/// The entries of `wanted`, in order, as `resolve` gives them, until the
/// next would take the table past `max_bytes`; and how many were left out.
fn assemble(
    wanted: &[u64],
    max_bytes: usize,
    mut resolve: impl FnMut(u64) -> Vec<FrameLine>,
) -> (Vec<(u64, Vec<FrameLine>)>, usize) {
    let mut known = HashSet::new();
    let mut used = 0;
    let mut entries = Vec::with_capacity(wanted.len());
    for (i, &svma) in wanted.iter().enumerate() {
        let lines = resolve(svma);
        let cost = encoded_bound(&lines, &mut known);
        if used + cost > max_bytes {
            return (entries, wanted.len() - i);
        }
        used += cost;
        entries.push((svma, lines));
    }
    (entries, 0)
}

/// Which symbol tables `image` has, as a key: the number of entries of
/// its symbol table and of its dynamic one, and the size of its
/// MiniDebugInfo (`.gnu_debugdata`). Copies of one build (same build id)
/// stripped differently differ in these.
pub(crate) fn symbol_tables_key<'data, R: ReadRef<'data>>(image: &object::File<'data, R>) -> u64 {
    let symbols = image.symbols().count() as u64;
    let dynamic = image.dynamic_symbols().count() as u64;
    let mini = image
        .section_by_name(".gnu_debugdata")
        .map_or(0, |s| s.size());
    // FNV-1a over the three.
    [symbols, dynamic, mini]
        .iter()
        .flat_map(|n| n.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Where and under what an image's table is kept.
#[derive(Clone, Copy)]
struct Keeping<'a> {
    cache: &'a FrameCache,
    id: &'a BuildId,
    source: NameSource,
}

/// The built table of `entries`; those that were `resolved` now (sorted;
/// `None`: none) join what the cache keeps for the image (`kept`).
/// `dwarf`: the names came from the image's DWARF, every part of it found
/// (the table says so, and an analyzer with the DWARF need not name the
/// addresses again); else from its symbol tables, at least in part.
#[allow(clippy::too_many_arguments)]
fn finish(
    entries: Vec<(u64, Vec<FrameLine>)>,
    left_out: usize,
    debug_file: Option<PathBuf>,
    dwarf: bool,
    kept: &FrameTable,
    resolved: Option<&[u64]>,
    keeping: Option<Keeping<'_>>,
    mut cache_error: Option<String>,
) -> FrameTableBuilt {
    let from_cache = entries
        .iter()
        .filter(|(s, _)| kept.get(*s).is_some())
        .count();
    let table = FrameTable::new(entries);
    if let (Some(k), Some(resolved)) = (keeping, resolved) {
        let is_new = |s: &u64| resolved.binary_search(s).is_ok();
        let new: Vec<_> = table
            .entries()
            .iter()
            .filter(|(s, _)| is_new(s))
            .cloned()
            .collect();
        if !new.is_empty() {
            let merged = FrameTable::new(kept.entries().iter().cloned().chain(new));
            // An entry that would grow past its bound starts again from
            // this recording's addresses.
            let stored = match k.cache.store(k.id, k.source, &merged) {
                Ok(false) => k.cache.store(k.id, k.source, &table),
                other => other,
            };
            if let Err(e) = stored {
                cache_error.get_or_insert_with(|| format!("{}: {e}", k.cache.dir().display()));
            }
        }
    }
    let table = table.with_dwarf(dwarf);
    FrameTableBuilt {
        bytes: table.to_bytes(),
        addresses: table.len(),
        left_out,
        debug_file,
        from_cache,
        dwarf_from_cache: false,
        cache_error,
        split_dwarf_missing: None,
        alt_file_missing: None,
    }
}

/// The first of the image's debug-file candidates that is a file with the
/// image's build id and DWARF, as the analyzer picks it.
fn find_debug_file<'data, R: ReadRef<'data>>(
    image: &object::File<'data, R>,
    path: &str,
    build_id: &BuildId,
    roots: &[PathBuf],
) -> Option<(PathBuf, File)> {
    let link = image.gnu_debuglink().ok().flatten();
    let debuglink = link.map(|(name, _)| String::from_utf8_lossy(name).into_owned());
    // An image without a build id note (a content id) has a debug file
    // only by its `.gnu_debuglink`, checked by the link's CRC-32, as the
    // analyzer checks it.
    let (want, wanted) = match (build_id.is_content_id(), link) {
        (true, Some((_, crc))) => (None, Wanted::LinkCrc(crc)),
        (true, None) => return None,
        (false, _) => (Some(build_id), Wanted::DebugFile),
    };
    debug_file_candidates(path, want, debuglink.as_deref(), roots)
        .into_iter()
        .find_map(|c| {
            let file = file_matching(&c, &build_id.0, wanted)?;
            Some((c, file))
        })
}

/// The first of the candidates for a `.gnu_debugaltlink` of the file at
/// `file` naming `name` with build id `id` that is a file with that build
/// id.
fn find_alt_file(file: &std::path::Path, name: &str, id: &[u8], roots: &[PathBuf]) -> Option<File> {
    alt_file_candidates(file, name.as_bytes(), id, roots)
        .into_iter()
        .find_map(|c| file_matching(&c, id, Wanted::Supplementary))
}

/// Which file [`file_matching`] looks for.
#[derive(Clone, Copy)]
enum Wanted {
    /// A debug file: the build id, and DWARF.
    DebugFile,
    /// A debug file with this CRC-32 (a `.gnu_debuglink`'s), and DWARF.
    LinkCrc(u32),
    /// A supplementary debug file: the build id, or the checksum of its
    /// `.debug_sup`.
    Supplementary,
}

/// The regular file at `path`, if it is the `wanted` object file with id
/// `id` (read through the cache: only its headers).
fn file_matching(path: &std::path::Path, id: &[u8], wanted: Wanted) -> Option<File> {
    let file = File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let ok = {
        let cache = ReadCache::new(&file);
        let obj = object::File::parse(&cache).ok()?;
        match wanted {
            Wanted::DebugFile => obj.build_id().ok().flatten() == Some(id) && has_dwarf(&obj),
            Wanted::LinkCrc(crc) => has_dwarf(&obj) && crate::debuglink_crc_matches(path, crc),
            Wanted::Supplementary => supplementary_id(&obj).as_deref() == Some(id),
        }
    };
    ok.then_some(file)
}

/// The offsets of `offsets` as SVMAs of `layout`, each once, in order.
fn svmas(layout: &Layout, offsets: &[u64]) -> Vec<u64> {
    let mut seen = HashSet::new();
    offsets
        .iter()
        .filter_map(|&o| layout.svma_of_file_offset(o))
        .filter(|s| seen.insert(*s))
        .collect()
}

/// An upper bound of the bytes `lines` add to an encoded table, new
/// strings counted whole.
fn encoded_bound(lines: &[FrameLine], known: &mut HashSet<String>) -> usize {
    // delta (at most 9 bytes) and frame count (at most 3), then per frame
    // function index (5), file option (6) and line option (6).
    let mut n = 12 + lines.len() * 17;
    for l in lines {
        for s in std::iter::once(&l.function).chain(l.file.as_ref()) {
            if known.insert(s.clone()) {
                n += s.len() + 9;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::ObjectSymbol;

    /// This test binary (with DWARF), and the file offsets of its
    /// function `name` and of `main`.
    fn own_request_offsets(names: &[&str]) -> Vec<u64> {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let layout = Layout::of(&obj);
        names
            .iter()
            .map(|name| {
                let sym = obj
                    .symbols()
                    .find(|s| s.name().is_ok_and(|n| n.contains(name)))
                    .unwrap_or_else(|| panic!("no symbol {name}"));
                layout.file_offset_of_svma(sym.address()).unwrap()
            })
            .collect()
    }

    /// The table of `offsets` in this test binary, through `cache` if any.
    fn build_with(
        offsets: &[u64],
        max_bytes: usize,
        cache: Option<&FrameCache>,
    ) -> Option<FrameTableBuilt> {
        let exe = std::env::current_exe().unwrap();
        let id = crate::build_id_of_file(&exe).expect("the linker gives test binaries a build id");
        frame_table_for_file(FrameRequest {
            file: File::open(&exe).unwrap(),
            path: exe.to_str().unwrap(),
            build_id: &id,
            file_offsets: offsets,
            max_bytes,
            debug_roots: &[],
            symbols_alone: false,
            cache,
        })
        .unwrap()
    }

    fn build(offsets: &[u64], max_bytes: usize) -> Option<FrameTableBuilt> {
        build_with(offsets, max_bytes, None)
    }

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "Mach-O test binaries keep their DWARF in a dSYM"
    )]
    // Looked up by name in the symbol table: never inlined into the harness.
    #[inline(never)]
    fn addresses_resolve_to_their_functions_with_files() {
        let offsets = own_request_offsets(&["addresses_resolve_to_their_functions_with_files"]);
        let built = build(&offsets, 1 << 20).expect("a table: this test binary has DWARF");
        assert_eq!((built.addresses, built.left_out), (1, 0));
        assert_eq!(built.debug_file, None, "the binary's own DWARF is used");
        let table = FrameTable::parse(&built.bytes).unwrap();
        assert_eq!(table.resolved_with_dwarf(), Some(true));
        let outer = table.entries()[0].1.last().unwrap();
        assert!(outer
            .function
            .ends_with("addresses_resolve_to_their_functions_with_files"));
        assert!(
            outer
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("build.rs")),
            "{outer:?}"
        );
    }

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "Mach-O test binaries keep their DWARF in a dSYM"
    )]
    // Looked up by name in the symbol table: never inlined into the harness.
    #[inline(never)]
    fn tables_stay_within_their_bytes() {
        let offsets = own_request_offsets(&["tables_stay_within_their_bytes", "addresses_resolve"]);
        let all = build(&offsets, 1 << 20).expect("a table: this test binary has DWARF");
        assert_eq!(all.addresses, 2);
        // Room for the first only: the second is left out.
        let first = build(&offsets[..1], 1 << 20).unwrap();
        let table = FrameTable::parse(&first.bytes).unwrap();
        let room = encoded_bound(&table.entries()[0].1, &mut HashSet::new());
        assert!(first.bytes.len() <= room);
        let one = build(&offsets, room).unwrap();
        assert_eq!((one.addresses, one.left_out), (1, 1));
        assert_eq!(one.bytes, first.bytes);
        let none = build(&offsets, 0).unwrap();
        assert_eq!((none.addresses, none.left_out), (0, 2));
        // An offset in no segment is not an address of the image.
        assert_eq!(build(&[u64::MAX], 1 << 20).unwrap().addresses, 0);
    }

    fn build_cached(offsets: &[u64], max_bytes: usize, cache: &FrameCache) -> FrameTableBuilt {
        build_with(offsets, max_bytes, Some(cache)).expect("a table: this test binary has DWARF")
    }

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "Mach-O test binaries keep their DWARF in a dSYM"
    )]
    // Looked up by name in the symbol table: never inlined into the harness.
    #[inline(never)]
    fn cached_addresses_give_the_table_resolved_afresh() {
        let root =
            std::env::temp_dir().join(format!("lrnprof-frames-cached-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = FrameCache::new(&root);
        let offsets = own_request_offsets(&[
            "cached_addresses_give_the_table_resolved_afresh",
            "tables_stay_within_their_bytes",
            "addresses_resolve_to_their_functions_with_files",
        ]);
        let afresh = |o: &[u64]| build(o, 1 << 20).unwrap();
        // Nothing kept yet: everything resolved, then kept.
        let first = build_cached(&offsets[..2], 1 << 20, &cache);
        assert_eq!((first.from_cache, first.cache_error.as_deref()), (0, None));
        assert_eq!(first.bytes, afresh(&offsets[..2]).bytes);
        // DWARF that was not compressed is read from the file next time too.
        let files: Vec<String> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(files.len() == 1 && files[0].ends_with(".own"), "{files:?}");
        // The same addresses again: all from the cache, the same bytes.
        let again = build_cached(&offsets[..2], 1 << 20, &cache);
        assert_eq!(again.from_cache, 2);
        assert_eq!(again.bytes, first.bytes);
        // One kept, one new: the new one resolved, both kept after.
        let mixed = build_cached(&offsets[1..], 1 << 20, &cache);
        assert_eq!(mixed.from_cache, 1);
        assert_eq!(mixed.bytes, afresh(&offsets[1..]).bytes);
        let all = build_cached(&offsets, 1 << 20, &cache);
        assert_eq!(all.from_cache, 3);
        assert_eq!(all.bytes, afresh(&offsets).bytes);
        // A table's byte limit holds for kept addresses too.
        let none = build_cached(&offsets, 0, &cache);
        assert_eq!((none.addresses, none.left_out), (0, 3));
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The path of the libc mapped in this process.
    fn libc_path() -> Option<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so"))
            .map(str::to_string)
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn reading_only_the_units_needed_gives_the_same_table() {
        // libc with its separate debug file (Debian's libc6-dbg): two
        // thousand units, of which a few hundred addresses need few.
        let Some(path) = libc_path() else {
            panic!("no libc mapped in this test process");
        };
        let id = crate::build_id_of_file(std::path::Path::new(&path)).expect("libc's build id");
        let bytes = std::fs::read(&path).unwrap();
        let obj = object::File::parse(&bytes[..]).unwrap();
        let layout = Layout::of(&obj);
        // Every 20th exported function, and an address inside each.
        let mut offsets: Vec<u64> = obj
            .dynamic_symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 8)
            .step_by(20)
            .filter_map(|s| Some(layout.file_offset_of_svma(s.address())? + 4))
            .collect();
        offsets.sort_unstable();
        offsets.dedup();
        assert!(offsets.len() > 50, "{} functions", offsets.len());
        let request = || FrameRequest {
            file: File::open(&path).unwrap(),
            path: &path,
            build_id: &id,
            file_offsets: &offsets,
            max_bytes: 4 << 20,
            debug_roots: &[],
            symbols_alone: false,
            cache: None,
        };
        let Some((hidden, units)) = build_table(request(), true).unwrap() else {
            let why = format!("{path} has no debug file here (apt-get install libc6-dbg)");
            if std::env::var_os("CI").is_some_and(|v| v == "true") {
                panic!("cannot check: {why}");
            }
            eprintln!("skipped: {why}");
            return;
        };
        let (whole, none) = build_table(request(), false)
            .unwrap()
            .expect("the same DWARF");
        assert!(units > 100, "most units hidden: {units}");
        assert_eq!(none, 0);
        assert_eq!(hidden.addresses, offsets.len());
        assert_eq!(hidden.bytes, whole.bytes);
        let table = FrameTable::parse(&hidden.bytes).unwrap();
        assert_eq!(
            table.resolved_with_dwarf(),
            Some(true),
            "from libc's debug file"
        );
        let with_lines = table
            .entries()
            .iter()
            .filter(|(_, lines)| lines.iter().any(|l| l.line.is_some()))
            .count();
        assert!(
            with_lines * 2 > offsets.len(),
            "most addresses resolve to lines: {with_lines} of {}",
            offsets.len()
        );
        // Through a cache, half the addresses first and then all: those
        // kept and those resolved beside them (with other units hidden)
        // give the same table.
        let root = std::env::temp_dir().join(format!("lrnprof-frames-libc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = FrameCache::new(&root);
        let half: Vec<u64> = offsets.iter().copied().step_by(2).collect();
        let cached = |offsets: &[u64]| {
            build_table(
                FrameRequest {
                    file_offsets: offsets,
                    cache: Some(&cache),
                    ..request()
                },
                true,
            )
            .unwrap()
            .unwrap()
            .0
        };
        assert_eq!(cached(&half).from_cache, 0);
        // The debug file's sections are compressed: kept inflated, and read
        // from there for the addresses not resolved yet.
        let kept_dwarf = std::fs::read_dir(cache.dir())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".debug.dwarf")
            })
            .count();
        assert_eq!(kept_dwarf, 1);
        let all = cached(&offsets);
        assert!(all.dwarf_from_cache);
        assert_eq!(all.from_cache, half.len());
        assert_eq!(all.bytes, whole.bytes);
        assert_eq!(all.debug_file, whole.debug_file);
        // All from the cache: the same bytes, which say DWARF too.
        let again = cached(&offsets);
        assert_eq!(again.from_cache, offsets.len());
        assert_eq!(again.bytes, whole.bytes);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
