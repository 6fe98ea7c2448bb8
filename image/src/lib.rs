//! An image's bytes as both sides of lrnprof need them: the recorder (and
//! `lrnprof-analyze pack`) embeds what the analyzer later reads, and this
//! crate defines that contract once.
//!
//! - **Build ids**: [`build_id_of_file`] and [`build_id_of_bytes`] find an
//!   ELF image's GNU build-id note or a Mach-O image's `LC_UUID`, reading
//!   only the headers.
//! - **Universal binaries**: [`universal_slices`] lists the architectures
//!   of a fat Mach-O file, [`thin_slice`] picks the one a process ran.
//! - **Embedding**: [`blobs_for_file`] turns the sections an [`EmbedLevel`]
//!   wants into trace [`Blob`](lrnprof_format::Blob)s, with the layout
//!   table ([`Layout`], blob [`LAYOUT_SECTION`]) that lets an analyzer map
//!   addresses without the file; [`blobs_for_touched_file`] cuts the
//!   `.eh_frame` to the entries a trace's code addresses reach
//!   ([`cut_eh_frame`]).
//! - **Section names and roles**: the one list of which sections each
//!   level carries ([`UNWIND_SECTIONS`], [`SYMBOL_SECTIONS`],
//!   [`DEBUG_SECTION_PREFIX`], [`MACHO_UNWIND_SECTIONS`]) and what the
//!   analyzer uses each for ([`section_role`]).
//! - **Naming addresses**: symbol tables built alike from a whole file
//!   ([`symbols_of_object`]), from embedded sections ([`symbol_table`],
//!   [`parse_elf64_symbols`], [`plt_symbols`]) and with a separate debug
//!   file ([`merge_symbols`], [`debug_file_candidates`]); the
//!   [`Resolver`] that turns an SVMA into its inline levels with file and
//!   line (DWARF through addr2line) or its symbol.
//! - **Frame tables**: [`frame_table_for_file`] resolves the addresses a
//!   trace refers to once, at the end of a recording, into a
//!   [`FrameTable`] (blob `BlobKind::Table { name: FRAMES_TABLE }`), which
//!   an analyzer without the image's DWARF reads instead.
//! - **Reading only the DWARF needed**: [`units_to_hide`] and
//!   [`hide_units`] keep addr2line to the units that hold a set of
//!   addresses, [`unused_dwarf`] names the sections it never reads,
//!   [`inflate_zlib`] inflates compressed ones.
//!
//! Everything here is a pure function over bytes or files' contents: no
//! process is touched, so the crate builds and behaves the same on every
//! host. Malformed input gives an error or `None`, never a panic, and no
//! length read from the input is allocated without a bound. Reading goes
//! through the `object` crate.
//!
//! ```no_run
//! use lrnprof_image::{blobs_for_file, build_id_of_file, EmbedLevel, Layout, LAYOUT_SECTION};
//! use lrnprof_format::BlobKind;
//! let path = std::path::Path::new("/usr/bin/true");
//! let id = build_id_of_file(path).expect("no build id");
//! let blobs = blobs_for_file(path, &id, EmbedLevel::Symbols)?;
//! for blob in &blobs {
//!     if let BlobKind::Section { name, .. } = &blob.kind {
//!         if name == LAYOUT_SECTION {
//!             println!("{} segments", Layout::parse(&blob.data).segments.len());
//!         }
//!     }
//! }
//! # Ok::<(), lrnprof_image::ImageError>(())
//! ```
//!
//! `docs/format.md` in the repository specifies the blobs, the layout
//! table and the frame table byte for byte.

#![deny(missing_docs)]
// One exception, `source::map`: files are mapped, not read.
#![deny(unsafe_code)]

mod build_id;
mod cfi_write;
mod code_cfi;
mod debug_file;
mod demangle;
mod eh_frame;
mod embed;
mod error;
mod frames;
mod layout;
mod resolve;
mod sections;
mod source;
mod split_dwarf;
mod symbols;
mod units;
mod universal;

pub use build_id::{build_id_of_bytes, build_id_of_file};
pub use code_cfi::{code_debug_frame, debug_frame_of_code, fde_ranges, for_each_fde};
pub use debug_file::{
    alt_file_candidates, debug_file_candidates, debuglink_crc_matches, supplementary_id,
    supplementary_link,
};
pub use demangle::demangle;
pub use eh_frame::{cut_eh_frame, CutEhFrame};
pub use embed::{
    blobs_for_file, blobs_for_image, blobs_for_open_file, blobs_for_touched_file, split_blob,
    EhFrameEmbedded, MAX_BLOB_PART,
};
pub use error::ImageError;
pub use frames::{
    frame_table_for_file, FrameCache, FrameRequest, FrameTable, FrameTableBuilt, FRAMES_TABLE,
    MAX_DWARF_BYTES,
};
pub use layout::{Layout, LayoutSection, LayoutSegment, LAYOUT_SECTION};
pub use resolve::{load_dwarf, project_inline, FrameLine, Resolver};
pub use sections::{
    canonical_section_name, section_role, EmbedLevel, SectionRole, DEBUG_SECTION_PREFIX,
    MACHO_HEADER_SECTION, MACHO_UNWIND_SECTIONS, SYMBOL_SECTIONS, UNWIND_SECTIONS,
};
pub use split_dwarf::{SplitBytes, SplitDwarf, SplitPlaces};
pub use symbols::{
    bound_sizeless, go_debug_frame, is_code_label_name, merge_symbols, mini_debug_info_symbols,
    object_has_symbols, parse_elf64_symbols, plt_symbols, symbol_at, symbol_table,
    symbols_of_object, PltTables, Symbol, MINI_DEBUG_INFO_SECTION,
};
pub use units::{hide_units, inflate_zlib, units_to_hide, unused_dwarf};
pub use universal::{thin_slice, universal_slices, UniversalSlice};
