//! Image data: the sections and symbols of one executable or library,
//! whether read from a local file or from data embedded in the trace, plus
//! the AVMA <-> SVMA arithmetic.

mod locate;
mod parse;
mod symbols;

pub(crate) use locate::{debuginfod_usable, load_image, own_vdso, LocateOptions};
pub(crate) use lrnprof_image::Symbol;
pub(crate) use parse::parse_file;
pub(crate) use symbols::Symbols;

use crate::timeline::{ImageKey, Mapping};
use lrnprof_image::FrameTable;
use std::collections::BTreeMap;
use std::ops::{Deref, Range};
use std::path::PathBuf;
use std::sync::Arc;

/// An image file's bytes: mapped, so that only the pages the analysis
/// reads (unwind tables, symbols, debug sections) are read from disk and
/// nothing is copied; or bytes held in memory (embedded in the trace, or
/// a file that could not be mapped).
pub(crate) enum FileBytes {
    Shared(Arc<Vec<u8>>),
    Mapped(memmap2::Mmap),
    /// A `.dwo` or `.dwp` file (split DWARF), or a section of one
    /// inflated.
    Split(lrnprof_image::SplitBytes),
}

impl FileBytes {
    /// The file at `path`, mapped if possible.
    pub fn open(path: &std::path::Path) -> std::io::Result<FileBytes> {
        let file = std::fs::File::open(path)?;
        // Safety: the map is read-only and lives as long as the section
        // bytes that point into it. Should another process truncate the
        // file while it is mapped, reading the lost pages faults (SIGBUS):
        // an analysis needs the images it reads to stay as they are, as
        // it needs the trace to (see `TraceBytes`).
        match unsafe { memmap2::Mmap::map(&file) } {
            Ok(map) => Ok(FileBytes::Mapped(map)),
            Err(_) => Ok(FileBytes::Shared(Arc::new(std::fs::read(path)?))),
        }
    }
}

impl Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Shared(v) => v,
            FileBytes::Mapped(m) => m,
            FileBytes::Split(b) => b,
        }
    }
}

/// A byte range of shared, immutable data: cheap to clone, usable by
/// framehop from any worker thread.
#[derive(Clone)]
pub(crate) struct SectionBytes {
    data: Arc<FileBytes>,
    range: Range<usize>,
}

impl SectionBytes {
    pub fn whole(data: Arc<Vec<u8>>) -> SectionBytes {
        let len = data.len();
        SectionBytes {
            data: Arc::new(FileBytes::Shared(data)),
            range: 0..len,
        }
    }

    /// `range` of split DWARF bytes (in bounds: the split DWARF reader
    /// gives only ranges of sections it found).
    pub fn split(data: &lrnprof_image::SplitBytes, range: Range<usize>) -> SectionBytes {
        let range = range.start.min(data.len())..range.end.min(data.len());
        SectionBytes {
            data: Arc::new(FileBytes::Split(data.clone())),
            range,
        }
    }

    /// `None` if the range is not inside `data`.
    pub fn slice(data: &Arc<FileBytes>, offset: u64, len: u64) -> Option<SectionBytes> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        (end <= data.len()).then(|| SectionBytes {
            data: data.clone(),
            range: start..end,
        })
    }
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data[self.range.clone()]
    }
}

impl std::fmt::Debug for SectionBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SectionBytes({} bytes)", self.range.len())
    }
}

/// A section: its SVMA and bytes (empty bytes when only the range is
/// known, or while the section is `deflated`).
#[derive(Debug, Clone)]
pub(crate) struct Section {
    pub svma: u64,
    pub size: u64,
    pub bytes: SectionBytes,
    /// A zlib-compressed debug section, inflated only when its image's
    /// DWARF is read: images no sample falls in are never inflated.
    pub deflated: Option<Deflated>,
}

impl Section {
    /// A section whose bytes are `bytes`.
    pub fn plain(svma: u64, size: u64, bytes: SectionBytes) -> Section {
        Section {
            svma,
            size,
            bytes,
            deflated: None,
        }
    }

