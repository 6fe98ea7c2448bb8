//! What later records say about an event sample: a syscall entry's return
//! and duration, an off-CPU switch-out's length, a sampled allocation's
//! free. Paired in the first pass, which sees every record in trace order,
//! so the second pass can value each sample on its own.

use lrnprof_format::{Pid, Record, SampleDetail, SampleKind, ThreadEvent, Tid, Timestamp};
use std::collections::HashMap;

/// What became of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A system call returned `ret` after `duration_ns`.
    Returned { duration_ns: u64, ret: i64 },
    /// A system call or off-CPU span had not ended when its thread exited,
    /// its next event of the same kind came (the end was lost), or the
    /// recording ended; `duration_ns` runs until then.
    Unfinished { duration_ns: u64 },
    /// A switched-out thread ran again after `duration_ns`.
    Resumed { duration_ns: u64 },
    /// A sampled allocation was freed (or its memory went away with an
    /// `exec`) at `at`.
    Freed { at: Timestamp },
}

impl Outcome {
    /// The span's length; 0 for frees.
    pub fn duration_ns(&self) -> u64 {
        match *self {
            Outcome::Returned { duration_ns, .. }
            | Outcome::Unfinished { duration_ns }
            | Outcome::Resumed { duration_ns } => duration_ns,
            Outcome::Freed { .. } => 0,
        }
    }
}

/// Identifies an event sample: one thread has at most one event of a kind
/// at one nanosecond.
pub(crate) type EventKey = (Pid, Tid, Timestamp, SampleKind);

/// What pairing needs of a sample's [`SampleDetail`]: a call's number or
/// an allocation's address, not a call's arguments. The first pass keeps
/// one per sample, at 16 bytes instead of the detail's 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pairing {
    /// Nothing to match on (CPU samples; a switch-out matches by thread).
    None,
    /// A system call's entry, number `nr`.
    Syscall { nr: u32 },
    /// A sampled allocation at `address`.
    Allocation { address: u64 },
}

impl From<&SampleDetail> for Pairing {
    fn from(detail: &SampleDetail) -> Pairing {
        match *detail {
            SampleDetail::Syscall { nr, .. } => Pairing::Syscall { nr },
            SampleDetail::Allocation { address } => Pairing::Allocation { address },
            SampleDetail::None | SampleDetail::OffCpu { .. } => Pairing::None,
        }
    }
}

/// Pairs event samples with the records that end them.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    done: HashMap<EventKey, Outcome>,
    /// Per thread: the pending syscall entry's time and number.
    syscalls: HashMap<(Pid, Tid), (Timestamp, u32)>,
    /// Per thread: the pending switch-out's time.
    switched_out: HashMap<(Pid, Tid), Timestamp>,
    /// Per (process, address): the live sampled allocation's thread and time.
    allocations: HashMap<(Pid, u64), (Tid, Timestamp)>,
}

impl Outcomes {
    /// What became of the event sample `key`, if anything is known.
    pub fn get(&self, key: &EventKey) -> Option<&Outcome> {
        self.done.get(key)
    }

    /// Note a sample, in trace order.
    pub fn sample(
        &mut self,
        pid: Pid,
        tid: Tid,
        time: Timestamp,
        kind: SampleKind,
        detail: Pairing,
    ) {
        match (kind, detail) {
            (SampleKind::Syscall, Pairing::Syscall { nr }) => {
                if let Some((t0, _)) = self.syscalls.insert((pid, tid), (time, nr)) {
                    // The previous call's return was lost.
                    self.unfinished((pid, tid, t0, SampleKind::Syscall), time);
                }
            }
            (SampleKind::OffCpu, _) => {
                if let Some(t0) = self.switched_out.insert((pid, tid), time) {
                    self.unfinished((pid, tid, t0, SampleKind::OffCpu), time);
                }
            }
            (SampleKind::Allocation, Pairing::Allocation { address }) => {
                if let Some((t, t0)) = self.allocations.insert((pid, address), (tid, time)) {
                    // The same address again: its free was lost, so it was
                    // freed by now.
                    self.done.insert(
                        (pid, t, t0, SampleKind::Allocation),
                        Outcome::Freed { at: time },
                    );
                }
            }
            _ => {}
        }
    }

