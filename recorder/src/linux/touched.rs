//! Which images the samples touch (their data is embedded at the end), and
//! the code addresses in them that the trace may need names for (each is
//! resolved once into the image's frame table at the end): every sampled
//! instruction pointer, and every callchain entry, link register and stack
//! word that points into an executable mapping of an image, as a return
//! address would. Runs on the writer thread, for every sample: only the
//! stack words that differ from what the thread's earlier copies held at
//! the same address are looked at, and each lookup is a bounds test and a
//! binary search.

use super::replica::{ByAddress, Rebuilt};
use lrnprof_format::{same_runs, BuildId, ImageMapRecord, StackHint};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{HashMap, HashSet};

/// Code addresses remembered at most, over all images (about 40 bytes
/// each); past it new ones are counted as left out.
pub(crate) const MAX_ADDRESSES: usize = 1 << 20;

/// Keep at most this many threads' seen stacks (see [`SeenStack`]); past
/// it they are forgotten and the next copies scanned whole.
const MAX_SEEN_STACKS: usize = 4096;

/// Hints' runs buffers kept for reuse at most (samples wait to be put in
/// time order with their hints, which come back in batches), and the
/// largest kept (runs of 8 bytes; a stack has a few): 512 KiB at most.
const MAX_SPARE_RUNS: usize = 1024;
const MAX_SPARE_RUNS_LEN: usize = 64;

/// Emptied lists of lookups in no image kept for reuse at most, and the
/// largest kept (entries of 24 bytes): 1.5 MiB at most.
const MAX_SPARE_UNPLACED: usize = 8;
const MAX_SPARE_UNPLACED_LEN: usize = 8192;

/// Emptied buffers kept for the next ones: at most `N`, none with room
/// for more than `LEN` items.
struct Spares<T, const N: usize, const LEN: usize>(Vec<Vec<T>>);

impl<T, const N: usize, const LEN: usize> Default for Spares<T, N, LEN> {
    fn default() -> Self {
        Spares(Vec::new())
    }
}

impl<T, const N: usize, const LEN: usize> Spares<T, N, LEN> {
    /// A kept buffer, or a new one.
    fn take(&mut self) -> Vec<T> {
        self.0.pop().unwrap_or_default()
    }

    /// Keep `v`, emptied, unless enough are kept or it is too large.
    fn give(&mut self, mut v: Vec<T>) {
        if self.0.len() < N && v.capacity() <= LEN {
            v.clear();
            self.0.push(v);
        }
    }
}

/// An executable mapping of an image with a build id, in one process.
struct TouchRange {
    start: u64,
    end: u64,
    file_offset: u64,
    /// Index into [`Touched::images`].
    image: usize,
}

/// What the samples touched of one image.
#[derive(Debug)]
pub(crate) struct TouchedImage {
    pub id: BuildId,
    pub touched: bool,
    /// Lookup addresses (file offsets) of sampled instruction pointers.
    pub ips: FxHashSet<u64>,
    /// Lookup addresses (file offsets) of possible return addresses
    /// (minus one, inside the call instruction).
    pub returns: FxHashSet<u64>,
    /// Addresses not remembered, past [`MAX_ADDRESSES`].
    pub left_out: u64,
}

impl TouchedImage {
    /// The lookup addresses to resolve, most important first: instruction
    /// pointers (the leaves every profile shows), then return addresses,
    /// each group sorted.
    pub fn lookups(&self) -> Vec<u64> {
        let mut ips: Vec<u64> = self.ips.iter().copied().collect();
        ips.sort_unstable();
        let mut returns: Vec<u64> = self
            .returns
            .iter()
            .copied()
            .filter(|a| !self.ips.contains(a))
            .collect();
        returns.sort_unstable();
        ips.extend(returns);
        ips
    }
}

/// What samples touched, for embedding.
#[derive(Default)]
pub(crate) struct Touched {
    /// Whether code addresses are remembered (for frame tables), not only
    /// which images were touched.
    collect: bool,
    /// Per process: its mappings sorted by start. Rebuilt when dirty.
    index: FxHashMap<u32, Vec<TouchRange>>,
    dirty: FxHashSet<u32>,
    pub images: Vec<TouchedImage>,
    image_ids: HashMap<BuildId, usize>,
    addresses: usize,
    /// What each thread's stack copies held, so only the words that
    /// changed are looked up.
    seen_stacks: FxHashMap<(u32, u32), SeenStack>,
    /// The changed words of the sample at hand (kept for its allocation).
    words: Vec<u64>,
    /// Buffers of hints' runs the trace writer is done with, for the next
    /// samples' hints: no allocation per sample.
    spare_runs: Spares<(u32, u32), MAX_SPARE_RUNS, MAX_SPARE_RUNS_LEN>,
    /// Lookups of processes whose mappings are not known yet, done once
    /// they are: a forked child's allocation sampler can report before
    /// the recorder has read the fork from the kernel.
    waiting: HashMap<u32, Vec<(u64, bool)>>,
    waiting_len: usize,
    /// Per process: lookups that fell in no image, while a late mapping may
    /// still place them.
    unplaced: FxHashMap<u32, Vec<Unplaced>>,
    unplaced_len: usize,
    /// Lists of `unplaced` emptied by [`Touched::round`], for the next
    /// ones: most lookups that fall in no image are heap pointers, kept
    /// only until the round after, so a process's list is filled and
    /// emptied again every round.
    spare_unplaced: Spares<Unplaced, MAX_SPARE_UNPLACED, MAX_SPARE_UNPLACED_LEN>,
    /// Processes whose mappings changed since the last [`Touched::round`].
    changed: HashSet<u32>,
    /// The id of the last stack copy compared (see [`StackHint::id`]).
    last_id: u64,
    /// Counts changes of mappings: when each process's last changed, and
    /// when each thread's copy put together from changed blocks was last
    /// looked up (see [`Touched::sample_rebuilt`]).
    epoch: u64,
    changed_at: FxHashMap<u32, u64>,
    scanned_at: FxHashMap<(u32, u32), u64>,
}

