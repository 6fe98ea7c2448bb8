//! Building a [`Profile`] from unwound samples: streaming aggregation in
//! sample order, then, once each unique frame is symbolicated, functions,
//! locations, roots, totals and warnings.

use super::{
    hex, primary, Amounts, EventKind, Function, ImageInfo, Location, LocationLine, ProcessInfo,
    Profile, SampleAmounts, SequenceEntry, Stack, Stats, ThreadProfile, ValueKind,
};
use crate::image::Source;
use crate::options::StackFilter;
use crate::pipeline::{FrameKey, Prepared};
use crate::symbolicate::Resolved;
use lrnprof_format::{ImageKind, Os, TraceHeader, TraceReader};
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::ops::Range;

/// Outermost functions that mean a stack reached its thread's root.
const ROOT_FUNCTIONS: &[&str] = &[
    "_start",
    // The dynamic loader's entry code after `_start`, while it runs the
    // libraries' constructors (glibc).
    "_dl_start_user",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    // Where a `makecontext` context's function returns to (glibc).
    "__start_context",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__GI___clone",
    "__GI___clone3",
    "thread_start",
    "_pthread_start",
    "pthread_start",
    "start",
    // Where a kernel thread starts (Linux 6.x on x86-64 enters through
    // the `_asm` part; other kernels and architectures through
    // `ret_from_fork`): the outermost frame of a kernel thread's kernel
    // callchain (`lrnprof-rec --kernel`).
    "ret_from_fork_asm",
    "ret_from_fork",
];

/// The samples of one block after unwinding, in trace order, as the
/// builder takes them: a sample whose outer frames are an earlier one's
/// names that sample instead of repeating them.
#[derive(Default)]
pub(crate) struct UnwoundBlock {
    pub samples: Vec<BlockSample>,
    /// The frames the samples list, each sample's leaf first.
    pub keys: Vec<FrameKey>,
}

/// One sample of an [`UnwoundBlock`].
pub(crate) struct BlockSample {
    /// Index into the timeline's threads.
    pub thread: u32,
    pub time: lrnprof_format::Timestamp,
    pub amounts: SampleAmounts,
    pub stack: BlockStack,
    pub clean: bool,
    pub used_kernel_chain: bool,
    pub presymbolized: bool,
    /// Whether its stack copy was cut short at a page its thread had never
    /// touched.
    pub cut_short: bool,
    /// Whether its walk stopped at a read past the end of its stack copy
    /// (a stack deeper than the copy).
    pub past_copy: bool,
}

/// A sample's frames in an [`UnwoundBlock`].
pub(crate) enum BlockStack {
    /// All of them: `keys` in [`UnwoundBlock::keys`], leaf first.
    Whole { keys: Range<u32> },
    /// `keys` (leaf first), then the frames of the block's sample number
    /// `base` (an earlier one) without its innermost `skip`.
    Joined {
        base: u32,
        skip: u32,
        keys: Range<u32>,
    },
}

/// No stack node: the empty stack, the parent of outermost frames.
const ROOT: u32 = u32::MAX;

/// A node of the stack table: a frame and the node of its callers.
#[derive(Debug, Clone, Copy)]
struct StackNode {
    parent: u32,
    frame: u32,
}

/// Builds a [`Profile`]: [`add`](Self::add) (or
/// [`add_block`](Self::add_block)) every sample in trace order,
/// symbolicate [`frames`](Self::frames), then [`finish`](Self::finish).
/// Ids are given in first-seen order, so the result does not depend on how
/// work was split between threads.
///
/// Stacks are interned as a table of (callers, frame) nodes: a sample
/// costs a lookup per frame that is not its base sample's, not per frame.
pub(crate) struct ProfileBuilder {
    frames: Vec<FrameKey>,
    frame_ids: FxHashMap<FrameKey, u32>,
    nodes: Vec<StackNode>,
    node_ids: FxHashMap<(u32, u32), u32>,
    /// Per stack: its thread and innermost node.
    stack_keys: Vec<(u32, u32)>,
    stack_samples: Vec<u64>,
    stack_clean: Vec<u64>,
    /// Per stack: samples cut short, and of those the clean ones.
    stack_cut_short: Vec<(u64, u64)>,
    /// Per stack: samples whose walk stopped at the end of the copy.
    stack_past_copy: Vec<u64>,
    stack_amounts: Vec<Amounts>,
    /// Per stack and kind of event ([`EventKind::index`]): samples, and
    /// of those the clean ones.
    stack_kinds: Vec<[(u64, u64); EventKind::COUNT]>,
    stack_ids: FxHashMap<(u32, u32), u32>,
    sequences: Vec<Vec<SequenceEntry>>,
    /// The value sequences weigh; `None`: no sequences kept.
    sequence_value: Option<ValueKind>,
    /// Whether consecutive samples with the same stack share an entry.
    merge_runs: bool,
    thread_samples: Vec<u64>,
    thread_amounts: Vec<Amounts>,
    value_kinds: Vec<ValueKind>,
    selected: Option<ValueKind>,
    kernel_chain: u64,
    presymbolized: u64,
    /// Frame ids of the sample being added, leaf first.
    scratch: Vec<u32>,
    /// Innermost node of each sample of the block being added.
    block_leaves: Vec<u32>,
}

