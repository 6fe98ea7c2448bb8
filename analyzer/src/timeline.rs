//! First pass over a trace: everything but the samples' stacks. Rebuilds,
//! per process, the image map over time as a list of generations, and
//! collects threads, lost counts and embedded blobs.

use crate::blobs::BlobStore;
use crate::kept::{Decompressed, KeptBlocks};
use crate::options::Progress;
use crate::ordered::for_each_in_order;
use crate::outcomes::{Outcomes, Pairing};
use crate::tallies::SyscallTallies;
use lrnprof_format::{
    BlockInfo, BuildId, FormatError, ImageKind, LostSource, Pid, ProcessEvent, Record, RecordRef,
    Sample, SampleFlags, SampleKind, StackMode, Summary, Tid, Timestamp, TraceHeader, TraceReader,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Blocks decoded at once: two per worker, so memory stays a few decoded
/// blocks per worker whatever the trace's length (a chunk being decoded
/// and one being applied). The passes that apply blocks in order keep
/// twice that many in flight ([`for_each_in_order`]'s window).
pub(crate) fn chunk_blocks() -> usize {
    rayon::current_num_threads().max(1) * 2
}

/// An image file, identified by path and build id (one entry however many
/// processes map it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ImageKey {
    pub path: String,
    pub build_id: Option<BuildId>,
    pub kind: ImageKind,
}

/// One mapping of an image into a process (AVMA range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub image: u32,
    pub executable: bool,
}

/// The image map of a process from `time` until the next generation.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub time: Timestamp,
    /// Sorted by `start`, non-overlapping.
    pub mappings: Arc<Vec<Mapping>>,
}

/// What the first pass learnt about a process.
#[derive(Debug, Default)]
pub(crate) struct ProcessTimeline {
    pub command: Vec<String>,
    pub executable: Option<String>,
    /// Its cgroup, the last recorded.
    pub cgroup: Option<String>,
    /// Some of its samples ran 32-bit code ([`SampleFlags::ABI_32`]).
    pub abi32: bool,
    pub generations: Vec<Generation>,
    current: Vec<Mapping>,
    dirty: bool,
}

impl ProcessTimeline {
    fn map(&mut self, m: Mapping) {
        self.unmap(m.start, m.end);
        let at = self.current.partition_point(|x| x.start < m.start);
        self.current.insert(at, m);
        self.dirty = true;
    }

    fn unmap(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.current.len() + 1);
        let mut changed = false;
        for m in self.current.drain(..) {
            if m.end <= start || m.start >= end {
                out.push(m);
                continue;
            }
            changed = true;
            if m.start < start {
                out.push(Mapping { end: start, ..m });
            }
            if m.end > end {
                out.push(Mapping {
                    start: end,
                    file_offset: m.file_offset.wrapping_add(end - m.start),
                    ..m
                });
            }
        }
        self.current = out;
        self.dirty |= changed;
    }

    fn snapshot(&mut self, time: Timestamp) {
        if self.dirty || self.generations.is_empty() {
            self.generations.push(Generation {
                time,
                mappings: Arc::new(self.current.clone()),
            });
            self.dirty = false;
        }
    }
}

/// Index of the generation in effect at `time` (the first one for samples
/// before any change).
pub(crate) fn generation_index(generations: &[Generation], time: Timestamp) -> Option<usize> {
    if generations.is_empty() {
        return None;
    }
    Some(
        generations
            .partition_point(|g| g.time <= time)
            .saturating_sub(1),
    )
}

/// What the first pass learnt about a thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThreadTimeline {
    /// Its last name.
    pub name: Option<String>,
    /// Every name it was given, with when, in time order (the last
    /// [`MAX_NAMES`]).
    pub names: Vec<(Timestamp, String)>,
    pub samples: u64,
    pub weight: u64,
    pub stack_bytes: u64,
    /// Sampling ticks at which the thread was found idle (`Idle` records).
    pub idle_ticks: u64,
}

/// Names kept per thread at most: a program that names its threads per
/// task could rename one thousands of times.
const MAX_NAMES: usize = 1024;

