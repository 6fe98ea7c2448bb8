//! Stack snapshot delta encoding.
//!
//! Consecutive samples of one thread share most of their stack: the frames
//! near the thread's root do not change while the leaf frames come and go. A
//! snapshot is stored as segments in address order, each either a literal run
//! of bytes or a run "the same as the previous snapshot of this thread, at the
//! same addresses". Since version 2 the "previous snapshot" may be any of
//! the thread's last [`MAX_BASES`] snapshots (`base` 0 the latest); readers
//! accept all of them, and this crate's writer refers to the latest only
//! (see [`LatestStack`]). Previous snapshots are only looked up within the
//! same block, so every block still decodes on its own.

use crate::by_address::ByAddress;
use serde::{Deserialize, Serialize};

/// Shortest run of equal bytes worth a `Same` segment: shorter runs cost more
/// to describe than to repeat.
pub const MIN_SAME_RUN: usize = 16;

/// Upper bound on one stack snapshot, in bytes. Recorders copy far less
/// (Linux caps a copy just under 64 KiB); readers refuse larger claims.
pub const MAX_STACK_LEN: u32 = 8 << 20;

/// How many recent snapshots of a thread a `base` can name.
pub const MAX_BASES: usize = 4;

/// One piece of an encoded snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) enum Segment<'a> {
    /// The next `n` bytes equal the previous snapshot's bytes at the same AVMAs.
    Same(u32),
    /// The next bytes, stored.
    Literal(#[serde(with = "serde_bytes")] &'a [u8]),
}

/// A snapshot as stored inside a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct WireStack<'a> {
    /// AVMA of the first byte.
    pub start: u64,
    /// Total bytes.
    pub len: u32,
    /// Which of the thread's recent snapshots `Same` segments refer to: 0
    /// the latest (always 0 in version 1, which has no such field).
    pub base: u8,
    /// The bytes, in address order.
    pub segments: Vec<Segment<'a>>,
}

/// Why an encoded snapshot cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StackDecodeError {
    /// A `Same` segment but no such previous snapshot of that thread in the block.
    NoPrevious,
    /// `base` is not below [`MAX_BASES`].
    BadBase { base: u8 },
    /// A `Same` segment reaching outside the previous snapshot.
    SameOutOfRange { addr: u64, len: u32 },
    /// The segments do not add up to `len`.
    LengthMismatch { expected: u32, found: u64 },
    /// `len` is over [`MAX_STACK_LEN`].
    TooLong { len: u32 },
}

impl std::fmt::Display for StackDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StackDecodeError::NoPrevious => {
                f.write_str("stack refers to a previous snapshot that the block does not have")
            }
            StackDecodeError::BadBase { base } => {
                write!(
                    f,
                    "stack refers to snapshot {base}, beyond the {MAX_BASES} kept"
                )
            }
            StackDecodeError::SameOutOfRange { addr, len } => write!(
                f,
                "stack reuses {len} bytes at {addr:#x}, outside the previous snapshot"
            ),
            StackDecodeError::LengthMismatch { expected, found } => {
                write!(f, "stack segments hold {found} bytes, expected {expected}")
            }
            StackDecodeError::TooLong { len } => {
                write!(
                    f,
                    "stack of {len} bytes exceeds the limit of {MAX_STACK_LEN}"
                )
            }
        }
    }
}

/// A snapshot's bytes at `start`, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StackRef<'a> {
    pub start: u64,
    pub bytes: &'a [u8],
}

impl StackRef<'_> {
    /// AVMA one past the last byte.
    fn end(&self) -> u64 {
        self.start.wrapping_add(self.bytes.len() as u64)
    }
}

/// Encode `new` against `prev`, the thread's recent snapshot number `base`
/// (0 the latest).
pub(crate) fn encode<'a>(new: StackRef<'a>, prev: Option<StackRef<'_>>, base: u8) -> WireStack<'a> {
    let bytes = new.bytes;
    let mut segments = Vec::new();
    let mut literal_from = 0usize;
    if let Some(prev) = prev {
        let overlap_start = new.start.max(prev.start);
        let overlap_end = new.end().min(prev.end());
        if overlap_start < overlap_end {
            // The overlap in `new` and the same AVMAs in `prev`.
            let a = (overlap_start - new.start) as usize;
            let b = (overlap_end - new.start) as usize;
            let p = (overlap_start - prev.start) as usize;
            same_runs(&bytes[a..b], &prev.bytes[p..p + (b - a)], |from, len| {
                let (from, to) = (a + from, a + from + len);
                if literal_from < from {
                    segments.push(Segment::Literal(&bytes[literal_from..from]));
                }
                segments.push(Segment::Same(len as u32));
                literal_from = to;
            });
        }
    }
    if literal_from < bytes.len() {
        segments.push(Segment::Literal(&bytes[literal_from..]));
    }
    WireStack {
        start: new.start,
        len: bytes.len() as u32,
        base: if prev.is_some() { base } else { 0 },
        segments,
    }
}

