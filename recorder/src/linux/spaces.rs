//! The mappings of each recorded process over time, for the converter.
//!
//! Records come from one ring per CPU, so they arrive out of time order: a
//! process's exec can be heard after the mappings of its new program, a
//! parent's exit before the fork it made just before, a mapping before the
//! fork of a child that already had it. Each mapping therefore keeps the
//! time it began and the time it ended (replaced by another mapping over
//! it, by an exec or by the exit of its process), and a child is given
//! what its parent had mapped at the time of the fork, whatever order the
//! records came in. Mappings that ended long before the latest record are
//! dropped.

use lrnprof_format::{ImageMapRecord, Pid, Timestamp};
use std::collections::HashMap;

/// How long after its end (in record time) a mapping, or a fork, is kept
/// for records that arrive late: far more than one drain of the rings.
const KEEP_ENDED_NS: u64 = 10_000_000_000;

/// One mapping and when it ended, if it did.
#[derive(Debug, Clone)]
struct Mapping {
    record: ImageMapRecord,
    until: Option<u64>,
}

impl Mapping {
    fn live_at(&self, t: u64) -> bool {
        self.record.time.0 <= t && self.until.is_none_or(|u| u > t)
    }
}

#[derive(Debug, Default)]
struct Space {
    mappings: Vec<Mapping>,
    /// Times its whole address space was replaced (exec) or ended (exit).
    replaced: Vec<u64>,
    /// Its children and when it forked them.
    forks: Vec<(u32, u64)>,
    /// No mapping ended later than this (an upper bound), so samples
    /// taken after it see `current` as it was.
    ended: u64,
}

/// The mappings of each process over time.
#[derive(Debug, Default)]
pub(crate) struct AddressSpaces {
    spaces: HashMap<u32, Space>,
    /// Each process's mappings that have not ended, for lookups by address.
    current: HashMap<u32, Vec<ImageMapRecord>>,
    /// The latest time heard, and when ended mappings were last dropped.
    latest: u64,
    swept: u64,
}

impl AddressSpaces {
    /// The mappings of each process that have not ended.
    pub fn current(&self) -> &HashMap<u32, Vec<ImageMapRecord>> {
        &self.current
    }

    /// The mappings process `pid` had at time `t`, when some of them have
    /// ended since (by an exec, the process's exit, or a mapping over
    /// them) and so are no longer [`current`](AddressSpaces::current):
    /// a sample can be heard from one CPU's ring after such a change
    /// heard from another's. `None` when `current` still has all of them.
    pub fn then_if_ended(&self, pid: u32, t: u64) -> Option<Vec<ImageMapRecord>> {
        let space = self.spaces.get(&pid)?;
        if space.ended <= t
            || !space
                .mappings
                .iter()
                .any(|m| m.until.is_some() && m.live_at(t))
        {
            return None;
        }
        Some(
            space
                .mappings
                .iter()
                .filter(|m| m.live_at(t))
                .map(|m| m.record.clone())
                .collect(),
        )
    }

    /// `m` is mapped in its process from its time on, over what was mapped
    /// there before. Returns the processes whose current mappings changed:
    /// `m`'s, and those of children forked after `m`'s time that had not
    /// been given it yet, with the records those children get.
    pub fn map(&mut self, m: &ImageMapRecord) -> (Vec<u32>, Vec<ImageMapRecord>) {
        self.heard(m.time.0);
        let mut changed = Vec::new();
        let mut given = Vec::new();
        let mut work = vec![m.clone()];
        while let Some(m) = work.pop() {
            let pid = m.pid.0;
            let until = self.insert(m.clone());
            changed.push(pid);
            // Children forked while it was mapped, heard before it.
            let forks = self.spaces.get(&pid).map(|s| s.forks.clone());
            for (child, at) in forks.into_iter().flatten() {
                if m.time.0 <= at && until.is_none_or(|u| u > at) {
                    let copy = ImageMapRecord {
                        time: Timestamp(at),
                        pid: Pid(child),
                        ..m.clone()
                    };
                    given.push(copy.clone());
                    work.push(copy);
                }
            }
        }
        self.sweep();
        changed.sort_unstable();
        changed.dedup();
        (changed, given)
    }

