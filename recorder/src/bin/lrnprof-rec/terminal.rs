//! `lrnprof-rec`'s stderr while recording: warnings, and on a terminal a
//! status line redrawn with each status the library reports.
//!
//! The library reports from the thread that drains the sample buffers, and
//! a write to a terminal can block (Ctrl-S, a slow connection), so status
//! lines are drawn by a thread of their own; the reporter only hands the
//! latest status over.

use lrnprof_recorder::{RecordStatus, RecordWarning, Reporter};
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Clears the line the cursor is on.
const CLEAR_LINE: &str = "\r\x1b[K";

/// The [`Reporter`] of `lrnprof-rec`. Dropping it stops the status line and
/// clears it.
pub struct Terminal {
    shared: Arc<Shared>,
    drawer: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    latest: Mutex<Latest>,
    changed: Condvar,
    /// Whether a status line is on the screen; held while writing.
    screen: Mutex<bool>,
}

#[derive(Default)]
struct Latest {
    status: Option<RecordStatus>,
    done: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; the data stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Terminal {
    /// Print warnings to stderr, and draw a status line if `status_line`
    /// (stderr is a terminal).
    pub fn start(status_line: bool) -> Terminal {
        let shared = Arc::new(Shared::default());
        let drawer = status_line
            .then(|| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name("lrnprof-status".into())
                    .spawn(move || draw(&shared))
                    // Without a thread, no status line: recording matters more.
                    .ok()
            })
            .flatten();
        Terminal { shared, drawer }
    }
}

/// Writes `line` and a newline to stderr in one call. A failure (stderr on
/// a full disk, a pipe whose reader has gone) is ignored: `eprintln!` would
/// panic, and a message nobody can read must not end a recording.
pub fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Redraw the status line each time a new status arrives, until done.
fn draw(shared: &Shared) {
    loop {
        let status = {
            let mut latest = lock(&shared.latest);
            while latest.status.is_none() && !latest.done {
                latest = shared
                    .changed
                    .wait(latest)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if latest.done {
                return;
            }
            latest.status.take()
        };
        if let Some(status) = status {
            let mut drawn = lock(&shared.screen);
            let _ = write!(std::io::stderr(), "{CLEAR_LINE}lrnprof-rec: {status}");
            *drawn = true;
        }
    }
}

/// Writes whole lines to stderr from any thread, clearing the status line
/// first if one is drawn (the next status draws it again).
#[derive(Clone)]
pub struct Lines {
    shared: Arc<Shared>,
}

impl Lines {
    pub fn say(&self, line: &str) {
        let mut drawn = lock(&self.shared.screen);
        let clear = if std::mem::take(&mut *drawn) {
            CLEAR_LINE
        } else {
            ""
        };
        say(&format!("{clear}{line}"));
    }
}

impl Terminal {
    /// A handle for lines written while recording, beside the reporter's.
    pub fn lines(&self) -> Lines {
        Lines {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Reporter for Terminal {
    fn status(&self, status: &RecordStatus) {
        if self.drawer.is_some() {
            lock(&self.shared.latest).status = Some(status.clone());
            self.shared.changed.notify_one();
        }
    }

    fn warning(&self, warning: &RecordWarning) {
        self.lines()
            .say(&format!("lrnprof-rec: warning: {warning}"));
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(drawer) = self.drawer.take() {
            lock(&self.shared.latest).done = true;
            self.shared.changed.notify_one();
            let _ = drawer.join();
            let _ = std::io::stderr().write_all(CLEAR_LINE.as_bytes());
        }
    }
}
