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
use crate::image::ImageData;
use gimli::EndianArcSlice;
use gimli::RunTimeEndian;
use lrnprof_image::{load_dwarf, project_inline, Resolver};
use std::sync::Arc;

type Reader = EndianArcSlice<RunTimeEndian>;

/// An image's DWARF sections, copied once into shared buffers so that every
/// worker's [`Symbolizer`] can read them.
pub(crate) struct DwarfSections {
    sections: Vec<(&'static str, Arc<[u8]>)>,
    endian: RunTimeEndian,
}

impl DwarfSections {
    /// `None` if the image has no DWARF.
    pub fn new(data: &ImageData) -> Option<DwarfSections> {
        if !data.has_dwarf() {
            return None;
        }
        let endian = if data.little_endian {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let mut sections = Vec::new();
        // The DWARF loader asks for each section it knows once: record them.
        let _ = load_dwarf(|name| {
            if let Some(s) = data.section(name) {
                sections.push((name, Arc::from(&s.bytes[..])));
            }
            gimli::EndianSlice::new(&[][..], endian)
        });
        Some(DwarfSections { sections, endian })
    }
}

/// Symbolicates addresses of one image. Not shared between threads: build
/// one per worker and image.
pub(crate) struct Symbolizer<'a> {
    data: &'a ImageData,
    resolver: Resolver<'a, Reader>,
}

impl<'a> Symbolizer<'a> {
    pub fn new(data: &'a ImageData, sections: Option<&DwarfSections>) -> Symbolizer<'a> {
        let dwarf = sections.and_then(|d| {
            load_dwarf(|name| {
                let bytes = d
                    .sections
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or_else(|| Arc::from(&[][..]), |(_, b)| b.clone());
                EndianArcSlice::new(bytes, d.endian)
            })
        });
        Symbolizer {
            data,
            resolver: Resolver::new(&data.symbols, dwarf),
        }
    }

    /// Function levels at `svma` (a lookup address: return addresses already
    /// moved back by one), innermost first; empty if nothing is known. The
    /// image's DWARF if it is here; else what the recording machine
    /// resolved the address to, if the trace's frame table has it; else the
    /// symbol table.
    pub fn lookup(&self, svma: Svma, inline: bool) -> Vec<FrameLine> {
        let Svma(svma) = svma;
        if !self.resolver.has_dwarf() {
            if let Some(lines) = self.data.frames.as_ref().and_then(|t| t.get(svma)) {
                return project_inline(lines, inline);
            }
        }
        self.resolver.lookup(svma, inline)
    }
}