/// The name at `time` of a thread given `names` (with when, in time order)
/// and last named `last`: the last given at or before `time` (the first,
/// for a time before any).
pub(crate) fn name_at<'a>(
    names: &'a [(Timestamp, String)],
    last: Option<&'a String>,
    time: Timestamp,
) -> Option<&'a String> {
    if names.len() <= 1 {
        return last;
    }
    let at = names.partition_point(|(t, _)| *t <= time);
    names.get(at.saturating_sub(1)).map(|(_, n)| n)
}

/// The names other than `last` among `names` (a thread's, see
/// [`name_at`]), oldest first, each once.
pub(crate) fn earlier_names(names: &[(Timestamp, String)], last: Option<&String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, n) in names {
        if Some(n) != last && !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

impl ThreadTimeline {
    /// The thread was given `name` at `time`.
    fn named(&mut self, time: Timestamp, name: String) {
        if self.name.as_ref() == Some(&name) {
            return;
        }
        if self.names.len() >= MAX_NAMES {
            self.names.remove(0);
        }
        let at = self.names.partition_point(|(t, _)| *t <= time);
        self.names.insert(at, (time, name.clone()));
        self.name = Some(name);
    }

    /// The name the thread had at `time` (see [`name_at`]).
    pub fn name_at(&self, time: Timestamp) -> Option<&String> {
        name_at(&self.names, self.name.as_ref(), time)
    }
}

/// Everything but the samples' stacks.
#[derive(Debug)]
pub(crate) struct Timeline {
    pub header: TraceHeader,
    pub processes: BTreeMap<Pid, ProcessTimeline>,
    pub threads: BTreeMap<(Pid, Tid), ThreadTimeline>,
    pub thread_index: HashMap<(Pid, Tid), u32>,
    pub images: Vec<ImageKey>,
    image_index: HashMap<ImageKey, u32>,
    pub blobs: BlobStore,
    pub samples: u64,
    pub presymbolized_samples: u64,
    pub lost: u64,
    /// Samples per kind, and the event records that end them.
    pub counts: EventCounts,
    pub first_time: Option<Timestamp>,
    pub last_time: Option<Timestamp>,
    pub summary: Option<Summary>,
    pub warnings: Vec<String>,
    /// What later records said about event samples (syscall returns,
    /// switch-ins, frees).
    pub outcomes: Outcomes,
    /// Syscall tallies and the recorded calls they scale.
    pub tallies: SyscallTallies,
    /// Indexes (into the reader's blocks) of blocks that failed to decode.
    pub bad_blocks: BTreeSet<usize>,
}

impl Timeline {
    fn new(header: TraceHeader) -> Timeline {
        Timeline {
            header,
            processes: BTreeMap::new(),
            threads: BTreeMap::new(),
            thread_index: HashMap::new(),
            images: Vec::new(),
            image_index: HashMap::new(),
            blobs: BlobStore::default(),
            samples: 0,
            presymbolized_samples: 0,
            lost: 0,
            counts: EventCounts::default(),
            first_time: None,
            last_time: None,
            summary: None,
            warnings: Vec::new(),
            outcomes: Outcomes::default(),
            tallies: SyscallTallies::default(),
            bad_blocks: BTreeSet::new(),
        }
    }

    fn intern_image(&mut self, key: ImageKey) -> u32 {
        if let Some(&i) = self.image_index.get(&key) {
            return i;
        }
        let i = self.images.len() as u32;
        self.image_index.insert(key.clone(), i);
        self.images.push(key);
        i
    }

    fn see_time(&mut self, t: Timestamp) {
        self.first_time = Some(self.first_time.map_or(t, |f| f.min(t)));
        self.last_time = Some(self.last_time.map_or(t, |l| l.max(t)));
    }

    fn apply(&mut self, item: Item) {
        match item {
            Item::Record(record) => self.apply_record(*record),
            Item::Sample {
                time,
                pid,
                tid,
                weight,
                stack_bytes,
                presymbolized,
                abi32,
                kind,
                detail,
            } => {
                self.outcomes.sample(pid, tid, time, kind, detail);
                if let (SampleKind::Syscall, Pairing::Syscall { nr }) = (kind, detail) {
                    self.tallies.sample(pid, tid, nr);
                }
                self.counts.sample(kind);
                self.see_time(time);
                self.samples += 1;
                self.presymbolized_samples += u64::from(presymbolized);
                let t = self.threads.entry((pid, tid)).or_default();
                t.samples += 1;
                t.weight = t.weight.saturating_add(weight);
                t.stack_bytes += stack_bytes;
                let p = self.processes.entry(pid).or_default();
                p.snapshot(time);
                p.abi32 |= abi32;
            }
        }
    }

    fn apply_record(&mut self, record: Record) {
        if let Some(t) = record.time() {
            self.see_time(t);
        }
        self.outcomes.record(&record);
        match record {
            Record::Process(mut p) => {
                // A fork's record names no command: the child runs its
                // parent's program with its parent's arguments (what /proc
                // shows for it) until it execs.
                if p.event == ProcessEvent::Fork && p.command.is_empty() {
                    if let Some(parent) = p.parent.and_then(|pp| self.processes.get(&pp)) {
                        p.command = parent.command.clone();
                        if p.executable.is_none() {
                            p.executable = parent.executable.clone();
                        }
                    }
                }
                let proc = self.processes.entry(p.pid).or_default();
                if !p.command.is_empty() {
                    proc.command = p.command;
                }
                if p.executable.is_some() {
                    proc.executable = p.executable;
                }
                if p.cgroup.is_some() {
                    proc.cgroup = p.cgroup;
                }
                if p.event == ProcessEvent::Exec {
                    proc.current.clear();
                    proc.dirty = true;
                }
            }
            Record::Thread(t) => {
                let th = self.threads.entry((t.pid, t.tid)).or_default();
                if let Some(name) = t.name.filter(|n| !n.is_empty()) {
                    th.named(t.time, name);
                }
            }
            Record::ImageMap(m) => {
                let image = self.intern_image(ImageKey {
                    path: m.path,
                    build_id: m.build_id.filter(|b| !b.0.is_empty()),
                    kind: m.kind,
                });
                if m.start < m.end {
                    self.processes.entry(m.pid).or_default().map(Mapping {
                        start: m.start,
                        end: m.end,
                        file_offset: m.file_offset,
                        image,
                        executable: m.executable,
                    });
                }
            }
            Record::ImageUnmap(u) => {
                self.processes
                    .entry(u.pid)
                    .or_default()
                    .unmap(u.start, u.end);
            }
            Record::Lost(l) => {
                self.lost += l.count;
                self.counts.lost(l.source, l.count);
            }
            Record::Idle(i) => {
                let th = self.threads.entry((i.pid, i.tid)).or_default();
                th.idle_ticks = th.idle_ticks.saturating_add(i.ticks);
            }
            Record::Blob(b) => self.blobs.add(b),
            Record::Summary(s) => self.summary = Some(s),
            // Their meaning went to `outcomes` above.
            Record::Free(_) => self.counts.frees += 1,
            Record::SyscallTally(t) => self.tallies.record(&t),
            Record::SyscallExit(_) | Record::SwitchIn(_) => {}
            Record::Sample(_) => unreachable!("samples are turned into Item::Sample"),
        }
    }
}

/// How many events of each kind a trace holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EventCounts {
    /// CPU samples (clock, timer or cycles).
    pub cpu_samples: u64,
    /// Sampled allocations.
    pub allocations: u64,
    /// Frees of sampled allocations.
    pub frees: u64,
    /// Syscall entries.
    pub syscalls: u64,
    /// Off-CPU switch-outs.
    pub off_cpu: u64,
    /// Samples or events the kernel's buffers dropped.
    pub lost_kernel: u64,
    /// Samples the recorder dropped.
    pub lost_recorder: u64,
    /// Allocations and frees the allocation sampler dropped.
    pub lost_heap_sampler: u64,
}

