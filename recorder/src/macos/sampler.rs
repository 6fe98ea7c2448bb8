//! The sampling thread: at each tick, every thread that used CPU since its
//! last sample is suspended, its registers and live stack are copied, and
//! it is resumed.

use super::regs_native;
use super::sys::{self, MachClock, Port, Suspended};
use crate::embed::EmbedLevel;
use crate::error::RecordError;
use crate::macho::{FileToEmbed, Images};
use crate::sink::SinkSender;
use lrnprof_format::{
    Pid, Record, Regs, Sample, SampleKind, StackSnapshot, ThreadEvent, ThreadRecord, Tid, Timestamp,
};
use mach2::mach_types::thread_act_t;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the sampler knows about one thread between ticks.
struct ThreadEntry {
    /// User + system CPU time at the last tick, in ns.
    cpu_ns: u64,
    /// The VM region holding its stack (AVMA range), looked up once and
    /// again only when the stack pointer leaves it.
    stack_region: Option<(u64, u64)>,
    /// The last tick the thread was listed in.
    seen_tick: u64,
}

/// What the sampler hands back when it stops.
#[derive(Debug, Default)]
pub(super) struct SamplerTotals {
    /// Image files samples touched, to embed now that sampling is over.
    pub files: Vec<FileToEmbed>,
    /// Ticks run.
    pub ticks: u64,
    /// Thread-ticks skipped because the thread had not run (not suspended).
    pub idle: u64,
    /// Thread-ticks where the thread vanished or could not be read.
    pub failed: u64,
}

/// The sampling state of one target task.
pub(super) struct Sampler {
    task: Port,
    pid: Pid,
    clock: MachClock,
    period: Duration,
    stack_size: usize,
    threads: HashMap<u64, ThreadEntry>,
    images: Images,
    out: Vec<Record>,
    totals: SamplerTotals,
}

impl Sampler {
    /// A sampler of `task` (process `pid`) at `frequency_hz`, copying at
    /// most `stack_size` bytes of stack per sample and embedding `embed` of
    /// the images samples touch.
    pub fn new(
        task: Port,
        pid: Pid,
        clock: MachClock,
        frequency_hz: u32,
        stack_size: u32,
        embed: EmbedLevel,
    ) -> Sampler {
        Sampler {
            task,
            pid,
            clock,
            period: Duration::from_nanos(1_000_000_000 / u64::from(frequency_hz.max(1))),
            stack_size: (stack_size & !7) as usize,
            threads: HashMap::new(),
            images: Images::new(pid, embed),
            out: Vec::new(),
            totals: SamplerTotals::default(),
        }
    }

    /// Sample until `stop` is set or the task goes away. Returns normally
    /// when the target exits.
    pub fn run(
        mut self,
        sink: SinkSender<Record>,
        stop: Arc<AtomicBool>,
        target_gone: Arc<AtomicBool>,
    ) -> Result<SamplerTotals, RecordError> {
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let alive = self.tick()?;
            for r in self.out.drain(..) {
                sink.send(r)?;
            }
            if !alive {
                target_gone.store(true, Ordering::Relaxed);
                break;
            }
            // Fixed-rate schedule; ticks missed while we were slow are
            // dropped rather than run back to back.
            next += self.period;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        self.totals.files = self.images.take_files();
        Ok(self.totals)
    }

    fn now(&self) -> Timestamp {
        Timestamp(self.clock.now_ns())
    }

