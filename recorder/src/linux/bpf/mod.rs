//! `--syscall-stack-every N`: counts, errors and durations of every call
//! tallied in the kernel by three small eBPF programs, and one call in N
//! per (thread, syscall) recorded as a full sample ([`programs`] says how).
//!
//! The programs are loaded with bpf(2) directly, from instructions encoded
//! here ([`insn`]): no compiler toolchain at build time. A tracepoint's
//! programs run at every hit of the tracepoint, whoever makes it; they are
//! attached through "anchor" perf events of their own, opened disabled on
//! the recorder's thread, so that the recording's events (opened per
//! thread, inherited by new ones) come and go without detaching them.
//! The recorder reads the tally map every second and at the end, and
//! writes what changed as [`SyscallTallyRecord`]s.

mod insn;
mod layout;
mod programs;
mod sys;

use super::sys::{perf_event_open, PerfEventAttr, PERF_ATTR_SIZE};
use super::tracefs::Tracepoint;
use crate::error::RecordError;
use layout::{Totals, INFLIGHT_VALUE_LEN, TALLY_KEY_LEN, TALLY_VALUE_LEN};
use lrnprof_format::{Pid, SyscallTallyRecord, Tid, Timestamp};
use programs::ProgramSettings;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// Threads x syscalls counted at once; beyond, calls are recorded as
/// samples (and counted from them), never lost.
const TALLY_ENTRIES: u32 = 65_536;
/// Threads in a syscall at once.
const INFLIGHT_ENTRIES: u32 = 65_536;
/// Traced processes (and, harmlessly, their threads) at once.
const TARGET_ENTRIES: u32 = 65_536;

/// What the programs need to know, from tracefs and the options.
#[derive(Debug, Clone)]
pub(crate) struct CounterPlan {
    pub enter: Tracepoint,
    pub exit: Tracepoint,
    pub fork: Tracepoint,
    /// One call in this many per (thread, syscall) is sampled (> 1).
    pub every: u32,
    /// `execve` and `execveat` numbers.
    pub execve: [u32; 2],
    /// The syscalls traced (empty: all): tallies of the others are not
    /// written.
    pub filter: Vec<u32>,
}

/// The loaded programs and their maps, for one recording.
pub(crate) struct SyscallCounter {
    targets: OwnedFd,
    inflight: OwnedFd,
    tally: OwnedFd,
    /// Attached programs stay attached while these are open.
    _anchors: Vec<OwnedFd>,
    _programs: Vec<OwnedFd>,
    /// Per (tid, nr): the totals last written, and when.
    last: HashMap<(u32, u32), (Totals, u64)>,
    /// When counting started (the first tallies' `from`).
    start: u64,
    keep: Option<HashSet<u32>>,
}