impl EventCounts {
    fn sample(&mut self, kind: SampleKind) {
        match kind {
            SampleKind::CpuTime | SampleKind::Cycles | SampleKind::WallTime => {
                self.cpu_samples += 1
            }
            SampleKind::Allocation => self.allocations += 1,
            SampleKind::Syscall => self.syscalls += 1,
            SampleKind::OffCpu => self.off_cpu += 1,
        }
    }

    fn lost(&mut self, source: LostSource, count: u64) {
        let n = match source {
            LostSource::Kernel => &mut self.lost_kernel,
            LostSource::Recorder => &mut self.lost_recorder,
            LostSource::HeapSampler => &mut self.lost_heap_sampler,
        };
        *n = n.saturating_add(count);
    }
}

/// A record as the first pass keeps it: samples shrink to their metadata.
enum Item {
    Record(Box<Record>),
    Sample {
        time: Timestamp,
        pid: Pid,
        tid: Tid,
        weight: u64,
        stack_bytes: u64,
        presymbolized: bool,
        abi32: bool,
        kind: SampleKind,
        detail: Pairing,
    },
}

/// Read every block once (in parallel, each block's records applied in
/// trace order as soon as they and those before them are read) and build
/// the timeline. Stacks are checked but not expanded. Blocks that fail to
/// decode are skipped with a warning and listed in
/// [`Timeline::bad_blocks`].
/// `release` is told the blocks the pass is done with; `kept` keeps what
/// decompressed blocks fit in its budget.
pub(crate) fn scan<D: AsRef<[u8]> + Sync>(
    reader: &TraceReader<D>,
    progress: &dyn Progress,
    release: &(dyn Fn(&[BlockInfo]) + Sync),
    kept: &KeptBlocks<'_>,
) -> Timeline {
    let mut timeline = Timeline::new(reader.header().clone());
    let blocks = reader.blocks();
    let total = blocks.len() as u64;
    for_each_in_order(
        blocks.len(),
        chunk_blocks() * 2,
        |i| {
            let items = items_of(reader, i, kept);
            release(&blocks[i..=i]);
            items
        },
        |i, items| {
            timeline.apply_block(i, items, blocks, kept);
            progress.update("reading", i as u64 + 1, total);
        },
    );
    for (i, key) in timeline.threads.keys().enumerate() {
        timeline.thread_index.insert(*key, i as u32);
    }
    if let Some(end) = timeline.last_time {
        timeline.outcomes.finish(end);
    }
    timeline
}

