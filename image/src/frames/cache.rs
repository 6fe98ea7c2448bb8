//! A directory of frame tables kept between recordings: for each image
//! (by build id) the addresses earlier recordings resolved and what they
//! resolved to. An image's code never changes under its build id, so an
//! address found there needs neither the image's DWARF nor its symbol
//! tables again (its symbol tables can change: stripping keeps the build
//! id, so names from symbols alone are also keyed by which tables the
//! file has); a recording whose addresses are all there skips inflating,
//! parsing and looking up altogether.
//!
//! Entries are frame tables in the trace's own encoding
//! ([`FrameTable::to_bytes`]), one file per image and source of names
//! (the image's own DWARF, a separate debug file, or symbols alone:
//! installing a debug file later changes what an address resolves to).
//! Where that DWARF is compressed (Debian's debug files are), the
//! sections a lookup reads are kept too, inflated: a recording with
//! addresses not seen before then skips inflating them, most of the time
//! a compressed image's table takes (libc with Debian's debug file: ten
//! new addresses in 10 ms instead of 29).
//! Files are replaced whole (written aside, then renamed), so a reader
//! never sees half of one; one that does not parse is ignored and
//! rewritten. Removing the directory at any time is safe.

use super::FrameTable;
use crate::source::{read_at_most, HeldBytes};
use bincode::Options;
use lrnprof_format::BuildId;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// Bumped whenever what an address resolves to may change (the resolver,
/// demangling, how a debug file is picked), so that tables resolved
/// before are not used. With the crate's version it names the directory
/// entries live in.
const LAYOUT: u32 = 4;

/// Most bytes of one entry. Past it an entry keeps only what the last
/// recording resolved.
const MAX_ENTRY_BYTES: usize = 8 << 20;

/// Most bytes of one image's inflated DWARF kept.
const MAX_SECTIONS_BYTES: u64 = 64 << 20;

/// Most bytes of a file of kept sections: the sections, and room for
/// their names and lengths.
const MAX_SECTIONS_FILE_BYTES: usize = MAX_SECTIONS_BYTES as usize + (64 << 10);

/// Most files kept; past it the least recently used go.
const MAX_ENTRIES: usize = 1024;

/// Most bytes of all files kept; past it the least recently used go.
const MAX_TOTAL_BYTES: u64 = 512 << 20;

/// The first bytes of a file of inflated sections.
const SECTIONS_MAGIC: &[u8; 8] = b"lrnpdw01";

/// Build ids shorter than this do not identify an image well enough to
/// trust its resolved frames to it (real ones are 8 to 20 bytes).
const MIN_BUILD_ID_BYTES: usize = 8;

/// Where an image's frames were named from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameSource {
    /// The image's own DWARF.
    OwnDwarf,
    /// A separate debug file's DWARF (with the same build id).
    DebugFile,
    /// The image's symbol tables alone, `tables` saying which it has
    /// ([`symbol_tables_key`](super::build::symbol_tables_key)). Stripping
    /// keeps the build id but drops symbols: a copy stripped with
    /// `--strip-all` names fewer addresses than the unstripped one, and
    /// its entry must not stand for the other's.
    Symbols { tables: u64 },
}

impl NameSource {
    fn suffix(self) -> String {
        match self {
            NameSource::OwnDwarf => "own".to_string(),
            NameSource::DebugFile => "debug".to_string(),
            NameSource::Symbols { tables } => format!("symbols-{tables:016x}"),
        }
    }

    /// Whether the names come from symbol tables alone.
    pub(crate) fn is_symbols(self) -> bool {
        matches!(self, NameSource::Symbols { .. })
    }
}

/// Frame tables kept in a directory between recordings (see the module
/// documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameCache {
    /// The directory of this layout's entries.
    dir: PathBuf,
}