impl ProfileBuilder {
    /// For the timeline's `threads` and a profile of `value_kinds`, of
    /// which the user `selected` one; with `keep_sequences`, each thread's
    /// samples in time order too ([`Profile::sequences`]), one entry per
    /// run of samples with the same stack unless `every_sample`.
    pub fn new(
        threads: usize,
        keep_sequences: bool,
        every_sample: bool,
        value_kinds: Vec<ValueKind>,
        selected: Option<ValueKind>,
    ) -> ProfileBuilder {
        let sequence_value = if keep_sequences {
            selected.or_else(|| primary(&value_kinds))
        } else {
            None
        };
        ProfileBuilder {
            frames: Vec::new(),
            frame_ids: FxHashMap::default(),
            nodes: Vec::new(),
            node_ids: FxHashMap::default(),
            stack_keys: Vec::new(),
            stack_samples: Vec::new(),
            stack_clean: Vec::new(),
            stack_cut_short: Vec::new(),
            stack_past_copy: Vec::new(),
            stack_amounts: Vec::new(),
            stack_kinds: Vec::new(),
            stack_ids: FxHashMap::default(),
            sequences: vec![Vec::new(); threads],
            sequence_value,
            merge_runs: !every_sample,
            thread_samples: vec![0; threads],
            thread_amounts: vec![Amounts::default(); threads],
            value_kinds,
            selected,
            kernel_chain: 0,
            presymbolized: 0,
            scratch: Vec::new(),
            block_leaves: Vec::new(),
        }
    }

    /// Count the samples of a block (blocks in trace order).
    pub fn add_block(&mut self, block: &UnwoundBlock) {
        let mut leaves = std::mem::take(&mut self.block_leaves);
        leaves.clear();
        for s in &block.samples {
            let (from, keys) = match &s.stack {
                BlockStack::Whole { keys } => (ROOT, keys),
                BlockStack::Joined { base, skip, keys } => {
                    let mut node = leaves.get(*base as usize).copied().unwrap_or(ROOT);
                    for _ in 0..*skip {
                        node = self.nodes.get(node as usize).map_or(ROOT, |n| n.parent);
                    }
                    (node, keys)
                }
            };
            let keys = block
                .keys
                .get(keys.start as usize..keys.end as usize)
                .unwrap_or(&[]);
            let node = self.extend(from, keys);
            leaves.push(node);
            self.count(
                s.thread,
                s.time,
                node,
                EventKind::of_sample(s.amounts.kind()),
                &s.amounts.expand(),
                s.clean,
                s.used_kernel_chain,
                s.presymbolized,
                s.cut_short,
                s.past_copy,
            );
        }
        self.block_leaves = leaves;
    }

    /// The node of `frames` (leaf first) called from the stack `from`.
    /// Frame ids are given leaf first, as a sample lists them.
    fn extend(&mut self, from: u32, frames: &[FrameKey]) -> u32 {
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for f in frames {
            let next = self.frames.len() as u32;
            let id = *self.frame_ids.entry(*f).or_insert_with(|| {
                self.frames.push(*f);
                next
            });
            ids.push(id);
        }
        let mut node = from;
        for &frame in ids.iter().rev() {
            let next = self.nodes.len() as u32;
            let nodes = &mut self.nodes;
            node = *self.node_ids.entry((node, frame)).or_insert_with(|| {
                nodes.push(StackNode {
                    parent: node,
                    frame,
                });
                next
            });
        }
        self.scratch = ids;
        node
    }

