//! Copying records out of a perf ring buffer.

use super::parse::{kind, sample, split_records, Layout, Layouts};
use super::replica::{ByAddress, Deltas, StackDelta, StackKeeper};
use std::sync::{Arc, Mutex};

/// Buffers handed back by the writer thread, for the draining thread's
/// next ones: chunk buffers once converted, and the buffers of long stack
/// copies once the trace writer is done with them (no longer a base of
/// its thread's next deltas). Memory already faulted in, instead of fresh
/// pages mapped for every chunk (which cost the recorder more system time
/// than the copies they hold), and no allocation per long stack in steady
/// state: with a stack copy allocated on the draining thread and freed on
/// the writer thread, the allocator had 9.2 % of the recorder's profile
/// samples on 43 KiB stacks at 10 kHz, 5.0 % with the buffers reused.
#[derive(Clone, Default)]
pub(crate) struct ChunkPool(Arc<Mutex<Pools>>);

#[derive(Default)]
struct Pools {
    chunks: Vec<Vec<u8>>,
    stacks: Vec<Vec<u8>>,
}

/// Chunk buffers kept at most, and the largest kept (bytes).
const POOL_BUFFERS: usize = 8;
const POOL_BUFFER_BYTES: usize = 4 << 20;
/// Stack buffers kept at most (a few per busy thread), and the largest
/// kept: the kernel copies at most 64 KiB of stack per sample.
const POOL_STACKS: usize = 64;
const POOL_STACK_BYTES: usize = 64 << 10;

impl ChunkPool {
    /// An empty buffer with room for at least `capacity` bytes.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut v = self.pop(|p| &mut p.chunks);
        v.reserve(capacity);
        v
    }

    /// Keep `v` for a later chunk, unless enough are kept.
    pub fn give(&self, v: Vec<u8>) {
        self.keep(v, POOL_BUFFER_BYTES, POOL_BUFFERS, |p| &mut p.chunks);
    }

    /// A copy of `bytes` in a kept stack buffer, or a new one. A kept
    /// buffer too small is dropped, not grown: growing an empty buffer
    /// reallocates, which copies its old bytes for nothing. New buffers
    /// are rounded up to a power of two, so that they fit the next
    /// stacks of about the same depth.
    pub fn stack_copy(&self, bytes: &[u8]) -> Vec<u8> {
        let mut v = self.pop(|p| &mut p.stacks);
        if v.capacity() < bytes.len() {
            let size = bytes.len().next_power_of_two().min(POOL_STACK_BYTES);
            v = Vec::with_capacity(size.max(bytes.len()));
        }
        v.extend_from_slice(bytes);
        v
    }

    /// Keep `v`, a stack copy's buffer, for a later one, unless enough
    /// are kept.
    pub fn give_stack(&self, v: Vec<u8>) {
        self.keep(v, POOL_STACK_BYTES, POOL_STACKS, |p| &mut p.stacks);
    }

    /// A kept buffer of `list`, or a new (empty) one.
    fn pop(&self, list: impl FnOnce(&mut Pools) -> &mut Vec<Vec<u8>>) -> Vec<u8> {
        self.0
            .lock()
            .ok()
            .and_then(|mut pool| list(&mut pool).pop())
            .unwrap_or_default()
    }

    fn keep(
        &self,
        mut v: Vec<u8>,
        max_bytes: usize,
        max_count: usize,
        list: impl FnOnce(&mut Pools) -> &mut Vec<Vec<u8>>,
    ) {
        if v.capacity() > max_bytes || v.capacity() == 0 {
            return;
        }
        if let Ok(mut pool) = self.0.lock() {
            let list = list(&mut pool);
            if list.len() < max_count {
                v.clear();
                list.push(v);
            }
        }
    }
}

/// Append `data[tail..head)` (positions modulo `data.len()`, a power of
/// two) to `out`; returns the number of bytes appended. `head` and `tail`
/// are the kernel's free-running byte counters.
#[cfg(test)]
pub(crate) fn copy_wrapped(data: &[u8], tail: u64, head: u64, out: &mut Vec<u8>) -> usize {
    let size = data.len() as u64;
    if size == 0 || head <= tail {
        return 0;
    }
    // A head more than one buffer ahead cannot happen with a kernel that
    // honours our tail; copy at most one buffer.
    let len = (head - tail).min(size);
    let start = (tail % size) as usize;
    let first = (len as usize).min(data.len() - start);
    out.extend_from_slice(&data[start..start + first]);
    out.extend_from_slice(&data[..len as usize - first]);
    len as usize
}

