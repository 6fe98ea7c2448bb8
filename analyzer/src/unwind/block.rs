//! Unwinding the samples of one block, each sample reusing the frames it
//! shares with the earlier sample its stack was delta-encoded against.
//!
//! Consecutive samples of a thread share most of their stack, and the
//! trace says which bytes did not change (a snapshot's base and the AVMA
//! from which it is unchanged, see `lrnprof_format::StackView`). A sample
//! is unwound from its leaf until a frame is in the same state as one of
//! its base sample's frames and everything unwinding that frame read lies
//! in the unchanged part: from there on the walk would repeat the base's,
//! so the base's frames are taken. Work follows what changed, not depth.
//! The result is the same as unwinding every sample in full.

use super::{
    chain, continue_with_callchain, walk, Aarch64Arch, Node, Reuse, UnwindArch, Walked, X86_64Arch,
    MAX_FRAMES, NONE,
};
use crate::kept::Decompressed;
use crate::options::SampleFilter;
use crate::outcomes::EventKey;
use crate::pipeline::{kernel_only, push_kernel_keys, GenerationRef, Prepared};
use crate::profile::{amounts, BlockSample, BlockStack, HeapScale, UnwoundBlock};
use crate::unwind::ArchCache;
use lrnprof_format::{
    Arch, Pid, RecordRef, Regs, Sample, SampleDetail, SampleFlags, SampleKind, StackMode,
    StackView, Tid, Timestamp, MAX_BASES,
};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// What the second pass needs besides the prepared trace.
pub(crate) struct BlockContext<'p> {
    pub prepared: &'p Prepared,
    pub filter: &'p SampleFilter,
    pub heap: Option<HeapScale>,
    /// End of the selected time range, for memory in use.
    pub inuse_at: Option<Timestamp>,
}

/// Unwind the selected samples of `raw` (a block that decoded in the
/// first pass) into `out`, whose buffers (an earlier block's, emptied
/// here) are reused: growing new ones for every block cost more than
/// filling them.
pub(crate) fn unwind_block(
    cx: &BlockContext<'_>,
    raw: &Decompressed<'_>,
    mut out: UnwoundBlock,
) -> UnwoundBlock {
    out.samples.clear();
    out.keys.clear();
    match cx.prepared.arch {
        Arch::X86_64 => BlockUnwinder::<X86_64Arch>::new(cx, out).run(raw),
        Arch::Aarch64 => BlockUnwinder::<Aarch64Arch>::new(cx, out).run(raw),
    }
}

/// Nodes per thread above which a thread's walks are compacted to those
/// later samples can still reuse (at most [`MAX_BASES`] chains), or twice
/// what the last compaction kept if that is more: compacting then copies
/// no more than was added since (with 600-frame stacks, a fixed 1024
/// compacted at every other sample and doubled the analysis's time). At
/// 4096, every worker faulted in about 5 MB of arenas of its own on a
/// deep-stack trace (with two jobs 4,800 page faults against 2,600 with
/// one); at 1024 with two jobs 2,700, 5 % less CPU, and on a 530,000-sample
/// trace 50 MB of peak memory instead of 63.
const COMPACT_AT: usize = 1024;

/// Bytes a stack copy may fall short of the recording's stack size and
/// still count as full: the kernel copies what it can up to the size.
const FULL_COPY_SLACK: u64 = 4096;

/// A walked sample that later samples of its thread may reuse.
#[derive(Clone, Copy)]
struct Entry {
    /// Its record index in the block.
    record: u32,
    /// Its index in the block's output.
    out: u32,
    walked: Walked,
    /// Its frames are the walk's, nothing added or inserted.
    plain: bool,
    generation: usize,
    /// End of its stack copy.
    end: u64,
}

/// Per thread: its walks' frames and its last walked samples.
struct ThreadWalks<R> {
    thread: u32,
    arena: Vec<Node<R>>,
    recent: VecDeque<Entry>,
    /// Buffers of the last compaction, reused by the next.
    spare: Vec<Node<R>>,
    moved: Vec<u32>,
    /// Nodes the last compaction kept.
    kept: usize,
}