    /// Whether the section has bytes (possibly not inflated yet).
    pub fn has_bytes(&self) -> bool {
        !self.bytes.is_empty() || self.deflated.is_some()
    }

    /// The section's bytes, inflated if compressed; `None` if it has none
    /// or its compressed stream is corrupt.
    pub fn read(&self) -> Option<SectionBytes> {
        match &self.deflated {
            Some(d) => d
                .inflate()
                .filter(|b| !b.is_empty())
                .map(|b| SectionBytes::whole(Arc::new(b))),
            None => Some(self.bytes.clone()).filter(|b| !b.is_empty()),
        }
    }
}

/// The zlib stream of a compressed section, inside its file's bytes.
#[derive(Clone)]
pub(crate) struct Deflated {
    pub stream: SectionBytes,
    /// Bytes once inflated (checked against the stream's length).
    pub size: usize,
}

impl Deflated {
    /// The inflated bytes; `None` if the stream is corrupt.
    pub fn inflate(&self) -> Option<Vec<u8>> {
        lrnprof_image::inflate_zlib(&self.stream, self.size)
    }
}

impl std::fmt::Debug for Deflated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Deflated({} -> {} bytes)", self.stream.len(), self.size)
    }
}

/// A loadable segment: which file bytes land at which SVMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub file_offset: u64,
    pub file_size: u64,
    pub svma: u64,
    /// Whether the segment is executable, when known (not from an
    /// embedded layout table).
    pub executable: Option<bool>,
}

/// Where an image's unwind or symbol data came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A file on the analysis machine (build id matched).
    File(PathBuf),
    /// Data embedded in the trace.
    Embedded,
    /// The image has none (a program built without unwind tables and
    /// without a C runtime, whose start files bring some): frame pointers
    /// only.
    NoneInImage,
    /// Nothing found.
    Missing,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Embedded => f.write_str("embedded in trace"),
            Source::NoneInImage => f.write_str("none in the image (frame pointers)"),
            Source::Missing => f.write_str("missing"),
        }
    }
}

/// The unwind tables an image may have, by the names [`ImageData`] keeps
/// them under (Mach-O `__eh_frame` as `.eh_frame`).
const UNWIND_TABLES: [&str; 3] = [".eh_frame", ".debug_frame", "__unwind_info"];

/// Everything the analyzer uses of one image, wherever it came from.
/// Section names are ELF style (`.eh_frame`, `.text`, `.debug_info`); the
/// Mach-O-only ones keep their names (`__unwind_info`, `__stubs`,
/// `__stub_helper`, and `__TEXT` for the whole text segment).
#[derive(Debug, Default)]
pub(crate) struct ImageData {
    pub is_macho: bool,
    pub little_endian: bool,
    /// Mach-O `__TEXT` vmaddr, 0 for ELF.
    pub base_svma: u64,
    pub segments: Vec<Segment>,
    pub sections: BTreeMap<String, Section>,
    /// Sorted by SVMA; built when first read.
    pub symbols: Symbols,
    /// What the recording machine resolved the trace's addresses of this
    /// image to (the embedded frame table), for an image whose DWARF is
    /// not here.
    pub frames: Option<Arc<FrameTable>>,
    /// Where the split DWARF of units compiled with `-gsplit-dwarf` is
    /// looked for besides the place each unit names: set when the image's
    /// DWARF comes from a file here.
    pub split_places: Option<lrnprof_image::SplitPlaces>,
    /// The DWARF sections of the supplementary debug file (`dwz -m`) the
    /// image's DWARF refers to, when it does and the file is here.
    pub sup: Option<Box<ImageData>>,
    /// Unwind rules the analyzer made for code no unwind table of the
    /// image describes, if it made any.
    pub made_rules: Option<MadeRules>,
}

/// Where the rules of an image's `.debug_frame` that it did not carry
/// came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MadeRules {
    /// A Go binary stripped of its unwind tables: its stack-pointer
    /// tables (`.gopclntab`).
    GoTables,
    /// Code without CFI: its instructions, for this many functions.
    Instructions { functions: usize },
}

