//! Reading a records block one record at a time, without copying stacks.
//!
//! A [`RawBlock`] is a decompressed records block. Its [`BlockCursor`]
//! yields records in order; a delta-encoded sample comes as a
//! [`SampleRef`], whose stack is a [`StackView`]: pieces of the block's
//! bytes (the literal runs of this and earlier snapshots of the thread),
//! never an expanded copy. The view also says which earlier sample the
//! snapshot was encoded against and from which AVMA up its bytes equal
//! that sample's: what an unwinder needs to reuse the earlier sample's
//! outer frames.

use crate::block::{bincode_options, MAX_BLOCK_DECODED_LEN, MAX_TRACKED_STACKS};
use crate::error::FormatError;
use crate::records::{Record, Regs, Sample, SampleDetail, SampleFlags, SampleKind, StackSnapshot};
use crate::stack::{decode_pieces, read_pieces, Piece, SegmentIn, Snap, WireStackIn, MAX_BASES};
use crate::types::{BlockOffset, Pid, Tid, Timestamp};
use bincode::Options;
use serde::Deserialize;
use std::collections::{HashMap, VecDeque};

/// A decompressed records block. Read it with [`records`](Self::records).
///
/// Its bytes are held in `B`: a `Vec` of its own from
/// [`TraceReader::raw_block`](crate::TraceReader::raw_block), or a buffer
/// the caller gave [`TraceReader::raw_block_in`](crate::TraceReader::raw_block_in)
/// (say, a part of one larger allocation holding many blocks).
#[derive(Debug)]
pub struct RawBlock<B = Vec<u8>> {
    pub(crate) offset: BlockOffset,
    pub(crate) version: u16,
    pub(crate) count: u32,
    pub(crate) bytes: B,
}

impl<B: AsRef<[u8]>> RawBlock<B> {
    /// Where the block is in its file.
    pub fn offset(&self) -> BlockOffset {
        self.offset
    }

    /// Records the block header announces.
    pub fn record_count(&self) -> u32 {
        self.count
    }

    /// A cursor over the block's records. With [`StackMode::LengthsOnly`]
    /// stack snapshots are checked but their bytes are not kept, which is
    /// all a pass over samples' metadata needs.
    pub fn records(&self, mode: StackMode) -> BlockCursor<'_> {
        let bytes = self.bytes.as_ref();
        BlockCursor {
            raw: bytes,
            rest: bytes,
            offset: self.offset,
            version: self.version,
            count: self.count,
            index: 0,
            keep: mode == StackMode::Bytes,
            decoded_len: bytes.len() as u64,
            threads: ThreadMap::default(),
            spare: Vec::new(),
            segments: Vec::new(),
            failed: false,
        }
    }
}

/// Per thread of a block, keyed by pid and tid, hashed with rustc's
/// `FxHasher` instead of SipHash, which cost 4.5 % of an analysis (two
/// lookups per sample). The keys only need spreading; a trace crafted to
/// collide slows a block down by at most the threads a block tracks
/// ([`MAX_TRACKED_STACKS`]).
type ThreadMap<V> = HashMap<(Pid, Tid), V, rustc_hash::FxBuildHasher>;

/// What a [`BlockCursor`] keeps of stack snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackMode {
    /// Check each snapshot's encoding, keep no bytes: views are empty, and
    /// samples' kernel callchains and kernel frames are skipped (empty).
    LengthsOnly,
    /// Keep each snapshot readable through its [`StackView`].
    Bytes,
}

/// One record read by a [`BlockCursor`].
#[derive(Debug)]
pub enum RecordRef<'c> {
    /// A record other than a delta-encoded sample (a sample stored whole,
    /// as no lrnprof writer does, comes as `Record::Sample`).
    Record(Record),
    /// A sample whose stack is delta-encoded.
    Sample(SampleRef<'c>),
}