    #[allow(clippy::too_many_arguments)]
    fn count(
        &mut self,
        thread: u32,
        time: lrnprof_format::Timestamp,
        node: u32,
        kind: EventKind,
        amounts: &Amounts,
        clean: bool,
        used_kernel_chain: bool,
        presymbolized: bool,
        cut_short: bool,
        past_copy: bool,
    ) {
        let next = self.stack_keys.len() as u32;
        let id = *self.stack_ids.entry((thread, node)).or_insert(next);
        if id == next {
            self.stack_keys.push((thread, node));
            self.stack_samples.push(0);
            self.stack_clean.push(0);
            self.stack_cut_short.push((0, 0));
            self.stack_past_copy.push(0);
            self.stack_amounts.push(Amounts::default());
            self.stack_kinds.push(Default::default());
        }
        let k = &mut self.stack_kinds[id as usize][kind.index()];
        k.0 += 1;
        k.1 += u64::from(clean);
        self.stack_past_copy[id as usize] += u64::from(past_copy);
        if cut_short {
            let c = &mut self.stack_cut_short[id as usize];
            c.0 += 1;
            c.1 += u64::from(clean);
        }
        self.stack_samples[id as usize] += 1;
        self.stack_amounts[id as usize].add(amounts);
        self.stack_clean[id as usize] += u64::from(clean);
        self.thread_samples[thread as usize] += 1;
        self.thread_amounts[thread as usize].add(amounts);
        self.kernel_chain += u64::from(used_kernel_chain);
        self.presymbolized += u64::from(presymbolized);
        if let Some(kind) = self.sequence_value {
            let weight = amounts.get(kind);
            if weight == 0 {
                // Not an event of the value shown (or one worth nothing).
                return;
            }
            let seq = &mut self.sequences[thread as usize];
            match seq.last_mut() {
                Some(last) if last.stack == id && self.merge_runs => {
                    last.samples += 1;
                    last.weight = last.weight.saturating_add(weight);
                    last.last_time = time;
                }
                _ => seq.push(SequenceEntry {
                    stack: id,
                    time,
                    last_time: time,
                    samples: 1,
                    weight,
                }),
            }
        }
    }

    /// The unique frames so far, in first-seen order.
    pub fn frames(&self) -> &[FrameKey] {
        &self.frames
    }