/// Processes whose last change of mappings is remembered at most.
const MAX_CHANGED_AT: usize = 1 << 16;

/// Lookups kept at most while their processes' mappings are unknown.
const MAX_WAITING: usize = 1 << 20;

/// Lookups kept at most while they may still fall in a mapping heard of
/// late (see [`Unplaced`]).
const MAX_UNPLACED: usize = 1 << 20;

/// A lookup that fell in no image of its process. Records come from one
/// ring per CPU, so the mapping of a sample's code can be heard after the
/// sample (from another CPU's ring) although it was made before: such
/// lookups are kept, and looked up again when the process's mappings
/// change, until every ring has been read past the sample's time.
#[derive(Debug, Clone, Copy)]
struct Unplaced {
    /// The sample's time.
    time: u64,
    addr: u64,
    is_ip: bool,
}

/// Which missed lookups of a sample are worth keeping as [`Unplaced`].
struct Keep {
    time: u64,
    /// The sample's stack copy: words pointing into it are no code.
    stack: std::ops::Range<u64>,
}

impl Keep {
    /// Whether `addr` may be code: user space (top bit clear: AArch64 maps
    /// libraries just under 2^48, x86-64 with 5-level paging may go above
    /// 2^47), above the lowest pages, not in the stack copy.
    fn may_be_code(&self, addr: u64) -> bool {
        (0x10000..1 << 63).contains(&addr) && !self.stack.contains(&addr)
    }
}

/// What one sample refers to.
pub(crate) struct SampleRefs<'a> {
    pub pid: u32,
    pub tid: u32,
    /// Instruction pointer.
    pub ip: u64,
    /// AArch64 link register (a return address until the leaf saves it).
    pub lr: Option<u64>,
    /// The kernel's callchain, innermost first, markers removed.
    pub callchain: &'a [u64],
    /// AVMA of the stack copy's first byte.
    pub sp: u64,
    /// The sample's time.
    pub time: u64,
    /// The stack copy.
    pub stack: &'a [u8],
    /// The copy is a 32-bit task's: its return addresses are 4-byte words,
    /// two to each 8-byte word compared.
    pub words32: bool,
}

impl Touched {
    /// Nothing touched yet; with `collect`, code addresses are remembered.
    pub fn new(collect: bool) -> Touched {
        Touched {
            collect,
            ..Touched::default()
        }
    }

    /// Process `pid`'s mappings changed (or it is gone).
    pub fn mappings_changed(&mut self, pid: u32) {
        self.index.remove(&pid);
        self.dirty.insert(pid);
        self.changed.insert(pid);
        self.epoch += 1;
        if !self.changed_at.contains_key(&pid) && self.changed_at.len() >= MAX_CHANGED_AT {
            // Forget when each process changed, and so when each thread
            // was looked up: every next copy is looked up whole.
            self.changed_at.clear();
            self.scanned_at.clear();
        }
        self.changed_at.insert(pid, self.epoch);
    }

    /// Every ring has been read past time `before`: look up again what
    /// fell in no image of a process whose mappings changed since, and
    /// forget what belongs to samples older than `before` (no mapping
    /// made before them can come any more).
    /// `then(pid, time)` gives what `pid` had mapped at `time` when some
    /// of it has ended since (see [`Touched::sample`]).
    pub fn round(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        before: u64,
        then: impl Fn(u32, u64) -> Option<Vec<ImageMapRecord>>,
    ) {
        for pid in std::mem::take(&mut self.changed) {
            let Some(list) = self.unplaced.remove(&pid) else {
                continue;
            };
            self.unplaced_len -= list.len();
            if maps.contains_key(&pid) {
                self.ensure_index(maps, pid);
            }
            let index = std::mem::take(&mut self.index);
            let ranges = index.get(&pid).map_or(&[][..], Vec::as_slice);
            let still: Vec<Unplaced> = list
                .into_iter()
                .filter(|u| {
                    if self.place(ranges, u.addr, u.is_ip) {
                        return false;
                    }
                    let Some(old) = then(pid, u.time) else {
                        return true;
                    };
                    let old = self.ranges_of(&old);
                    !self.place(&old, u.addr, u.is_ip)
                })
                .collect();
            self.index = index;
            if !still.is_empty() {
                self.unplaced_len += still.len();
                self.unplaced.insert(pid, still);
            }
        }
        let mut len = 0;
        let spare = &mut self.spare_unplaced;
        self.unplaced.retain(|_, list| {
            list.retain(|u| u.time >= before);
            len += list.len();
            let keep = !list.is_empty();
            if !keep {
                spare.give(std::mem::take(list));
            }
            keep
        });
        self.unplaced_len = len;
    }

    /// Process `pid`'s mappings became known: do the lookups that waited
    /// for them.
    pub fn mappings_known(&mut self, maps: &HashMap<u32, Vec<ImageMapRecord>>, pid: u32) {
        if let Some(waiting) = self.waiting.remove(&pid) {
            self.waiting_len -= waiting.len();
            self.touch(maps, pid, waiting);
        }
    }