/// A sample read by a [`BlockCursor`]: every field in `sample` but the
/// stack, which is `stack`.
#[derive(Debug)]
pub struct SampleRef<'c> {
    /// Index of the record in its block.
    pub index: u32,
    /// The sample; its `stack` field is left empty.
    pub sample: Sample,
    /// The sample's stack snapshot.
    pub stack: StackView<'c>,
}

/// The earlier sample a stack snapshot was delta-encoded against, and how
/// much of it is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackBase {
    /// Index in the block of that sample's record (same thread, earlier).
    pub record: u32,
    /// Every byte of the snapshot from this AVMA to its end equals that
    /// sample's byte at the same AVMA.
    pub unchanged_from: u64,
}

/// A stack snapshot as stored: readable by address without being copied
/// into one buffer.
#[derive(Debug, Clone, Copy)]
pub struct StackView<'c> {
    start: u64,
    len: u32,
    repr: Repr<'c>,
    base: Option<StackBase>,
}

#[derive(Debug, Clone, Copy)]
enum Repr<'c> {
    Empty,
    Whole(&'c [u8]),
    Pieces(&'c [Piece<'c>]),
}

impl<'c> StackView<'c> {
    /// A view of a whole snapshot.
    pub fn of_snapshot(s: &'c StackSnapshot) -> StackView<'c> {
        StackView {
            start: s.start,
            len: s.bytes.len() as u32,
            repr: Repr::Whole(&s.bytes),
            base: None,
        }
    }

    /// AVMA of the first byte.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Bytes in the snapshot.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the snapshot has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the AVMA of the last byte.
    pub fn end(&self) -> u64 {
        self.start.wrapping_add(self.len.into())
    }

    /// Whether the bytes can be read ([`StackMode::Bytes`]).
    pub fn has_bytes(&self) -> bool {
        !matches!(self.repr, Repr::Empty) || self.len == 0
    }

    /// The earlier sample this snapshot shares its outer bytes with, if
    /// any byte is shared.
    pub fn base(&self) -> Option<StackBase> {
        self.base
    }

    /// Copy the bytes at AVMAs `addr..addr + buf.len()` into `buf`;
    /// `false` (and `buf` unspecified) if they are not all in the snapshot
    /// or its bytes were not kept.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some(off) = addr.checked_sub(self.start) else {
            return false;
        };
        if off
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > u64::from(self.len))
        {
            return false;
        }
        match self.repr {
            Repr::Empty => return buf.is_empty(),
            Repr::Whole(b) => buf.copy_from_slice(&b[off as usize..off as usize + buf.len()]),
            Repr::Pieces(p) => read_pieces(p, off, buf),
        }
        true
    }

    /// A reader of words that remembers where its last read was, for the
    /// many nearby reads of an unwinder.
    pub fn reader(&self, little_endian: bool) -> StackReader<'c> {
        StackReader {
            view: *self,
            little_endian,
            hint: 0,
        }
    }

    /// The 8-byte word at `addr`, in the given byte order.
    pub fn read_u64(&self, addr: u64, little_endian: bool) -> Option<u64> {
        let word = |b: [u8; 8]| {
            if little_endian {
                u64::from_le_bytes(b)
            } else {
                u64::from_be_bytes(b)
            }
        };
        // The usual case, a word inside one piece (an unwinder reads many).
        if let Repr::Pieces(pieces) = self.repr {
            let off = addr.checked_sub(self.start)?;
            if off.checked_add(8)? > u64::from(self.len) {
                return None;
            }
            let i = pieces.partition_point(|p| u64::from(p.off) + p.bytes.len() as u64 <= off);
            let p = pieces.get(i)?;
            let at = (off - u64::from(p.off)) as usize;
            if let Some(b) = p.bytes.get(at..at + 8) {
                return b.try_into().ok().map(word);
            }
        }
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| word(b))
    }

    /// The snapshot as one buffer (empty bytes if they were not kept).
    pub fn to_snapshot(&self) -> StackSnapshot {
        let mut bytes = vec![0; self.len as usize];
        if !self.read(self.start, &mut bytes) {
            bytes.clear();
        }
        StackSnapshot {
            start: self.start,
            bytes,
        }
    }
}

