//! Extracting what of an image a trace carries, so it can be analyzed
//! where the image does not exist: from an image's bytes to [`Blob`]s.
//!
//! Each section an [`EmbedLevel`] wants becomes `BlobKind::Section { name,
//! svma }` keyed by the image's build id, `name` the section's canonical
//! name and `svma` its address in the file. DWARF sections compressed in the
//! file (`SHF_COMPRESSED`, `.zdebug_*`) are stored decompressed under their
//! `.debug_*` name. Blobs of `.debug_*` sections are zstd-compressed on
//! their own (`compressed: true`); others are not (the trace's blocks are
//! compressed anyway). Every level but `None` adds the layout table
//! ([`LAYOUT_SECTION`]). A blob whose stored bytes exceed its part size is
//! split into parts with the same key ([`split_blob`]).

use crate::eh_frame::cut_eh_frame;
use crate::layout::{Layout, LAYOUT_SECTION};
use crate::sections::{EmbedLevel, DEBUG_SECTION_PREFIX};
use crate::ImageError;
use lrnprof_format::{Blob, BlobKind, BuildId};
use object::{Object, ObjectSection, ReadRef, SectionKind};
use std::borrow::Cow;
use std::path::Path;

/// Stored bytes per blob record at most for [`blobs_for_image`] and the
/// like; larger blobs are split.
pub const MAX_BLOB_PART: usize = 32 << 20;

/// zstd level for `.debug_*` blobs.
const DEBUG_ZSTD_LEVEL: i32 = 9;

