//! When the recorder's threads run ahead of the target's.
//!
//! With many busy target threads on few CPUs, a recorder at normal
//! priority gets too little CPU to drain the rings in time, and samples
//! are lost. At real-time priority, though, every drain preempts the
//! program at once on whatever core it runs, and on a loaded machine the
//! program pays for refilling the caches the recorder evicted (measured
//! on an allocation-heavy program: docs/benchmarks.md). So the draining
//! thread and the writer run at their normal priority while they can
//! keep up there, and are raised (real-time where permitted, else nice
//! -10) from the first sign that they cannot until none has been seen for
//! [`CALM`]. The signs:
//!
//! - The recorder uses more than [`FAIR_SHARE_USE`] of the CPU a thread
//!   at normal priority can count on: the machine's CPUs shared among the
//!   threads ready to run (`/proc/loadavg`), measured every [`WINDOW`].
//!   Past its fair share the scheduler lets it wait for long stretches
//!   (hundreds of milliseconds with 600 busy target threads), and the
//!   rings overflow before a drain could see them fill.
//! - A kernel ring found more than half full when drained (a small one:
//!   an eighth, see [`kernel_ring_fraction`]), or the allocation
//!   sampler's more than half. The drains are paced to find a ring about
//!   a quarter full (see `pace`); at 10 kHz with 64 KiB stack copies the
//!   kernel wakes the drain at half (see `RingPlan::wakeup_bytes`), and
//!   the threads stay raised. The allocation sampler's ring is small on
//!   purpose (it stays in the caches) and holds about 50 ms of the
//!   busiest allocator measured: a drain finds up to 40% of it, and a
//!   full one makes allocating threads wait, not lose records.
//! - Drains more than [`LATE`] later than the wait asked for (see
//!   `pace`): the draining thread did not get a CPU in time, or waited
//!   for the writer (whose lag blocks it).

use super::attr;
use super::procfs;
use super::sys::{self, Scheduling};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the rings must keep up before the threads go back to normal.
pub(crate) const CALM: Duration = Duration::from_secs(1);

/// How often the recorder's CPU use is compared with its fair share.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);

/// The part of its fair share of CPU the recorder may use at normal
/// priority.
pub(crate) const FAIR_SHARE_USE: f64 = 0.75;

/// Whether a recorder that used `cpu` of CPU time in `wall` needs more
/// than [`FAIR_SHARE_USE`] of its fair share of `cpus` CPUs shared by
/// `running` threads.
pub(crate) fn over_fair_share(cpu: Duration, wall: Duration, cpus: usize, running: u32) -> bool {
    let used = cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9);
    let share = cpus as f64 / f64::from(running.max(1));
    used > FAIR_SHARE_USE * share
}

/// Drains further apart than the wait asked for by more than this mean
/// the draining thread did not get a CPU when it asked, or waited for the
/// writer.
pub(crate) const LATE: Duration = Duration::from_millis(30);

/// The part of a kernel ring of `ring_bytes` past which it is behind
/// (the samples that overflow it are lost), as `1 / fraction`. A ring
/// that wakes the draining thread half full (see `RingPlan::wakeup_bytes`)
/// is drained about a quarter full (see `pace`), so one found more than
/// half full was drained late by as much again, or woke the drain itself
/// (at 10 kHz). A smaller ring (a user held to `perf_event_mlock_kb`: 32
/// copies) wakes it a quarter full and is behind past an eighth, that is
/// at every drain that finds samples in it.
pub(crate) fn kernel_ring_fraction(ring_bytes: usize) -> usize {
    if ring_bytes >= attr::HALF_FULL_WAKE_MIN {
        2
    } else {
        8
    }
}
/// The allocation sampler's ring is behind once more than `1 /
/// HEAP_RING_FRACTION` of it is full (a sampler finding it full waits).
pub(crate) const HEAP_RING_FRACTION: usize = 2;

/// Whether `pending` bytes of a ring of `size` mean the drain is behind,
/// at `1 / fraction` full.
pub(crate) fn behind(pending: usize, size: usize, fraction: usize) -> bool {
    pending > size / fraction
}