/// Reads words of a [`StackView`], starting each search at the piece of
/// the previous read.
#[derive(Debug, Clone)]
pub struct StackReader<'c> {
    view: StackView<'c>,
    little_endian: bool,
    hint: usize,
}

impl StackReader<'_> {
    /// The 8-byte word at `addr`, as [`StackView::read_u64`].
    pub fn read_u64(&mut self, addr: u64) -> Option<u64> {
        if let Repr::Pieces(pieces) = self.view.repr {
            let off = addr.checked_sub(self.view.start)?;
            if off.checked_add(8)? > u64::from(self.view.len) {
                return None;
            }
            fn inside<'p>(p: &Piece<'p>, off: u64) -> Option<&'p [u8]> {
                let at = off.checked_sub(u64::from(p.off))?;
                p.bytes.get(at as usize..at as usize + 8)
            }
            // The last piece read, or the next one up.
            for i in [self.hint, self.hint + 1] {
                if let Some(b) = pieces.get(i).and_then(|p| inside(p, off)) {
                    self.hint = i;
                    return b.try_into().ok().map(|b| self.word(b));
                }
            }
            let i = pieces.partition_point(|p| u64::from(p.off) + p.bytes.len() as u64 <= off);
            if let Some(b) = pieces.get(i).and_then(|p| inside(p, off)) {
                self.hint = i;
                return b.try_into().ok().map(|b| self.word(b));
            }
        }
        self.view.read_u64(addr, self.little_endian)
    }

    fn word(&self, b: [u8; 8]) -> u64 {
        if self.little_endian {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        }
    }
}

/// Reads a [`RawBlock`]'s records in order.
///
/// A block that fails to decode yields one `Err` and then ends; records
/// read before the error are valid on their own, but a caller that treats
/// blocks as units should drop them.
#[derive(Debug)]
pub struct BlockCursor<'a> {
    raw: &'a [u8],
    rest: &'a [u8],
    offset: BlockOffset,
    version: u16,
    count: u32,
    index: u32,
    keep: bool,
    decoded_len: u64,
    /// Per thread, its last snapshots, oldest first.
    threads: ThreadMap<VecDeque<Snap<'a>>>,
    /// Pieces of the snapshot being decoded (an evicted snapshot's buffer).
    spare: Vec<Piece<'a>>,
    /// The segments of the last sample read, emptied, for the next one.
    segments: Vec<SegmentIn<'a>>,
    failed: bool,
}

