//! One sampling round over a task's threads, as the macOS backend does it,
//! written against [`TaskThreads`] so it is tested on any host.
//!
//! Each round: refresh the image list; list the threads; a thread whose CPU
//! time did not move since its last sample is skipped without being
//! stopped; every other one is stopped, its registers read and its live
//! stack copied, and it is let go. Threads seen for the first time get a
//! thread record, threads no longer listed an exit record. Images that a
//! sample's registers or stack words point into are embedded the first
//! time (see [`Images::embed`]).

use super::images::{Images, TaskMemory};
use super::strip_pac;
use crate::error::RecordError;
use lrnprof_format::{
    IdleRecord, Pid, Record, Regs, Sample, SampleDetail, SampleFlags, SampleKind, StackSnapshot,
    ThreadEvent, ThreadRecord, Tid, Timestamp,
};
use std::collections::HashMap;

/// A task's threads, as a sampling round needs them.
pub(crate) trait TaskThreads: TaskMemory {
    /// A handle to one thread, valid while its [`TaskThreads::List`] lives.
    type Thread: Copy;
    /// The threads listed at one moment; releases them when dropped.
    type List: AsRef<[Self::Thread]>;

    /// The task's current threads; `None` once the task is gone.
    fn threads(&self) -> Option<Self::List>;
    /// The system-wide thread id.
    fn thread_id(&self, thread: Self::Thread) -> Option<u64>;
    /// User plus system CPU time so far, in nanoseconds.
    fn cpu_time_ns(&self, thread: Self::Thread) -> Option<u64>;
    /// The thread's name, if it has one.
    fn thread_name(&self, thread: Self::Thread) -> Option<String>;
    /// Now, on the trace clock, in nanoseconds.
    fn now_ns(&self) -> u64;
    /// Stop `thread`, read its registers, run `copy` while it is stopped,
    /// and let it run again, whatever happens. Returns the time it was
    /// stopped at, its registers and what `copy` returned.
    fn while_stopped<R>(
        &self,
        thread: Self::Thread,
        copy: impl FnOnce(&Regs) -> R,
    ) -> Option<(u64, Regs, R)>;
    /// The VM region (AVMA range) containing `address`.
    fn region_containing(&self, address: u64) -> Option<(u64, u64)>;
}

/// What the sampler knows about one thread between rounds.
struct ThreadEntry {
    /// User + system CPU time at the last round, in ns.
    cpu_ns: u64,
    /// The VM region holding its stack (AVMA range), looked up once and
    /// again only when the stack pointer leaves it.
    stack_region: Option<(u64, u64)>,
    /// The last round the thread was listed in.
    seen_round: u64,
    /// Its name when last looked at.
    name: Option<String>,
    /// Rounds at which it was idle since its last `Idle` record.
    idle_ticks: u64,
}

/// Every this many rounds, thread names are read again: programs often
/// name a thread after it started.
const NAME_CHECK_ROUNDS: u64 = 128;

/// Counts of what the rounds did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundCounts {
    /// Rounds run.
    pub rounds: u64,
    /// Samples taken.
    pub samples: u64,
    /// Thread-rounds skipped because the thread had not run (not stopped).
    pub idle: u64,
    /// Thread-rounds where the thread vanished or could not be read.
    pub failed: u64,
}

/// The sampling state of one task.
pub(crate) struct ThreadSampler {
    pid: Pid,
    /// The most CPU time charged to a thread's first sample, in ns.
    period_ns: u64,
    /// The most bytes of stack copied per sample.
    stack_size: usize,
    /// The `cputype` this recorder can sample.
    cputype: u32,
    threads: HashMap<u64, ThreadEntry>,
    /// The task's images.
    pub images: Images,
    /// What the rounds did so far.
    pub counts: RoundCounts,
}

