//! Long stack copies on their way from the draining thread to the writer
//! thread, as the blocks that changed.
//!
//! A thread's consecutive copies are mostly the same bytes at the same
//! addresses. The draining thread keeps, per thread, what its copies held
//! by address ([`ByAddress`]), compares each new copy with it where the
//! copy lies in the ring buffer, and sends only the blocks that differ
//! ([`StackDelta`]). The writer thread keeps the same bytes per thread
//! and writes the blocks over them, in the order they were sent, which
//! puts each copy together again from memory it touched last
//! ([`Replicas`]). Both sides change their bytes alike for the same copies
//! in the same order, so they hold the same bytes; and what the writer
//! needs of the comparison (the runs equal to what was held, for the
//! trace's delta encoding, and the changed words, for the scan for
//! images) is found in the changed blocks alone. The sample then waits
//! for time order with its blocks only, and its bytes are copied out of
//! a second copy of the thread's bytes just before it is written
//! ([`Followers`]).
//!
//! Before, each deep copy was copied whole from the ring into a buffer the
//! writer thread then took, and compared whole again there: on a 40 KiB
//! stack at 10 kHz the copy cost 3.5 to 4.9 µs, of which 3.9 µs was
//! writing into memory the other thread had used last.

pub(crate) use lrnprof_format::ByAddress;
use lrnprof_format::{common_prefix_len, SameRuns};
use rustc_hash::{FxHashMap, FxHashSet};

/// Bytes compared and sent together.
pub(crate) const BLOCK: usize = 64;

/// Threads whose bytes each side holds at most (up to [`MAX_HELD_SPAN`](lrnprof_format::MAX_HELD_SPAN) each);
/// past it every thread is forgotten, on both sides, and the next copies
/// are sent whole.
const MAX_THREADS: usize = 512;

/// The changed blocks of the copies of one chunk, one copy after another.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    /// `(offset, length)` in its copy of each stretch of changed blocks.
    pub changed: Vec<(u32, u32)>,
    /// Their bytes, one after another.
    pub bytes: Vec<u8>,
}

/// A sample's stack copy as the draining thread sends it: the blocks that
/// differ from what the thread's copies held, in a chunk's [`Deltas`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StackDelta {
    pub pid: u32,
    pub tid: u32,
    /// AVMA of the copy's first byte.
    pub sp: u64,
    pub len: u32,
    /// Every thread's bytes are forgotten first, on both sides.
    pub forget_all: bool,
    /// How many times every thread was forgotten before this copy: a
    /// thread's bytes start afresh with each generation.
    pub generation: u32,
    /// The copy's stretches, `Deltas::changed[changed]`.
    pub changed: std::ops::Range<usize>,
    /// Where their bytes start in `Deltas::bytes`.
    pub bytes_at: usize,
}

/// The draining thread's side: what each thread's copies held.
#[derive(Debug, Default)]
pub(crate) struct StackKeeper {
    held: FxHashMap<(u32, u32), Kept>,
    /// Times every thread was forgotten.
    generation: u32,
}

#[derive(Debug, Default)]
struct Kept {
    bytes: ByAddress,
    /// The time of the thread's last copy sent as a delta.
    last_time: u64,
}

impl StackKeeper {
    /// Compare `stack`, thread `tid`'s copy of the bytes at `sp` (which
    /// [`ByAddress::can_hold`]) sampled at `time`, with what its copies
    /// held, add the blocks that differ to `out`, and hold `stack` from
    /// now on. `None`, holding nothing, for a copy not later than the
    /// thread's last one sent: it must travel whole, since the writer
    /// puts copies together a second time in time order (see
    /// [`Followers`]).
    pub fn delta(
        &mut self,
        pid: u32,
        tid: u32,
        sp: u64,
        time: u64,
        stack: &[u8],
        out: &mut Deltas,
    ) -> Option<StackDelta> {
        let key = (pid, tid);
        let known = match self.held.get(&key) {
            Some(k) if time <= k.last_time => return None,
            k => k.is_some(),
        };
        let forget_all = !known && self.held.len() >= MAX_THREADS;
        if forget_all {
            self.held.clear();
            self.generation = self.generation.wrapping_add(1);
        }
        let kept = self.held.entry(key).or_default();
        kept.last_time = time;
        let held = &mut kept.bytes;
        held.cover(sp, stack.len() as u64);
        let held = held.at(sp, stack.len());
        let (changed_from, bytes_at) = (out.changed.len(), out.bytes.len());
        changed_blocks(stack, held, |from, to| {
            out.changed.push((from as u32, (to - from) as u32));
            out.bytes.extend_from_slice(&stack[from..to]);
        });
        Some(StackDelta {
            pid,
            tid,
            sp,
            len: stack.len() as u32,
            forget_all,
            generation: self.generation,
            changed: changed_from..out.changed.len(),
            bytes_at,
        })
    }
}