impl<'a> BlockCursor<'a> {
    /// The next record, `None` after the last one or after an error.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Result<RecordRef<'_>, FormatError>> {
        if self.failed {
            return None;
        }
        if self.index == self.count {
            if !self.rest.is_empty() {
                self.failed = true;
                return Some(Err(FormatError::BadRecord {
                    offset: self.offset,
                    index: self.count,
                    message: format!("{} bytes left over after the last record", self.rest.len()),
                }));
            }
            return None;
        }
        let index = self.index;
        self.index += 1;
        // Cleared by `read_one` once the record is read.
        self.failed = true;
        Some(self.read_one(index))
    }

    fn read_one(&mut self, index: u32) -> Result<RecordRef<'_>, FormatError> {
        let offset = self.offset;
        let bad = |message: String| FormatError::BadRecord {
            offset,
            index,
            message,
        };
        let fast = if self.version == 1 {
            None
        } else {
            let segments = std::mem::take(&mut self.segments);
            crate::sample_in::read_sample(self.rest, self.keep, segments).map(|(w, len)| {
                self.rest = &self.rest[len..];
                w
            })
        };
        let options = bincode_options().with_limit(self.raw.len() as u64);
        let mut de = bincode::Deserializer::with_bincode_read(
            SliceRead {
                rest: &mut self.rest,
            },
            options,
        );
        let wire = if let Some(w) = fast {
            WireRecordIn::Sample(w)
        } else if self.version == 1 {
            match crate::v1::WireRecordV1In::deserialize(&mut de) {
                Ok(crate::v1::WireRecordV1In::Plain(r)) => WireRecordIn::Plain(r.into()),
                Ok(crate::v1::WireRecordV1In::Sample(w)) => WireRecordIn::Sample(w.into()),
                Err(e) => return Err(bad(e.to_string())),
            }
        } else if self.keep {
            WireRecordIn::deserialize(&mut de).map_err(|e| bad(e.to_string()))?
        } else {
            // A metadata pass: kernel stacks are skipped, not collected.
            match WireRecordIn::<Skipped>::deserialize(&mut de) {
                Ok(WireRecordIn::Plain(r)) => WireRecordIn::Plain(r),
                Ok(WireRecordIn::Sample(w)) => WireRecordIn::Sample(w.without_kernel_stacks()),
                Err(e) => return Err(bad(e.to_string())),
            }
        };
        let w = match wire {
            WireRecordIn::Plain(r) => {
                self.failed = false;
                return Ok(RecordRef::Record(r));
            }
            WireRecordIn::Sample(w) => w,
        };
        let key = (w.pid, w.tid);
        let keep = self.keep;
        let ring = self.threads.get(&key);
        let prev = ring.and_then(|r| {
            r.len()
                .checked_sub(usize::from(w.stack.base) + 1)
                .map(|i| &r[i])
        });
        let mut pieces = std::mem::take(&mut self.spare);
        let decoded = decode_pieces(&w.stack, prev, keep, &mut pieces);
        // The segments' buffer serves the next sample.
        let mut segments = w.stack.segments;
        segments.clear();
        self.segments = segments;
        let unchanged = decoded.map_err(|e| bad(e.to_string()))?;
        let base = prev.filter(|_| unchanged < w.stack.len).map(|p| StackBase {
            record: p.record,
            unchanged_from: w.stack.start.wrapping_add(unchanged.into()),
        });
        self.decoded_len += u64::from(w.stack.len);
        if self.decoded_len > MAX_BLOCK_DECODED_LEN {
            return Err(bad(format!(
                "block decodes to more than {MAX_BLOCK_DECODED_LEN} bytes"
            )));
        }
        if self.threads.len() >= MAX_TRACKED_STACKS && !self.threads.contains_key(&key) {
            // The writer forgot every thread at this point too.
            self.threads.clear();
        }
        let ring = self.threads.entry(key).or_default();
        if ring.len() >= MAX_BASES {
            if let Some(old) = ring.pop_front() {
                self.spare = old.pieces;
            }
        }
        ring.push_back(Snap {
            record: index,
            start: w.stack.start,
            len: w.stack.len,
            pieces,
        });
        self.failed = false;
        let snap = ring.back().expect("just pushed");
        let stack = StackView {
            start: snap.start,
            len: snap.len,
            repr: if keep {
                Repr::Pieces(&snap.pieces)
            } else {
                Repr::Empty
            },
            base,
        };
        Ok(RecordRef::Sample(SampleRef {
            index,
            sample: Sample {
                time: w.time,
                pid: w.pid,
                tid: w.tid,
                cpu: w.cpu,
                kind: w.kind,
                weight: w.weight,
                regs: w.regs,
                stack: StackSnapshot {
                    start: w.stack.start,
                    bytes: Vec::new(),
                },
                kernel_callchain: w.kernel_callchain,
                frames: w.frames,
                kernel_frames: w.kernel_frames,
                flags: w.flags,
                detail: w.detail,
            },
            stack,
        }))
    }
}

/// A record as a cursor reads it from a version-2 block.
#[derive(Deserialize)]
pub(crate) enum WireRecordIn<'a, K = Vec<u64>> {
    Plain(Record),
    #[serde(borrow)]
    Sample(WireSampleIn<'a, K>),
}

