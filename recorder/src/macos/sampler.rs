//! The sampling thread: runs [`ThreadSampler`] rounds at the requested
//! rate against the target task, and hands the records to the writer.

use super::regs_native;
use super::sys::{self, MachClock, Port, Suspended, ThreadList};
use crate::error::RecordError;
use crate::macho::{FileToEmbed, Images, TaskMemory, TaskThreads, ThreadSampler};
use crate::sink::SinkSender;
use lrnprof_format::{Pid, Record, Regs, Timestamp};
use lrnprof_image::EmbedLevel;
use mach2::mach_types::thread_act_t;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The target task as the sampling rounds see it.
struct Task {
    port: Port,
    clock: MachClock,
}

impl TaskMemory for Task {
    fn read(&self, address: u64, buf: &mut [u8]) -> bool {
        sys::read_memory(&self.port, address, buf).is_ok()
    }

    fn all_image_infos_address(&self) -> Result<u64, RecordError> {
        sys::dyld_all_image_infos_address(&self.port)
            .map_err(|code| sys::kern_error("task_info(TASK_DYLD_INFO)", code))
    }
}

impl TaskThreads for Task {
    type Thread = thread_act_t;
    type List = ThreadList;

    fn threads(&self) -> Option<ThreadList> {
        // task_threads fails only on a task that is gone (whatever the
        // code: dead port, terminated task).
        sys::threads_of(&self.port).ok()
    }

    fn thread_id(&self, thread: thread_act_t) -> Option<u64> {
        sys::thread_id(thread).ok()
    }

    fn cpu_time_ns(&self, thread: thread_act_t) -> Option<u64> {
        sys::thread_cpu_time_ns(thread).ok()
    }

    fn thread_name(&self, thread: thread_act_t) -> Option<String> {
        sys::thread_name(thread)
    }

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn while_stopped<R>(
        &self,
        thread: thread_act_t,
        copy: impl FnOnce(&Regs) -> R,
    ) -> Option<(u64, Regs, R)> {
        // The guard resumes the thread on every path out of here.
        let suspended = Suspended::new(thread).ok()?;
        let time = self.clock.now_ns();
        let regs = regs_native::read_regs(&suspended).ok()?;
        let copied = copy(&regs);
        drop(suspended);
        Some((time, regs, copied))
    }

    fn region_containing(&self, address: u64) -> Option<(u64, u64)> {
        sys::region_containing(&self.port, address)
    }
}

/// What the sampler hands back when it stops.
#[derive(Debug, Default)]
pub(super) struct SamplerTotals {
    /// Image files samples touched, to embed now that sampling is over.
    pub files: Vec<FileToEmbed>,
}

/// The sampling thread's state.
pub(super) struct Sampler {
    task: Task,
    period: Duration,
    rounds: ThreadSampler,
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
        let period = Duration::from_nanos(1_000_000_000 / u64::from(frequency_hz.max(1)));
        Sampler {
            task: Task { port: task, clock },
            period,
            rounds: ThreadSampler::new(
                pid,
                period.as_nanos() as u64,
                stack_size,
                regs_native::CPU_TYPE,
                Images::new(pid, embed),
            ),
        }
    }

    /// Sample until `stop` is set or the task goes away (then
    /// `target_gone` is set).
    pub fn run(
        mut self,
        sink: SinkSender<Record>,
        stop: Arc<AtomicBool>,
        target_gone: Arc<AtomicBool>,
    ) -> Result<SamplerTotals, RecordError> {
        let mut out = Vec::new();
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let alive = self.rounds.round(&self.task, &mut out)?;
            for r in out.drain(..) {
                sink.send(r)?;
            }
            if !alive {
                target_gone.store(true, Ordering::Relaxed);
                break;
            }
            // Fixed-rate schedule; rounds missed while we were slow are
            // dropped rather than run back to back.
            next += self.period;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        self.rounds
            .flush_idle(Timestamp(self.task.now_ns()), &mut out);
        for r in out.drain(..) {
            sink.send(r)?;
        }
        Ok(SamplerTotals {
            files: self.rounds.images.take_files(),
        })
    }
}