/// Call `each(from, to)` for every stretch of whole [`BLOCK`]s (the last
/// may be cut by the end) of `new` that differ from `held`'s (of the same
/// length), in order, as long as they run on, and write it over `held`'s:
/// equal stretches are passed over at `memcmp`'s speed, and only changed
/// blocks compared one by one.
fn changed_blocks(new: &[u8], held: &mut [u8], mut each: impl FnMut(usize, usize)) {
    let n = new.len().min(held.len());
    let mut at = 0;
    while at < n {
        at += common_prefix_len(&new[at..n], &held[at..n]);
        if at >= n {
            break;
        }
        let from = at / BLOCK * BLOCK;
        let mut to = (from + BLOCK).min(n);
        while to < n {
            let end = (to + BLOCK).min(n);
            if new[to..end] == held[to..end] {
                break;
            }
            to = end;
        }
        held[from..to].copy_from_slice(&new[from..to]);
        each(from, to);
        at = to;
    }
}

/// The writer thread's side: what each thread's copies held, and the id
/// of its last copy.
#[derive(Debug, Default)]
pub(crate) struct Replicas {
    held: FxHashMap<(u32, u32), Replica>,
    /// Threads whose delta did not fit: their bytes are no longer the
    /// draining thread's, and their copies are refused until both sides
    /// forget every thread.
    broken: FxHashSet<(u32, u32)>,
}

#[derive(Debug, Default)]
struct Replica {
    bytes: ByAddress,
    /// The id of the last copy written over `bytes`, which hold it whole.
    last: Option<u64>,
}

/// What putting a copy together found, besides its bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Rebuilt {
    /// The copy (its hint's id) that `runs` are equal to wherever it
    /// reaches: the thread's last one, if it is held whole.
    pub base: Option<u64>,
    /// `(offset, length)` of the runs of the copy equal to what was held
    /// (those [`lrnprof_format::same_runs`] finds).
    pub runs: Vec<(u32, u32)>,
    /// `(offset, value)` of each aligned word (whole words only) that
    /// differs from what was held at its address, unless zero.
    pub words: Vec<(u32, u64)>,
}

/// A [`StackDelta`] that does not fit its chunk's [`Deltas`] (the
/// draining and writer threads disagree, which is a bug), or that no
/// stack could be (see [`ByAddress::can_hold`], which the draining thread
/// checks first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mismatch;

impl Replicas {
    /// Put the copy `d` together again from the blocks in `deltas`, named
    /// `id` (its bytes are then the thread's: [`view`](Self::view));
    /// `found` gets what was found on the way (emptied first).
    pub fn rebuild(
        &mut self,
        d: &StackDelta,
        deltas: &Deltas,
        id: u64,
        found: &mut Rebuilt,
    ) -> Result<(), Mismatch> {
        let key = (d.pid, d.tid);
        if d.forget_all {
            self.held.clear();
            self.broken.clear();
        }
        if self.broken.contains(&key) || !ByAddress::can_hold(d.sp, u64::from(d.len)) {
            return Err(Mismatch);
        }
        let result = self.put_together(d, deltas, id, found);
        if result.is_err() {
            self.held.remove(&key);
            self.broken.insert(key);
        }
        result
    }

    /// The `len` bytes thread `tid` holds at `sp`, if held.
    pub fn view(&self, pid: u32, tid: u32, sp: u64, len: usize) -> Option<&[u8]> {
        self.held.get(&(pid, tid))?.bytes.view(sp, len)
    }