/// A list of addresses read past without being kept.
pub(crate) struct Skipped;

impl<'de> Deserialize<'de> for Skipped {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Skipped, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Skipped;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Skipped, A::Error> {
                while seq.next_element::<u64>()?.is_some() {}
                Ok(Skipped)
            }
        }
        d.deserialize_seq(Visit)
    }
}

impl<'a> WireSampleIn<'a, Skipped> {
    /// The sample with empty kernel callchain and kernel frames.
    pub(crate) fn without_kernel_stacks(self) -> WireSampleIn<'a> {
        WireSampleIn {
            time: self.time,
            pid: self.pid,
            tid: self.tid,
            cpu: self.cpu,
            kind: self.kind,
            weight: self.weight,
            regs: self.regs,
            stack: self.stack,
            kernel_callchain: Vec::new(),
            frames: self.frames,
            kernel_frames: Vec::new(),
            flags: self.flags,
            detail: self.detail,
        }
    }
}

/// A sample as stored, its literal stack bytes borrowed from the block.
/// Field order is part of the format (see `block::WireSample`). `K` holds
/// the kernel callchain and kernel frames.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) struct WireSampleIn<'a, K = Vec<u64>> {
    pub time: Timestamp,
    pub pid: Pid,
    pub tid: Tid,
    pub cpu: Option<u32>,
    pub kind: SampleKind,
    pub weight: u64,
    pub regs: Regs,
    #[serde(borrow)]
    pub stack: WireStackIn<'a>,
    pub kernel_callchain: K,
    pub frames: Vec<u64>,
    pub kernel_frames: K,
    pub flags: SampleFlags,
    pub detail: SampleDetail,
}

/// A bincode reader over a slice that lends its bytes (so literals are
/// borrowed, not copied) and leaves the unread rest in `rest`.
struct SliceRead<'a, 'r> {
    rest: &'r mut &'a [u8],
}

impl<'a> SliceRead<'a, '_> {
    fn take(&mut self, len: usize) -> bincode::Result<&'a [u8]> {
        if len > self.rest.len() {
            return Err(Box::new(bincode::ErrorKind::Io(eof())));
        }
        let (head, tail) = self.rest.split_at(len);
        *self.rest = tail;
        Ok(head)
    }
}

/// The error a short slice gives in `std::io::Read::read_exact`, so that
/// messages match those of reading from an `io::Read`.
fn eof() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "failed to fill whole buffer",
    )
}

impl std::io::Read for SliceRead<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.rest.len());
        buf[..n].copy_from_slice(&self.rest[..n]);
        *self.rest = &self.rest[n..];
        Ok(n)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        if buf.len() > self.rest.len() {
            *self.rest = &[];
            return Err(eof());
        }
        let n = buf.len();
        buf.copy_from_slice(&self.rest[..n]);
        *self.rest = &self.rest[n..];
        Ok(())
    }
}

impl<'a> bincode::BincodeRead<'a> for SliceRead<'a, '_> {
    fn forward_read_str<V>(&mut self, length: usize, visitor: V) -> bincode::Result<V::Value>
    where
        V: serde::de::Visitor<'a>,
    {
        let bytes = self.take(length)?;
        let s = std::str::from_utf8(bytes).map_err(bincode::ErrorKind::InvalidUtf8Encoding)?;
        visitor.visit_borrowed_str(s)
    }

    fn get_byte_buffer(&mut self, length: usize) -> bincode::Result<Vec<u8>> {
        self.take(length).map(<[u8]>::to_vec)
    }

