//! `lrnprof-library-user`: a program with its own SIGINT handler that
//! records a child with the recorder library, for the end-to-end test
//! `record::as_library`.
//!
//! `lrnprof-library-user TRACE` launches a shell that spins until this
//! program exits, records it into TRACE, and while samples arrive checks
//! that its SIGINT handler and SIGTERM disposition are still the ones it
//! set, and that a SIGINT raised in it reaches its handler and does not
//! stop the recording. It then stops the recording through the token
//! (killing the shell), checks the same again, and prints what it found
//! on stdout as `key=value` lines for the test to judge. It writes
//! nothing to stderr unless it fails, so anything there came from the
//! library.

use lrnprof_recorder::{
    record, RecordOptions, RecordStatus, RecordWarning, Reporter, StopRequest, StopToken,
    TargetSpec,
};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// SIGINTs this program's handler has seen.
static SIGINTS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigint(_signal: libc::c_int) {
    SIGINTS.fetch_add(1, Ordering::SeqCst);
}

/// The failure bound of every wait: far beyond what a loaded machine needs.
const PATIENCE: Duration = Duration::from_secs(60);

/// Hands statuses to the thread that decides when to stop; keeps warnings.
struct Relay {
    /// `None` once recording has returned, which ends the control
    /// thread's wait if it never saw enough samples.
    statuses: Mutex<Option<Sender<RecordStatus>>>,
    warnings: Mutex<Vec<String>>,
}

impl Reporter for Relay {
    fn status(&self, status: &RecordStatus) {
        if let Some(tx) = &*lock(&self.statuses) {
            let _ = tx.send(status.clone());
        }
    }

    fn warning(&self, warning: &RecordWarning) {
        lock(&self.warnings).push(warning.to_string());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lrnprof-library-user: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let out = std::env::args_os()
        .nth(1)
        .ok_or("usage: lrnprof-library-user TRACE")?;
    install_sigint_handler()?;
    let sigterm_before = disposition(libc::SIGTERM)?;

    let token = StopToken::new();
    let (tx, rx) = channel();
    let relay = Relay {
        statuses: Mutex::new(Some(tx)),
        warnings: Mutex::new(Vec::new()),
    };
    let options = RecordOptions {
        // Spins until this program is gone, so a failed run leaves no
        // busy process behind.
        target: TargetSpec::Command(
            [
                "/bin/sh",
                "-c",
                "while kill -0 $PPID 2>/dev/null; do :; done",
            ]
            .iter()
            .map(Into::into)
            .collect(),
        ),
        out: out.into(),
        ..Default::default()
    };
    let (summary, during) = std::thread::scope(|scope| {
        let control = {
            let token = &token;
            scope.spawn(move || check_while_recording(&rx, token, sigterm_before))
        };
        let summary = record(&options, &token, &relay);
        lock(&relay.statuses).take();
        let during = control
            .join()
            .map_err(|_| "the control thread panicked".to_string());
        (summary, during)
    });
    let summary = summary.map_err(|e| format!("recording failed: {e}"))?;
    let during = during??;

    let handler_after = handler_is_ours(libc::SIGINT)?;
    let sigterm_after = disposition(libc::SIGTERM)? == sigterm_before;
    raise_sigint()?;
    println!("handler_during_recording={}", yes(during.handler));
    println!("sigterm_unchanged_during_recording={}", yes(during.sigterm));
    println!("samples_after_own_sigint={}", during.samples_after);
    println!("handler_after_recording={}", yes(handler_after));
    println!("sigterm_unchanged_after_recording={}", yes(sigterm_after));
    println!("sigints_handled={}", SIGINTS.load(Ordering::SeqCst));
    println!("stop_reason={:?}", summary.stop_reason);
    println!("target_exit={:?}", summary.target_exit);
    println!("samples={}", summary.samples);
    for w in lock(&relay.warnings).iter() {
        println!("warning={w}");
    }
    Ok(())
}

/// What the control thread saw while the recording ran.
struct During {
    handler: bool,
    sigterm: bool,
    samples_after: u64,
}

/// Wait for samples, check the signal dispositions, raise a SIGINT, wait
/// for more samples (the recording went on), then stop it.
fn check_while_recording(
    statuses: &Receiver<RecordStatus>,
    token: &StopToken,
    sigterm_before: libc::sighandler_t,
) -> Result<During, String> {
    let stop_on_exit = StopOnDrop(token);
    let before = wait_for_samples_above(statuses, 0)?;
    let handler = handler_is_ours(libc::SIGINT)?;
    let sigterm = disposition(libc::SIGTERM)? == sigterm_before;
    raise_sigint()?;
    let samples_after = wait_for_samples_above(statuses, before)?;
    drop(stop_on_exit);
    Ok(During {
        handler,
        sigterm,
        samples_after,
    })
}

/// Stops the recording however the control thread ends, so it never runs
/// on after a failed check.
struct StopOnDrop<'a>(&'a StopToken);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop_with(StopRequest {
            signal: None,
            kill_target: true,
        });
    }
}

/// Samples written once a status reports more than `than`.
fn wait_for_samples_above(statuses: &Receiver<RecordStatus>, than: u64) -> Result<u64, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let status = statuses
            .recv_timeout(left)
            .map_err(|e| format!("no status with more than {than} samples: {e}"))?;
        if status.samples > than {
            return Ok(status.samples);
        }
    }
}

fn install_sigint_handler() -> Result<(), String> {
    // Safety: a zeroed sigaction is a valid "no flags, empty mask" value;
    // the handler only adds to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigint as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut()) != 0 {
            return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The installed handler (or SIG_DFL / SIG_IGN) of `signal`.
fn disposition(signal: libc::c_int) -> Result<libc::sighandler_t, String> {
    // Safety: a null new action only queries; `old` is a valid sigaction.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
            return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
        }
        Ok(old.sa_sigaction)
    }
}

fn handler_is_ours(signal: libc::c_int) -> Result<bool, String> {
    Ok(disposition(signal)? == on_sigint as *const () as libc::sighandler_t)
}

/// Send SIGINT to this thread; the handler has run when this returns.
fn raise_sigint() -> Result<(), String> {
    let before = SIGINTS.load(Ordering::SeqCst);
    // Safety: raise has no memory preconditions.
    if unsafe { libc::raise(libc::SIGINT) } != 0 {
        return Err(format!("raise: {}", std::io::Error::last_os_error()));
    }
    // A signal raised in an unblocking thread is handled before raise returns.
    if SIGINTS.load(Ordering::SeqCst) == before {
        return Err("the SIGINT handler did not run".into());
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