impl SyscallCounter {
    /// Load and attach the programs. `now`: the trace clock (ns).
    pub fn start(plan: &CounterPlan, now: u64) -> Result<SyscallCounter, RecordError> {
        let hash = |key, value, entries, name| {
            sys::map_create(sys::MAP_TYPE_HASH, key, value, entries, name)
                .map_err(|e| bpf_error("creating a BPF map", &e))
        };
        let targets = hash(4, 4, TARGET_ENTRIES, "lrnprof_targets")?;
        let inflight = hash(
            4,
            INFLIGHT_VALUE_LEN as u32,
            INFLIGHT_ENTRIES,
            "lrnprof_inflight",
        )?;
        let tally = hash(
            TALLY_KEY_LEN as u32,
            TALLY_VALUE_LEN as u32,
            TALLY_ENTRIES,
            "lrnprof_tally",
        )?;
        let field = |tp: &Tracepoint, name: &str, size: usize| {
            tp.fields
                .iter()
                .find(|f| f.name == name && f.size == size)
                .and_then(|f| i16::try_from(f.offset).ok())
                .filter(|&o| o >= 8 && o % size as i16 == 0)
                .ok_or_else(|| {
                    RecordError::Tracing(format!(
                        "the tracepoint has no {size}-byte `{name}` field where the syscall \
                         counting program can read it; use --syscall-stack-every 1"
                    ))
                })
        };
        let settings = ProgramSettings {
            targets: targets.as_raw_fd(),
            inflight: inflight.as_raw_fd(),
            tally: tally.as_raw_fd(),
            enter_id: field(&plan.enter, "id", 8)?,
            exit_id: field(&plan.exit, "id", 8)?,
            exit_ret: field(&plan.exit, "ret", 8)?,
            fork_child_pid: field(&plan.fork, "child_pid", 4)?,
            every: plan.every,
            execve: plan.execve,
        };
        let mut anchors = Vec::new();
        let mut loaded = Vec::new();
        for (tp, insns, name) in [
            (&plan.enter, programs::sys_enter(&settings), "lrnprof_enter"),
            (&plan.exit, programs::sys_exit(&settings), "lrnprof_exit"),
            (
                &plan.fork,
                programs::process_fork(&settings),
                "lrnprof_fork",
            ),
        ] {
            let insns = insns.ok_or_else(|| {
                RecordError::Internal(format!("the {name} program has an unresolved jump"))
            })?;
            let prog = sys::prog_load(sys::PROG_TYPE_TRACEPOINT, &insns, c"GPL", name)
                .map_err(|e| load_error(name, &e))?;
            let anchor =
                anchor_event(tp.id).map_err(|e| bpf_error("opening a tracepoint event", &e))?;
            sys::perf_set_bpf(&anchor, &prog)
                .map_err(|e| bpf_error("attaching a BPF program to a tracepoint", &e))?;
            anchors.push(anchor);
            loaded.push(prog);
        }
        Ok(SyscallCounter {
            targets,
            inflight,
            tally,
            _anchors: anchors,
            _programs: loaded,
            last: HashMap::new(),
            start: now,
            keep: (!plan.filter.is_empty()).then(|| plan.filter.iter().copied().collect()),
        })
    }

    /// Trace process `tgid` (and the children it forks from now on);
    /// `after_exec`: only from its next successful `execve` on (a
    /// launched command, whose calls before that are the recorder's).
    pub fn add_target(&self, tgid: u32, after_exec: bool) -> Result<(), RecordError> {
        let state = u32::from(!after_exec);
        sys::map_update(
            &self.targets,
            &tgid.to_ne_bytes(),
            &state.to_ne_bytes(),
            sys::UPDATE_ANY,
        )
        .map_err(|e| bpf_error("adding the target to the BPF map", &e))
    }

    /// What the programs counted since the last call, at `now` (ns).
    /// Entries of threads that are gone are removed, with their last
    /// counts; so are processes that are gone from the targets.
    pub fn read(&mut self, now: u64) -> Result<Vec<SyscallTallyRecord>, RecordError> {
        let err = |e: io::Error| bpf_error("reading the syscall tallies", &e);
        let keys = all_keys::<TALLY_KEY_LEN>(&self.tally).map_err(err)?;
        let mut out = Vec::new();
        let mut alive: HashMap<u32, bool> = HashMap::new();
        let mut value = [0u8; TALLY_VALUE_LEN];
        for key in keys {
            let (tid, nr) = layout::parse_tally_key(&key);
            // The tgid is in the value: read it first, then decide.
            if !sys::map_lookup(&self.tally, &key, &mut value).map_err(err)? {
                continue;
            }
            let tgid = Totals::parse(&value).tgid;
            let live = *alive
                .entry(tid)
                .or_insert_with(|| Path::new(&format!("/proc/{tgid}/task/{tid}")).exists());
            if !live {
                // Its last counts, and nothing can add to them any more.
                if !sys::map_lookup_and_delete(&self.tally, &key, &mut value).map_err(err)? {
                    continue;
                }
            }
            let totals = Totals::parse(&value);
            let (before, from) = match live {
                true => self.last.get(&(tid, nr)).copied(),
                false => self.last.remove(&(tid, nr)),
            }
            .unwrap_or((Totals::default(), self.start));
            if let Some(d) = totals.since(&before) {
                if live {
                    self.last.insert((tid, nr), (totals, now));
                }
                if self.keep.as_ref().is_none_or(|k| k.contains(&nr)) {
                    out.push(record(now, from, tid, nr, &d));
                }
            }
        }
        for (tid, live) in alive {
            if !live {
                sys::map_delete(&self.inflight, &tid.to_ne_bytes()).map_err(err)?;
            }
        }
        for key in all_keys::<4>(&self.targets).map_err(err)? {
            if !Path::new(&format!("/proc/{}", u32::from_ne_bytes(key))).exists() {
                sys::map_delete(&self.targets, &key).map_err(err)?;
            }
        }
        Ok(out)
    }

