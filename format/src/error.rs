use crate::types::BlockOffset;

/// Everything that can go wrong reading or writing a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Reading or writing the underlying file failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with the `.lpt` magic.
    #[error("not an lrnprof trace: magic is {found:02x?}, expected {expected:02x?}")]
    BadMagic {
        /// The first bytes of the file.
        found: Vec<u8>,
        /// The magic of an `.lpt` file.
        expected: Vec<u8>,
    },
    /// The file is shorter than its fixed header.
    #[error("trace is {len} bytes, too short for the {needed}-byte file header")]
    TooShort {
        /// Bytes in the file.
        len: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// Written by an older format this reader no longer reads.
    #[error(
        "trace format version {found} is too old: this lrnprof reads versions {oldest} to {newest}"
    )]
    VersionTooOld {
        /// Version in the file.
        found: u16,
        /// Oldest readable version.
        oldest: u16,
        /// Newest readable version.
        newest: u16,
    },
    /// Written by a newer lrnprof.
    #[error("trace format version {found} is newer than this lrnprof reads ({newest}): upgrade lrnprof-analyze")]
    VersionTooNew {
        /// Version in the file.
        found: u16,
        /// Newest readable version.
        newest: u16,
    },
    /// A length field exceeds the bytes that follow or a sane bound.
    #[error("{what} at offset {offset} claims {len} bytes, but at most {max} are possible")]
    LengthOutOfBounds {
        /// Which length.
        what: &'static str,
        /// File offset of the structure.
        offset: u64,
        /// The length claimed.
        len: u64,
        /// The bound it broke.
        max: u64,
    },
    /// Stored and computed checksums differ.
    #[error(
        "{what} at offset {offset} is corrupt: checksum {found:#010x}, expected {expected:#010x}"
    )]
    BadChecksum {
        /// Which structure.
        what: &'static str,
        /// File offset of the structure.
        offset: u64,
        /// Checksum computed over the bytes.
        found: u32,
        /// Checksum stored in the file.
        expected: u32,
    },
    /// A block header does not start with the block magic.
    #[error("no block header at offset {offset}: found {found:02x?}")]
    BadBlockMagic {
        /// File offset.
        offset: u64,
        /// The bytes found instead.
        found: [u8; 4],
    },
    /// A block's codec or kind byte is unknown.
    #[error("block at offset {offset} has unknown {what} {value}")]
    UnknownBlockField {
        /// Which field.
        what: &'static str,
        /// File offset.
        offset: u64,
        /// The value found.
        value: u8,
    },
    /// zstd could not decompress a block.
    #[error("block at offset {}: decompression failed: {message}", offset.0)]
    Decompress {
        /// The block.
        offset: BlockOffset,
        /// zstd's message.
        message: String,
    },
    /// A block decompressed to a different length than its header says.
    #[error("block at offset {}: decompressed to {found} bytes, header says {expected}", offset.0)]
    RawLengthMismatch {
        /// The block.
        offset: BlockOffset,
        /// Bytes produced.
        found: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// A record inside a block could not be decoded.
    #[error("block at offset {}: record {index} is malformed: {message}", offset.0)]
    BadRecord {
        /// The block.
        offset: BlockOffset,
        /// Index of the record in the block.
        index: u32,
        /// What was wrong.
        message: String,
    },
    /// The file header's encoded [`TraceHeader`](crate::TraceHeader) is malformed.
    #[error("trace header is malformed: {0}")]
    BadHeader(String),
    /// A record could not be encoded.
    #[error("cannot encode record: {0}")]
    Encode(String),
    /// A record is larger than a block may be.
    #[error("record of {len} bytes exceeds the block limit of {max} bytes")]
    RecordTooLarge {
        /// Encoded size.
        len: u64,
        /// Limit.
        max: u64,
    },
}