/// What the first pass read of a block: what it keeps of the records,
/// and the decompressed block.
type Decoded<'a> = Result<(Vec<Item>, Decompressed<'a>), FormatError>;

/// What the first pass keeps of block `index`'s records, and the block
/// (in its part of `kept`'s arena if it is kept).
fn items_of<'a, D: AsRef<[u8]>>(
    reader: &TraceReader<D>,
    index: usize,
    kept: &KeptBlocks<'a>,
) -> Decoded<'a> {
    let b = &reader.blocks()[index];
    let raw = kept.decompress(reader, index)?;
    let mut cursor = raw.records(StackMode::LengthsOnly);
    // Every record takes a byte at least: a count past that is a corrupt
    // header, which decoding reports.
    let mut items =
        Vec::with_capacity((raw.record_count() as usize).min(b.header.raw_len as usize));
    while let Some(r) = cursor.next() {
        items.push(match r? {
            RecordRef::Sample(s) => Item::of_sample(&s.sample, s.stack.len().into()),
            RecordRef::Record(Record::Sample(s)) => Item::of_sample(&s, s.stack.bytes.len() as u64),
            RecordRef::Record(other) => Item::Record(Box::new(other)),
        });
    }
    drop(cursor);
    Ok((items, raw))
}

impl Item {
    fn of_sample(s: &Sample, stack_bytes: u64) -> Item {
        Item::Sample {
            time: s.time,
            pid: s.pid,
            tid: s.tid,
            weight: s.weight,
            stack_bytes,
            presymbolized: !s.frames.is_empty(),
            abi32: s.flags.contains(SampleFlags::ABI_32),
            kind: s.kind,
            detail: Pairing::from(&s.detail),
        }
    }
}

