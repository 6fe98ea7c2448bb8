//! Turning drained perf records into trace records, on the writer thread.
//!
//! Ring buffers are per CPU, so records arrive in time order per CPU but
//! not across CPUs. Records are held in a heap and released in time order
//! once every buffer has been drained past their time (a "round", as in
//! perf's ordered events). This thread also does the slow lookups the
//! sampling side must not: build ids, `/proc` reads, the vDSO's bytes.

use super::attr::Role;
use super::execwatch::ExecWatch;
use super::heap::{HeapEvent, HeapStats};
use super::images::Images;
use super::pace::{Pace, Watch};
use super::parse::{self, Layouts, Mmap2Record, PerfRecord, SampleRecord};
use super::procfs::{self, MapsEntry};
use super::regs::ArchRegs;
use super::replica::{Deltas, Followers, Later, Mismatch, Rebuilt, Replicas};
use super::ring::{Chunk, ChunkPool, Detached};
use super::touched::SampleRefs;
use super::tracefs::SyscallPayloads;
use super::untouched::{self, UntouchedPages};
use crate::error::RecordError;
use crate::report::RecordWarning;
use crate::sink::{Convert, FramesNamed, StackFor};
use lrnprof_format::{
    FreeRecord, LostRecord, LostSource, Pid, ProcessEvent, ProcessRecord, Record, Regs, Sample,
    SampleDetail, SampleFlags, SampleKind, StackHint, StackSnapshot, SwitchInRecord,
    SyscallExitRecord, SyscallTallyRecord, ThreadEvent, ThreadRecord, Tid, Timestamp,
};
use lrnprof_image::{EmbedLevel, FrameCache};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the sampling side sends to the writer thread.
#[derive(Debug)]
pub(crate) enum RawMsg {
    /// What existed when recording started. Sent before any chunk.
    Initial(Initial),
    /// Whole perf records drained from one ring buffer.
    Chunk(Chunk),
    /// Every ring buffer has been drained up to at least this time (ns).
    Round(u64),
    /// Events of the allocation sampler, in the order it wrote them.
    Heap(Vec<HeapEvent>),
    /// Syscall tallies read from the kernel, each at its own time.
    Tallies(Vec<SyscallTallyRecord>),
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

/// Records waiting to be released in time order. They stay where they
/// arrived; only their (time, arrival number) keys are sorted, so holding
/// many records back (the allocation sampler's are held for
/// `HEAP_HOLD_NS`) costs no moving of records at every release.
#[derive(Default)]
struct Held {
    /// By arrival number minus `first`, samples with what the comparison
    /// of their stacks found; `None` once released.
    records: VecDeque<Option<(Record, Carried)>>,
    /// Arrival number of `records[0]`.
    first: u64,
    /// (time, arrival number) of each record held, in order when
    /// `sorted`.
    keys: VecDeque<(u64, u64)>,
    sorted: bool,
}

impl Held {
    fn push(&mut self, time: u64, record: Record, carried: Carried) {
        let seq = self.first + self.records.len() as u64;
        self.records.push_back(Some((record, carried)));
        if self.keys.is_empty() {
            self.sorted = true;
        } else if self.keys.back().is_some_and(|&last| last > (time, seq)) {
            self.sorted = false;
        }
        self.keys.push_back((time, seq));
    }

    /// Move the records older than `before` to `out`, oldest first (and,
    /// for equal times, in arrival order), and what is known of each
    /// sample's stack to `hints`, in the same order.
    fn release(&mut self, before: u64, out: &mut Vec<Record>, hints: &mut VecDeque<SampleHint>) {
        if !self.sorted {
            // A stable sort merges the runs there are (what was left
            // sorted, one per drained buffer) with few moves.
            self.keys.make_contiguous().sort();
            self.sorted = true;
        }
        while let Some(&(time, seq)) = self.keys.front() {
            if time >= before {
                break;
            }
            self.keys.pop_front();
            let slot = &mut self.records[(seq - self.first) as usize];
            if let Some((record, carried)) = slot.take() {
                if let Record::Sample(s) = &record {
                    hints.push_back(SampleHint {
                        tid: s.tid.0,
                        time: s.time.0,
                        carried,
                    });
                }
                out.push(record);
            }
        }
        while let Some(None) = self.records.front() {
            self.records.pop_front();
            self.first += 1;
        }
    }
}

/// What the touched-image scan found of a released sample's stack (see
/// [`StackHint`]), with the thread and time of the sample it belongs to.
#[derive(Debug)]
struct SampleHint {
    tid: u32,
    time: u64,
    carried: Carried,
}

/// What goes with a sample to the trace writer besides its record: what
/// the scan for images found of its stack, and, for a stack put together
/// from the blocks that changed, where its bytes will be (they go into
/// the record just before it is written; see `replica::Followers`).
#[derive(Debug, Default)]
struct Carried {
    hint: Option<StackHint>,
    later: Option<Later>,
}

/// A stack copy taken out of its record (see [`Chunk`]), as the sample
/// gets it.
#[derive(Debug)]
enum Taken {
    /// Its bytes.
    Whole(Vec<u8>),
    /// Put together from the blocks that changed, named `id`: its bytes
    /// are the thread's in `Converter::replicas` for now, and will be in
    /// `Converter::followers` when written; what putting it together
    /// found is in `Converter::rebuilt`.
    Replica { id: u64, later: Later },
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
    layouts: Layouts,
    regs: ArchRegs,
    /// The kind of CPU samples.
    sample_kind: SampleKind,
    /// Where syscall tracepoint payloads keep their fields.
    payloads: Option<SyscallPayloads>,
    /// Per thread: its switch-out sample, until the `PERF_RECORD_SWITCH`
    /// written right after it says whether the thread was preempted.
    switched_out: HashMap<u32, (Sample, Carried)>,
    /// Records not released yet.
    pending: Held,
    /// What is known of the stacks of the samples released, in order, until
    /// the trace writer asks ([`Convert::stack_for`]).
    released_hints: VecDeque<SampleHint>,
    /// Records older than this may be released.
    released_before: u64,
    /// Records older than this have been released.
    released_upto: u64,
    /// What the allocation sampler did, with `--heap`.
    heap: Option<HeapStats>,
    last_time: u64,
    names: HashMap<u32, String>,
    launched_root: Option<u32>,
    /// The launched command has exited (the recording ends).
    root_exited: bool,
    /// Processes of the recorded tree that have not exited: those left
    /// when the launched command exits run on unrecorded.
    running: BTreeSet<u32>,
    /// `--syscall-filter` chose syscalls by the recorder's own numbers.
    syscall_filter: bool,
    /// 32-bit processes whose calls it chose by those numbers, which are
    /// other calls in theirs (see [`RecordWarning::SyscallFilter32Bit`]).
    filtered_32: BTreeMap<u32, Option<String>>,
    regions: HashMap<u32, Regions>,
    images: Images,
    /// Records that could not be parsed.
    malformed: u64,
    pids_seen: HashSet<u32>,
    /// Where the writer thread says who it is, for `urgency`.
    writer_thread: Arc<AtomicI32>,
    /// Most bytes of stack the kernel copies per sample, per event role.
    stack_sizes: Vec<(Role, u32)>,
    untouched: UntouchedPages,
    /// System-wide recording: what differs from recording a process tree.
    system: Option<SystemWide>,
    /// Command lines read the moment processes exec'd, when the kernel
    /// tells (see `execwatch`).
    execs: Option<ExecWatch>,
    /// Short waits between drains while a thread's copies may be cut
    /// short.
    pace: Watch,
    /// Where converted chunks go back to the draining thread.
    chunks: Option<ChunkPool>,
    /// The stack copy taken out of the record at hand.
    detached: Option<Taken>,
    /// Each thread's stack bytes, as the draining thread's (see
    /// `replica`).
    replicas: Replicas,
    rebuilt: Rebuilt,
    /// The same bytes, as the samples are written.
    followers: Followers,
}

/// How a system-wide recording's records are converted.
#[derive(Debug, Clone, Default)]
pub(crate) struct SystemWide {
    /// The recorder's own process, left out of the samples.
    pub recorder_pid: u32,
    /// Kernel frames are recorded: embed the symbols that name them.
    pub kernel: bool,
    /// The kernel addresses of every kernel frame seen.
    kernel_addresses: HashSet<u64>,
}

impl SystemWide {
    /// Settings for a recording by `recorder_pid`, with kernel frames if
    /// `kernel`.
    pub fn new(recorder_pid: u32, kernel: bool) -> SystemWide {
        SystemWide {
            recorder_pid,
            kernel,
            kernel_addresses: HashSet::new(),
        }
    }
}

/// A sample's stack copy, from the stack pointer up.
struct StackCopy<'a> {
    bytes: Cow<'a, [u8]>,
    /// The copy was made by the kernel, which stops at pages the thread
    /// never touched (see `untouched`), with this much room.
    kernel: Option<KernelCopy>,
    /// The copy was put together from the blocks that changed (see
    /// `replica`), with this id; what that found is in
    /// [`Converter::rebuilt`].
    rebuilt: Option<u64>,
    /// The sample does not keep these bytes: they will be there when it
    /// is written (see `replica::Followers`).
    later: Option<Later>,
}