/// The scheduling of the draining thread (the one that made it) and of
/// the writer thread (once it has said who it is).
pub(crate) struct Urgency {
    drainer: i32,
    /// The writer thread's id, 0 until it starts.
    writer: Arc<AtomicI32>,
    /// The draining thread's scheduling as found, given back to both.
    normal: Option<Scheduling>,
    /// Whether raising is permitted at all (found out at the first try).
    permitted: bool,
    /// Since when the threads are raised, and the writer with them.
    raised: Option<Raised>,
    last_behind: Instant,
    last_drain: Instant,
    /// The current window: when it began, and the recorder's CPU time then.
    window: (Instant, u64),
    cpus: usize,
    /// Raised for the whole recording.
    always: bool,
}

struct Raised {
    writer: bool,
}

impl Urgency {
    /// For the calling (draining) thread and the writer thread that
    /// will store its id in `writer`; raised at once (attaching to
    /// thousands of busy threads must not wait for CPU) until the rings
    /// have kept up for [`CALM`], or with `always` for the whole
    /// recording.
    pub fn new(writer: Arc<AtomicI32>, always: bool) -> Urgency {
        let normal = Scheduling::of_this_thread();
        let mut u = Urgency {
            drainer: sys::thread_id(),
            writer,
            // Already real-time (the user's choice): left alone.
            permitted: normal.is_some_and(|n| n.is_normal()),
            normal,
            raised: None,
            last_behind: Instant::now(),
            last_drain: Instant::now(),
            window: (Instant::now(), sys::process_cpu_ns()),
            cpus: sys::cpu_count(),
            always,
        };
        u.raise();
        u
    }

    /// After a drain: whether anything was found behind, and the longest
    /// the draining thread meant to wait since the last drain.
    pub fn drained(&mut self, behind: bool, waited_at_most: Duration) {
        let now = Instant::now();
        let late = now.duration_since(self.last_drain) > waited_at_most + LATE;
        self.last_drain = now;
        let busy = self.permitted && !self.always && self.over_fair_share(now);
        self.decide(now, self.always || behind || late || busy);
    }

    /// Raise at a sign of falling behind, lower after [`CALM`] without one.
    fn decide(&mut self, now: Instant, behind: bool) {
        if behind {
            self.last_behind = now;
            self.raise();
        } else if self.raised.is_some() {
            if now.duration_since(self.last_behind) >= CALM {
                self.lower();
            } else {
                // A writer that started after the raise is raised too.
                self.raise();
            }
        }
    }

    /// Whether the threads are raised now.
    #[cfg(test)]
    pub fn raised(&self) -> bool {
        self.raised.is_some()
    }

    /// At the end of each window: whether the recorder used more than it
    /// can count on at normal priority.
    fn over_fair_share(&mut self, now: Instant) -> bool {
        let (began, cpu_then) = self.window;
        let wall = now.duration_since(began);
        if wall < WINDOW {
            return false;
        }
        let cpu_now = sys::process_cpu_ns();
        self.window = (now, cpu_now);
        let cpu = Duration::from_nanos(cpu_now.saturating_sub(cpu_then));
        procfs::running_threads()
            .is_some_and(|running| over_fair_share(cpu, wall, self.cpus, running))
    }

    fn raise(&mut self) {
        if !self.permitted {
            return;
        }
        let writer = self.writer.load(Ordering::Acquire);
        match &mut self.raised {
            None => {
                let nice = self.normal.map_or(0, |n| n.nice());
                if !sys::raise_thread(self.drainer, nice) {
                    self.permitted = false;
                    return;
                }
                let writer = writer != 0 && sys::raise_thread(writer, nice);
                self.raised = Some(Raised { writer });
            }
            Some(r) if !r.writer && writer != 0 => {
                let nice = self.normal.map_or(0, |n| n.nice());
                r.writer = sys::raise_thread(writer, nice);
            }
            Some(_) => {}
        }
    }

