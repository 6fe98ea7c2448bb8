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
//!   which sees both, asks for short waits ([`SHORT`]) for a while after
//!   either, and ends a long wait already begun.

use super::sys;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The wait while something may be cut short: 20 ms keeps the copies cut
/// short under 2% of a 1 kHz thread's first second.
pub(crate) const SHORT: Duration = Duration::from_millis(20);
/// The wait otherwise.
pub(crate) const LONG: Duration = Duration::from_millis(100);
/// How long short waits last after what asked for them.
const HURRY_FOR_NS: u64 = 1_000_000_000;
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