impl ThreadSampler {
    /// A sampler of process `pid`, whose rounds are `period_ns` apart, that
    /// copies at most `stack_size` bytes of stack per sample and records
    /// only code of `cputype`.
    pub fn new(
        pid: Pid,
        period_ns: u64,
        stack_size: u32,
        cputype: u32,
        images: Images,
    ) -> ThreadSampler {
        ThreadSampler {
            pid,
            period_ns,
            stack_size: effective_stack_size(stack_size) as usize,
            cputype,
            threads: HashMap::new(),
            images,
            counts: RoundCounts::default(),
        }
    }

    /// One round over the task's threads; records go to `out`. Returns
    /// whether the task is still alive.
    pub fn round<T: TaskThreads>(
        &mut self,
        task: &T,
        out: &mut Vec<Record>,
    ) -> Result<bool, RecordError> {
        let time = Timestamp(task.now_ns());
        if self.images.refresh(task, time, out).is_err() {
            // A half-updated or unreadable list: retried next round; a dead
            // task is noticed by the thread list below.
            self.images.unreadable += 1;
        }
        if let Some(cpu) = self.images.executable_cputype() {
            if cpu != self.cputype {
                return Err(RecordError::Unsupported(format!(
                    "pid {} runs code of another architecture (cputype {cpu:#x}, e.g. x86_64 \
                     under Rosetta): record it with the lrnprof-rec build for that architecture",
                    self.pid.0
                )));
            }
        }
        let Some(list) = task.threads() else {
            return Ok(false);
        };
        self.counts.rounds += 1;
        let round = self.counts.rounds;
        for &thread in list.as_ref() {
            let (Some(id), Some(cpu_ns)) = (task.thread_id(thread), task.cpu_time_ns(thread))
            else {
                self.counts.failed += 1;
                continue;
            };
            let weight = match self.threads.get_mut(&id) {
                Some(entry) => {
                    entry.seen_round = round;
                    if round.is_multiple_of(NAME_CHECK_ROUNDS) {
                        let name = task.thread_name(thread);
                        if name.is_some() && name != entry.name {
                            entry.name = name.clone();
                            out.push(Record::Thread(ThreadRecord {
                                time: Timestamp(task.now_ns()),
                                pid: self.pid,
                                tid: Tid(id as u32),
                                event: ThreadEvent::Rename,
                                name,
                            }));
                        }
                    }
                    let delta = cpu_ns.saturating_sub(entry.cpu_ns);
                    entry.cpu_ns = cpu_ns;
                    delta
                }
                None => {
                    let name = task.thread_name(thread);
                    out.push(Record::Thread(ThreadRecord {
                        time: Timestamp(task.now_ns()),
                        pid: self.pid,
                        tid: Tid(id as u32),
                        event: if round == 1 {
                            ThreadEvent::Existing
                        } else {
                            ThreadEvent::Start
                        },
                        name: name.clone(),
                    }));
                    self.threads.insert(
                        id,
                        ThreadEntry {
                            cpu_ns,
                            stack_region: None,
                            seen_round: round,
                            name,
                            idle_ticks: 0,
                        },
                    );
                    // No earlier reading: charge at most one period.
                    cpu_ns.min(self.period_ns)
                }
            };
            if weight == 0 {
                // Did not run since its last sample: nothing to charge, and
                // no reason to stop it. Idle ticks are summed per thread and
                // written when it next runs, exits, or recording ends.
                self.counts.idle += 1;
                if let Some(entry) = self.threads.get_mut(&id) {
                    entry.idle_ticks += 1;
                }
                continue;
            }
            self.take_idle(id, Timestamp(task.now_ns()), out);
            match self.sample(task, thread, id, weight) {
                Some(sample) => {
                    self.counts.samples += 1;
                    self.embed_touched(task, &sample, out);
                    out.push(Record::Sample(sample));
                }
                None => self.counts.failed += 1,
            }
        }
        drop(list);
        let time = Timestamp(task.now_ns());
        let mut exited: Vec<u64> = self
            .threads
            .iter()
            .filter(|(_, e)| e.seen_round != round)
            .map(|(&id, _)| id)
            .collect();
        exited.sort_unstable();
        for id in exited {
            self.take_idle(id, time, out);
            self.threads.remove(&id);
            out.push(Record::Thread(ThreadRecord {
                time,
                pid: self.pid,
                tid: Tid(id as u32),
                event: ThreadEvent::Exit,
                name: None,
            }));
        }
        Ok(true)
    }