    fn forward_read_bytes<V>(&mut self, length: usize, visitor: V) -> bincode::Result<V::Value>
    where
        V: serde::de::Visitor<'a>,
    {
        visitor.visit_borrowed_bytes(self.take(length)?)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{RegsX86_64, TraceHeader, TraceReader, TraceWriter, WriterOptions};

    /// A CPU sample of thread `tid` of process 1 with stack `bytes` at
    /// `start` (also for other modules' tests).
    pub(crate) fn sample(time: u64, tid: u32, start: u64, bytes: Vec<u8>) -> Record {
        Record::Sample(Sample {
            time: Timestamp(time),
            pid: Pid(1),
            tid: Tid(tid),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight: 1,
            regs: Regs::X86_64(RegsX86_64::default()),
            stack: StackSnapshot { start, bytes },
            kernel_callchain: vec![7],
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        })
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
            .collect()
    }

    /// Samples written with their stack bytes apart (`write_sample`) are
    /// stored exactly as samples holding them (`write`), in every block.
    #[test]
    fn stacks_written_apart_give_the_same_file() {
        let mut records = Vec::new();
        for i in 0..200u64 {
            let mut bytes = pattern(3000 + (i as usize % 7) * 64, 5);
            bytes[(i as usize * 37) % 3000] ^= i as u8;
            records.push(sample(i, 1 + (i % 3) as u32, 0x20000 - (i % 7) * 64, bytes));
        }
        let write = |apart: bool| {
            let mut file = Vec::new();
            let options = WriterOptions {
                block_size: 16 << 10,
                ..WriterOptions::default()
            };
            let mut w = TraceWriter::new(&mut file, &TraceHeader::example(), options).unwrap();
            for r in &records {
                if let (true, Record::Sample(s)) = (apart, r) {
                    let mut bare = s.clone();
                    let bytes = std::mem::take(&mut bare.stack.bytes);
                    w.write_sample(&bare, &bytes, None).unwrap();
                } else {
                    w.write(r).unwrap();
                }
            }
            w.finish().unwrap();
            file
        };
        let (whole, apart) = (write(false), write(true));
        assert_eq!(whole, apart);
        let reader = TraceReader::new(&whole[..]).unwrap();
        assert!(reader.blocks().len() > 2, "several blocks");
    }

    /// Thread 1 deepens its stack by 64 bytes, thread 2 interleaves, then
    /// thread 1 changes one word in the middle.
    #[test]
    fn views_read_like_snapshots_and_name_their_base() {
        let outer = pattern(4096, 3);
        let mut deeper = pattern(64, 9);
        deeper.extend_from_slice(&outer);
        let mut changed = deeper.clone();
        changed[64 + 2000] ^= 0xff;
        let records = vec![
            sample(1, 1, 0x10000, outer.clone()),
            sample(2, 2, 0x90000, pattern(100, 1)),
            sample(3, 1, 0x10000 - 64, deeper.clone()),
            sample(4, 1, 0x10000 - 64, changed.clone()),
        ];
        let mut file = Vec::new();
        let mut w =
            TraceWriter::new(&mut file, &TraceHeader::example(), WriterOptions::default()).unwrap();
        for r in &records {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let reader = TraceReader::new(&file[..]).unwrap();
        let raw = reader.raw_block(&reader.blocks()[0]).unwrap();
        let mut cursor = raw.records(StackMode::Bytes);
        let mut seen = Vec::new();
        while let Some(r) = cursor.next() {
            let RecordRef::Sample(s) = r.unwrap() else {
                panic!("only samples were written")
            };
            let Record::Sample(orig) = &records[s.index as usize] else {
                unreachable!()
            };
            assert_eq!(s.stack.to_snapshot(), orig.stack);
            assert_eq!(s.sample.kernel_callchain, vec![7]);
            let word = s.stack.read_u64(orig.stack.start + 8, true).unwrap();
            assert_eq!(word.to_le_bytes(), orig.stack.bytes[8..16]);
            assert_eq!(s.stack.read_u64(s.stack.end() - 4, true), None);
            seen.push((s.index, s.stack.base()));
        }
        assert_eq!(seen[0], (0, None));
        assert_eq!(seen[1], (1, None));
        // All of the outer 4096 bytes are thread 1's first snapshot's.
        assert_eq!(
            seen[2],
            (
                2,
                Some(StackBase {
                    record: 0,
                    unchanged_from: 0x10000
                })
            )
        );
        // Above the changed byte only.
        let (index, base) = seen[3];
        assert_eq!(index, 3);
        let base = base.unwrap();
        assert_eq!(base.record, 2);
        assert!(base.unchanged_from > 0x10000 + 2000 && base.unchanged_from <= 0x10000 + 2048);
        // Lengths only: the same records, no bytes.
        let mut cursor = raw.records(StackMode::LengthsOnly);
        let mut n = 0;
        while let Some(r) = cursor.next() {
            let RecordRef::Sample(s) = r.unwrap() else {
                unreachable!()
            };
            assert!(!s.stack.has_bytes());
            assert_eq!(s.stack.read_u64(s.stack.start(), true), None);
            n += 1;
        }
        assert_eq!(n, 4);
    }

    /// A block decompressed into a caller's buffer reads as one in a
    /// buffer of its own; a buffer of another length, or a payload that
    /// does not fill it, is refused.
    #[test]
    fn blocks_decompress_into_a_given_buffer() {
        let records: Vec<Record> = (0..300u64)
            .map(|i| {
                let mut bytes = pattern(2000, 4);
                bytes[(i as usize * 13) % 2000] ^= i as u8;
                sample(i, 1 + (i % 2) as u32, 0x40000, bytes)
            })
            .collect();
        let mut file = Vec::new();
        let options = WriterOptions {
            block_size: 8 << 10,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::new(&mut file, &TraceHeader::example(), options).unwrap();
        for r in &records {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let reader = TraceReader::new(&file[..]).unwrap();
        assert!(reader.blocks().len() > 1, "several blocks");
        let snapshots = |raw: &RawBlock<&mut [u8]>| {
            let mut cursor = raw.records(StackMode::Bytes);
            let mut out = Vec::new();
            while let Some(r) = cursor.next() {
                if let RecordRef::Sample(s) = r.unwrap() {
                    out.push((s.index, s.sample.time, s.stack.to_snapshot()));
                }
            }
            out
        };
        // Every block in one allocation, one after the other.
        let total: usize = reader
            .blocks()
            .iter()
            .map(|b| b.header.raw_len as usize)
            .sum();
        let mut arena = vec![0xa5u8; total];
        let mut rest = &mut arena[..];
        let mut read = 0;
        for b in reader.blocks() {
            let (buf, tail) = rest.split_at_mut(b.header.raw_len as usize);
            rest = tail;
            let own = reader.raw_block(b).unwrap();
            let mut own_buf = own.bytes.clone();
            let own = RawBlock {
                offset: own.offset,
                version: own.version,
                count: own.count,
                bytes: &mut own_buf[..],
            };
            let given = reader.raw_block_in(b, buf).unwrap();
            let seen = snapshots(&given);
            assert_eq!(seen, snapshots(&own));
            read += seen.len();
        }
        assert_eq!(read, records.len());
        let first = &reader.blocks()[0];
        let len = first.header.raw_len as usize;
        let mut short = vec![0u8; len - 1];
        assert!(reader.raw_block_in(first, &mut short[..]).is_err());
        let mut long = vec![0u8; len + 1];
        assert!(reader.raw_block_in(first, &mut long[..]).is_err());
        // A payload that decompresses to fewer bytes than its header says.
        let mut header = first.header;
        header.raw_len += 1;
        let start = first.offset.0 as usize + crate::raw::BLOCK_HEADER_LEN;
        let payload = &file[start..start + first.header.compressed_len as usize];
        assert!(matches!(
            crate::block::decompress_into(first.offset, &header, payload, &mut long[..]),
            Err(FormatError::RawLengthMismatch { .. })
        ));
    }
}
