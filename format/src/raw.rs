//! The fixed little-endian framing of an `.lpt` file: file header, block
//! headers and footer. `docs/format.md` is the byte-level spec of this module.

use crate::error::FormatError;

/// First eight bytes of every trace. The high byte and the CR/LF/^Z pair catch
/// files mangled by text-mode transfers, as PNG's magic does.
pub const MAGIC: [u8; 8] = *b"\x89LPT\r\n\x1a\n";

/// The format version this crate writes. Version 2 added allocation,
/// syscall and off-CPU events, kernel frames, sample flags, process cgroups,
/// system-wide targets and stack deltas against older snapshots; version 3
/// added syscall tallies (syscall stacks at one call in N); version 1
/// traces read as CPU-sample traces (`docs/format.md`, "Versions").
pub const VERSION: u16 = 3;

/// The oldest format version this crate reads.
pub const OLDEST_READABLE_VERSION: u16 = 1;

/// Size of the fixed file header, in bytes.
pub const FILE_HEADER_LEN: usize = 20;

/// Size of a block header, in bytes.
pub const BLOCK_HEADER_LEN: usize = 40;

/// Size of the footer of a cleanly finished trace, in bytes.
pub const FOOTER_LEN: usize = 16;

/// First four bytes of every block.
pub const BLOCK_MAGIC: [u8; 4] = *b"LBLK";

/// Last eight bytes of a cleanly finished trace.
pub const FOOTER_MAGIC: [u8; 8] = *b"LPTINDEX";

/// Upper bound on the encoded trace header, in bytes.
pub const MAX_HEADER_LEN: u32 = 1 << 20;

/// Upper bound on a block's decompressed size, in bytes. Readers reject
/// larger claims before allocating.
pub const MAX_BLOCK_RAW_LEN: u32 = 64 << 20;

/// Upper bound on a block's compressed size, in bytes.
pub const MAX_BLOCK_COMPRESSED_LEN: u32 = MAX_BLOCK_RAW_LEN + (1 << 20);

const _: () = assert!(FILE_HEADER_LEN == 8 + 2 + 2 + 4 + 4);
const _: () = assert!(BLOCK_HEADER_LEN == 4 + 1 + 1 + 2 + 4 + 4 + 4 + 8 + 8 + 4);
const _: () = assert!(FOOTER_LEN == 8 + FOOTER_MAGIC.len());
const _: () = assert!(MAX_BLOCK_COMPRESSED_LEN > MAX_BLOCK_RAW_LEN);

/// What a block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockKind {
    /// Records.
    Records = 0,
    /// The block index of a cleanly finished trace.
    Index = 1,
}

/// How a block's payload is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Codec {
    /// Stored as is.
    None = 0,
    /// One zstd frame.
    Zstd = 1,
}

/// The fixed file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// Format version.
    pub version: u16,
    /// Reserved flags, zero in version 1.
    pub flags: u16,
    /// Length of the bincode-encoded [`TraceHeader`](crate::TraceHeader) that follows.
    pub header_len: u32,
    /// CRC-32 (IEEE) of those bytes.
    pub header_crc: u32,
}

impl FileHeader {
    /// Encode as the first [`FILE_HEADER_LEN`] bytes of a trace.
    pub fn to_bytes(&self) -> [u8; FILE_HEADER_LEN] {
        let mut b = [0u8; FILE_HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.header_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.header_crc.to_le_bytes());
        b
    }

    /// Parse and validate magic and version.
    pub fn parse(data: &[u8]) -> Result<FileHeader, FormatError> {
        if data.len() < 8 || data[0..8] != MAGIC {
            return Err(FormatError::BadMagic {
                found: data[..data.len().min(8)].to_vec(),
                expected: MAGIC.to_vec(),
            });
        }
        if data.len() < FILE_HEADER_LEN {
            return Err(FormatError::TooShort {
                len: data.len() as u64,
                needed: FILE_HEADER_LEN as u64,
            });
        }
        let version = u16_at(data, 8);
        if version < OLDEST_READABLE_VERSION {
            return Err(FormatError::VersionTooOld {
                found: version,
                oldest: OLDEST_READABLE_VERSION,
                newest: VERSION,
            });
        }
        if version > VERSION {
            return Err(FormatError::VersionTooNew {
                found: version,
                newest: VERSION,
            });
        }
        let header = FileHeader {
            version,
            flags: u16_at(data, 10),
            header_len: u32_at(data, 12),
            header_crc: u32_at(data, 16),
        };
        if header.header_len > MAX_HEADER_LEN {
            return Err(FormatError::LengthOutOfBounds {
                what: "trace header",
                offset: FILE_HEADER_LEN as u64,
                len: header.header_len.into(),
                max: MAX_HEADER_LEN.into(),
            });
        }
        Ok(header)
    }
}