    /// Detach the programs and free the maps, on a thread of its own: the
    /// kernel waits for a grace period when a tracepoint loses its last
    /// perf event (tens of ms each here), which can pass while the trace
    /// is being finished. Join the handle before returning.
    pub fn close(self) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let SyscallCounter {
                _anchors: anchors, ..
            } = self;
            // One thread per anchor, so that their waits overlap.
            let closing: Vec<_> = anchors
                .into_iter()
                .map(|fd| std::thread::spawn(move || drop(fd)))
                .collect();
            for c in closing {
                let _ = c.join();
            }
        })
    }
}

fn record(time: u64, from: u64, tid: u32, nr: u32, d: &Totals) -> SyscallTallyRecord {
    SyscallTallyRecord {
        time: Timestamp(time),
        from: Timestamp(from),
        pid: Pid(d.tgid),
        tid: Tid(tid),
        nr,
        calls: d.calls,
        finished: d.finished,
        errors: d.errors,
        total_ns: d.total_ns,
        max_ns: d.max_ns,
        sampled_calls: d.sampled_calls,
        sampled_finished: d.sampled_finished,
        sampled_errors: d.sampled_errors,
        sampled_ns: d.sampled_ns,
    }
}

/// Every key of `map`.
fn all_keys<const N: usize>(map: &OwnedFd) -> io::Result<Vec<[u8; N]>> {
    let mut keys: Vec<[u8; N]> = Vec::new();
    let mut next = [0u8; N];
    while sys::map_next_key(map, keys.last().map(|k| &k[..]), &mut next)? {
        keys.push(next);
        if keys.len() > TALLY_ENTRIES.max(TARGET_ENTRIES) as usize {
            // Keys deleted under the walk can restart it; the map never
            // holds more than this.
            break;
        }
    }
    Ok(keys)
}

/// A tracepoint event on this thread that never samples, for attaching
/// a program to its tracepoint.
fn anchor_event(tracepoint: u64) -> io::Result<OwnedFd> {
    const PERF_TYPE_TRACEPOINT: u32 = 2;
    const DISABLED: u64 = 1;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_TRACEPOINT,
        size: PERF_ATTR_SIZE,
        config: tracepoint,
        sample_period: 1,
        flags: DISABLED,
        ..Default::default()
    };
    perf_event_open(&attr, 0, -1)
}

/// What to do about a bpf(2) failure.
fn bpf_error(what: &str, e: &io::Error) -> RecordError {
    RecordError::Tracing(match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => format!(
            "{what} was refused ({e}): --syscall-stack-every above 1 loads BPF programs, which \
             needs root or CAP_BPF and CAP_PERFMON; record as root or use --syscall-stack-every 1"
        ),
        Some(libc::ENOSYS) => format!(
            "{what} failed ({e}): this kernel has no bpf(2) (CONFIG_BPF_SYSCALL); use \
             --syscall-stack-every 1"
        ),
        Some(libc::EINVAL | libc::EOPNOTSUPP) => format!(
            "{what} failed ({e}): this kernel cannot run BPF programs on tracepoints \
             (CONFIG_BPF_EVENTS); use --syscall-stack-every 1"
        ),
        _ => format!("{what} failed: {e}; use --syscall-stack-every 1"),
    })
}

