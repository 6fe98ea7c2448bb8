//! Syscall tallies (`lrnprof-rec --syscall-stack-every N`, N > 1): every
//! call counted in the kernel, one in N per (thread, syscall) recorded as
//! a sample. Exact figures come from the tallies; what only samples know
//! (call sites, stacks, errno names, single durations) is scaled up from
//! the samples of the same thread and syscall.
//!
//! The rule (format docs, `SyscallTallyRecord`): a thread's exact calls of
//! a syscall are its tallied calls, plus its recorded calls, minus its
//! tallied calls that were recorded. Calls the kernel could not tally are
//! recorded, and appear only in the middle term.

use lrnprof_format::{Pid, SyscallTallyRecord, Tid, Timestamp};
use std::collections::HashMap;

/// One thread's calls of one syscall.
pub(crate) type TallyKey = (Pid, Tid, u32);

/// Counts of calls, tallied or recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CallCounts {
    pub calls: u64,
    pub finished: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub sampled_calls: u64,
    pub sampled_finished: u64,
    pub sampled_errors: u64,
    pub sampled_ns: u64,
}

impl CallCounts {
    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == CallCounts::default()
    }

    fn add(&mut self, t: &SyscallTallyRecord) {
        self.calls += t.calls;
        self.finished += t.finished;
        self.errors += t.errors;
        self.total_ns += t.total_ns;
        self.max_ns = self.max_ns.max(t.max_ns);
        self.sampled_calls += t.sampled_calls;
        self.sampled_finished += t.sampled_finished;
        self.sampled_errors += t.sampled_errors;
        self.sampled_ns += t.sampled_ns;
    }
}

/// The tallies of a trace, and how many calls of each thread and syscall
/// were recorded as samples.
#[derive(Debug, Default)]
pub(crate) struct SyscallTallies {
    records: Vec<SyscallTallyRecord>,
    totals: HashMap<TallyKey, CallCounts>,
    recorded: HashMap<TallyKey, u64>,
}

impl SyscallTallies {
    /// Note a tally record.
    pub fn record(&mut self, t: &SyscallTallyRecord) {
        self.totals.entry((t.pid, t.tid, t.nr)).or_default().add(t);
        self.records.push(t.clone());
    }

    /// Note a recorded syscall entry.
    pub fn sample(&mut self, pid: Pid, tid: Tid, nr: u32) {
        *self.recorded.entry((pid, tid, nr)).or_default() += 1;
    }

    /// How many calls each recorded call of `key` stands for: its exact
    /// calls over its recorded ones (1 without tallies).
    pub fn weight(&self, key: &TallyKey) -> f64 {
        let recorded = self.recorded.get(key).copied().unwrap_or(0);
        let Some(t) = self.totals.get(key) else {
            return 1.0;
        };
        if recorded == 0 {
            return 1.0;
        }
        let exact = (t.calls + recorded).saturating_sub(t.sampled_calls);
        (exact as f64 / recorded as f64).max(1.0)
    }

    /// The tallies kept by `keep` (pid, tid, nr, end of period), added up
    /// per thread and syscall.
    pub fn selected(
        &self,
        mut keep: impl FnMut(Pid, Tid, u32, Timestamp) -> bool,
    ) -> HashMap<TallyKey, CallCounts> {
        let mut out: HashMap<TallyKey, CallCounts> = HashMap::new();
        for t in &self.records {
            if keep(t.pid, t.tid, t.nr, t.time) {
                out.entry((t.pid, t.tid, t.nr)).or_default().add(t);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(tid: u32, nr: u32, calls: u64, sampled: u64) -> SyscallTallyRecord {
        SyscallTallyRecord {
            time: Timestamp(2_000),
            from: Timestamp(1_000),
            pid: Pid(10),
            tid: Tid(tid),
            nr,
            calls,
            finished: calls,
            errors: 0,
            total_ns: calls * 100,
            max_ns: 300,
            sampled_calls: sampled,
            sampled_finished: sampled,
            sampled_errors: 0,
            sampled_ns: sampled * 100,
        }
    }

    #[test]
    fn weights_are_exact_calls_over_recorded_ones() {
        let mut t = SyscallTallies::default();
        // Thread 11: 64 writes, 4 recorded, all tallied.
        t.record(&tally(11, 1, 40, 3));
        t.record(&tally(11, 1, 24, 1));
        for _ in 0..4 {
            t.sample(Pid(10), Tid(11), 1);
        }
        assert_eq!(t.weight(&(Pid(10), Tid(11), 1)), 16.0);
        // Thread 12: 10 tallied (1 recorded) and 2 recorded untallied (the
        // map was full): 12 calls, 3 recorded.
        t.record(&tally(12, 1, 10, 1));
        for _ in 0..3 {
            t.sample(Pid(10), Tid(12), 1);
        }
        assert_eq!(t.weight(&(Pid(10), Tid(12), 1)), 4.0);
        // No tallies (every call recorded), or no samples: weight 1.
        t.sample(Pid(10), Tid(13), 1);
        assert_eq!(t.weight(&(Pid(10), Tid(13), 1)), 1.0);
        assert_eq!(t.weight(&(Pid(10), Tid(14), 1)), 1.0);
        let sel = t.selected(|_, tid, _, _| tid == Tid(11));
        assert_eq!(sel.len(), 1);
        assert_eq!(sel[&(Pid(10), Tid(11), 1)].calls, 64);
        assert_eq!(sel[&(Pid(10), Tid(11), 1)].sampled_calls, 4);
    }
}
