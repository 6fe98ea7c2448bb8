//! Symbolication: addresses to functions, files and lines, with inline
//! frames (addr2line), symbol tables when there is no DWARF, demangling,
//! and perf JIT maps.

mod demangle;
mod jitmap;
mod resolve;

pub(crate) use jitmap::JitMap;
pub(crate) use resolve::{symbolicate, Resolved};

use crate::address::Svma;
use crate::image::{ImageData, SectionBytes};
use gimli::EndianReader;
use gimli::RunTimeEndian;
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

/// DWARF is read in place, from the image's shared buffers.
type Reader = EndianReader<RunTimeEndian, SectionBytes>;

// Safety: a `SectionBytes` derefs to a range of a `Vec` inside an `Arc`,
// whose heap buffer never moves while any clone of the `Arc` lives, and
// clones deref to the same bytes.
unsafe impl stable_deref_trait::StableDeref for SectionBytes {}
// Safety: as above; a clone shares the `Arc` and the range.
unsafe impl stable_deref_trait::CloneStableDeref for SectionBytes {}

/// DWARF sections the symbolizer never reads: variable locations, macros
/// and name indexes.
pub(crate) fn unused_dwarf(name: &str) -> bool {
    matches!(
        name,
        ".debug_loc"
            | ".debug_loclists"
            | ".debug_macro"
            | ".debug_macinfo"
            | ".debug_pubnames"
            | ".debug_pubtypes"
            | ".debug_gnu_pubnames"
            | ".debug_gnu_pubtypes"
    )
}

/// An image's DWARF sections, shared (not copied) so that every worker's
/// [`Symbolizer`] can read them.
pub(crate) struct DwarfSections {
    sections: Vec<(gimli::SectionId, SectionBytes)>,
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
        // Dwarf::load asks for each section it knows once: record them.
        let _ = gimli::Dwarf::load(|id| -> Result<(), gimli::Error> {
            if let Some(s) = data.section(id.name()).filter(|_| !unused_dwarf(id.name())) {
                sections.push((id, s.bytes.clone()));
            }
            Ok(())
        });
        Some(DwarfSections { sections, endian })
    }
}

/// Symbolicates addresses of one image. Not shared between threads: build
/// one per worker and image.
pub(crate) struct Symbolizer<'a> {
    data: &'a ImageData,
    dwarf: Option<addr2line::Context<Reader>>,
}

impl<'a> Symbolizer<'a> {
    pub fn new(data: &'a ImageData, sections: Option<&DwarfSections>) -> Symbolizer<'a> {
        let dwarf = sections.and_then(|d| {
            let loaded = gimli::Dwarf::load(|id| -> Result<Reader, gimli::Error> {
                let bytes = d.sections.iter().find(|(sid, _)| *sid == id).map_or_else(
                    || SectionBytes::whole(Arc::new(Vec::new())),
                    |(_, b)| b.clone(),
                );
                Ok(EndianReader::new(bytes, d.endian))
            });
            loaded
                .ok()
                .and_then(|d| addr2line::Context::from_dwarf(d).ok())
        });
        Symbolizer { data, dwarf }
    }

    /// Function levels at `svma` (a lookup address: return addresses already
    /// moved back by one), innermost first; empty if nothing is known.
    pub fn lookup(&self, svma: Svma, inline: bool) -> Vec<FrameLine> {
        let Svma(svma) = svma;
        let mut lines = self.lookup_dwarf(svma);
        if !inline && lines.len() > 1 {
            lines.drain(..lines.len() - 1);
        }
        let sym = self.lookup_symbol(svma);
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
            if out.len() > 256 {
                break;
            }
        }
        out
    }

    fn lookup_symbol(&self, svma: u64) -> Option<String> {
        let syms = &self.data.symbols;
        let i = syms.partition_point(|s| s.svma <= svma).checked_sub(1)?;
        let s = &syms[i];
        if s.size != 0 && svma - s.svma >= s.size {
            return None;
        }
        Some(demangle::demangle(&s.name))
    }
}