impl std::fmt::Display for MadeRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MadeRules::GoTables => f.write_str(
                "no unwind table: unwind rules made from the Go binary's stack-pointer tables (.gopclntab)",
            ),
            MadeRules::Instructions { functions } => write!(
                f,
                "unwind rules made from the instructions of {functions} function{} that no unwind table describes",
                if *functions == 1 { "" } else { "s" }
            ),
        }
    }
}

impl ImageData {
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.get(name)
    }

    /// What gimli needs to read the pointers of this image's `.eh_frame`
    /// (at `eh_frame_svma`): the SVMAs they may be relative to.
    pub fn eh_frame_bases(&self, eh_frame_svma: u64) -> gimli::BaseAddresses {
        let mut bases = gimli::BaseAddresses::default().set_eh_frame(eh_frame_svma);
        if let Some(text) = self.section(".text") {
            bases = bases.set_text(text.svma);
        }
        if let Some(got) = self.section(".got") {
            bases = bases.set_got(got.svma);
        }
        bases
    }

    /// Whether an unwind table's bytes are here.
    pub fn has_unwind_data(&self) -> bool {
        UNWIND_TABLES
            .iter()
            .any(|n| self.sections.get(*n).is_some_and(Section::has_bytes))
    }

    /// Whether the image has an unwind table, its bytes here or not (the
    /// layout table in a trace lists sections that were not embedded).
    pub fn has_unwind_table(&self) -> bool {
        UNWIND_TABLES.iter().any(|n| self.sections.contains_key(*n))
    }

    pub fn has_dwarf(&self) -> bool {
        self.sections
            .get(".debug_info")
            .is_some_and(Section::has_bytes)
    }

    /// Whether file and line information and inline frames are known:
    /// DWARF, or a frame table that has some.
    pub fn has_debug_info(&self) -> bool {
        self.has_dwarf() || self.frames.as_deref().is_some_and(locate::has_lines)
    }

    /// AVMA minus SVMA for `mapping` (an image mapped at `mapping.start` from
    /// file offset `mapping.file_offset`).
    ///
    /// The segment a mapping holds is one whose file bytes overlap the
    /// mapping's. Linkers such as lld pack segments into shared pages (the
    /// text segment at file offset 0x3b4 and SVMA 0x103b4, mapped from file
    /// offset 0), so several may overlap: for an executable mapping, take the
    /// one holding `.text` if known, else the last one (text follows the
    /// read-only headers); for others the first.
    pub fn bias(&self, mapping: &Mapping) -> u64 {
        let len = mapping.end.saturating_sub(mapping.start);
        let map_end = mapping.file_offset.saturating_add(len);
        let overlaps = |s: &&Segment| {
            s.file_size > 0
                && s.file_offset < map_end
                && mapping.file_offset < s.file_offset.saturating_add(s.file_size)
        };
        let mut candidates = self.segments.iter().filter(overlaps);
        let seg = if mapping.executable {
            let text = self.section(".text").map(|t| t.svma);
            let all: Vec<&Segment> = candidates.collect();
            let flagged = all.iter().find(|s| s.executable == Some(true));
            let holds_text =
                text.and_then(|t| all.iter().find(|s| t >= s.svma && t - s.svma < s.file_size));
            let last = all.iter().rev().find(|s| s.executable != Some(false));
            flagged.or(holds_text).or(last).copied().copied()
        } else {
            candidates.next().copied()
        };
        let svma = match seg {
            // The SVMA of the mapping's first byte (before the segment's
            // start if the segment begins inside the mapped page).
            Some(s) if mapping.file_offset >= s.file_offset => {
                s.svma.wrapping_add(mapping.file_offset - s.file_offset)
            }
            Some(s) => s.svma.wrapping_sub(s.file_offset - mapping.file_offset),
            // No program headers (embedded sections only): assume the usual
            // layout where file offsets equal SVMAs, relative to base.
            None => self.base_svma.wrapping_add(mapping.file_offset),
        };
        mapping.start.wrapping_sub(svma)
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn seg(file_offset: u64, file_size: u64, svma: u64) -> Segment {
        Segment {
            file_offset,
            file_size,
            svma,
            executable: None,
        }
    }

    fn mapping(start: u64, end: u64, file_offset: u64, executable: bool) -> Mapping {
        Mapping {
            start,
            end,
            file_offset,
            image: 0,
            executable,
        }
    }

    #[test]
    fn deflated_sections_inflate_when_read_and_corrupt_ones_do_not() {
        use std::io::Write;
        let plain: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&plain).unwrap();
        let stream = Arc::new(z.finish().unwrap());
        let d = Deflated {
            stream: SectionBytes::whole(stream.clone()),
            size: plain.len(),
        };
        let section = Section {
            svma: 0,
            size: plain.len() as u64,
            bytes: SectionBytes::whole(Arc::new(Vec::new())),
            deflated: Some(d.clone()),
        };
        assert!(section.has_bytes());
        assert_eq!(d.inflate().as_deref(), Some(&plain[..]));
        // A size the stream does not match, or a damaged stream.
        let wrong = Deflated {
            size: plain.len() + 1,
            ..d.clone()
        };
        assert_eq!(wrong.inflate(), None);
        let mut bad = (*stream).clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        bad.truncate(mid + 1);
        let bad = Deflated {
            stream: SectionBytes::whole(Arc::new(bad)),
            ..d
        };
        assert_eq!(bad.inflate(), None);
    }

    #[test]
    fn bias_of_gnu_ld_layout() {
        // Text at file offset 0x1000, SVMA 0x1000, mapped from offset 0x1000.
        let d = ImageData {
            segments: vec![seg(0, 0x628, 0), seg(0x1000, 0x1c5, 0x1000)],
            ..Default::default()
        };
        let slide = 0x5555_0000_0000;
        assert_eq!(
            d.bias(&mapping(slide + 0x1000, slide + 0x2000, 0x1000, true)),
            slide
        );
        assert_eq!(d.bias(&mapping(slide, slide + 0x1000, 0, false)), slide);
    }

    #[test]
    fn bias_of_lld_packed_layout() {
        // lld: text at file offset 0x3b4 but SVMA 0x103b4, sharing the
        // first page with the headers; the kernel maps offset 0 at the
        // page of 0x10000.
        let mut d = ImageData {
            segments: vec![
                seg(0, 0x3b4, 0),
                seg(0x3b4, 0x74, 0x103b4),
                seg(0x428, 0x10, 0x20428),
            ],
            ..Default::default()
        };
        let slide = 0x7000_0000_0000;
        let text = mapping(slide + 0x10000, slide + 0x11000, 0, true);
        assert_eq!(d.bias(&mapping(slide, slide + 0x1000, 0, false)), slide);
        // From program headers: the executable flag decides.
        d.segments[1].executable = Some(true);
        d.segments[2].executable = Some(false);
        assert_eq!(d.bias(&text), slide);
        // From an embedded layout (no flags): the segment holding .text.
        for s in &mut d.segments {
            s.executable = None;
        }
        d.sections.insert(
            ".text".into(),
            Section::plain(0x103b4, 0x74, SectionBytes::whole(Arc::new(Vec::new()))),
        );
        assert_eq!(d.bias(&text), slide);
    }
}

/// An image and what was found for it.
#[derive(Debug)]
pub(crate) struct LoadedImage {
    pub key: ImageKey,
    pub data: Option<ImageData>,
    pub unwind_source: Source,
    pub symbol_source: Source,
    /// Why data is missing or a local file was refused.
    pub notes: Vec<String>,
}

impl LoadedImage {
    /// `path` without its directories.
    pub fn short_name(&self) -> &str {
        short_name(&self.key.path)
    }
}

/// The file name of `path`.
pub(crate) fn short_name(path: &str) -> &str {
    path.rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(path)
}