/// The blobs that carry `level`'s sections of the ELF image `bytes`, and
/// its layout table, keyed by `build_id`. Errors if the bytes are not an
/// image. A Mach-O image gets its layout table only: Mach-O images travel
/// whole or as the sections a recorder copies from memory
/// ([`MACHO_UNWIND_SECTIONS`](crate::MACHO_UNWIND_SECTIONS)).
pub fn blobs_for_image(
    bytes: &[u8],
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, ImageError> {
    blobs_for_data(bytes, build_id, level, None).map(|(blobs, _)| blobs)
}

/// [`blobs_for_image`] reading the image file at `path` piecewise, so only
/// the wanted sections are read into memory.
pub fn blobs_for_file(
    path: &Path,
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, ImageError> {
    let file = std::fs::File::open(path).map_err(|source| ImageError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    blobs_for_open_file(file, build_id, level)
}

/// [`blobs_for_file`] for a file already open (e.g. kept open since the
/// image was mapped, in case its path goes away).
pub fn blobs_for_open_file(
    file: std::fs::File,
    build_id: &BuildId,
    level: EmbedLevel,
) -> Result<Vec<Blob>, ImageError> {
    let cache = object::ReadCache::new(file);
    blobs_for_data(&cache, build_id, level, None).map(|(blobs, _)| blobs)
}

/// How an image's `.eh_frame` went into its blobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EhFrameEmbedded {
    /// Cut to the FDEs the code addresses reach ([`cut_eh_frame`]): this
    /// many kept, this many turned into filler.
    Cut {
        /// FDEs kept.
        kept: usize,
        /// FDEs dropped.
        dropped: usize,
    },
    /// Whole, for this reason.
    Whole(String),
    /// The image has none (or the level embeds none).
    Absent,
}

/// [`blobs_for_open_file`] for an image of which a trace refers to the
/// code addresses `file_offsets` only (offsets in the file: instruction
/// pointers as they are, return addresses minus one), and to no other
/// (none left out): its `.eh_frame` keeps only the FDEs an unwinder picks
/// for those ([`cut_eh_frame`]), unless anything is unusual, then it is
/// whole. Says which.
pub fn blobs_for_touched_file(
    file: std::fs::File,
    build_id: &BuildId,
    level: EmbedLevel,
    file_offsets: &[u64],
) -> Result<(Vec<Blob>, EhFrameEmbedded), ImageError> {
    let cache = object::ReadCache::new(file);
    blobs_for_data(&cache, build_id, level, Some(file_offsets))
}

/// The lookups `file_offsets` as SVMAs through `layout`, for a cut of the
/// `.eh_frame` of `file`, or why the section stays whole.
fn lookup_svmas<'data, R: ReadRef<'data>>(
    file: &object::File<'data, R>,
    layout: &Layout,
    file_offsets: &[u64],
) -> Result<Vec<u64>, String> {
    if file.format() != object::BinaryFormat::Elf || !file.is_little_endian() || !file.is_64() {
        return Err("not a little-endian 64-bit ELF image".into());
    }
    file_offsets
        .iter()
        .map(|&o| {
            layout
                .svma_of_file_offset(o)
                .ok_or_else(|| format!("code address at file offset {o:#x} is in no segment"))
        })
        .collect()
}

fn blobs_for_data<'data, R: ReadRef<'data>>(
    data: R,
    build_id: &BuildId,
    level: EmbedLevel,
    reach: Option<&[u64]>,
) -> Result<(Vec<Blob>, EhFrameEmbedded), ImageError> {
    let mut eh_frame = EhFrameEmbedded::Absent;
    if level == EmbedLevel::None {
        return Ok((Vec::new(), eh_frame));
    }
    let file = object::File::parse(data).map_err(|e| ImageError::NotAnImage(e.to_string()))?;
    let layout = Layout::of(&file);
    let mut blobs = Vec::new();
    // The functions the trace reaches (all where an address cannot be
    // placed).
    let reached = reach.and_then(|offsets| {
        let mut svmas = lookup_svmas(&file, &layout, offsets).ok()?;
        svmas.sort_unstable();
        Some(svmas)
    });
    // Code without CFI (musl's libc): rules made from its instructions,
    // after the image's own `.debug_frame` if it has one.
    let code_cfi = crate::code_debug_frame(&file, reached.as_deref());
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        let Some(stored_name) = level.stored_name(name) else {
            continue;
        };
        if code_cfi.is_some() && stored_name == ".debug_frame" {
            continue;
        }
        if section.kind() == SectionKind::UninitializedData {
            continue;
        }
        let bytes = section
            .uncompressed_data()
            .map_err(|e| ImageError::Section {
                name: name.to_string(),
                reason: e.to_string(),
            })?;
        if bytes.is_empty() {
            continue;
        }
        let bytes = match reach {
            Some(offsets) if stored_name == ".eh_frame" => {
                let cut = lookup_svmas(&file, &layout, offsets)
                    .and_then(|svmas| cut_eh_frame(&bytes, section.address(), &svmas));
                match cut {
                    Ok(cut) => {
                        eh_frame = EhFrameEmbedded::Cut {
                            kept: cut.kept,
                            dropped: cut.dropped,
                        };
                        Cow::Owned(cut.bytes)
                    }
                    Err(reason) => {
                        eh_frame = EhFrameEmbedded::Whole(reason);
                        bytes
                    }
                }
            }
            _ => bytes,
        };
        let compress = stored_name.starts_with(DEBUG_SECTION_PREFIX);
        let stored = if compress {
            zstd::bulk::compress(&bytes, DEBUG_ZSTD_LEVEL).map_err(|source| {
                ImageError::Compress {
                    name: name.to_string(),
                    source,
                }
            })?
        } else {
            bytes.into_owned()
        };
        let kind = BlobKind::Section {
            name: stored_name.into_owned(),
            svma: section.address(),
        };
        blobs.extend(split_blob(build_id, kind, compress, stored, MAX_BLOB_PART));
    }
    // A stripped Go binary has no unwind table: its stack-pointer tables
    // give one, for the functions the trace reaches.
    let go = file
        .section_by_name(".gopclntab")
        .and_then(|_| crate::go_debug_frame(&file, reached.as_deref()));
    if let Some(bytes) = go.or(code_cfi) {
        let stored = zstd::bulk::compress(&bytes, DEBUG_ZSTD_LEVEL).map_err(|source| {
            ImageError::Compress {
                name: ".debug_frame".to_string(),
                source,
            }
        })?;
        let kind = BlobKind::Section {
            name: ".debug_frame".to_string(),
            svma: 0,
        };
        blobs.extend(split_blob(build_id, kind, true, stored, MAX_BLOB_PART));
    }
    let layout_kind = BlobKind::Section {
        name: LAYOUT_SECTION.to_string(),
        svma: 0,
    };
    blobs.extend(split_blob(
        build_id,
        layout_kind,
        false,
        layout.to_bytes(),
        MAX_BLOB_PART,
    ));
    Ok((blobs, eh_frame))
}

/// `data` as one blob, or as parts of at most `max_part` bytes (taken as
/// at least one) with the same key, each saying where it starts (`offset`)
/// in the whole (`total_len`). Empty data is one empty blob.
pub fn split_blob(
    build_id: &BuildId,
    kind: BlobKind,
    compressed: bool,
    data: Vec<u8>,
    max_part: usize,
) -> Vec<Blob> {
    let max_part = max_part.max(1);
    let total_len = data.len() as u64;
    if data.len() <= max_part {
        return vec![Blob {
            build_id: build_id.clone(),
            kind,
            compressed,
            offset: 0,
            total_len,
            data,
        }];
    }
    data.chunks(max_part)
        .enumerate()
        .map(|(i, part)| Blob {
            build_id: build_id.clone(),
            kind: kind.clone(),
            compressed,
            offset: (i * max_part) as u64,
            total_len,
            data: part.to_vec(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blobs_are_split() {
        let id = BuildId(vec![1]);
        let len = MAX_BLOB_PART * 2 + 5;
        let out = split_blob(&id, BlobKind::Image, false, vec![7u8; len], MAX_BLOB_PART);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].offset, (MAX_BLOB_PART * 2) as u64);
        assert_eq!(out[2].data.len(), 5);
        assert!(out.iter().all(|b| b.total_len == len as u64));
        let one = split_blob(&id, BlobKind::Image, true, vec![1, 2], 2);
        assert_eq!(one.len(), 1);
        assert!(one[0].compressed);
        assert_eq!(
            split_blob(&id, BlobKind::Image, false, Vec::new(), 0).len(),
            1
        );
    }

    #[test]
    fn garbage_is_not_an_image() {
        let id = BuildId(vec![1]);
        let msg = blobs_for_image(b"garbage", &id, EmbedLevel::Symbols)
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("not an image: "), "{msg}");
        assert!(blobs_for_image(b"garbage", &id, EmbedLevel::None)
            .unwrap()
            .is_empty());
        let missing = Path::new("/nonexistent/image");
        let msg = blobs_for_file(missing, &id, EmbedLevel::Unwind)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("/nonexistent/image"), "{msg}");
    }

    fn section_names(blobs: &[Blob]) -> Vec<&str> {
        blobs
            .iter()
            .filter_map(|b| match &b.kind {
                BlobKind::Section { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    fn find<'a>(blobs: &'a [Blob], wanted: &str) -> Option<&'a Blob> {
        blobs
            .iter()
            .find(|b| matches!(&b.kind, BlobKind::Section { name, .. } if name == wanted))
    }

    /// This test binary's `.eh_frame`, cut to one function's code: the
    /// other blobs are those of the whole file; anything unusual keeps
    /// the section whole and says why.
    #[test]
    fn touched_files_get_their_eh_frame_cut() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&bytes[..]).unwrap();
        if file.format() != object::BinaryFormat::Elf {
            return;
        }
        let id = BuildId(vec![9]);
        let layout = Layout::of(&file);
        let here = {
            use object::ObjectSymbol;
            let sym = file
                .symbols()
                .find(|s| s.name().is_ok_and(|n| n.contains("split_blob")))
                .expect("split_blob's symbol");
            layout.file_offset_of_svma(sym.address()).unwrap()
        };
        let open = || std::fs::File::open(&exe).unwrap();
        let (cut, how) =
            blobs_for_touched_file(open(), &id, EmbedLevel::Symbols, &[here, here + 1]).unwrap();
        let EhFrameEmbedded::Cut { kept, dropped } = how else {
            panic!("{how:?}")
        };
        assert!((1..=2).contains(&kept) && dropped > 100, "{kept} {dropped}");
        let whole = blobs_for_image(&bytes, &id, EmbedLevel::Symbols).unwrap();
        assert_eq!(section_names(&cut), section_names(&whole));
        for (c, w) in cut.iter().zip(&whole) {
            if matches!(&c.kind, BlobKind::Section { name, .. } if name == ".eh_frame") {
                assert_eq!(c.data.len(), w.data.len());
                assert_ne!(c.data, w.data);
            } else {
                assert_eq!(c, w);
            }
        }
        // An address in no segment: the section stays whole.
        let (blobs, how) =
            blobs_for_touched_file(open(), &id, EmbedLevel::Symbols, &[u64::MAX]).unwrap();
        assert!(
            matches!(&how, EhFrameEmbedded::Whole(r) if r.contains("in no segment")),
            "{how:?}"
        );
        assert_eq!(blobs, whole);
        let (_, how) = blobs_for_touched_file(open(), &id, EmbedLevel::None, &[here]).unwrap();
        assert_eq!(how, EhFrameEmbedded::Absent);
    }

    /// This test binary is an image with unwind info, symbols and DWARF.
    #[test]
    fn extracts_sections_of_a_real_image() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let id = BuildId(vec![9]);
        let blobs = blobs_for_image(&bytes, &id, EmbedLevel::Symbols).unwrap();
        let names = section_names(&blobs);
        if object::File::parse(&bytes[..]).unwrap().format() == object::BinaryFormat::MachO {
            assert_eq!(names, [LAYOUT_SECTION]);
            return;
        }
        assert!(names.contains(&".eh_frame"), "{names:?}");
        assert!(names.contains(&".symtab"), "{names:?}");
        assert_eq!(names.last(), Some(&LAYOUT_SECTION));
        assert!(!names.iter().any(|n| n.starts_with(".debug_info")));
        let layout = Layout::parse(&find(&blobs, LAYOUT_SECTION).unwrap().data);
        assert!(!layout.segments.is_empty());
        let text = layout.sections.iter().find(|s| s.name == ".text").unwrap();
        assert!(text.size > 0);
        let debug = blobs_for_image(&bytes, &id, EmbedLevel::Debug).unwrap();
        let info = find(&debug, ".debug_info").expect("test binaries have DWARF");
        assert!(info.compressed);
        let unwind = blobs_for_file(&exe, &id, EmbedLevel::Unwind).unwrap();
        assert!(find(&unwind, ".eh_frame").is_some());
        assert!(find(&unwind, ".symtab").is_none());
        // Piecewise and whole reads give the same blobs.
        assert_eq!(
            unwind,
            blobs_for_image(&bytes, &id, EmbedLevel::Unwind).unwrap()
        );
    }
}