    /// The profile, given what symbolication found for each of
    /// [`frames`](Self::frames) (in the same order).
    pub fn finish<D: AsRef<[u8]>>(
        self,
        reader: &TraceReader<D>,
        trace_name: &str,
        prepared: Prepared,
        lines: Vec<Resolved>,
        stack_filter: &StackFilter,
    ) -> Profile {
        let Prepared {
            timeline,
            images,
            mut warnings,
            ..
        } = prepared;
        // Functions and locations in first-seen frame order.
        let mut functions: Vec<Function> = Vec::new();
        let mut function_ids: HashMap<(String, Option<String>), u32> = HashMap::new();
        let mut image_frames = vec![0u64; images.len()];
        let mut locations = Vec::with_capacity(self.frames.len());
        for (key, (frame_lines, known)) in self.frames.iter().zip(lines) {
            let lines = frame_lines
                .into_iter()
                .map(|l| {
                    let k = (l.function, l.file);
                    let next = functions.len() as u32;
                    let id = *function_ids.entry(k.clone()).or_insert_with(|| {
                        functions.push(Function {
                            name: k.0,
                            file: k.1,
                            first_line: None,
                        });
                        next
                    });
                    let f = &mut functions[id as usize];
                    if let Some(line) = l.line {
                        f.first_line = Some(f.first_line.map_or(line, |x| x.min(line)));
                    }
                    LocationLine {
                        function: id,
                        line: l.line,
                    }
                })
                .collect();
            locations.push(Location {
                image: key.image(),
                address: key.address(),
                lines,
                unknown: !known,
            });
        }

        let mut stats = Stats {
            trace_samples: timeline.samples,
            presymbolized_samples: self.presymbolized,
            kernel_callchain_samples: self.kernel_chain,
            lost_samples: timeline.lost,
            events: timeline.counts.clone(),
            trace_bytes: reader.len(),
            finished: reader.report().finished,
            ..Default::default()
        };
        if let (Some(a), Some(b)) = (timeline.first_time, timeline.last_time) {
            stats.duration_ns = b.0 - a.0;
        }
        let mut threads: Vec<ThreadProfile> = timeline
            .threads
            .iter()
            .enumerate()
            .map(|(i, ((pid, tid), t))| ThreadProfile {
                pid: *pid,
                tid: *tid,
                name: t.name.clone(),
                names: match t.names.len() {
                    0 | 1 => Vec::new(),
                    _ => t.names.clone(),
                },
                trace_samples: t.samples,
                samples: self.thread_samples[i],
                values: self.thread_amounts[i].project(&self.value_kinds),
                root_samples: 0,
                idle_ticks: t.idle_ticks,
            })
            .collect();
        stats.stack_bytes = timeline.threads.values().map(|t| t.stack_bytes).sum();
        // Each stack's frames, leaf first, walked up the tree; in parallel:
        // on a short python trace, a quarter of what was left on one
        // thread once the samples were unwound.
        let mut stacks: Vec<Stack> = self
            .stack_keys
            .par_iter()
            .zip(self.stack_samples.par_iter())
            .zip(self.stack_amounts.par_iter())
            .zip(self.stack_kinds.par_iter())
            .map(|(((&(thread, leaf), &samples), amounts), kinds)| {
                let mut locations = Vec::new();
                let mut node = leaf;
                while let Some(n) = self.nodes.get(node as usize) {
                    locations.push(n.frame);
                    node = n.parent;
                }
                Stack {
                    thread,
                    locations,
                    samples,
                    values: amounts.project(&self.value_kinds),
                    root_samples: 0,
                    kind_samples: kinds.map(|(samples, _)| samples),
                }
            })
            .collect();
        let kept = (!stack_filter.is_empty())
            .then(|| kept_stacks(stack_filter, &functions, &locations, &stacks));
        for (i, ((((s, clean), cut), past_copy), kinds)) in stacks
            .iter_mut()
            .zip(self.stack_clean)
            .zip(self.stack_cut_short)
            .zip(self.stack_past_copy)
            .zip(self.stack_kinds)
            .enumerate()
        {
            if kept.as_ref().is_some_and(|k| !k[i]) {
                // Not shown: neither in its thread's totals nor in stats.
                let t = &mut threads[s.thread as usize];
                t.samples = t.samples.saturating_sub(s.samples);
                for (v, sv) in t.values.iter_mut().zip(&s.values) {
                    *v = v.saturating_sub(*sv);
                }
                continue;
            }
            let outer_is_root = s.locations.last().is_some_and(|&l| {
                locations[l as usize].lines.last().is_some_and(|ll| {
                    ROOT_FUNCTIONS.contains(&functions[ll.function as usize].name.as_str())
                })
            });
            s.root_samples = if outer_is_root { s.samples } else { clean };
            for (kind, (samples, clean)) in EventKind::ALL.into_iter().zip(kinds) {
                let root = if outer_is_root { samples } else { clean };
                stats.root_by_kind.add(kind, samples, root);
            }
            // The kernel's callchain may have gone on to the root.
            stats.past_copy_samples += if outer_is_root { 0 } else { past_copy };
            // JIT code: in anonymous executable memory, or outside every
            // mapping but named by the process's JIT map; unnamed code
            // outside every mapping may be JIT code without a map.
            let short = s.samples - s.root_samples;
            if let Some(&l) = s.locations.last() {
                let named = !locations[l as usize].unknown;
                match self.frames[l as usize] {
                    FrameKey::Image { image, .. } | FrameKey::Unresolved { image, .. }
                        if images[image as usize].key.kind == ImageKind::Anonymous =>
                    {
                        stats.jit_end_samples += short;
                    }
                    FrameKey::Outside { .. } if named => stats.jit_end_samples += short,
                    FrameKey::Outside { .. } => stats.unnamed_end_samples += short,
                    _ => {}
                }
            }
            // Samples in JIT code that nothing names: each address is a
            // function of its own.
            if let Some(&l) = s.locations.first() {
                let jit = match self.frames[l as usize] {
                    FrameKey::Image { image, .. } | FrameKey::Unresolved { image, .. } => {
                        images[image as usize].key.kind == ImageKind::Anonymous
                    }
                    FrameKey::Outside { .. } => true,
                    _ => false,
                };
                if jit && locations[l as usize].unknown {
                    stats.unnamed_jit_samples += s.samples;
                }
            }
            stats.cut_short_samples += cut.0;
            stats.cut_short_root_samples += if outer_is_root { cut.0 } else { cut.1 };
            stats.samples += s.samples;
            stats.root_samples += s.root_samples;
            threads[s.thread as usize].root_samples += s.root_samples;
            stats.frames += s.samples * s.locations.len() as u64;
            for &l in &s.locations {
                let loc = &locations[l as usize];
                if loc.unknown {
                    stats.unknown_frames += s.samples;
                }
                if let Some(img) = loc.image {
                    image_frames[img as usize] += s.samples;
                }
            }
        }

        let (stacks, sequences) = match kept {
            None => (stacks, self.sequences),
            Some(kept) => retain_stacks(stacks, self.sequences, &kept),
        };

        let mut missing = Vec::new();
        let image_infos: Vec<ImageInfo> = images
            .iter()
            .zip(&image_frames)
            .map(|(img, &frames)| {
                let has_debug_info = img.data.as_ref().is_some_and(|d| d.has_debug_info());
                if frames > 0
                    && img.key.kind != lrnprof_format::ImageKind::Anonymous
                    && (img.unwind_source == Source::Missing
                        || img.symbol_source == Source::Missing)
                {
                    missing.push(format!(
                        "{} ({})",
                        img.key.path,
                        hex(&img.key.build_id).unwrap_or_else(|| "no build id".into())
                    ));
                }
                let jit = img.key.kind == lrnprof_format::ImageKind::Anonymous;
                let (unwind_data, symbol_data) = match jit {
                    true => (
                        "frame pointers only (JIT code has no unwind tables)".to_string(),
                        "the runtime's /tmp/perf-PID.map, where it wrote one".to_string(),
                    ),
                    false => (
                        source_text(&img.unwind_source),
                        source_text(&img.symbol_source),
                    ),
                };
                ImageInfo {
                    path: img.key.path.clone(),
                    build_id: hex(&img.key.build_id),
                    unwind_data,
                    symbol_data,
                    has_debug_info,
                    notes: img.notes.clone(),
                    frames,
                    jit,
                    content_id: img
                        .key
                        .build_id
                        .as_ref()
                        .is_some_and(|id| id.is_content_id()),
                }
            })
            .collect();
        if let Some(w) = empty_trace_warning(&stats, &timeline.header) {
            warnings.push(w);
        }
        if let Some(w) = past_copy_warning(&stats, &timeline.header) {
            warnings.push(w);
        }
        if let Some(w) = jit_end_warning(&stats) {
            warnings.push(w);
        }
        if let Some(w) = unnamed_jit_warning(&stats) {
            warnings.push(w);
        }
        if !missing.is_empty() {
            warnings.push(format!(
                "unwind or symbol data missing for {}: give their files with --symbols DIR or record with embedded data",
                missing.join(", ")
            ));
        }
        for img in &images {
            for n in &img.notes {
                if n.starts_with("not using") {
                    warnings.push(n.clone());
                }
            }
        }
        let processes = timeline
            .processes
            .iter()
            .map(|(pid, p)| ProcessInfo {
                pid: pid.0,
                command: p.command.clone(),
                executable: p.executable.clone(),
                name: timeline
                    .threads
                    .get(&(*pid, lrnprof_format::Tid(pid.0)))
                    .and_then(|t| t.name.clone())
                    .or_else(|| {
                        let exe = p
                            .executable
                            .as_deref()
                            .or(p.command.first().map(|c| c.as_str()))?;
                        Some(exe.rsplit('/').next().unwrap_or(exe).to_string())
                    }),
                cgroup: p.cgroup.clone(),
                abi32: p.abi32,
                samples: threads
                    .iter()
                    .filter(|t| t.pid == *pid)
                    .map(|t| t.samples)
                    .sum(),
            })
            .collect();
        Profile {
            header: timeline.header,
            trace_name: trace_name.to_string(),
            threads,
            processes,
            images: image_infos,
            functions,
            locations,
            stacks,
            value_kinds: self.value_kinds,
            selected: self.selected,
            sequences,
            stats,
            warnings,
        }
    }
}