    /// Thread `tid`'s bytes, taken out (left empty) until
    /// [`restore`](Self::restore)d, to be read while the caller's other
    /// state is borrowed.
    pub fn take(&mut self, pid: u32, tid: u32) -> Option<ByAddress> {
        self.held
            .get_mut(&(pid, tid))
            .map(|r| std::mem::take(&mut r.bytes))
    }

    /// Put back what [`take`](Self::take) took.
    pub fn restore(&mut self, pid: u32, tid: u32, bytes: ByAddress) {
        if let Some(r) = self.held.get_mut(&(pid, tid)) {
            r.bytes = bytes;
        }
    }

    fn put_together(
        &mut self,
        d: &StackDelta,
        deltas: &Deltas,
        id: u64,
        found: &mut Rebuilt,
    ) -> Result<(), Mismatch> {
        let replica = self.held.entry((d.pid, d.tid)).or_default();
        let kept = replica.bytes.cover(d.sp, u64::from(d.len));
        found.base = if kept { replica.last } else { None };
        replica.last = Some(id);
        let len = d.len as usize;
        let held = replica.bytes.at(d.sp, len);
        let changed = deltas.changed.get(d.changed.clone()).ok_or(Mismatch)?;
        let mut src = deltas.bytes.get(d.bytes_at..).ok_or(Mismatch)?;
        found.runs.clear();
        found.words.clear();
        let runs = &mut found.runs;
        let mut same = SameRuns::new(|from, len| runs.push((from as u32, len as u32)));
        let words_end = len / 8 * 8;
        let mut pos = 0;
        for &(from, n) in changed {
            let (from, n) = (from as usize, n as usize);
            let to = from.checked_add(n).filter(|&to| from >= pos && to <= len);
            let (Some(to), Some(new)) = (to, src.get(..n)) else {
                return Err(Mismatch);
            };
            src = &src[n..];
            same.equal(from - pos);
            same.compare(new, &held[from..to]);
            // Stretches start at block boundaries, which are words'.
            let mut at = from;
            while at + 8 <= to.min(words_end) {
                let word =
                    |b: &[u8], i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8"));
                let value = word(new, at - from);
                if value != word(held, at) && value != 0 {
                    found.words.push((at as u32, value));
                }
                at += 8;
            }
            held[from..to].copy_from_slice(new);
            pos = to;
        }
        same.equal(len - pos);
        same.finish();
        Ok(())
    }
}

/// The writer thread's second copy of each thread's bytes, brought up to
/// date as samples leave the time-ordering queue, just before each goes
/// to the trace writer: a sample's stack bytes are copied out of it then,
/// into the buffer the trace writer has just released, instead of into a
/// buffer of their own when the sample is converted (which, by the time
/// it is written, a round of samples later, is out of the cache).
///
/// Each thread's changed blocks are logged as the copies are put
/// together ([`log`](Self::log)) and applied in the same order when a
/// sample's bytes are wanted ([`bytes`](Self::bytes)). Samples leave the
/// queue in time order, and the draining thread sends as changed blocks
/// only copies later than the thread's last one sent that way, so a
/// thread's samples are wanted in the order their blocks were logged; a
/// sample dropped on the way ([`drop_later`](Self::drop_later)) has its
/// blocks applied all the same.
#[derive(Debug, Default)]
pub(crate) struct Followers {
    /// By generation (see [`StackDelta::generation`]), pid and tid.
    threads: FxHashMap<(u32, u32, u32), Follower>,
    /// The latest generation logged.
    latest: u32,
    /// Logged steps already applied, for their buffers.
    spare: Vec<Step>,
}

#[derive(Debug, Default)]
struct Follower {
    bytes: ByAddress,
    /// Steps logged so far.
    logged: u64,
    /// Steps applied to `bytes` so far.
    applied: u64,
    /// Steps not applied yet, in order.
    log: std::collections::VecDeque<Step>,
    /// A step did not fit (a bug): no more bytes for this generation.
    broken: bool,
}

/// The blocks of one copy, as [`StackDelta`] gives them.
#[derive(Debug, Default)]
struct Step {
    seq: u64,
    sp: u64,
    len: u32,
    changed: Vec<(u32, u32)>,
    bytes: Vec<u8>,
    /// Its sample will never ask for its bytes.
    dropped: bool,
}

/// Spare steps kept at most.
const MAX_SPARE_STEPS: usize = 256;