/// Call `each` with every whole record of `data[tail..head)` (positions
/// modulo `data.len()`, a power of two; `head` and `tail` are the
/// kernel's free-running byte counters), in order, read where it lies: a
/// record that runs across the end of `data` is first put together in
/// `wrapped`, the only copy made here. `each` also gets the bytes of the
/// range walked up to the end of that record, which its caller may give
/// back to the kernel once done with it. Stops at a malformed header (a
/// size under 8, or past `head`): nothing after it can be split into
/// records. Returns the bytes of the range, at most one buffer.
pub(crate) fn for_each_record(
    data: &[u8],
    tail: u64,
    head: u64,
    wrapped: &mut Vec<u8>,
    mut each: impl FnMut(&[u8], usize),
) -> usize {
    let size = data.len();
    if size == 0 || head <= tail {
        return 0;
    }
    let len = (head - tail).min(size as u64) as usize;
    let start = (tail % size as u64) as usize;
    // The range as offsets from `start`, read through `at`.
    let piece = |from: usize, n: usize, into: &mut Vec<u8>| {
        into.clear();
        into.reserve(n);
        let at = (start + from) % size;
        let first = n.min(size - at);
        into.extend_from_slice(&data[at..at + first]);
        into.extend_from_slice(&data[..n - first]);
    };
    let mut pos = 0;
    while pos + 8 <= len {
        let at = (start + pos) % size;
        let mut header = [0u8; 8];
        if at + 8 <= size {
            header.copy_from_slice(&data[at..at + 8]);
        } else {
            piece(pos, 8, wrapped);
            header.copy_from_slice(wrapped);
        }
        let rec_len = u16::from_ne_bytes([header[6], header[7]]) as usize;
        if rec_len < 8 || pos + rec_len > len {
            break;
        }
        let done = pos + rec_len;
        if at + rec_len <= size {
            each(&data[at..at + rec_len], done);
        } else {
            piece(pos, rec_len, wrapped);
            each(wrapped, done);
        }
        pos = done;
    }
    len
}

/// Append the records of `src` to `out`, dropping the dead part of each
/// sample's stack copy: the kernel reserves `sample_stack_user` bytes per
/// sample but fills only `dyn_size`. The result is again valid perf
/// records (with `size == dyn_size`), so the writer thread's parser reads
/// both. This is the only work the draining thread does per record: a few
/// fixed-offset reads and one copy. Stops after the record that makes
/// the bytes appended `max` or more; returns the bytes of `src` consumed,
/// which is more than zero unless `src` is empty.
pub(crate) fn compact_samples(
    layouts: &Layouts,
    src: &[u8],
    out: &mut Vec<u8>,
    max: usize,
) -> usize {
    let max = max.max(1);
    let mut consumed = 0;
    let start_len = out.len();
    for (_, _, rec) in split_records(src) {
        if out.len() - start_len >= max {
            break;
        }
        consumed += rec.len();
        compact_record(layouts, rec, out);
    }
    if consumed < src.len() && out.len() - start_len < max {
        // A malformed header: nothing after it can be split into records.
        consumed = src.len();
    }
    consumed
}

/// Append the record `rec` (whole, with its header) to `out`, without the
/// dead part of its stack copy if it is a sample (see
/// [`compact_samples`]).
pub(crate) fn compact_record(layouts: &Layouts, rec: &[u8], out: &mut Vec<u8>) {
    let is_sample = rec.get(0..4) == Some(&kind::SAMPLE.to_ne_bytes()[..]);
    match is_sample
        .then(|| stack_field(layouts.of_sample(rec)?.1, rec))
        .flatten()
    {
        Some(StackField {
            at, size, dyn_size, ..
        }) if dyn_size < size => {
            let start = out.len();
            out.extend_from_slice(&rec[..at]);
            out.extend_from_slice(&dyn_size.to_ne_bytes());
            if dyn_size > 0 {
                out.extend_from_slice(&rec[at + 8..at + 8 + dyn_size as usize]);
                out.extend_from_slice(&dyn_size.to_ne_bytes());
            }
            let new_len = (out.len() - start) as u16;
            out[start + 6..start + 8].copy_from_slice(&new_len.to_ne_bytes());
        }
        _ => out.extend_from_slice(rec),
    }
}