/// Per stack, whether `filter` keeps it: decided once per function, then
/// per location (any of its inline levels) and per stack (any location).
fn kept_stacks(
    filter: &StackFilter,
    functions: &[Function],
    locations: &[Location],
    stacks: &[Stack],
) -> Vec<bool> {
    let any = |texts: &[String], name: &str| texts.iter().any(|t| name.contains(t.as_str()));
    let or = |(a, b): (bool, bool), (c, d): (bool, bool)| (a || c, b || d);
    // (matches a --focus text, matches an --ignore text)
    let by_function: Vec<(bool, bool)> = functions
        .iter()
        .map(|f| (any(&filter.focus, &f.name), any(&filter.ignore, &f.name)))
        .collect();
    let by_location: Vec<(bool, bool)> = locations
        .iter()
        .map(|l| {
            l.lines
                .iter()
                .map(|ll| by_function[ll.function as usize])
                .fold((false, false), or)
        })
        .collect();
    stacks
        .iter()
        .map(|s| {
            let (focus, ignore) = s
                .locations
                .iter()
                .map(|&l| by_location[l as usize])
                .fold((false, false), or);
            (filter.focus.is_empty() || focus) && !ignore
        })
        .collect()
}

/// The stacks `kept` says to keep, and the sequences' entries of those,
/// renumbered.
fn retain_stacks(
    stacks: Vec<Stack>,
    sequences: Vec<Vec<SequenceEntry>>,
    kept: &[bool],
) -> (Vec<Stack>, Vec<Vec<SequenceEntry>>) {
    let mut index = vec![None; stacks.len()];
    let mut out = Vec::new();
    for (i, s) in stacks.into_iter().enumerate() {
        if kept[i] {
            index[i] = Some(out.len() as u32);
            out.push(s);
        }
    }
    let sequences = sequences
        .into_iter()
        .map(|seq| {
            seq.into_iter()
                .filter_map(|mut e| {
                    e.stack = index[e.stack as usize]?;
                    Some(e)
                })
                .collect()
        })
        .collect();
    (out, sequences)
}

