//! Encoding records into blocks and decoding them back.

use crate::cursor::{RawBlock, RecordRef, StackMode};
use crate::error::FormatError;
use crate::raw::{BlockHeader, BlockKind, Codec, MAX_BLOCK_RAW_LEN};
use crate::records::{Record, Regs, Sample, SampleDetail, SampleFlags, SampleKind};
use crate::stack::{self, LatestStack, StackHint, StackRef, WireStack};
use crate::types::{BlockOffset, Pid, Tid, Timestamp};
use bincode::Options;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The bincode configuration of every record: varint integers, little endian.
pub(crate) fn bincode_options() -> impl Options + Copy {
    bincode::DefaultOptions::new()
        .with_varint_encoding()
        .with_little_endian()
}

/// The bincode configuration of the trace header: like records, with a limit.
pub(crate) fn bincode_header_options() -> impl Options + Copy {
    bincode_options().with_limit(crate::raw::MAX_HEADER_LEN.into())
}

/// Upper bound on the bytes a block's records occupy once decoded (stack
/// snapshots expanded). `Same` segments make a small block decode to much
/// more memory; writers cut blocks at a quarter of this, readers refuse more.
pub const MAX_BLOCK_DECODED_LEN: u64 = 256 << 20;

/// Writers start a new block once the decoded size reaches this.
pub(crate) const BLOCK_DECODED_TARGET: u64 = MAX_BLOCK_DECODED_LEN / 4;

/// Keep at most this many threads' previous snapshots per block, so a
/// recording of thousands of threads stays bounded in memory.
pub(crate) const MAX_TRACKED_STACKS: usize = 4096;

/// A record as it is stored in a block: samples carry delta-encoded stacks.
/// Variant order is part of the format.
#[derive(Serialize)]
enum WireRecordRef<'a> {
    Plain(&'a Record),
    Sample(&'a WireSample<'a>),
}

/// A sample as stored (see `cursor::WireSampleIn` for reading).
#[derive(Serialize)]
pub(crate) struct WireSample<'a> {
    pub time: Timestamp,
    pub pid: Pid,
    pub tid: Tid,
    pub cpu: Option<u32>,
    pub kind: SampleKind,
    pub weight: u64,
    pub regs: Regs,
    pub stack: WireStack<'a>,
    pub kernel_callchain: &'a [u64],
    pub frames: &'a [u64],
    pub kernel_frames: &'a [u64],
    pub flags: SampleFlags,
    pub detail: SampleDetail,
}

/// An encoded block: its header and its bytes as they go into the file.
#[derive(Debug, Clone)]
pub struct EncodedBlock {
    /// The block header.
    pub header: BlockHeader,
    /// Header bytes followed by the payload.
    pub bytes: Vec<u8>,
}

/// Accumulates records into one block.
///
/// Building (serializing, stack delta encoding) is cheap; [`finish`](Self::finish)
/// compresses and may run on another thread than the one producing records.
#[derive(Debug)]
pub struct BlockBuilder {
    raw: Vec<u8>,
    decoded_len: u64,
    count: u32,
    first_time: Option<u64>,
    last_time: u64,
    /// Each thread's latest snapshot in the block.
    prev_stacks: HashMap<(Pid, Tid), LatestStack>,
    /// Buffers of threads' bytes from earlier blocks, for the next.
    spare: Vec<LatestStack>,
    zstd: Zstd,
}

/// zstd's compression context and its level, kept from block to block: a
/// context made for each block allocated and cleared its tables (about a
/// megabyte at level 3) every time, fresh memory the kernel had to fault
/// in. The compressed bytes are the same.
#[derive(Default)]
struct Zstd(Option<(i32, zstd::bulk::Compressor<'static>)>);

impl Zstd {
    /// The context, set to `level`.
    fn at(&mut self, level: i32) -> Result<&mut zstd::bulk::Compressor<'static>, FormatError> {
        if self.0.as_ref().is_none_or(|(l, _)| *l != level) {
            self.0 = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        Ok(&mut self.0.as_mut().expect("just set").1)
    }
}

impl std::fmt::Debug for Zstd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Zstd")
            .field(&self.0.as_ref().map(|(l, _)| l))
            .finish()
    }
}

/// Threads' byte buffers kept from block to block at most: enough for a
/// block's worth of busy threads, dropped past that.
const MAX_SPARE_STACKS: usize = 64;

impl Default for BlockBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BlockBuilder {
    /// An empty block.
    pub fn new() -> BlockBuilder {
        BlockBuilder {
            raw: Vec::new(),
            decoded_len: 0,
            count: 0,
            first_time: None,
            last_time: 0,
            prev_stacks: HashMap::new(),
            spare: Vec::new(),
            zstd: Zstd::default(),
        }
    }

    /// Bytes of serialized records so far (before compression).
    pub fn raw_len(&self) -> usize {
        self.raw.len()
    }