    /// Note what a sample refers to. `maps` are the current executable
    /// mappings of each process; `then`, those the sample's process had at
    /// its time when some have ended since (the sample heard after its
    /// process exec'd, exited or unmapped them). Unchanged stack words
    /// were looked up when they first appeared; every copy is scanned
    /// whole again after its process's mappings change. Returns what the
    /// comparison found of the stack copy, for the trace writer (see
    /// [`StackHint`]): the runs equal to the thread's previous copy, when
    /// it is held whole.
    pub fn sample(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        then: Option<&[ImageMapRecord]>,
        s: &SampleRefs<'_>,
    ) -> StackHint {
        let (pid, tid) = (s.pid, s.tid);
        if self.dirty.contains(&pid) {
            self.seen_stacks.retain(|&(p, _), _| p != pid);
        }
        if !self.seen_stacks.contains_key(&(pid, tid)) && self.seen_stacks.len() >= MAX_SEEN_STACKS
        {
            self.seen_stacks.clear();
        }
        let mut seen = self.seen_stacks.remove(&(pid, tid)).unwrap_or_default();
        let mut words = std::mem::take(&mut self.words);
        words.clear();
        let mut hint = StackHint {
            id: self.next_id(),
            base: None,
            runs: self.spare_runs.take(),
        };
        hint.base = seen.update(s.sp, s.stack, hint.id, &mut hint.runs, |w| words.push(w));
        if s.words32 {
            split_words(&mut words);
        }
        self.look_up(maps, then, s, &words);
        self.words = words;
        self.seen_stacks.insert((pid, tid), seen);
        hint
    }

    /// Like [`sample`](Self::sample), for a copy the writer put together
    /// from the blocks that changed (see `replica`), named `id`: `rebuilt`
    /// is what that found against the thread's earlier copies, over the
    /// whole copy, of which the sample keeps `s.stack`. A thread's first
    /// copy after its process's mappings changed is looked up whole.
    pub fn sample_rebuilt(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        then: Option<&[ImageMapRecord]>,
        s: &SampleRefs<'_>,
        id: u64,
        rebuilt: &Rebuilt,
    ) -> StackHint {
        let keep = s.stack.len();
        let mut words = std::mem::take(&mut self.words);
        words.clear();
        if self.scan_whole((s.pid, s.tid)) {
            words.extend(
                s.stack
                    .chunks_exact(8)
                    .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
                    .filter(|&w| w != 0),
            );
        } else {
            words.extend(
                rebuilt
                    .words
                    .iter()
                    .filter(|&&(at, _)| at as usize + 8 <= keep)
                    .map(|&(_, w)| w),
            );
        }
        let mut hint = StackHint {
            id,
            base: rebuilt.base,
            runs: self.spare_runs.take(),
        };
        if s.words32 {
            split_words(&mut words);
        }
        // The runs of the part kept.
        hint.runs
            .extend(rebuilt.runs.iter().filter_map(|&(from, len)| {
                let room = keep.checked_sub(from as usize).filter(|&r| r > 0)?;
                Some((from, len.min(room as u32)))
            }));
        self.look_up(maps, then, s, &words);
        self.words = words;
        hint
    }

    /// Whether thread `key`'s copy must be looked up whole: its process's
    /// mappings changed since its last copy, or that is not known.
    fn scan_whole(&mut self, key: (u32, u32)) -> bool {
        let changed = self.changed_at.get(&key.0).copied().unwrap_or(0);
        if !self.scanned_at.contains_key(&key) && self.scanned_at.len() >= MAX_SEEN_STACKS {
            self.scanned_at.clear();
        }
        let last = self.scanned_at.insert(key, self.epoch);
        last.is_none_or(|last| last < changed)
    }

    /// A number for a stack copy, given to no other (see
    /// [`StackHint::id`]).
    pub fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// Look up what sample `s` refers to: its instruction pointer, its
    /// callchain, link register and the stack `words` that changed.
    fn look_up(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        then: Option<&[ImageMapRecord]>,
        s: &SampleRefs<'_>,
        words: &[u64],
    ) {
        let pid = s.pid;
        // Return addresses are looked up one byte back, inside their call.
        // The callchain starts with the instruction pointer itself.
        let chain = match s.callchain.split_first() {
            Some((&first, rest)) if first == s.ip => rest,
            _ => s.callchain,
        };
        let returns = chain
            .iter()
            .copied()
            .chain(s.lr)
            .chain(words.iter().copied())
            .map(|a| a.wrapping_sub(1));
        let lookups = std::iter::once((s.ip, true)).chain(returns.map(|a| (a, false)));
        let keep = Keep {
            time: s.time,
            stack: s.sp..s.sp.saturating_add(s.stack.len() as u64),
        };
        if let Some(then) = then {
            let ranges = self.ranges_of(then);
            self.touch_in(&ranges, pid, lookups, Some(&keep));
        } else if maps.contains_key(&pid) {
            self.touch_keeping(maps, pid, lookups, Some(&keep));
        } else if self.waiting_len < MAX_WAITING {
            let waiting = self.waiting.entry(pid).or_default();
            let before = waiting.len();
            waiting.extend(lookups.take(MAX_WAITING - self.waiting_len));
            self.waiting_len += waiting.len() - before;
        }
    }

