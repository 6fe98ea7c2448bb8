//! An image or debug file with DWARF, as `object` reads it to build a
//! frame table.

use object::{ReadCache, ReadRef};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;

/// Files up to this size are read whole.
const WHOLE_MAX_BYTES: u64 = 32 << 20;

/// A file read whole when it is small, else through `object`'s
/// [`ReadCache`], which keeps what was read. Through the cache every
/// symbol name is a read of its own (a system call each): libc's debug
/// file has 10,000 symbols, whose names were about a quarter of the time
/// building libc's frame table took. Read whole, they are read in place,
/// and the DWARF sections, which are read anyway, cost no more. Larger
/// files (a big program with its DWARF) go through the cache so that only
/// the sections used are held in memory. A file without DWARF is better
/// read through the cache: only its headers and symbols are read.
pub(crate) enum FileSource<R: Read + Seek> {
    Whole(Vec<u8>),
    Cached(ReadCache<R>),
}

impl<'f> FileSource<&'f File> {
    /// `file`, read whole if small.
    pub fn of(file: &'f File) -> FileSource<&'f File> {
        match read_whole(file) {
            Some(bytes) => FileSource::Whole(bytes),
            None => FileSource::Cached(ReadCache::new(file)),
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
            FileSource::Whole(b) => Ok(b.len() as u64),
            FileSource::Cached(c) => c.len(),
        }
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        match self {
            FileSource::Whole(b) => (&b[..]).read_bytes_at(offset, size),
            FileSource::Cached(c) => c.read_bytes_at(offset, size),
        }
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        match self {
            FileSource::Whole(b) => (&b[..]).read_bytes_at_until(range, delimiter),
            FileSource::Cached(c) => c.read_bytes_at_until(range, delimiter),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::Object;

    /// This test binary parses alike read whole and through the cache.
    #[test]
    fn whole_and_cached_files_read_alike() {
        let path = std::env::current_exe().unwrap();
        let whole = FileSource::Whole(std::fs::read(&path).unwrap());
        let cached = FileSource::Cached(ReadCache::new(File::open(&path).unwrap()));
        let a = object::File::parse(&whole).unwrap();
        let b = object::File::parse(&cached).unwrap();
        assert_eq!(a.build_id().unwrap(), b.build_id().unwrap());
        let names = |f: &object::File<'_, _>| {
            use object::ObjectSymbol;
            f.symbols()
                .filter_map(|s| s.name().ok().map(str::to_owned))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&a), names(&b));
        let len = (&whole).len().unwrap();
        assert_eq!(len, (&cached).len().unwrap());
        assert_eq!(
            (&whole).read_bytes_at_until(1..len, 0),
            (&cached).read_bytes_at_until(1..len, 0)
        );
        // A small file is read whole.
        let path = std::env::temp_dir().join(format!("lrnprof-source-{}", std::process::id()));
        std::fs::write(&path, b"\x7fELF not really").unwrap();
        let small = File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(matches!(FileSource::of(&small), FileSource::Whole(b) if b.len() == 15));
    }
}
