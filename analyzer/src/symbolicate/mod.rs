//! Symbolication: addresses to functions, files and lines, with inline
//! frames (DWARF), symbol tables when there is no DWARF, the frame table a
//! recorder embedded for images whose DWARF is not here, and perf JIT maps.
//! Names are resolved by `lrnprof-image`'s [`Resolver`], the same code
//! that built the frame table on the recording machine.

mod jitmap;
mod resolve;

pub(crate) use jitmap::JitMap;
pub use lrnprof_image::FrameLine;
pub(crate) use resolve::{symbolicate, Resolved};

use crate::address::Svma;
use crate::image::{ImageData, SectionBytes};
use gimli::EndianReader;
use gimli::RunTimeEndian;
use lrnprof_image::{
    hide_units, load_dwarf, project_inline, units_to_hide, unused_dwarf, Resolver, SplitDwarf,
};
use rayon::prelude::*;
use std::sync::Arc;

/// DWARF is read in place, from the image's shared buffers.
type Reader = EndianReader<RunTimeEndian, SectionBytes>;

// Safety: a `SectionBytes` derefs to a range of a `Vec`'s heap buffer or
// of a file mapping, inside an `Arc`: neither moves while any clone of the
// `Arc` lives, and clones deref to the same bytes.
unsafe impl stable_deref_trait::StableDeref for SectionBytes {}
// Safety: as above; a clone shares the `Arc` and the range.
unsafe impl stable_deref_trait::CloneStableDeref for SectionBytes {}

/// An image's DWARF sections, shared (not copied) so that every worker's
/// [`Symbolizer`] can read them.
pub(crate) struct DwarfSections {
    sections: Vec<(&'static str, SectionBytes)>,
    /// Those of the supplementary debug file (`dwz -m`) they refer to.
    sup: Option<Vec<(&'static str, SectionBytes)>>,
    endian: RunTimeEndian,
}

impl DwarfSections {
    /// The image's DWARF as the lookups of `svmas` (sorted; `None`: any
    /// address) need it: only the units that hold one of them are
    /// parsed (see [`units`]). `None` if the image has no DWARF.
    pub fn for_addresses(data: &ImageData, svmas: Option<&[u64]>) -> Option<DwarfSections> {
        if !data.has_dwarf() {
            return None;
        }
        let endian = if data.little_endian {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let mut sections = dwarf_sections(data);
        if let Some(svmas) = svmas {
            let get = |name: &str| {
                sections
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(&[][..], |(_, b)| b.as_slice())
            };
            let hide = units_to_hide(
                get(".debug_info"),
                get(".debug_abbrev"),
                get(".debug_aranges"),
                endian,
                svmas,
            );
            if let (Some(hide), Some((_, info))) =
                (hide, sections.iter_mut().find(|(n, _)| *n == ".debug_info"))
            {
                // Patched in place when inflated here, else in a copy.
                if let Bytes::Shared(shared) = info {
                    *info = Bytes::Owned(shared.to_vec());
                }
                if let Bytes::Owned(bytes) = info {
                    hide_units(bytes, &hide);
                }
            }
        }
        let shared = |sections: Vec<(&'static str, Bytes)>| {
            sections
                .into_iter()
                .map(|(name, b)| {
                    let bytes = match b {
                        Bytes::Shared(s) => s,
                        Bytes::Owned(v) => SectionBytes::whole(Arc::new(v)),
                    };
                    (name, bytes)
                })
                .collect()
        };
        Some(DwarfSections {
            sections: shared(sections),
            sup: data.sup.as_deref().map(|sup| shared(dwarf_sections(sup))),
            endian,
        })
    }

    /// A reader of section `name` of `sections` (empty if it is not there).
    fn reader(
        sections: &[(&'static str, SectionBytes)],
        name: &str,
        endian: RunTimeEndian,
    ) -> Reader {
        let bytes = sections.iter().find(|(n, _)| *n == name).map_or_else(
            || SectionBytes::whole(Arc::new(Vec::new())),
            |(_, b)| b.clone(),
        );
        EndianReader::new(bytes, endian)
    }
}

/// The DWARF sections of `data` that the resolver reads; compressed ones
/// inflated now, in parallel (a corrupt one reads as empty).
fn dwarf_sections(data: &ImageData) -> Vec<(&'static str, Bytes)> {
    let mut wanted = Vec::new();
    // The DWARF loader asks for each section it knows once: record them.
    let _ = load_dwarf(|name| {
        if let Some(s) = data.section(name).filter(|_| !unused_dwarf(name)) {
            wanted.push((name, s));
        }
        gimli::EndianSlice::new(&[][..], RunTimeEndian::Little)
    });
    wanted
        .into_par_iter()
        .map(|(name, s)| {
            let bytes = match &s.deflated {
                Some(d) => Bytes::Owned(d.inflate().unwrap_or_default()),
                None => Bytes::Shared(s.bytes.clone()),
            };
            (name, bytes)
        })
        .collect()
}

/// A DWARF section's bytes while [`DwarfSections`] is built: the image's,
/// or inflated (or copied to be patched) here.
enum Bytes {
    Shared(SectionBytes),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Shared(s) => s,
            Bytes::Owned(v) => v,
        }
    }
}

/// Symbolicates addresses of one image. Not shared between threads: build
/// one per worker and image.
pub(crate) struct Symbolizer<'a> {
    data: &'a ImageData,
    /// Made at once when the image's DWARF is given, else on the first
    /// address the trace's frame table does not resolve: only then is
    /// the image's symbol table built.
    resolver: std::cell::OnceCell<Resolver<'a, Reader>>,
}

impl<'a> Symbolizer<'a> {
    pub fn new(data: &'a ImageData, sections: Option<&DwarfSections>) -> Symbolizer<'a> {
        let dwarf = sections.and_then(|d| {
            let mut dwarf = load_dwarf(|name| DwarfSections::reader(&d.sections, name, d.endian))?;
            if let Some(sup) = &d.sup {
                let _ = dwarf.load_sup(|id| -> Result<Reader, gimli::Error> {
                    Ok(DwarfSections::reader(sup, id.name(), d.endian))
                });
            }
            Some(dwarf)
        });
        let resolver = std::cell::OnceCell::new();
        if dwarf.is_some() {
            let mut r = Resolver::new(data.symbols.table(), dwarf);
            if let (Some(places), Some(d)) = (&data.split_places, sections) {
                let split = SplitDwarf::new(places.clone());
                let endian = d.endian;
                r = r.with_split_dwarf(move |load| {
                    split.load(load, |bytes, range| {
                        EndianReader::new(SectionBytes::split(bytes, range), endian)
                    })
                });
            }
            let _ = resolver.set(r);
        }
        Symbolizer { data, resolver }
    }

    /// Function levels at `svma` (a lookup address: return addresses already
    /// moved back by one), innermost first; empty if nothing is known. The
    /// image's DWARF if it was read (it is not when the trace's frame table
    /// has every address of the image); else what the recording machine
    /// resolved the address to, if the trace's frame table has it; else the
    /// symbol table.
    pub fn lookup(&self, svma: Svma, inline: bool) -> Vec<FrameLine> {
        let Svma(svma) = svma;
        if !self.resolver.get().is_some_and(Resolver::has_dwarf) {
            if let Some(lines) = self.data.frames.as_ref().and_then(|t| t.get(svma)) {
                return project_inline(lines, inline);
            }
        }
        self.resolver
            .get_or_init(|| Resolver::new(self.data.symbols.table(), None))
            .lookup(svma, inline)
    }
}