/// What the producer of a snapshot already knows of it, so that the block
/// builder need not compare it with the thread's previous snapshot: the
/// recorder compares each stack copy with what the thread's earlier copies
/// held anyway (to find the return addresses that are new), and hands on
/// the equal runs it found. A hint only saves work: the encoding is the
/// one a comparison gives, and a hint that does not fit is ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackHint {
    /// Names this snapshot for a later hint's `base`: a number given to no
    /// other snapshot written through the same writer.
    pub id: u64,
    /// The snapshot (its hint's `id`) the runs were found against. They
    /// are used only if it is the thread's latest snapshot in the block.
    pub base: Option<u64>,
    /// `(offset, length)` of runs of this snapshot's bytes, in order and
    /// not overlapping, that equal `base`'s bytes at the same addresses
    /// wherever `base` has bytes (outside its range they say nothing).
    /// Given the runs [`same_runs`] finds (against bytes that match `base`
    /// where it reaches), the trace gets the bytes a comparison gives.
    pub runs: Vec<(u32, u32)>,
}

/// Encode `new` against `prev` (the thread's latest snapshot) from `runs`
/// of `new` known to equal `prev` at the same AVMAs within `prev`'s range
/// (see [`StackHint::runs`]), without comparing; `None` if the runs are
/// out of order or out of `new`.
fn encode_from_runs<'a>(
    new: StackRef<'a>,
    prev: StackRef<'_>,
    runs: &[(u32, u32)],
) -> Option<WireStack<'a>> {
    let bytes = new.bytes;
    let overlap_start = new.start.max(prev.start);
    let overlap_end = new.end().min(prev.end());
    let (a, b) = if overlap_start < overlap_end {
        (
            (overlap_start - new.start) as usize,
            (overlap_end - new.start) as usize,
        )
    } else {
        (0, 0)
    };
    let mut segments = Vec::new();
    let mut literal_from = 0usize;
    let mut last_end = 0usize;
    for &(from, len) in runs {
        let from = from as usize;
        let to = from.checked_add(len as usize)?;
        if from < last_end || to > bytes.len() {
            return None;
        }
        last_end = to;
        // The part `prev` reaches, as a comparison of the overlap finds it.
        let (from, to) = (from.max(a), to.min(b));
        if to < from + MIN_SAME_RUN {
            continue;
        }
        debug_assert_eq!(
            bytes[from..to],
            prev.bytes[from - a + (overlap_start - prev.start) as usize..][..to - from],
            "a hinted run differs from its base"
        );
        if literal_from < from {
            segments.push(Segment::Literal(&bytes[literal_from..from]));
        }
        segments.push(Segment::Same((to - from) as u32));
        literal_from = to;
    }
    if literal_from < bytes.len() {
        segments.push(Segment::Literal(&bytes[literal_from..]));
    }
    Some(WireStack {
        start: new.start,
        len: bytes.len() as u32,
        base: 0,
        segments,
    })
}

/// A thread's latest snapshot in a block, as the writer keeps it: among
/// the bytes of the thread's earlier snapshots by address, so that making
/// the next snapshot the latest writes only the bytes that are not `Same`,
/// however deep the stack. The writer deltas against the latest snapshot
/// only: with older ones tried as well (`base` 1 to 3) the recorder's
/// traces came out no smaller after compression.
#[derive(Debug, Default)]
pub(crate) struct LatestStack {
    held: ByAddress,
    /// The latest snapshot (start, length, its hint's id), if the block
    /// has one of the thread and its bytes are held.
    latest: Option<(u64, usize, Option<u64>)>,
}

