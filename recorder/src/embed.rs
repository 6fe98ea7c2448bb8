//! What of an image to carry inside a trace so it can be analyzed where
//! the image does not exist: pure functions from an image's bytes to
//! [`Blob`]s, shared by the recorder (at the end of a recording) and
//! `lrnprof-analyze pack` (for an existing trace).
//!
//! # Blob layout
//!
//! Each section becomes `BlobKind::Section { name, svma }` keyed by the
//! image's build id, `name` as in the file (`.eh_frame`) and `svma` its
//! address in the file. DWARF sections compressed in the file
//! (`SHF_COMPRESSED`, `.zdebug_*`) are stored decompressed under their
//! `.debug_*` name. Blobs of `.debug_*` sections are zstd-compressed on
//! their own (`compressed: true`); others are not (the trace's blocks are
//! compressed anyway). A blob whose stored bytes exceed [`MAX_BLOB_PART`]
//! is split into parts with the same key, `offset` and `total_len`.
//!
//! Every level also embeds [`LAYOUT_SECTION`]: a text table of the image's
//! loadable segments and all its sections, so an analyzer can map AVMAs to
//! SVMAs and give the unwinder the `.text` / `.got` ranges without the
//! file. One line per entry, fields separated by one space, numbers in
//! lowercase hex without `0x`:
//!
//! ```text
//! segment FILE_OFFSET FILE_SIZE SVMA MEM_SIZE
//! section NAME SVMA SIZE
//! ```

use lrnprof_format::{Blob, BlobKind, BuildId};
use object::{Object, ObjectSection, ObjectSegment, ReadRef, SectionKind};
use std::str::FromStr;

/// Name of the layout blob (see the module docs).
pub const LAYOUT_SECTION: &str = ".lrnprof.layout";

/// Stored bytes per blob record at most; larger blobs are split.
pub const MAX_BLOB_PART: usize = 32 << 20;

/// zstd level for `.debug_*` blobs.
const DEBUG_ZSTD_LEVEL: i32 = 9;

/// How much of each image a trace carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum EmbedLevel {
    /// Nothing: the analyzer needs the image files (matching build ids).
    None,
    /// Unwind sections (`.eh_frame`, `.eh_frame_hdr`, `.debug_frame`) and
    /// the layout: stacks unwind anywhere, functions show as addresses.
    Unwind,
    /// Unwind sections and symbol tables (`.symtab`/`.strtab`,
    /// `.dynsym`/`.dynstr`, and `.rela.plt`, which names PLT stubs):
    /// function names anywhere.
    #[default]
    Symbols,
    /// Also the DWARF `.debug_*` sections: file:line and inline frames.
    Debug,
}

impl FromStr for EmbedLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(EmbedLevel::None),
            "unwind" => Ok(EmbedLevel::Unwind),
            "symbols" => Ok(EmbedLevel::Symbols),
            "debug" => Ok(EmbedLevel::Debug),
            other => Err(format!(
                "unknown embed level {other:?}: use none, unwind, symbols or debug"
            )),
        }
    }
}

const UNWIND: [&str; 3] = [".eh_frame", ".eh_frame_hdr", ".debug_frame"];
const SYMBOLS: [&str; 5] = [".symtab", ".strtab", ".dynsym", ".dynstr", ".rela.plt"];

/// The name a wanted section is stored under, or `None` if `level` does
/// not want it.
fn wanted(name: &str, level: EmbedLevel) -> Option<String> {
    let debug_name = name
        .strip_prefix(".zdebug_")
        .map(|rest| format!(".debug_{rest}"));
    let name = debug_name.as_deref().unwrap_or(name);
    let want = match level {
        EmbedLevel::None => false,
        EmbedLevel::Unwind => UNWIND.contains(&name),
        EmbedLevel::Symbols => UNWIND.contains(&name) || SYMBOLS.contains(&name),
        EmbedLevel::Debug => {
            UNWIND.contains(&name) || SYMBOLS.contains(&name) || name.starts_with(".debug_")
        }
    };
    want.then(|| name.to_string())
}

