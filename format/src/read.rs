//! Trace reader: index or forward scan, sequential and parallel decoding.

use crate::block::{decode_index, decode_records, decompress, decompress_into, IndexEntry};
use crate::cursor::RawBlock;
use crate::error::FormatError;
use crate::raw::{
    parse_footer, BlockHeader, BlockKind, FileHeader, BLOCK_HEADER_LEN, BLOCK_MAGIC,
    FILE_HEADER_LEN, FOOTER_LEN,
};
use crate::records::Record;
use crate::types::{BlockOffset, TraceHeader};
use bincode::Options;
use rayon::prelude::*;
use std::path::Path;

/// Where a records block is and what its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    /// Offset of the block header in the file.
    pub offset: BlockOffset,
    /// The block header.
    pub header: BlockHeader,
}

/// Bytes the reader could not use, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRange {
    /// Offset of the first unusable byte.
    pub offset: u64,
    /// Number of unusable bytes.
    pub len: u64,
    /// Why they were not usable.
    pub reason: String,
}

/// What the reader found about the file's integrity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Whether the trace ends with a valid index and footer, i.e. the writer
    /// finished cleanly.
    pub finished: bool,
    /// Corrupt ranges skipped in the middle, and a cut-off tail.
    pub skipped: Vec<SkippedRange>,
}

impl ReadReport {
    /// Total bytes that could not be used.
    pub fn lost_bytes(&self) -> u64 {
        self.skipped.iter().map(|s| s.len).sum()
    }
}

/// Reads a trace held in memory.
///
/// Opening validates the file header and locates every whole, checksummed
/// records block: through the index of a cleanly finished trace, or by a
/// forward scan of one that was cut short (recorder killed, disk full).
/// Damaged ranges are skipped and listed in [`report`](Self::report).
#[derive(Debug)]
pub struct TraceReader<D> {
    data: D,
    version: u16,
    header: TraceHeader,
    blocks: Vec<BlockInfo>,
    report: ReadReport,
}

impl TraceReader<Vec<u8>> {
    /// Read the file at `path` into memory and open it.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceReader<Vec<u8>>, FormatError> {
        TraceReader::new(std::fs::read(path)?)
    }
}

impl<D: AsRef<[u8]>> TraceReader<D> {
    /// Open a trace from its bytes.
    pub fn new(data: D) -> Result<TraceReader<D>, FormatError> {
        let bytes = data.as_ref();
        let fixed = FileHeader::parse(bytes)?;
        let header_end = FILE_HEADER_LEN as u64 + u64::from(fixed.header_len);
        if header_end > bytes.len() as u64 {
            return Err(FormatError::LengthOutOfBounds {
                what: "trace header",
                offset: FILE_HEADER_LEN as u64,
                len: fixed.header_len.into(),
                max: (bytes.len() - FILE_HEADER_LEN) as u64,
            });
        }
        let encoded = &bytes[FILE_HEADER_LEN..header_end as usize];
        let found = crc32fast::hash(encoded);
        if found != fixed.header_crc {
            return Err(FormatError::BadChecksum {
                what: "trace header",
                offset: FILE_HEADER_LEN as u64,
                found,
                expected: fixed.header_crc,
            });
        }
        let header: TraceHeader = if fixed.version == 1 {
            crate::block::bincode_header_options()
                .deserialize::<crate::v1::TraceHeaderV1>(encoded)
                .map(TraceHeader::from)
        } else {
            crate::block::bincode_header_options().deserialize(encoded)
        }
        .map_err(|e| FormatError::BadHeader(e.to_string()))?;
        let (blocks, report) =
            read_index(bytes, header_end).unwrap_or_else(|| scan(bytes, header_end));
        Ok(TraceReader {
            data,
            version: fixed.version,
            header,
            blocks,
            report,
        })
    }

    /// The trace header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The format version of the file.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Every whole records block, in file order.
    pub fn blocks(&self) -> &[BlockInfo] {
        &self.blocks
    }

    /// Whether the trace was finished cleanly, and what was lost if not.
    pub fn report(&self) -> &ReadReport {
        &self.report
    }

    /// The trace's bytes, as given to [`new`](Self::new).
    pub fn data(&self) -> &D {
        &self.data
    }

    /// Total size of the trace, in bytes.
    pub fn len(&self) -> u64 {
        self.data.as_ref().len() as u64
    }

    /// Whether the trace has no bytes (never true for an opened trace).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decompress and decode one block.
    pub fn decode_block(&self, block: &BlockInfo) -> Result<Vec<Record>, FormatError> {
        decode_records(&self.raw_block(block)?)
    }

    /// Decompress one block, to read its records with
    /// [`RawBlock::records`] (stacks as views, not copies).
    pub fn raw_block(&self, block: &BlockInfo) -> Result<RawBlock, FormatError> {
        let start = block.offset.0 as usize + BLOCK_HEADER_LEN;
        let payload = &self.data.as_ref()[start..start + block.header.compressed_len as usize];
        Ok(RawBlock {
            offset: block.offset,
            version: self.version,
            count: block.header.record_count,
            bytes: decompress(block.offset, &block.header, payload)?,
        })
    }

