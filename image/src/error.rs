//! The image crate's error type.

use std::path::PathBuf;

/// Why an image's bytes could not be read as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// An embed level name that does not exist.
    #[error("unknown embed level {0:?}: use none, unwind, symbols or debug")]
    UnknownEmbedLevel(String),
    /// The image file cannot be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The bytes are not an ELF or Mach-O image (or its headers are corrupt).
    #[error("not an image: {0}")]
    NotAnImage(String),
    /// A section to embed cannot be read or decompressed.
    #[error("section {name}: {reason}")]
    Section {
        /// The section's name in the file.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// zstd failed to compress a section.
    #[error("compressing section {name}: {source}")]
    Compress {
        /// The section's name in the file.
        name: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The header of a universal (fat) Mach-O file is corrupt.
    #[error("malformed universal Mach-O header: {0}")]
    MalformedUniversal(String),
    /// A universal file has no slice of the wanted architecture.
    #[error("no slice for cputype {cputype:#x} among the {count} of the universal file")]
    NoSlice {
        /// The wanted `cputype`.
        cputype: u32,
        /// How many slices the file has.
        count: usize,
    },
    /// A universal file's header places a slice beyond the file's end.
    #[error("slice {index} at offset {offset} with size {size} is past the end of the universal file ({len} bytes)")]
    SlicePastEnd {
        /// The slice's index in the header.
        index: usize,
        /// Its stated offset.
        offset: u64,
        /// Its stated size.
        size: u64,
        /// The file's length.
        len: usize,
    },
    /// A thin image expected to be 64-bit Mach-O is something else.
    #[error("not a 64-bit Mach-O image: {0}")]
    NotMachO64(String),
    /// A thin Mach-O image is of another architecture than wanted.
    #[error("cputype {found:#x} of the Mach-O image, expected {expected:#x}")]
    WrongArch {
        /// The image's `cputype`.
        found: u32,
        /// The wanted `cputype`.
        expected: u32,
    },
    /// A table lrnprof derived from an image (a `BlobKind::Table`) is
    /// malformed.
    #[error("malformed {name} table: {reason}")]
    MalformedTable {
        /// The table's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An image's DWARF is too large to read for a frame table.
    #[error("its DWARF is {} MiB, more than the {} MiB read for a frame table", bytes >> 20, max >> 20)]
    DwarfTooLarge {
        /// Bytes of DWARF sections.
        bytes: u64,
        /// The most that is read.
        max: u64,
    },
}
