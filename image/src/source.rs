//! An image or debug file with DWARF, as `object` reads it to build a
//! frame table.

use object::{ReadCache, ReadRef};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;

/// Files up to this size are read whole when they cannot be mapped.
const WHOLE_MAX_BYTES: u64 = 32 << 20;

/// A file mapped into memory, or, where it cannot be (a file system
/// without mmap, a special file), read whole when it is small, else
/// through `object`'s [`ReadCache`], which keeps what was read.
///
/// Mapped, only the pages read are read, from the page cache and without
/// a copy: building libc's frame table touches its debug file's symbols
/// and the few units that hold the addresses wanted, a fraction of the
/// 4 MB file (and of the 9 MB of DWARF kept inflated in the frame cache),
/// which, read whole, cost a copy and a fresh page of memory for every
/// 4 KiB. Through the cache every symbol name is a read of its own (a
/// system call each): libc's debug file has 10,000 symbols, whose names
/// were about a quarter of the time building libc's frame table took.
///
/// Should another process truncate a file while it is mapped, reading the
/// lost pages faults (SIGBUS). Package managers, linkers and the frame
/// cache replace files by renaming a new one over them, which leaves the
/// mapped file as it was; a library truncated in place crashes the
/// programs that map it as well.
pub(crate) enum FileSource<R: Read + Seek> {
    Mapped(memmap2::Mmap),
    Whole(Vec<u8>),
    Cached(ReadCache<R>),
}

impl<'f> FileSource<&'f File> {
    /// `file`, mapped, else read whole if small.
    pub fn of(file: &'f File) -> FileSource<&'f File> {
        if let Some(map) = map(file) {
            return FileSource::Mapped(map);
        }
        match read_whole(file) {
            Some(bytes) => FileSource::Whole(bytes),
            None => FileSource::Cached(ReadCache::new(file)),
        }
    }
}

/// `file` mapped read-only; `None` if it is empty or cannot be mapped.
#[allow(unsafe_code)]
pub(crate) fn map(file: &File) -> Option<memmap2::Mmap> {
    // Safety: the map is read-only and lives as long as the bytes read
    // from it; see [`FileSource`] for a file truncated meanwhile.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    (!map.is_empty()).then_some(map)
}

/// A file's bytes, mapped (see [`FileSource`] on the mapping) or read.
pub(crate) enum HeldBytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
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

/// The bytes of `file` if it is small enough; `None` otherwise or if it
/// cannot be read (the cache then reports what fails).
fn read_whole(mut file: &File) -> Option<Vec<u8>> {
    let len = file.metadata().ok()?.len();
    if len > WHOLE_MAX_BYTES {
        return None;
    }
    file.seek(SeekFrom::Start(0)).ok()?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(WHOLE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() as u64 <= WHOLE_MAX_BYTES).then_some(bytes)
}

impl<'a, R: Read + Seek> ReadRef<'a> for &'a FileSource<R> {
    fn len(self) -> Result<u64, ()> {
        match self {
            FileSource::Mapped(m) => Ok(m.len() as u64),
            FileSource::Whole(b) => Ok(b.len() as u64),
            FileSource::Cached(c) => c.len(),
        }
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        match self {
            FileSource::Mapped(m) => (&m[..]).read_bytes_at(offset, size),
            FileSource::Whole(b) => (&b[..]).read_bytes_at(offset, size),
            FileSource::Cached(c) => c.read_bytes_at(offset, size),
        }
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        match self {
            FileSource::Mapped(m) => (&m[..]).read_bytes_at_until(range, delimiter),
            FileSource::Whole(b) => (&b[..]).read_bytes_at_until(range, delimiter),
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
        assert!(matches!(mapped, FileSource::Mapped(_)));
        let whole = FileSource::Whole(std::fs::read(&path).unwrap());
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
        assert!(matches!(FileSource::of(&empty), FileSource::Whole(b) if b.is_empty()));
    }
}