    /// [`raw_block`](Self::raw_block), decompressing into `buf`, which
    /// must be exactly as long as the block's raw length
    /// (`block.header.raw_len`); the block holds `buf` and reads from it.
    /// For a caller that places many blocks in one allocation.
    pub fn raw_block_in<B: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        block: &BlockInfo,
        mut buf: B,
    ) -> Result<RawBlock<B>, FormatError> {
        let start = block.offset.0 as usize + BLOCK_HEADER_LEN;
        let payload = &self.data.as_ref()[start..start + block.header.compressed_len as usize];
        decompress_into(block.offset, &block.header, payload, buf.as_mut())?;
        Ok(RawBlock {
            offset: block.offset,
            version: self.version,
            count: block.header.record_count,
            bytes: buf,
        })
    }

    /// All records in file order. A block that fails to decode yields one
    /// `Err` and iteration goes on with the next block.
    pub fn records(&self) -> impl Iterator<Item = Result<Record, FormatError>> + '_ {
        self.blocks
            .iter()
            .flat_map(move |b| match self.decode_block(b) {
                Ok(records) => records.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            })
    }
}

impl<D: AsRef<[u8]> + Sync> TraceReader<D> {
    /// Decode every block in parallel on the current rayon pool, in file order.
    pub fn par_decode_blocks(
        &self,
    ) -> impl IndexedParallelIterator<Item = (BlockInfo, Result<Vec<Record>, FormatError>)> + '_
    {
        self.blocks
            .par_iter()
            .map(move |b| (*b, self.decode_block(b)))
    }
}

/// Locate blocks through the footer and index. `None` if the trace has no
/// valid footer or index; the caller then scans.
fn read_index(bytes: &[u8], body_start: u64) -> Option<(Vec<BlockInfo>, ReadReport)> {
    let index_offset = parse_footer(bytes)?;
    if index_offset < body_start || index_offset > (bytes.len() - FOOTER_LEN) as u64 {
        return None;
    }
    let header = BlockHeader::parse(bytes, index_offset).ok()?;
    if header.kind != BlockKind::Index
        || index_offset + header.total_len() != (bytes.len() - FOOTER_LEN) as u64
    {
        return None;
    }
    let payload =
        &bytes[index_offset as usize + BLOCK_HEADER_LEN..][..header.compressed_len as usize];
    let raw = decompress(BlockOffset(index_offset), &header, payload).ok()?;
    let entries: Vec<IndexEntry> = decode_index(&raw).ok()?;
    let mut blocks = Vec::with_capacity(entries.len());
    let mut expected = body_start;
    for e in entries {
        // The index must describe the body exactly; anything else means
        // damage, and the forward scan will say where.
        if e.offset != expected {
            return None;
        }
        let h = BlockHeader::parse(&bytes[..index_offset as usize], e.offset).ok()?;
        if h.kind != BlockKind::Records || h.record_count != e.record_count {
            return None;
        }
        expected += h.total_len();
        blocks.push(BlockInfo {
            offset: BlockOffset(e.offset),
            header: h,
        });
    }
    if expected != index_offset {
        return None;
    }
    Some((
        blocks,
        ReadReport {
            finished: true,
            skipped: Vec::new(),
        },
    ))
}

/// Walk the body block by block; on damage, resynchronize at the next valid
/// block header.
fn scan(bytes: &[u8], body_start: u64) -> (Vec<BlockInfo>, ReadReport) {
    let len = bytes.len() as u64;
    let mut blocks = Vec::new();
    let mut report = ReadReport::default();
    let mut pos = body_start;
    while pos < len {
        match BlockHeader::parse(bytes, pos) {
            Ok(h) => {
                match h.kind {
                    BlockKind::Records => blocks.push(BlockInfo {
                        offset: BlockOffset(pos),
                        header: h,
                    }),
                    BlockKind::Index => {
                        // An index followed by a footer is a clean end even if
                        // the index did not match (damage was found above).
                        let end = pos + h.total_len();
                        if end + FOOTER_LEN as u64 == len && parse_footer(bytes) == Some(pos) {
                            report.finished = report.skipped.is_empty();
                            return (blocks, report);
                        }
                    }
                }
                pos += h.total_len();
            }
            Err(e) => {
                let next = find_next_block(bytes, pos + 1);
                let end = next.unwrap_or(len);
                report.skipped.push(SkippedRange {
                    offset: pos,
                    len: end - pos,
                    reason: if next.is_none() && end - pos < BLOCK_HEADER_LEN as u64 {
                        format!("trace cut off inside a block header ({e})")
                    } else if next.is_none() {
                        format!("trace cut off or damaged at its end: {e}")
                    } else {
                        e.to_string()
                    },
                });
                pos = end;
            }
        }
    }
    (blocks, report)
}

fn find_next_block(bytes: &[u8], from: u64) -> Option<u64> {
    let mut at = from as usize;
    while at + BLOCK_HEADER_LEN <= bytes.len() {
        let rel = bytes[at..].windows(4).position(|w| w == BLOCK_MAGIC)?;
        at += rel;
        if BlockHeader::parse(bytes, at as u64).is_ok() {
            return Some(at as u64);
        }
        at += 1;
    }
    None
}