/// The largest user stack copy Linux's perf events allow (bytes; the
/// recorder's `MAX_STACK_SIZE`, which this crate cannot name). macOS
/// copies up to [`lrnprof_format::MAX_STACK_LEN`].
const LINUX_MAX_STACK_COPY: u32 = 65528;

/// When at least a tenth of the samples stop in JIT code, or in unnamed
/// code outside every mapped file: why, and what to do.
fn jit_end_warning(stats: &Stats) -> Option<String> {
    let share = |n: u64| 100.0 * n as f64 / stats.samples.max(1) as f64;
    let many = |n: u64| n > 0 && n.saturating_mul(10) >= stats.samples;
    let (named, unnamed) = (stats.jit_end_samples, stats.unnamed_end_samples);
    if many(named) {
        return Some(format!(
            "{named} samples ({:.1}%) stop short of their thread's root in JIT code \
             (anonymous executable memory, named from the perf-PID.map a runtime writes): \
             JIT code has no unwind tables, so only frame pointers lead to its callers, and \
             this code keeps none. Have the runtime keep them: for Java, run it with \
             -XX:+PreserveFramePointer",
            share(named)
        ));
    }
    many(unnamed).then(|| {
        format!(
            "{unnamed} samples ({:.1}%) stop short of their thread's root in unnamed code \
             outside every mapped file. If the program runs a JIT compiler (a JVM, \
             Node.js), that is its code: it is named only from the /tmp/perf-PID.map the \
             runtime writes, and followed to its callers only by frame pointers. Java: \
             -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit \
             -XX:+PreserveFramePointer; Node.js: --perf-basic-prof",
            share(unnamed)
        )
    })
}

/// When at least a tenth of the samples are in code that nothing names,
/// in anonymous executable memory or outside every mapped file (JIT code
/// without a map), and [`jit_end_warning`] has not already said how to
/// name it: what to do.
fn unnamed_jit_warning(stats: &Stats) -> Option<String> {
    let many = |n: u64| n > 0 && n.saturating_mul(10) >= stats.samples;
    let n = stats.unnamed_jit_samples;
    let told = many(stats.unnamed_end_samples) && !many(stats.jit_end_samples);
    (many(n) && !told).then(|| {
        format!(
            "{n} samples ({:.1}%) are in code that nothing names, in anonymous executable \
             memory or outside every mapped file: if the program runs a JIT compiler \
             (Node.js, Chromium, a JVM), that is its code, named only from the \
             /tmp/perf-PID.map the runtime writes, and each of its addresses counts as a \
             function of its own. Node.js: --perf-basic-prof; Chromium: --no-sandbox \
             --js-flags=--perf-basic-prof; Java: -XX:+UnlockDiagnosticVMOptions \
             -XX:+DumpPerfMapAtExit, or jcmd PID Compiler.perfmap; Python 3.12 or later: -X perf",
            100.0 * n as f64 / stats.samples.max(1) as f64
        )
    })
}

/// A trace without a single sample or event: why, most likely, and what
/// to do.
fn empty_trace_warning(stats: &Stats, header: &TraceHeader) -> Option<String> {
    if stats.trace_samples > 0 {
        return None;
    }
    let hz = header.sampling.frequency_hz;
    Some(if !stats.finished {
        // The recorder stopped (killed, out of disk) before it wrote a
        // whole block: how much the threads ran says nothing.
        "the readable part of the trace holds no samples or events: the recorder wrote no \
         whole block of them before it stopped (or before this read, if it still records)"
            .to_string()
    } else if header.events.cpu && hz > 0 {
        format!(
            "the trace holds no samples: the recorded threads used less CPU time than one \
             sampling interval ({:.2} ms at {hz} Hz), or were recorded while they slept; \
             record a longer run, raise the rate (lrnprof-rec --freq), or see where they \
             wait with lrnprof-rec --off-cpu",
            1000.0 / f64::from(hz)
        )
    } else {
        "the trace holds no samples or events: nothing of what was recorded happened \
         while it was"
            .to_string()
    })
}