/// Stacks a chunk makes room for when it takes its first one out.
const CHUNK_STACKS: usize = 32;

/// Stack copies at least this long leave the ring in buffers of their own
/// (see [`Chunk`]); shorter ones stay in the chunk.
pub(crate) const DETACH_STACK_MIN: u64 = 2048;

/// Records drained from one ring buffer, on their way to the writer
/// thread: perf records as [`compact_record`] leaves them, and the long
/// stack copies taken out of them: as the blocks that changed since the
/// thread's earlier copies (see `replica`), or whole in a buffer the
/// sample keeps, so their bytes are copied once on their way from the
/// ring to the trace.
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    pub bytes: Vec<u8>,
    /// In the order of their records.
    pub stacks: Vec<DetachedStack>,
    /// The changed blocks of the stacks sent as deltas.
    pub deltas: Deltas,
    /// Bytes in `stacks` and `deltas`.
    detached_len: usize,
}

impl Chunk {
    /// A chunk of `bytes` with no stack taken out.
    #[cfg(test)]
    pub fn plain(bytes: Vec<u8>) -> Chunk {
        Chunk {
            bytes,
            ..Chunk::default()
        }
    }

    /// Nothing in it.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Bytes held, the stacks taken out included.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.detached_len
    }

    /// Append record `rec` like [`compact_record`], but a sample's live
    /// stack of [`DETACH_STACK_MIN`] bytes or more is taken out (the
    /// record left in `bytes` has a stack size of 0): as the blocks that
    /// differ from what `keeper` held of the thread's copies, or, with no
    /// keeper or a sample that does not say whose stack it is, whole in a
    /// buffer of its own (one of `pool`'s).
    pub fn push_record(
        &mut self,
        layouts: &Layouts,
        rec: &[u8],
        pool: &ChunkPool,
        keeper: Option<&mut Keeper>,
    ) {
        let is_sample = rec.get(0..4) == Some(&kind::SAMPLE.to_ne_bytes()[..]);
        let Some((layout, field)) = is_sample
            .then(|| {
                let layout = layouts.of_sample(rec)?.1;
                Some((layout, stack_field(layout, rec)?))
            })
            .flatten()
            .filter(|(_, f)| f.dyn_size >= DETACH_STACK_MIN)
        else {
            compact_record(layouts, rec, &mut self.bytes);
            return;
        };
        let (at, dyn_size) = (field.at, field.dyn_size as usize);
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&rec[..at]);
        self.bytes.extend_from_slice(&0u64.to_ne_bytes());
        let new_len = (self.bytes.len() - start) as u16;
        self.bytes[start + 6..start + 8].copy_from_slice(&new_len.to_ne_bytes());
        if self.stacks.capacity() == 0 {
            // About as many as fit a chunk, at once.
            self.stacks.reserve(CHUNK_STACKS);
        }
        let live = &rec[at + 8..at + 8 + dyn_size];
        let owner = keeper
            .and_then(|k| Some((field.owner(layout, rec, k.sp_index)?, k)))
            .filter(|(o, _)| ByAddress::can_hold(o.sp, dyn_size as u64));
        let delta = owner.and_then(|(o, k)| {
            if self.deltas.bytes.capacity() == 0 {
                self.deltas.bytes = pool.take(0);
            }
            let before = self.deltas.bytes.len();
            let d = k
                .stacks
                .delta(o.pid, o.tid, o.sp, o.time, live, &mut self.deltas)?;
            self.detached_len += self.deltas.bytes.len() - before;
            Some(d)
        });
        let stack = match delta {
            Some(d) => Detached::Delta(d),
            // No keeper, no owner, or older than the thread's last copy.
            None => {
                self.detached_len += dyn_size;
                Detached::Whole(pool.stack_copy(live))
            }
        };
        self.stacks.push(DetachedStack { at: start, stack });
    }
}

/// The draining thread's state for sending stacks as deltas.
#[derive(Debug)]
pub(crate) struct Keeper {
    /// Which of the sampled user registers is the stack pointer.
    sp_index: usize,
    stacks: StackKeeper,
}

