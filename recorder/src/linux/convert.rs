//! Turning drained perf records into trace records, on the writer thread.
//!
//! Ring buffers are per CPU, so records arrive in time order per CPU but
//! not across CPUs. Records are held in a heap and released in time order
//! once every buffer has been drained past their time (a "round", as in
//! perf's ordered events). This thread also does the slow lookups the
//! sampling side must not: build ids, `/proc` reads, the vDSO's bytes.

use super::heap::{HeapEvent, HeapStats};
use super::images::Images;
use super::parse::{self, Layout, Mmap2Record, PerfRecord, SampleRecord};
use super::procfs::{self, MapsEntry};
use super::regs::ArchRegs;
use crate::error::RecordError;
use crate::report::RecordWarning;
use crate::sink::Convert;
use lrnprof_format::{
    FreeRecord, LostRecord, LostSource, Pid, ProcessEvent, ProcessRecord, Record, Sample,
    SampleDetail, SampleFlags, SampleKind, StackSnapshot, ThreadEvent, ThreadRecord, Tid,
    Timestamp,
};
use lrnprof_image::EmbedLevel;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// What the sampling side sends to the writer thread.
#[derive(Debug)]
pub(crate) enum RawMsg {
    /// What existed when recording started. Sent before any chunk.
    Initial(Initial),
    /// Whole perf records drained from one ring buffer.
    Chunk(Vec<u8>),
    /// Every ring buffer has been drained up to at least this time (ns).
    Round(u64),
    /// Events of the allocation sampler, in the order it wrote them.
    Heap(Vec<HeapEvent>),
    /// The launched process exited.
    Exited {
        /// The process.
        pid: u32,
        /// When it was reaped (ns).
        time: u64,
        /// `Some(code)` for an exit, or `128 + signal`.
        code: i32,
    },
}

/// The processes already there when recording started.
#[derive(Debug)]
pub(crate) struct Initial {
    /// Start of recording (ns).
    pub time: u64,
    /// The process.
    pub pid: u32,
    /// Its threads.
    pub tids: Vec<u32>,
    /// Launched: the command; it has not exec'd yet, so do not read its
    /// maps (they are the recorder's).
    pub launched: Option<Vec<String>>,
}

/// A record waiting to be released in time order.
struct Pending {
    time: u64,
    seq: u64,
    /// Boxed: the heap moves entries log(n) times per push and pop, and a
    /// sample is hundreds of bytes.
    record: Box<Record>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

/// Writable memory ranges of a process, to trim stack copies at the end
/// of the stack's mapping.
struct Regions {
    ranges: Vec<(u64, u64)>,
    read_at: Instant,
}

/// Re-read a process's maps on a miss at most this often.
const REGIONS_REFRESH: Duration = Duration::from_millis(50);

/// The Linux [`Convert`].
pub(crate) struct Converter {
    layout: Layout,
    regs: ArchRegs,
    sample_kind: SampleKind,
    pending: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    /// Records older than this may be released.
    released_before: u64,
    /// Records older than this have been released.
    released_upto: u64,
    /// What the allocation sampler did, with `--heap`.
    heap: Option<HeapStats>,
    last_time: u64,
    names: HashMap<u32, String>,
    launched_root: Option<u32>,
    regions: HashMap<u32, Regions>,
    images: Images,
    /// Records that could not be parsed.
    malformed: u64,
    pids_seen: HashSet<u32>,
    priority: Option<super::sys::PriorityGuard>,
}

impl Converter {
    /// A converter for records of `layout`.
    pub fn new(
        layout: Layout,
        regs: ArchRegs,
        sample_kind: SampleKind,
        embed: EmbedLevel,
    ) -> Converter {
        Converter {
            layout,
            regs,
            sample_kind,
            pending: BinaryHeap::new(),
            seq: 0,
            released_before: 0,
            released_upto: 0,
            heap: None,
            last_time: 0,
            names: HashMap::new(),
            launched_root: None,
            regions: HashMap::new(),
            images: Images::new(embed),
            malformed: 0,
            pids_seen: HashSet::new(),
            priority: None,
        }
    }

    /// Allocation sampling is on; `explained`: a warning has already said
    /// why the launched program's allocations will not be recorded.
    pub fn with_heap(mut self, explained: bool) -> Converter {
        self.heap = Some(HeapStats::new(explained));
        self
    }

