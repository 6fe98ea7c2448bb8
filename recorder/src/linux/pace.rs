//! How long the draining thread may wait between drains when the kernel's
//! buffers do not wake it first.
//!
//! Each drain wakes both of the recorder's threads, which on a virtual
//! machine costs on the order of 100 µs of CPU: a target that is mostly
//! idle, or runs little, cost the recorder more in drains every 20 ms
//! than in samples. So the wait is long ([`LONG`]) unless:
//!
//! - the buffers fill fast: the wait is cut so that the fullest ring
//!   would be about [`TARGET_FILL`] full when drained, half of what counts
//!   as falling behind for a 16 MiB ring (see `urgency`; a smaller one
//!   wakes the drain itself a quarter full). A busy thread at 1 kHz fills a
//!   ring with 64 KiB per sample (the kernel keeps room for the whole
//!   copy), so a 16 MiB ring is drained about every 64 ms, with the
//!   three quarters left lasting another 190 ms. (Drains every 20 ms, at
//!   1/16, cost the recorder 1.26-1.33× the CPU per sample at 1 kHz in
//!   steady state: docs/benchmarks.md.) At 10 kHz the kernel wakes the drain half full
//!   first;
//! - a stack copy may be cut short: a copy that stopped at a page its
//!   thread never touched is completed only once the writer thread has
//!   seen it (see `untouched`), and until then every copy of that thread
//!   is cut short too. That happens to threads that have just started or
//!   just called into a function with a large stack buffer, so the writer,
//!   which sees both, asks for short waits ([`SHORT`]) after either, and
//!   ends a long wait already begun: for a second after a copy cut short,
//!   and after a start until it has seen a whole copy of the thread
//!   ([`Watch`]).

use super::sys;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The wait while something may be cut short: 20 ms keeps the copies cut
/// short under 2% of a 1 kHz thread's first second.
pub(crate) const SHORT: Duration = Duration::from_millis(20);
/// The wait otherwise.
pub(crate) const LONG: Duration = Duration::from_millis(100);
/// How long short waits last at most after what asked for them.
const HURRY_FOR_NS: u64 = 1_000_000_000;
/// Started threads remembered before those started longer than
/// [`HURRY_FOR_NS`] ago are looked for and forgotten.
const MAX_STARTED: usize = 1 << 12;
/// How full the fullest kernel ring may get between drains, as the rate
/// it filled at since the last drain goes on.
pub(crate) const TARGET_FILL: f64 = 1.0 / 4.0;

/// Shared by the writer thread, which [`hurry`](Pace::hurry)s, and the
/// draining thread, which asks for its [`interval`](Pace::interval).
#[derive(Debug, Default, Clone)]
pub(crate) struct Pace {
    /// `CLOCK_MONOTONIC` ns until which waits are short.
    short_until: Arc<AtomicU64>,
    /// The eventfd the draining thread's wait also ends on.
    wake: Option<Arc<OwnedFd>>,
}

impl Pace {
    /// A pace that makes `wake` (an eventfd) readable when waits turn
    /// short.
    pub fn waking(wake: Arc<OwnedFd>) -> Pace {
        Pace {
            wake: Some(wake),
            ..Pace::default()
        }
    }

    /// Wait short for a while after `time_ns` (a trace timestamp: a thread
    /// started, a copy was cut short). If waits were long by then, the
    /// current wait ends now.
    pub fn hurry(&self, time_ns: u64) {
        let before = self
            .short_until
            .fetch_max(time_ns.saturating_add(HURRY_FOR_NS), Ordering::Relaxed);
        if before <= time_ns {
            if let Some(wake) = &self.wake {
                sys::eventfd_add(wake);
            }
        }
    }

    /// The longest wait before the next drain at `now_ns`, the last drain
    /// having found the fullest kernel ring `fullest` full (0 to 1) after
    /// `since` without a drain.
    pub fn interval(&self, now_ns: u64, fullest: f64, since: Duration) -> Duration {
        if now_ns < self.short_until.load(Ordering::Relaxed) {
            return SHORT;
        }
        // Per second, of a ring.
        let rate = fullest / since.as_secs_f64().max(1e-6);
        if rate * LONG.as_secs_f64() <= TARGET_FILL {
            return LONG;
        }
        Duration::from_secs_f64(TARGET_FILL / rate).clamp(SHORT, LONG)
    }
}