impl FrameCache {
    /// The cache under `root` (for instance [`FrameCache::default_root`]);
    /// nothing is created until an entry is written.
    pub fn new(root: &Path) -> FrameCache {
        FrameCache {
            dir: root.join(layout_dir_name()),
        }
    }

    /// `$XDG_CACHE_HOME/lrnprof`, else `$HOME/.cache/lrnprof`; `None`
    /// when neither is set to an absolute path.
    pub fn default_root() -> Option<PathBuf> {
        default_root_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
    }

    /// The directory entries are written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry file of image `id` named from `source`; `None` when `id`
    /// is too short to key an entry.
    fn entry_path(&self, id: &BuildId, source: NameSource) -> Option<PathBuf> {
        self.file_path(id, &source.suffix())
    }

    /// The file of image `id` with `suffix`; `None` when `id` is too short
    /// to key an entry.
    fn file_path(&self, id: &BuildId, suffix: &str) -> Option<PathBuf> {
        if id.0.len() < MIN_BUILD_ID_BYTES {
            return None;
        }
        let mut name = String::with_capacity(id.0.len() * 2 + 8);
        for b in &id.0 {
            let _ = write!(name, "{b:02x}");
        }
        name.push('.');
        name.push_str(suffix);
        Some(self.dir.join(name))
    }

    /// The file of image `id`'s inflated DWARF sections from `source`.
    fn sections_path(&self, id: &BuildId, source: NameSource) -> Option<PathBuf> {
        self.file_path(id, &format!("{}.dwarf", source.suffix()))
    }

    /// The table kept for image `id` named from `source`: empty when there
    /// is none, or it cannot be read or parsed.
    pub(crate) fn load(&self, id: &BuildId, source: NameSource) -> FrameTable {
        let Some(path) = self.entry_path(id, source) else {
            return FrameTable::default();
        };
        let Some(bytes) = std::fs::File::open(&path)
            .ok()
            .and_then(|f| read_at_most(&f, MAX_ENTRY_BYTES as u64))
        else {
            return FrameTable::default();
        };
        let table = FrameTable::parse(&bytes).unwrap_or_default();
        touch(&path);
        table
    }

    /// Keep `table` as image `id`'s entry named from `source`, replacing
    /// the one there. Whether it was kept: not when larger than
    /// [`MAX_ENTRY_BYTES`] or `id` is too short to key an entry.
    pub(crate) fn store(
        &self,
        id: &BuildId,
        source: NameSource,
        table: &FrameTable,
    ) -> io::Result<bool> {
        let Some(path) = self.entry_path(id, source) else {
            return Ok(false);
        };
        let bytes = table.to_bytes();
        if bytes.len() > MAX_ENTRY_BYTES {
            return Ok(false);
        }
        self.write_file(&path, &[&bytes])?;
        Ok(true)
    }

    /// Inflated DWARF sections of image `id` from `source`, by name, kept
    /// by [`store_sections`](Self::store_sections); `None` when there are
    /// none or the file is not whole.
    pub(crate) fn load_sections(&self, id: &BuildId, source: NameSource) -> Option<KeptSections> {
        let path = self.sections_path(id, source)?;
        // Mapped: a lookup reads a few units' worth of these megabytes.
        let file = std::fs::File::open(&path).ok()?;
        let bytes = HeldBytes::of(&file, MAX_SECTIONS_FILE_BYTES as u64)?;
        let kept = KeptSections::parse(bytes)?;
        touch(&path);
        Some(kept)
    }