impl LatestStack {
    /// The latest snapshot's bytes.
    fn get(&self) -> Option<StackRef<'_>> {
        let (start, len, _) = self.latest?;
        Some(StackRef {
            start,
            bytes: self.held.view(start, len)?,
        })
    }

    /// Encode `new` against the latest snapshot: from `hint`'s runs when
    /// they were found against it, else by comparing.
    pub fn encode<'a>(&self, new: StackRef<'a>, hint: Option<&StackHint>) -> WireStack<'a> {
        let prev = self.get();
        let hinted = hint.zip(prev).and_then(|(h, prev)| {
            let id = self.latest.and_then(|(_, _, id)| id);
            if h.base.is_none() || h.base != id {
                return None;
            }
            encode_from_runs(new, prev, &h.runs)
        });
        hinted.unwrap_or_else(|| encode(new, prev, 0))
    }

    /// Make `new`, encoded as `wire` by [`encode`](Self::encode), the
    /// latest snapshot, named `id` by its hint: its literal bytes are
    /// written over the bytes held (its `Same` bytes are there already),
    /// or all of it when the bytes held had to start afresh.
    pub fn remember(&mut self, new: StackRef<'_>, wire: &WireStack<'_>, id: Option<u64>) {
        let len = new.bytes.len();
        if !ByAddress::can_hold(new.start, len as u64) {
            self.latest = None;
            return;
        }
        // With no latest snapshot the wire is all literals.
        let kept = self.held.cover(new.start, len as u64);
        let held = self.held.at(new.start, len);
        if !kept {
            held.copy_from_slice(new.bytes);
        } else {
            let mut at = 0usize;
            for segment in &wire.segments {
                match segment {
                    Segment::Same(n) => at += *n as usize,
                    Segment::Literal(l) => {
                        held[at..at + l.len()].copy_from_slice(l);
                        at += l.len();
                    }
                }
            }
        }
        self.latest = Some((new.start, len, id));
    }

    /// Forget the latest snapshot (a new block), keeping the buffer.
    pub fn forget(&mut self) {
        self.latest = None;
    }
}

/// A segment as a block cursor reads it: literals borrowed from the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) enum SegmentIn<'a> {
    /// See [`Segment::Same`].
    Same(u32),
    /// See [`Segment::Literal`].
    Literal(&'a [u8]),
}

/// A [`WireStack`] as a block cursor reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct WireStackIn<'a> {
    pub start: u64,
    pub len: u32,
    pub base: u8,
    #[serde(borrow)]
    pub segments: Vec<SegmentIn<'a>>,
}

/// A run of a decoded snapshot's bytes, `off` bytes above its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece<'a> {
    pub off: u32,
    pub bytes: &'a [u8],
}

/// A snapshot as a block cursor remembers it for later deltas: where it
/// is, which record it came from and, when bytes are kept, its bytes as
/// pieces borrowed from the block (never copied).
#[derive(Debug, Clone, Default)]
pub(crate) struct Snap<'a> {
    pub record: u32,
    pub start: u64,
    pub len: u32,
    pub pieces: Vec<Piece<'a>>,
}

/// Decode `wire`, whose `Same` segments refer to `prev` (the thread's
/// snapshot number `wire.base`, if the block has it). With `keep`, the
/// snapshot's pieces go to `out` (cleared first). Returns the offset from
/// the snapshot's start from which every byte is a `Same` byte, i.e. equal
/// to `prev`'s at the same AVMA (`wire.len` if the last bytes are literal).
pub(crate) fn decode_pieces<'a>(
    wire: &WireStackIn<'a>,
    prev: Option<&Snap<'a>>,
    keep: bool,
    out: &mut Vec<Piece<'a>>,
) -> Result<u32, StackDecodeError> {
    out.clear();
    if wire.len > MAX_STACK_LEN {
        return Err(StackDecodeError::TooLong { len: wire.len });
    }
    if usize::from(wire.base) >= MAX_BASES {
        return Err(StackDecodeError::BadBase { base: wire.base });
    }
    // Bytes so far, in u64: `Same` runs are bounded by the previous
    // snapshot and literals by the block, so this cannot overflow.
    let mut pos = 0u64;
    let mut same_from: Option<u64> = None;
    for segment in &wire.segments {
        match *segment {
            SegmentIn::Literal(lit) => {
                if !lit.is_empty() {
                    if keep {
                        out.push(Piece {
                            off: pos as u32,
                            bytes: lit,
                        });
                    }
                    same_from = None;
                }
                pos += lit.len() as u64;
            }
            SegmentIn::Same(n) => {
                let prev = prev.ok_or(StackDecodeError::NoPrevious)?;
                let addr = wire.start.wrapping_add(pos);
                let out_of_range = StackDecodeError::SameOutOfRange { addr, len: n };
                let from = addr.checked_sub(prev.start).ok_or(out_of_range.clone())?;
                let to = from.checked_add(n.into()).ok_or(out_of_range.clone())?;
                if to > u64::from(prev.len) {
                    return Err(out_of_range);
                }
                if n > 0 {
                    same_from.get_or_insert(pos);
                    if keep {
                        copy_pieces(&prev.pieces, from, to, pos, out);
                    }
                }
                pos += u64::from(n);
            }
        }
        if pos > u64::from(wire.len) {
            // Stop before `Same` runs can grow the copy past the claim.
            break;
        }
    }
    if pos != u64::from(wire.len) {
        return Err(StackDecodeError::LengthMismatch {
            expected: wire.len,
            found: pos,
        });
    }
    Ok(same_from.map_or(wire.len, |f| f as u32))
}