struct BlockUnwinder<'c, 'p, A: UnwindArch> {
    cx: &'c BlockContext<'p>,
    cache: ArchCache,
    threads: FxHashMap<(Pid, Tid), ThreadWalks<A::State>>,
    frames: Vec<u64>,
    out: UnwoundBlock,
}

impl<'c, 'p, A: UnwindArch> BlockUnwinder<'c, 'p, A> {
    fn new(cx: &'c BlockContext<'p>, out: UnwoundBlock) -> Self {
        BlockUnwinder {
            cx,
            cache: if cx.prepared.unwinders_share_cache() {
                ArchCache::kept(cx.prepared.arch)
            } else {
                ArchCache::new(cx.prepared.arch)
            },
            threads: FxHashMap::default(),
            frames: Vec::new(),
            out,
        }
    }

    fn run(mut self, raw: &Decompressed<'_>) -> UnwoundBlock {
        let mut cursor = raw.records(StackMode::Bytes);
        while let Some(Ok(r)) = cursor.next() {
            match r {
                RecordRef::Sample(s) => self.sample(&s.sample, Some(s.index), &s.stack),
                // A sample stored whole: no earlier sample to reuse.
                RecordRef::Record(lrnprof_format::Record::Sample(s)) => {
                    self.sample(&s, None, &StackView::of_snapshot(&s.stack))
                }
                RecordRef::Record(_) => {}
            }
        }
        A::spare_arenas().with(|spare| {
            for (_, walks) in self.threads.drain() {
                spare.give(walks.arena);
                spare.give(walks.spare);
            }
        });
        if self.cx.prepared.unwinders_share_cache() {
            self.cache.keep();
        }
        self.out
    }