    fn push(&mut self, time: u64, record: Record) {
        self.last_time = self.last_time.max(time);
        self.seq += 1;
        self.pending.push(Reverse(Pending {
            time,
            seq: self.seq,
            record: Box::new(record),
        }));
    }

    fn release(&mut self, before: u64, out: &mut Vec<Record>) {
        while let Some(Reverse(p)) = self.pending.peek() {
            if p.time >= before {
                break;
            }
            let Reverse(p) = self.pending.pop().expect("peeked");
            out.push(*p.record);
        }
    }

    fn initial(&mut self, init: Initial) {
        let t = init.time;
        let pid = init.pid;
        let (command, executable) = match &init.launched {
            Some(cmd) => (cmd.clone(), None),
            None => (procfs::command_line(pid), procfs::executable(pid)),
        };
        if init.launched.is_some() {
            self.launched_root = Some(pid);
        }
        self.push(
            t,
            Record::Process(ProcessRecord {
                time: Timestamp(t),
                pid: Pid(pid),
                parent: procfs::parent_pid(pid).map(Pid),
                event: ProcessEvent::Existing,
                command,
                executable,
                cgroup: None,
            }),
        );
        for &tid in &init.tids {
            // A launched command may not have exec'd yet (its name would
            // still be the recorder's): use the name exec will give it.
            let name = match &init.launched {
                Some(cmd) => cmd.first().map(|c| exec_comm(c)),
                None => procfs::thread_name(pid, tid),
            };
            self.thread(t, pid, tid, ThreadEvent::Existing, name);
        }
        if init.launched.is_none() {
            if let Ok(maps) = procfs::read_maps(pid) {
                self.set_regions(pid, &maps);
                for m in maps.iter().filter(|m| m.exec) {
                    if let Some(r) = self.images.record_from_maps(t, pid, m) {
                        self.push_image(r);
                    }
                }
            }
        }
    }

    /// Queue an image record and remember it for the process's children.
    fn push_image(&mut self, record: Record) {
        if let Record::ImageMap(m) = &record {
            self.images.remember(m);
            self.push(m.time.0, record);
        }
    }

    fn thread(&mut self, t: u64, pid: u32, tid: u32, event: ThreadEvent, name: Option<String>) {
        if let Some(n) = &name {
            self.names.insert(tid, n.clone());
        }
        self.push(
            t,
            Record::Thread(ThreadRecord {
                time: Timestamp(t),
                pid: Pid(pid),
                tid: Tid(tid),
                event,
                name,
            }),
        );
    }

    fn set_regions(&mut self, pid: u32, maps: &[MapsEntry]) {
        let ranges = maps
            .iter()
            .filter(|m| m.write)
            .map(|m| (m.start, m.end))
            .collect();
        self.regions.insert(
            pid,
            Regions {
                ranges,
                read_at: Instant::now(),
            },
        );
    }

    /// End of the writable mapping containing `sp`, if known.
    fn stack_end(&mut self, pid: u32, sp: u64) -> Option<u64> {
        let find = |r: &Regions| {
            r.ranges
                .iter()
                .find(|&&(s, e)| s <= sp && sp < e)
                .map(|&(_, e)| e)
        };
        if let Some(end) = self.regions.get(&pid).and_then(find) {
            return Some(end);
        }
        let stale = self
            .regions
            .get(&pid)
            .is_none_or(|r| r.read_at.elapsed() >= REGIONS_REFRESH);
        if stale {
            match procfs::read_maps(pid) {
                Ok(maps) => self.set_regions(pid, &maps),
                Err(_) => {
                    // Gone: remember that, so we do not retry per sample.
                    self.regions.insert(
                        pid,
                        Regions {
                            ranges: Vec::new(),
                            read_at: Instant::now(),
                        },
                    );
                }
            }
        }
        self.regions.get(&pid).and_then(find)
    }

