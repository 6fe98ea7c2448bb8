//! Allocation sampling (`--heap`): the launched command gets the sampler
//! of `recorder/preload` preloaded (`LD_PRELOAD`) and a memory file it
//! shares with the recorder (its descriptor and a cookie in
//! `LRNPROF_HEAP`, see `lrnprof_preload::protocol`). The sampler writes
//! sampled allocations (with registers and a raw stack copy) and the frees
//! of sampled blocks into the ring there; this thread drains it with the
//! perf buffers, and the writer thread turns the events into `Sample`s of
//! kind `Allocation`, `Free` and `Lost` records, in time order with the
//! rest (both sides read `CLOCK_MONOTONIC`).

mod library;
mod program;

use super::sys::{self, SharedMap};
use crate::error::RecordError;
use crate::report::RecordWarning;
use crate::HeapOptions;
use lrnprof_preload::protocol::{
    self, state, Control, Event, Settings, CONTROL_SIZE, ENV_VAR, MAX_RECORD,
};
use lrnprof_preload::ring::{Consumer, Pop, Ring, KIND_SKIP};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

pub(crate) use program::{check as check_program, Escape};

/// An event of the sampler, owned, for the writer thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeapEvent {
    /// A sampled allocation.
    Alloc {
        time: u64,
        pid: u32,
        tid: u32,
        address: u64,
        size: u64,
        regs: protocol::Regs,
        stack: Vec<u8>,
    },
    /// A sampled block was freed.
    Free {
        time: u64,
        pid: u32,
        tid: u32,
        address: u64,
    },
    /// The sampler started in process `pid`.
    Hello { pid: u32 },
    /// Samplers dropped `count` events (ring full, or its table of live
    /// sampled blocks full), noticed at `time`.
    Lost { time: u64, count: u64 },
    /// The ring could not be read on (a writer died with space reserved
    /// and no header written): no more events.
    Broken { time: u64 },
}

/// A record not ready for this long is given up on while recording (a
/// writer killed mid-record, or its process gone).
const PATIENCE_NS: u64 = 1_000_000_000;

/// Stack bytes taken per drain at most, so one message stays bounded and
/// the perf buffers are not kept waiting.
const DRAIN_BUDGET: usize = 8 << 20;

/// The ring of one recording, as its only consumer.
pub(crate) struct HeapSession {
    // Dropped before the mapping it points into.
    consumer: Consumer,
    _map: SharedMap,
    fd: OwnedFd,
    library: PathBuf,
    cookie: u64,
    buf: Vec<u8>,
    /// Events the samplers or this consumer dropped, as reported so far.
    lost_reported: u64,
    dropped: u64,
    broken: bool,
}

fn random_cookie() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(sys::monotonic_ns());
    h.write_u32(std::process::id());
    h.finish()
}

impl HeapSession {
    /// Install the sampler's library and set up the ring for `options`,
    /// copying at most `stack_size` bytes of stack per sample.
    pub fn new(options: &HeapOptions, stack_size: u32) -> Result<HeapSession, RecordError> {
        let library = library::install(sys::geteuid())?;
        let every = options.mean_interval <= 1;
        // A small ring stays in the caches: writing records into memory
        // that has gone cold since its last lap cost the program more than
        // anything else the sampler does (measured: 10% against 2.5% for
        // 16 MiB against 2 MiB on benches' alloc_heavy). Recording every
        // allocation needs room for bursts instead, and a table for every
        // live block (its pages are touched only as used).
        let (data_log2, table_log2) = if every { (26, 18) } else { (21, 12) };
        let len = CONTROL_SIZE + (1 << data_log2);
        let fd = sys::memfd(c"lrnprof-heap", len).map_err(|e| RecordError::Sys {
            what: "creating the allocation sampler's shared memory".into(),
            source: e,
        })?;
        let map = SharedMap::new(&fd, len).map_err(|e| RecordError::Sys {
            what: "mapping the allocation sampler's shared memory".into(),
            source: e,
        })?;
        let cookie = random_cookie();
        let control = map.ptr().cast::<Control>();
        // Safety: the mapping is page-aligned, at least CONTROL_SIZE long
        // and ours; nothing else maps it yet.
        unsafe {
            control.write(Control {
                settings: Settings {
                    magic: protocol::MAGIC,
                    version: protocol::VERSION,
                    data_log2,
                    cookie,
                    mean_interval: options.mean_interval.max(1),
                    stack_size: stack_size.min(protocol::MAX_STACK as u32),
                    table_log2,
                },
                ..Control::default()
            });
        }
        // Safety: the data follows the control block in the same mapping,
        // which the session keeps until after the consumer is gone.
        let ring = unsafe { Ring::new(control, map.ptr().add(CONTROL_SIZE)) };
        let c = ring.control();
        c.heartbeat_ns
            .0
            .store(sys::monotonic_ns(), Ordering::Relaxed);
        c.state.0.store(state::RECORDING, Ordering::Release);
        Ok(HeapSession {
            consumer: Consumer::new(ring),
            _map: map,
            fd,
            library,
            cookie,
            buf: vec![0; MAX_RECORD],
            lost_reported: 0,
            dropped: 0,
            broken: false,
        })
    }

