//! An image or debug file with DWARF, as `object` reads it to build a
//! frame table.

use object::{ReadCache, ReadRef};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;

/// Files up to this size are read whole when they cannot be mapped.
const WHOLE_MAX_BYTES: u64 = 32 << 20;

/// A file mapped into memory (see [`HeldBytes`]), or, where it cannot
/// be (a file system without mmap, a special file), read whole when it is
/// small, else through `object`'s [`ReadCache`], which keeps what was
/// read.
///
/// Through the cache every symbol name is a read of its own (a system
/// call each): libc's debug file has 10,000 symbols, whose names were
/// about a quarter of the time building libc's frame table took.
pub(crate) enum FileSource<R: Read + Seek> {
    Held(HeldBytes),
    Cached(ReadCache<R>),
}

impl<'f> FileSource<&'f File> {
    /// `file`, mapped whatever its size, else read whole if small, else
    /// through the cache.
    pub fn of(file: &'f File) -> FileSource<&'f File> {
        if let Some(map) = map(file) {
            return FileSource::Held(HeldBytes::Mapped(map));
        }
        match read_at_most(file, WHOLE_MAX_BYTES) {
            Some(bytes) => FileSource::Held(HeldBytes::Read(bytes)),
            None => FileSource::Cached(ReadCache::new(file)),
        }
    }

    /// `file` mapped, else through the cache (which reads only what is
    /// asked for: the headers and symbol tables, when there is no DWARF).
    pub fn mapped_or_cached(file: &'f File) -> FileSource<&'f File> {
        match map(file) {
            Some(map) => FileSource::Held(HeldBytes::Mapped(map)),
            None => FileSource::Cached(ReadCache::new(file)),
        }
    }
}

/// `file` mapped read-only; `None` if it is empty or cannot be mapped.
#[allow(unsafe_code)]
fn map(file: &File) -> Option<memmap2::Mmap> {
    // Safety: the map is read-only and lives as long as the bytes read
    // from it; see [`HeldBytes`] for a file truncated meanwhile.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    (!map.is_empty()).then_some(map)
}

/// A file's bytes, mapped or read.
///
/// Mapped, only the pages read are read, from the page cache and without
/// a copy: building libc's frame table touches its debug file's symbols
/// and the few units that hold the addresses wanted, a fraction of the
/// 4 MB file (and of the 9 MB of DWARF kept inflated in the frame cache),
/// which, read whole, cost a copy and a fresh page of memory for every
/// 4 KiB.
///
/// Should another process truncate a file while it is mapped, reading the
/// lost pages faults (SIGBUS). Package managers, linkers and the frame
/// cache replace files by renaming a new one over them, which leaves the
/// mapped file as it was; a library truncated in place crashes the
/// programs that map it as well.
pub(crate) enum HeldBytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl HeldBytes {
    /// `file` mapped, else read whole if it has at most `max` bytes;
    /// `None` if it is larger or cannot be read.
    pub fn of(file: &File, max: u64) -> Option<HeldBytes> {
        match map(file) {
            Some(map) if map.len() as u64 <= max => Some(HeldBytes::Mapped(map)),
            Some(_) => None,
            None => read_at_most(file, max).map(HeldBytes::Read),
        }
    }
}

impl std::ops::Deref for HeldBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HeldBytes::Mapped(m) => m,
            HeldBytes::Read(v) => v,
        }
    }
}

/// The bytes of `file` from its start if it has at most `max`; `None`
/// otherwise or if it cannot be read.
pub(crate) fn read_at_most(mut file: &File, max: u64) -> Option<Vec<u8>> {
    let len = file.metadata().ok()?.len();
    if len > max {
        return None;
    }
    file.seek(SeekFrom::Start(0)).ok()?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= max).then_some(bytes)
}

impl<'a, R: Read + Seek> ReadRef<'a> for &'a FileSource<R> {
    fn len(self) -> Result<u64, ()> {
        match self {
            FileSource::Held(b) => Ok(b.len() as u64),
            FileSource::Cached(c) => c.len(),
        }
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        match self {
            FileSource::Held(b) => (&b[..]).read_bytes_at(offset, size),
            FileSource::Cached(c) => c.read_bytes_at(offset, size),
        }
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        match self {
            FileSource::Held(b) => (&b[..]).read_bytes_at_until(range, delimiter),
            FileSource::Cached(c) => c.read_bytes_at_until(range, delimiter),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::Object;

    /// This test binary parses alike mapped, read whole and through the
    /// cache.
    #[test]
    fn mapped_whole_and_cached_files_read_alike() {
        let path = std::env::current_exe().unwrap();
        let file = File::open(&path).unwrap();
        let mapped = FileSource::of(&file);
        assert!(matches!(mapped, FileSource::Held(HeldBytes::Mapped(_))));
        let whole = FileSource::Held(HeldBytes::Read(std::fs::read(&path).unwrap()));
        let cached = FileSource::Cached(ReadCache::new(&file));
        let names = |f: &object::File<'_, _>| {
            use object::ObjectSymbol;
            f.symbols()
                .filter_map(|s| s.name().ok().map(str::to_owned))
                .collect::<Vec<_>>()
        };
        let a = object::File::parse(&whole).unwrap();
        let len = (&whole).len().unwrap();
        for other in [&mapped, &cached] {
            let b = object::File::parse(other).unwrap();
            assert_eq!(a.build_id().unwrap(), b.build_id().unwrap());
            assert_eq!(names(&a), names(&b));
            assert_eq!(len, other.len().unwrap());
            assert_eq!(
                (&whole).read_bytes_at_until(1..len, 0),
                other.read_bytes_at_until(1..len, 0)
            );
        }
        // An empty file cannot be mapped: it is read (as nothing).
        let path = std::env::temp_dir().join(format!("lrnprof-source-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let empty = File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(map(&empty).is_none());
        assert!(matches!(
            FileSource::of(&empty),
            FileSource::Held(HeldBytes::Read(b)) if b.is_empty()
        ));
        // Past the limit, neither mapped nor read.
        assert!(HeldBytes::of(&file, 1024).is_none());
        assert_eq!(read_at_most(&file, len - 1), None);
        assert_eq!(read_at_most(&file, len).map(|b| b.len() as u64), Some(len));
    }
}