    /// Write the `Idle` record of thread `id` if it has idle ticks pending.
    fn take_idle(&mut self, id: u64, time: Timestamp, out: &mut Vec<Record>) {
        if let Some(entry) = self.threads.get_mut(&id) {
            if entry.idle_ticks > 0 {
                out.push(Record::Idle(IdleRecord {
                    time,
                    pid: self.pid,
                    tid: Tid(id as u32),
                    ticks: std::mem::take(&mut entry.idle_ticks),
                }));
            }
        }
    }

    /// Write the pending `Idle` records of every thread, in thread id order:
    /// called once sampling stops.
    pub fn flush_idle(&mut self, time: Timestamp, out: &mut Vec<Record>) {
        let mut ids: Vec<u64> = self.threads.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.take_idle(id, time, out);
        }
    }

    /// Stop the thread, read its registers and live stack, let it go.
    fn sample<T: TaskThreads>(
        &mut self,
        task: &T,
        thread: T::Thread,
        id: u64,
        weight: u64,
    ) -> Option<Sample> {
        let region = &mut self.threads.get_mut(&id)?.stack_region;
        let max_len = self.stack_size;
        let (time, regs, stack) =
            task.while_stopped(thread, |regs| copy_stack(task, region, regs.sp(), max_len))?;
        Some(Sample {
            time: Timestamp(time),
            pid: self.pid,
            tid: Tid(id as u32),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight,
            regs,
            stack,
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        })
    }

    /// Embed the images this sample's registers or stack words point into,
    /// the first time that happens: a cheap over-approximation of "images
    /// on the stack", with no unwinding.
    fn embed_touched(&mut self, task: &impl TaskMemory, sample: &Sample, out: &mut Vec<Record>) {
        if !self.images.has_pending() {
            return;
        }
        let lr = match sample.regs {
            Regs::Aarch64(r) => r.lr,
            Regs::X86_64(_) => 0,
        };
        let words = sample.stack.bytes.chunks_exact(8).map(|w| {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            strip_pac(u64::from_le_bytes(word))
        });
        for address in [sample.regs.ip(), lr].into_iter().chain(words) {
            if let Some(start) = self.images.wants_embedding(address) {
                self.images.embed(task, start, out);
            }
        }
    }
}

/// The most stack bytes copied per sample for a requested `stack_size`:
/// rounded down to whole words and capped by what a trace record may hold.
pub(crate) fn effective_stack_size(stack_size: u32) -> u32 {
    stack_size.min(lrnprof_format::MAX_STACK_LEN) & !7
}