    fn sample(&mut self, s: &Sample, record: Option<u32>, stack: &StackView<'_>) {
        let prepared = self.cx.prepared;
        if !prepared.selected(self.cx.filter, s) {
            return;
        }
        let Some(walks) = self.thread(s.pid, s.tid) else {
            return;
        };
        let thread = walks.thread;
        // Only events have outcomes; CPU samples skip the lookup.
        let outcome = match s.kind {
            SampleKind::Allocation | SampleKind::Syscall | SampleKind::OffCpu => {
                let key: EventKey = (s.pid, s.tid, s.time, s.kind);
                prepared.timeline.outcomes.get(&key)
            }
            _ => None,
        };
        let out_index = self.out.samples.len() as u32;
        let keys_start = self.out.keys.len() as u32;
        let mut values = amounts(s.kind, s.weight, outcome, self.cx.heap, self.cx.inuse_at);
        if let (SampleKind::Syscall, SampleDetail::Syscall { nr, .. }) = (s.kind, &s.detail) {
            // With tallies, one recorded call stands for several.
            values.scale(prepared.timeline.tallies.weight(&(s.pid, s.tid, *nr)));
        }
        let mut sample = BlockSample {
            thread,
            time: s.time,
            amounts: values,
            stack: BlockStack::Whole {
                keys: keys_start..keys_start,
            },
            clean: false,
            used_kernel_chain: false,
            presymbolized: !s.frames.is_empty(),
            cut_short: s.flags.contains(SampleFlags::STACK_CUT_SHORT),
            past_copy: false,
        };
        // Kernel frames first (the leaf end), as perf shows them.
        push_kernel_keys(&s.kernel_frames, &mut self.out.keys);
        let generation = prepared.generation_at(s.pid, s.time);
        if kernel_only(s) {
            // A kernel thread: no user context to unwind.
        } else if sample.presymbolized {
            // A stripped trace: the frames are the sample's, and whether
            // they reached the root is what `strip` found.
            sample.clean = s.flags.contains(SampleFlags::REACHED_ROOT);
            prepared.push_frame_keys(
                s.pid,
                generation.as_ref(),
                s.frames.iter().copied(),
                &mut self.out.keys,
            );
        } else if let (true, Some(g)) = (s.flags.contains(SampleFlags::ABI_32), &generation) {
            // A 32-bit process: walked in full, by its own unwinder (a
            // trace is untrusted input: should it panic, keep the
            // instruction pointer).
            let u = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                g.unwinder.unwind_32(s, stack)
            }))
            .unwrap_or_else(|_| super::Unwound {
                frames: vec![s.regs.ip()],
                clean: false,
                used_kernel_chain: false,
            });
            sample.clean = u.clean;
            sample.used_kernel_chain = u.used_kernel_chain;
            prepared.push_frame_keys(s.pid, Some(g), u.frames.iter().copied(), &mut self.out.keys);
        } else {
            let walked = match &generation {
                Some(g) => self.walk(s, record, stack, g, out_index, &mut sample),
                None => Err(Fallback { callchain: true }),
            };
            match walked {
                Ok(e) => {
                    if let Some(walks) = self.threads.get_mut(&(s.pid, s.tid)) {
                        walks.remember(e);
                    }
                }
                Err(Fallback { callchain }) => {
                    // No unwinder for the process, registers of another
                    // arch, or a panic in the unwinder: the instruction
                    // pointer, then (but after a panic) the kernel's
                    // callchain where it continues.
                    let mut frames = vec![s.regs.ip()];
                    if callchain {
                        sample.used_kernel_chain =
                            continue_with_callchain(&mut frames, &s.kernel_callchain);
                    }
                    if let (Some(g), Regs::Aarch64(r)) = (&generation, &s.regs) {
                        if prepared.frameless_caller(g.mappings, r.lr, &frames) {
                            frames.insert(1, r.lr);
                        }
                    }
                    prepared.push_frame_keys(
                        s.pid,
                        generation.as_ref(),
                        frames.iter().copied(),
                        &mut self.out.keys,
                    );
                }
            }
        }
        if s.kind == SampleKind::Allocation {
            if let BlockStack::Whole { keys } = &sample.stack {
                prepared.drop_sampler_frames(&mut self.out.keys, keys.start as usize);
            }
        }
        let end = self.out.keys.len() as u32;
        match &mut sample.stack {
            BlockStack::Whole { keys } | BlockStack::Joined { keys, .. } => keys.end = end,
        }
        self.out.samples.push(sample);
    }

    /// The walks of a thread, created on its first sample in the block.
    fn thread(&mut self, pid: Pid, tid: Tid) -> Option<&mut ThreadWalks<A::State>> {
        if !self.threads.contains_key(&(pid, tid)) {
            let thread = *self.cx.prepared.timeline.thread_index.get(&(pid, tid))?;
            self.threads.insert(
                (pid, tid),
                ThreadWalks {
                    thread,
                    arena: A::spare_arenas().with(|s| s.take()),
                    recent: VecDeque::new(),
                    spare: A::spare_arenas().with(|s| s.take()),
                    moved: Vec::new(),
                    kept: 0,
                },
            );
        }
        self.threads.get_mut(&(pid, tid))
    }

    /// Walk `s`, reusing its base sample's frames where they are the same,
    /// and put its frames in the output. Returns what later samples may
    /// reuse, or (with nothing output) how to fall back.
    fn walk(
        &mut self,
        s: &Sample,
        record: Option<u32>,
        stack: &StackView<'_>,
        g: &GenerationRef<'_>,
        out_index: u32,
        sample: &mut BlockSample,
    ) -> Result<Entry, Fallback> {
        let prepared = self.cx.prepared;
        let other_arch = Fallback { callchain: true };
        let unwinder = A::unwinder(g.unwinder).ok_or(other_arch)?;
        let cache = A::cache(&mut self.cache).ok_or(other_arch)?;
        let (pc, regs) = A::start(unwinder, &s.regs).ok_or(other_arch)?;
        let walks = self
            .threads
            .get_mut(&(s.pid, s.tid))
            .ok_or(Fallback { callchain: false })?;
        let base = stack.base().and_then(|b| {
            let e = walks.recent.iter().rev().find(|e| e.record == b.record)?;
            (e.generation == g.index && !e.walked.truncated).then_some((e, b.unchanged_from))
        });
        let reuse = base.map(|(e, unchanged_from)| Reuse {
            leaf: e.walked.leaf,
            len: e.walked.len,
            clean: e.walked.clean,
            unchanged_from,
            end: stack.end(),
            base_end: e.end,
            past_end: e.walked.past_end,
        });
        let base = base.map(|(e, _)| *e);
        let little_endian = prepared.little_endian();
        // A trace is untrusted input: should the unwinder panic on it,
        // keep the instruction pointer and go on.
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            walk::<A>(
                unwinder,
                &g.unwinder.trampolines,
                cache,
                pc,
                regs,
                stack,
                little_endian,
                reuse.as_ref(),
                &mut walks.arena,
            )
        }))
        .map_err(|_| Fallback { callchain: false })?;
        sample.clean = walked.clean;
        // Only from a copy as long as the recording allowed, not one the
        // recorder trimmed at the thread's stack top or at a never-touched
        // page.
        sample.past_copy = walked.past_end
            && !sample.cut_short
            && u64::from(stack.len()) + FULL_COPY_SLACK
                >= u64::from(prepared.timeline.header.sampling.stack_size);
        // What a full unwind adds to the walk's frames.
        let mut frames = std::mem::take(&mut self.frames);
        frames.clear();
        // An allocation's leaf frames are the sampler's, which its keys
        // leave out, and kernel frames come before a sample's user frames:
        // such a sample is neither joined to nor joined on.
        let mut plain = s.kind != SampleKind::Allocation && s.kernel_frames.is_empty();
        let callchain = !walked.clean && !s.kernel_callchain.is_empty();
        let frameless = matches!(s.regs, Regs::Aarch64(_));
        if callchain || frameless {
            frames.extend(
                chain(&walks.arena, walked.leaf)
                    .take(walked.len as usize)
                    .map(|n| n.address.address()),
            );
            if callchain {
                sample.used_kernel_chain =
                    continue_with_callchain(&mut frames, &s.kernel_callchain);
                plain &= !sample.used_kernel_chain;
            }
            if let Regs::Aarch64(r) = &s.regs {
                if prepared.frameless_caller(g.mappings, r.lr, &frames) {
                    frames.insert(1, r.lr);
                    plain = false;
                }
            }
        }
        let joined = match (walked.joined, base) {
            (Some((skip, new)), Some(b)) if plain && b.plain && !walked.truncated => {
                Some((b.out, skip, new))
            }
            _ => None,
        };
        let arena = &walks.arena;
        match joined {
            Some((base_out, skip, new)) => {
                prepared.push_frame_keys(
                    s.pid,
                    Some(g),
                    chain(arena, walked.leaf)
                        .take(new as usize)
                        .map(|n| n.address.address()),
                    &mut self.out.keys,
                );
                let start = match &sample.stack {
                    BlockStack::Whole { keys } | BlockStack::Joined { keys, .. } => keys.start,
                };
                sample.stack = BlockStack::Joined {
                    base: base_out,
                    skip,
                    keys: start..start,
                };
            }
            None if frames.is_empty() => prepared.push_frame_keys(
                s.pid,
                Some(g),
                chain(arena, walked.leaf)
                    .take(walked.len as usize)
                    .map(|n| n.address.address()),
                &mut self.out.keys,
            ),
            None => {
                prepared.push_frame_keys(s.pid, Some(g), frames.iter().copied(), &mut self.out.keys)
            }
        }
        self.frames = frames;
        debug_assert!(walked.len as usize <= MAX_FRAMES);
        Ok(Entry {
            record: record.unwrap_or(NONE),
            out: out_index,
            walked,
            plain,
            generation: g.index,
            end: stack.end(),
        })
    }
}