/// What to do when more than 1 % of the samples stop short of their
/// thread's root at the end of their stack copy, from what the trace
/// recorded: frame pointers help where the kernel's callchain was
/// recorded (or can be, on Linux), a larger copy where one is allowed.
fn past_copy_warning(stats: &Stats, header: &TraceHeader) -> Option<String> {
    let n = stats.past_copy_samples;
    if n == 0 || n.saturating_mul(100) < stats.samples {
        return None;
    }
    let stack_size = header.sampling.stack_size;
    let frame_pointers =
        "build the program with frame pointers (-fno-omit-frame-pointer; for Rust \
         -C force-frame-pointers=yes)";
    let mut advice = Vec::new();
    match (header.sampling.kernel_callchain, header.os) {
        (true, _) => advice.push(format!(
            "{frame_pointers} so the kernel's callchain continues them"
        )),
        (false, Os::Linux) => advice.push(format!(
            "{frame_pointers} and record with --callchain on, so the kernel's callchain \
             continues them"
        )),
        (false, Os::MacOs) => {}
    }
    let max = match header.os {
        Os::Linux => LINUX_MAX_STACK_COPY,
        Os::MacOs => lrnprof_format::MAX_STACK_LEN,
    };
    if stack_size < max {
        advice.push(format!("record with a larger --stack-size (at most {max})"));
    }
    let advice = match advice.join(", or ") {
        a if a.is_empty() => "No larger copy can be recorded".to_string(),
        mut a => {
            a[..1].make_ascii_uppercase();
            a
        }
    };
    Some(format!(
        "{n} samples ({:.1}%) stop short of their thread's root at the end of their \
         {stack_size}-byte stack copy: their stacks are deeper than the copy. {advice}",
        100.0 * n as f64 / stats.samples.max(1) as f64
    ))
}