/// Append the parts of `pieces` between offsets `from` and `to` of their
/// snapshot, moved to offset `at` of the new one.
fn copy_pieces<'a>(pieces: &[Piece<'a>], from: u64, to: u64, at: u64, out: &mut Vec<Piece<'a>>) {
    let first = pieces.partition_point(|p| u64::from(p.off) + p.bytes.len() as u64 <= from);
    for p in &pieces[first..] {
        let p_start = u64::from(p.off);
        if p_start >= to {
            break;
        }
        let lo = p_start.max(from);
        let hi = (p_start + p.bytes.len() as u64).min(to);
        out.push(Piece {
            off: (lo - from + at) as u32,
            bytes: &p.bytes[(lo - p_start) as usize..(hi - p_start) as usize],
        });
    }
}

/// Copy the bytes at offsets `off..off + buf.len()` of a snapshot made of
/// `pieces` into `buf`. The caller checked that the range is inside it.
pub(crate) fn read_pieces(pieces: &[Piece<'_>], off: u64, buf: &mut [u8]) {
    let mut i = pieces.partition_point(|p| u64::from(p.off) + p.bytes.len() as u64 <= off);
    let mut done = 0usize;
    while done < buf.len() {
        let Some(p) = pieces.get(i) else { return };
        let at = (off + done as u64 - u64::from(p.off)) as usize;
        let n = (p.bytes.len() - at).min(buf.len() - done);
        buf[done..done + n].copy_from_slice(&p.bytes[at..at + n]);
        done += n;
        i += 1;
    }
}

/// Call `same` with (offset, length) of every run of at least
/// [`MIN_SAME_RUN`] bytes where `x` and `y` (of equal length; the shorter
/// length if not) agree and that is as long as it can be, in order: the
/// runs the encoding stores as `Same` segments. One pass over both, a word at a time: long equal
/// stretches (most of a stack) in bulk, and where the bytes differ, each
/// word's equal bytes at its two ends found from the difference's zero
/// bytes (a run inside one word is too short to count).
pub fn same_runs(x: &[u8], y: &[u8], same: impl FnMut(usize, usize)) {
    let n = x.len().min(y.len());
    let mut runs = SameRuns::new(same);
    runs.compare(&x[..n], &y[..n]);
    runs.finish();
}

/// [`same_runs`] over bytes met piece by piece, in order: stretches known
/// to be equal, and stretches to compare. The runs reported are the ones
/// [`same_runs`] finds over the whole, with offsets from the first piece.
pub struct SameRuns<F: FnMut(usize, usize)> {
    /// Offset of the next piece.
    at: usize,
    /// Equal bytes ending at `at`.
    run: usize,
    same: F,
}

impl<F: FnMut(usize, usize)> SameRuns<F> {
    /// No bytes met yet; `same` gets each run (offset, length) once it
    /// ends.
    pub fn new(same: F) -> SameRuns<F> {
        SameRuns {
            at: 0,
            run: 0,
            same,
        }
    }

    /// The next `len` bytes are equal.
    pub fn equal(&mut self, len: usize) {
        self.at += len;
        self.run += len;
    }

    /// The next bytes are `x`'s, to be compared with `y`'s (of equal
    /// length; the shorter length if not).
    pub fn compare(&mut self, x: &[u8], y: &[u8]) {
        const _: () = assert!(MIN_SAME_RUN > 6, "a run inside one word never counts");
        let n = x.len().min(y.len());
        let mut i = 0usize;
        while i + 8 <= n {
            let d = word(x, i) ^ word(y, i);
            if d == 0 {
                let k = common_prefix_len(&x[i..n], &y[i..n]);
                self.run += k;
                i += k;
                continue;
            }
            // Little-endian: the low bytes of `d` are the lower addresses.
            let head = d.trailing_zeros() as usize / 8;
            if self.run + head >= MIN_SAME_RUN {
                (self.same)(self.at + i - self.run, self.run + head);
            }
            self.run = d.leading_zeros() as usize / 8;
            i += 8;
        }
        for k in i..n {
            if x[k] == y[k] {
                self.run += 1;
            } else {
                if self.run >= MIN_SAME_RUN {
                    (self.same)(self.at + k - self.run, self.run);
                }
                self.run = 0;
            }
        }
        self.at += n;
    }

    /// No more bytes: report the run that ends with them.
    pub fn finish(mut self) {
        if self.run >= MIN_SAME_RUN {
            (self.same)(self.at - self.run, self.run);
        }
    }
}

/// The eight bytes of `b` at `i` as a little-endian word.
#[inline(always)]
fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("eight bytes"))
}