/// Where a sample's stack bytes will be: the copy logged as step `seq` of
/// a thread's bytes in [`Followers`], of which the sample keeps `keep`
/// bytes at `sp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Later {
    generation: u32,
    pid: u32,
    tid: u32,
    seq: u64,
    pub sp: u64,
    /// Bytes the sample keeps (the copy's, or fewer).
    pub keep: u32,
}

impl Later {
    /// Whose stack it is.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whose stack it is.
    pub fn tid(&self) -> u32 {
        self.tid
    }
}

impl Followers {
    /// Log the changed blocks of `d` (in `deltas`, which
    /// [`Replicas::rebuild`] took without a mismatch) as its thread's
    /// next step.
    pub fn log(&mut self, d: &StackDelta, deltas: &Deltas) -> Result<Later, Mismatch> {
        let changed = deltas.changed.get(d.changed.clone()).ok_or(Mismatch)?;
        let n: usize = changed.iter().map(|&(_, n)| n as usize).sum();
        let bytes = deltas
            .bytes
            .get(d.bytes_at..)
            .and_then(|b| b.get(..n))
            .ok_or(Mismatch)?;
        if d.generation != self.latest {
            // Threads of the generation before may still have samples
            // waiting; older ones not.
            self.latest = d.generation;
            let latest = self.latest;
            self.threads
                .retain(|&(g, _, _), _| g == latest || g.wrapping_add(1) == latest);
        }
        let f = self
            .threads
            .entry((d.generation, d.pid, d.tid))
            .or_default();
        let mut step = self.spare.pop().unwrap_or_default();
        step.seq = f.logged;
        step.sp = d.sp;
        step.len = d.len;
        step.changed.clear();
        step.changed.extend_from_slice(changed);
        step.bytes.clear();
        step.bytes.extend_from_slice(bytes);
        step.dropped = false;
        f.logged += 1;
        f.log.push_back(step);
        Ok(Later {
            generation: d.generation,
            pid: d.pid,
            tid: d.tid,
            seq: f.logged - 1,
            sp: d.sp,
            keep: d.len,
        })
    }

    /// The bytes of `later`'s copy that its sample keeps; `Mismatch` if
    /// the copy is no longer to be had (a later copy of the thread was
    /// asked for first, or its generation was forgotten).
    pub fn bytes(&mut self, later: &Later) -> Result<&[u8], Mismatch> {
        let f = self
            .threads
            .get_mut(&(later.generation, later.pid, later.tid))
            .ok_or(Mismatch)?;
        if f.broken || f.applied > later.seq {
            return Err(Mismatch);
        }
        apply(f, later.seq + 1, false, &mut self.spare)?;
        if f.applied != later.seq + 1 {
            return Err(Mismatch);
        }
        f.bytes.view(later.sp, later.keep as usize).ok_or(Mismatch)
    }

    /// `later`'s sample will not ask for its bytes: its blocks are applied
    /// once the thread's earlier samples had theirs.
    pub fn drop_later(&mut self, later: &Later) {
        let Some(f) = self
            .threads
            .get_mut(&(later.generation, later.pid, later.tid))
        else {
            return;
        };
        if let Some(step) = f.log.iter_mut().find(|s| s.seq == later.seq) {
            step.dropped = true;
        }
        // Dropped steps at the front wait for no one.
        let _ = apply(f, f.applied, true, &mut self.spare);
    }
}