    /// The descriptor the launched command must inherit.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Variables to set in the launched command's environment: the
    /// sampler first in `LD_PRELOAD` (before any the user preloads), and
    /// where to find the ring. Children inherit both.
    pub fn environment(&self, preload: Option<OsString>) -> Vec<(OsString, OsString)> {
        let mut list = self.library.clone().into_os_string();
        if let Some(old) = preload.filter(|p| !p.is_empty()) {
            list.push(":");
            list.push(old);
        }
        vec![
            ("LD_PRELOAD".into(), list),
            (
                ENV_VAR.into(),
                format!("{}:{:016x}", self.fd(), self.cookie).into(),
            ),
        ]
    }

    /// Whether the samplers have filled more of the ring than a drain
    /// should find (see `urgency`).
    pub fn behind(&self) -> bool {
        let control = self.consumer.ring().control();
        let head = control.head.0.load(Ordering::Relaxed);
        let tail = control.tail.0.load(Ordering::Relaxed);
        let size = 1u64 << control.settings.data_log2;
        let used = head.saturating_sub(tail).min(size) as usize;
        let fraction = super::urgency::HEAP_RING_FRACTION;
        super::urgency::behind(used, size as usize, fraction)
    }

    /// Take what the samplers wrote, up to a budget; `last`: the
    /// recording is over, records still being written are given up.
    /// Returns whether there may be more.
    pub fn drain(&mut self, out: &mut Vec<HeapEvent>, now: u64, last: bool) -> bool {
        if self.broken {
            return false;
        }
        self.consumer
            .ring()
            .control()
            .heartbeat_ns
            .0
            .store(now, Ordering::Relaxed);
        let patience = if last { 0 } else { PATIENCE_NS };
        let mut taken = 0;
        let more = loop {
            if taken >= DRAIN_BUDGET {
                break true;
            }
            match self.consumer.pop(&mut self.buf, now, patience) {
                Pop::Record { kind, len } => {
                    taken += len;
                    match protocol::decode(kind, &self.buf[..len]) {
                        Some(e) => out.push(owned(e)),
                        None if kind == KIND_SKIP => {}
                        None => self.dropped += 1,
                    }
                }
                Pop::Dropped => self.dropped += 1,
                Pop::Empty | Pop::Waiting => break false,
                Pop::Broken => {
                    self.broken = true;
                    self.stop();
                    out.push(HeapEvent::Broken { time: now });
                    break false;
                }
            }
        };
        let lost = self
            .consumer
            .ring()
            .control()
            .lost
            .0
            .load(Ordering::Relaxed)
            .saturating_add(self.dropped);
        if lost > self.lost_reported {
            out.push(HeapEvent::Lost {
                time: now,
                count: lost - self.lost_reported,
            });
            self.lost_reported = lost;
        }
        more
    }

    /// Tell the samplers the recording is over: they write nothing more.
    pub fn stop(&self) {
        self.consumer
            .ring()
            .control()
            .state
            .0
            .store(state::STOPPED, Ordering::Release);
    }
}

/// What the allocation sampler did in a recording.
#[derive(Debug, Default)]
pub(crate) struct HeapStats {
    /// Processes it started in.
    pub processes: HashSet<u32>,
    /// Sampled allocations.
    pub allocations: u64,
    /// Its ring became unreadable.
    pub broken: bool,
    /// A warning already said why the program's allocations escape it.
    pub explained: bool,
    /// Processes seen running 32-bit code, which cannot load the 64-bit
    /// sampler, with their names if known (the first few).
    pub thirty_two_bit: BTreeMap<u32, Option<String>>,
    /// Per thread, the last time given to one of its events that came
    /// after the recorder had written later records (see [`Self::place`]).
    late: HashMap<(u32, u32), u64>,
}

impl HeapStats {
    /// Nothing yet; `explained`: a warning already said why the launched
    /// program's allocations escape the sampler.
    pub fn new(explained: bool) -> HeapStats {
        HeapStats {
            explained,
            ..HeapStats::default()
        }
    }

    /// The time to write an event of thread `tid` taken at `time` under,
    /// when records before `released` are already written: its own, or,
    /// for an event that arrived that late (its thread was descheduled
    /// between taking the time and writing it, for longer than the
    /// recorder holds records back), the first free nanosecond of its
    /// thread from `released` on. The trace stays in time order, and no
    /// two events of one thread share a time (the analyzer pairs an
    /// allocation with its free by thread and time).
    pub fn place(&mut self, pid: u32, tid: u32, time: u64, released: u64) -> u64 {
        if time >= released {
            return time;
        }
        if self.late.len() > 4096 {
            self.late.retain(|_, &mut t| t >= released);
        }
        let last = self.late.entry((pid, tid)).or_insert(0);
        *last = released.max(last.saturating_add(1));
        *last
    }