/// How many leading bytes `a` and `b` share (up to the shorter's length).
/// Long equal runs are the rule (a thread's stack hardly changes between
/// samples): they are compared in blocks, which `memcmp` does fastest,
/// then eight bytes at a time, the tail byte by byte. A difference in the
/// first word (where the bytes differ, runs are short) costs no call. The
/// recorder compares its stack copies with it too.
pub fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 256;
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    if len >= 8 {
        let d = word(a, 0) ^ word(b, 0);
        if d != 0 {
            return d.trailing_zeros() as usize / 8;
        }
    }
    let mut n = 0;
    for (ca, cb) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)) {
        if ca != cb {
            break;
        }
        n += BLOCK;
    }
    while n + 8 <= len {
        let d = word(a, n) ^ word(b, n);
        if d != 0 {
            return n + d.trailing_zeros() as usize / 8;
        }
        n += 8;
    }
    n + a[n..]
        .iter()
        .zip(&b[n..])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::StackSnapshot;

    /// Decode `wire` against `recent` into an owned snapshot, the way a
    /// block cursor does.
    /// (`recent` oldest first, as a reader keeps them.)
    fn decode(
        wire: WireStack,
        recent: &[&StackSnapshot],
    ) -> Result<StackSnapshot, StackDecodeError> {
        let segments: Vec<SegmentIn<'_>> = wire
            .segments
            .iter()
            .map(|s| match s {
                Segment::Same(n) => SegmentIn::Same(*n),
                Segment::Literal(l) => SegmentIn::Literal(l),
            })
            .collect();
        let wire_in = WireStackIn {
            start: wire.start,
            len: wire.len,
            base: wire.base,
            segments,
        };
        let prev = recent
            .len()
            .checked_sub(usize::from(wire.base) + 1)
            .map(|i| recent[i])
            .map(|p| Snap {
                record: 0,
                start: p.start,
                len: p.bytes.len() as u32,
                pieces: vec![Piece {
                    off: 0,
                    bytes: &p.bytes,
                }],
            });
        let mut pieces = Vec::new();
        decode_pieces(&wire_in, prev.as_ref(), true, &mut pieces)?;
        let mut bytes = vec![0; wire.len as usize];
        read_pieces(&pieces, 0, &mut bytes);
        Ok(StackSnapshot {
            start: wire.start,
            bytes,
        })
    }

    /// A generator of pseudo-random numbers below its argument
    /// (xorshift, from `seed`), the same in every run.
    fn random_below(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    fn snap(start: u64, bytes: Vec<u8>) -> StackSnapshot {
        StackSnapshot { start, bytes }
    }

    fn r(s: &StackSnapshot) -> StackRef<'_> {
        StackRef {
            start: s.start,
            bytes: &s.bytes,
        }
    }

    /// A thread's latest snapshot held as `s`, named `id`.
    fn latest(s: &StackSnapshot, id: Option<u64>) -> LatestStack {
        let mut l = LatestStack::default();
        l.remember(r(s), &encode(r(s), None, 0), id);
        l
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn common_prefix_is_found_at_every_length_and_position() {
        let a = pattern(1100, 3);
        for len in [0, 1, 7, 8, 9, 255, 256, 257, 700, 1100] {
            for diff in [0, 1, 8, 255, 256, 300, 511, 512, 1099] {
                let mut b = a[..len].to_vec();
                if diff < len {
                    b[diff] ^= 0x40;
                }
                let expected = a[..len].iter().zip(&b).take_while(|(x, y)| x == y).count();
                assert_eq!(common_prefix_len(&a[..len], &b), expected, "{len} {diff}");
            }
        }
    }

    /// The segments the encoding is defined by, found byte by byte: the
    /// maximal runs of equal bytes of the overlap, those of at least
    /// [`MIN_SAME_RUN`] bytes `Same`, the rest literal.
    fn segments_byte_by_byte<'a>(new: &'a StackSnapshot, prev: &StackSnapshot) -> Vec<Segment<'a>> {
        let mut segments = Vec::new();
        let mut literal_from = 0;
        let mut run_from = None;
        let mut close = |segments: &mut Vec<Segment<'a>>, from: usize, to: usize| {
            if to - from >= MIN_SAME_RUN {
                if literal_from < from {
                    segments.push(Segment::Literal(&new.bytes[literal_from..from]));
                }
                segments.push(Segment::Same((to - from) as u32));
                literal_from = to;
            }
        };
        for (i, &byte) in new.bytes.iter().enumerate() {
            let addr = new.start + i as u64;
            let equal = addr >= prev.start
                && addr < prev.end()
                && prev.bytes[(addr - prev.start) as usize] == byte;
            match (equal, run_from) {
                (true, None) => run_from = Some(i),
                (false, Some(from)) => {
                    close(&mut segments, from, i);
                    run_from = None;
                }
                _ => {}
            }
        }
        if let Some(from) = run_from {
            close(&mut segments, from, new.bytes.len());
        }
        if literal_from < new.bytes.len() {
            segments.push(Segment::Literal(&new.bytes[literal_from..]));
        }
        segments
    }

    /// The word-at-a-time encoder finds exactly the runs a byte-by-byte
    /// walk does, wherever the changes fall and however the snapshots
    /// are placed and aligned.
    #[test]
    fn encoding_matches_a_byte_by_byte_walk() {
        let mut next = random_below(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let len = next(3000) as usize;
            let prev = snap(0x10_000 + next(64), pattern(len, next(256) as u8));
            let mut bytes = prev.bytes.clone();
            // Changes: single bytes, short and long runs.
            for _ in 0..next(40) {
                if bytes.is_empty() {
                    break;
                }
                let at = next(bytes.len() as u64) as usize;
                let n = [1, 2, 7, 8, 9, 15, 16, 17, 40][next(9) as usize];
                // Some bytes of a change stay as they were, as in the
                // words of a real stack (the high bytes of pointers).
                for b in bytes.iter_mut().skip(at).take(n) {
                    if next(3) > 0 {
                        *b = b.wrapping_add(1 + next(255) as u8);
                    }
                }
            }
            // Moved up or down, grown or cut at either end.
            let shift = next(200) as i64 - 100;
            let start = (prev.start as i64 + shift) as u64;
            let bytes = if shift >= 0 {
                bytes.split_off((shift as usize).min(bytes.len()))
            } else {
                let mut b = pattern(shift.unsigned_abs() as usize, 5);
                b.extend(bytes);
                b
            };
            let mut bytes = bytes;
            bytes.truncate(bytes.len().saturating_sub(next(100) as usize));
            let new = snap(start, bytes);
            let w = encode(r(&new), Some(r(&prev)), 0);
            assert_eq!(w.segments, segments_byte_by_byte(&new, &prev));
            assert_eq!(decode(w, &[&prev]).unwrap(), new);
        }
    }

    /// Met piece by piece, with pieces known equal passed over, the runs
    /// are the ones one comparison of the whole finds.
    #[test]
    fn runs_found_in_pieces_are_the_whole_comparison_runs() {
        let mut next = random_below(0x6a09_e667_f3bc_c909);
        for round in 0..2000 {
            let len = next(3000) as usize;
            let y = pattern(len, next(256) as u8);
            let mut x = y.clone();
            for _ in 0..next(30) {
                if x.is_empty() {
                    break;
                }
                let at = next(x.len() as u64) as usize;
                for b in x.iter_mut().skip(at).take(1 + next(40) as usize) {
                    if next(3) > 0 {
                        *b = b.wrapping_add(1 + next(255) as u8);
                    }
                }
            }
            let mut whole = Vec::new();
            same_runs(&x, &y, |from, len| whole.push((from, len)));
            // Cut anywhere; a piece without a difference may be passed
            // over as equal.
            let mut pieces = Vec::new();
            let mut runs = SameRuns::new(|from, len| pieces.push((from, len)));
            let mut at = 0;
            while at < len {
                let end = (at + 1 + next(300) as usize).min(len);
                if x[at..end] == y[at..end] && next(2) == 0 {
                    runs.equal(end - at);
                } else {
                    runs.compare(&x[at..end], &y[at..end]);
                }
                at = end;
            }
            runs.finish();
            assert_eq!(pieces, whole, "round {round}");
        }
    }

    /// The runs a writer finds against what a thread's copies held (the
    /// base's bytes where the base reaches, anything elsewhere) give the
    /// encoding a comparison with the base gives; hints that do not fit
    /// are ignored.
    #[test]
    fn hinted_encoding_is_the_compared_one() {
        let mut next = random_below(0x2545_f491_4f6c_dd1d);
        let mut hinted_runs = 0;
        for round in 0..2000 {
            let len = next(3000) as usize;
            let prev = snap(0x10_000 + next(64) * 8, pattern(len, next(256) as u8));
            let start = (prev.start as i64 + (next(40) as i64 - 20) * 8) as u64;
            // What the writer held: the base where it reaches, older bytes
            // (partly equal to the new ones) below and above it.
            let (lo, hi) = (
                prev.start.min(start) - 256,
                prev.end().max(start + 3000) + 256,
            );
            let mut held = pattern((hi - lo) as usize, 9);
            let p = (prev.start - lo) as usize;
            held[p..p + prev.bytes.len()].copy_from_slice(&prev.bytes);
            let new_len = next(3000) as usize;
            let n = (start - lo) as usize;
            let mut bytes = held[n..n + new_len].to_vec();
            for _ in 0..next(30) {
                if bytes.is_empty() {
                    break;
                }
                let at = next(bytes.len() as u64) as usize;
                for b in bytes.iter_mut().skip(at).take(1 + next(40) as usize) {
                    *b = b.wrapping_add(1 + next(255) as u8);
                }
            }
            let new = snap(start, bytes);
            let mut runs = Vec::new();
            same_runs(&new.bytes, &held[n..n + new_len], |from, len| {
                runs.push((from as u32, len as u32))
            });
            hinted_runs += runs.len();
            // The writer held another snapshot of the thread before.
            let mut recent = latest(&snap(prev.start + 64, pattern(64, 3)), Some(6));
            recent.remember(r(&prev), &recent.encode(r(&prev), None), Some(7));
            let compared = recent.encode(r(&new), None);
            assert_eq!(compared, encode(r(&new), Some(r(&prev)), 0));
            let hint = |base, runs: &[(u32, u32)]| StackHint {
                id: 8,
                base,
                runs: runs.to_vec(),
            };
            assert_eq!(
                recent.encode(r(&new), Some(&hint(Some(7), &runs))),
                compared,
                "round {round}"
            );
            // A hint against another snapshot, or none, is not used.
            let wrong = [(0, new_len as u32)];
            assert_eq!(
                recent.encode(r(&new), Some(&hint(Some(6), &wrong))),
                compared
            );
            assert_eq!(recent.encode(r(&new), Some(&hint(None, &wrong))), compared);
            // Runs out of order or past the end are ignored.
            if runs.len() >= 2 {
                let mut swapped = runs.clone();
                swapped.swap(0, 1);
                assert_eq!(
                    recent.encode(r(&new), Some(&hint(Some(7), &swapped))),
                    compared
                );
            }
            let past = [(new_len as u32, 16)];
            assert_eq!(
                recent.encode(r(&new), Some(&hint(Some(7), &past))),
                compared
            );
            assert_eq!(decode(compared, &[&prev]).unwrap(), new);
        }
        assert!(
            hinted_runs > 2000,
            "the rounds compared little: {hinted_runs}"
        );
    }

    /// Whatever a thread's snapshots do (move up and down, jump away, start
    /// at an odd address, change here and there), each encodes against
    /// the latest one as a comparison with it does, decodes to itself,
    /// and leaves its own bytes as the latest.
    #[test]
    fn latest_snapshot_is_held_as_it_was() {
        let mut next = random_below(0x9e37_79b9_7f4a_7c15);
        let mut held = LatestStack::default();
        let mut prev: Option<StackSnapshot> = None;
        let mut start = 0x7ff0_0000u64;
        let mut bytes = pattern(20_000, 1);
        for round in 0..3000 {
            match next(20) {
                0 => start += 1 + next(7),
                1 => start = 0x7ff0_0000 + next(1 << 20) * 8,
                2 => start = u64::MAX - next(64),
                _ => start = (start as i64 + (next(64) as i64 - 32) * 8) as u64,
            }
            let len = next(20_000) as usize;
            bytes.resize(len, 0);
            for _ in 0..next(8) {
                if len == 0 {
                    break;
                }
                let at = next(len as u64) as usize;
                for b in bytes.iter_mut().skip(at).take(1 + next(300) as usize) {
                    *b = b.wrapping_add(1 + next(255) as u8);
                }
            }
            let new = snap(start, bytes.clone());
            let wire = held.encode(r(&new), None);
            let base = prev
                .as_ref()
                .filter(|p| ByAddress::can_hold(p.start, p.bytes.len() as u64));
            assert_eq!(wire, encode(r(&new), base.map(r), 0), "round {round}");
            let recent: Vec<&StackSnapshot> = base.into_iter().collect();
            assert_eq!(decode(wire.clone(), &recent).unwrap(), new);
            held.remember(r(&new), &wire, Some(round));
            if ByAddress::can_hold(new.start, len as u64) {
                assert_eq!(held.get(), Some(r(&new)), "round {round}");
            } else {
                assert_eq!(held.get(), None);
            }
            prev = Some(new);
            if next(50) == 0 {
                held.forget();
                prev = None;
            }
        }
    }

    #[test]
    fn no_previous_is_one_literal() {
        let s = snap(0x1000, pattern(100, 1));
        let w = encode(r(&s), None, 0);
        assert_eq!(w.segments, vec![Segment::Literal(&s.bytes)]);
        assert_eq!(decode(w, &[]).unwrap(), s);
    }

    #[test]
    fn deeper_leaf_shares_the_root_part() {
        // Previous sample: sp at 0x2000, 4 KiB up to the stack top.
        let prev = snap(0x2000, pattern(4096, 7));
        // Now sp is 256 bytes lower; the new leaf frame has other bytes, and
        // one word in the middle changed.
        let mut bytes = pattern(256, 99);
        bytes.extend_from_slice(&prev.bytes);
        bytes[256 + 1000] ^= 0xff;
        let new = snap(0x2000 - 256, bytes);
        let w = encode(r(&new), Some(r(&prev)), 0);
        let literal: usize = w
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.len(),
                Segment::Same(_) => 0,
            })
            .sum();
        assert!(literal < 256 + MIN_SAME_RUN * 2, "literal bytes: {literal}");
        assert_eq!(decode(w, &[&prev]).unwrap(), new);
    }

    #[test]
    fn shallower_and_disjoint_snapshots() {
        let prev = snap(0x2000, pattern(4096, 7));
        let shallower = snap(0x2100, prev.bytes[0x100..].to_vec());
        let w = encode(r(&shallower), Some(r(&prev)), 0);
        assert_eq!(w.segments, vec![Segment::Same(4096 - 0x100)]);
        assert_eq!(decode(w, &[&prev]).unwrap(), shallower);

        let disjoint = snap(0x9000, pattern(64, 3));
        let w = encode(r(&disjoint), Some(r(&prev)), 0);
        assert_eq!(decode(w, &[&prev]).unwrap(), disjoint);
    }

    #[test]
    fn malformed_segments_are_errors() {
        let prev = snap(0x2000, pattern(64, 7));
        let w = WireStack {
            start: 0x2000,
            len: 128,
            base: 0,
            segments: vec![Segment::Same(128)],
        };
        assert!(matches!(
            decode(w.clone(), &[&prev]),
            Err(StackDecodeError::SameOutOfRange { .. })
        ));
        assert_eq!(decode(w, &[]), Err(StackDecodeError::NoPrevious));
        let w = WireStack {
            start: 0,
            len: 10,
            base: 0,
            segments: vec![Segment::Literal(&[0; 3])],
        };
        assert!(matches!(
            decode(w, &[]),
            Err(StackDecodeError::LengthMismatch { .. })
        ));
        let w = WireStack {
            start: 0x1000,
            len: 4,
            base: 0,
            segments: vec![Segment::Same(u32::MAX)],
        };
        assert!(decode(w, &[&prev]).is_err());
    }

    #[test]
    fn older_base_is_used_and_bounded() {
        let a = snap(0x2000, pattern(512, 1));
        let b = snap(0x2000, pattern(512, 2));
        let new = snap(0x2000, a.bytes.clone());
        // The thread was at `a`, then `b`, then back at `a`'s bytes.
        let w = encode(r(&new), Some(r(&a)), 1);
        assert_eq!(w.base, 1);
        assert_eq!(w.segments, vec![Segment::Same(512)]);
        assert_eq!(decode(w.clone(), &[&a, &b]).unwrap(), new);
        // Against the wrong base the bytes differ, but decoding is still
        // well-defined: it reads what that base holds.
        assert_eq!(decode(w.clone(), &[&b, &a]).unwrap().bytes, b.bytes);
        assert_eq!(decode(w, &[&a]), Err(StackDecodeError::NoPrevious));
        let bad = WireStack {
            start: 0x2000,
            len: 0,
            base: MAX_BASES as u8,
            segments: vec![],
        };
        assert_eq!(
            decode(bad, &[&a]),
            Err(StackDecodeError::BadBase {
                base: MAX_BASES as u8
            })
        );
    }
}