    fn perf_record(&mut self, rec: PerfRecord<'_>) {
        match rec {
            PerfRecord::Sample(s) => self.sample(s),
            PerfRecord::Mmap2(m) => self.mmap(m),
            PerfRecord::Comm {
                pid,
                tid,
                name,
                exec,
                id,
            } => {
                let t = id.time.unwrap_or(self.last_time);
                if exec {
                    self.push(
                        t,
                        Record::Process(ProcessRecord {
                            time: Timestamp(t),
                            pid: Pid(pid),
                            parent: None,
                            event: ProcessEvent::Exec,
                            command: procfs::command_line(pid),
                            executable: procfs::executable(pid),
                            cgroup: None,
                        }),
                    );
                    // The exec replaced the address space.
                    self.regions.remove(&pid);
                    self.images.forget_process(pid);
                }
                self.thread(t, pid, tid, ThreadEvent::Rename, Some(name.to_string()));
            }
            PerfRecord::Fork {
                pid,
                ppid,
                tid,
                ptid,
                time,
            } => {
                let name = self.names.get(&ptid).cloned();
                if pid == tid && pid != ppid {
                    self.push(
                        time,
                        Record::Process(ProcessRecord {
                            time: Timestamp(time),
                            pid: Pid(pid),
                            parent: Some(Pid(ppid)),
                            event: ProcessEvent::Fork,
                            command: Vec::new(),
                            executable: None,
                            cgroup: None,
                        }),
                    );
                    // The child starts with a copy of its parent's mappings.
                    for r in self.images.inherited(ppid, pid, time) {
                        self.push_image(r);
                    }
                }
                self.thread(time, pid, tid, ThreadEvent::Start, name);
            }
            PerfRecord::Exit { pid, tid, time } => {
                self.push(
                    time,
                    Record::Thread(ThreadRecord {
                        time: Timestamp(time),
                        pid: Pid(pid),
                        tid: Tid(tid),
                        event: ThreadEvent::Exit,
                        name: None,
                    }),
                );
                self.names.remove(&tid);
                if pid == tid {
                    self.regions.remove(&pid);
                    self.images.forget_process(pid);
                    if self.launched_root != Some(pid) {
                        self.push(time, process_exit(time, pid, None));
                    }
                }
            }
            PerfRecord::Lost { lost, id } | PerfRecord::LostSamples { lost, id } => {
                let t = id.time.unwrap_or(self.last_time);
                self.push(
                    t,
                    Record::Lost(LostRecord {
                        time: Timestamp(t),
                        pid: None,
                        tid: None,
                        count: lost,
                        source: LostSource::Kernel,
                    }),
                );
            }
            PerfRecord::Throttle { .. } | PerfRecord::Other { .. } => {}
        }
    }

    fn mmap(&mut self, m: Mmap2Record<'_>) {
        if m.prot & libc::PROT_EXEC as u32 == 0 {
            return;
        }
        let t = m.id.time.unwrap_or(self.last_time);
        let end = m.addr.saturating_add(m.len);
        if let Some(r) = self
            .images
            .record(t, m.pid, m.addr, end, m.pgoff, m.filename, m.build_id)
        {
            self.push_image(r);
        }
    }

    fn sample(&mut self, s: SampleRecord<'_>) {
        let Some(regs) = (self.regs.convert)(&s.regs) else {
            // No user registers (the thread was in the kernel with no user
            // context): nothing to unwind from.
            return;
        };
        let sample = self.sample_with_stack(s.time, s.pid, s.tid, regs, s.stack, &s.callchain);
        self.push(
            s.time,
            Record::Sample(Sample {
                cpu: s.cpu,
                kind: self.sample_kind,
                weight: s.period,
                kernel_callchain: s.callchain,
                ..sample
            }),
        );
    }

    /// A sample of thread `tid` with `regs` and the stack copy `stack`
    /// (from the stack pointer up), trimmed at the end of the stack's
    /// mapping, its images noted for embedding; kind, weight, CPU and
    /// callchain for the caller to set.
    fn sample_with_stack(
        &mut self,
        time: u64,
        pid: u32,
        tid: u32,
        regs: lrnprof_format::Regs,
        stack: &[u8],
        callchain: &[u64],
    ) -> Sample {
        let sp = regs.sp();
        let mut live = stack;
        if let Some(end) = self.stack_end(pid, sp) {
            let keep = end.saturating_sub(sp).min(live.len() as u64) as usize;
            live = &live[..keep];
        }
        self.pids_seen.insert(pid);
        if self.images.embedding() {
            // Return addresses are somewhere in the stack copy: any word
            // pointing into an image marks it as needed for unwinding.
            self.images
                .touch_sample(pid, tid, regs.ip(), callchain, sp, live);
        }
        Sample {
            time: Timestamp(time),
            pid: Pid(pid),
            tid: Tid(tid),
            cpu: None,
            kind: self.sample_kind,
            weight: 0,
            regs,
            stack: StackSnapshot {
                start: sp,
                bytes: live.to_vec(),
            },
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        }
    }