/// Copy the live stack, from `sp` to the end of its VM region or `max_len`
/// bytes, whichever is less; `region` caches the region between samples.
/// An unreadable stack gives an empty copy (the sample keeps its registers).
fn copy_stack(
    task: &impl TaskThreads,
    region: &mut Option<(u64, u64)>,
    sp: u64,
    max_len: usize,
) -> StackSnapshot {
    let end = match *region {
        Some((start, end)) if start <= sp && sp < end => end,
        _ => match task.region_containing(sp) {
            Some((start, end)) if start <= sp && sp < end => {
                *region = Some((start, end));
                end
            }
            _ => {
                *region = None;
                return StackSnapshot {
                    start: sp,
                    bytes: Vec::new(),
                };
            }
        },
    };
    let len = usize::try_from(end - sp).unwrap_or(usize::MAX).min(max_len);
    let mut bytes = vec![0u8; len];
    if !task.read(sp, &mut bytes) {
        *region = None;
        bytes.clear();
    }
    StackSnapshot { start: sp, bytes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::RegsX86_64;
    use lrnprof_image::EmbedLevel;
    use std::cell::{Cell, RefCell};

    const PERIOD_NS: u64 = 1_000_000;
    const CPU_TYPE: u32 = 0x0100_0007;
    /// The one stack region: 256 bytes, each byte its offset.
    const STACK: u64 = 0x7ff0_0000;

    #[derive(Clone)]
    struct FakeThread {
        id: u64,
        cpu_ns: u64,
        sp: u64,
        name: Option<&'static str>,
        can_stop: bool,
    }

    /// A pretend task: threads with CPU times and registers, one stack
    /// region, a clock that ticks on every reading, and a log of which
    /// threads were stopped.
    struct Fake {
        threads: Vec<FakeThread>,
        gone: bool,
        clock: Cell<u64>,
        stopped: RefCell<Vec<u64>>,
    }

    impl Fake {
        fn new(threads: Vec<FakeThread>) -> Fake {
            Fake {
                threads,
                gone: false,
                clock: Cell::new(100),
                stopped: RefCell::new(Vec::new()),
            }
        }
    }

    fn thread(id: u64, cpu_ns: u64) -> FakeThread {
        FakeThread {
            id,
            cpu_ns,
            sp: STACK + 192,
            name: Some("worker"),
            can_stop: true,
        }
    }

    impl TaskMemory for Fake {
        fn read(&self, address: u64, buf: &mut [u8]) -> bool {
            let Some(offset) = address.checked_sub(STACK) else {
                return false;
            };
            if offset + buf.len() as u64 > 256 {
                return false;
            }
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (offset as usize + i) as u8;
            }
            true
        }

        fn all_image_infos_address(&self) -> Result<u64, RecordError> {
            Ok(0)
        }
    }

    impl TaskThreads for Fake {
        type Thread = usize;
        type List = Vec<usize>;

        fn threads(&self) -> Option<Vec<usize>> {
            (!self.gone).then(|| (0..self.threads.len()).collect())
        }

        fn thread_id(&self, thread: usize) -> Option<u64> {
            Some(self.threads[thread].id)
        }

        fn cpu_time_ns(&self, thread: usize) -> Option<u64> {
            Some(self.threads[thread].cpu_ns)
        }

        fn thread_name(&self, thread: usize) -> Option<String> {
            self.threads[thread].name.map(str::to_string)
        }

        fn now_ns(&self) -> u64 {
            self.clock.set(self.clock.get() + 10);
            self.clock.get()
        }

        fn while_stopped<R>(
            &self,
            thread: usize,
            copy: impl FnOnce(&Regs) -> R,
        ) -> Option<(u64, Regs, R)> {
            let t = &self.threads[thread];
            if !t.can_stop {
                return None;
            }
            self.stopped.borrow_mut().push(t.id);
            let regs = Regs::X86_64(RegsX86_64 {
                ip: 0x1_0000_1000 + t.id,
                sp: t.sp,
                bp: t.sp + 16,
            });
            let time = self.now_ns();
            Some((time, regs, copy(&regs)))
        }

        fn region_containing(&self, address: u64) -> Option<(u64, u64)> {
            (STACK..STACK + 256)
                .contains(&address)
                .then_some((STACK, STACK + 256))
        }
    }

    fn sampler(stack_size: u32) -> ThreadSampler {
        ThreadSampler::new(
            Pid(9),
            PERIOD_NS,
            stack_size,
            CPU_TYPE,
            Images::new(Pid(9), EmbedLevel::Symbols),
        )
    }

    fn samples(out: &[Record]) -> Vec<&Sample> {
        out.iter()
            .filter_map(|r| match r {
                Record::Sample(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    fn thread_events(out: &[Record]) -> Vec<(u32, ThreadEvent, Option<String>)> {
        out.iter()
            .filter_map(|r| match r {
                Record::Thread(t) => Some((t.tid.0, t.event, t.name.clone())),
                _ => None,
            })
            .collect()
    }

    fn assert_time_ordered(out: &[Record]) {
        let times: Vec<Timestamp> = out.iter().filter_map(Record::time).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }

    #[test]
    fn first_round_lists_threads_and_samples_those_that_ran() {
        let task = Fake::new(vec![thread(1, 5_000_000), thread(2, 0)]);
        let mut s = sampler(65536);
        let mut out = Vec::new();
        assert!(s.round(&task, &mut out).unwrap());
        assert_eq!(
            thread_events(&out),
            vec![
                (1, ThreadEvent::Existing, Some("worker".into())),
                (2, ThreadEvent::Existing, Some("worker".into())),
            ]
        );
        // Thread 2 never ran: it is not even stopped.
        assert_eq!(*task.stopped.borrow(), vec![1]);
        let samples = samples(&out);
        assert_eq!(samples.len(), 1);
        let sample = samples[0];
        assert_eq!((sample.pid, sample.tid), (Pid(9), Tid(1)));
        assert_eq!(sample.kind, SampleKind::CpuTime);
        // A first sample is charged at most one period.
        assert_eq!(sample.weight, PERIOD_NS);
        assert_eq!(sample.regs.sp(), STACK + 192);
        // The live stack: from sp to the end of its region.
        assert_eq!(sample.stack.start, STACK + 192);
        assert_eq!(sample.stack.bytes, (192..=255).collect::<Vec<u8>>());
        assert_eq!(
            s.counts,
            RoundCounts {
                rounds: 1,
                samples: 1,
                idle: 1,
                failed: 0
            }
        );
        assert_time_ordered(&out);
    }

    #[test]
    fn later_rounds_charge_cpu_time_used_and_skip_idle_threads() {
        let mut task = Fake::new(vec![thread(1, 5_000_000), thread(2, 7_000_000)]);
        let mut s = sampler(65536);
        s.round(&task, &mut Vec::new()).unwrap();
        task.threads[0].cpu_ns += 300_000;
        task.stopped.borrow_mut().clear();
        let mut out = Vec::new();
        s.round(&task, &mut out).unwrap();
        assert!(thread_events(&out).is_empty(), "{out:?}");
        let samples = samples(&out);
        assert_eq!(samples.len(), 1);
        assert_eq!((samples[0].tid, samples[0].weight), (Tid(1), 300_000));
        assert_eq!(*task.stopped.borrow(), vec![1]);
        assert_eq!(s.counts.idle, 1);
    }

    fn idle(out: &[Record]) -> Vec<(u32, u64)> {
        out.iter()
            .filter_map(|r| match r {
                Record::Idle(i) => Some((i.tid.0, i.ticks)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn idle_ticks_are_summed_and_written_when_the_thread_runs_exits_or_recording_ends() {
        let mut task = Fake::new(vec![thread(1, 5), thread(2, 5), thread(3, 5)]);
        let mut s = sampler(65536);
        s.round(&task, &mut Vec::new()).unwrap();
        // Three rounds in which nobody runs: no records, nobody stopped.
        task.stopped.borrow_mut().clear();
        for _ in 0..3 {
            let mut out = Vec::new();
            s.round(&task, &mut out).unwrap();
            assert!(idle(&out).is_empty() && samples(&out).is_empty(), "{out:?}");
        }
        assert!(task.stopped.borrow().is_empty());
        // Thread 1 runs: its idle ticks come first, then its sample.
        task.threads[0].cpu_ns += 1000;
        let mut out = Vec::new();
        s.round(&task, &mut out).unwrap();
        assert_eq!(idle(&out), vec![(1, 3)]);
        let idle_at = out
            .iter()
            .position(|r| matches!(r, Record::Idle(_)))
            .unwrap();
        let sample_at = out
            .iter()
            .position(|r| matches!(r, Record::Sample(_)))
            .unwrap();
        assert!(idle_at < sample_at);
        // Thread 2 exits: its ticks are written before its exit.
        task.threads.remove(1);
        let mut out = Vec::new();
        s.round(&task, &mut out).unwrap();
        assert_eq!(idle(&out), vec![(2, 4)]);
        assert_eq!(thread_events(&out), vec![(2, ThreadEvent::Exit, None)]);
        assert_time_ordered(&out);
        // Recording ends: thread 3's ticks (5 rounds) and thread 1's (1 round).
        let mut out = Vec::new();
        s.flush_idle(Timestamp(u64::MAX), &mut out);
        assert_eq!(idle(&out), vec![(1, 1), (3, 5)]);
        let mut out = Vec::new();
        s.flush_idle(Timestamp(u64::MAX), &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn threads_that_appear_and_vanish_get_start_and_exit_records() {
        let mut task = Fake::new(vec![thread(1, 0), thread(2, 0)]);
        let mut s = sampler(65536);
        s.round(&task, &mut Vec::new()).unwrap();
        task.threads = vec![thread(1, 0), thread(3, 0)];
        task.threads[1].name = None;
        let mut out = Vec::new();
        s.round(&task, &mut out).unwrap();
        assert_eq!(
            thread_events(&out),
            vec![(3, ThreadEvent::Start, None), (2, ThreadEvent::Exit, None)]
        );
        assert_time_ordered(&out);
    }

    #[test]
    fn stack_copies_are_capped_and_unreadable_stacks_keep_the_registers() {
        let mut task = Fake::new(vec![thread(1, 1), thread(2, 1)]);
        task.threads[1].sp = 0x10; // in no region
        let mut s = sampler(32 + 5); // rounded down to 32
        let mut out = Vec::new();
        s.round(&task, &mut out).unwrap();
        let samples = samples(&out);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].stack.bytes, (192..224).collect::<Vec<u8>>());
        assert_eq!(samples[1].stack.start, 0x10);
        assert!(samples[1].stack.bytes.is_empty());
        assert_eq!(samples[1].regs.ip(), 0x1_0000_1002);
    }

    #[test]
    fn stack_sizes_are_whole_words_within_the_format_limit() {
        assert_eq!(effective_stack_size(65535), 65528);
        assert_eq!(
            effective_stack_size(u32::MAX),
            lrnprof_format::MAX_STACK_LEN
        );
        assert_eq!(effective_stack_size(7), 0);
    }

    #[test]
    fn threads_that_cannot_be_stopped_are_counted_and_skipped() {
        let mut task = Fake::new(vec![thread(1, 1)]);
        task.threads[0].can_stop = false;
        let mut s = sampler(65536);
        let mut out = Vec::new();
        s.round(&task, &mut out).unwrap();
        assert!(samples(&out).is_empty());
        assert_eq!((s.counts.samples, s.counts.failed), (0, 1));
    }

    #[test]
    fn names_given_after_a_thread_started_are_recorded_as_renames() {
        let mut task = Fake::new(vec![thread(1, 0)]);
        task.threads[0].name = None;
        let mut s = sampler(65536);
        s.round(&task, &mut Vec::new()).unwrap();
        task.threads[0].name = Some("decoder");
        let mut out = Vec::new();
        for _ in 1..NAME_CHECK_ROUNDS {
            s.round(&task, &mut out).unwrap();
        }
        assert_eq!(
            thread_events(&out),
            vec![(1, ThreadEvent::Rename, Some("decoder".into()))]
        );
        // The same name is not reported again.
        out.clear();
        for _ in 0..NAME_CHECK_ROUNDS {
            s.round(&task, &mut out).unwrap();
        }
        assert!(thread_events(&out).is_empty(), "{out:?}");
    }

    #[test]
    fn a_task_that_is_gone_ends_sampling() {
        let mut task = Fake::new(vec![thread(1, 1)]);
        task.gone = true;
        let mut out = Vec::new();
        assert!(!sampler(65536).round(&task, &mut out).unwrap());
        assert!(out.is_empty());
    }
}
