//! When to stop: a token the caller holds, or a duration.
//!
//! The library installs no signal handler. A caller that wants Ctrl-C to
//! stop a recording catches the signal itself and calls [`StopToken`]'s
//! methods (from a normal thread: they take a lock, so not from inside a
//! signal handler). `lrnprof-rec` does exactly that.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Every recorded process exited.
    TargetExited,
    /// The caller stopped it because the process got this signal
    /// ([`StopRequest::signal`]; SIGINT for Ctrl-C, SIGTERM).
    Signal(i32),
    /// The requested duration passed.
    Duration,
    /// The caller stopped it ([`StopToken::stop`]).
    Stopped,
}

/// How to stop, for [`StopToken::stop_with`]. `StopRequest::default()` is
/// what [`StopToken::stop`] asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopRequest {
    /// The signal that made the caller stop, if any: the summary's stop
    /// reason is then [`StopReason::Signal`] instead of
    /// [`StopReason::Stopped`].
    pub signal: Option<i32>,
    /// Kill a launched command (SIGKILL) and wait for it, so the summary
    /// has its exit status. Otherwise it keeps running, as after
    /// [`RecordOptions::duration`](crate::RecordOptions::duration). Has no
    /// effect on a process attached to by pid.
    pub kill_target: bool,
}

/// Stops a recording from another thread, and passes signals on to a
/// launched command. Cheap to clone; every clone controls the same
/// recording.
///
/// Give one token to [`record`](crate::record) and keep a clone. Once
/// stopped, a token stays stopped: a recording started with it stops as
/// soon as it has started. Use a new token for each recording.
///
/// ```
/// use lrnprof_recorder::{StopRequest, StopToken};
/// let token = StopToken::new();
/// let for_ctrl_c = token.clone();
/// // ... on Ctrl-C, from a thread that watches for it:
/// for_ctrl_c.stop_with(StopRequest { signal: Some(2), kill_target: false });
/// assert!(token.is_stopped());
/// ```
#[derive(Clone, Default)]
pub struct StopToken {
    shared: Arc<Mutex<Requests>>,
}

/// What the caller asked for and the recording has not acted on yet.
#[derive(Default)]
struct Requests {
    stop: Option<StopRequest>,
    /// Signals to pass on to the launched command, oldest first.
    signals: Vec<i32>,
    /// Interrupts the backend's wait for data, so requests are seen at
    /// once; set while a recording runs.
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl fmt::Debug for StopToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let requests = self.lock();
        f.debug_struct("StopToken")
            .field("stop", &requests.stop)
            .field("signals", &requests.signals)
            .finish_non_exhaustive()
    }
}

impl StopToken {
    /// A token nothing has stopped yet.
    pub fn new() -> StopToken {
        StopToken::default()
    }

    /// Stop recording: [`record`](crate::record) finishes the trace and
    /// returns with [`StopReason::Stopped`]. A launched command keeps
    /// running.
    pub fn stop(&self) {
        self.stop_with(StopRequest::default());
    }

    /// Stop recording as `request` says. If the recording was already
    /// asked to stop, the first request's signal is kept, and the command
    /// is killed if either request says so (until the recording has acted
    /// on the first one).
    pub fn stop_with(&self, request: StopRequest) {
        let mut requests = self.lock();
        let merged = match requests.stop {
            Some(first) => StopRequest {
                signal: first.signal.or(request.signal),
                kill_target: first.kill_target || request.kill_target,
            },
            None => request,
        };
        requests.stop = Some(merged);
        wake(&requests);
    }

    /// Send `signal` to the launched command, which goes on being recorded
    /// (it may exit, and then the recording ends). A signal sent before the
    /// command has started is delivered as soon as it has. Does nothing when
    /// recording a process attached to by pid, or once the command has
    /// exited.
    pub fn signal_target(&self, signal: i32) {
        let mut requests = self.lock();
        requests.signals.push(signal);
        wake(&requests);
    }

    /// Whether [`stop`](Self::stop) or [`stop_with`](Self::stop_with) has
    /// been called.
    pub fn is_stopped(&self) -> bool {
        self.lock().stop.is_some()
    }

    /// The stop request, if any (it stays), and the signals to pass on
    /// since the last call (they are taken).
    pub(crate) fn take(&self) -> (Option<StopRequest>, Vec<i32>) {
        let mut requests = self.lock();
        (requests.stop, std::mem::take(&mut requests.signals))
    }