    fn lower(&mut self) {
        let (Some(raised), Some(normal)) = (self.raised.take(), self.normal) else {
            return;
        };
        normal.apply(self.drainer);
        if raised.writer {
            normal.apply(self.writer.load(Ordering::Acquire));
        }
    }
}

impl Drop for Urgency {
    fn drop(&mut self) {
        // Sampling is over: the last drain, and embedding (reading and
        // compressing image sections), run at normal priority.
        self.lower();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_behind_past_its_fraction() {
        let large = 16 << 20;
        let large_fraction = kernel_ring_fraction(large);
        assert!(!behind(0, large, large_fraction));
        assert!(!behind(large / 2, large, large_fraction));
        assert!(behind(large / 2 + 1, large, large_fraction));
        let small = 256 << 10;
        let small_fraction = kernel_ring_fraction(small);
        assert!(!behind(small / 8, small, small_fraction));
        assert!(behind(small / 8 + 1, small, small_fraction));
        assert!(!behind(2048, 4096, HEAP_RING_FRACTION));
        assert!(behind(2049, 4096, HEAP_RING_FRACTION));
    }

    #[test]
    fn always_raised_stays_raised_until_dropped() {
        let before = Scheduling::of_this_thread().unwrap();
        let mut u = Urgency::new(Arc::new(AtomicI32::new(0)), true);
        let permitted = u.raised();
        u.last_behind = Instant::now() - CALM;
        u.drained(false, Duration::from_millis(20));
        assert_eq!(u.raised(), permitted);
        drop(u);
        assert!(Scheduling::of_this_thread().unwrap().same_as(&before));
    }

    #[test]
    fn the_fair_share_is_the_cpus_shared_by_the_threads_ready_to_run() {
        let ms = Duration::from_millis;
        // 12% of a CPU on 2 CPUs with 8 threads ready: a share of 25%.
        assert!(!over_fair_share(ms(12), ms(100), 2, 8));
        // 6% among 600 busy threads: a share of 0.33%.
        assert!(over_fair_share(ms(6), ms(100), 2, 600));
        assert!(over_fair_share(ms(20), ms(100), 2, 8));
        assert!(!over_fair_share(ms(0), ms(0), 2, 0));
    }

    /// As root the threads really change scheduling; elsewhere raising is
    /// refused and nothing changes, which is checked too.
    #[test]
    fn raised_while_behind_and_back_to_normal_when_calm() {
        let before = Scheduling::of_this_thread().unwrap();
        let writer = Arc::new(AtomicI32::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let w = writer.clone();
        let writer_thread = std::thread::spawn(move || {
            w.store(sys::thread_id(), Ordering::Release);
            tx.send(()).unwrap();
            stop_rx.recv().unwrap();
            Scheduling::of_this_thread().unwrap()
        });
        rx.recv().unwrap();
        let mut u = Urgency::new(writer.clone(), false);
        let permitted = u.raised();
        if permitted {
            let now = Scheduling::of_this_thread().unwrap();
            assert!(!now.is_normal() || now.nice() < before.nice());
        }
        // Behind again and again: stays raised.
        u.decide(Instant::now(), true);
        assert_eq!(u.raised(), permitted);
        // Calm, but not for long enough yet.
        u.decide(Instant::now(), false);
        assert_eq!(u.raised(), permitted);
        // Calm since CALM ago.
        u.last_behind = Instant::now() - CALM;
        u.decide(Instant::now(), false);
        assert!(!u.raised());
        let after = Scheduling::of_this_thread().unwrap();
        assert!(after.same_as(&before));
        // Still calm: stays normal.
        u.decide(Instant::now(), false);
        assert!(!u.raised());
        // Behind: raised again, the writer with it.
        u.decide(Instant::now(), true);
        assert_eq!(u.raised(), permitted);
        let writer_now = Scheduling::of_thread(writer.load(Ordering::Acquire)).unwrap();
        assert_eq!(!writer_now.same_as(&before), permitted);
        drop(u);
        assert!(Scheduling::of_this_thread().unwrap().same_as(&before));
        stop_tx.send(()).unwrap();
        let writer_end = writer_thread.join().unwrap();
        assert!(writer_end.same_as(&before));
    }
}
