//! Ctrl-C and SIGTERM: `lrnprof-rec`'s own signal handling, which drives
//! the library's [`StopToken`].
//!
//! When attached by pid, the first signal stops recording. When launching
//! a command, the first signal is passed on to it (unless it is a Ctrl-C
//! that the terminal already delivered to it) and recording goes on until
//! it exits; a second signal kills it and stops.
//!
//! The handler only writes the signal number to a pipe; a thread reads it
//! and calls the token, whose methods take a lock and so cannot run in a
//! handler.

use crate::terminal::Lines;
use lrnprof_recorder::{StopRequest, StopToken};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// The pipe's write end, for the handler (-1 until installed).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// This process's pid, for the handler.
static RECORDER_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe calls here. A child forked to launch the
    // command runs this handler too until it execs (and Ctrl-C reaches it
    // along with us); its signals are not the recorder's. The write end is
    // non-blocking, so a write fails only after 64 KiB of signals the
    // thread has not read yet, and then the signal is one too many anyway.
    let fd = PIPE_WRITE.load(Ordering::Relaxed);
    // Safety: getpid has no preconditions; write reads one live byte.
    unsafe {
        if fd >= 0 && libc::getpid() == RECORDER_PID.load(Ordering::Relaxed) {
            let byte = signal as u8;
            libc::write(fd, (&byte as *const u8).cast(), 1);
        }
    }
}

/// What to do about the `count`th signal received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Stop recording (attached by pid).
    Stop,
    /// Pass the signal on to the launched command and keep recording.
    Forward,
    /// Nothing: the terminal delivered this Ctrl-C to the command already.
    Nothing,
    /// Kill the launched command and stop.
    Kill,
}

fn action(signal: i32, count: u32, launched: bool, terminal_delivers_sigint: bool) -> Action {
    match (launched, count) {
        (false, _) => Action::Stop,
        (true, 1) if signal == libc::SIGINT && terminal_delivers_sigint => Action::Nothing,
        (true, 1) => Action::Forward,
        (true, _) => Action::Kill,
    }
}

/// Catch SIGINT and SIGTERM for the rest of the process's life and act on
/// them through `token`; `launched` says whether the recorder launches the
/// command it records.
pub fn handle_with(token: StopToken, launched: bool, lines: Lines) -> io::Result<()> {
    let (mut read, write) = io::pipe()?;
    // Safety: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(write.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(write.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    // Safety: getpid has no preconditions.
    RECORDER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    // The handler may run until the process ends: the write end is never closed.
    PIPE_WRITE.store(write.into_raw_fd(), Ordering::Relaxed);
    std::thread::Builder::new()
        .name("lrnprof-signals".into())
        .spawn(move || {
            let mut count = 0;
            let mut byte = [0u8];
            while read.read_exact(&mut byte).is_ok() {
                count += 1;
                let signal = i32::from(byte[0]);
                match action(signal, count, launched, terminal_delivers_sigint()) {
                    Action::Stop => token.stop_with(StopRequest {
                        signal: Some(signal),
                        kill_target: false,
                    }),
                    Action::Forward => {
                        token.signal_target(signal);
                        // Only SIGINT and SIGTERM are caught.
                        let name = if signal == libc::SIGINT {
                            "SIGINT"
                        } else {
                            "SIGTERM"
                        };
                        lines.say(&format!(
                            "lrnprof-rec: {name} passed on to the command; recording until it \
                             exits (a second SIGINT or SIGTERM kills it)"
                        ));
                    }
                    Action::Nothing => {}
                    Action::Kill => token.stop_with(StopRequest {
                        signal: Some(signal),
                        kill_target: true,
                    }),
                }
            }
        })?;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        install(signal)?;
    }
    Ok(())
}

fn install(signal: libc::c_int) -> io::Result<()> {
    // Safety: a zeroed sigaction is a valid "no flags, empty mask" value;
    // the handler makes only async-signal-safe calls.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("sigaction({signal}): {e}"),
            ));
        }
    }
    Ok(())
}

/// Whether the foreground process group of the terminal on stdin is ours,
/// i.e. Ctrl-C there also reaches a child in our process group.
fn terminal_delivers_sigint() -> bool {
    // Safety: no memory is passed; errors are checked.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attached_recordings_stop_on_the_first_signal() {
        assert_eq!(action(libc::SIGINT, 1, false, true), Action::Stop);
        assert_eq!(action(libc::SIGTERM, 1, false, false), Action::Stop);
    }

    #[test]
    fn launched_commands_get_the_first_signal_and_die_of_the_second() {
        assert_eq!(action(libc::SIGTERM, 1, true, false), Action::Forward);
        assert_eq!(action(libc::SIGTERM, 1, true, true), Action::Forward);
        assert_eq!(action(libc::SIGINT, 1, true, false), Action::Forward);
        // Ctrl-C on the terminal reached the command already.
        assert_eq!(action(libc::SIGINT, 1, true, true), Action::Nothing);
        assert_eq!(action(libc::SIGINT, 2, true, true), Action::Kill);
        assert_eq!(action(libc::SIGTERM, 3, true, false), Action::Kill);
    }
}