    /// Call `wake` on every request until the guard is dropped.
    pub(crate) fn wake_with(&self, wake: Arc<dyn Fn() + Send + Sync>) -> WakeGuard<'_> {
        self.lock().wake = Some(wake);
        WakeGuard { token: self }
    }

    fn lock(&self) -> MutexGuard<'_, Requests> {
        // The lock is never held across anything that can panic; a
        // poisoned one still holds consistent requests.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn wake(requests: &Requests) {
    if let Some(wake) = &requests.wake {
        wake();
    }
}

/// Unregisters a [`StopToken::wake_with`] callback on drop.
pub(crate) struct WakeGuard<'a> {
    token: &'a StopToken,
}

impl Drop for WakeGuard<'_> {
    fn drop(&mut self) {
        self.token.lock().wake = None;
    }
}

/// A sleep that [`StopToken`] requests cut short, for backends that wait
/// with a timeout rather than on file descriptors.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
#[derive(Default)]
pub(crate) struct Wakeup {
    woken: Mutex<bool>,
    changed: Condvar,
}

#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
impl Wakeup {
    /// End the current or next [`sleep`](Self::sleep).
    pub fn wake(&self) {
        *self.lock() = true;
        self.changed.notify_all();
    }

    /// Sleep until woken or `timeout` passes.
    pub fn sleep(&self, timeout: Duration) {
        let woken = self.lock();
        let (mut woken, _) = self
            .changed
            .wait_timeout_while(woken, timeout, |woken| !*woken)
            .unwrap_or_else(|e| e.into_inner());
        *woken = false;
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        self.woken.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// When recording started and when `--duration` ends it.
pub(crate) struct Deadline {
    started: Instant,
    deadline: Option<Instant>,
}

impl Deadline {
    /// Start the clock.
    pub fn start(duration: Option<Duration>) -> Deadline {
        let started = Instant::now();
        Deadline {
            started,
            deadline: duration.map(|d| started + d),
        }
    }

    /// When recording started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether the duration has passed.
    pub fn passed(&self) -> bool {
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

impl StopRequest {
    /// The stop reason this request leads to.
    pub(crate) fn reason(&self) -> StopReason {
        self.signal.map_or(StopReason::Stopped, StopReason::Signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_first_signal_is_kept_and_kill_requests_add_up() {
        let token = StopToken::new();
        assert!(!token.is_stopped());
        token.stop_with(StopRequest {
            signal: Some(15),
            kill_target: false,
        });
        token.stop_with(StopRequest {
            signal: Some(2),
            kill_target: true,
        });
        assert!(token.is_stopped());
        let (stop, signals) = token.take();
        let stop = stop.unwrap();
        assert_eq!(stop.reason(), StopReason::Signal(15));
        assert!(stop.kill_target);
        assert!(signals.is_empty());
        // A stopped token stays stopped.
        assert_eq!(token.take().0, Some(stop));
    }

    #[test]
    fn signals_for_the_target_are_taken_once_in_order() {
        let token = StopToken::new();
        token.signal_target(15);
        token.clone().signal_target(2);
        assert_eq!(token.take(), (None, vec![15, 2]));
        assert_eq!(token.take(), (None, vec![]));
        token.stop();
        assert_eq!(
            token.take().0.map(|s| s.reason()),
            Some(StopReason::Stopped)
        );
    }

    #[test]
    fn requests_wake_the_recording_while_it_is_registered() {
        let token = StopToken::new();
        let woken = Arc::new(AtomicUsize::new(0));
        {
            let count = Arc::clone(&woken);
            let _guard = token.wake_with(Arc::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }));
            token.signal_target(15);
            token.stop();
            assert_eq!(woken.load(Ordering::SeqCst), 2);
        }
        token.stop();
        assert_eq!(woken.load(Ordering::SeqCst), 2, "woken after unregistering");
    }

    #[test]
    fn a_wakeup_ends_the_next_sleep_at_once() {
        let wakeup = Wakeup::default();
        wakeup.wake();
        let started = Instant::now();
        // Would wait two minutes if the wake were lost.
        wakeup.sleep(Duration::from_secs(120));
        assert!(started.elapsed() < Duration::from_secs(60));
        // Consumed: the next sleep runs to its timeout.
        wakeup.sleep(Duration::ZERO);
    }

    #[test]
    fn a_deadline_bounds_timeouts() {
        let none = Deadline::start(None);
        assert!(!none.passed());
        assert_eq!(none.timeout(Duration::from_secs(1)), Duration::from_secs(1));
        let past = Deadline::start(Some(Duration::ZERO));
        assert!(past.passed());
        assert_eq!(past.timeout(Duration::from_secs(1)), Duration::ZERO);
    }
}
