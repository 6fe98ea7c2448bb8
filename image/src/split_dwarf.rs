//! Split DWARF (`gcc`/`clang -gsplit-dwarf`, rustc
//! `-C split-debuginfo=unpacked`): the image keeps only a skeleton of each
//! compilation unit (its addresses and line table); the unit's functions,
//! and with them function names and inline frames, are in a `.dwo` file the
//! compiler wrote beside the object file, or in a `.dwp` package that `dwp`
//! or `llvm-dwp` made of them. addr2line asks for a unit's split part when
//! a lookup first needs it ([`SplitDwarfLoad`]); [`SplitDwarf`] finds the
//! file, checks that it is the unit's (its DWO id) and reads it.

use crate::frames::MAX_DWARF_BYTES;
use crate::source::HeldBytes;
use crate::units::inflate_zlib;
use addr2line::SplitDwarfLoad;
use object::{CompressionFormat, Object, ObjectSection};
use std::cell::{Cell, OnceCell};
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where to look for an image's split DWARF besides the place each
/// skeleton unit names (its compilation directory joined with its `.dwo`
/// name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitPlaces {
    /// The image's file and its separate debug file, as paths on this
    /// machine: `FILE.dwp` is the package of either (as `gdb` looks for
    /// it), and a `.dwo` is also looked for by its name in their
    /// directories (a build tree moved as a whole).
    pub files: Vec<PathBuf>,
    /// Directories where `.dwo` files and the package are also looked for
    /// by their names (the analyzer's `--symbols`).
    pub dirs: Vec<PathBuf>,
    /// Roots under which absolute paths are also tried (a container's
    /// root).
    pub roots: Vec<PathBuf>,
}

impl SplitPlaces {
    /// Where the package may be, in order.
    fn packages(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for f in &self.files {
            let mut p = f.clone().into_os_string();
            p.push(".dwp");
            out.push(PathBuf::from(p));
            if let Some(stem) = f.to_str().and_then(|s| s.strip_suffix(".debug")) {
                out.push(PathBuf::from(format!("{stem}.dwp")));
            }
        }
        if let Some(name) = self.files.first().and_then(|f| f.file_name()) {
            let mut name = name.to_os_string();
            name.push(".dwp");
            out.extend(self.dirs.iter().map(|d| d.join(&name)));
        }
        dedup(out)
    }

    /// Where the `.dwo` named `name` in a unit compiled in `comp_dir` may
    /// be, in order.
    fn dwo_candidates(&self, comp_dir: Option<&str>, name: &str) -> Vec<PathBuf> {
        let name_path = Path::new(name);
        let mut out = Vec::new();
        let named = match comp_dir {
            _ if name_path.is_absolute() => Some(name_path.to_path_buf()),
            Some(dir) => Some(Path::new(dir).join(name_path)),
            None => None,
        };
        if let Some(p) = named {
            if p.is_absolute() {
                let rel = p.strip_prefix("/").unwrap_or(&p).to_path_buf();
                out.push(p);
                out.extend(self.roots.iter().map(|r| r.join(&rel)));
            } else {
                out.push(p);
            }
        }
        let dirs = self
            .files
            .iter()
            .filter_map(|f| f.parent().map(Path::to_path_buf))
            .chain(self.dirs.iter().cloned());
        for dir in dirs {
            if name_path.is_relative() {
                out.push(dir.join(name_path));
            }
            if let Some(base) = name_path.file_name() {
                out.push(dir.join(base));
            }
        }
        dedup(out)
    }
}