/// The fixed header in front of every block's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// What the block holds.
    pub kind: BlockKind,
    /// How the payload is compressed.
    pub codec: Codec,
    /// Length of the payload after decompression.
    pub raw_len: u32,
    /// Length of the payload as stored.
    pub compressed_len: u32,
    /// Number of records in the payload.
    pub record_count: u32,
    /// Smallest record time in the block, in ns (0 if none).
    pub first_time: u64,
    /// Largest record time in the block, in ns (0 if none).
    pub last_time: u64,
}

impl BlockHeader {
    /// Encode, with the CRC-32 over the first 36 header bytes and `payload`.
    pub fn to_bytes(&self, payload: &[u8]) -> [u8; BLOCK_HEADER_LEN] {
        let mut b = [0u8; BLOCK_HEADER_LEN];
        b[0..4].copy_from_slice(&BLOCK_MAGIC);
        b[4] = self.kind as u8;
        b[5] = self.codec as u8;
        // b[6..8]: reserved flags, zero.
        b[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.compressed_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.record_count.to_le_bytes());
        b[20..28].copy_from_slice(&self.first_time.to_le_bytes());
        b[28..36].copy_from_slice(&self.last_time.to_le_bytes());
        let crc = block_crc(&b[..36], payload);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parse the header at `data[offset..]` and check it against the bytes
    /// that follow. `data` is the whole file, so errors can name the offset.
    pub fn parse(data: &[u8], offset: u64) -> Result<BlockHeader, FormatError> {
        let start = offset as usize;
        let avail = data.len().saturating_sub(start);
        if avail < BLOCK_HEADER_LEN {
            return Err(FormatError::LengthOutOfBounds {
                what: "block header",
                offset,
                len: BLOCK_HEADER_LEN as u64,
                max: avail as u64,
            });
        }
        let h = &data[start..start + BLOCK_HEADER_LEN];
        if h[0..4] != BLOCK_MAGIC {
            return Err(FormatError::BadBlockMagic {
                offset,
                found: [h[0], h[1], h[2], h[3]],
            });
        }
        let kind = match h[4] {
            0 => BlockKind::Records,
            1 => BlockKind::Index,
            value => {
                return Err(FormatError::UnknownBlockField {
                    what: "kind",
                    offset,
                    value,
                })
            }
        };
        let codec = match h[5] {
            0 => Codec::None,
            1 => Codec::Zstd,
            value => {
                return Err(FormatError::UnknownBlockField {
                    what: "codec",
                    offset,
                    value,
                })
            }
        };
        let header = BlockHeader {
            kind,
            codec,
            raw_len: u32_at(h, 8),
            compressed_len: u32_at(h, 12),
            record_count: u32_at(h, 16),
            first_time: u64_at(h, 20),
            last_time: u64_at(h, 28),
        };
        if header.raw_len > MAX_BLOCK_RAW_LEN {
            return Err(FormatError::LengthOutOfBounds {
                what: "block raw length",
                offset,
                len: header.raw_len.into(),
                max: MAX_BLOCK_RAW_LEN.into(),
            });
        }
        let payload_avail = (avail - BLOCK_HEADER_LEN) as u64;
        let max = payload_avail.min(MAX_BLOCK_COMPRESSED_LEN.into());
        if u64::from(header.compressed_len) > max {
            return Err(FormatError::LengthOutOfBounds {
                what: "block payload",
                offset,
                len: header.compressed_len.into(),
                max,
            });
        }
        let payload = &data[start + BLOCK_HEADER_LEN..][..header.compressed_len as usize];
        let expected = u32_at(h, 36);
        let found = block_crc(&h[..36], payload);
        if found != expected {
            return Err(FormatError::BadChecksum {
                what: "block",
                offset,
                found,
                expected,
            });
        }
        Ok(header)
    }

    /// Bytes the block occupies in the file, header included.
    pub fn total_len(&self) -> u64 {
        BLOCK_HEADER_LEN as u64 + u64::from(self.compressed_len)
    }
}

/// Encode the footer of a cleanly finished trace.
pub fn footer_bytes(index_offset: u64) -> [u8; FOOTER_LEN] {
    let mut b = [0u8; FOOTER_LEN];
    b[0..8].copy_from_slice(&index_offset.to_le_bytes());
    b[8..16].copy_from_slice(&FOOTER_MAGIC);
    b
}

/// The index block offset named by the footer, if `data` ends with one.
pub fn parse_footer(data: &[u8]) -> Option<u64> {
    let tail = data.len().checked_sub(FOOTER_LEN)?;
    let f = &data[tail..];
    (f[8..16] == FOOTER_MAGIC).then(|| u64_at(f, 0))
}

fn block_crc(header: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header);
    h.update(payload);
    h.finalize()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_header_layout() {
        let h = FileHeader {
            version: 1,
            flags: 0,
            header_len: 0x0102,
            header_crc: 0xAABBCCDD,
        };
        #[rustfmt::skip]
        let expected: [u8; FILE_HEADER_LEN] = [
            0x89, b'L', b'P', b'T', b'\r', b'\n', 0x1a, b'\n', // magic
            0x01, 0x00,                                       // version 1
            0x00, 0x00,                                       // flags
            0x02, 0x01, 0x00, 0x00,                           // header_len 0x102
            0xDD, 0xCC, 0xBB, 0xAA,                           // header_crc
        ];
        assert_eq!(h.to_bytes(), expected);
        assert_eq!(FileHeader::parse(&expected).unwrap(), h);
    }