    fn heap_event(&mut self, event: HeapEvent) {
        let released = self.released_upto;
        let Some(stats) = self.heap.as_mut() else {
            return;
        };
        match event {
            HeapEvent::Alloc {
                time,
                pid,
                tid,
                address,
                size,
                regs,
                stack,
            } => {
                stats.allocations += 1;
                let time = stats.place(pid, tid, time, released);
                let regs = super::regs::from_sampler(self.regs.arch, regs);
                let sample = self.sample_with_stack(time, pid, tid, regs, &stack, &[]);
                self.push(
                    time,
                    Record::Sample(Sample {
                        kind: SampleKind::Allocation,
                        weight: size,
                        detail: SampleDetail::Allocation { address },
                        ..sample
                    }),
                );
            }
            HeapEvent::Free {
                time,
                pid,
                tid,
                address,
            } => {
                let time = stats.place(pid, tid, time, released);
                self.push(
                    time,
                    Record::Free(FreeRecord {
                        time: Timestamp(time),
                        pid: Pid(pid),
                        tid: Tid(tid),
                        address,
                    }),
                );
            }
            HeapEvent::Hello { pid } => {
                stats.processes.insert(pid);
            }
            HeapEvent::Lost { time, count } => {
                let time = time.max(released);
                self.push(
                    time,
                    Record::Lost(LostRecord {
                        time: Timestamp(time),
                        pid: None,
                        tid: None,
                        count,
                        source: LostSource::HeapSampler,
                    }),
                );
            }
            HeapEvent::Broken { .. } => stats.broken = true,
        }
    }
}

/// The thread name the kernel gives a program at exec: its file name, cut
/// to 15 bytes (`TASK_COMM_LEN` - 1).
fn exec_comm(program: &str) -> String {
    let base = program.rsplit('/').next().unwrap_or(program);
    let mut end = base.len().min(15);
    while !base.is_char_boundary(end) {
        end -= 1;
    }
    base[..end].to_string()
}

fn process_exit(time: u64, pid: u32, code: Option<i32>) -> Record {
    Record::Process(ProcessRecord {
        time: Timestamp(time),
        pid: Pid(pid),
        parent: None,
        event: ProcessEvent::Exit { code },
        command: Vec::new(),
        executable: None,
        cgroup: None,
    })
}

impl Convert for Converter {
    type Raw = RawMsg;

    fn on_writer_thread(&mut self) {
        // Falling behind blocks the draining thread; keep up with the
        // target. Start from normal: threads inherit their creator's policy.
        super::sys::normal_thread_priority();
        self.priority = super::sys::raise_thread_priority();
    }

    fn convert(&mut self, raw: RawMsg, out: &mut Vec<Record>) -> Result<(), RecordError> {
        match raw {
            RawMsg::Initial(init) => self.initial(init),
            RawMsg::Chunk(bytes) => {
                for (kind, misc, rec) in parse::split_records(&bytes) {
                    match parse::parse_record(&self.layout, kind, misc, rec) {
                        Ok(r) => self.perf_record(r),
                        Err(_) => self.malformed += 1,
                    }
                }
            }
            RawMsg::Round(time) => {
                let before = self.released_before;
                self.release(before, out);
                self.released_upto = before;
                self.released_before = time;
            }
            RawMsg::Heap(events) => {
                for e in events {
                    self.heap_event(e);
                }
            }
            RawMsg::Exited { pid, time, code } => {
                self.push(time, process_exit(time, pid, Some(code)));
            }
        }
        Ok(())
    }