    /// One round over the task's threads. Returns whether the task is alive.
    fn tick(&mut self) -> Result<bool, RecordError> {
        let time = self.now();
        if self
            .images
            .refresh(&self.task, time, &mut self.out)
            .is_err()
        {
            // A half-updated or unreadable list: retried next tick; a dead
            // task is noticed by task_threads below.
            self.images.unreadable += 1;
        }
        if let Some(cpu) = self.images.executable_cputype() {
            if cpu != regs_native::CPU_TYPE {
                return Err(RecordError::Unsupported(format!(
                    "pid {} runs code of another architecture (cputype {cpu:#x}, e.g. x86_64 \
                     under Rosetta): record it with the lrnprof-rec build for that architecture",
                    self.pid.0
                )));
            }
        }
        // task_threads fails only on a task that is gone (whatever the
        // code: dead port, terminated task), so any failure ends sampling.
        let Ok(list) = sys::threads_of(&self.task) else {
            return Ok(false);
        };
        self.totals.ticks += 1;
        let tick = self.totals.ticks;
        let nominal = self.period.as_nanos() as u64;
        for &port in list.ports() {
            let (Ok(id), Ok(cpu_ns)) = (sys::thread_id(port), sys::thread_cpu_time_ns(port)) else {
                self.totals.failed += 1;
                continue;
            };
            let weight = match self.threads.get_mut(&id) {
                Some(entry) => {
                    entry.seen_tick = tick;
                    let delta = cpu_ns.saturating_sub(entry.cpu_ns);
                    entry.cpu_ns = cpu_ns;
                    delta
                }
                None => {
                    self.out.push(Record::Thread(ThreadRecord {
                        time: self.now(),
                        pid: self.pid,
                        tid: Tid(id as u32),
                        event: if tick == 1 {
                            ThreadEvent::Existing
                        } else {
                            ThreadEvent::Start
                        },
                        name: sys::thread_name(port),
                    }));
                    self.threads.insert(
                        id,
                        ThreadEntry {
                            cpu_ns,
                            stack_region: None,
                            seen_tick: tick,
                        },
                    );
                    // No earlier reading: charge at most one period.
                    cpu_ns.min(nominal)
                }
            };
            if weight == 0 {
                // Did not run since its last sample: nothing to charge, and
                // no reason to stop it.
                self.totals.idle += 1;
                continue;
            }
            match self.sample(port, id, weight) {
                Ok(sample) => {
                    self.embed_touched(&sample);
                    self.out.push(Record::Sample(sample));
                }
                Err(_) => self.totals.failed += 1,
            }
        }
        let time = self.now();
        let exited: Vec<u64> = self
            .threads
            .iter()
            .filter(|(_, e)| e.seen_tick != tick)
            .map(|(&id, _)| id)
            .collect();
        for id in exited {
            self.threads.remove(&id);
            self.out.push(Record::Thread(ThreadRecord {
                time,
                pid: self.pid,
                tid: Tid(id as u32),
                event: ThreadEvent::Exit,
                name: None,
            }));
        }
        Ok(true)
    }

    /// Suspend, read registers and stack, resume (on every path, by the
    /// guard's drop).
    fn sample(&mut self, port: thread_act_t, id: u64, weight: u64) -> Result<Sample, sys::Kern> {
        let suspended = Suspended::new(port)?;
        let time = self.now();
        let regs = regs_native::read_regs(&suspended)?;
        let region = self.threads.get_mut(&id).map(|e| &mut e.stack_region);
        let stack = copy_stack(&self.task, region, regs.sp(), self.stack_size);
        drop(suspended);
        Ok(Sample {
            time,
            pid: self.pid,
            tid: Tid(id as u32),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight,
            regs,
            stack,
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
        })
    }

    /// Embed the unwind sections of shared-cache images this sample's
    /// registers or stack words point into, the first time that happens.
    /// A cheap over-approximation of "images on the stack": no unwinding.
    fn embed_touched(&mut self, sample: &Sample) {
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
            crate::macho::strip_pac(u64::from_le_bytes(word))
        });
        for address in [sample.regs.ip(), lr].into_iter().chain(words) {
            if let Some(start) = self.images.wants_embedding(address) {
                self.images.embed(&self.task, start, &mut self.out);
            }
        }
    }
}

/// Copy the live stack, from `sp` to the end of its VM region or
/// `max_len` bytes, whichever is less. An unreadable stack gives an empty
/// copy (the sample still has its registers).
fn copy_stack(
    task: &Port,
    region: Option<&mut Option<(u64, u64)>>,
    sp: u64,
    max_len: usize,
) -> StackSnapshot {
    let mut empty = None;
    let cached = region.unwrap_or(&mut empty);
    let (_, end) = match *cached {
        Some((start, end)) if start <= sp && sp < end => (start, end),
        _ => match sys::region_containing(task, sp) {
            Some(r) => {
                *cached = Some(r);
                r
            }
            None => {
                return StackSnapshot {
                    start: sp,
                    bytes: Vec::new(),
                }
            }
        },
    };
    let len = ((end - sp) as usize).min(max_len);
    let mut bytes = vec![0u8; len];
    if sys::read_memory(task, sp, &mut bytes).is_err() {
        *cached = None;
        bytes.clear();
    }
    StackSnapshot { start: sp, bytes }
}