    #[test]
    fn version_checks() {
        let mut b = FileHeader {
            version: VERSION + 1,
            flags: 0,
            header_len: 0,
            header_crc: 0,
        }
        .to_bytes();
        assert!(matches!(
            FileHeader::parse(&b),
            Err(FormatError::VersionTooNew { found, .. }) if found == VERSION + 1
        ));
        for version in OLDEST_READABLE_VERSION..=VERSION {
            b[8..10].copy_from_slice(&version.to_le_bytes());
            assert_eq!(FileHeader::parse(&b).unwrap().version, version);
        }
        b[8] = 0;
        assert!(matches!(
            FileHeader::parse(&b),
            Err(FormatError::VersionTooOld { found: 0, .. })
        ));
    }

    #[test]
    fn header_len_is_bounded() {
        let b = FileHeader {
            version: 1,
            flags: 0,
            header_len: u32::MAX,
            header_crc: 0,
        }
        .to_bytes();
        assert!(matches!(
            FileHeader::parse(&b),
            Err(FormatError::LengthOutOfBounds {
                len: 0xFFFF_FFFF,
                ..
            })
        ));
    }

    #[test]
    fn block_header_layout_and_crc() {
        let h = BlockHeader {
            kind: BlockKind::Records,
            codec: Codec::None,
            raw_len: 3,
            compressed_len: 3,
            record_count: 1,
            first_time: 10,
            last_time: 20,
        };
        let mut file = h.to_bytes(b"abc").to_vec();
        file.extend_from_slice(b"abc");
        #[rustfmt::skip]
        let expected_prefix: [u8; 36] = [
            b'L', b'B', b'L', b'K',  // block magic
            0,                       // kind: records
            0,                       // codec: none
            0, 0,                    // reserved
            3, 0, 0, 0,              // raw_len
            3, 0, 0, 0,              // compressed_len
            1, 0, 0, 0,              // record_count
            10, 0, 0, 0, 0, 0, 0, 0, // first_time
            20, 0, 0, 0, 0, 0, 0, 0, // last_time
        ];
        assert_eq!(file[..36], expected_prefix);
        assert_eq!(BlockHeader::parse(&file, 0).unwrap(), h);
        file[41] ^= 1;
        assert!(matches!(
            BlockHeader::parse(&file, 0),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    #[test]
    fn block_payload_longer_than_file() {
        let h = BlockHeader {
            kind: BlockKind::Records,
            codec: Codec::None,
            raw_len: 100,
            compressed_len: 100,
            record_count: 1,
            first_time: 0,
            last_time: 0,
        };
        let file = h.to_bytes(&[0; 100]).to_vec();
        assert!(matches!(
            BlockHeader::parse(&file, 0),
            Err(FormatError::LengthOutOfBounds {
                len: 100,
                max: 0,
                ..
            })
        ));
    }

    #[test]
    fn footer_round_trip() {
        let mut data = vec![1, 2, 3];
        data.extend_from_slice(&footer_bytes(0x1234));
        assert_eq!(parse_footer(&data), Some(0x1234));
        assert_eq!(parse_footer(&data[..data.len() - 1]), None);
    }
}