impl Keeper {
    /// Stack pointers are the `sp_index`th sampled user register.
    pub fn new(sp_index: usize) -> Keeper {
        Keeper {
            sp_index,
            stacks: StackKeeper::default(),
        }
    }
}

/// A sample's stack copy taken out of its record.
#[derive(Debug)]
pub(crate) struct DetachedStack {
    /// Offset of the record in [`Chunk::bytes`].
    pub at: usize,
    pub stack: Detached,
}

/// How a stack copy taken out of its record travels.
#[derive(Debug)]
pub(crate) enum Detached {
    /// The live bytes.
    Whole(Vec<u8>),
    /// The blocks that changed, in the chunk's [`Deltas`].
    Delta(StackDelta),
}

/// Where a sample's stack copy is, and what says whose it is.
#[derive(Debug, Clone, Copy)]
struct StackField {
    /// Offset of the `STACK_USER` size field in the record.
    at: usize,
    size: u64,
    dyn_size: u64,
    /// Offset of the pid and tid (`PERF_SAMPLE_TID`), if sampled.
    tid_at: Option<usize>,
    /// Offset of the time (`PERF_SAMPLE_TIME`), if sampled.
    time_at: Option<usize>,
    /// Offset of the first user register value, if the sample has them.
    regs_at: Option<usize>,
}

/// Whose stack a sample copied, and when.
#[derive(Debug, Clone, Copy)]
struct Owner {
    pid: u32,
    tid: u32,
    /// The stack pointer.
    sp: u64,
    time: u64,
}

impl StackField {
    /// The sample's pid, tid, time and the `index`th user register value.
    fn owner(&self, layout: &Layout, rec: &[u8], index: usize) -> Option<Owner> {
        let read32 = |at: usize| Some(u32::from_ne_bytes(rec.get(at..at + 4)?.try_into().ok()?));
        let read64 = |at: usize| Some(u64::from_ne_bytes(rec.get(at..at + 8)?.try_into().ok()?));
        let tid_at = self.tid_at?;
        if index >= layout.user_regs {
            return None;
        }
        Some(Owner {
            pid: read32(tid_at)?,
            tid: read32(tid_at + 4)?,
            sp: read64(self.regs_at? + index * 8)?,
            time: read64(self.time_at?)?,
        })
    }
}