/// Apply `f`'s logged steps up to step `upto` (excluded), and, with
/// `dropped`, the dropped steps right after it. A step that does not fit
/// breaks the thread's bytes for good.
fn apply(
    f: &mut Follower,
    upto: u64,
    dropped: bool,
    spare: &mut Vec<Step>,
) -> Result<(), Mismatch> {
    if f.broken {
        return Err(Mismatch);
    }
    while let Some(step) = f.log.front() {
        if step.seq >= upto && !(dropped && step.dropped) {
            break;
        }
        let step = f.log.pop_front().expect("a front step");
        f.applied = step.seq + 1;
        let len = step.len as usize;
        if !ByAddress::can_hold(step.sp, step.len.into()) {
            f.broken = true;
            return Err(Mismatch);
        }
        f.bytes.cover(step.sp, step.len.into());
        let held = f.bytes.at(step.sp, len);
        let mut src = &step.bytes[..];
        for &(from, n) in &step.changed {
            let (from, n) = (from as usize, n as usize);
            let (Some(dst), Some(new)) = (held.get_mut(from..from + n), src.get(..n)) else {
                f.broken = true;
                return Err(Mismatch);
            };
            dst.copy_from_slice(new);
            src = &src[n..];
        }
        if spare.len() < MAX_SPARE_STEPS {
            spare.push(step);
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use lrnprof_format::same_runs;

    /// Pseudo-random numbers below their argument (0 for 0), from `seed`.
    pub(crate) fn random_below(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if n == 0 {
                0
            } else {
                x % n
            }
        }
    }

    /// Copies of a few threads, moving up and down and changing here and
    /// there, come out of the writer's side as they went into the
    /// draining side, with the runs and changed words a whole comparison
    /// with what the thread's copies held finds.
    #[test]
    fn copies_are_put_together_as_they_were_sent() {
        let mut next = random_below(0x9e37_79b9_7f4a_7c15);
        let mut keeper = StackKeeper::default();
        let mut replicas = Replicas::default();
        // What a plain comparison holds, per thread.
        let mut plain: FxHashMap<u32, (ByAddress, Option<u64>)> = FxHashMap::default();
        let mut stacks: Vec<Vec<u8>> = (0..3).map(|_| vec![0; 24_000]).collect();
        let top = 0x7fff_0000u64;
        let mut id = 0;
        let mut found = Rebuilt::default();
        let mut deltas = Deltas::default();
        for round in 0..3000 {
            let tid = next(3) as u32;
            let stack = &mut stacks[tid as usize];
            for _ in 0..next(6) {
                let at = next(stack.len() as u64) as usize;
                for b in stack.iter_mut().skip(at).take(1 + next(100) as usize) {
                    if next(4) > 0 {
                        *b = b.wrapping_add(1 + next(255) as u8);
                    }
                }
            }
            // Deeper or shallower, now and then misaligned or far away.
            let depth = (2048 + next(18_000) as usize) & !7;
            let mut sp = top - depth as u64;
            if next(50) == 0 {
                sp += 4;
            }
            if next(80) == 0 {
                sp -= 1 << 20;
            }
            let copy = &stack[stack.len() - depth..];
            if next(4) == 0 {
                deltas = Deltas::default();
            }
            let d = keeper
                .delta(1, tid, sp, round + 1, copy, &mut deltas)
                .unwrap();
            id += 1;
            replicas.rebuild(&d, &deltas, id, &mut found).unwrap();
            let got = replicas.view(1, tid, sp, copy.len());
            assert_eq!(got, Some(copy), "round {round}");
            // Against a plain comparison of the whole copy.
            let (held, last) = plain.entry(tid).or_default();
            let kept = held.cover(sp, copy.len() as u64);
            assert_eq!(found.base, if kept { *last } else { None }, "round {round}");
            *last = Some(id);
            let held = held.at(sp, copy.len());
            let mut runs = Vec::new();
            same_runs(copy, held, |from, len| runs.push((from as u32, len as u32)));
            assert_eq!(found.runs, runs, "round {round}");
            let words: Vec<(u32, u64)> = (0..copy.len() / 8 * 8)
                .step_by(8)
                .filter_map(|at| {
                    let w = |b: &[u8]| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
                    (w(copy) != w(held) && w(copy) != 0).then(|| (at as u32, w(copy)))
                })
                .collect();
            assert_eq!(found.words, words, "round {round}");
            held.copy_from_slice(copy);
        }
    }

    /// Only the changed blocks travel, and a copy held whole again sends
    /// nothing.
    #[test]
    fn only_changed_blocks_are_sent() {
        let mut keeper = StackKeeper::default();
        let mut deltas = Deltas::default();
        let mut stack = vec![7u8; 4000];
        let d = keeper.delta(1, 2, 0x1000, 1, &stack, &mut deltas).unwrap();
        assert_eq!(deltas.changed[d.changed.clone()], [(0, 4000)]);
        let d = keeper.delta(1, 2, 0x1000, 2, &stack, &mut deltas).unwrap();
        assert!(d.changed.is_empty());
        stack[100] = 1;
        stack[130] = 1;
        stack[3999] = 1;
        let before = deltas.bytes.len();
        let d = keeper.delta(1, 2, 0x1000, 3, &stack, &mut deltas).unwrap();
        assert_eq!(deltas.changed[d.changed.clone()], [(64, 128), (3968, 32)]);
        assert_eq!(d.bytes_at, before);
        assert_eq!(deltas.bytes.len() - before, 160);
    }

    /// Past the threads held, both sides forget them all at the same copy.
    #[test]
    fn both_sides_forget_together() {
        let mut keeper = StackKeeper::default();
        let mut replicas = Replicas::default();
        let mut deltas = Deltas::default();
        let mut found = Rebuilt::default();
        let stack = vec![3u8; 256];
        for tid in 0..=MAX_THREADS as u32 {
            let d = keeper
                .delta(1, tid, 0x1000, 1, &stack, &mut deltas)
                .unwrap();
            assert_eq!(d.forget_all, tid == MAX_THREADS as u32);
            assert_eq!(d.generation, u32::from(tid == MAX_THREADS as u32));
            replicas
                .rebuild(&d, &deltas, u64::from(tid), &mut found)
                .unwrap();
        }
        assert_eq!((keeper.held.len(), replicas.held.len()), (1, 1));
        // Thread 0 was forgotten: sent whole, no base.
        let d = keeper.delta(1, 0, 0x1000, 2, &stack, &mut deltas).unwrap();
        assert_eq!(deltas.changed[d.changed.clone()], [(0, 256)]);
        replicas.rebuild(&d, &deltas, 999, &mut found).unwrap();
        assert_eq!(found.base, None);
    }

    /// A delta that does not fit its blocks is refused, not trusted.
    #[test]
    fn a_delta_past_its_blocks_is_a_mismatch() {
        let mut replicas = Replicas::default();
        let mut found = Rebuilt::default();
        let deltas = Deltas {
            changed: vec![(0, 64), (32, 64)],
            bytes: vec![1; 128],
        };
        let d = StackDelta {
            pid: 1,
            tid: 1,
            sp: 0x1000,
            len: 128,
            forget_all: false,
            generation: 0,
            changed: 0..2,
            bytes_at: 0,
        };
        assert_eq!(replicas.rebuild(&d, &deltas, 1, &mut found), Err(Mismatch));
        let past = StackDelta {
            changed: 0..3,
            ..d.clone()
        };
        assert_eq!(
            replicas.rebuild(&past, &deltas, 2, &mut found),
            Err(Mismatch)
        );
        let short = StackDelta {
            bytes_at: 100,
            changed: 0..1,
            ..d
        };
        assert_eq!(
            replicas.rebuild(&short, &deltas, 3, &mut found),
            Err(Mismatch)
        );
        // The thread's later copies are refused, until all are forgotten.
        let fine = StackDelta {
            changed: 0..1,
            bytes_at: 0,
            ..short
        };
        assert_eq!(
            replicas.rebuild(&fine, &deltas, 4, &mut found),
            Err(Mismatch)
        );
        // Where no stack can be (the top of the address space): refused.
        let top = StackDelta {
            forget_all: true,
            sp: u64::MAX - 100,
            ..fine.clone()
        };
        assert_eq!(
            replicas.rebuild(&top, &deltas, 5, &mut found),
            Err(Mismatch)
        );
        let fresh = StackDelta {
            forget_all: true,
            ..fine
        };
        let mut whole = vec![1; 64];
        whole.resize(128, 0);
        assert_eq!(replicas.rebuild(&fresh, &deltas, 5, &mut found), Ok(()));
        assert_eq!(replicas.view(1, 1, 0x1000, 128), Some(&whole[..]));
    }

    /// A copy not later than the thread's last one sent as a delta is
    /// refused (it travels whole) and held nowhere: the next delta is
    /// against the copy before it.
    #[test]
    fn copies_out_of_time_order_are_not_deltas() {
        let mut keeper = StackKeeper::default();
        let mut deltas = Deltas::default();
        let stack = vec![7u8; 4000];
        assert!(keeper.delta(1, 2, 0x1000, 5, &stack, &mut deltas).is_some());
        let other = vec![9u8; 4000];
        assert_eq!(keeper.delta(1, 2, 0x1000, 5, &other, &mut deltas), None);
        assert_eq!(keeper.delta(1, 2, 0x1000, 3, &other, &mut deltas), None);
        // Another thread is not held back.
        assert!(keeper.delta(1, 3, 0x1000, 4, &other, &mut deltas).is_some());
        let d = keeper.delta(1, 2, 0x1000, 6, &stack, &mut deltas).unwrap();
        assert!(d.changed.is_empty());
    }

    /// The followers give every copy's bytes when asked in the order the
    /// copies were logged, each thread on its own, with some samples
    /// dropped on the way, across both sides forgetting every thread; a
    /// copy asked for after a later one of its thread is refused.
    #[test]
    fn followers_give_each_copy_asked_in_order() {
        let mut next = random_below(0x3c6e_f372_fe94_f82b);
        let mut keeper = StackKeeper::default();
        let mut replicas = Replicas::default();
        let mut followers = Followers::default();
        let mut found = Rebuilt::default();
        let mut deltas = Deltas::default();
        let top = 0x7fff_0000u64;
        let threads = 6u32;
        let mut stacks: Vec<Vec<u8>> = (0..threads).map(|_| vec![0; 16_000]).collect();
        // Per thread, the copies logged and not asked for yet.
        let mut waiting: Vec<std::collections::VecDeque<(Later, Vec<u8>)>> =
            (0..threads).map(|_| Default::default()).collect();
        let (mut asked, mut dropped) = (0, 0);
        for round in 0..4000u64 {
            if next(500) == 0 {
                // Enough other threads for both sides to forget them all.
                for tid in 100..100 + MAX_THREADS as u32 {
                    let d = keeper
                        .delta(1, tid, 0x1000, round + 1, &[1; 64], &mut deltas)
                        .unwrap();
                    replicas.rebuild(&d, &deltas, 0, &mut found).unwrap();
                    let later = followers.log(&d, &deltas).unwrap();
                    followers.drop_later(&later);
                }
            }
            let tid = next(u64::from(threads)) as u32;
            let stack = &mut stacks[tid as usize];
            for _ in 0..next(6) {
                let at = next(stack.len() as u64) as usize;
                for b in stack.iter_mut().skip(at).take(1 + next(100) as usize) {
                    *b = b.wrapping_add(1 + next(255) as u8);
                }
            }
            let depth = (2048 + next(12_000) as usize) & !7;
            let sp = top - depth as u64;
            let copy = &stack[stack.len() - depth..];
            if next(4) == 0 {
                deltas = Deltas::default();
            }
            let d = keeper
                .delta(1, tid, sp, round + 1, copy, &mut deltas)
                .unwrap();
            replicas.rebuild(&d, &deltas, round, &mut found).unwrap();
            let mut later = followers.log(&d, &deltas).unwrap();
            later.keep = (later.keep as u64 - next(later.keep as u64 / 2)) as u32;
            waiting[tid as usize].push_back((later, copy[..later.keep as usize].to_vec()));
            // Ask for (or drop) some of one thread's copies, oldest first.
            let t = next(u64::from(threads)) as usize;
            for _ in 0..next(4) {
                let Some((later, bytes)) = waiting[t].pop_front() else {
                    break;
                };
                if next(5) == 0 {
                    followers.drop_later(&later);
                    dropped += 1;
                } else {
                    assert_eq!(followers.bytes(&later), Ok(&bytes[..]), "round {round}");
                    asked += 1;
                }
            }
        }
        assert!(asked > 2000 && dropped > 400, "{asked} {dropped}");
        // Two more copies, asked for last first: only the last is given.
        let mut two = Vec::new();
        for (time, byte) in [(5000, 1u8), (5001, 2)] {
            let copy = vec![byte; 4096];
            let d = keeper
                .delta(1, 0, top - 4096, time, &copy, &mut deltas)
                .unwrap();
            replicas.rebuild(&d, &deltas, time, &mut found).unwrap();
            two.push((followers.log(&d, &deltas).unwrap(), copy));
        }
        assert_eq!(followers.bytes(&two[1].0), Ok(&two[1].1[..]));
        assert_eq!(followers.bytes(&two[0].0), Err(Mismatch));
    }
}
