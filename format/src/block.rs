//! Encoding records into blocks and decoding them back.

use crate::cursor::{RawBlock, RecordRef, StackMode};
use crate::error::FormatError;
use crate::raw::{BlockHeader, BlockKind, Codec, MAX_BLOCK_RAW_LEN};
use crate::records::{Record, Regs, Sample, SampleDetail, SampleFlags, SampleKind};
use crate::stack::{self, RecentStacks, StackHint, WireStack};
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
    prev_stacks: HashMap<(Pid, Tid), RecentStacks>,
    /// Buffers of snapshots no longer a base of any delta, for the
    /// caller's next stacks ([`take_spare_stack`](Self::take_spare_stack)).
    spare: Vec<Vec<u8>>,
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

/// Spare stack buffers kept at most: enough for a block's worth of busy
/// threads, dropped past that.
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
        self.append(record, None)?;
        if let Record::Sample(s) = record {
            self.recent(s.pid, s.tid)
                .push(s.stack.start, &s.stack.bytes);
        }
        Ok(())
    }

    /// [`push`](Self::push), taking a sample's stack bytes out of `record`
    /// (left with an empty stack) as the base of the thread's next deltas
    /// instead of copying them. On failure `record` is as it was.
    pub fn push_taking_stack(&mut self, record: &mut Record) -> Result<(), FormatError> {
        self.push_taking_stack_hinted(record, None)
    }

    /// [`push_taking_stack`](Self::push_taking_stack) with what the caller
    /// knows of a sample's stack (see [`StackHint`]): the same bytes in the
    /// block, without comparing the stack with the thread's previous one
    /// when the hint's base is that one.
    pub fn push_taking_stack_hinted(
        &mut self,
        record: &mut Record,
        hint: Option<&StackHint>,
    ) -> Result<(), FormatError> {
        self.append(record, hint)?;
        if let Record::Sample(s) = record {
            let stack = std::mem::take(&mut s.stack);
            let evicted = self
                .recent(s.pid, s.tid)
                .push_owned(stack, hint.map(|h| h.id));
            if let Some(bytes) = evicted {
                keep_spare(&mut self.spare, bytes);
            }
        }
        Ok(())
    }

    /// The buffer of a stack snapshot the builder no longer needs (empty,
    /// its capacity kept), if it has one: a caller that hands stacks over
    /// with [`push_taking_stack`](Self::push_taking_stack) can fill it
    /// instead of allocating a new one.
    pub fn take_spare_stack(&mut self) -> Option<Vec<u8>> {
        self.spare.pop()
    }

    /// The thread's recent snapshots, bounding how many threads are kept.
    fn recent(&mut self, pid: Pid, tid: Tid) -> &mut RecentStacks {
        let key = (pid, tid);
        if self.prev_stacks.len() >= MAX_TRACKED_STACKS && !self.prev_stacks.contains_key(&key) {
            self.prev_stacks.clear();
        }
        self.prev_stacks.entry(key).or_default()
    }

    /// Serialize a record into the block; its stack, if any, is not yet
    /// remembered for later deltas.
    fn append(&mut self, record: &Record, hint: Option<&StackHint>) -> Result<(), FormatError> {
        let before = self.raw.len();
        let result = match record {
            Record::Sample(s) => self.push_sample(s, hint),
            other => bincode_options()
                .serialize_into(&mut self.raw, &WireRecordRef::Plain(other))
                .map_err(|e| FormatError::Encode(e.to_string())),
        };
        if let Err(e) = result {
            self.raw.truncate(before);
            return Err(e);
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
        self.decoded_len += (self.raw.len() - before) as u64;
        if let Record::Sample(s) = record {
            self.decoded_len += s.stack.bytes.len() as u64;
        }
        if let Some(Timestamp(t)) = record.time() {
            self.first_time = Some(self.first_time.map_or(t, |f| f.min(t)));
            self.last_time = self.last_time.max(t);
        }
        Ok(())
    }

    fn push_sample(&mut self, s: &Sample, hint: Option<&StackHint>) -> Result<(), FormatError> {
        if s.stack.bytes.len() > stack::MAX_STACK_LEN as usize {
            return Err(FormatError::RecordTooLarge {
                len: s.stack.bytes.len() as u64,
                max: stack::MAX_STACK_LEN.into(),
            });
        }
        let key = (s.pid, s.tid);
        let wire_stack = match self.prev_stacks.get(&key) {
            Some(recent) => stack::encode_best(&s.stack, recent, hint),
            None => stack::encode(&s.stack, None, 0),
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
        bincode_options()
            .serialize_into(&mut self.raw, &WireRecordRef::Sample(&wire))
            .map_err(|e| FormatError::Encode(e.to_string()))
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
        for (_, recent) in self.prev_stacks.drain() {
            for bytes in recent.into_buffers() {
                keep_spare(&mut self.spare, bytes);
            }
        }
        Ok(block)
    }
}

/// Keep `bytes`, a snapshot's buffer, in `spare` unless enough are kept.
fn keep_spare(spare: &mut Vec<Vec<u8>>, mut bytes: Vec<u8>) {
    if spare.len() < MAX_SPARE_STACKS && bytes.capacity() > 0 {
        bytes.clear();
        spare.push(bytes);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::MAX_BASES;

    fn sample(tid: u32, i: u64) -> Record {
        let mut bytes = vec![7u8; 4096];
        bytes[(i as usize * 8) % 4096] = i as u8;
        crate::cursor::tests::sample(1000 + i, tid, 0x7000_0000, bytes)
    }

    /// A snapshot's buffer comes back once no later delta can refer to it:
    /// when it falls out of its thread's recent snapshots, and when the
    /// block is finished; never while it is still a base.
    #[test]
    fn stack_buffers_come_back_once_no_delta_needs_them() {
        let mut b = BlockBuilder::new();
        for i in 0..MAX_BASES as u64 {
            b.push_taking_stack(&mut sample(1, i)).unwrap();
            assert!(b.take_spare_stack().is_none(), "still a base");
        }
        b.push_taking_stack(&mut sample(1, 99)).unwrap();
        let spare = b.take_spare_stack().expect("the oldest fell out");
        assert!(spare.is_empty() && spare.capacity() >= 4096);
        assert!(b.take_spare_stack().is_none());
        b.push_taking_stack(&mut sample(2, 0)).unwrap();
        b.finish(1).unwrap();
        let mut back = 0;
        while let Some(s) = b.take_spare_stack() {
            assert!(s.is_empty() && s.capacity() >= 4096);
            back += 1;
        }
        assert_eq!(back, MAX_BASES + 1);
    }

    /// Samples whose stacks reuse the spare buffers encode as samples with
    /// freshly allocated stacks do.
    #[test]
    fn reused_buffers_change_no_byte_of_the_block() {
        let records: Vec<Record> = (0..40).map(|i| sample(1 + (i % 3) as u32, i)).collect();
        let mut fresh = BlockBuilder::new();
        let mut reusing = BlockBuilder::new();
        for r in &records {
            fresh.push_taking_stack(&mut r.clone()).unwrap();
            let mut r = r.clone();
            if let (Record::Sample(s), Some(mut buf)) = (&mut r, reusing.take_spare_stack()) {
                buf.extend_from_slice(&s.stack.bytes);
                s.stack.bytes = buf;
            }
            reusing.push_taking_stack(&mut r).unwrap();
        }
        assert_eq!(
            fresh.finish(1).unwrap().bytes,
            reusing.finish(1).unwrap().bytes
        );
    }
}