/// The writer's side of [`Pace`]: short waits while copies may be cut
/// short. A thread that starts (or that the recorder first hears of) may
/// have its first copies cut short: it keeps the waits short until the
/// writer sees a whole copy of it taken later, or it exits, for at most
/// [`HURRY_FOR_NS`]. A copy cut short keeps them short for
/// [`HURRY_FOR_NS`] after it, whole copies or not: a thread with one gap
/// in its stack often shows another soon (a deeper buffer), and each is
/// read only once the writer has seen a copy stop there. (Every start
/// kept the waits short for a second, which in a recording of a few
/// seconds was most of it.)
#[derive(Debug, Default)]
pub(crate) struct Watch {
    pace: Pace,
    /// Thread → trace time (ns) it started at, until its first whole copy.
    started: HashMap<u32, u64>,
    /// Waits stay short until then (trace time, ns) after copies cut short.
    cut_until: u64,
    /// The latest start heard of (kept when its entry leaves `started`):
    /// a second after it, every start in `started` is over.
    newest_start: u64,
}

impl Watch {
    pub fn new(pace: Pace) -> Watch {
        Watch {
            pace,
            ..Watch::default()
        }
    }

    /// Thread `tid` started at `time_ns`, or the recorder heard of it then.
    pub fn started(&mut self, tid: u32, time_ns: u64) {
        if self.started.len() >= MAX_STARTED {
            // Threads never sampled since they started: only exits and
            // whole copies forget them otherwise.
            self.settle(time_ns);
        }
        let since = self.started.entry(tid).or_insert(time_ns);
        *since = (*since).max(time_ns);
        self.newest_start = self.newest_start.max(time_ns);
        self.pace.hurry(time_ns);
    }

    /// A copy of a thread taken at `time_ns` was cut short.
    pub fn cut_short(&mut self, time_ns: u64) {
        self.cut_until = self.cut_until.max(time_ns.saturating_add(HURRY_FOR_NS));
        self.pace.hurry(time_ns);
    }

    /// The kernel copied the stack of `tid` at `time_ns` whole: a copy
    /// taken after the thread started ends its short waits.
    pub fn whole_copy(&mut self, tid: u32, time_ns: u64) {
        if self.started.is_empty() {
            return;
        }
        if time_ns >= self.newest_start.saturating_add(HURRY_FOR_NS) {
            // Threads never sampled since their start (short-lived
            // processes of a system-wide recording): forgotten at once,
            // so that later copies do not look each up. Their waits are
            // over, and `short_until` says so already.
            self.started.clear();
            return;
        }
        if self.started.get(&tid).is_some_and(|&since| time_ns > since) {
            self.started.remove(&tid);
            self.settle(time_ns);
        }
    }

    /// Thread `tid` exited at `time_ns`.
    pub fn exited(&mut self, tid: u32, time_ns: u64) {
        if self.started.remove(&tid).is_some() {
            self.settle(time_ns);
        }
    }