    /// Keep `sections` (name, inflated bytes) as image `id`'s DWARF from
    /// `source`. Whether they were kept: not past [`MAX_SECTIONS_BYTES`].
    pub(crate) fn store_sections(
        &self,
        id: &BuildId,
        source: NameSource,
        sections: &[(&str, &[u8])],
    ) -> io::Result<bool> {
        let Some(path) = self.sections_path(id, source) else {
            return Ok(false);
        };
        let total: u64 = sections.iter().map(|(_, d)| d.len() as u64).sum();
        if total > MAX_SECTIONS_BYTES {
            return Ok(false);
        }
        let header: Vec<(&str, u64)> = sections.iter().map(|(n, d)| (*n, d.len() as u64)).collect();
        let header = header_options()
            .serialize(&header)
            .expect("encoding to memory cannot fail");
        let len = (header.len() as u64).to_le_bytes();
        let mut parts: Vec<&[u8]> = vec![SECTIONS_MAGIC, &len, &header];
        parts.extend(sections.iter().map(|(_, d)| *d));
        self.write_file(&path, &parts)?;
        Ok(true)
    }

    /// Write `parts` as the file `path`, replacing it whole.
    fn write_file(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        let new_dir = create_private_dir(&self.dir)?;
        if new_dir {
            self.remove_other_layouts();
        }
        let is_new = !path.exists();
        let mut aside = path.as_os_str().to_owned();
        aside.push(format!(".part-{}", std::process::id()));
        let aside = PathBuf::from(aside);
        let written = std::fs::File::create(&aside)
            .and_then(|mut f| parts.iter().try_for_each(|p| f.write_all(p)))
            .and_then(|()| std::fs::rename(&aside, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&aside);
        }
        written?;
        if is_new {
            self.trim(MAX_ENTRIES, MAX_TOTAL_BYTES);
        }
        Ok(())
    }

