//! The values a profile carries per stack, named as pprof names its sample
//! types, and what each recorded event adds to them.

use crate::outcomes::Outcome;
use lrnprof_format::{SampleEvent, SampleKind, TraceHeader};
use std::fmt;

/// One value of a profile, as a pprof sample type (`name/unit`).
///
/// Every output picks one of them with the same option (`--value NAME`);
/// pprof writes them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ValueKind {
    /// CPU samples (`samples/count`).
    Samples,
    /// On-CPU time (`cpu/nanoseconds`): the weights of CPU-clock or timer samples.
    Cpu,
    /// CPU cycles (`cycles/count`): the weights of cycle-counter samples.
    Cycles,
    /// Estimated allocations (`alloc_objects/count`).
    AllocObjects,
    /// Estimated bytes allocated (`alloc_space/bytes`).
    AllocSpace,
    /// Estimated allocations not freed at the end of the selected time
    /// range (`inuse_objects/count`).
    InuseObjects,
    /// Estimated bytes not freed at the end of the selected time range
    /// (`inuse_space/bytes`).
    InuseSpace,
    /// System calls (`syscalls/count`), exact.
    Syscalls,
    /// Time in system calls (`syscall_time/nanoseconds`), exact.
    SyscallTime,
    /// Time off CPU after a switch-out (`off_cpu/nanoseconds`).
    OffCpu,
}

/// Number of [`ValueKind`]s.
pub(crate) const VALUE_KINDS: usize = 10;

impl ValueKind {
    /// Every kind, in the order profiles list them.
    pub const ALL: [ValueKind; VALUE_KINDS] = [
        ValueKind::Samples,
        ValueKind::Cpu,
        ValueKind::Cycles,
        ValueKind::AllocObjects,
        ValueKind::AllocSpace,
        ValueKind::InuseObjects,
        ValueKind::InuseSpace,
        ValueKind::Syscalls,
        ValueKind::SyscallTime,
        ValueKind::OffCpu,
    ];

    /// Which kind of event the value adds up.
    pub fn event_kind(self) -> super::EventKind {
        use super::EventKind;
        match self {
            ValueKind::Samples | ValueKind::Cpu | ValueKind::Cycles => EventKind::Cpu,
            ValueKind::AllocObjects
            | ValueKind::AllocSpace
            | ValueKind::InuseObjects
            | ValueKind::InuseSpace => EventKind::Allocations,
            ValueKind::Syscalls | ValueKind::SyscallTime => EventKind::Syscalls,
            ValueKind::OffCpu => EventKind::OffCpu,
        }
    }

    /// The pprof sample type name (`cpu`, `inuse_space`, ...), also the
    /// name `--value` takes.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::Samples => "samples",
            ValueKind::Cpu => "cpu",
            ValueKind::Cycles => "cycles",
            ValueKind::AllocObjects => "alloc_objects",
            ValueKind::AllocSpace => "alloc_space",
            ValueKind::InuseObjects => "inuse_objects",
            ValueKind::InuseSpace => "inuse_space",
            ValueKind::Syscalls => "syscalls",
            ValueKind::SyscallTime => "syscall_time",
            ValueKind::OffCpu => "off_cpu",
        }
    }

    /// The pprof unit: `count`, `nanoseconds` or `bytes`.
    pub fn unit(self) -> &'static str {
        match self {
            ValueKind::Samples
            | ValueKind::Cycles
            | ValueKind::AllocObjects
            | ValueKind::InuseObjects
            | ValueKind::Syscalls => "count",
            ValueKind::Cpu | ValueKind::SyscallTime | ValueKind::OffCpu => "nanoseconds",
            ValueKind::AllocSpace | ValueKind::InuseSpace => "bytes",
        }
    }

    /// The kind named `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<ValueKind> {
        ValueKind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name(), self.unit())
    }
}