impl Timeline {
    fn apply_block<'a>(
        &mut self,
        i: usize,
        decoded: Decoded<'a>,
        blocks: &[BlockInfo],
        kept: &KeptBlocks<'a>,
    ) {
        match decoded {
            Ok((items, raw)) => {
                items.into_iter().for_each(|item| self.apply(item));
                kept.keep(i, raw);
            }
            Err(e) => {
                self.bad_blocks.insert(i);
                self.warnings.push(format!(
                    "block at offset {} could not be decoded and was skipped: {e}",
                    blocks[i].offset.0
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_thread_has_each_name_for_its_time() {
        let mut t = ThreadTimeline::default();
        assert_eq!(t.name_at(Timestamp(5)), None);
        t.named(Timestamp(10), "main".into());
        assert_eq!(t.name_at(Timestamp(5)).unwrap(), "main");
        t.named(Timestamp(20), "loader".into());
        t.named(Timestamp(20), "loader".into());
        t.named(Timestamp(30), "main".into());
        let at = |time| t.name_at(Timestamp(time)).unwrap().as_str();
        assert_eq!(
            [at(5), at(10), at(19), at(20), at(29), at(30), at(99)],
            ["main", "main", "main", "loader", "loader", "main", "main"]
        );
        assert_eq!(t.name.as_deref(), Some("main"));
        assert_eq!(earlier_names(&t.names, t.name.as_ref()), ["loader"]);
        // A thread renamed more often than the names kept: the latest
        // stay, and the current name is found.
        for i in 0..MAX_NAMES as u64 + 10 {
            t.named(Timestamp(100 + i), format!("task-{i}"));
        }
        let last = format!("task-{}", MAX_NAMES + 9);
        assert_eq!(t.name_at(Timestamp(u64::MAX)), Some(&last));
        assert_eq!(t.names.len(), MAX_NAMES);
    }

    /// The first pass holds an item per record of the blocks in flight: a
    /// syscall's arguments made every item 104 bytes.
    #[test]
    fn items_stay_small() {
        assert!(
            std::mem::size_of::<Item>() <= 56,
            "{}",
            std::mem::size_of::<Item>()
        );
    }

    fn m(start: u64, end: u64, off: u64, image: u32) -> Mapping {
        Mapping {
            start,
            end,
            file_offset: off,
            image,
            executable: true,
        }
    }

    #[test]
    fn map_replaces_and_unmap_splits() {
        let mut p = ProcessTimeline::default();
        p.map(m(0x1000, 0x5000, 0, 1));
        p.map(m(0x2000, 0x3000, 0x100, 2));
        assert_eq!(
            p.current,
            vec![
                m(0x1000, 0x2000, 0, 1),
                m(0x2000, 0x3000, 0x100, 2),
                m(0x3000, 0x5000, 0x2000, 1)
            ]
        );
        p.unmap(0x1800, 0x3800);
        assert_eq!(
            p.current,
            vec![m(0x1000, 0x1800, 0, 1), m(0x3800, 0x5000, 0x2800, 1)]
        );
    }

    #[test]
    fn generations_follow_time() {
        let mut p = ProcessTimeline::default();
        p.map(m(0x1000, 0x2000, 0, 1));
        p.snapshot(Timestamp(10));
        p.snapshot(Timestamp(11)); // unchanged: no new generation
        p.map(m(0x4000, 0x5000, 0, 2));
        p.snapshot(Timestamp(20));
        assert_eq!(p.generations.len(), 2);
        let at = |t| generation_index(&p.generations, Timestamp(t)).unwrap();
        assert_eq!(at(15), 0);
        assert_eq!(at(20), 1);
        assert_eq!(at(5), 0);
        assert_eq!(p.generations[at(99)].mappings.len(), 2);
        assert_eq!(generation_index(&[], Timestamp(1)), None);
    }
}