    /// Bytes the records will occupy once decoded, stacks expanded: a
    /// block should be finished before this reaches a few tens of MiB.
    pub fn decoded_len(&self) -> u64 {
        self.decoded_len
    }

    /// Records so far.
    pub fn record_count(&self) -> u32 {
        self.count
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Append a record. Fails if it alone would exceed the block size limit;
    /// the caller should then start a new block (see [`TraceWriter`](crate::TraceWriter)).
    pub fn push(&mut self, record: &Record) -> Result<(), FormatError> {
        self.push_hinted(record, None)
    }

    /// [`push`](Self::push) with what the caller knows of a sample's stack
    /// (see [`StackHint`]): the same bytes in the block, without comparing
    /// the stack with the thread's previous one when the hint's base is
    /// that one.
    pub fn push_hinted(
        &mut self,
        record: &Record,
        hint: Option<&StackHint>,
    ) -> Result<(), FormatError> {
        match record {
            Record::Sample(s) => self.push_sample(s, &s.stack.bytes, hint),
            other => self.append(other.time(), 0, &WireRecordRef::Plain(other)),
        }
    }

    /// [`push_hinted`](Self::push_hinted) sample `s` with the stack bytes
    /// `stack` at `s.stack.start` (`s.stack.bytes` is not read): a caller
    /// that holds a stack's bytes elsewhere need not copy them into the
    /// sample. The block keeps no reference to them.
    pub fn push_sample(
        &mut self,
        s: &Sample,
        stack: &[u8],
        hint: Option<&StackHint>,
    ) -> Result<(), FormatError> {
        if stack.len() > stack::MAX_STACK_LEN as usize {
            return Err(FormatError::RecordTooLarge {
                len: stack.len() as u64,
                max: stack::MAX_STACK_LEN.into(),
            });
        }
        let new = StackRef {
            start: s.stack.start,
            bytes: stack,
        };
        let key = (s.pid, s.tid);
        let wire_stack = match self.prev_stacks.get(&key) {
            Some(latest) => latest.encode(new, hint),
            None => stack::encode(new, None, 0),
        };
        let wire = WireSample {
            time: s.time,
            pid: s.pid,
            tid: s.tid,
            cpu: s.cpu,
            kind: s.kind,
            weight: s.weight,
            regs: s.regs,
            stack: wire_stack,
            kernel_callchain: &s.kernel_callchain,
            frames: &s.frames,
            kernel_frames: &s.kernel_frames,
            flags: s.flags,
            detail: s.detail,
        };
        self.append(Some(s.time), stack.len(), &WireRecordRef::Sample(&wire))?;
        self.latest(key)
            .remember(new, &wire.stack, hint.map(|h| h.id));
        Ok(())
    }

    /// The thread's latest snapshot, bounding how many threads are kept
    /// (as a reader does).
    fn latest(&mut self, key: (Pid, Tid)) -> &mut LatestStack {
        if self.prev_stacks.len() >= MAX_TRACKED_STACKS && !self.prev_stacks.contains_key(&key) {
            self.forget_stacks();
        }
        let spare = &mut self.spare;
        self.prev_stacks
            .entry(key)
            .or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// Forget every thread's snapshot, keeping some of their buffers.
    fn forget_stacks(&mut self) {
        for (_, mut latest) in self.prev_stacks.drain() {
            if self.spare.len() < MAX_SPARE_STACKS {
                latest.forget();
                self.spare.push(latest);
            }
        }
    }

    /// Serialize `record` (at `time`, with `stack_len` bytes of stack
    /// snapshot) into the block, or leave the block as it was.
    fn append(
        &mut self,
        time: Option<Timestamp>,
        stack_len: usize,
        record: &WireRecordRef<'_>,
    ) -> Result<(), FormatError> {
        let before = self.raw.len();
        if let Err(e) = bincode_options().serialize_into(&mut self.raw, record) {
            self.raw.truncate(before);
            return Err(FormatError::Encode(e.to_string()));
        }
        if self.raw.len() > MAX_BLOCK_RAW_LEN as usize {
            let len = (self.raw.len() - before) as u64;
            self.raw.truncate(before);
            return Err(FormatError::RecordTooLarge {
                len,
                max: MAX_BLOCK_RAW_LEN.into(),
            });
        }
        self.count += 1;
        self.decoded_len += (self.raw.len() - before + stack_len) as u64;
        if let Some(Timestamp(t)) = time {
            self.first_time = Some(self.first_time.map_or(t, |f| f.min(t)));
            self.last_time = self.last_time.max(t);
        }
        Ok(())
    }

    /// Compress the block at zstd `level` and reset the builder for the next one.
    pub fn finish(&mut self, level: i32) -> Result<EncodedBlock, FormatError> {
        let block = encode_payload(
            BlockKind::Records,
            &self.raw,
            self.count,
            self.first_time.unwrap_or(0),
            self.last_time,
            self.zstd.at(level)?,
        )?;
        self.raw.clear();
        self.decoded_len = 0;
        self.count = 0;
        self.first_time = None;
        self.last_time = 0;
        self.forget_stacks();
        Ok(block)
    }
}

pub(crate) fn encode_payload(
    kind: BlockKind,
    raw: &[u8],
    count: u32,
    first_time: u64,
    last_time: u64,
    zstd: &mut zstd::bulk::Compressor<'_>,
) -> Result<EncodedBlock, FormatError> {
    let compressed = zstd.compress(raw)?;
    let header = BlockHeader {
        kind,
        codec: Codec::Zstd,
        raw_len: raw.len() as u32,
        compressed_len: compressed.len() as u32,
        record_count: count,
        first_time,
        last_time,
    };
    let mut bytes = Vec::with_capacity(crate::raw::BLOCK_HEADER_LEN + compressed.len());
    bytes.extend_from_slice(&header.to_bytes(&compressed));
    bytes.extend_from_slice(&compressed);
    Ok(EncodedBlock { header, bytes })
}

/// Decompress a block payload, refusing to produce more than the header's raw length.
pub(crate) fn decompress(
    offset: BlockOffset,
    header: &BlockHeader,
    payload: &[u8],
) -> Result<Vec<u8>, FormatError> {
    let raw = match header.codec {
        Codec::None => payload.to_vec(),
        Codec::Zstd => zstd::bulk::decompress(payload, header.raw_len as usize)
            .map_err(|e| zstd_error(offset, e))?,
    };
    check_raw_len(offset, header, raw.len())?;
    Ok(raw)
}

fn zstd_error(offset: BlockOffset, e: std::io::Error) -> FormatError {
    FormatError::Decompress {
        offset,
        message: e.to_string(),
    }
}

/// Refuse a block that decompressed to `found` bytes, not its header's.
fn check_raw_len(
    offset: BlockOffset,
    header: &BlockHeader,
    found: usize,
) -> Result<(), FormatError> {
    if found != header.raw_len as usize {
        return Err(FormatError::RawLengthMismatch {
            offset,
            found: found as u64,
            expected: header.raw_len.into(),
        });
    }
    Ok(())
}

/// Decompress a block payload into `out`, which must be exactly the
/// header's raw length: a payload that decompresses to more or fewer
/// bytes is refused, as by [`decompress`].
pub(crate) fn decompress_into(
    offset: BlockOffset,
    header: &BlockHeader,
    payload: &[u8],
    out: &mut [u8],
) -> Result<(), FormatError> {
    if out.len() != header.raw_len as usize {
        return Err(FormatError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a buffer of {} bytes for block at offset {}, which decompresses to {}",
                out.len(),
                offset.0,
                header.raw_len
            ),
        )));
    }
    let found = match header.codec {
        Codec::None => {
            if let Some(out) = out.get_mut(..payload.len()) {
                out.copy_from_slice(payload);
            }
            payload.len()
        }
        Codec::Zstd => {
            zstd::bulk::decompress_to_buffer(payload, out).map_err(|e| zstd_error(offset, e))?
        }
    };
    check_raw_len(offset, header, found)
}

