//! System-wide recording (`TargetSpec::System`): every event opened once
//! per CPU for every process, rather than per thread. Processes that
//! start, exec and exit meanwhile come through the tracking event's fork,
//! comm, exit and mmap records, as for a process tree; the processes
//! already running are read from `/proc` once the events are enabled.

use super::attr::{self, AttrSettings, EventSpec};
use super::convert::{Initial, RawMsg};
use super::events::Events;
use super::{procfs, sys};
use crate::error::RecordError;
use crate::sink::SinkSender;

/// Open every event once per online CPU for every process, falling back
/// from build-id MMAP2 records to plain ones on older kernels.
pub(super) fn open(
    settings: AttrSettings,
    specs: &[EventSpec],
    page_size: usize,
    ring_pages: usize,
) -> Result<Events, RecordError> {
    super::open_events(
        settings,
        specs,
        page_size,
        ring_pages,
        Events::open_system,
        |e| {
            matches!(e.error.raw_os_error(), Some(libc::EACCES | libc::EPERM)).then(|| denied(true))
        },
    )
}

/// The error for a refused system-wide (`system`) or kernel-sampling
/// recording, with what to do about it.
pub(super) fn denied(system: bool) -> RecordError {
    let (what, advice) = attr::system_advice(
        system,
        procfs::read_sysctl("/proc/sys/kernel/perf_event_paranoid"),
        sys::geteuid(),
    );
    RecordError::SystemDenied { what, advice }
}

/// Send the processes running at `time` (all but the recorder), each
/// with its threads, as the writer's initial state. Call once the
/// events are enabled, so that a process started meanwhile is seen
/// either here or through its fork record (or both).
pub(super) fn send_existing(sender: &SinkSender<RawMsg>, time: u64) -> Result<(), RecordError> {
    let own = std::process::id();
    let pids = procfs::list_pids().map_err(|e| RecordError::Sys {
        what: "listing /proc".into(),
        source: e,
    })?;
    for pid in pids.into_iter().filter(|&p| p != own) {
        // Gone meanwhile: its exit record follows, nothing to add.
        let Ok(tids) = procfs::list_tasks(pid) else {
            continue;
        };
        sender.send(RawMsg::Initial(Initial {
            time,
            pid,
            tids,
            launched: None,
        }))?;
    }
    Ok(())
}