/// How to unwind a sample the walk could not take.
#[derive(Debug, Clone, Copy)]
struct Fallback {
    /// Continue the instruction pointer with the kernel callchain.
    callchain: bool,
}

impl<R: Copy> ThreadWalks<R> {
    /// Keep `e` for later samples, and bound the memory of the thread's
    /// walks to what they can still reuse.
    fn remember(&mut self, e: Entry) {
        if e.record == NONE {
            return;
        }
        if self.recent.len() >= MAX_BASES {
            self.recent.pop_front();
        }
        self.recent.push_back(e);
        if self.arena.len() > COMPACT_AT.max(2 * self.kept) {
            self.compact();
        }
    }

    /// Copy the frames of the remembered walks into a new arena.
    fn compact(&mut self) {
        let mut moved = std::mem::take(&mut self.moved);
        moved.clear();
        moved.resize(self.arena.len(), NONE);
        let mut arena = std::mem::take(&mut self.spare);
        arena.clear();
        let mut path = Vec::new();
        for e in self.recent.iter_mut() {
            path.clear();
            let mut at = e.walked.leaf;
            while let Some(n) = self.arena.get(at as usize) {
                if moved[at as usize] != NONE {
                    break;
                }
                path.push(at);
                at = n.parent;
            }
            // Outermost first, so each node's parent is already moved.
            let mut parent = moved.get(at as usize).copied().unwrap_or(NONE);
            for &old in path.iter().rev() {
                let new = arena.len() as u32;
                arena.push(Node {
                    parent,
                    ..self.arena[old as usize]
                });
                moved[old as usize] = new;
                parent = new;
            }
            e.walked.leaf = moved.get(e.walked.leaf as usize).copied().unwrap_or(NONE);
        }
        self.spare = std::mem::replace(&mut self.arena, arena);
        self.moved = moved;
        self.kept = self.arena.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::{chain, Node, Walked, NONE};
    use framehop::FrameAddress;

    /// A thread's walks with `n` new chains of `depth` frames each, every
    /// one remembered: how many times they were compacted, and the largest
    /// arena.
    fn compactions(depth: usize, n: usize) -> (usize, usize, ThreadWalks<u64>) {
        let mut walks = ThreadWalks::<u64> {
            thread: 0,
            arena: Vec::new(),
            recent: VecDeque::new(),
            spare: Vec::new(),
            moved: Vec::new(),
            kept: 0,
        };
        let (mut compacted, mut largest) = (0, 0);
        for i in 0..n {
            let first = walks.arena.len();
            for k in 0..depth {
                let parent = if k + 1 == depth {
                    NONE
                } else {
                    (first + k + 1) as u32
                };
                walks.arena.push(Node {
                    address: FrameAddress::from_instruction_pointer((i * depth + k) as u64 + 1),
                    state: k as u64,
                    lo: 0,
                    hi: 0,
                    parent,
                });
            }
            let before = walks.arena.len();
            largest = largest.max(before);
            walks.remember(Entry {
                record: i as u32,
                out: i as u32,
                walked: Walked {
                    leaf: first as u32,
                    len: depth as u32,
                    clean: true,
                    truncated: false,
                    joined: None,
                    past_end: false,
                },
                plain: true,
                generation: 0,
                end: 0,
            });
            if walks.arena.len() < before {
                compacted += 1;
            }
        }
        (compacted, largest, walks)
    }

    #[test]
    fn shallow_walks_stay_within_the_compaction_threshold() {
        let (compacted, largest, _) = compactions(30, 1000);
        assert!(compacted > 0);
        assert!(largest <= COMPACT_AT + 30, "{largest} nodes");
    }

    #[test]
    fn deep_walks_are_compacted_once_the_arena_doubled() {
        // Four kept chains of 600 frames are more than the threshold:
        // compacting at every sample would copy them all every time.
        let (compacted, largest, walks) = compactions(600, 100);
        assert!(compacted <= 100 / 4 + 1, "{compacted} compactions");
        assert!(largest <= 2 * MAX_BASES * 600 + 600, "{largest} nodes");
        // What is kept is the last samples' frames, whole.
        assert_eq!(walks.recent.len(), MAX_BASES);
        for e in &walks.recent {
            let regs: Vec<u64> = chain(&walks.arena, e.walked.leaf)
                .map(|n| n.state)
                .collect();
            assert_eq!(regs, (0..600).collect::<Vec<u64>>());
        }
    }
}