    fn finish(
        &mut self,
        out: &mut Vec<Record>,
        warnings: &mut Vec<RecordWarning>,
    ) -> Result<(), RecordError> {
        // Sampling is over: embedding (reading and compressing sections)
        // runs at normal priority.
        self.priority = None;
        self.release(u64::MAX, out);
        if self.malformed > 0 {
            warnings.push(RecordWarning::MalformedRecords {
                count: self.malformed,
            });
        }
        if let Some(heap) = &self.heap {
            heap.warnings(warnings);
        }
        let blobs = self.images.embedded_blobs(&self.pids_seen, warnings);
        out.extend(blobs.into_iter().map(Record::Blob));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_names_are_cut_like_the_kernel_does() {
        assert_eq!(exec_comm("/usr/bin/python3"), "python3");
        assert_eq!(exec_comm("a-very-long-program-name"), "a-very-long-pro");
        assert_eq!(exec_comm("./x"), "x");
    }

    fn converter() -> Converter {
        Converter::new(
            Layout {
                sample_type: parse::sample::TID | parse::sample::TIME,
                user_regs: 3,
            },
            super::super::regs::X86_64,
            SampleKind::CpuTime,
            EmbedLevel::None,
        )
    }

    fn lost_at(c: &mut Converter, t: u64) {
        c.push(
            t,
            Record::Lost(LostRecord {
                time: Timestamp(t),
                pid: None,
                tid: None,
                count: 1,
                source: LostSource::Kernel,
            }),
        );
    }

    #[rustfmt::skip]
    #[test]
    fn kernel_losses_become_lost_records() {
        let mut c = Converter::new(
            Layout { sample_type: parse::sample::TID | parse::sample::TIME, user_regs: 3 },
            super::super::regs::X86_64,
            SampleKind::CpuTime,
            EmbedLevel::None,
        );
        let mut rec = parse::kind::LOST.to_ne_bytes().to_vec();
        rec.extend(0u16.to_ne_bytes());             // misc
        rec.extend(40u16.to_ne_bytes());            // size
        rec.extend(1u64.to_ne_bytes());             // id
        rec.extend(17u64.to_ne_bytes());            // lost
        rec.extend([5u32.to_ne_bytes(), 6u32.to_ne_bytes()].concat()); // sample_id pid, tid
        rec.extend(900u64.to_ne_bytes());           // sample_id time
        let mut out = Vec::new();
        c.convert(RawMsg::Chunk(rec), &mut out).unwrap();
        let mut warnings = Vec::new();
        c.finish(&mut out, &mut warnings).unwrap();
        assert_eq!(
            out,
            [Record::Lost(LostRecord { time: Timestamp(900), pid: None, tid: None, count: 17, source: LostSource::Kernel })]
        );
        assert!(warnings.is_empty());
    }

    #[rustfmt::skip]
    #[test]
    fn records_that_do_not_parse_are_counted_in_a_warning() {
        let mut c = converter();
        let mut rec = parse::kind::LOST.to_ne_bytes().to_vec();
        rec.extend(0u16.to_ne_bytes());             // misc
        rec.extend(16u16.to_ne_bytes());            // size: too short for a LOST record
        rec.extend(1u64.to_ne_bytes());             // id, then nothing
        let mut out = Vec::new();
        c.convert(RawMsg::Chunk(rec), &mut out).unwrap();
        let mut warnings = Vec::new();
        c.finish(&mut out, &mut warnings).unwrap();
        assert!(out.is_empty());
        assert_eq!(warnings, [RecordWarning::MalformedRecords { count: 1 }]);
    }

    #[test]
    fn releases_in_time_order_one_round_late() {
        let mut c = converter();
        let mut out = Vec::new();
        lost_at(&mut c, 30);
        lost_at(&mut c, 10);
        c.convert(RawMsg::Round(40), &mut out).unwrap();
        // Nothing yet: a record from another CPU may still be older.
        assert!(out.is_empty());
        lost_at(&mut c, 20);
        lost_at(&mut c, 50);
        c.convert(RawMsg::Round(60), &mut out).unwrap();
        let times: Vec<u64> = out.iter().map(|r| r.time().unwrap().0).collect();
        assert_eq!(times, [10, 20, 30]);
        c.finish(&mut out, &mut Vec::new()).unwrap();
        assert_eq!(out.last().unwrap().time(), Some(Timestamp(50)));
    }
}