fn load_error(name: &str, e: &sys::LoadError) -> RecordError {
    if e.log.is_empty() {
        return bpf_error(&format!("loading the {name} BPF program"), &e.error);
    }
    // The verifier's last lines say why.
    let why: Vec<&str> = e.log.lines().rev().take(3).collect();
    let why: Vec<&str> = why.into_iter().rev().collect();
    RecordError::Tracing(format!(
        "the kernel's BPF verifier refused the {name} program ({}): {}; use \
         --syscall-stack-every 1",
        e.error,
        why.join(" | ")
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{sys as linux_sys, tracefs};
    use super::*;

    /// Under CI a check that cannot be made fails; elsewhere it is skipped.
    fn cannot_check(why: &str) {
        let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        assert!(!ci, "cannot check: {why}");
        eprintln!("skipped: {why}");
    }

    fn plan(every: u32) -> Option<CounterPlan> {
        let root = tracefs::find().ok()?;
        Some(CounterPlan {
            enter: tracefs::tracepoint(&root, "raw_syscalls", "sys_enter").ok()?,
            exit: tracefs::tracepoint(&root, "raw_syscalls", "sys_exit").ok()?,
            fork: tracefs::tracepoint(&root, "sched", "sched_process_fork").ok()?,
            every,
            execve: [u32::MAX; 2],
            filter: Vec::new(),
        })
    }

    fn tid() -> u32 {
        // Safety: gettid has no arguments and cannot fail.
        unsafe { libc::gettid() as u32 }
    }

    /// The programs load, pass the verifier, and count this thread's calls
    /// exactly, one in `every` sampled, errors included.
    #[test]
    fn programs_count_this_threads_calls() {
        if linux_sys::geteuid() != 0 {
            return cannot_check("loading BPF programs needs root");
        }
        let Some(plan) = plan(4) else {
            return cannot_check("tracefs or the raw_syscalls tracepoints are missing");
        };
        let start = linux_sys::monotonic_ns();
        let mut counter = SyscallCounter::start(&plan, start).expect("loading the programs");
        counter.add_target(std::process::id(), false).unwrap();
        let me = tid();
        for _ in 0..10 {
            // Safety: close(-1) only fails with EBADF.
            unsafe { libc::close(-1) };
        }
        for _ in 0..7 {
            // Safety: getppid cannot fail.
            unsafe { libc::getppid() };
        }
        let tallies = counter.read(linux_sys::monotonic_ns()).unwrap();
        let of = |name| {
            let nr = lrnprof_format::syscall_number(super::super::NATIVE_REGS.arch, name).unwrap();
            tallies
                .iter()
                .find(|t| t.tid.0 == me && t.nr == nr)
                .cloned()
                .unwrap_or_else(|| panic!("no tally of {name} in {tallies:?}"))
        };
        let close = of("close");
        assert_eq!(close.pid.0, std::process::id());
        assert_eq!((close.calls, close.finished, close.errors), (10, 10, 10));
        // Calls 1, 5 and 9 were sampled.
        assert_eq!(
            (
                close.sampled_calls,
                close.sampled_finished,
                close.sampled_errors
            ),
            (3, 3, 3)
        );
        assert!(close.total_ns >= close.sampled_ns && close.max_ns > 0);
        assert_eq!((close.from.0, close.time.0 > start), (start, true));
        let getppid = of("getppid");
        assert_eq!(
            (getppid.calls, getppid.errors, getppid.sampled_calls),
            (7, 0, 2)
        );
        // Read again: only what changed since (calls 8 and 9, the 9th sampled).
        for _ in 0..2 {
            // Safety: as above.
            unsafe { libc::getppid() };
        }
        let again = counter.read(linux_sys::monotonic_ns()).unwrap();
        let nr = lrnprof_format::syscall_number(super::super::NATIVE_REGS.arch, "getppid").unwrap();
        let t = again.iter().find(|t| t.tid.0 == me && t.nr == nr).unwrap();
        assert_eq!((t.calls, t.sampled_calls, t.from), (2, 1, getppid.time));
        counter.close().join().unwrap();
    }

    /// A process that is not a target is left alone: nothing is counted.
    #[test]
    fn other_processes_are_not_counted() {
        if linux_sys::geteuid() != 0 {
            return cannot_check("loading BPF programs needs root");
        }
        let Some(plan) = plan(2) else {
            return cannot_check("tracefs or the raw_syscalls tracepoints are missing");
        };
        let mut counter = SyscallCounter::start(&plan, linux_sys::monotonic_ns()).unwrap();
        // Safety: close(-1) only fails with EBADF.
        unsafe { libc::close(-1) };
        let tallies = counter.read(linux_sys::monotonic_ns()).unwrap();
        assert!(
            tallies.iter().all(|t| t.pid.0 != std::process::id()),
            "{tallies:?}"
        );
        counter.close().join().unwrap();
    }
}
