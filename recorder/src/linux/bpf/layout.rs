//! The byte layouts of the programs' map entries, shared by the programs
//! (which write them) and the recorder (which reads them). Host byte
//! order, as the kernel stores them.

/// Offsets in a tally value: u64 counters.
pub(crate) mod tally {
    /// Calls entered.
    pub const CALLS: usize = 0;
    /// Of which sampled.
    pub const SAMPLED_CALLS: usize = 8;
    /// Calls returned.
    pub const FINISHED: usize = 16;
    pub const ERRORS: usize = 24;
    /// ns, of the calls returned.
    pub const TOTAL_NS: usize = 32;
    pub const MAX_NS: usize = 40;
    pub const SAMPLED_FINISHED: usize = 48;
    pub const SAMPLED_ERRORS: usize = 56;
    pub const SAMPLED_NS: usize = 64;
    /// The thread's process.
    pub const TGID: usize = 72;
}

/// Bytes of a tally value.
pub(crate) const TALLY_VALUE_LEN: usize = 80;
/// Bytes of a tally key: u32 tid, u32 nr.
pub(crate) const TALLY_KEY_LEN: usize = 8;

/// Offsets in an inflight value (16 bytes).
pub(crate) mod inflight {
    /// u64: when the call entered (CLOCK_MONOTONIC ns).
    pub const ENTER_NS: usize = 0;
    /// u32: its number (`u32::MAX` once its exit was seen).
    pub const NR: usize = 8;
    /// u32: `FLAG_SAMPLED | FLAG_TALLIED`.
    pub const FLAGS: usize = 12;
}

/// Bytes of an inflight value.
pub(crate) const INFLIGHT_VALUE_LEN: usize = 16;

/// A tally map key.
#[cfg(test)]
pub(crate) fn tally_key(tid: u32, nr: u32) -> [u8; TALLY_KEY_LEN] {
    let mut k = [0u8; TALLY_KEY_LEN];
    k[..4].copy_from_slice(&tid.to_ne_bytes());
    k[4..].copy_from_slice(&nr.to_ne_bytes());
    k
}

/// (tid, nr) of a tally map key.
pub(crate) fn parse_tally_key(k: &[u8; TALLY_KEY_LEN]) -> (u32, u32) {
    let w = |i: usize| u32::from_ne_bytes([k[i], k[i + 1], k[i + 2], k[i + 3]]);
    (w(0), w(4))
}

/// A tally value's counters, cumulative since its entry was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub calls: u64,
    pub sampled_calls: u64,
    pub finished: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub sampled_finished: u64,
    pub sampled_errors: u64,
    pub sampled_ns: u64,
    pub tgid: u32,
}

impl Totals {
    /// Decode a tally value.
    pub fn parse(v: &[u8; TALLY_VALUE_LEN]) -> Totals {
        let w = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v[at..at + 8]);
            u64::from_ne_bytes(b)
        };
        Totals {
            calls: w(tally::CALLS),
            sampled_calls: w(tally::SAMPLED_CALLS),
            finished: w(tally::FINISHED),
            errors: w(tally::ERRORS),
            total_ns: w(tally::TOTAL_NS),
            max_ns: w(tally::MAX_NS),
            sampled_finished: w(tally::SAMPLED_FINISHED),
            sampled_errors: w(tally::SAMPLED_ERRORS),
            sampled_ns: w(tally::SAMPLED_NS),
            tgid: w(tally::TGID) as u32,
        }
    }

    /// What changed since `before` (counters only grow; `max_ns` is kept
    /// as is); `None` when nothing did.
    pub fn since(&self, before: &Totals) -> Option<Totals> {
        let d = Totals {
            calls: self.calls.wrapping_sub(before.calls),
            sampled_calls: self.sampled_calls.wrapping_sub(before.sampled_calls),
            finished: self.finished.wrapping_sub(before.finished),
            errors: self.errors.wrapping_sub(before.errors),
            total_ns: self.total_ns.wrapping_sub(before.total_ns),
            max_ns: self.max_ns,
            sampled_finished: self.sampled_finished.wrapping_sub(before.sampled_finished),
            sampled_errors: self.sampled_errors.wrapping_sub(before.sampled_errors),
            sampled_ns: self.sampled_ns.wrapping_sub(before.sampled_ns),
            tgid: self.tgid,
        };
        (d.calls != 0 || d.finished != 0).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    #[test]
    fn tally_values_decode_and_subtract() {
        let mut v = [0u8; TALLY_VALUE_LEN];
        for (at, x) in [
            (tally::CALLS, 40u64),          // entered
            (tally::SAMPLED_CALLS, 3),      // 1st, 17th, 33rd
            (tally::FINISHED, 39),          // one still in the kernel
            (tally::ERRORS, 5),
            (tally::TOTAL_NS, 39_000),
            (tally::MAX_NS, 4_000),
            (tally::SAMPLED_FINISHED, 3),
            (tally::SAMPLED_ERRORS, 1),
            (tally::SAMPLED_NS, 3_500),
            (tally::TGID, 4242),
        ] {
            v[at..at + 8].copy_from_slice(&x.to_ne_bytes());
        }
        let t = Totals::parse(&v);
        assert_eq!((t.calls, t.sampled_calls, t.finished, t.errors), (40, 3, 39, 5));
        assert_eq!((t.total_ns, t.max_ns, t.tgid), (39_000, 4_000, 4242));
        assert_eq!((t.sampled_finished, t.sampled_errors, t.sampled_ns), (3, 1, 3_500));
        let before = Totals { calls: 30, sampled_calls: 2, finished: 30, errors: 5,
            total_ns: 30_000, max_ns: 4_000, sampled_finished: 2, sampled_errors: 1,
            sampled_ns: 2_000, tgid: 4242 };
        let d = t.since(&before).unwrap();
        assert_eq!((d.calls, d.sampled_calls, d.finished, d.errors), (10, 1, 9, 0));
        assert_eq!((d.total_ns, d.max_ns, d.sampled_ns), (9_000, 4_000, 1_500));
        assert_eq!(t.since(&t), None, "nothing new");
        assert_eq!(parse_tally_key(&tally_key(7, 1)), (7, 1));
    }
}
