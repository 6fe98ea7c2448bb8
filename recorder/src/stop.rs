//! When to stop: Ctrl-C / SIGTERM, or a duration.

use crate::error::RecordError;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The last stop signal received (0: none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    // Only async-signal-safe work here: one atomic store.
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

/// Why recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Every recorded process exited.
    TargetExited,
    /// The recorder got this signal (SIGINT for Ctrl-C, SIGTERM).
    Signal(i32),
    /// The requested duration passed.
    Duration,
}

/// Catches SIGINT and SIGTERM for as long as it lives and knows the
/// deadline; restores the previous handlers on drop.
pub(crate) struct StopWatch {
    started: Instant,
    deadline: Option<Instant>,
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl StopWatch {
    /// Install the handlers and start the clock.
    pub fn start(duration: Option<Duration>) -> Result<StopWatch, RecordError> {
        STOP_SIGNAL.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        for signal in [libc::SIGINT, libc::SIGTERM] {
            previous.push((
                signal,
                install(signal, on_stop_signal as *const () as libc::sighandler_t)?,
            ));
        }
        let started = Instant::now();
        Ok(StopWatch {
            started,
            deadline: duration.map(|d| started + d),
            previous,
        })
    }

    /// When recording started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// A signal received since the last call, if any.
    pub fn take_signal(&self) -> Option<i32> {
        match STOP_SIGNAL.swap(0, Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Whether the duration has passed.
    pub fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// How long until the deadline (for poll timeouts), at most `max`.
    pub fn timeout(&self, max: Duration) -> Duration {
        match self.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(max),
            None => max,
        }
    }
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        for (signal, action) in self.previous.drain(..) {
            // Safety: restores an action previously returned by sigaction.
            unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
        }
    }
}

fn install(
    signal: libc::c_int,
    handler: libc::sighandler_t,
) -> Result<libc::sigaction, RecordError> {
    // Safety: zeroed sigaction is a valid "no flags, empty mask" value; the
    // handler only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        libc::sigemptyset(&mut action.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, &action, &mut old) != 0 {
            return Err(RecordError::last_os(format!("sigaction({signal})")));
        }
        Ok(old)
    }
}
