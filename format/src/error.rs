use crate::types::BlockOffset;

/// Everything that can go wrong reading or writing a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Reading or writing the underlying file failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with the `.lpt` magic.
    #[error("not an lrnprof trace: {}", what_file(found))]
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

/// What a file that is no trace seems to be, from its first bytes, and
/// what lrnprof-analyze wants instead.
fn what_file(first: &[u8]) -> String {
    const WANT: &str = "lrnprof-analyze reads the .lpt traces lrnprof-rec writes";
    match first {
        [] => "the file is empty".to_string(),
        [b'P', b'E', b'R', b'F', b'I', b'L', b'E', ..] => {
            format!("it is a perf.data file, which perf record writes; {WANT}")
        }
        [0x1f, 0x8b, ..] => format!("it is gzip-compressed (a pprof profile?); {WANT}"),
        [0x7f, b'E', b'L', b'F', ..] => format!(
            "it is an ELF file (a program or library); {WANT} (a program's files are \
             found by build id, or given with --symbols DIR)"
        ),
        [0x89, b'L', b'P', b'T', ..] => "it starts as a trace does, but its first bytes \
             are damaged, as a transfer that rewrites line endings (text mode) damages them: \
             copy it as binary"
            .to_string(),
        _ => {
            format!("its first bytes are {first:02x?}, where a trace starts with \\x89LPT; {WANT}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_no_traces_are_named() {
        let say = |first: &[u8]| what_file(first);
        assert_eq!(say(b""), "the file is empty");
        assert!(say(b"PERFILE2").starts_with("it is a perf.data file"));
        assert!(say(&[0x1f, 0x8b, 8, 0]).contains("pprof"));
        assert!(say(b"\x7fELF\x02\x01").contains("ELF file"));
        // \r\n turned into \n by a text-mode transfer.
        assert!(say(b"\x89LPT\n\x1a\n\x03").contains("copy it as binary"));
        assert!(say(b"hello").contains("[68, 65, 6c, 6c, 6f]"));
    }
}
