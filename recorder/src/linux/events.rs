//! The opened events of a recording: every [`EventSpec`] for every thread
//! and online CPU, with `inherit` so threads and processes created later
//! are followed. On each CPU all events write into one ring buffer (the
//! first event opened there owns it), so the records of one CPU come in
//! time order whichever event wrote them; each event's id says which
//! layout its samples have.

use super::attr::{AttrSettings, EventSpec, Role, MIN_RING_PAGES};
use super::parse::Layouts;
use super::sys::{self, PerfEventAttr, RingMap};
use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// An event that could not be opened, and which one.
#[derive(Debug)]
pub(crate) struct OpenError {
    pub role: Role,
    pub error: io::Error,
}

/// One spec as opened: its attribute and filter.
struct Opened {
    spec: EventSpec,
    attr: PerfEventAttr,
    filter: Option<CString>,
}

/// The opened events and their ring buffers.
pub(crate) struct Events {
    specs: Vec<Opened>,
    settings: AttrSettings,
    cpus: Vec<u32>,
    ring_pages: usize,
    page_size: usize,
    /// Per CPU (same order as `cpus`): the event owning the ring buffer.
    leaders: Vec<Option<(OwnedFd, RingMap)>>,
    others: Vec<OwnedFd>,
    /// The syscall-entry events among them (see [`Events::switch_order`]).
    entries: HashSet<RawFd>,
    tids: HashSet<u32>,
    layouts: Layouts,
}

impl Events {
    /// Events of `specs` (none opened yet) on `cpus`, each ring buffer of
    /// `ring_pages` pages at most.
    pub fn new(
        settings: AttrSettings,
        specs: &[EventSpec],
        cpus: Vec<u32>,
        ring_pages: usize,
        page_size: usize,
    ) -> Events {
        let specs = specs
            .iter()
            .map(|spec| Opened {
                attr: settings.attr(spec),
                // A filter is built from syscall numbers: no NUL inside.
                filter: spec
                    .filter
                    .as_ref()
                    .and_then(|f| CString::new(f.as_str()).ok()),
                spec: spec.clone(),
            })
            .collect();
        Events {
            specs,
            settings,
            leaders: (0..cpus.len()).map(|_| None).collect(),
            cpus,
            ring_pages,
            page_size,
            others: Vec::new(),
            entries: HashSet::new(),
            tids: HashSet::new(),
            layouts: Layouts::new(),
        }
    }

    /// Open every event of one thread on every CPU.
    pub fn open_thread(&mut self, tid: u32) -> Result<(), OpenError> {
        self.open_task(tid as i32)?;
        self.tids.insert(tid);
        Ok(())
    }

    /// Open every event once per CPU for every process (system-wide).
    pub fn open_system(&mut self) -> Result<(), OpenError> {
        self.open_task(-1)
    }

    /// Open every event of `tid` (-1: every thread) on every CPU.
    fn open_task(&mut self, tid: i32) -> Result<(), OpenError> {
        let mut opened = Vec::new();
        for (i, &cpu) in self.cpus.iter().enumerate() {
            for o in &self.specs {
                let role = o.spec.role;
                let err = |error| OpenError { role, error };
                let fd = sys::perf_event_open(&o.attr, tid, cpu as i32).map_err(err)?;
                if let Some(filter) = &o.filter {
                    sys::perf_set_filter(&fd, filter).map_err(err)?;
                }
                let id = sys::perf_event_id(&fd).map_err(err)?;
                opened.push((i, fd, id, role, self.settings.layout(&o.spec)));
            }
        }
        for (i, fd, id, role, layout) in opened {
            self.layouts.insert(id, role, layout);
            if role == Role::SyscallEnter {
                self.entries.insert(fd.as_raw_fd());
            }
            match &self.leaders[i] {
                Some((leader, _)) => {
                    sys::perf_set_output(&fd, leader).map_err(|error| OpenError { role, error })?;
                    self.others.push(fd);
                }
                None => {
                    let ring = self
                        .map_ring(&fd)
                        .map_err(|error| OpenError { role, error })?;
                    self.leaders[i] = Some((fd, ring));
                }
            }
        }
        Ok(())
    }

    /// Map a ring buffer, halving its size while the kernel refuses.
    fn map_ring(&mut self, fd: &OwnedFd) -> io::Result<RingMap> {
        loop {
            match RingMap::new(fd, self.page_size, self.ring_pages) {
                Ok(r) => return Ok(r),
                Err(e)
                    if self.ring_pages > MIN_RING_PAGES
                        && matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOMEM)) =>
                {
                    self.ring_pages /= 2;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every opened event.
    pub fn all_fds(&self) -> impl Iterator<Item = &OwnedFd> {
        self.leaders
            .iter()
            .flatten()
            .map(|(fd, _)| fd)
            .chain(self.others.iter())
    }

    /// Every opened event in the order to enable them (`enable`) or to
    /// disable them: syscall-entry events are switched on last and off
    /// first, so that every entry recorded has its exit event on and no
    /// call is cut in two by the switch itself (events are enabled one file
    /// at a time while the target runs).
    pub fn switch_order(&self, enable: bool) -> Vec<&OwnedFd> {
        let (mut entries, mut rest): (Vec<&OwnedFd>, Vec<&OwnedFd>) = self
            .all_fds()
            .partition(|fd| self.entries.contains(&fd.as_raw_fd()));
        if enable {
            rest.append(&mut entries);
            rest
        } else {
            entries.append(&mut rest);
            entries
        }
    }

    /// The ring buffers' owners, to poll.
    pub fn ring_fds(&self) -> impl Iterator<Item = &OwnedFd> {
        self.leaders.iter().flatten().map(|(fd, _)| fd)
    }

    /// The ring buffers, to drain.
    pub fn rings(&mut self) -> impl Iterator<Item = &mut RingMap> {
        self.leaders.iter_mut().flatten().map(|(_, ring)| ring)
    }

    /// Whether `tid`'s events are open.
    pub fn has_thread(&self, tid: u32) -> bool {
        self.tids.contains(&tid)
    }

    /// The threads whose events were opened, ascending.
    pub fn tids(&self) -> Vec<u32> {
        let mut tids: Vec<u32> = self.tids.iter().copied().collect();
        tids.sort_unstable();
        tids
    }

    /// How to parse the samples of every event opened so far.
    pub fn layouts(&self) -> &Layouts {
        &self.layouts
    }
}