/// Decode the records of a decompressed records block, stacks expanded.
pub(crate) fn decode_records(raw: &RawBlock) -> Result<Vec<Record>, FormatError> {
    // Every record takes at least one byte, so the length bounds the count.
    let mut records = Vec::with_capacity((raw.count as usize).min(raw.bytes.len()));
    let mut cursor = raw.records(StackMode::Bytes);
    while let Some(r) = cursor.next() {
        records.push(match r? {
            RecordRef::Record(r) => r,
            RecordRef::Sample(s) => Record::Sample(Sample {
                stack: s.stack.to_snapshot(),
                ..s.sample
            }),
        });
    }
    Ok(records)
}

/// One entry of the index block of a cleanly finished trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexEntry {
    pub offset: u64,
    pub record_count: u32,
    pub first_time: u64,
    pub last_time: u64,
}

pub(crate) fn encode_index(
    entries: &[IndexEntry],
    level: i32,
) -> Result<EncodedBlock, FormatError> {
    let raw = bincode_options()
        .serialize(entries)
        .map_err(|e| FormatError::Encode(e.to_string()))?;
    let mut zstd = zstd::bulk::Compressor::new(level)?;
    encode_payload(
        BlockKind::Index,
        &raw,
        entries.len() as u32,
        0,
        0,
        &mut zstd,
    )
}

pub(crate) fn decode_index(raw: &[u8]) -> Result<Vec<IndexEntry>, String> {
    bincode_options()
        .with_limit(raw.len() as u64)
        .deserialize(raw)
        .map_err(|e| e.to_string())
}