    /// Remove the least recently used files (written or read) until at
    /// most `files` remain, of at most `bytes` in all.
    fn trim(&self, files: usize, bytes: u64) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(|e| {
                let e = e.ok()?;
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        let mut left = entries.len();
        for (_, len, path) in entries {
            if left <= files && total <= bytes {
                break;
            }
            let _ = std::fs::remove_file(path);
            left -= 1;
            total -= len;
        }
    }

    /// Remove the directories of other layouts and versions beside this
    /// one: their entries are never read again.
    fn remove_other_layouts(&self) {
        let (Some(parent), Some(ours)) = (self.dir.parent(), self.dir.file_name()) else {
            return;
        };
        let Ok(dir) = std::fs::read_dir(parent) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name();
            if name != ours && name.to_string_lossy().starts_with("frames-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Inflated DWARF sections read back from the cache.
pub(crate) struct KeptSections {
    bytes: HeldBytes,
    /// Name and range in `bytes` of each section.
    sections: Vec<(String, std::ops::Range<usize>)>,
}

impl KeptSections {
    /// The sections of a file written by `store_sections`; `None` if it is
    /// not one, or not whole.
    fn parse(bytes: HeldBytes) -> Option<KeptSections> {
        let rest = bytes.strip_prefix(SECTIONS_MAGIC)?;
        let header_len = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let header = rest.get(8..8usize.checked_add(usize::try_from(header_len).ok()?)?)?;
        let names: Vec<(String, u64)> = header_options()
            .with_limit(header.len() as u64)
            .deserialize(header)
            .ok()?;
        let mut at = SECTIONS_MAGIC.len() + 8 + header.len();
        let mut sections = Vec::with_capacity(names.len());
        for (name, len) in names {
            let end = at.checked_add(usize::try_from(len).ok()?)?;
            sections.push((name, at..end));
            at = end;
        }
        (at == bytes.len()).then_some(KeptSections { bytes, sections })
    }

    /// Each section's name and bytes.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.sections
            .iter()
            .map(|(n, r)| (n.as_str(), &self.bytes[r.clone()]))
    }
}

/// How the names and lengths of kept sections are encoded.
fn header_options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
}

/// `frames-<layout>-<crate version>`.
fn layout_dir_name() -> String {
    format!("frames-{LAYOUT}-{}", env!("CARGO_PKG_VERSION"))
}

fn default_root_from(xdg_cache: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let absolute = |v: OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    xdg_cache
        .and_then(absolute)
        .or_else(|| Some(home.and_then(absolute)?.join(".cache")))
        .map(|p| p.join("lrnprof"))
}

/// Create `dir` and its parents, the last only readable by its owner (the
/// names of the recorded programs' functions are in it). Whether `dir` was
/// created.
fn create_private_dir(dir: &Path) -> io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match builder.create(dir) {
        Ok(()) => Ok(true),
        // Another recorder was first.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Mark the file at `path` as used now, so that trimming keeps it longer
/// than files not used since.
fn touch(path: &Path) {
    let now = std::time::SystemTime::now();
    let _ = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(now));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::FrameLine;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lrnprof-frame-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn table(svmas: &[u64]) -> FrameTable {
        FrameTable::new(svmas.iter().map(|&s| {
            let line = FrameLine {
                function: format!("f{s}"),
                file: Some("a.c".into()),
                line: Some(s as u32),
            };
            (s, vec![line])
        }))
    }

    const ID: BuildId = BuildId(Vec::new());

    fn id(byte: u8) -> BuildId {
        BuildId(vec![byte; 20])
    }

    #[test]
    fn the_default_root_follows_xdg_then_home() {
        let some = |s: &str| Some(OsString::from(s));
        assert_eq!(
            default_root_from(some("/c"), some("/h")),
            Some(PathBuf::from("/c/lrnprof"))
        );
        assert_eq!(
            default_root_from(None, some("/h")),
            Some(PathBuf::from("/h/.cache/lrnprof"))
        );
        // Relative paths are ignored, as the XDG specification says.
        assert_eq!(
            default_root_from(some("c"), some("/h")),
            Some(PathBuf::from("/h/.cache/lrnprof"))
        );
        assert_eq!(default_root_from(some("c"), some("h")), None);
        assert_eq!(default_root_from(None, None), None);
    }

    #[test]
    fn an_entry_reads_back_per_image_and_source() {
        let root = scratch("entry");
        let cache = FrameCache::new(&root);
        assert!(cache.load(&id(1), NameSource::OwnDwarf).is_empty());
        cache
            .store(&id(1), NameSource::OwnDwarf, &table(&[16, 32]))
            .unwrap();
        assert_eq!(cache.load(&id(1), NameSource::OwnDwarf), table(&[16, 32]));
        // Another image, or the same named from elsewhere: nothing.
        assert!(cache.load(&id(2), NameSource::OwnDwarf).is_empty());
        assert!(cache.load(&id(1), NameSource::DebugFile).is_empty());
        assert!(cache
            .load(&id(1), NameSource::Symbols { tables: 1 })
            .is_empty());
        // Copies of one build stripped differently do not share entries.
        cache
            .store(&id(1), NameSource::Symbols { tables: 1 }, &table(&[8]))
            .unwrap();
        assert_eq!(
            cache.load(&id(1), NameSource::Symbols { tables: 1 }),
            table(&[8])
        );
        assert!(cache
            .load(&id(1), NameSource::Symbols { tables: 2 })
            .is_empty());
        std::fs::remove_file(
            cache
                .entry_path(&id(1), NameSource::Symbols { tables: 1 })
                .unwrap(),
        )
        .unwrap();
        // Replaced whole; nothing written aside is left.
        cache
            .store(&id(1), NameSource::OwnDwarf, &table(&[48]))
            .unwrap();
        assert_eq!(cache.load(&id(1), NameSource::OwnDwarf), table(&[48]));
        let files = std::fs::read_dir(cache.dir()).unwrap().count();
        assert_eq!(files, 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(cache.dir()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn short_ids_and_corrupt_entries_are_not_used() {
        let root = scratch("corrupt");
        let cache = FrameCache::new(&root);
        let kept = cache.store(&ID, NameSource::OwnDwarf, &table(&[16]));
        assert!(!kept.unwrap());
        assert!(!cache.dir().exists(), "no entry for an empty build id");
        cache
            .store(&id(3), NameSource::Symbols { tables: 1 }, &table(&[16]))
            .unwrap();
        let path = cache
            .entry_path(&id(3), NameSource::Symbols { tables: 1 })
            .unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 2);
        std::fs::write(&path, &bytes).unwrap();
        assert!(cache
            .load(&id(3), NameSource::Symbols { tables: 1 })
            .is_empty());
        std::fs::write(&path, vec![0xff; MAX_ENTRY_BYTES + 1]).unwrap();
        assert!(cache
            .load(&id(3), NameSource::Symbols { tables: 1 })
            .is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn inflated_sections_read_back_whole_or_not_at_all() {
        let root = scratch("sections");
        let cache = FrameCache::new(&root);
        assert!(cache.load_sections(&id(1), NameSource::DebugFile).is_none());
        let info = vec![7u8; 1000];
        let sections = [
            (".debug_abbrev", &b"abbrev"[..]),
            (".debug_info", &info[..]),
        ];
        assert!(cache
            .store_sections(&id(1), NameSource::DebugFile, &sections)
            .unwrap());
        let kept = cache.load_sections(&id(1), NameSource::DebugFile).unwrap();
        assert_eq!(kept.iter().collect::<Vec<_>>(), sections);
        // Kept apart from the frame table, and per source.
        assert!(cache.load(&id(1), NameSource::DebugFile).is_empty());
        assert!(cache.load_sections(&id(1), NameSource::OwnDwarf).is_none());
        // A file cut short, or with bytes after the last section, is not used.
        let path = cache.sections_path(&id(1), NameSource::DebugFile).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(cache.load_sections(&id(1), NameSource::DebugFile).is_none());
        std::fs::write(&path, [&bytes[..], b"x"].concat()).unwrap();
        assert!(cache.load_sections(&id(1), NameSource::DebugFile).is_none());
        std::fs::write(&path, &bytes[..8]).unwrap();
        assert!(cache.load_sections(&id(1), NameSource::DebugFile).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_oldest_entries_go_past_the_limit_and_other_layouts_at_once() {
        let root = scratch("trim");
        let old = root.join("frames-0-0.0.1");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("x.own"), b"old").unwrap();
        let unrelated = root.join("other");
        std::fs::create_dir_all(&unrelated).unwrap();
        let cache = FrameCache::new(&root);
        for i in 0..5 {
            cache
                .store(&id(i), NameSource::OwnDwarf, &table(&[16]))
                .unwrap();
            // Distinct modification times, oldest first.
            let path = cache.entry_path(&id(i), NameSource::OwnDwarf).unwrap();
            let when = std::time::SystemTime::UNIX_EPOCH
                + std::time::Duration::from_secs(1_000_000 + u64::from(i));
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        assert!(!old.exists(), "an earlier layout's entries are removed");
        assert!(unrelated.exists(), "only entry directories are removed");
        cache.trim(3, u64::MAX);
        let left: Vec<bool> = (0..5)
            .map(|i| !cache.load(&id(i), NameSource::OwnDwarf).is_empty())
            .collect();
        assert_eq!(left, [false, false, true, true, true]);
        // By bytes: the oldest go until the rest fit.
        let one = std::fs::metadata(cache.entry_path(&id(4), NameSource::OwnDwarf).unwrap())
            .unwrap()
            .len();
        cache.trim(usize::MAX, 2 * one);
        let left: Vec<bool> = (2..5)
            .map(|i| !cache.load(&id(i), NameSource::OwnDwarf).is_empty())
            .collect();
        assert_eq!(left, [false, true, true]);
        // Reading an entry makes it the most recently used.
        assert!(!cache.load(&id(3), NameSource::OwnDwarf).is_empty());
        cache.trim(1, u64::MAX);
        let left: Vec<bool> = (3..5)
            .map(|i| {
                cache
                    .entry_path(&id(i), NameSource::OwnDwarf)
                    .unwrap()
                    .exists()
            })
            .collect();
        assert_eq!(left, [true, false]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