/// The blobs that carry `level`'s sections of the image `bytes` (ELF or
/// Mach-O), keyed by `build_id`. Errors if the bytes are not an image.
pub fn blobs_for_image(
    bytes: &[u8],
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, String> {
    blobs_for_data(bytes, build_id, level)
}

/// [`blobs_for_image`] reading the image file at `path` piecewise, so
/// only the wanted sections are read into memory.
pub fn blobs_for_file(
    path: &std::path::Path,
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    blobs_for_open_file(file, build_id, level)
}

/// [`blobs_for_file`] for a file already open (e.g. kept open since the
/// image was mapped, in case the path goes away).
pub fn blobs_for_open_file(
    file: std::fs::File,
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, String> {
    let cache = object::ReadCache::new(file);
    blobs_for_data(&cache, build_id, level)
}

fn blobs_for_data<'data, R: ReadRef<'data>>(
    data: R,
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, String> {
    if level == EmbedLevel::None {
        return Ok(Vec::new());
    }
    let file = object::File::parse(data).map_err(|e| format!("not an image: {e}"))?;
    let mut blobs = Vec::new();
    let mut layout = String::new();
    for seg in file.segments() {
        let (offset, size) = seg.file_range();
        layout.push_str(&format!(
            "segment {offset:x} {size:x} {:x} {:x}\n",
            seg.address(),
            seg.size()
        ));
    }
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        if name.is_empty() || name.contains(char::is_whitespace) {
            continue;
        }
        layout.push_str(&format!(
            "section {name} {:x} {:x}\n",
            section.address(),
            section.size()
        ));
        let Some(stored_name) = wanted(name, level) else {
            continue;
        };
        if section.kind() == SectionKind::UninitializedData {
            continue;
        }
        let bytes = section
            .uncompressed_data()
            .map_err(|e| format!("section {name}: {e}"))?;
        if bytes.is_empty() {
            continue;
        }
        let compress = stored_name.starts_with(".debug_");
        let stored = if compress {
            zstd::bulk::compress(&bytes, DEBUG_ZSTD_LEVEL).map_err(|e| e.to_string())?
        } else {
            bytes.into_owned()
        };
        split_into(
            &mut blobs,
            build_id,
            BlobKind::Section {
                name: stored_name,
                svma: section.address(),
            },
            compress,
            stored,
        );
    }
    split_into(
        &mut blobs,
        build_id,
        BlobKind::Section {
            name: LAYOUT_SECTION.to_string(),
            svma: 0,
        },
        false,
        layout.into_bytes(),
    );
    Ok(blobs)
}

/// Push `data` as one blob, or as parts of at most [`MAX_BLOB_PART`] bytes.
pub fn split_into(
    out: &mut Vec<Blob>,
    build_id: &BuildId,
    kind: BlobKind,
    compressed: bool,
    data: Vec<u8>,
) {
    let total_len = data.len() as u64;
    if data.len() <= MAX_BLOB_PART {
        out.push(Blob {
            build_id: build_id.clone(),
            kind,
            compressed,
            offset: 0,
            total_len,
            data,
        });
        return;
    }
    for (i, part) in data.chunks(MAX_BLOB_PART).enumerate() {
        out.push(Blob {
            build_id: build_id.clone(),
            kind: kind.clone(),
            compressed,
            offset: (i * MAX_BLOB_PART) as u64,
            total_len,
            data: part.to_vec(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("debug".parse(), Ok(EmbedLevel::Debug));
        assert!("all".parse::<EmbedLevel>().is_err());
        assert!(EmbedLevel::Unwind < EmbedLevel::Symbols);
        assert_eq!(EmbedLevel::default(), EmbedLevel::Symbols);
    }

    #[test]
    fn levels_choose_sections() {
        assert_eq!(
            wanted(".eh_frame", EmbedLevel::Unwind).as_deref(),
            Some(".eh_frame")
        );
        assert_eq!(wanted(".symtab", EmbedLevel::Unwind), None);
        assert_eq!(
            wanted(".dynsym", EmbedLevel::Symbols).as_deref(),
            Some(".dynsym")
        );
        assert_eq!(
            wanted(".rela.plt", EmbedLevel::Symbols).as_deref(),
            Some(".rela.plt")
        );
        assert_eq!(wanted(".rela.plt", EmbedLevel::Unwind), None);
        assert_eq!(wanted(".debug_info", EmbedLevel::Symbols), None);
        assert_eq!(
            wanted(".zdebug_line", EmbedLevel::Debug).as_deref(),
            Some(".debug_line")
        );
        assert_eq!(wanted(".text", EmbedLevel::Debug), None);
        assert_eq!(wanted(".eh_frame", EmbedLevel::None), None);
    }

    #[test]
    fn large_blobs_are_split() {
        let mut out = Vec::new();
        let id = BuildId(vec![1]);
        let kind = BlobKind::Image;
        split_into(&mut out, &id, kind, false, vec![7u8; MAX_BLOB_PART * 2 + 5]);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].offset, (MAX_BLOB_PART * 2) as u64);
        assert_eq!(out[2].data.len(), 5);
        assert!(out
            .iter()
            .all(|b| b.total_len == (MAX_BLOB_PART * 2 + 5) as u64));
    }

    #[test]
    fn garbage_is_not_an_image() {
        assert!(blobs_for_image(b"garbage", &BuildId(vec![1]), EmbedLevel::Symbols).is_err());
        assert!(
            blobs_for_image(b"garbage", &BuildId(vec![1]), EmbedLevel::None)
                .unwrap()
                .is_empty()
        );
    }

    /// This test binary is an ELF image with unwind info and symbols.
    #[cfg(target_os = "linux")]
    #[test]
    fn extracts_sections_of_a_real_image() {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let id = BuildId(vec![9]);
        let blobs = blobs_for_image(&bytes, &id, EmbedLevel::Symbols).unwrap();
        let names: Vec<&str> = blobs
            .iter()
            .filter_map(|b| match &b.kind {
                BlobKind::Section { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert!(names.contains(&".eh_frame"), "{names:?}");
        assert!(names.contains(&".symtab"), "{names:?}");
        assert!(names.contains(&LAYOUT_SECTION));
        assert!(!names.iter().any(|n| n.starts_with(".debug_info")));
        let layout = blobs
            .iter()
            .find(|b| {
                matches!(&b.kind,
            BlobKind::Section { name, .. } if name == LAYOUT_SECTION)
            })
            .unwrap();
        let text = String::from_utf8(layout.data.clone()).unwrap();
        assert!(text.lines().any(|l| l.starts_with("segment ")));
        assert!(text.lines().any(|l| l.starts_with("section .text ")));
        let debug = blobs_for_image(&bytes, &id, EmbedLevel::Debug).unwrap();
        let info = debug
            .iter()
            .find(|b| matches!(&b.kind, BlobKind::Section { name, .. } if name == ".debug_info"))
            .expect("test binaries have DWARF");
        assert!(info.compressed);
        assert!(blobs_for_file(
            std::path::Path::new("/proc/self/exe"),
            &id,
            EmbedLevel::Unwind
        )
        .unwrap()
        .iter()
        .any(|b| matches!(&b.kind, BlobKind::Section { name, .. } if name == ".eh_frame")));
    }
}