/// Where the stack copy of sample `rec` is; `None` if it has none or is
/// malformed.
fn stack_field(layout: &Layout, rec: &[u8]) -> Option<StackField> {
    let t = layout.sample_type;
    if t & sample::STACK_USER == 0 {
        return None;
    }
    let read = |at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(
            rec.get(at..at.checked_add(8)?)?.try_into().ok()?,
        ))
    };
    let fixed = [
        sample::IDENTIFIER,
        sample::IP,
        sample::TID,
        sample::TIME,
        sample::ADDR,
        sample::ID,
        sample::STREAM_ID,
        sample::CPU,
        sample::PERIOD,
    ];
    if t & (sample::READ | sample::BRANCH_STACK) != 0 {
        return None;
    }
    let before_tid = fixed[..2].iter().filter(|&&b| t & b != 0).count() * 8;
    let tid_at = (t & sample::TID != 0).then_some(8 + before_tid);
    let before_time = fixed[..3].iter().filter(|&&b| t & b != 0).count() * 8;
    let time_at = (t & sample::TIME != 0).then_some(8 + before_time);
    let mut at = 8 + fixed.iter().filter(|&&b| t & b != 0).count() * 8;
    if t & sample::CALLCHAIN != 0 {
        let nr = usize::try_from(read(at)?).ok()?;
        at = at.checked_add(8)?.checked_add(nr.checked_mul(8)?)?;
    }
    if t & sample::RAW != 0 {
        let size = u32::from_ne_bytes(rec.get(at..at.checked_add(4)?)?.try_into().ok()?);
        at = at.checked_add(4)?.checked_add(size as usize)?;
    }
    let mut regs_at = None;
    if t & sample::REGS_USER != 0 {
        let abi = read(at)?;
        at += 8;
        if abi != 0 {
            regs_at = Some(at);
            at += layout.user_regs * 8;
        }
    }
    let size = read(at)?;
    if size == 0 {
        return None;
    }
    let dyn_at = at
        .checked_add(8)?
        .checked_add(usize::try_from(size).ok()?)?;
    let dyn_size = read(dyn_at)?.min(size);
    Some(StackField {
        at,
        size,
        dyn_size,
        tid_at,
        time_at,
        regs_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::attr::Role;
    use crate::linux::parse::{parse_record, PerfRecord};

    #[test]
    fn copies_without_wrapping() {
        let data = [0u8, 1, 2, 3, 4, 5, 6, 7];
        let mut out = Vec::new();
        assert_eq!(copy_wrapped(&data, 2, 5, &mut out), 3);
        assert_eq!(out, [2, 3, 4]);
    }

    #[test]
    fn copies_across_the_end() {
        let data = [0u8, 1, 2, 3, 4, 5, 6, 7];
        let mut out = Vec::new();
        // Counters are free-running: 14 % 8 = 6, so bytes 6, 7, 0, 1.
        assert_eq!(copy_wrapped(&data, 14, 18, &mut out), 4);
        assert_eq!(out, [6, 7, 0, 1]);
    }

    /// Found by the `perf_records` fuzz target: a callchain count that
    /// puts the stack field within 8 bytes of the end of the address space
    /// overflowed the offset arithmetic.
    #[test]
    fn callchain_counts_near_the_address_space_end_are_malformed() {
        let layout = Layout {
            sample_type: sample::CALLCHAIN | sample::STACK_USER,
            user_regs: 0,
        };
        // The stack field would be at 8 + 8 + nr * 8 = usize::MAX - 7.
        let nr = (usize::MAX - 7 - 16) / 8;
        let mut rec = kind::SAMPLE.to_ne_bytes().to_vec();
        rec.extend(0u16.to_ne_bytes());
        rec.extend(16u16.to_ne_bytes());
        rec.extend((nr as u64).to_ne_bytes());
        let mut out = Vec::new();
        let layouts = Layouts::single(Role::Cpu, layout);
        assert_eq!(compact_samples(&layouts, &rec, &mut out, 64), rec.len());
        assert_eq!(out, rec);
    }

    #[test]
    fn empty_when_nothing_new() {
        let mut out = Vec::new();
        assert_eq!(copy_wrapped(&[0u8; 8], 5, 5, &mut out), 0);
        assert!(out.is_empty());
    }

    #[rustfmt::skip]
    #[test]
    fn compaction_keeps_only_the_live_stack() {
        let layout = Layout {
            sample_type: sample::TID | sample::TIME | sample::CALLCHAIN
                | sample::REGS_USER | sample::STACK_USER,
            user_regs: 3,
        };
        let mut body: Vec<u8> = Vec::new();
        let mut u64s = |v: &[u64]| body.extend(v.iter().flat_map(|x| x.to_ne_bytes()));
        u64s(&[(11u64 << 32) | 10]);        // pid 10, tid 11
        u64s(&[500]);                       // time
        u64s(&[1, 0x401000]);               // callchain: nr 1, ip
        u64s(&[2, 1, 2, 3]);                // regs abi 64-bit, bp sp ip
        u64s(&[32]);                        // stack size
        u64s(&[0xaa, 0xbb, 0xcc, 0xdd]);    // 32 stack bytes
        u64s(&[16]);                        // dyn_size: 16 live
        let mut rec = (kind::SAMPLE).to_ne_bytes().to_vec();
        rec.extend(0u16.to_ne_bytes());
        rec.extend(((body.len() + 8) as u16).to_ne_bytes());
        rec.extend(&body);
        let mut other = 5u32.to_ne_bytes().to_vec(); // a THROTTLE record, kept as is
        other.extend(0u16.to_ne_bytes());
        other.extend(16u16.to_ne_bytes());
        other.extend(7u64.to_ne_bytes());
        let mut src = rec.clone();
        src.extend(&other);
        let layout = Layouts::single(Role::Cpu, layout);

        let mut out = Vec::new();
        assert_eq!(compact_samples(&layout, &src, &mut out, usize::MAX), src.len());
        assert_eq!(out.len(), src.len() - 16);
        let recs: Vec<_> = split_records(&out).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].2, &other[..]);
        let (k, misc, r) = recs[0];
        let PerfRecord::Sample(s) = parse_record(&layout, k, misc, r).unwrap() else { panic!() };
        assert_eq!(*s.regs, [1, 2, 3]);
        assert_eq!(s.callchain, [0x401000]);
        let expect: Vec<u8> = [0xaau64, 0xbb].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(s.stack, &expect[..]);

        // With a small limit, one record per call.
        let mut first = Vec::new();
        let n = compact_samples(&layout, &src, &mut first, 1);
        assert_eq!(n, rec.len());
        let mut second = Vec::new();
        assert_eq!(compact_samples(&layout, &src[n..], &mut second, 1), other.len());
        assert_eq!(second, other);
    }

    /// Long live stacks leave their record for a buffer of their own;
    /// short ones and other records are compacted as before.
    #[rustfmt::skip]
    #[test]
    fn long_stacks_are_taken_out_of_their_records() {
        let layout = Layout {
            sample_type: sample::TID | sample::TIME | sample::REGS_USER | sample::STACK_USER,
            user_regs: 3,
        };
        let sample_rec = |size: u64, live: u64| {
            let mut body: Vec<u8> = Vec::new();
            let mut u64s = |v: &[u64]| body.extend(v.iter().flat_map(|x| x.to_ne_bytes()));
            u64s(&[(11u64 << 32) | 10]);      // pid 10, tid 11
            u64s(&[500]);                     // time
            u64s(&[2, 1, 2, 3]);              // regs abi 64-bit, bp sp ip
            u64s(&[size]);                    // stack size
            let words: Vec<u64> = (0..size / 8).map(|i| 0x1000 + i).collect();
            u64s(&words);                     // stack bytes
            u64s(&[live]);                    // dyn_size
            let mut rec = (kind::SAMPLE).to_ne_bytes().to_vec();
            rec.extend(0u16.to_ne_bytes());
            rec.extend(((body.len() + 8) as u16).to_ne_bytes());
            rec.extend(&body);
            rec
        };
        let layouts = Layouts::single(Role::Cpu, layout);
        let long = sample_rec(8192, DETACH_STACK_MIN + 8);
        let short = sample_rec(8192, DETACH_STACK_MIN - 8);
        let mut chunk = Chunk::default();
        for rec in [&short, &long, &short] {
            chunk.push_record(&layouts, rec, &ChunkPool::default(), None);
        }
        // The short ones as compact_record leaves them, the long one
        // without its stack, which comes beside it.
        let mut compacted = Vec::new();
        compact_record(&layouts, &short, &mut compacted);
        let recs: Vec<_> = split_records(&chunk.bytes).collect();
        assert_eq!(recs.len(), 3);
        assert_eq!((recs[0].2, recs[2].2), (&compacted[..], &compacted[..]));
        assert_eq!(chunk.stacks.len(), 1);
        assert_eq!(chunk.stacks[0].at, compacted.len());
        let live = (DETACH_STACK_MIN + 8) as usize;
        let whole = |d: &DetachedStack| match &d.stack {
            Detached::Whole(bytes) => bytes.clone(),
            Detached::Delta(d) => panic!("{d:?}"),
        };
        assert_eq!(whole(&chunk.stacks[0]), long[8 + 48 + 8..8 + 48 + 8 + live]);
        assert_eq!(chunk.len(), chunk.bytes.len() + live);
        let (k, misc, r) = recs[1];
        let PerfRecord::Sample(s) = parse_record(&layouts, k, misc, r).unwrap() else { panic!() };
        assert_eq!((s.pid, s.tid, s.time), (10, 11, 500));
        assert_eq!(*s.regs, [1, 2, 3]);
        assert!(s.stack.is_empty());
        // The size field sits where it did in the kernel's record.
        let PerfRecord::Sample(orig) = parse_record(&layouts, k, misc, &long).unwrap() else { panic!() };
        assert_eq!(s.stack_offset, orig.stack_offset);
        // With a pool, a stack buffer given back (its old bytes dropped)
        // holds the next long stack: the same bytes, no new allocation.
        let pool = ChunkPool::default();
        let old = vec![0xeeu8; 65536];
        let at = old.as_ptr();
        pool.give_stack(old);
        let mut pooled = Chunk::default();
        pooled.push_record(&layouts, &long, &pool, None);
        assert_eq!(pooled.bytes, chunk.bytes[compacted.len()..chunk.bytes.len() - compacted.len()]);
        assert_eq!(whole(&pooled.stacks[0]), whole(&chunk.stacks[0]));
        let Detached::Whole(bytes) = &pooled.stacks[0].stack else { panic!() };
        assert_eq!(bytes.as_ptr(), at);
        // With a keeper, the thread's stack goes as the blocks that
        // changed, whose, and where (the second register, bp sp ip).
        let mut keeper = Keeper::new(1);
        let mut delta = Chunk::default();
        let mut later = long.clone();
        later[16..24].copy_from_slice(&501u64.to_ne_bytes());
        for rec in [&long, &later] {
            delta.push_record(&layouts, rec, &pool, Some(&mut keeper));
        }
        assert_eq!(delta.bytes[..pooled.bytes.len()], pooled.bytes);
        assert_eq!(delta.bytes.len(), 2 * pooled.bytes.len());
        let deltas: Vec<&StackDelta> = delta.stacks.iter().map(|d| match &d.stack {
            Detached::Delta(d) => d,
            Detached::Whole(_) => panic!("sent whole"),
        }).collect();
        assert_eq!((deltas[0].pid, deltas[0].tid, deltas[0].sp, deltas[0].len), (10, 11, 2, live as u32));
        // The first whole, the second the same: nothing changed.
        assert_eq!(delta.deltas.changed, [(0, live as u32)]);
        assert_eq!(delta.deltas.bytes, whole(&chunk.stacks[0]));
        assert!(deltas[1].changed.is_empty());
        assert_eq!(delta.len(), delta.bytes.len() + live);
        // A copy not later than the thread's last one goes whole.
        delta.push_record(&layouts, &long, &pool, Some(&mut keeper));
        assert_eq!(whole(&delta.stacks[2]), whole(&chunk.stacks[0]));
        // Buffers too large for a stack copy are not kept.
        pool.give_stack(vec![0; (64 << 10) + 1]);
        assert!(pool.stack_copy(&[1, 2]).capacity() < 1024);
    }

    /// A kept stack buffer too small for the next copy is replaced by one
    /// of the next power of two (at most a whole copy's), not grown; one
    /// large enough is reused.
    #[test]
    fn stack_buffers_are_replaced_not_grown() {
        let pool = ChunkPool::default();
        pool.give_stack(Vec::with_capacity(100));
        let bytes: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let copy = pool.stack_copy(&bytes);
        assert_eq!(copy, bytes);
        assert!(copy.capacity() >= 8192);
        let at = copy.as_ptr();
        pool.give_stack(copy);
        let again = pool.stack_copy(&bytes[..4000]);
        assert_eq!((again.as_ptr(), &again[..]), (at, &bytes[..4000]));
        // Near the largest copy the kernel makes: a whole copy's buffer.
        let deep = vec![7u8; 65528];
        let copy = pool.stack_copy(&deep);
        assert_eq!((copy.len(), copy.capacity() >= 65528), (65528, true));
        assert!(copy.capacity() <= 64 << 10);
    }

    /// Garbage in the buffer (which the kernel never writes, but a bug
    /// might) yields errors or nothing, never a panic.
    #[test]
    fn random_bytes_never_panic() {
        use crate::linux::parse::{parse_record, tests};
        let (single, multi) = (tests::single(), tests::multi());
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let len = (next() % 200) as usize;
            let mut buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Make a plausible header now and then, so records get parsed.
            if buf.len() >= 8 && next() % 2 == 0 {
                let kind = [1u32, 2, 3, 4, 7, 9, 10, 13, 9, 14][(next() % 10) as usize];
                buf[..4].copy_from_slice(&kind.to_ne_bytes());
                let size = (8 + next() % (buf.len() as u64 - 7)) as u16;
                buf[6..8].copy_from_slice(&size.to_ne_bytes());
            }
            // Samples of the events of a multi-event recording now and then.
            if buf.len() >= 16 && next() % 2 == 0 {
                buf[8..16].copy_from_slice(&(next() % 5).to_ne_bytes());
            }
            for layout in [&single, &multi] {
                let mut out = Vec::new();
                let mut pos = 0;
                while pos < buf.len() {
                    let n = compact_samples(layout, &buf[pos..], &mut out, 64);
                    assert!(n > 0, "no progress");
                    pos += n;
                }
                for (k, misc, rec) in split_records(&buf) {
                    let _ = parse_record(layout, k, misc, rec);
                }
                for (k, misc, rec) in split_records(&out) {
                    let _ = parse_record(layout, k, misc, rec);
                }
            }
        }
    }

    /// Records laid out in a ring of `size` bytes from `tail` on, as the
    /// kernel writes them: `(kind, body length)` each, 8-aligned.
    fn ring_with(size: usize, tail: u64, records: &[(u32, usize)]) -> (Vec<u8>, u64) {
        let mut data = vec![0u8; size];
        let mut pos = tail;
        for (n, &(kind, body)) in records.iter().enumerate() {
            let mut rec = kind.to_ne_bytes().to_vec();
            rec.extend(0u16.to_ne_bytes());
            rec.extend(((body + 8) as u16).to_ne_bytes());
            rec.extend((0..body).map(|i| (n * 31 + i) as u8));
            for b in rec {
                data[(pos % size as u64) as usize] = b;
                pos += 1;
            }
        }
        (data, pos)
    }

    #[test]
    fn records_are_read_in_place_and_wrapped_ones_put_together() {
        // Three records from offset 40 of a 64-byte ring: the second runs
        // across the end, the third starts after it.
        let (data, head) = ring_with(64, 40, &[(9, 8), (9, 16), (9, 0)]);
        let mut wrapped = Vec::new();
        let mut seen = Vec::new();
        let mut ends = Vec::new();
        let n = for_each_record(&data, 40, head, &mut wrapped, |r, done| {
            seen.push(r.to_vec());
            ends.push(done);
        });
        assert_eq!(ends, [16, 40, 48]);
        assert_eq!(n, 48);
        assert_eq!(seen.len(), 3);
        let mut copied = Vec::new();
        copy_wrapped(&data, 40, head, &mut copied);
        assert_eq!(seen.concat(), copied);
        // Nothing new: no record.
        assert_eq!(
            for_each_record(&data, head, head, &mut wrapped, |_, _| panic!()),
            0
        );
    }

    #[test]
    fn a_malformed_header_ends_the_walk() {
        let (mut data, head) = ring_with(64, 0, &[(9, 8), (9, 8)]);
        // The second record claims 4 bytes.
        data[16 + 6..16 + 8].copy_from_slice(&4u16.to_ne_bytes());
        let mut seen = 0;
        let n = for_each_record(&data, 0, head, &mut Vec::new(), |_, _| seen += 1);
        assert_eq!((n, seen), (32, 1));
        // One claiming more than was written.
        let (mut data, head) = ring_with(64, 0, &[(9, 8)]);
        data[6..8].copy_from_slice(&40u16.to_ne_bytes());
        let mut seen = 0;
        for_each_record(&data, 0, head, &mut Vec::new(), |_, _| seen += 1);
        assert_eq!(seen, 0);
    }

    #[test]
    fn draining_in_place_compacts_as_copying_first_did() {
        use crate::linux::parse::tests;
        let (single, multi) = (tests::single(), tests::multi());
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2_000 {
            let size = 256usize;
            let mut data: Vec<u8> = (0..size).map(|_| next() as u8).collect();
            let tail = next() % 10_000 / 8 * 8;
            // Plausible headers at 8-aligned places, as the kernel writes.
            let mut pos = tail;
            let head = tail + next() % 250 / 8 * 8;
            while pos + 8 <= head {
                let len = (8 + next() % 64 / 8 * 8).min(head - pos) as u16;
                let at = (pos % size as u64) as usize;
                let kind = [9u32, 9, 3, 10][(next() % 4) as usize];
                data[at..at + 4].copy_from_slice(&kind.to_ne_bytes());
                data[at + 6..at + 8].copy_from_slice(&len.to_ne_bytes());
                pos += u64::from(len.max(8));
            }
            for layout in [&single, &multi] {
                let mut copied = Vec::new();
                copy_wrapped(&data, tail, head, &mut copied);
                let mut before = Vec::new();
                compact_samples(layout, &copied, &mut before, usize::MAX);
                let mut after = Vec::new();
                let mut wrapped = Vec::new();
                for_each_record(&data, tail, head, &mut wrapped, |r, _| {
                    compact_record(layout, r, &mut after)
                });
                assert_eq!(after, before);
            }
        }
    }
}