impl StackCopy<'_> {
    /// A copy the sample keeps.
    fn owned(bytes: Vec<u8>, kernel: Option<KernelCopy>) -> StackCopy<'static> {
        StackCopy {
            bytes: Cow::Owned(bytes),
            kernel,
            rebuilt: None,
            later: None,
        }
    }
}

/// Room the kernel had for a sample's stack copy, and whose stack it was.
#[derive(Debug, Clone, Copy)]
struct KernelCopy {
    /// The event's `sample_stack_user`.
    stack_size: u32,
    /// Where the copy starts in the perf record.
    stack_offset: usize,
    /// A 32-bit task's stack (4-byte words): the sample is flagged
    /// [`SampleFlags::ABI_32`].
    abi32: bool,
}

/// What the converter needs to know of the sampling settings.
#[derive(Debug, Clone)]
pub(crate) struct ConvertSettings {
    /// How the records of each event are laid out.
    pub layouts: Layouts,
    /// The registers of the recorder's architecture.
    pub regs: ArchRegs,
    /// The kind of every CPU sample.
    pub sample_kind: SampleKind,
    /// Where syscall tracepoint payloads keep their fields.
    pub payloads: Option<SyscallPayloads>,
    /// What to embed at the end.
    pub embed: EmbedLevel,
    /// Most bytes of stack copied per sample, per event role.
    pub stack_sizes: Vec<(Role, u32)>,
    /// Bytes per page.
    pub page_size: u64,
}

impl Converter {
    /// A converter for records sampled with `settings`.
    pub fn new(settings: ConvertSettings) -> Converter {
        let ConvertSettings {
            layouts,
            regs,
            sample_kind,
            payloads,
            embed,
            stack_sizes,
            page_size,
        } = settings;
        Converter {
            layouts,
            regs,
            sample_kind,
            payloads,
            switched_out: HashMap::new(),
            released_hints: VecDeque::new(),
            pending: Held::default(),
            released_before: 0,
            released_upto: 0,
            heap: None,
            last_time: 0,
            names: HashMap::new(),
            launched_root: None,
            root_exited: false,
            running: BTreeSet::new(),
            syscall_filter: false,
            filtered_32: BTreeMap::new(),
            regions: HashMap::new(),
            images: Images::new(embed),
            malformed: 0,
            pids_seen: HashSet::new(),
            writer_thread: Arc::default(),
            stack_sizes,
            untouched: UntouchedPages::new(page_size),
            system: None,
            execs: None,
            pace: Watch::default(),
            chunks: None,
            detached: None,
            replicas: Replicas::default(),
            rebuilt: Rebuilt::default(),
            followers: Followers::default(),
        }
    }
    /// Most bytes of stack the kernel copies per sample of `role`.
    fn stack_size(&self, role: Role) -> u32 {
        self.stack_sizes
            .iter()
            .find(|(r, _)| *r == role)
            .map_or(0, |(_, n)| *n)
    }

    /// Syscalls are chosen by `--syscall-filter`, by the numbers of the
    /// recorder's architecture.
    pub fn with_syscall_filter(mut self) -> Converter {
        self.syscall_filter = true;
        self
    }

    /// Allocation sampling is on; `explained`: a warning has already said
    /// why the launched program's allocations will not be recorded.
    pub fn with_heap(mut self, explained: bool) -> Converter {
        self.heap = Some(HeapStats::new(explained));
        self
    }

    /// Take frame tables' addresses resolved by earlier recordings from
    /// `cache`, and keep there those this one resolves.
    pub fn with_frame_cache(mut self, cache: Option<FrameCache>) -> Converter {
        self.images = self.images.with_cache(cache);
        self
    }

    /// Convert the records of a system-wide or `--kernel` recording
    /// (processes' cgroups, kernel frames and their symbols, the recorder
    /// left out).
    pub fn with_system(mut self, system: SystemWide) -> Converter {
        self.system = Some(system);
        self
    }

    /// Take exec'd processes' command lines from `watch`, which read them
    /// as they exec'd, before reading `/proc` (too late for short-lived
    /// programs).
    pub fn with_exec_watch(mut self, watch: ExecWatch) -> Converter {
        self.execs = Some(watch);
        self
    }

    /// Ask the draining thread through `pace` for short waits after a
    /// copy is cut short, and after a thread starts until its first whole
    /// copy.
    pub fn with_pace(mut self, pace: Pace) -> Converter {
        self.pace = Watch::new(pace);
        self
    }

    /// Hand converted chunks back to `pool` for the draining thread.
    pub fn with_chunk_pool(mut self, pool: ChunkPool) -> Converter {
        self.chunks = Some(pool);
        self
    }

    /// The writer thread stores its id in `id` when it starts.
    pub fn with_writer_thread(mut self, id: Arc<AtomicI32>) -> Converter {
        self.writer_thread = id;
        self
    }

    /// The cgroup of `pid`, recorded only system-wide.
    fn cgroup(&self, pid: u32) -> Option<String> {
        self.system.as_ref().and_then(|_| procfs::cgroup(pid))
    }