    /// Waits short until a second after the latest start still waiting
    /// for a whole copy, or after the latest copy cut short, whichever is
    /// later (long from now if neither); starts older than a second are
    /// forgotten.
    fn settle(&mut self, now_ns: u64) {
        self.started
            .retain(|_, since| since.saturating_add(HURRY_FOR_NS) > now_ns);
        let until = self
            .started
            .values()
            .map(|since| since.saturating_add(HURRY_FOR_NS))
            .fold(self.cut_until, u64::max);
        self.pace.short_until.store(until, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: (f64, Duration) = (0.0, LONG);

    fn interval(pace: &Pace, now_ns: u64, (fullest, since): (f64, Duration)) -> Duration {
        pace.interval(now_ns, fullest, since)
    }

    #[test]
    fn short_for_a_second_after_each_hurry() {
        let pace = Pace::default();
        assert_eq!(interval(&pace, 5, QUIET), LONG);
        let writer = pace.clone();
        writer.hurry(1_000);
        assert_eq!(interval(&pace, 1_000, QUIET), SHORT);
        assert_eq!(interval(&pace, 1_000 + HURRY_FOR_NS - 1, QUIET), SHORT);
        assert_eq!(interval(&pace, 1_000 + HURRY_FOR_NS, QUIET), LONG);
        // An older event does not shorten a later hurry.
        writer.hurry(3 * HURRY_FOR_NS);
        writer.hurry(HURRY_FOR_NS);
        assert_eq!(interval(&pace, 3 * HURRY_FOR_NS + 1, QUIET), SHORT);
    }

    #[test]
    fn fast_filling_rings_are_drained_before_they_reach_the_target() {
        let pace = Pace::default();
        let ms = Duration::from_millis;
        // A busy thread at 1 kHz: 64 KiB per sample, 1/13 of a 16 MiB
        // ring in 20 ms: a quarter in about 65 ms.
        let wait = interval(&pace, 0, (1.0 / 13.0, ms(20)));
        assert!(wait > ms(60) && wait < ms(70), "{wait:?}");
        // At 10 kHz the target is reached within the short wait.
        assert_eq!(interval(&pace, 0, (10.0 / 13.0, ms(20))), SHORT);
        // A third of the 1 kHz rate: about 200 ms to the target, so the
        // long wait.
        assert_eq!(interval(&pace, 0, (1.0 / 39.0, ms(20))), LONG);
        // A drain right after another does not divide by zero.
        assert_eq!(interval(&pace, 0, (0.5, Duration::ZERO)), SHORT);
    }

    #[test]
    fn a_started_thread_keeps_waits_short_until_a_later_whole_copy() {
        let pace = Pace::default();
        let mut watch = Watch::new(pace.clone());
        let ms = 1_000_000;
        watch.started(7, 10 * ms);
        assert_eq!(interval(&pace, 11 * ms, QUIET), SHORT);
        // A copy taken when the thread started does not end them.
        watch.whole_copy(7, 10 * ms);
        assert_eq!(interval(&pace, 12 * ms, QUIET), SHORT);
        // Another thread's whole copy does not either.
        watch.whole_copy(8, 13 * ms);
        assert_eq!(interval(&pace, 14 * ms, QUIET), SHORT);
        watch.whole_copy(7, 15 * ms);
        assert_eq!(interval(&pace, 16 * ms, QUIET), LONG);
    }

    #[test]
    fn a_copy_cut_short_keeps_waits_short_for_a_second_whole_copies_or_not() {
        let pace = Pace::default();
        let mut watch = Watch::new(pace.clone());
        let ms = 1_000_000;
        watch.started(7, 10 * ms);
        watch.cut_short(12 * ms);
        watch.whole_copy(7, 15 * ms);
        assert_eq!(interval(&pace, 16 * ms, QUIET), SHORT);
        assert_eq!(interval(&pace, 12 * ms + HURRY_FOR_NS - 1, QUIET), SHORT);
        assert_eq!(interval(&pace, 12 * ms + HURRY_FOR_NS, QUIET), LONG);
        // A start heard later and ended by a whole copy leaves the second
        // after the copy cut short as it was.
        watch.cut_short(2 * HURRY_FOR_NS);
        watch.started(9, 2 * HURRY_FOR_NS + ms);
        watch.whole_copy(9, 2 * HURRY_FOR_NS + 2 * ms);
        assert_eq!(interval(&pace, 3 * HURRY_FOR_NS - 1, QUIET), SHORT);
        assert_eq!(interval(&pace, 3 * HURRY_FOR_NS, QUIET), LONG);
    }

    #[test]
    fn waits_stay_short_while_any_started_thread_waits_and_for_at_most_a_second() {
        let pace = Pace::default();
        let mut watch = Watch::new(pace.clone());
        let ms = 1_000_000;
        watch.started(1, 0);
        watch.started(2, 5 * ms);
        watch.started(3, 6 * ms);
        watch.whole_copy(2, 8 * ms);
        assert_eq!(interval(&pace, 9 * ms, QUIET), SHORT);
        // An exit ends a thread's wait too.
        watch.exited(3, 10 * ms);
        assert_eq!(interval(&pace, 11 * ms, QUIET), SHORT);
        // Thread 1 is never sampled: a second after it started, the waits
        // are long again, and it is forgotten then.
        assert_eq!(interval(&pace, HURRY_FOR_NS - 1, QUIET), SHORT);
        assert_eq!(interval(&pace, HURRY_FOR_NS, QUIET), LONG);
        watch.started(4, 2 * HURRY_FOR_NS);
        watch.whole_copy(4, 2 * HURRY_FOR_NS + ms);
        assert!(watch.started.is_empty());
        assert_eq!(interval(&pace, 2 * HURRY_FOR_NS + 2 * ms, QUIET), LONG);
    }

    #[test]
    fn threads_never_sampled_are_forgotten_a_second_after_the_latest_start() {
        let pace = Pace::default();
        let mut watch = Watch::new(pace.clone());
        let ms = 1_000_000;
        watch.started(1, 0);
        watch.started(2, 5 * ms);
        // Another thread's copies before the second is over change
        // nothing.
        watch.whole_copy(3, HURRY_FOR_NS);
        assert_eq!(watch.started.len(), 2);
        assert_eq!(interval(&pace, HURRY_FOR_NS, QUIET), SHORT);
        watch.whole_copy(3, HURRY_FOR_NS + 5 * ms);
        assert!(watch.started.is_empty());
        assert_eq!(interval(&pace, HURRY_FOR_NS + 5 * ms, QUIET), LONG);
        // A later start waits for its whole copy as before.
        watch.started(4, 2 * HURRY_FOR_NS);
        watch.whole_copy(3, 2 * HURRY_FOR_NS + ms);
        assert_eq!(interval(&pace, 2 * HURRY_FOR_NS + 2 * ms, QUIET), SHORT);
        watch.whole_copy(4, 2 * HURRY_FOR_NS + 3 * ms);
        assert_eq!(interval(&pace, 2 * HURRY_FOR_NS + 4 * ms, QUIET), LONG);
    }

    #[test]
    fn threads_never_sampled_are_forgotten_when_many() {
        let mut watch = Watch::default();
        for tid in 0..MAX_STARTED as u32 {
            watch.started(tid, u64::from(tid));
        }
        assert_eq!(watch.started.len(), MAX_STARTED);
        watch.started(u32::MAX, 2 * HURRY_FOR_NS);
        assert_eq!(watch.started.len(), 1);
    }

    #[test]
    fn the_first_whole_copies_end_the_short_waits_of_the_start() {
        // The recording's start asks for short waits before the writer
        // has heard of any thread; once the threads it hears of have had
        // a whole copy, the waits are long.
        let pace = Pace::default();
        pace.hurry(0);
        let mut watch = Watch::new(pace.clone());
        let ms = 1_000_000;
        assert_eq!(interval(&pace, ms, QUIET), SHORT);
        // A copy of a thread not at risk changes nothing.
        watch.whole_copy(9, 2 * ms);
        assert_eq!(interval(&pace, 3 * ms, QUIET), SHORT);
        watch.started(9, 4 * ms);
        watch.whole_copy(9, 5 * ms);
        assert_eq!(interval(&pace, 6 * ms, QUIET), LONG);
    }

    #[test]
    fn turning_short_ends_the_wait() {
        let wake = Arc::new(sys::eventfd().unwrap());
        let pace = Pace::waking(Arc::clone(&wake));
        let readable = || {
            let ready = sys::poll_readable(&[std::os::fd::AsRawFd::as_raw_fd(&*wake)], 0);
            !ready.unwrap().is_empty()
        };
        pace.hurry(1_000);
        assert!(readable());
        sys::eventfd_reset(&wake);
        // Already short: the wait is short anyway.
        pace.hurry(2_000);
        assert!(!readable());
        // Waits turned long again at 2_000 + HURRY_FOR_NS.
        pace.hurry(2_000 + HURRY_FOR_NS);
        assert!(readable());
    }
}