/// The value kinds a trace's recording settings give, in profile order.
pub(crate) fn kinds_of(header: &TraceHeader) -> Vec<ValueKind> {
    let mut kinds = Vec::new();
    if header.events.cpu {
        kinds.push(ValueKind::Samples);
        kinds.push(match header.sampling.event {
            SampleEvent::Cycles => ValueKind::Cycles,
            SampleEvent::CpuClock | SampleEvent::Timer => ValueKind::Cpu,
        });
    }
    if header.events.heap.is_some() {
        kinds.extend([
            ValueKind::AllocObjects,
            ValueKind::AllocSpace,
            ValueKind::InuseObjects,
            ValueKind::InuseSpace,
        ]);
    }
    if header.events.syscalls.is_some() {
        kinds.extend([ValueKind::Syscalls, ValueKind::SyscallTime]);
    }
    if header.events.off_cpu.is_some() {
        kinds.push(ValueKind::OffCpu);
    }
    kinds
}

/// The value a view shows when the user picks none: time on CPU (or
/// cycles) where CPU samples were taken, else memory in use, syscall time,
/// off-CPU time.
pub(crate) fn primary(kinds: &[ValueKind]) -> Option<ValueKind> {
    [
        ValueKind::Cpu,
        ValueKind::Cycles,
        ValueKind::InuseSpace,
        ValueKind::SyscallTime,
        ValueKind::OffCpu,
    ]
    .into_iter()
    .find(|k| kinds.contains(k))
}

/// Amounts of every [`ValueKind`], indexed by [`ValueKind::index`].
///
/// Kept as `f64` so that heap estimates, which are fractional per sample,
/// add up without rounding bias; every other amount is an integer, exact
/// in an `f64` up to 2^53 (104 days in ns), and outputs round once.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Amounts(pub [f64; VALUE_KINDS]);

impl Amounts {
    /// The amount of `kind`, rounded.
    pub fn get(&self, kind: ValueKind) -> u64 {
        self.0[kind.index()].round() as u64
    }

    fn set(&mut self, kind: ValueKind, amount: f64) {
        self.0[kind.index()] = amount;
    }

    /// Add `other`.
    pub fn add(&mut self, other: &Amounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// These amounts in the order of `kinds`, rounded.
    pub fn project(&self, kinds: &[ValueKind]) -> Vec<u64> {
        kinds.iter().map(|&k| self.get(k)).collect()
    }
}

/// How heap amounts are scaled up from samples (see [`amounts`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeapScale {
    /// The mean bytes between two sampled allocations; 1 = all recorded.
    pub mean_interval: u64,
}

impl HeapScale {
    /// Allocations and bytes one sampled allocation of `size` bytes stands for.
    ///
    /// With intervals drawn from an exponential distribution of mean `R`,
    /// an allocation of `s` bytes is sampled with probability
    /// `p = 1 - exp(-s / R)`; dividing by `p` gives unbiased estimates of
    /// counts (`1 / p`) and bytes (`s / p`), the estimator of tcmalloc and
    /// Go's heap profiles (which apply it per stack to the average size;
    /// per sample it stays unbiased when sizes differ).
    pub fn estimate(self, size: u64) -> (f64, f64) {
        if self.mean_interval <= 1 || size == 0 {
            return (1.0, size as f64);
        }
        let p = -(-(size as f64) / self.mean_interval as f64).exp_m1();
        if p <= 0.0 {
            return (1.0, size as f64);
        }
        (1.0 / p, size as f64 / p)
    }
}

/// What one sample adds to the values its kind has: at most a count and
/// an amount (an allocation's in-use values repeat its allocated ones).
/// An unwound block holds one per sample, so this is kept at 24 bytes
/// rather than as [`Amounts`] (80); [`SampleAmounts::expand`] gives those.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SampleAmounts {
    kind: SampleKind,
    /// Samples, allocated objects or calls (unused off CPU).
    count: f64,
    /// CPU time, cycles, allocated bytes, call time or time off CPU.
    amount: f64,
    /// An allocation still in use at the end of the selected range.
    in_use: bool,
}

impl SampleAmounts {
    /// The kind of event the sample is.
    pub fn kind(&self) -> SampleKind {
        self.kind
    }