    /// Keep `runs`, a hint's, for a later sample's hint (see
    /// [`MAX_SPARE_RUNS`]).
    pub fn recycle_runs(&mut self, runs: Vec<(u32, u32)>) {
        self.spare_runs.give(runs);
    }

    /// Note that process `pid` refers to each of `lookups` (AVMA, whether
    /// it is an instruction pointer).
    pub fn touch(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        pid: u32,
        lookups: impl IntoIterator<Item = (u64, bool)>,
    ) {
        self.touch_keeping(maps, pid, lookups, None);
    }

    /// [`Touched::touch`], keeping what falls in no image as [`Unplaced`]
    /// as `keep` says.
    fn touch_keeping(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        pid: u32,
        lookups: impl IntoIterator<Item = (u64, bool)>,
        keep: Option<&Keep>,
    ) {
        self.ensure_index(maps, pid);
        // Out of `self` while placing (moving the map costs no hashing).
        let index = std::mem::take(&mut self.index);
        let ranges = index.get(&pid).map_or(&[][..], Vec::as_slice);
        self.touch_in(ranges, pid, lookups, keep);
        self.index = index;
    }

    /// Note each of `lookups` of process `pid` in the image of `ranges`
    /// that holds it, keeping what falls in none as [`Unplaced`] as `keep`
    /// says.
    fn touch_in(
        &mut self,
        ranges: &[TouchRange],
        pid: u32,
        lookups: impl IntoIterator<Item = (u64, bool)>,
        keep: Option<&Keep>,
    ) {
        let lo = ranges.first().map_or(u64::MAX, |r| r.start);
        let hi = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        for (addr, is_ip) in lookups {
            let placed = (lo..hi).contains(&addr) && self.place(ranges, addr, is_ip);
            if placed {
                continue;
            }
            if let Some(k) = keep.filter(|k| k.may_be_code(addr)) {
                if self.unplaced_len < MAX_UNPLACED {
                    let spare = &mut self.spare_unplaced;
                    let list = self.unplaced.entry(pid).or_insert_with(|| spare.take());
                    list.push(Unplaced {
                        time: k.time,
                        addr,
                        is_ip,
                    });
                    self.unplaced_len += 1;
                }
            }
        }
    }

    /// Build process `pid`'s index if its mappings changed.
    fn ensure_index(&mut self, maps: &HashMap<u32, Vec<ImageMapRecord>>, pid: u32) {
        if self.dirty.remove(&pid) || !self.index.contains_key(&pid) {
            let ranges = self.ranges_of(maps.get(&pid).map_or(&[][..], |m| &m[..]));
            self.index.insert(pid, ranges);
        }
    }

    /// Note the lookup of `addr` in the image of `ranges` (sorted by
    /// start) that holds it; `false` if no image does.
    fn place(&mut self, ranges: &[TouchRange], addr: u64, is_ip: bool) -> bool {
        let i = ranges.partition_point(|r| r.start <= addr);
        let Some(r) = i.checked_sub(1).map(|i| &ranges[i]) else {
            return false;
        };
        if addr >= r.end {
            return false;
        }
        let image = &mut self.images[r.image];
        image.touched = true;
        if !self.collect {
            return true;
        }
        let offset = addr - r.start + r.file_offset;
        let set = if is_ip {
            &mut image.ips
        } else {
            &mut image.returns
        };
        if set.contains(&offset) {
            return true;
        }
        if self.addresses >= MAX_ADDRESSES {
            image.left_out += 1;
            return true;
        }
        set.insert(offset);
        self.addresses += 1;
        true
    }