fn dedup(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::with_capacity(paths.len());
    for p in paths {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Bytes split DWARF is read from: a `.dwo` or `.dwp` file, mapped (read
/// whole where it cannot be), or a section of one inflated. Shared, so a
/// reader may hold a reference of its own.
#[derive(Clone)]
pub struct SplitBytes(Arc<HeldBytes>);

impl Deref for SplitBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// The DWARF sections of a `.dwo` or `.dwp` file.
struct SplitFile {
    /// By their names in the file (`.debug_info.dwo`, `.debug_cu_index`).
    sections: Vec<(String, SplitBytes, Range<usize>)>,
    little_endian: bool,
}

impl SplitFile {
    /// The file at `path` if it is an object file; its sections that
    /// cannot be read are left out (a corrupt compressed one).
    fn read(path: &Path) -> Option<SplitFile> {
        let file = File::open(path).ok()?;
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let bytes = SplitBytes(Arc::new(HeldBytes::of(&file, MAX_DWARF_BYTES)?));
        let obj = object::File::parse(&bytes[..]).ok()?;
        let mut sections = Vec::new();
        for s in obj.sections() {
            let Ok(name) = s.name() else { continue };
            if !(name.ends_with(".dwo") || name.ends_with("_index")) {
                continue;
            }
            let Ok(c) = s.compressed_data() else { continue };
            let (data, range) = match c.format {
                CompressionFormat::None => {
                    // `c.data` lies inside `bytes`.
                    let Some(start) =
                        (c.data.as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)
                    else {
                        continue;
                    };
                    (bytes.clone(), start..start + c.data.len())
                }
                _ if c.uncompressed_size > MAX_DWARF_BYTES => continue,
                CompressionFormat::Zlib => {
                    let size = c.uncompressed_size as usize;
                    let Some(d) = inflate_zlib(c.data, size) else {
                        continue;
                    };
                    (SplitBytes(Arc::new(HeldBytes::Read(d))), 0..size)
                }
                _ => {
                    let Ok(d) = c.decompress() else { continue };
                    let d = d.into_owned();
                    let len = d.len();
                    (SplitBytes(Arc::new(HeldBytes::Read(d))), 0..len)
                }
            };
            sections.push((name.to_string(), data, range));
        }
        Some(SplitFile {
            sections,
            little_endian: obj.is_little_endian(),
        })
    }

    fn section(&self, name: Option<&str>) -> Option<(&SplitBytes, Range<usize>)> {
        let name = name?;
        self.sections
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, b, r)| (b, r.clone()))
    }

    /// The DWO id of the file's first unit (a `.dwo` holds one).
    fn dwo_id(&self) -> Option<gimli::DwoId> {
        let endian = if self.little_endian {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let dwarf = gimli::Dwarf::load(|id| -> Result<_, gimli::Error> {
            let data = self.section(id.dwo_name()).map_or(&[][..], |(b, r)| &b[r]);
            Ok(gimli::EndianSlice::new(data, endian))
        })
        .ok()?;
        let header = dwarf.units().next().ok()??;
        dwarf.unit(header).ok()?.dwo_id
    }
}

/// Finds and reads the split DWARF of one image's units as addr2line asks
/// for it ([`Resolver::with_split_dwarf`](crate::Resolver::with_split_dwarf)).
/// Files are read once, on first use; a `.dwo` is used only if its DWO id
/// is the unit's (a `.dwo` rebuilt since the image was linked is not).
/// Not shared between threads.
pub struct SplitDwarf {
    places: SplitPlaces,
    /// The package, once looked for.
    package: OnceCell<Option<SplitFile>>,
    /// One slot per unit of the image, taken in order of first use
    /// (addr2line asks once per unit).
    files: OnceCell<Vec<OnceCell<Option<SplitFile>>>>,
    next: Cell<usize>,
    empty: SplitBytes,
    missing: Cell<usize>,
    first_missing: OnceCell<PathBuf>,
}

impl SplitDwarf {
    /// Looks for split DWARF where each unit says it is and at `places`.
    pub fn new(places: SplitPlaces) -> SplitDwarf {
        SplitDwarf {
            places,
            package: OnceCell::new(),
            files: OnceCell::new(),
            next: Cell::new(0),
            empty: SplitBytes(Arc::new(HeldBytes::Read(Vec::new()))),
            missing: Cell::new(0),
            first_missing: OnceCell::new(),
        }
    }

    /// The split part of the unit `load` asks for, `None` if it is not
    /// found. `reader` makes a gimli reader of a range of the bytes read.
    pub fn load<'s, R: gimli::Reader>(
        &'s self,
        load: &SplitDwarfLoad<R>,
        reader: impl Fn(&'s SplitBytes, Range<usize>) -> R,
    ) -> Option<Arc<gimli::Dwarf<R>>> {
        let reader = &reader;
        let sections = |file: &'s SplitFile| {
            move |id: gimli::SectionId| -> Result<R, gimli::Error> {
                Ok(match file.section(id.dwo_name()) {
                    Some((b, r)) => reader(b, r),
                    None => reader(&self.empty, 0..0),
                })
            }
        };
        let package = self.package.get_or_init(|| {
            self.places
                .packages()
                .iter()
                .find_map(|p| SplitFile::read(p))
        });
        if let Some(package) = package {
            let empty = reader(&self.empty, 0..0);
            let found = gimli::DwarfPackage::load(sections(package), empty)
                .and_then(|p| p.find_cu(load.dwo_id, &load.parent));
            if let Ok(Some(dwarf)) = found {
                return Some(Arc::new(dwarf));
            }
        }
        let text = |r: &Option<R>| -> Option<String> {
            let r = r.as_ref()?;
            Some(String::from_utf8_lossy(&r.to_slice().ok()?).into_owned())
        };
        let name = text(&load.path)?;
        let comp_dir = text(&load.comp_dir);
        let slots = self.files.get_or_init(|| {
            let mut units = load.parent.units();
            let mut n = 0;
            while let Ok(Some(_)) = units.next() {
                n += 1;
            }
            (0..n).map(|_| OnceCell::new()).collect()
        });
        let slot = slots.get(self.next.get())?;
        self.next.set(self.next.get() + 1);
        let candidates = self.places.dwo_candidates(comp_dir.as_deref(), &name);
        let file = slot.get_or_init(|| {
            candidates
                .iter()
                .filter_map(|c| SplitFile::read(c))
                .find(|f| f.dwo_id() == Some(load.dwo_id))
        });
        let Some(file) = file else {
            self.missing.set(self.missing.get() + 1);
            if let Some(first) = candidates.into_iter().next() {
                let _ = self.first_missing.set(first);
            }
            return None;
        };
        let mut dwarf = gimli::Dwarf::load(sections(file)).ok()?;
        dwarf.make_dwo(&load.parent);
        Some(Arc::new(dwarf))
    }

    /// How many units' split DWARF was asked for and not found, and where
    /// the first of them was looked for first.
    pub fn missing(&self) -> Option<(usize, Option<&Path>)> {
        let n = self.missing.get();
        (n > 0).then(|| (n, self.first_missing.get().map(PathBuf::as_path)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dwo_files_are_looked_for_where_the_unit_says_then_beside_the_image() {
        let places = SplitPlaces {
            files: vec![PathBuf::from("/opt/app/bin/server")],
            dirs: vec![PathBuf::from("/syms")],
            roots: vec![PathBuf::from("/proc/7/root")],
        };
        let c = places.dwo_candidates(Some("/build/obj"), "src/a.dwo");
        let c: Vec<&str> = c.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            c,
            [
                "/build/obj/src/a.dwo",
                "/proc/7/root/build/obj/src/a.dwo",
                "/opt/app/bin/src/a.dwo",
                "/opt/app/bin/a.dwo",
                "/syms/src/a.dwo",
                "/syms/a.dwo",
            ]
        );
        // An absolute name is tried as it is; without a compilation
        // directory a relative one only beside the image.
        let c = places.dwo_candidates(None, "/b/x.dwo");
        assert_eq!(c[0], PathBuf::from("/b/x.dwo"));
        assert_eq!(c[2], PathBuf::from("/opt/app/bin/x.dwo"));
        let c = places.dwo_candidates(None, "x.dwo");
        assert_eq!(
            c,
            [
                PathBuf::from("/opt/app/bin/x.dwo"),
                PathBuf::from("/syms/x.dwo")
            ]
        );
    }

    #[test]
    fn packages_are_named_after_the_image_and_its_debug_file() {
        let places = SplitPlaces {
            files: vec![
                PathBuf::from("/opt/app/server"),
                PathBuf::from("/usr/lib/debug/opt/app/server.debug"),
            ],
            dirs: vec![PathBuf::from("/syms")],
            roots: Vec::new(),
        };
        let p = places.packages();
        let p: Vec<&str> = p.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            p,
            [
                "/opt/app/server.dwp",
                "/usr/lib/debug/opt/app/server.debug.dwp",
                "/usr/lib/debug/opt/app/server.dwp",
                "/syms/server.dwp",
            ]
        );
    }

    #[test]
    fn files_that_are_not_object_files_are_not_read() {
        assert!(SplitFile::read(Path::new("/nonexistent/x.dwo")).is_none());
        assert!(SplitFile::read(Path::new("/")).is_none());
        let path = std::env::temp_dir().join(format!("lrnprof-split-{}", std::process::id()));
        std::fs::write(&path, b"not an object file").unwrap();
        let read = SplitFile::read(&path);
        let _ = std::fs::remove_file(&path);
        assert!(read.is_none());
    }
}