    /// Multiply both by `factor` (a recorded call standing for several).
    pub fn scale(&mut self, factor: f64) {
        self.count *= factor;
        self.amount *= factor;
    }

    /// The amount of every value.
    pub fn expand(&self) -> Amounts {
        let mut a = Amounts::default();
        let (count, amount) = match self.kind {
            SampleKind::CpuTime | SampleKind::WallTime => (ValueKind::Samples, ValueKind::Cpu),
            SampleKind::Cycles => (ValueKind::Samples, ValueKind::Cycles),
            SampleKind::Allocation => {
                if self.in_use {
                    a.set(ValueKind::InuseObjects, self.count);
                    a.set(ValueKind::InuseSpace, self.amount);
                }
                (ValueKind::AllocObjects, ValueKind::AllocSpace)
            }
            SampleKind::Syscall => (ValueKind::Syscalls, ValueKind::SyscallTime),
            SampleKind::OffCpu => {
                a.set(ValueKind::OffCpu, self.amount);
                return a;
            }
        };
        a.set(count, self.count);
        a.set(amount, self.amount);
        a
    }
}

/// What one sample adds to each value, given what later records said
/// about it. `inuse_at`: the end of the selected time range, for the
/// in-use values.
pub(crate) fn amounts(
    kind: SampleKind,
    weight: u64,
    outcome: Option<&Outcome>,
    heap: Option<HeapScale>,
    inuse_at: Option<lrnprof_format::Timestamp>,
) -> SampleAmounts {
    let duration = || outcome.map_or(0.0, |o| o.duration_ns() as f64);
    let (count, amount, in_use) = match kind {
        SampleKind::CpuTime | SampleKind::WallTime | SampleKind::Cycles => {
            (1.0, weight as f64, false)
        }
        SampleKind::Allocation => {
            let (objects, bytes) = heap.map_or((1.0, weight as f64), |h| h.estimate(weight));
            let freed = match outcome {
                Some(Outcome::Freed { at }) => inuse_at.is_none_or(|end| *at <= end),
                _ => false,
            };
            (objects, bytes, !freed)
        }
        SampleKind::Syscall => (1.0, duration(), false),
        SampleKind::OffCpu => (0.0, duration(), false),
    };
    SampleAmounts {
        kind,
        count,
        amount,
        in_use,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{EventSettings, HeapSettings, Timestamp};

    #[test]
    fn names_round_trip_and_units() {
        for k in ValueKind::ALL {
            assert_eq!(ValueKind::from_name(k.name()), Some(k));
            assert_eq!(ValueKind::ALL[k.index()], k);
        }
        assert_eq!(ValueKind::from_name("nope"), None);
        assert_eq!(ValueKind::Cycles.to_string(), "cycles/count");
        assert_eq!(ValueKind::InuseSpace.to_string(), "inuse_space/bytes");
    }

    #[test]
    fn kinds_follow_the_recording() {
        let mut h = TraceHeader::example();
        assert_eq!(kinds_of(&h), [ValueKind::Samples, ValueKind::Cpu]);
        h.sampling.event = SampleEvent::Cycles;
        assert_eq!(kinds_of(&h), [ValueKind::Samples, ValueKind::Cycles]);
        h.events = EventSettings {
            cpu: false,
            heap: Some(HeapSettings {
                mean_interval: 512 * 1024,
            }),
            ..EventSettings::default()
        };
        let kinds = kinds_of(&h);
        assert_eq!(kinds.len(), 4);
        assert_eq!(primary(&kinds), Some(ValueKind::InuseSpace));
    }

    #[test]
    fn heap_estimates_scale_small_allocations_up() {
        let every = HeapScale { mean_interval: 1 };
        assert_eq!(every.estimate(100), (1.0, 100.0));
        let r = HeapScale {
            mean_interval: 512 * 1024,
        };
        // A 512 KiB allocation is sampled with p = 1 - 1/e.
        let (n, bytes) = r.estimate(512 * 1024);
        assert!((n - 1.582).abs() < 0.001, "{n}");
        assert!((829_000.0..830_000.0).contains(&bytes), "{bytes}");
        // A 64-byte one with p ~ 64/R: it stands for ~R bytes.
        let (n, bytes) = r.estimate(64);
        assert!((8190.0..8194.0).contains(&n), "{n}");
        assert!((524_250.0..524_350.0).contains(&bytes), "{bytes}");
        // Huge allocations are always sampled.
        assert_eq!(r.estimate(1 << 40), (1.0, (1u64 << 40) as f64));
    }

    #[test]
    fn amounts_per_kind() {
        let a = amounts(SampleKind::CpuTime, 1000, None, None, None).expand();
        assert_eq!(
            (a.get(ValueKind::Samples), a.get(ValueKind::Cpu)),
            (1, 1000)
        );
        let a = amounts(SampleKind::Cycles, 7, None, None, None).expand();
        assert_eq!(a.get(ValueKind::Cycles), 7);
        assert_eq!(a.get(ValueKind::Cpu), 0);

        let freed = Outcome::Freed { at: Timestamp(50) };
        let live = amounts(SampleKind::Allocation, 64, None, None, None).expand();
        assert_eq!(live.get(ValueKind::InuseSpace), 64);
        let gone = amounts(SampleKind::Allocation, 64, Some(&freed), None, None).expand();
        assert_eq!(gone.get(ValueKind::AllocSpace), 64);
        assert_eq!(gone.get(ValueKind::InuseSpace), 0);
        // Freed after the selected range ends: still in use at its end.
        let later = amounts(
            SampleKind::Allocation,
            64,
            Some(&freed),
            None,
            Some(Timestamp(40)),
        )
        .expand();
        assert_eq!(later.get(ValueKind::InuseObjects), 1);

        let call = Outcome::Returned {
            duration_ns: 250,
            ret: -2,
        };
        let a = amounts(SampleKind::Syscall, 1, Some(&call), None, None).expand();
        assert_eq!(
            (a.get(ValueKind::Syscalls), a.get(ValueKind::SyscallTime)),
            (1, 250)
        );
        let off = Outcome::Resumed { duration_ns: 9 };
        let a = amounts(SampleKind::OffCpu, 0, Some(&off), None, None).expand();
        assert_eq!(a.get(ValueKind::OffCpu), 9);
    }

    #[test]
    fn sample_amounts_stay_small() {
        assert!(std::mem::size_of::<SampleAmounts>() <= 24);
    }

    /// The compact form expands to exactly what each kind adds, with
    /// every other value zero, scaled as a whole for tallied calls.
    #[test]
    fn sample_amounts_expand_to_their_kinds_values_only() {
        use ValueKind::*;
        let only = |a: Amounts, set: &[(ValueKind, f64)]| {
            let mut want = Amounts::default();
            for &(k, v) in set {
                want.set(k, v);
            }
            assert_eq!(a, want);
        };
        only(
            amounts(SampleKind::WallTime, 5, None, None, None).expand(),
            &[(Samples, 1.0), (Cpu, 5.0)],
        );
        only(
            amounts(SampleKind::Cycles, 7, None, None, None).expand(),
            &[(Samples, 1.0), (Cycles, 7.0)],
        );
        let heap = Some(HeapScale { mean_interval: 1 });
        only(
            amounts(SampleKind::Allocation, 64, None, heap, None).expand(),
            &[
                (AllocObjects, 1.0),
                (AllocSpace, 64.0),
                (InuseObjects, 1.0),
                (InuseSpace, 64.0),
            ],
        );
        let freed = Outcome::Freed { at: Timestamp(50) };
        only(
            amounts(SampleKind::Allocation, 64, Some(&freed), None, None).expand(),
            &[(AllocObjects, 1.0), (AllocSpace, 64.0)],
        );
        let mut call = amounts(SampleKind::Syscall, 1, None, None, None);
        call.scale(3.0);
        only(call.expand(), &[(Syscalls, 3.0)]);
        only(
            amounts(SampleKind::OffCpu, 0, None, None, None).expand(),
            &[],
        );
    }
}