    /// What the user should know at the end.
    pub fn warnings(&self, out: &mut Vec<RecordWarning>) {
        if self.broken {
            out.push(RecordWarning::HeapRingBroken);
        }
        if self.explained {
            return;
        }
        if !self.thirty_two_bit.is_empty() {
            out.push(RecordWarning::Heap32Bit {
                processes: self.thirty_two_bit.clone().into_iter().collect(),
            });
            return;
        }
        if self.allocations > 0 {
            return;
        }
        out.push(RecordWarning::HeapNothingRecorded {
            reason: if self.processes.is_empty() {
                "the allocation sampler did not start in any process (a setuid program, a \
                 static one, or one that cleared LD_PRELOAD or closed the sampler's descriptor)"
                    .into()
            } else {
                "the allocation sampler ran, but the program allocated less than the sampling \
                 interval through malloc (--heap-rate 1 records every allocation)"
                    .into()
            },
        });
    }
}

fn owned(e: Event<'_>) -> HeapEvent {
    match e {
        Event::Alloc(a) => HeapEvent::Alloc {
            time: a.time,
            pid: a.pid,
            tid: a.tid,
            address: a.address,
            size: a.size,
            regs: a.regs,
            stack: a.stack.to_vec(),
        },
        Event::Free {
            time,
            pid,
            tid,
            address,
        } => HeapEvent::Free {
            time,
            pid,
            tid,
            address,
        },
        Event::Hello { pid, .. } => HeapEvent::Hello { pid },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_preload::protocol::{kind, SMALL_LEN};

    fn session(mean: u64) -> HeapSession {
        HeapSession::new(
            &HeapOptions {
                mean_interval: mean,
            },
            8192,
        )
        .unwrap()
    }

    #[test]
    fn late_events_are_placed_after_what_is_written_at_distinct_times() {
        let mut stats = HeapStats::default();
        assert_eq!(stats.place(1, 2, 500, 100), 500, "on time");
        assert_eq!(stats.place(1, 2, 50, 100), 100);
        assert_eq!(stats.place(1, 2, 60, 100), 101, "same thread: the next ns");
        assert_eq!(stats.place(1, 3, 60, 100), 100, "another thread");
        assert_eq!(stats.place(1, 2, 70, 200), 200);
    }

    #[test]
    fn the_environment_names_the_library_and_the_ring() {
        let s = session(1000);
        let env = s.environment(Some("/opt/other.so".into()));
        assert_eq!(env[0].0, "LD_PRELOAD");
        let preload = env[0].1.to_str().unwrap();
        assert!(preload.ends_with(":/opt/other.so"), "{preload}");
        assert!(preload.contains("liblrnprof_preload-"), "{preload}");
        let value = env[1].1.to_str().unwrap();
        let (fd, cookie) = protocol::parse_env_value(value.as_bytes()).unwrap();
        assert_eq!((fd, cookie), (s.fd(), s.cookie));
        // The settings are there for the sampler to check.
        let settings = s.consumer.ring().control().settings;
        assert_eq!(settings.magic, protocol::MAGIC);
        assert_eq!(settings.mean_interval, 1000);
        assert_eq!(settings.stack_size, 8192);
    }

    #[test]
    fn drained_records_become_events_and_losses_are_reported_once() {
        let mut s = session(1);
        // Another mapping of the same file, as a sampler would have.
        let map = SharedMap::new(&s.fd, CONTROL_SIZE + (1 << 26)).unwrap();
        // Safety: the same layout the session made.
        let ring = unsafe { Ring::new(map.ptr().cast::<Control>(), map.ptr().add(CONTROL_SIZE)) };
        let mut r = ring.reserve(SMALL_LEN, kind::FREE).unwrap();
        for w in [5u64, 7 | 8 << 32, 0xabc0] {
            r.put_u64(w);
        }
        r.commit();
        ring.control().lost.0.fetch_add(3, Ordering::Relaxed);
        let mut out = Vec::new();
        assert!(!s.drain(&mut out, 100, false));
        assert_eq!(
            out,
            [
                HeapEvent::Free {
                    time: 5,
                    pid: 7,
                    tid: 8,
                    address: 0xabc0
                },
                HeapEvent::Lost {
                    time: 100,
                    count: 3
                }
            ]
        );
        out.clear();
        s.drain(&mut out, 200, true);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(ring.control().heartbeat_ns.0.load(Ordering::Relaxed), 200);
        s.stop();
        assert_eq!(
            ring.control().state.0.load(Ordering::Relaxed),
            state::STOPPED
        );
    }
}