    fn push(&mut self, time: u64, record: Record) {
        self.push_hinted(time, record, Carried::default());
    }

    /// [`push`](Self::push) a record with what is known of its stack.
    fn push_hinted(&mut self, time: u64, record: Record, carried: Carried) {
        self.last_time = self.last_time.max(time);
        self.pending.push(time, record, carried);
    }

    fn release(&mut self, before: u64, out: &mut Vec<Record>) {
        self.pending.release(before, out, &mut self.released_hints);
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
        self.running.insert(pid);
        self.push(
            t,
            Record::Process(ProcessRecord {
                time: Timestamp(t),
                pid: Pid(pid),
                parent: procfs::parent_pid(pid).map(Pid),
                event: ProcessEvent::Existing,
                command,
                executable,
                cgroup: self.cgroup(pid),
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
            let given = self.images.remember(m);
            self.push(m.time.0, record);
            // Children forked after it, heard before it, get it too.
            for m in given {
                self.push(m.time.0, Record::ImageMap(m));
            }
        }
    }

    fn thread(&mut self, t: u64, pid: u32, tid: u32, event: ThreadEvent, name: Option<String>) {
        if matches!(event, ThreadEvent::Existing | ThreadEvent::Start) {
            self.pace.started(tid, t);
        }
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
                    let heard = self.execs.as_ref().and_then(|w| w.take(pid, t));
                    let (command, executable) = match heard {
                        Some(seen) if !seen.command.is_empty() => (seen.command, seen.executable),
                        _ => (procfs::command_line(pid), procfs::executable(pid)),
                    };
                    self.push(
                        t,
                        Record::Process(ProcessRecord {
                            time: Timestamp(t),
                            pid: Pid(pid),
                            parent: None,
                            event: ProcessEvent::Exec,
                            command,
                            executable,
                            cgroup: self.cgroup(pid),
                        }),
                    );
                    // The exec replaced the address space.
                    self.regions.remove(&pid);
                    self.untouched.process_replaced(pid);
                    self.images.forget_process(pid, t);
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
                    self.running.insert(pid);
                    self.push(
                        time,
                        Record::Process(ProcessRecord {
                            time: Timestamp(time),
                            pid: Pid(pid),
                            parent: Some(Pid(ppid)),
                            event: ProcessEvent::Fork,
                            command: Vec::new(),
                            executable: None,
                            cgroup: self.cgroup(pid),
                        }),
                    );
                    // The child starts with a copy of its parent's mappings.
                    for r in self.images.inherited(ppid, pid, time) {
                        self.push(time, r);
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
                self.untouched.thread_exited(pid, tid);
                self.pace.exited(tid, time);
                if pid == tid {
                    self.running.remove(&pid);
                    self.regions.remove(&pid);
                    self.images.forget_process(pid, time);
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
            PerfRecord::Switch { out, preempted, id } => {
                let (Some(pid), Some(tid), Some(t)) = (id.pid, id.tid, id.time) else {
                    return;
                };
                if out {
                    if let Some((mut s, hint)) = self.switched_out.remove(&tid) {
                        s.detail = SampleDetail::OffCpu { preempted };
                        self.push_hinted(s.time.0, Record::Sample(s), hint);
                    }
                } else {
                    self.flush_switched_out(tid);
                    self.push(
                        t,
                        Record::SwitchIn(SwitchInRecord {
                            time: Timestamp(t),
                            pid: Pid(pid),
                            tid: Tid(tid),
                        }),
                    );
                }
            }
            PerfRecord::Throttle { .. } | PerfRecord::Other { .. } => {}
        }
    }

    fn flush_all_switched_out(&mut self) {
        let tids: Vec<u32> = self.switched_out.keys().copied().collect();
        for tid in tids {
            self.flush_switched_out(tid);
        }
    }

    /// Write `tid`'s switch-out sample still waiting for its switch record
    /// (which was lost, or is in the next drain): not known to be preempted.
    fn flush_switched_out(&mut self, tid: u32) {
        if let Some((s, hint)) = self.switched_out.remove(&tid) {
            self.push_hinted(s.time.0, Record::Sample(s), hint);
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
            .record(t, m.pid, m.addr, end, m.pgoff, &m.filename, m.build_id)
        {
            self.push_image(r);
        }
    }

    fn sample(&mut self, s: SampleRecord<'_>) {
        // A thread's last switch-out, as it dies (`do_task_dead`): the
        // kernel gives its thread id as -1, since it has none left. No
        // switch-in follows, so it is no wait; kept (with --kernel, which
        // has stacks for it), such samples held 1.1 s of the 13.9 s
        // off-CPU time of one system-wide test recording. Dropped before
        // their kernel addresses join those whose symbols are embedded.
        if s.role == Role::Switch && s.tid == u32::MAX {
            return;
        }
        if let Some(system) = &mut self.system {
            // The recorder's own work, and the idle task (pid 0) of idle
            // CPUs, are not what the user asked about.
            if s.pid == system.recorder_pid || s.pid == 0 {
                return;
            }
            system
                .kernel_addresses
                .extend(s.kernel_callchain.iter().copied());
        }
        if s.abi32 && (self.heap.is_some() || self.syscall_filter) {
            let name = self.names.get(&s.pid);
            if let Some(heap) = self.heap.as_mut() {
                note_process(&mut heap.thirty_two_bit, s.pid, name);
            }
            // Any sample: the calls the filter lets through may all be
            // other calls than the user asked for, or none.
            if self.syscall_filter {
                note_process(&mut self.filtered_32, s.pid, name);
            }
        }
        let (kind, weight, detail) = match s.role {
            Role::Cpu => (self.sample_kind, s.period, SampleDetail::None),
            Role::SyscallEnter => {
                let Some((nr, args)) = self.payloads.and_then(|p| p.enter(s.raw)) else {
                    self.malformed += 1;
                    return;
                };
                let nr = u32::try_from(nr).unwrap_or(u32::MAX);
                (SampleKind::Syscall, 1, SampleDetail::Syscall { nr, args })
            }
            Role::SyscallExit => {
                match self.payloads.and_then(|p| p.exit(s.raw)) {
                    Some((nr, ret)) => self.push(
                        s.time,
                        Record::SyscallExit(SyscallExitRecord {
                            time: Timestamp(s.time),
                            pid: Pid(s.pid),
                            tid: Tid(s.tid),
                            nr: u32::try_from(nr).unwrap_or(u32::MAX),
                            ret,
                        }),
                    ),
                    None => self.malformed += 1,
                }
                return;
            }
            // The dummy event never samples.
            Role::Tracking => return,
            Role::Switch => (
                SampleKind::OffCpu,
                0,
                SampleDetail::OffCpu { preempted: false },
            ),
        };
        let regs = match (self.regs.convert)(&s.regs) {
            Some(regs) => regs,
            // No user registers: a kernel thread, which has no user
            // context. A CPU sample or a switch-out is dropped unless it
            // has kernel frames (--kernel): without them it has nothing to
            // show, and `--all --off-cpu` filled the profile with every
            // kernel thread's sleep as a frame `0x0`. Another event still
            // counts, with no stack.
            None if matches!(s.role, Role::Cpu | Role::Switch) && s.kernel_callchain.is_empty() => {
                return
            }
            None => (self.regs.convert)(&vec![0; self.regs.mask.count_ones() as usize])
                .expect("registers of the mask's length convert"),
        };
        // What the kernel had room to copy: a copy shorter than that may
        // have stopped at a page the thread never touched.
        let room = KernelCopy {
            stack_size: self.stack_size(s.role),
            stack_offset: s.stack_offset,
            abi32: s.abi32,
        };
        let taken = self.detached.take();
        // A stack put together from the blocks that changed is read where
        // it was put together, taken out of `replicas` meanwhile.
        let owner = match &taken {
            Some(Taken::Replica { later, .. }) => Some((later.pid(), later.tid())),
            _ => None,
        };
        let held = owner.and_then(|(pid, tid)| self.replicas.take(pid, tid));
        let copy = match taken {
            Some(Taken::Whole(bytes)) => StackCopy::owned(bytes, Some(room)),
            Some(Taken::Replica { id, later }) => {
                match held
                    .as_ref()
                    .and_then(|h| h.view(later.sp, later.keep as usize))
                {
                    Some(bytes) => StackCopy {
                        bytes: Cow::Borrowed(bytes),
                        kernel: Some(room),
                        rebuilt: Some(id),
                        later: Some(later),
                    },
                    None => {
                        // Cannot be: the bytes were just put together.
                        self.followers.drop_later(&later);
                        self.malformed += 1;
                        StackCopy::owned(Vec::new(), Some(room))
                    }
                }
            }
            None => StackCopy {
                bytes: Cow::Borrowed(s.stack),
                kernel: Some(room),
                rebuilt: None,
                later: None,
            },
        };
        let (sample, carried) =
            self.sample_with_stack(s.time, s.pid, s.tid, regs, copy, &s.callchain);
        if let (Some((pid, tid)), Some(held)) = (owner, held) {
            self.replicas.restore(pid, tid, held);
        }
        let sample = Sample {
            cpu: s.cpu,
            kind,
            weight,
            kernel_callchain: s.callchain,
            kernel_frames: s.kernel_callchain,
            detail,
            ..sample
        };
        if s.role == Role::Switch {
            self.flush_switched_out(s.tid);
            self.switched_out.insert(s.tid, (sample, carried));
        } else {
            self.push_hinted(s.time, Record::Sample(sample), carried);
        }
    }

    /// A sample of thread `tid` with `regs` and the stack copy `copy`
    /// (from the stack pointer up), trimmed at the end of the stack's
    /// mapping, its images noted for embedding; kind, weight, CPU and
    /// callchain for the caller to set. With it, what the scan for images
    /// found of the stack, for the trace writer, and, if the sample does
    /// not keep the copy's bytes, where they will be.
    fn sample_with_stack(
        &mut self,
        time: u64,
        pid: u32,
        tid: u32,
        regs: Regs,
        copy: StackCopy<'_>,
        callchain: &[u64],
    ) -> (Sample, Carried) {
        let StackCopy {
            bytes: stack,
            kernel,
            rebuilt,
            later,
        } = copy;
        let abi32 = kernel.is_some_and(|k| k.abi32);
        let sp = regs.sp();
        let mut live = &stack[..];
        let mut flags = SampleFlags::default();
        if abi32 {
            flags = flags.with(SampleFlags::ABI_32);
        }
        if let Some(end) = self.stack_end(pid, sp) {
            let keep = end.saturating_sub(sp).min(live.len() as u64) as usize;
            live = &live[..keep];
            let missing = kernel.and_then(|k| {
                untouched::missing_range(
                    sp,
                    stack.len(),
                    end,
                    k.stack_size,
                    k.stack_offset,
                    self.untouched.page_size(),
                )
            });
            if let Some(missing) = missing {
                flags = flags.with(SampleFlags::STACK_CUT_SHORT);
                self.untouched.cut_short(pid, tid, time, missing);
                self.pace.cut_short(time);
            } else if kernel.is_some() {
                self.pace.whole_copy(tid, time);
            }
        }
        self.pids_seen.insert(pid);
        let mut hint = None;
        if self.images.embedding() {
            // Return addresses are somewhere in the stack copy: any word
            // pointing into an image marks it as needed for unwinding, and
            // its frame table resolves the word.
            let lr = match &regs {
                Regs::Aarch64(r) => Some(r.lr),
                Regs::X86_64(_) => None,
            };
            let refs = SampleRefs {
                pid,
                tid,
                ip: regs.ip(),
                lr,
                callchain,
                sp,
                time,
                stack: live,
                words32: abi32,
            };
            hint = Some(match rebuilt {
                Some(id) => self.images.touch_rebuilt(&refs, id, &self.rebuilt),
                None => self.images.touch_sample(&refs),
            });
        }
        let keep = live.len();
        let later = later.map(|mut l| {
            l.keep = keep as u32;
            l
        });
        let bytes = match stack {
            _ if later.is_some() => Vec::new(),
            Cow::Borrowed(b) => b[..keep].to_vec(),
            Cow::Owned(mut v) => {
                v.truncate(keep);
                v
            }
        };
        let sample = Sample {
            time: Timestamp(time),
            pid: Pid(pid),
            tid: Tid(tid),
            cpu: None,
            kind: self.sample_kind,
            weight: 0,
            regs,
            stack: StackSnapshot { start: sp, bytes },
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags,
            detail: SampleDetail::None,
        };
        (sample, Carried { hint, later })
    }

    /// A stack copy taken out of its record, as the sample gets it; one
    /// put together from the blocks that changed is named and logged for
    /// the writing (what putting it together found goes to `rebuilt`).
    /// `None` for a delta that does not fit.
    fn detached_stack(&mut self, stack: Detached, deltas: &Deltas) -> Option<Taken> {
        let d = match stack {
            Detached::Whole(bytes) => return Some(Taken::Whole(bytes)),
            Detached::Delta(d) => d,
        };
        let id = self.images.next_stack_id();
        let logged = self
            .replicas
            .rebuild(&d, deltas, id, &mut self.rebuilt)
            .and_then(|()| self.followers.log(&d, deltas));
        match logged {
            Ok(later) => Some(Taken::Replica { id, later }),
            // The sample keeps no stack, and counts as malformed.
            Err(Mismatch) => {
                self.malformed += 1;
                None
            }
        }
    }

    /// A stack copy no sample took: its buffer back to the pool, or its
    /// blocks applied without it.
    fn discard(&mut self, taken: Taken) {
        match taken {
            Taken::Whole(bytes) => self.recycle_stack(bytes),
            Taken::Replica { later, .. } => self.followers.drop_later(&later),
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
                let copy = StackCopy::owned(stack, None);
                let (sample, carried) = self.sample_with_stack(time, pid, tid, regs, copy, &[]);
                self.push_hinted(
                    time,
                    Record::Sample(Sample {
                        kind: SampleKind::Allocation,
                        weight: size,
                        detail: SampleDetail::Allocation { address },
                        ..sample
                    }),
                    carried,
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
        // Start from normal (threads inherit their creator's policy); the
        // draining thread raises this one while the rings fill.
        super::sys::normal_thread_priority();
        self.writer_thread
            .store(super::sys::thread_id(), Ordering::Release);
    }

    fn stack_for(&mut self, record: &Record) -> StackFor<'_> {
        let Record::Sample(s) = record else {
            return StackFor::default();
        };
        // Released samples come to the writer in the order released: a
        // sample not the next one here means they did not (a record
        // written some other way), and no hint is trusted until the next
        // release.
        let carried = match self.released_hints.pop_front() {
            Some(h) if (h.tid, h.time) == (s.tid.0, s.time.0) => h.carried,
            h => {
                for h in h.into_iter().chain(self.released_hints.drain(..)) {
                    if let Some(later) = &h.carried.later {
                        self.followers.drop_later(later);
                    }
                }
                return StackFor::default();
            }
        };
        // The stack's bytes, where the thread's bytes are put together
        // again: written from there, never copied whole.
        let bytes = match &carried.later {
            Some(later) => match self.followers.bytes(later) {
                Ok(bytes) => Some(bytes),
                Err(Mismatch) => {
                    self.malformed += 1;
                    None
                }
            },
            None => None,
        };
        StackFor {
            hint: carried.hint,
            bytes,
        }
    }

    fn recycle_hint(&mut self, hint: StackHint) {
        self.images.recycle_runs(hint.runs);
    }

    fn recycle_stack(&mut self, bytes: Vec<u8>) {
        if let Some(pool) = &self.chunks {
            pool.give_stack(bytes);
        }
    }

    fn convert(&mut self, raw: RawMsg, out: &mut Vec<Record>) -> Result<(), RecordError> {
        match raw {
            RawMsg::Initial(init) => self.initial(init),
            RawMsg::Chunk(Chunk {
                bytes,
                stacks,
                deltas,
                ..
            }) => {
                let mut stacks = stacks.into_iter().peekable();
                for (kind, misc, rec) in parse::split_records(&bytes) {
                    // A stack taken out of this record comes with it.
                    let at = rec.as_ptr() as usize - bytes.as_ptr() as usize;
                    if let Some(d) = stacks.next_if(|d| d.at == at) {
                        self.detached = self.detached_stack(d.stack, &deltas);
                    }
                    match parse::parse_record(&self.layouts, kind, misc, rec) {
                        Ok(r) => self.perf_record(r),
                        Err(_) => self.malformed += 1,
                    }
                    // A stack no sample took (a malformed record, a
                    // sample left out).
                    if let Some(taken) = self.detached.take() {
                        self.discard(taken);
                    }
                }
                // Stacks of records not reached (after a malformed
                // header): their blocks count all the same, for the
                // thread's later copies.
                for d in stacks {
                    if let Some(taken) = self.detached_stack(d.stack, &deltas) {
                        self.discard(taken);
                    }
                }
                // A switch record follows its sample in the same buffer:
                // what did not come by the end of the drain never will.
                self.flush_all_switched_out();
                if let Some(pool) = &self.chunks {
                    pool.give(bytes);
                    pool.give(deltas.bytes);
                }
            }
            RawMsg::Round(time) => {
                self.images.round(time);
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
            RawMsg::Tallies(tallies) => {
                for t in tallies {
                    self.push(t.time.0, Record::SyscallTally(t));
                }
            }
            RawMsg::Exited { pid, time, code } => {
                self.root_exited |= self.launched_root == Some(pid);
                self.push(time, process_exit(time, pid, Some(code)));
            }
        }
        Ok(())
    }

    fn frames_named(&self) -> FramesNamed {
        self.images.frames_named()
    }

    fn finish(
        &mut self,
        out: &mut Vec<Record>,
        warnings: &mut Vec<RecordWarning>,
    ) -> Result<(), RecordError> {
        self.flush_all_switched_out();
        self.release(u64::MAX, out);
        // Every record has been read: a last look for late mappings.
        self.images.round(u64::MAX);
        if self.malformed > 0 {
            warnings.push(RecordWarning::MalformedRecords {
                count: self.malformed,
            });
        }
        let untouched = &self.untouched.stats;
        if let Some(reason) = &untouched.first_error {
            warnings.push(RecordWarning::StackPagesUnread {
                samples: untouched.cut_short,
                reason: reason.clone(),
            });
        }
        if let Some(heap) = &self.heap {
            heap.warnings(warnings);
        }
        if !self.filtered_32.is_empty() {
            warnings.push(RecordWarning::SyscallFilter32Bit {
                processes: std::mem::take(&mut self.filtered_32).into_iter().collect(),
            });
        }
        if self.root_exited && self.system.is_none() {
            let running: Vec<(u32, Option<String>)> = self
                .running
                .iter()
                .filter(|&&pid| Some(pid) != self.launched_root && !procfs::has_exited(pid))
                .map(|&pid| (pid, procfs::thread_name(pid, pid)))
                .collect();
            if !running.is_empty() {
                warnings.push(RecordWarning::StillRunning { processes: running });
            }
        }
        let blobs = self.images.embedded_blobs(&self.pids_seen, warnings);
        out.extend(blobs.into_iter().map(Record::Blob));
        if let Some(system) = self.system.as_ref().filter(|s| s.kernel) {
            let blobs = super::kernel::symbol_blobs(&system.kernel_addresses, warnings);
            out.extend(blobs.into_iter().map(Record::Blob));
        }
        Ok(())
    }
}

/// Processes named in a warning at most.
const NAMED_PROCESSES: usize = 16;

/// Note process `pid` for a warning, with the name it has now: a process
/// that exec'd is heard of by its new name a little after its first
/// samples, from another CPU's ring.
fn note_process(noted: &mut BTreeMap<u32, Option<String>>, pid: u32, name: Option<&String>) {
    let room = noted.len() < NAMED_PROCESSES;
    match noted.get_mut(&pid) {
        Some(n) if name.is_some() && n.as_ref() != name => *n = name.cloned(),
        Some(_) => {}
        None if room => {
            noted.insert(pid, name.cloned());
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::replica::tests::random_below;
    use super::super::ring::Keeper;
    use super::*;
    use lrnprof_format::{TraceHeader, TraceReader, TraceWriter};

    #[test]
    fn noted_processes_keep_their_latest_name_up_to_a_bound() {
        let mut noted = BTreeMap::new();
        let (sh, prog) = ("sh".to_string(), "prog".to_string());
        note_process(&mut noted, 7, Some(&sh));
        note_process(&mut noted, 7, Some(&prog));
        // A name no longer known (the process exited) is not forgotten.
        note_process(&mut noted, 7, None);
        assert_eq!(noted, BTreeMap::from([(7, Some(prog))]));
        for pid in 100..200 {
            note_process(&mut noted, pid, None);
        }
        assert_eq!(noted.len(), NAMED_PROCESSES);
    }

    #[test]
    fn exec_names_are_cut_like_the_kernel_does() {
        assert_eq!(exec_comm("/usr/bin/python3"), "python3");
        assert_eq!(exec_comm("a-very-long-program-name"), "a-very-long-pro");
        assert_eq!(exec_comm("./x"), "x");
    }

    fn settings() -> ConvertSettings {
        ConvertSettings {
            layouts: Layouts::single(
                Role::Cpu,
                parse::Layout {
                    sample_type: parse::sample::TID | parse::sample::TIME,
                    user_regs: 3,
                },
            ),
            regs: super::super::regs::X86_64,
            sample_kind: SampleKind::CpuTime,
            payloads: None,
            embed: EmbedLevel::None,
            stack_sizes: vec![(Role::Cpu, 65528)],
            page_size: 4096,
        }
    }

    fn converter() -> Converter {
        Converter::new(settings())
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
        let mut c = converter();
        let mut rec = parse::kind::LOST.to_ne_bytes().to_vec();
        rec.extend(0u16.to_ne_bytes());             // misc
        rec.extend(40u16.to_ne_bytes());            // size
        rec.extend(1u64.to_ne_bytes());             // id
        rec.extend(17u64.to_ne_bytes());            // lost
        rec.extend([5u32.to_ne_bytes(), 6u32.to_ne_bytes()].concat()); // sample_id pid, tid
        rec.extend(900u64.to_ne_bytes());           // sample_id time
        let mut out = Vec::new();
        c.convert(RawMsg::Chunk(Chunk::plain(rec)), &mut out).unwrap();
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
        c.convert(RawMsg::Chunk(Chunk::plain(rec)), &mut out).unwrap();
        let mut warnings = Vec::new();
        c.finish(&mut out, &mut warnings).unwrap();
        assert!(out.is_empty());
        assert_eq!(warnings, [RecordWarning::MalformedRecords { count: 1 }]);
    }

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn perf_record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
        let mut rec = kind.to_ne_bytes().to_vec();
        rec.extend(misc.to_ne_bytes());
        rec.extend(((body.len() + 8) as u16).to_ne_bytes());
        rec.extend(body);
        rec
    }

    /// pid 10, tid 11, the identifier of `event`, `time` and cpu 1 in the
    /// order of a sample's fields (identifier first) or of a trailer.
    fn ids(event: u64, time: u64, sample: bool) -> Vec<u8> {
        let (id, pid_tid, t, cpu) = (
            u64s(&[event]),
            u64s(&[(11 << 32) | 10]),
            u64s(&[time]),
            u64s(&[1]),
        );
        if sample {
            [id, pid_tid, t, cpu].concat()
        } else {
            [pid_tid, t, cpu, id].concat()
        }
    }

    #[rustfmt::skip]
    #[test]
    fn syscalls_and_switches_become_event_records() {
        let mut c = Converter::new(ConvertSettings {
            layouts: parse::tests::multi(),
            payloads: Some(SyscallPayloads { enter_id: 8, enter_args: 16, exit_id: 8, exit_ret: 16 }),
            ..settings()
        });
        let mut chunk = parse::tests::syscall_enter_record();     // write(3, 0x1000, 5) at 7000
        let mut exit = ids(3, 7500, true);
        exit.extend(28u32.to_ne_bytes());                         // raw size: 24 + 4 padding
        exit.extend([0u8; 8]);                                    // common fields
        exit.extend(u64s(&[1, -9i64 as u64]));                    // id, ret -EBADF
        exit.extend([0u8; 4]);                                    // padding
        chunk.extend(perf_record(parse::kind::SAMPLE, 0, &exit));
        let mut switch = ids(4, 8000, true);
        switch.extend(u64s(&[0]));                                // callchain nr 0
        switch.extend(u64s(&[2, 0x7ff0, 0x7fe0, 0x401000]));      // regs
        switch.extend(u64s(&[0]));                                // no stack copied
        chunk.extend(perf_record(parse::kind::SAMPLE, 0, &switch));
        let out_preempt = parse::MISC_SWITCH_OUT | parse::MISC_SWITCH_OUT_PREEMPT;
        chunk.extend(perf_record(parse::kind::SWITCH, out_preempt, &ids(4, 8001, false)));
        chunk.extend(perf_record(parse::kind::SWITCH, 0, &ids(4, 9000, false)));
        let mut out = Vec::new();
        c.convert(RawMsg::Chunk(Chunk::plain(chunk)), &mut out).unwrap();
        let mut warnings = Vec::new();
        c.finish(&mut out, &mut warnings).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(out.len(), 4, "{out:#?}");
        let Record::Sample(enter) = &out[0] else { panic!("{:?}", out[0]) };
        assert_eq!((enter.kind, enter.weight, enter.time), (SampleKind::Syscall, 1, Timestamp(7000)));
        assert_eq!(enter.detail, SampleDetail::Syscall { nr: 1, args: [3, 0x1000, 5, 0, 0, 0] });
        assert_eq!((enter.regs.sp(), enter.stack.bytes.len()), (0x7fe0, 8));
        assert_eq!(out[1], Record::SyscallExit(SyscallExitRecord {
            time: Timestamp(7500), pid: Pid(10), tid: Tid(11), nr: 1, ret: -9,
        }));
        let Record::Sample(off) = &out[2] else { panic!("{:?}", out[2]) };
        assert_eq!((off.kind, off.weight, off.time), (SampleKind::OffCpu, 0, Timestamp(8000)));
        assert_eq!(off.detail, SampleDetail::OffCpu { preempted: true });
        assert_eq!(out[3], Record::SwitchIn(SwitchInRecord {
            time: Timestamp(9000), pid: Pid(10), tid: Tid(11),
        }));
    }

    /// `settings()`'s trailer: pid and tid, time.
    fn trailer(pid: u32, time: u64) -> Vec<u8> {
        u64s(&[((pid as u64) << 32) | pid as u64, time])
    }

    fn mmap2_record(pid: u32, time: u64, addr: u64, id: u8) -> Vec<u8> {
        let mut body = [pid.to_ne_bytes(), pid.to_ne_bytes()].concat();
        body.extend(u64s(&[addr, 0x1000, 0]));
        let mut build_id = [0u8; 24];
        build_id[0] = 20;
        build_id[4] = id;
        body.extend(build_id);
        body.extend((libc::PROT_READ | libc::PROT_EXEC).to_ne_bytes());
        body.extend(0u32.to_ne_bytes());
        body.extend(b"/nonexistent/image.so\0\0\0");
        body.extend(trailer(pid, time));
        perf_record(parse::kind::MMAP2, parse::MISC_MMAP_BUILD_ID, &body)
    }

    /// Records of a process that execs, heard in the order the rings gave
    /// them in a failed recording: the new program's first mappings before
    /// the exec itself (they came from another CPU's ring), and a child
    /// forked after the exec. The child gets the new program's mappings.
    #[rustfmt::skip]
    #[test]
    fn a_child_gets_its_parents_mappings_whatever_order_they_were_heard_in() {
        let mut c = converter();
        let mut chunk = mmap2_record(10, 100, 0x1000, 1);           // the old program
        chunk.extend(mmap2_record(10, 210, 0x5000, 2));             // the new one...
        chunk.extend(mmap2_record(10, 220, 0x7000, 3));
        let mut comm = [10u32.to_ne_bytes(), 10u32.to_ne_bytes()].concat();
        comm.extend(b"prog\0\0\0\0");
        comm.extend(trailer(10, 200));
        chunk.extend(perf_record(parse::kind::COMM, parse::MISC_COMM_EXEC, &comm)); // exec at 200
        chunk.extend(mmap2_record(10, 230, 0x9000, 4));
        // Fork of 20 at 300, heard after a mapping made before it (250).
        let fork = [20u32, 10, 20, 10].map(u32::to_ne_bytes).concat();
        let mut fork = [fork, u64s(&[300])].concat();
        fork.extend(trailer(10, 300));
        chunk.extend(perf_record(parse::kind::FORK, 0, &fork));
        chunk.extend(mmap2_record(10, 250, 0xb000, 5));
        let mut out = Vec::new();
        c.convert(RawMsg::Chunk(Chunk::plain(chunk)), &mut out).unwrap();
        c.finish(&mut out, &mut Vec::new()).unwrap();
        let mut child: Vec<(u64, u64)> = out.iter().filter_map(|r| match r {
            Record::ImageMap(m) if m.pid == Pid(20) => Some((m.start, m.time.0)),
            _ => None,
        }).collect();
        child.sort_unstable();
        assert_eq!(child, [(0x5000, 300), (0x7000, 300), (0x9000, 300), (0xb000, 300)], "{out:#?}");
    }

    /// CPU samples with thread, time, three registers (bp sp ip) and a
    /// stack copy.
    fn stack_layouts() -> Layouts {
        Layouts::single(
            Role::Cpu,
            parse::Layout {
                sample_type: parse::sample::TID
                    | parse::sample::TIME
                    | parse::sample::REGS_USER
                    | parse::sample::STACK_USER,
                user_regs: 3,
            },
        )
    }

    /// A stack the draining thread took out of its record (see `Chunk`)
    /// makes the same sample as one left in it.
    #[rustfmt::skip]
    #[test]
    fn stacks_taken_out_of_their_records_convert_the_same() {
        let layouts = stack_layouts;
        let mut body = u64s(&[(11 << 32) | 10, 500]);         // pid 10, tid 11, time
        body.extend(u64s(&[2, 0x7ff0, 0x7000, 0x401000]));    // regs: bp sp ip
        body.extend(u64s(&[8192]));                           // stack size
        body.extend(u64s(&(0..1024).map(|i| 0x5000 + i).collect::<Vec<u64>>()));
        body.extend(u64s(&[4096]));                           // dyn_size
        let rec = perf_record(parse::kind::SAMPLE, 0, &body);
        let convert = |chunk: Chunk| {
            let mut c = Converter::new(ConvertSettings { layouts: layouts(), ..settings() });
            let mut out = Vec::new();
            c.convert(RawMsg::Chunk(chunk), &mut out).unwrap();
            c.finish(&mut out, &mut Vec::new()).unwrap();
            out
        };
        let mut detached = Chunk::default();
        detached.push_record(&layouts(), &rec, &ChunkPool::default(), None);
        assert_eq!(detached.stacks.len(), 1);
        let mut compacted = Vec::new();
        super::super::ring::compact_record(&layouts(), &rec, &mut compacted);
        let (given, copied) = (convert(detached), convert(Chunk::plain(compacted)));
        assert_eq!(given, copied);
        let Some(Record::Sample(s)) = given.iter().find(|r| matches!(r, Record::Sample(_))) else {
            panic!("{given:?}")
        };
        assert_eq!((s.stack.start, s.stack.bytes.len()), (0x7000, 4096));
        assert_eq!(s.stack.bytes[..8], 0x5000u64.to_ne_bytes());
    }

    /// What the writer gets of `r`'s stack: its hint, returned, and its
    /// bytes, put into the sample if the converter held them apart.
    fn stack_into(c: &mut Converter, r: &mut Record) -> Option<StackHint> {
        let StackFor { hint, bytes } = c.stack_for(r);
        if let (Some(bytes), Record::Sample(s)) = (bytes, r) {
            assert!(s.stack.bytes.is_empty(), "bytes in two places");
            s.stack.bytes = bytes.to_vec();
        }
        hint
    }

    /// Each released sample comes with what the scan for images found of
    /// its stack, named by the copy it was compared with (the thread's
    /// previous one in arrival order); written with those hints, the
    /// trace holds the stacks as given, also where a sample arrived out of
    /// time order and its hint names a copy the writer has not written.
    #[rustfmt::skip]
    #[test]
    fn samples_come_with_what_their_stack_comparison_found() {
        let layouts = stack_layouts;
        let sample = |time: u64, leaf: u64| {
            let mut body = u64s(&[(11 << 32) | 10, time]);        // pid 10, tid 11, time
            body.extend(u64s(&[2, 0x7ff0, 0x7000, 0x401000]));    // regs: bp sp ip
            body.extend(u64s(&[4096]));                           // stack size
            let mut words: Vec<u64> = (0..512).map(|i| 0x5000 + i).collect();
            words[0] = leaf;
            body.extend(u64s(&words));
            body.extend(u64s(&[4096]));                           // dyn_size
            perf_record(parse::kind::SAMPLE, 0, &body)
        };
        let mut c = Converter::new(ConvertSettings {
            layouts: layouts(),
            embed: EmbedLevel::Symbols,
            ..settings()
        });
        // Arrival order 500, 600, 550 (another CPU's ring read late).
        let mut chunk = Chunk::default();
        for (time, leaf) in [(500, 1), (600, 2), (550, 3)] {
            chunk.push_record(&layouts(), &sample(time, leaf), &ChunkPool::default(), None);
        }
        let mut out = Vec::new();
        c.convert(RawMsg::Chunk(chunk), &mut out).unwrap();
        c.finish(&mut out, &mut Vec::new()).unwrap();
        let mut samples: Vec<&mut Record> = out
            .iter_mut()
            .filter(|r| matches!(r, Record::Sample(_)))
            .collect();
        let hints: Vec<StackHint> = samples
            .iter_mut()
            .map(|r| stack_into(&mut c, r).expect("a hint per sample"))
            .collect();
        let times: Vec<u64> = samples.iter().map(|r| r.time().unwrap().0).collect();
        assert_eq!(times, [500, 550, 600]);
        let (first, late, second) = (&hints[0], &hints[1], &hints[2]);
        assert_eq!(first.base, None);
        assert_eq!(second.base, Some(first.id));
        assert_eq!(late.base, Some(second.id));
        // Equal but for the leaf word's low byte.
        assert_eq!(second.runs, [(1, 4095)]);
        // Asked out of order, or for a record of no hint: none is trusted.
        assert_eq!(stack_into(&mut c, samples[0]), None);
        let samples: Vec<&Record> = samples.into_iter().map(|r| &*r).collect();

        let mut trace = Vec::new();
        let mut w = TraceWriter::new(&mut trace, &TraceHeader::example(), Default::default()).unwrap();
        for (r, h) in samples.iter().zip(&hints) {
            w.write_hinted(r, Some(h)).unwrap();
        }
        w.finish().unwrap();
        let read: Vec<Record> = TraceReader::new(trace).unwrap().records().map(Result::unwrap).collect();
        let expected: Vec<Record> = samples.into_iter().cloned().collect();
        assert_eq!(read, expected);
    }

    /// Deep stacks sent as the blocks that changed make the samples, hints
    /// and trace that stacks sent whole make: threads taking turns, stacks
    /// growing, shrinking and changing, chunks cut anywhere. With chunks
    /// whose last records cannot be split, the samples and the trace are
    /// still the same (the lost records' blocks count for their threads'
    /// next copies, which only changes the hints).
    #[test]
    fn stacks_sent_as_deltas_make_the_same_trace() {
        stacks_sent_as_deltas_make_the_same_trace_cut(false, false);
        stacks_sent_as_deltas_make_the_same_trace_cut(true, false);
        stacks_sent_as_deltas_make_the_same_trace_cut(false, true);
    }

    /// With `cut_some`, some chunks end in a cut record; with
    /// `out_of_order`, some samples are older than the ones drained
    /// before them (another CPU's ring read late).
    fn stacks_sent_as_deltas_make_the_same_trace_cut(cut_some: bool, out_of_order: bool) {
        let layouts = stack_layouts;
        let mut next = random_below(0x6a09_e667_f3bc_c909);
        let top = 0x7fff_0000u64;
        let mut stacks: Vec<Vec<u64>> = (0..3)
            .map(|t| (0..2000).map(|i| 0x40_0000 + t * 0x1000 + i).collect())
            .collect();
        // Chunks as the draining thread makes them both ways.
        let (mut whole, mut delta) = (Vec::new(), Vec::new());
        let (mut w, mut d) = (Chunk::default(), Chunk::default());
        let mut keeper = Keeper::new(1);
        let pool = ChunkPool::default();
        for time in 1..=600u64 {
            let t = next(3) as usize;
            let stack = &mut stacks[t];
            for _ in 0..next(4) {
                let at = next(stack.len() as u64) as usize;
                stack[at] = if next(5) == 0 {
                    0
                } else {
                    0x40_0000 + next(1 << 20)
                };
            }
            let depth = 300 + next(1700) as usize;
            let words = &stack[stack.len() - depth..];
            let sp = top - 8 * depth as u64;
            let time = if out_of_order && next(3) == 0 {
                time * 10 - 25
            } else {
                time * 10
            };
            let mut body = u64s(&[((11 + t as u64) << 32) | 10, time]);
            body.extend(u64s(&[2, 0x7ff0, sp, 0x401000]));
            body.extend(u64s(&[16384]));
            let mut copy = u64s(words);
            copy.resize(16384, 0);
            body.extend(copy);
            body.extend(u64s(&[8 * depth as u64]));
            let rec = perf_record(parse::kind::SAMPLE, 0, &body);
            w.push_record(&layouts(), &rec, &pool, None);
            d.push_record(&layouts(), &rec, &pool, Some(&mut keeper));
            if next(8) == 0 {
                if cut_some && next(4) == 0 {
                    // The last record's header cut: it and what follows
                    // cannot be split.
                    let cut = w.bytes.len() - 3;
                    w.bytes.truncate(cut);
                    let cut = d.bytes.len() - 3;
                    d.bytes.truncate(cut);
                }
                whole.push(std::mem::take(&mut w));
                delta.push(std::mem::take(&mut d));
            }
        }
        whole.push(w);
        delta.push(d);
        let sent_whole = delta
            .iter()
            .flat_map(|c| &c.stacks)
            .filter(|s| matches!(s.stack, Detached::Whole(_)))
            .count();
        if out_of_order {
            assert!(sent_whole > 20, "{sent_whole}");
        } else {
            assert_eq!(sent_whole, 0);
        }
        let run = |chunks: Vec<Chunk>| {
            let mut c = Converter::new(ConvertSettings {
                layouts: layouts(),
                embed: EmbedLevel::Symbols,
                ..settings()
            });
            let mut out = Vec::new();
            for chunk in chunks {
                c.convert(RawMsg::Chunk(chunk), &mut out).unwrap();
            }
            c.finish(&mut out, &mut Vec::new()).unwrap();
            let mut samples: Vec<Record> = out
                .into_iter()
                .filter(|r| matches!(r, Record::Sample(_)))
                .collect();
            let hints: Vec<Option<StackHint>> =
                samples.iter_mut().map(|r| stack_into(&mut c, r)).collect();
            let mut trace = Vec::new();
            let mut tw =
                TraceWriter::new(&mut trace, &TraceHeader::example(), Default::default()).unwrap();
            for (r, h) in samples.iter().zip(&hints) {
                tw.write_hinted(r, h.as_ref()).unwrap();
            }
            tw.finish().unwrap();
            (samples, hints, trace)
        };
        let (sent_whole, sent_delta) = (run(whole), run(delta));
        assert!(sent_whole.0.len() > 400, "{}", sent_whole.0.len());
        assert!(
            sent_whole
                .1
                .iter()
                .filter(|h| h.as_ref().is_some_and(|h| h.base.is_some()))
                .count()
                > 300
        );
        assert_eq!(sent_delta.0, sent_whole.0);
        // (Copies out of order are compared with other copies of the
        // thread one way than the other: other hints, the same trace.)
        if !cut_some && !out_of_order {
            assert_eq!(sent_delta.1, sent_whole.1);
        }
        assert_eq!(sent_delta.2, sent_whole.2);
    }

    /// Held records come out as a stable sort by time would give them,
    /// whatever runs they arrive in and wherever releases cut.
    #[test]
    fn held_records_are_released_in_time_then_arrival_order() {
        let mut next = random_below(0x2545_f491_4f6c_dd1d);
        let lost = |time: u64, count: u64| {
            Record::Lost(LostRecord {
                time: Timestamp(time),
                pid: None,
                tid: None,
                count,
                source: LostSource::Kernel,
            })
        };
        for _ in 0..200 {
            let mut held = Held::default();
            // The model: what is held, in arrival order.
            let mut model: Vec<(u64, u64)> = Vec::new();
            let mut released_before = 0;
            let mut id = 0;
            let release = |held: &mut Held, model: &mut Vec<(u64, u64)>, before: u64| {
                let mut out = Vec::new();
                held.release(before, &mut out, &mut VecDeque::new());
                // A stable sort by time of what is older than `before`.
                let mut expected: Vec<(u64, u64)> =
                    model.iter().copied().filter(|&(t, _)| t < before).collect();
                expected.sort_by_key(|&(t, _)| t);
                model.retain(|&(t, _)| t >= before);
                let expected: Vec<Record> = expected.iter().map(|&(t, id)| lost(t, id)).collect();
                assert_eq!(out, expected);
            };
            for _ in 0..(1 + next(8)) {
                // A few runs in order, from about where the last cut was.
                for _ in 0..next(4) {
                    let mut t = released_before + next(50);
                    for _ in 0..next(30) {
                        t += next(3);
                        id += 1;
                        held.push(t, lost(t, id), Carried::default());
                        model.push((t, id));
                    }
                }
                released_before += next(60);
                release(&mut held, &mut model, released_before);
            }
            release(&mut held, &mut model, u64::MAX);
            assert!(held.records.is_empty() && held.keys.is_empty());
        }
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