    /// Process `pid`'s address space was replaced by an exec, or ended by
    /// its exit, at `time`: what was mapped before is gone from then on.
    pub fn replace(&mut self, pid: u32, time: u64) {
        self.heard(time);
        let space = self.spaces.entry(pid).or_default();
        for m in &mut space.mappings {
            if m.record.time.0 < time && m.until.is_none_or(|u| u > time) {
                m.until = Some(time);
                space.ended = space.ended.max(time);
            }
        }
        space.replaced.push(time);
        self.refresh(pid);
        self.sweep();
    }

    /// Process `parent` forked `child` at `time`: the child's copies of
    /// what the parent had mapped then.
    pub fn fork(&mut self, parent: u32, child: u32, time: u64) -> Vec<ImageMapRecord> {
        self.heard(time);
        let space = self.spaces.entry(parent).or_default();
        space.forks.push((child, time));
        let copies: Vec<ImageMapRecord> = space
            .mappings
            .iter()
            .filter(|m| m.live_at(time))
            .map(|m| ImageMapRecord {
                time: Timestamp(time),
                pid: Pid(child),
                ..m.record.clone()
            })
            .collect();
        for c in &copies {
            self.insert(c.clone());
        }
        self.refresh(child);
        self.sweep();
        copies
    }

    /// Adds `m` to its process, ending what it maps over from its time
    /// on, and ending it where a later mapping or exec was heard first.
    /// Returns when it ends.
    fn insert(&mut self, m: ImageMapRecord) -> Option<u64> {
        let pid = m.pid.0;
        let t = m.time.0;
        let space = self.spaces.entry(pid).or_default();
        let mut until = space.replaced.iter().copied().filter(|&r| r > t).min();
        for old in &mut space.mappings {
            if old.record.end <= m.start || old.record.start >= m.end {
                continue;
            }
            if old.record.time.0 <= t {
                if old.until.is_none_or(|u| u > t) {
                    old.until = Some(t);
                    space.ended = space.ended.max(t);
                }
            } else {
                until = Some(until.map_or(old.record.time.0, |u| u.min(old.record.time.0)));
            }
        }
        if let Some(u) = until {
            space.ended = space.ended.max(u);
        }
        space.mappings.push(Mapping { record: m, until });
        self.refresh(pid);
        until
    }

    fn refresh(&mut self, pid: u32) {
        let live: Vec<ImageMapRecord> = self
            .spaces
            .get(&pid)
            .into_iter()
            .flat_map(|s| &s.mappings)
            .filter(|m| m.until.is_none())
            .map(|m| m.record.clone())
            .collect();
        if live.is_empty() {
            self.current.remove(&pid);
        } else {
            self.current.insert(pid, live);
        }
    }

    fn heard(&mut self, time: u64) {
        self.latest = self.latest.max(time);
    }