fn source_text(s: &Source) -> String {
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::Timestamp;

    fn function(name: &str) -> Function {
        Function {
            name: name.to_string(),
            file: None,
            first_line: None,
        }
    }

    /// A location of functions `f`, innermost (inlined) first.
    fn location(f: &[u32]) -> Location {
        Location {
            image: None,
            address: 0,
            lines: f
                .iter()
                .map(|&function| LocationLine {
                    function,
                    line: None,
                })
                .collect(),
            unknown: false,
        }
    }

    fn stack(locations: &[u32]) -> Stack {
        Stack {
            thread: 0,
            locations: locations.to_vec(),
            samples: 1,
            values: vec![1],
            root_samples: 1,
            kind_samples: [0; EventKind::COUNT],
        }
    }

    #[test]
    fn focus_and_ignore_match_any_level_of_any_frame() {
        let functions = [function("main"), function("parse_json"), function("memcpy")];
        // Location 1 is memcpy inlined into parse_json.
        let locations = [location(&[0]), location(&[2, 1]), location(&[2])];
        let stacks = [stack(&[1, 0]), stack(&[2, 0]), stack(&[0])];
        let kept = |focus: &[&str], ignore: &[&str]| {
            let filter = StackFilter {
                focus: focus.iter().map(|s| s.to_string()).collect(),
                ignore: ignore.iter().map(|s| s.to_string()).collect(),
            };
            kept_stacks(&filter, &functions, &locations, &stacks)
        };
        assert_eq!(kept(&["json"], &[]), [true, false, false]);
        assert_eq!(kept(&["memcpy"], &[]), [true, true, false]);
        assert_eq!(kept(&[], &["memcpy"]), [false, false, true]);
        assert_eq!(kept(&["main"], &["parse"]), [false, true, true]);
        assert_eq!(kept(&["json", "mem"], &[]), [true, true, false]);
    }

    #[test]
    fn dropped_stacks_leave_the_sequences_renumbered() {
        let entry = |stack: u32, t: u64| SequenceEntry {
            stack,
            time: Timestamp(t),
            last_time: Timestamp(t),
            samples: 1,
            weight: 1,
        };
        let stacks = vec![stack(&[0]), stack(&[1]), stack(&[2])];
        let sequences = vec![vec![entry(0, 1), entry(1, 2), entry(2, 3), entry(0, 4)]];
        let (stacks, sequences) = retain_stacks(stacks, sequences, &[false, true, true]);
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0].locations, [1]);
        assert_eq!(sequences, [vec![entry(0, 2), entry(1, 3)]]);
    }

    fn stats(samples: u64, past_copy_samples: u64) -> Stats {
        Stats {
            samples,
            past_copy_samples,
            finished: true,
            ..Default::default()
        }
    }

    #[test]
    fn stacks_ending_in_jit_code_are_told_from_a_tenth_of_the_samples() {
        assert_eq!(jit_end_warning(&stats(1000, 0)), None);
        let jit = |n| Stats {
            jit_end_samples: n,
            ..stats(1000, 0)
        };
        assert_eq!(jit_end_warning(&jit(99)), None);
        let w = jit_end_warning(&jit(100)).unwrap();
        assert!(w.starts_with("100 samples (10.0%) stop short"), "{w}");
        assert!(w.contains("-XX:+PreserveFramePointer"), "{w}");
        let unnamed = |n| Stats {
            unnamed_end_samples: n,
            ..stats(1000, 0)
        };
        assert_eq!(jit_end_warning(&unnamed(99)), None);
        let w = jit_end_warning(&unnamed(500)).unwrap();
        assert!(w.starts_with("500 samples (50.0%) stop short"), "{w}");
        assert!(w.contains("DumpPerfMapAtExit"), "{w}");
    }

    #[test]
    fn samples_in_unnamed_jit_code_are_told_from_a_tenth_of_the_samples() {
        let jit = |leaf, stopped| Stats {
            unnamed_jit_samples: leaf,
            unnamed_end_samples: stopped,
            ..stats(1000, 0)
        };
        assert_eq!(unnamed_jit_warning(&jit(0, 0)), None);
        assert_eq!(unnamed_jit_warning(&jit(99, 0)), None);
        let w = unnamed_jit_warning(&jit(130, 0)).unwrap();
        assert!(
            w.starts_with("130 samples (13.0%) are in code that nothing names"),
            "{w}"
        );
        assert!(w.contains("--perf-basic-prof"), "{w}");
        // Stacks that also stop there: the advice is given once.
        assert_eq!(unnamed_jit_warning(&jit(500, 500)), None);
        assert!(jit_end_warning(&jit(500, 500))
            .unwrap()
            .contains("DumpPerfMapAtExit"));
        // Unless the other warning is about named JIT code without frame
        // pointers: then this one says how to name the rest.
        let both = Stats {
            jit_end_samples: 300,
            ..jit(500, 500)
        };
        assert!(!jit_end_warning(&both)
            .unwrap()
            .contains("DumpPerfMapAtExit"));
        assert!(unnamed_jit_warning(&both).is_some());
    }

    fn header(os: Os, kernel_callchain: bool, stack_size: u32) -> TraceHeader {
        let mut h = TraceHeader::example();
        h.os = os;
        h.sampling.kernel_callchain = kernel_callchain;
        h.sampling.stack_size = stack_size;
        h
    }

    #[test]
    fn stacks_deeper_than_the_copy_are_explained_past_one_percent() {
        let linux = header(Os::Linux, true, LINUX_MAX_STACK_COPY);
        assert_eq!(past_copy_warning(&stats(1000, 0), &linux), None);
        assert_eq!(past_copy_warning(&stats(1000, 9), &linux), None);
        let w = past_copy_warning(&stats(1000, 10), &linux).unwrap();
        assert!(w.starts_with("10 samples (1.0%) stop short"), "{w}");
        assert!(w.contains("65528-byte stack copy"), "{w}");
        assert!(w.contains("-fno-omit-frame-pointer"), "{w}");
        // At the largest copy, a larger one is no advice.
        assert!(!w.contains("--stack-size"), "{w}");
        let w = past_copy_warning(&stats(10, 10), &header(Os::Linux, true, 8192)).unwrap();
        assert!(w.contains("(100.0%)") && w.contains("8192-byte"), "{w}");
        assert!(w.contains("a larger --stack-size (at most 65528)"), "{w}");
    }

    #[test]
    fn a_trace_without_samples_is_explained() {
        let mut h = header(Os::Linux, true, LINUX_MAX_STACK_COPY);
        let mut none = stats(0, 0);
        none.trace_samples = 0;
        let mut some = stats(5, 0);
        some.trace_samples = 5;
        assert_eq!(empty_trace_warning(&some, &h), None);
        h.events.cpu = true;
        h.sampling.frequency_hz = 4000;
        let w = empty_trace_warning(&none, &h).unwrap();
        assert!(
            w.contains("one sampling interval (0.25 ms at 4000 Hz)"),
            "{w}"
        );
        h.events.cpu = false;
        let w = empty_trace_warning(&none, &h).unwrap();
        assert!(w.starts_with("the trace holds no samples or events"), "{w}");
        // A trace cut off before its first block of samples.
        h.events.cpu = true;
        none.finished = false;
        let w = empty_trace_warning(&none, &h).unwrap();
        assert!(
            w.starts_with("the readable part of the trace holds no samples"),
            "{w}"
        );
    }

    #[test]
    fn the_advice_follows_what_the_trace_recorded() {
        let all = stats(10, 10);
        // Linux without the callchain: turn it on too.
        let w = past_copy_warning(&all, &header(Os::Linux, false, LINUX_MAX_STACK_COPY)).unwrap();
        assert!(w.contains("--callchain on"), "{w}");
        // macOS records no callchain and copies up to 8 MiB.
        let w = past_copy_warning(&all, &header(Os::MacOs, false, 65528)).unwrap();
        assert!(!w.contains("frame pointers"), "{w}");
        assert!(w.contains("at most 8388608"), "{w}");
        let w = past_copy_warning(&all, &header(Os::MacOs, false, 8 << 20)).unwrap();
        assert!(w.ends_with("No larger copy can be recorded"), "{w}");
    }
}