    /// Note a record other than a sample, in trace order.
    pub fn record(&mut self, record: &Record) {
        match record {
            Record::SyscallExit(e) => {
                if let Some((t0, nr)) = self.syscalls.remove(&(e.pid, e.tid)) {
                    let key = (e.pid, e.tid, t0, SampleKind::Syscall);
                    if nr == e.nr {
                        self.done.insert(
                            key,
                            Outcome::Returned {
                                duration_ns: e.time.0.saturating_sub(t0.0),
                                ret: e.ret,
                            },
                        );
                    } else {
                        // Another call's return: this call's was lost.
                        self.unfinished(key, e.time);
                    }
                }
            }
            Record::SwitchIn(s) => {
                if let Some(t0) = self.switched_out.remove(&(s.pid, s.tid)) {
                    self.done.insert(
                        (s.pid, s.tid, t0, SampleKind::OffCpu),
                        Outcome::Resumed {
                            duration_ns: s.time.0.saturating_sub(t0.0),
                        },
                    );
                }
            }
            Record::Free(f) => {
                if let Some((tid, t0)) = self.allocations.remove(&(f.pid, f.address)) {
                    self.done.insert(
                        (f.pid, tid, t0, SampleKind::Allocation),
                        Outcome::Freed { at: f.time },
                    );
                }
            }
            Record::Thread(t) if t.event == ThreadEvent::Exit => {
                self.end_thread(t.pid, t.tid, t.time);
            }
            Record::Process(p) if p.event == lrnprof_format::ProcessEvent::Exec => {
                // The old address space, and every block in it, is gone.
                let gone: Vec<(Pid, u64)> = self
                    .allocations
                    .keys()
                    .filter(|(pid, _)| *pid == p.pid)
                    .copied()
                    .collect();
                for k in gone {
                    if let Some((tid, t0)) = self.allocations.remove(&k) {
                        self.done.insert(
                            (k.0, tid, t0, SampleKind::Allocation),
                            Outcome::Freed { at: p.time },
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// The recording ended at `end`: spans still open are unfinished.
    /// Allocations not freed stay in use (that is what a leak is).
    pub fn finish(&mut self, end: Timestamp) {
        let open: Vec<(Pid, Tid)> = self
            .syscalls
            .keys()
            .chain(self.switched_out.keys())
            .copied()
            .collect();
        for (pid, tid) in open {
            self.end_thread(pid, tid, end);
        }
    }

    fn end_thread(&mut self, pid: Pid, tid: Tid, at: Timestamp) {
        if let Some((t0, _)) = self.syscalls.remove(&(pid, tid)) {
            self.unfinished((pid, tid, t0, SampleKind::Syscall), at);
        }
        if let Some(t0) = self.switched_out.remove(&(pid, tid)) {
            self.unfinished((pid, tid, t0, SampleKind::OffCpu), at);
        }
    }

    fn unfinished(&mut self, key: EventKey, at: Timestamp) {
        self.done.insert(
            key,
            Outcome::Unfinished {
                duration_ns: at.0.saturating_sub(key.2 .0),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{FreeRecord, SwitchInRecord, SyscallExitRecord, ThreadRecord};

    const P: Pid = Pid(1);
    const T: Tid = Tid(2);

    fn syscall(o: &mut Outcomes, t: u64, nr: u32) {
        o.sample(
            P,
            T,
            Timestamp(t),
            SampleKind::Syscall,
            (&SampleDetail::Syscall { nr, args: [0; 6] }).into(),
        );
    }

    fn exit(o: &mut Outcomes, t: u64, nr: u32, ret: i64) {
        o.record(&Record::SyscallExit(SyscallExitRecord {
            time: Timestamp(t),
            pid: P,
            tid: T,
            nr,
            ret,
        }));
    }

    fn key(t: u64, kind: SampleKind) -> EventKey {
        (P, T, Timestamp(t), kind)
    }

    #[test]
    fn syscalls_pair_by_thread_and_number() {
        let mut o = Outcomes::default();
        syscall(&mut o, 10, 1);
        exit(&mut o, 15, 1, -9);
        syscall(&mut o, 20, 0);
        // The return of call 0 was lost; call 1's return does not match it.
        exit(&mut o, 30, 1, 4);
        syscall(&mut o, 40, 3);
        syscall(&mut o, 45, 3);
        o.record(&Record::Thread(ThreadRecord {
            time: Timestamp(50),
            pid: P,
            tid: T,
            event: ThreadEvent::Exit,
            name: None,
        }));
        let get = |t| o.get(&key(t, SampleKind::Syscall)).copied();
        assert_eq!(
            get(10),
            Some(Outcome::Returned {
                duration_ns: 5,
                ret: -9
            })
        );
        assert_eq!(get(20), Some(Outcome::Unfinished { duration_ns: 10 }));
        assert_eq!(get(40), Some(Outcome::Unfinished { duration_ns: 5 }));
        assert_eq!(get(45), Some(Outcome::Unfinished { duration_ns: 5 }));
    }

    #[test]
    fn off_cpu_spans_end_at_switch_in_or_the_end() {
        let mut o = Outcomes::default();
        o.sample(
            P,
            T,
            Timestamp(100),
            SampleKind::OffCpu,
            (&SampleDetail::OffCpu { preempted: false }).into(),
        );
        o.record(&Record::SwitchIn(SwitchInRecord {
            time: Timestamp(1100),
            pid: P,
            tid: T,
        }));
        o.sample(
            P,
            T,
            Timestamp(2000),
            SampleKind::OffCpu,
            (&SampleDetail::OffCpu { preempted: true }).into(),
        );
        o.finish(Timestamp(2500));
        assert_eq!(
            o.get(&key(100, SampleKind::OffCpu)),
            Some(&Outcome::Resumed { duration_ns: 1000 })
        );
        assert_eq!(
            o.get(&key(2000, SampleKind::OffCpu)),
            Some(&Outcome::Unfinished { duration_ns: 500 })
        );
    }

    #[test]
    fn allocations_are_freed_by_address_within_the_process() {
        let mut o = Outcomes::default();
        let alloc = |o: &mut Outcomes, t, address| {
            o.sample(
                P,
                T,
                Timestamp(t),
                SampleKind::Allocation,
                (&SampleDetail::Allocation { address }).into(),
            );
        };
        let free = |o: &mut Outcomes, t, pid, address| {
            o.record(&Record::Free(FreeRecord {
                time: Timestamp(t),
                pid,
                tid: Tid(9),
                address,
            }));
        };
        alloc(&mut o, 1, 0x1000);
        alloc(&mut o, 2, 0x2000);
        free(&mut o, 3, Pid(77), 0x1000); // another process: not ours
        free(&mut o, 4, P, 0x1000);
        alloc(&mut o, 5, 0x2000); // reused without a free: the first went
        o.finish(Timestamp(9));
        let get = |t| o.get(&key(t, SampleKind::Allocation)).copied();
        assert_eq!(get(1), Some(Outcome::Freed { at: Timestamp(4) }));
        assert_eq!(get(2), Some(Outcome::Freed { at: Timestamp(5) }));
        assert_eq!(get(5), None, "still in use at the end");
    }
}