    /// The index of `maps` (executable mappings with a build id).
    fn ranges_of(&mut self, maps: &[ImageMapRecord]) -> Vec<TouchRange> {
        let mut ranges: Vec<TouchRange> = maps
            .iter()
            .filter_map(|m| {
                let id = m.build_id.as_ref()?;
                let image = match self.image_ids.get(id) {
                    Some(&i) => i,
                    None => {
                        self.images.push(TouchedImage {
                            id: id.clone(),
                            touched: false,
                            ips: FxHashSet::default(),
                            returns: FxHashSet::default(),
                            left_out: 0,
                        });
                        self.image_ids.insert(id.clone(), self.images.len() - 1);
                        self.images.len() - 1
                    }
                };
                Some(TouchRange {
                    start: m.start,
                    end: m.end,
                    file_offset: m.file_offset,
                    image,
                })
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        ranges
    }

    /// What the samples touched of image `id`.
    pub fn image(&self, id: &BuildId) -> Option<&TouchedImage> {
        self.image_ids.get(id).map(|&i| &self.images[i])
    }

    /// The build ids of the images touched, sorted.
    pub fn touched_ids(&self) -> Vec<&BuildId> {
        let mut ids: Vec<&BuildId> = self
            .images
            .iter()
            .filter(|i| i.touched)
            .map(|i| &i.id)
            .collect();
        ids.sort();
        ids
    }
}

/// What a thread's stack copies held, by address: each copy is written
/// over it, so a word equal to what it holds at the same address was
/// looked up when it first appeared, in this copy or an earlier one. Bytes
/// no copy has held yet are zero, and a zero word is no code address.
#[derive(Default)]
struct SeenStack {
    held: ByAddress,
    /// The id of the last copy written over `held`, which holds it whole.
    last: Option<u64>,
}

impl SeenStack {
    /// Call `changed` with each aligned word of `stack` (starting at AVMA
    /// `sp`) that differs from what is held at its address, as a
    /// native-endian value (zero, no code address, left out), and hold
    /// `stack`, named `id`, from now on. `runs` gets the runs of `stack`
    /// equal to what was held ([`same_runs`]); returns the id of the copy
    /// they are equal to wherever that copy reaches (the last one, if it
    /// is held whole).
    fn update(
        &mut self,
        sp: u64,
        stack: &[u8],
        id: u64,
        runs: &mut Vec<(u32, u32)>,
        mut changed: impl FnMut(u64),
    ) -> Option<u64> {
        runs.clear();
        if !ByAddress::can_hold(sp, stack.len() as u64) {
            // Not a stack (a malformed sample): nothing held, every word
            // looked up.
            *self = SeenStack::default();
            hold(
                stack,
                &mut vec![0; stack.len()],
                0,
                stack.len(),
                &mut changed,
            );
            return None;
        }
        let base = if self.held.cover(sp, stack.len() as u64) {
            self.last
        } else {
            None
        };
        self.last = Some(id);
        let held = self.held.at(sp, stack.len());
        same_runs(stack, held, |from, len| {
            runs.push((from as u32, len as u32))
        });
        // Between the runs: look at the words, and hold the new bytes.
        let mut from = 0;
        for i in 0..=runs.len() {
            let (to, next) = match runs.get(i) {
                Some(&(at, len)) => (at as usize, (at + len) as usize),
                None => (stack.len(), stack.len()),
            };
            if from < to {
                hold(stack, held, from, to, &mut changed);
            }
            from = next;
        }
        base
    }
}

/// Turn `words`, 8-byte words of a 32-bit task's stack, into the 4-byte
/// words they hold (the lower address's is the low half), zeros left out.
fn split_words(words: &mut Vec<u64>) {
    let n = words.len();
    for i in 0..n {
        let w = words[i];
        words[i] = w & 0xffff_ffff;
        if w >> 32 != 0 {
            words.push(w >> 32);
        }
    }
    words.retain(|&w| w != 0);
}

/// Call `changed` with each aligned word of `new` (whole words only: the
/// bytes past the last one are no address) that has bytes in `from..to`
/// and differs from `held`'s, unless zero; then copy those bytes of `new`
/// over `held` (of the same length).
fn hold(new: &[u8], held: &mut [u8], from: usize, to: usize, changed: &mut impl FnMut(u64)) {
    let words_end = to.min(new.len() / 8 * 8);
    let mut at = from / 8 * 8;
    while at < words_end {
        let value = u64::from_ne_bytes(new[at..at + 8].try_into().expect("8 bytes"));
        if value != u64::from_ne_bytes(held[at..at + 8].try_into().expect("8 bytes")) && value != 0
        {
            changed(value);
        }
        at += 8;
    }
    held[from..to].copy_from_slice(&new[from..to]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::MAX_HELD_SPAN;
    use lrnprof_format::{ImageKind, Pid, Timestamp};

    fn map(pid: u32, start: u64, end: u64, id: u8) -> ImageMapRecord {
        ImageMapRecord {
            time: Timestamp(1),
            pid: Pid(pid),
            start,
            end,
            file_offset: 0x1000,
            path: format!("/lib{id}.so"),
            build_id: Some(BuildId(vec![id])),
            kind: ImageKind::File,
            executable: true,
        }
    }

    fn maps(list: &[ImageMapRecord]) -> HashMap<u32, Vec<ImageMapRecord>> {
        let mut m: HashMap<u32, Vec<ImageMapRecord>> = HashMap::new();
        for r in list {
            m.entry(r.pid.0).or_default().push(r.clone());
        }
        m
    }

    fn touched(t: &Touched) -> Vec<u8> {
        t.touched_ids().iter().map(|id| id.0[0]).collect()
    }

    #[test]
    fn touches_find_the_image_holding_an_address() {
        let mut t = Touched::new(true);
        let m = maps(&[map(1, 0x1000, 0x2000, 1), map(1, 0x5000, 0x6000, 2)]);
        t.touch(&m, 1, [(0x5fff, true), (0x3000, false)]); // in image 2; between images
        t.touch(&m, 2, [(0x1000, true)]); // another process
        assert_eq!(touched(&t), [2]);
        // File offsets: the mapping starts at file offset 0x1000.
        let two = t.image(&BuildId(vec![2])).unwrap();
        assert_eq!(two.lookups(), [0x1fff]);
        // A new mapping over the first replaces it.
        let m = maps(&[map(1, 0x1000, 0x2000, 3), map(1, 0x5000, 0x6000, 2)]);
        t.mappings_changed(1);
        t.touch(&m, 1, [(0x1800, false)]);
        assert_eq!(touched(&t), [2, 3]);
    }

    #[test]
    fn samples_give_instruction_pointers_and_return_addresses() {
        let mut t = Touched::new(true);
        let m = maps(&[map(1, 0x1000, 0x2000, 1)]);
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let stack = words(&[0x1234, 0x9999, 0x1001]);
        t.sample(
            &m,
            None,
            &SampleRefs {
                pid: 1,
                tid: 7,
                ip: 0x1100,
                lr: Some(0x1400),
                callchain: &[0x1100, 0x1500],
                sp: 0x8000,
                time: 1,
                stack: &stack,
                words32: false,
            },
        );
        let one = t.image(&BuildId(vec![1])).unwrap();
        // The ip as it is (the callchain's first entry is the ip again),
        // return addresses one byte back.
        assert_eq!(one.lookups(), [0x1100, 0x1000, 0x1233, 0x13ff, 0x14ff]);
        // Without collecting, only which images were touched.
        let mut t = Touched::new(false);
        t.touch(&m, 1, [(0x1100, true)]);
        assert_eq!(touched(&t), [1]);
        assert!(t.image(&BuildId(vec![1])).unwrap().lookups().is_empty());
    }

    #[test]
    fn a_32_bit_stack_is_looked_up_in_4_byte_words() {
        let m = maps(&[map(1, 0x1000, 0x2000, 1)]);
        // Two return addresses in one 8-byte word, then one in the high
        // half of a word whose low half is no code.
        let stack: Vec<u8> = [0x1234u32, 0x1801, 0x9999, 0x1a01]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let lookups = |words32| {
            let mut t = Touched::new(true);
            let s = SampleRefs {
                pid: 1,
                tid: 7,
                ip: 0x1100,
                lr: None,
                callchain: &[],
                sp: 0x8000,
                time: 1,
                stack: &stack,
                words32,
            };
            t.sample(&m, None, &s);
            t.image(&BuildId(vec![1])).unwrap().lookups()
        };
        assert_eq!(lookups(true), [0x1100, 0x1233, 0x1800, 0x1a00]);
        // As 8-byte words they are no addresses.
        assert_eq!(lookups(false), [0x1100]);
    }

    #[test]
    fn only_changed_stack_words_are_looked_up_until_the_images_change() {
        let mut t = Touched::new(false);
        let mut list = vec![map(1, 0x1000, 0x2000, 1)];
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let sample = |t: &mut Touched, list: &[ImageMapRecord], sp: u64, w: &[u64]| {
            let stack = words(w);
            t.sample(
                &maps(list),
                None,
                &SampleRefs {
                    pid: 1,
                    tid: 7,
                    ip: 0,
                    lr: None,
                    callchain: &[],
                    sp,
                    time: 1,
                    stack: &stack,
                    words32: false,
                },
            );
        };
        // First copy: a word into image 1 is found.
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        assert_eq!(touched(&t), [1]);
        // Image 2 is mapped where an unchanged word of the next copy
        // already pointed: the images changed, so the copy is scanned whole.
        list.push(map(1, 0x9000, 0xa000, 2));
        t.mappings_changed(1);
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        assert_eq!(touched(&t), [1, 2]);
        // Words equal to the previous copy's at the same address are skipped,
        // changed and new words are looked up (here, one sp lower).
        list.push(map(1, 0xb000, 0xc000, 3));
        t.mappings_changed(1);
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        list.push(map(1, 0xd000, 0xe000, 4));
        t.mappings_changed(1);
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        assert_eq!(touched(&t), [1, 2]);
        sample(&mut t, &list, 0x7ff8, &[0xb010, 0x1234, 0x9999]);
        assert_eq!(touched(&t), [1, 2, 3]);
        // SeenStack itself: only the differing, aligned words.
        let update = |seen: &mut SeenStack, sp: u64, w: &[u64]| {
            let mut changed = Vec::new();
            seen.update(sp, &words(w), 0, &mut Vec::new(), |w| changed.push(w));
            changed
        };
        let mut seen = SeenStack::default();
        assert_eq!(update(&mut seen, 0x100, &[1, 2, 3]), [1, 2, 3]);
        assert_eq!(update(&mut seen, 0xf8, &[9, 1, 5, 3]), [9, 5]);
        // Misaligned with what is held: everything is new again.
        assert_eq!(update(&mut seen, 0x104, &[1, 2]), [1, 2]);
    }

    /// A sample of a process whose mappings come later (a forked child
    /// heard from before its fork) is looked up once they do.
    #[test]
    fn samples_before_their_process_mappings_are_looked_up_when_they_come() {
        let mut t = Touched::new(true);
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let stack = words(&[0x1801]);
        let none = HashMap::new();
        t.sample(
            &none,
            None,
            &SampleRefs {
                pid: 9,
                tid: 9,
                ip: 0x1100,
                lr: None,
                callchain: &[],
                sp: 0x8000,
                time: 1,
                stack: &stack,
                words32: false,
            },
        );
        assert!(touched(&t).is_empty());
        let m = maps(&[map(9, 0x1000, 0x2000, 1)]);
        t.mappings_known(&m, 9);
        assert_eq!(touched(&t), [1]);
        let one = t.image(&BuildId(vec![1])).unwrap();
        assert_eq!(one.lookups(), [0x1100, 0x1800]);
        assert!(t.waiting.is_empty() && t.waiting_len == 0);
    }

    /// A sample's code mapped before it but heard of after it (another
    /// CPU's ring) is found at the next round; what no mapping placed by
    /// then is forgotten.
    #[test]
    fn lookups_in_no_image_wait_for_late_mappings_until_the_round() {
        let mut t = Touched::new(true);
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        // 0x30801 and 0x8010 (inside the stack copy) are in no image yet.
        let stack = words(&[0x30801, 0x8010, 0x1801]);
        let sample = |t: &mut Touched, m: &HashMap<u32, Vec<ImageMapRecord>>, time| {
            t.sample(
                m,
                None,
                &SampleRefs {
                    pid: 1,
                    tid: 1,
                    ip: 0x30100,
                    lr: None,
                    callchain: &[],
                    sp: 0x8000,
                    time,
                    stack: &stack,
                    words32: false,
                },
            )
        };
        let mut list = vec![map(1, 0x1000, 0x2000, 1)];
        sample(&mut t, &maps(&list), 100);
        assert_eq!(touched(&t), [1]);
        // The ip and the word into the future mapping wait; the stack
        // pointer does not.
        assert_eq!(t.unplaced_len, 2);
        // The mapping, made before the sample, is heard of now.
        list.push(map(1, 0x30000, 0x40000, 2));
        t.mappings_changed(1);
        t.round(&maps(&list), 50, |_, _| None);
        assert_eq!(touched(&t), [1, 2]);
        let two = t.image(&BuildId(vec![2])).unwrap();
        assert_eq!(two.lookups(), [0x1100, 0x1800]);
        assert_eq!(t.unplaced_len, 0);
        // What no mapping places is forgotten once the rings are past it.
        let mut t = Touched::new(true);
        sample(&mut t, &maps(&list[..1]), 100);
        assert_eq!(t.unplaced_len, 2);
        t.round(&maps(&list[..1]), 100, |_, _| None);
        assert_eq!(t.unplaced_len, 2, "the sample at 100 may still be placed");
        t.round(&maps(&list[..1]), 101, |_, _| None);
        assert_eq!(t.unplaced_len, 0);
        assert!(t.unplaced.is_empty());
        // The emptied list is kept and holds the next sample's (its ip;
        // the unchanged stack word was looked up before).
        assert_eq!(t.spare_unplaced.0.len(), 1);
        let kept = t.spare_unplaced.0[0].as_ptr();
        sample(&mut t, &maps(&list[..1]), 300);
        assert_eq!((t.unplaced_len, t.unplaced[&1].as_ptr()), (1, kept));
        assert!(t.spare_unplaced.0.is_empty());
    }

    /// A sample whose process's mappings changed after it (heard first)
    /// is looked up in what was mapped at its time, not in what is now.
    #[test]
    fn samples_older_than_a_change_use_the_mappings_of_their_time() {
        let mut t = Touched::new(true);
        let now = maps(&[map(1, 0x1000, 0x2000, 2)]);
        let then = [map(1, 0x1000, 0x2000, 1), map(1, 0x5000, 0x6000, 3)];
        let stack: Vec<u8> = 0x5801u64.to_ne_bytes().to_vec();
        t.sample(
            &now,
            Some(&then),
            &SampleRefs {
                pid: 1,
                tid: 1,
                ip: 0x1100,
                lr: None,
                callchain: &[],
                sp: 0x8000,
                time: 1,
                stack: &stack,
                words32: false,
            },
        );
        assert_eq!(touched(&t), [1, 3]);
        assert_eq!(t.image(&BuildId(vec![1])).unwrap().lookups(), [0x1100]);
        assert_eq!(t.image(&BuildId(vec![3])).unwrap().lookups(), [0x1800]);
        // The same process's index of current mappings is untouched.
        t.touch(&now, 1, [(0x1200, true)]);
        assert_eq!(touched(&t), [1, 2, 3]);
    }

    #[test]
    fn words_held_by_any_earlier_copy_are_not_looked_up_again() {
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let update = |seen: &mut SeenStack, sp: u64, w: &[u64]| {
            let mut changed = Vec::new();
            seen.update(sp, &words(w), 0, &mut Vec::new(), |w| changed.push(w));
            changed
        };
        let mut seen = SeenStack::default();
        let top = 0x7fff_0000u64;
        // A deep copy, a shallow one, then the deep one again: its lower
        // words are still held from the first.
        let deep: Vec<u64> = (1..=2000).collect();
        assert_eq!(update(&mut seen, top - 16000, &deep).len(), 2000);
        assert_eq!(
            update(&mut seen, top - 80, &deep[1990..]),
            Vec::<u64>::new()
        );
        assert_eq!(update(&mut seen, top - 16000, &deep), Vec::<u64>::new());
        // Deepening word by word: new words only, whatever the growth.
        for i in 1..=600u64 {
            // Each copy: `i` words below the deep one, the lowest new.
            let mut fresh = vec![0u64; i as usize - 1];
            fresh.insert(0, 100_000 + i);
            fresh.extend_from_slice(&deep);
            let changed = update(&mut seen, top - 16000 - 8 * i, &fresh);
            assert_eq!(changed, [100_000 + i], "step {i}");
        }
        // Zero words are never reported (bytes not yet held are zero).
        let mut seen = SeenStack::default();
        assert_eq!(update(&mut seen, 0x1000, &[0, 7, 0]), [7]);
        // A copy too far from what is held starts afresh.
        assert_eq!(update(&mut seen, 0x1000 + MAX_HELD_SPAN, &[7]), [7]);
        // One at the top of the address space (a malformed sample) is
        // not held: looked up whole every time.
        let top = u64::MAX - 20;
        assert_eq!(update(&mut seen, top, &[7, 0]), [7]);
        assert_eq!(update(&mut seen, top, &[7, 0]), [7]);
    }

    /// A copy put together from changed blocks has its changed words
    /// looked up (within the part the sample keeps), and is looked up
    /// whole the first time and after its process's mappings change; its
    /// hint keeps the id, base and runs found, cut to the part kept.
    #[test]
    fn rebuilt_copies_look_up_what_changed() {
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let mut t = Touched::new(true);
        let list = vec![map(1, 0x1000, 0x2000, 1)];
        let stack = words(&[0x1201, 0x1301, 0x1401]);
        let refs = |stack| SampleRefs {
            pid: 1,
            tid: 10,
            ip: 0x1100,
            lr: None,
            callchain: &[],
            sp: 0x7000,
            time: 5,
            stack,
            words32: false,
        };
        let rebuilt = |words: Vec<(u32, u64)>| Rebuilt {
            base: Some(3),
            runs: vec![(0, 8), (8, 16), (20, 100), (24, 16)],
            words,
        };
        let looked_up = |t: &Touched| t.image(&BuildId(vec![1])).unwrap().lookups();
        // The thread's first copy: whole, whatever changed.
        let h = t.sample_rebuilt(&maps(&list), None, &refs(&stack), 4, &rebuilt(vec![]));
        assert_eq!((h.id, h.base), (4, Some(3)));
        assert_eq!(h.runs, [(0, 8), (8, 16), (20, 4)]);
        assert_eq!(looked_up(&t), [0x1100, 0x1200, 0x1300, 0x1400]);
        // Then only what changed, in the part kept.
        let next = words(&[0x1601, 0x1701, 0x1801]);
        let changed = rebuilt(vec![(8, 0x1701), (16, 0x1801)]);
        t.sample_rebuilt(&maps(&list), None, &refs(&next[..16]), 5, &changed);
        assert_eq!(looked_up(&t), [0x1100, 0x1200, 0x1300, 0x1400, 0x1700]);
        // New mappings: whole again.
        t.mappings_changed(1);
        t.sample_rebuilt(&maps(&list), None, &refs(&next), 6, &rebuilt(vec![]));
        assert_eq!(
            looked_up(&t),
            [0x1100, 0x1200, 0x1300, 0x1400, 0x1600, 0x1700, 0x1800]
        );
    }

    /// What the comparison hands the trace writer: runs equal to the last
    /// copy, named by its id, and no base once the copy is not held whole.
    #[test]
    fn each_copy_names_the_copy_its_runs_equal() {
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let mut seen = SeenStack::default();
        let mut runs = Vec::new();
        let deep: Vec<u64> = (1..=64).map(|i| 0x5000_0000 + i).collect();
        let top = 0x7fff_0000u64;
        let sp = top - 8 * deep.len() as u64;
        assert_eq!(seen.update(sp, &words(&deep), 1, &mut runs, |_| ()), None);
        assert!(runs.is_empty());
        // The leaf word changed: the rest is one run, against copy 1.
        let mut next = deep.clone();
        next[0] = 0x6000_0000;
        assert_eq!(
            seen.update(sp, &words(&next), 2, &mut runs, |_| ()),
            Some(1)
        );
        // (The changed word's high bytes are equal too.)
        assert_eq!(runs, [(4, 63 * 8 + 4)]);
        // Shallower, then deeper again: the runs also cover what an older
        // copy left held below the last one (the writer clips them to it).
        assert_eq!(
            seen.update(top - 80, &words(&next[54..]), 3, &mut runs, |_| ()),
            Some(2)
        );
        assert_eq!(runs, [(0, 80)]);
        assert_eq!(
            seen.update(sp, &words(&next), 4, &mut runs, |_| ()),
            Some(3)
        );
        assert_eq!(runs, [(0, 64 * 8)]);
        // Misaligned with what is held: started afresh, no base.
        assert_eq!(
            seen.update(sp + 4, &words(&deep), 5, &mut runs, |_| ()),
            None
        );
        assert!(runs.is_empty());
        // A whole sample: ids count up, the base is the thread's last copy.
        let mut t = Touched::new(true);
        let list = vec![map(1, 0x1000, 0x2000, 1)];
        let stack = words(&deep);
        let refs = |tid| SampleRefs {
            pid: 1,
            tid,
            ip: 0x1100,
            lr: None,
            callchain: &[],
            sp,
            time: 5,
            stack: &stack,
            words32: false,
        };
        let first = t.sample(&maps(&list), None, &refs(10));
        let other = t.sample(&maps(&list), None, &refs(11));
        let second = t.sample(&maps(&list), None, &refs(10));
        assert_eq!((first.base, other.base), (None, None));
        assert_eq!(second.base, Some(first.id));
        assert_eq!(second.runs, [(0, stack.len() as u32)]);
        assert!(first.id < other.id && other.id < second.id);
        // New mappings: every copy of the process is compared afresh.
        t.mappings_changed(1);
        assert_eq!(t.sample(&maps(&list), None, &refs(10)).base, None);
        // A hint's runs given back hold the next hint's, emptied first.
        let mut given = second.runs;
        given.push((1, 2));
        let at = given.as_ptr();
        t.recycle_runs(given);
        // (Thread 11's copies were forgotten with the mappings: no runs.)
        let third = t.sample(&maps(&list), None, &refs(11));
        assert_eq!(third.runs.as_ptr(), at);
        assert_eq!((third.base, third.runs.len()), (None, 0));
        t.recycle_runs(third.runs);
        let fourth = t.sample(&maps(&list), None, &refs(11));
        assert_eq!(fourth.runs.as_ptr(), at);
        assert_eq!(
            (fourth.base, &fourth.runs[..]),
            (Some(third.id), &[(0, stack.len() as u32)][..])
        );
        // Buffers beyond what is kept are dropped.
        for _ in 0..MAX_SPARE_RUNS + 10 {
            t.recycle_runs(Vec::with_capacity(4));
        }
        t.recycle_runs(Vec::with_capacity(MAX_SPARE_RUNS_LEN + 1));
        assert_eq!(t.spare_runs.0.len(), MAX_SPARE_RUNS);
        assert!(t
            .spare_runs
            .0
            .iter()
            .all(|r| r.capacity() <= MAX_SPARE_RUNS_LEN));
    }
}