    /// Drops what ended, and forks made, long before the latest record.
    fn sweep(&mut self) {
        if self.latest < self.swept.saturating_add(KEEP_ENDED_NS) {
            return;
        }
        self.swept = self.latest;
        let Some(before) = self.latest.checked_sub(KEEP_ENDED_NS) else {
            return;
        };
        self.spaces.retain(|_, s| {
            s.mappings.retain(|m| m.until.is_none_or(|u| u >= before));
            s.forks.retain(|&(_, at)| at >= before);
            s.replaced.retain(|&r| r >= before);
            !(s.mappings.is_empty() && s.forks.is_empty() && s.replaced.is_empty())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{BuildId, ImageKind};

    fn map(pid: u32, time: u64, start: u64, id: u8) -> ImageMapRecord {
        ImageMapRecord {
            time: Timestamp(time),
            pid: Pid(pid),
            start,
            end: start + 0x1000,
            file_offset: 0,
            path: format!("/lib{id}.so"),
            build_id: Some(BuildId(vec![id])),
            kind: ImageKind::File,
            executable: true,
        }
    }

    fn ids(spaces: &AddressSpaces, pid: u32) -> Vec<u8> {
        copied_ids(spaces.current().get(&pid).map_or(&[][..], |m| &m[..]))
    }

    fn copied_ids(copies: &[ImageMapRecord]) -> Vec<u8> {
        let mut ids: Vec<u8> = copies
            .iter()
            .map(|m| m.build_id.as_ref().unwrap().0[0])
            .collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_mapping_over_another_replaces_it_whatever_the_order_heard() {
        let mut s = AddressSpaces::default();
        s.map(&map(1, 10, 0x1000, 1));
        s.map(&map(1, 30, 0x1000, 3));
        // Heard last, mapped between the two: it never shows.
        s.map(&map(1, 20, 0x1000, 2));
        assert_eq!(ids(&s, 1), [3]);
    }

    #[test]
    fn an_exec_heard_after_the_new_programs_mappings_keeps_them() {
        let mut s = AddressSpaces::default();
        s.map(&map(1, 10, 0x1000, 1));
        s.map(&map(1, 10, 0x9000, 2));
        // The new program's mappings first, then the exec before them.
        s.map(&map(1, 30, 0x5000, 3));
        s.replace(1, 20);
        s.map(&map(1, 31, 0x7000, 4));
        assert_eq!(ids(&s, 1), [3, 4]);
        // A child forked after the exec gets the new program only.
        assert_eq!(copied_ids(&s.fork(1, 9, 40)), [3, 4]);
        assert_eq!(ids(&s, 9), [3, 4]);
    }

    #[test]
    fn a_fork_heard_after_its_parents_exit_still_inherits() {
        let mut s = AddressSpaces::default();
        s.map(&map(1, 10, 0x1000, 1));
        s.replace(1, 50);
        assert!(ids(&s, 1).is_empty());
        assert_eq!(copied_ids(&s.fork(1, 9, 40)), [1]);
        assert_eq!(ids(&s, 9), [1]);
    }

    #[test]
    fn a_mapping_heard_after_a_later_fork_goes_to_the_child() {
        let mut s = AddressSpaces::default();
        s.map(&map(1, 10, 0x1000, 1));
        assert_eq!(copied_ids(&s.fork(1, 9, 40)), [1]);
        // Mapped at 30, before the fork, heard after it.
        let (changed, given) = s.map(&map(1, 30, 0x5000, 2));
        assert_eq!(changed, [1, 9]);
        assert_eq!(copied_ids(&given), [2]);
        assert_eq!((given[0].pid, given[0].time), (Pid(9), Timestamp(40)));
        assert_eq!(ids(&s, 9), [1, 2]);
        // Mapped after the fork: the parent's only.
        let (changed, given) = s.map(&map(1, 45, 0x7000, 3));
        assert_eq!((changed, given.len()), (vec![1], 0));
        assert_eq!(ids(&s, 9), [1, 2]);
        assert_eq!(ids(&s, 1), [1, 2, 3]);
    }

    #[test]
    fn a_late_parent_mapping_does_not_undo_the_childs_exec() {
        let mut s = AddressSpaces::default();
        s.fork(1, 9, 40);
        s.replace(9, 50);
        s.map(&map(9, 55, 0x1000, 7));
        let (_, given) = s.map(&map(1, 30, 0x5000, 2));
        // Recorded for the child at the fork (the trace is in time order),
        // gone from its current mappings since its exec.
        assert_eq!(copied_ids(&given), [2]);
        assert_eq!(ids(&s, 9), [7]);
    }

    #[test]
    fn what_a_process_had_mapped_is_known_after_it_ended() {
        let mut s = AddressSpaces::default();
        s.map(&map(1, 10, 0x1000, 1));
        s.map(&map(1, 10, 0x5000, 2));
        // Nothing ended: the current mappings are those of any time.
        assert_eq!(s.then_if_ended(1, 15), None);
        s.map(&map(1, 20, 0x5000, 3));
        let then = |s: &AddressSpaces, t| s.then_if_ended(1, t).map(|m| copied_ids(&m));
        assert_eq!(then(&s, 15), Some(vec![1, 2]));
        assert_eq!(then(&s, 25), None);
        // Exec (or exit) at 30: before it, what was mapped then.
        s.replace(1, 30);
        assert_eq!(then(&s, 25), Some(vec![1, 3]));
        assert_eq!(then(&s, 15), Some(vec![1, 2]));
        assert_eq!(then(&s, 35), None);
        assert_eq!(s.then_if_ended(2, 15), None);
    }

    #[test]
    fn ended_mappings_are_dropped_once_old() {
        let mut s = AddressSpaces::default();
        s.map(&map(1, 10, 0x1000, 1));
        s.replace(1, 20);
        s.map(&map(2, 20 + 2 * KEEP_ENDED_NS, 0x1000, 2));
        assert!(!s.spaces.contains_key(&1));
        assert!(s.fork(1, 9, 30).is_empty());
    }
}
