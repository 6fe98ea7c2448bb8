//! Building the `perf_event_attr` and interpreting what the kernel allows.

use super::parse::{sample, Layout};
use super::sys::{PerfEventAttr, PERF_ATTR_SIZE};

/// `perf_event_attr` flag bits.
pub(crate) mod flag {
    pub const DISABLED: u64 = 1 << 0;
    pub const INHERIT: u64 = 1 << 1;
    pub const EXCLUDE_KERNEL: u64 = 1 << 5;
    pub const EXCLUDE_HV: u64 = 1 << 6;
    pub const MMAP: u64 = 1 << 8;
    pub const COMM: u64 = 1 << 9;
    pub const FREQ: u64 = 1 << 10;
    pub const ENABLE_ON_EXEC: u64 = 1 << 12;
    pub const TASK: u64 = 1 << 13;
    pub const WATERMARK: u64 = 1 << 14;
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    pub const EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
    pub const MMAP2: u64 = 1 << 23;
    pub const COMM_EXEC: u64 = 1 << 24;
    pub const USE_CLOCKID: u64 = 1 << 25;
    pub const CONTEXT_SWITCH: u64 = 1 << 26;
    pub const BUILD_ID: u64 = 1 << 34;
}

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;
const PERF_COUNT_SW_DUMMY: u64 = 9;

/// The CPU sampling event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// Hardware cycles, at a frequency.
    Cycles,
    /// Software CPU clock, with a fixed period in nanoseconds.
    CpuClock,
}

/// What an opened event is for. Every event of a recording writes into
/// the same ring buffer per CPU; samples say which event they come from
/// by their `PERF_SAMPLE_IDENTIFIER`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// CPU samples (the clock or cycle counter).
    #[default]
    Cpu,
    /// `raw_syscalls:sys_enter`, every call: number, arguments, registers
    /// and stack.
    SyscallEnter,
    /// `raw_syscalls:sys_exit`, every call: number and return value.
    SyscallExit,
    /// The software context-switch event: registers and stack at each
    /// switch-out, and (`context_switch`) a record at each switch-in.
    Switch,
    /// A dummy event that never samples, opened only to write the records
    /// that follow the target when no other event does (`--heap --no-cpu`).
    Tracking,
}

/// One event opened for every thread and CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventSpec {
    pub role: Role,
    /// The tracepoint id (`PERF_TYPE_TRACEPOINT` config) of syscall events.
    pub tracepoint: u64,
    /// Bytes of user stack per sample (already a valid size; 0: none).
    pub stack_size: u32,
    /// Also the kernel's frame-pointer walk of the user stack.
    pub callchain: bool,
    /// Whether this event writes the records that track the target
    /// (mmap, comm, fork, exit); exactly one event of a recording does.
    pub tracking: bool,
    /// A tracepoint filter (`id == 1 || id == 3`), set on every event
    /// opened; inherited copies use their parent's.
    pub filter: Option<String>,
}

impl EventSpec {
    /// An event of `role` with a stack copy of `stack_size` bytes.
    pub fn new(role: Role, stack_size: u32) -> EventSpec {
        EventSpec {
            role,
            tracepoint: 0,
            stack_size: valid_stack_size(stack_size),
            callchain: false,
            tracking: false,
            filter: None,
        }
    }
}

/// Settings every event shares, and the CPU event's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttrSettings {
    pub event: EventKind,
    pub frequency_hz: u32,
    /// Launch mode: enable at the child's `execve`. Events always start
    /// disabled; when attaching they are enabled once all are open, so
    /// no ring fills while the rest are being opened.
    pub enable_on_exec: bool,
    /// Ask for build ids in MMAP2 records (Linux 5.12+).
    pub build_id: bool,
    /// `sample_regs_user`.
    pub regs_mask: u64,
    /// Wake the reader when this many bytes are waiting.
    pub wakeup_bytes: u32,
    /// System-wide: one event per CPU for every process (`pid` -1), so no
    /// `inherit`.
    pub system: bool,
    /// CPU samples also in kernel code, with the kernel part of their
    /// callchain.
    pub kernel: bool,
}

/// The largest `sample_stack_user` the kernel accepts: below `u16::MAX`
/// (a record's size is a u16) and a multiple of 8.
pub(crate) const MAX_STACK_SIZE: u32 = 65528;

/// Round a requested stack size down to what the kernel accepts.
pub(crate) fn valid_stack_size(requested: u32) -> u32 {
    requested.min(MAX_STACK_SIZE) & !7
}

/// Clamp the frequency to `perf_event_max_sample_rate`; the bool says
/// whether it was lowered.
pub(crate) fn clamp_frequency(requested: u32, max: Option<i64>) -> (u32, bool) {
    match max {
        Some(max) if max > 0 && i64::from(requested) > max => (max as u32, true),
        _ => (requested, false),
    }
}

/// The `sample_id` fields every event asks for, so that the trailer of
/// every non-sample record has the same layout, ending with the event's
/// identifier.
pub(crate) const SAMPLE_ID_BITS: u64 =
    sample::IDENTIFIER | sample::TID | sample::TIME | sample::CPU;

impl AttrSettings {
    /// The sample layout of `spec`'s event.
    pub fn layout(&self, spec: &EventSpec) -> Layout {
        let sample_type = self.sample_type(spec);
        Layout {
            sample_type,
            user_regs: if sample_type & sample::REGS_USER != 0 {
                self.regs_mask.count_ones() as usize
            } else {
                0
            },
        }
    }

    fn sample_type(&self, spec: &EventSpec) -> u64 {
        let mut t = SAMPLE_ID_BITS;
        t |= match spec.role {
            Role::Cpu => sample::PERIOD | sample::REGS_USER,
            Role::SyscallEnter => sample::RAW | sample::REGS_USER,
            Role::SyscallExit => return t | sample::RAW,
            Role::Tracking => return t,
            Role::Switch => sample::REGS_USER,
        };
        if spec.stack_size > 0 {
            t |= sample::STACK_USER;
        }
        if spec.callchain {
            t |= sample::CALLCHAIN;
        }
        t
    }

    /// The attribute of `spec`'s event.
    pub fn attr(&self, spec: &EventSpec) -> PerfEventAttr {
        let mut flags = flag::DISABLED
            | flag::EXCLUDE_HV
            | flag::SAMPLE_ID_ALL
            | flag::USE_CLOCKID
            | flag::WATERMARK;
        if !self.system {
            flags |= flag::INHERIT;
        }
        // With --kernel, CPU samples and switch-outs keep the kernel part
        // of their callchain: where the kernel was, and where the thread
        // blocked in it.
        let kernel_chain = self.kernel && matches!(spec.role, Role::Cpu | Role::Switch);
        if spec.callchain && !kernel_chain {
            flags |= flag::EXCLUDE_CALLCHAIN_KERNEL;
        }
        if self.enable_on_exec {
            flags |= flag::ENABLE_ON_EXEC;
        }
        if spec.tracking {
            flags |= flag::MMAP | flag::MMAP2 | flag::COMM | flag::COMM_EXEC | flag::TASK;
            if self.build_id {
                flags |= flag::BUILD_ID;
            }
        }
        // Tracepoints and context switches happen in the kernel: an event
        // excluding the kernel would never fire. Only user stacks and
        // registers are asked for all the same.
        let (type_, config, period) = match spec.role {
            Role::Cpu => {
                if !self.kernel {
                    flags |= flag::EXCLUDE_KERNEL;
                }
                match self.event {
                    EventKind::Cycles => {
                        flags |= flag::FREQ;
                        (
                            PERF_TYPE_HARDWARE,
                            PERF_COUNT_HW_CPU_CYCLES,
                            u64::from(self.frequency_hz),
                        )
                    }
                    EventKind::CpuClock => (
                        PERF_TYPE_SOFTWARE,
                        PERF_COUNT_SW_CPU_CLOCK,
                        (1_000_000_000 / u64::from(self.frequency_hz.max(1))).max(1),
                    ),
                }
            }
            Role::SyscallEnter | Role::SyscallExit => (PERF_TYPE_TRACEPOINT, spec.tracepoint, 1),
            Role::Switch => {
                flags |= flag::CONTEXT_SWITCH;
                (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, 1)
            }
            // The dummy event never counts, so never samples.
            Role::Tracking => {
                flags |= flag::EXCLUDE_KERNEL;
                (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_DUMMY, 1)
            }
        };
        let sample_type = self.sample_type(spec);
        PerfEventAttr {
            type_,
            size: PERF_ATTR_SIZE,
            config,
            sample_period: period,
            sample_type,
            flags,
            wakeup: self.wakeup_bytes,
            sample_regs_user: if sample_type & sample::REGS_USER != 0 {
                self.regs_mask
            } else {
                0
            },
            sample_stack_user: if sample_type & sample::STACK_USER != 0 {
                spec.stack_size
            } else {
                0
            },
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        }
    }
}

/// The tracepoint filter that keeps syscalls `numbers` (ascending); `None`
/// for all. Runs of consecutive numbers become ranges: the kernel takes
/// filters of one page at most.
pub(crate) fn syscall_filter(numbers: &[u32]) -> Option<String> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &n in numbers {
        match runs.last_mut() {
            Some((_, last)) if n == last.saturating_add(1) => *last = n,
            Some((_, last)) if n == *last => {}
            _ => runs.push((n, n)),
        }
    }
    let terms: Vec<String> = runs
        .iter()
        .map(|&(a, b)| {
            if a == b {
                format!("id == {a}")
            } else {
                format!("(id >= {a} && id <= {b})")
            }
        })
        .collect();
    (!terms.is_empty()).then(|| terms.join(" || "))
}

/// Ring buffer size and stack copy size that work together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingPlan {
    /// Data pages per ring buffer (a power of two).
    pub pages: usize,
    /// Bytes of stack per sample.
    pub stack_size: u32,
    /// Whether `stack_size` was lowered to fit the ring.
    pub stack_limited: bool,
    /// What set the ring's size.
    pub bound: RingBound,
}

/// What sets a ring buffer's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingBound {
    /// The recorder's default, for a user who may lock it (root).
    Default,
    /// The size the user asked for.
    Chosen,
    /// What `kernel.perf_event_mlock_kb` lets a user lock.
    MlockLimit,
}

impl RingPlan {
    /// Bytes written to a ring before the kernel wakes the draining
    /// thread. Each wake is a round of both of the recorder's threads
    /// (on the order of 100 µs of CPU on a virtual machine), so a ring of
    /// [`HALF_FULL_WAKE_MIN`] or more wakes it half full: at 10 kHz with
    /// 64 KiB copies the other half of a 16 MiB ring still lasts 13 ms.
    /// A smaller ring (a user held to `perf_event_mlock_kb`: 32 copies)
    /// wakes it a quarter full, leaving more room for a late drain.
    pub fn wakeup_bytes(&self, page_size: usize) -> u32 {
        let bytes = self.pages * page_size;
        let wake = if bytes >= HALF_FULL_WAKE_MIN {
            bytes / 2
        } else {
            bytes / 4
        };
        wake.min(u32::MAX as usize) as u32
    }
}

/// The smallest ring buffer, in pages: the least a user may choose, and
/// where halving a ring the kernel refused stops.
pub(crate) const MIN_RING_PAGES: usize = 8;

/// The smallest ring that wakes the draining thread half full.
pub(crate) const HALF_FULL_WAKE_MIN: usize = 4 << 20;

/// A ring must hold at least this many full-size samples, or bursts
/// between two drains overflow it.
const MIN_SAMPLES_PER_RING: usize = 32;
/// Bytes of a sample record besides its stack (header, ids, registers,
/// callchain), roughly.
const SAMPLE_OVERHEAD: usize = 1024;

/// Plan the ring size per CPU and the stack size. The kernel reserves a
/// sample's whole `stack_size` in the ring, however little is live. A
/// ring has `default_pages`, or the power of two pages at most `chosen`
/// bytes (at least [`MIN_RING_PAGES`]); root (`CAP_IPC_LOCK`) may lock
/// that, other users what `kernel.perf_event_mlock_kb` allows per CPU
/// (one page of it is metadata) if that is less.
pub(crate) fn plan_ring(
    page_size: usize,
    default_pages: usize,
    chosen: Option<u64>,
    unlimited: bool,
    mlock_kb: Option<i64>,
    stack_size: u32,
) -> RingPlan {
    let (limit, mut bound) = match chosen {
        Some(bytes) => {
            let bytes = bytes.min(crate::options::MAX_RING_SIZE) as usize;
            let pages = (bytes / page_size.max(1)).max(MIN_RING_PAGES);
            (power_of_two_at_most(pages), RingBound::Chosen)
        }
        None => (default_pages, RingBound::Default),
    };
    let pages = if unlimited {
        limit
    } else {
        let allowed = mlock_kb.unwrap_or(516).max(0) as usize * 1024 / page_size;
        let mut p = 1;
        while p * 2 < allowed && p * 2 <= limit {
            p *= 2;
        }
        if p < limit {
            bound = RingBound::MlockLimit;
        }
        p
    };
    let ring_bytes = pages * page_size;
    let fits = (ring_bytes / MIN_SAMPLES_PER_RING).saturating_sub(SAMPLE_OVERHEAD);
    let capped = valid_stack_size(stack_size.min(u32::try_from(fits).unwrap_or(u32::MAX)));
    RingPlan {
        pages,
        stack_size: capped,
        stack_limited: capped < valid_stack_size(stack_size),
        bound,
    }
}

/// The largest power of two at most `n` (1 for 0).
fn power_of_two_at_most(n: usize) -> usize {
    match n.checked_ilog2() {
        Some(log) => 1 << log,
        None => 1,
    }
}

/// What to tell a user whose system-wide (`system`) or else
/// kernel-sampling `perf_event_open` failed with EACCES/EPERM: what was
/// refused, and how to lift it.
pub(crate) fn system_advice(system: bool, paranoid: Option<i64>, our_uid: u32) -> (String, String) {
    // CPU-wide events need paranoid 0 or lower, kernel sampling 1 or lower.
    let (needed, what, flag) = if system {
        (0, "the whole system", "--all")
    } else {
        (1, "kernel code", "--kernel")
    };
    let advice = match paranoid {
        Some(p) if p > needed && our_uid != 0 => format!(
            "{flag} needs kernel.perf_event_paranoid {needed} or lower, and it is {p}: run as root \
             (or with CAP_PERFMON), or lower it with `sudo sysctl kernel.perf_event_paranoid={needed}`"
        ),
        _ => format!(
            "perf_event_open was refused for {flag} (a seccomp filter, e.g. a container's, or a \
             missing capability): run as root with CAP_PERFMON, or allow perf_event_open in the \
             container's seccomp profile"
        ),
    };
    (what.to_string(), advice)
}

/// What to tell a user whose `perf_event_open` of a `role` event on
/// `pid` failed with EACCES/EPERM.
pub(crate) fn permission_advice(
    role: Role,
    paranoid: Option<i64>,
    our_uid: u32,
    target_uid: Option<u32>,
) -> String {
    if our_uid != 0 && target_uid.is_some_and(|u| u != our_uid) {
        return format!(
            "the process belongs to uid {} and we are uid {our_uid}: run as that user, or as root \
             (or with CAP_PERFMON and CAP_SYS_PTRACE)",
            target_uid.unwrap_or_default()
        );
    }
    // Tracepoint data (PERF_SAMPLE_RAW) needs paranoid -1, events that fire
    // in the kernel need 1 or lower, user-only sampling 2 or lower.
    let (needed, what) = match role {
        Role::Cpu | Role::Tracking => (2, "sampling"),
        Role::SyscallEnter | Role::SyscallExit => (-1, "syscall tracing (--syscalls)"),
        Role::Switch => (1, "off-CPU recording (--off-cpu)"),
    };
    match paranoid {
        Some(p) if p > needed && our_uid != 0 => format!(
            "{what} needs kernel.perf_event_paranoid {needed} or lower, and it is {p}: lower it \
             with `sudo sysctl kernel.perf_event_paranoid={needed}`, or run as root / with CAP_PERFMON"
        ),
        _ => "perf_event_open was refused (a seccomp filter, e.g. a container's, or a \
              non-dumpable/setuid target): run as root with CAP_PERFMON and CAP_SYS_PTRACE, \
              or allow perf_event_open in the container's seccomp profile"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AttrSettings {
        AttrSettings {
            event: EventKind::CpuClock,
            frequency_hz: 1000,
            enable_on_exec: true,
            build_id: true,
            regs_mask: 0b111 << 6,
            wakeup_bytes: 4096,
            system: false,
            kernel: false,
        }
    }

    fn cpu() -> EventSpec {
        EventSpec {
            tracking: true,
            callchain: true,
            ..EventSpec::new(Role::Cpu, 8192)
        }
    }

    #[test]
    fn cpu_clock_uses_a_period_in_ns() {
        let a = settings().attr(&cpu());
        assert_eq!((a.type_, a.config, a.sample_period), (1, 0, 1_000_000));
        assert_eq!(a.flags & flag::FREQ, 0);
        assert_eq!(a.size, 128);
        assert_eq!(a.clockid, libc::CLOCK_MONOTONIC);
    }

    #[test]
    fn cycles_use_a_frequency() {
        let a = AttrSettings {
            event: EventKind::Cycles,
            ..settings()
        }
        .attr(&cpu());
        assert_eq!((a.type_, a.sample_period), (0, 1000));
        assert_ne!(a.flags & flag::FREQ, 0);
    }

    #[test]
    fn tracking_only_uses_the_dummy_event_and_keeps_the_side_records() {
        let a = settings().attr(&EventSpec {
            tracking: true,
            ..EventSpec::new(Role::Tracking, 0)
        });
        assert_eq!((a.type_, a.config), (1, 9));
        assert_eq!(a.sample_type & sample::STACK_USER, 0);
        for f in [flag::MMAP2, flag::COMM, flag::TASK, flag::INHERIT] {
            assert_ne!(a.flags & f, 0, "flag {f:#x}");
        }
    }

    #[test]
    fn flags_follow_the_settings() {
        let a = settings().attr(&cpu());
        for f in [
            flag::INHERIT,
            flag::EXCLUDE_KERNEL,
            flag::EXCLUDE_CALLCHAIN_KERNEL,
            flag::DISABLED,
            flag::ENABLE_ON_EXEC,
            flag::MMAP2,
            flag::SAMPLE_ID_ALL,
            flag::USE_CLOCKID,
            flag::BUILD_ID,
        ] {
            assert_ne!(a.flags & f, 0, "flag {f:#x}");
        }
        assert_ne!(a.sample_type & sample::CALLCHAIN, 0);
        let b = AttrSettings {
            enable_on_exec: false,
            build_id: false,
            ..settings()
        }
        .attr(&EventSpec {
            callchain: false,
            ..cpu()
        });
        assert_eq!(b.flags & (flag::ENABLE_ON_EXEC | flag::BUILD_ID), 0);
        assert_ne!(b.flags & flag::DISABLED, 0, "enabled once all are open");
        assert_eq!(b.sample_type & sample::CALLCHAIN, 0);
    }

    #[test]
    fn kernel_side_events_do_not_exclude_the_kernel() {
        let s = settings();
        let enter = EventSpec {
            tracepoint: 443,
            callchain: true,
            ..EventSpec::new(Role::SyscallEnter, 4096)
        };
        let a = s.attr(&enter);
        assert_eq!((a.type_, a.config, a.sample_period), (2, 443, 1));
        assert_eq!(
            a.flags & flag::EXCLUDE_KERNEL,
            0,
            "tracepoints fire in the kernel"
        );
        assert_eq!(
            a.flags & (flag::MMAP | flag::COMM | flag::TASK),
            0,
            "not tracking"
        );
        assert_ne!(a.sample_type & sample::RAW, 0);
        assert_eq!(
            (a.sample_stack_user, a.sample_regs_user),
            (4096, 0b111 << 6)
        );
        let layout = s.layout(&enter);
        assert_eq!(layout.user_regs, 3);

        let exit = s.attr(&EventSpec::new(Role::SyscallExit, 4096));
        assert_eq!(exit.sample_type, SAMPLE_ID_BITS | sample::RAW);
        assert_eq!((exit.sample_stack_user, exit.sample_regs_user), (0, 0));
        assert_eq!(s.layout(&EventSpec::new(Role::SyscallExit, 0)).user_regs, 0);

        let switch = s.attr(&EventSpec::new(Role::Switch, 0));
        assert_eq!(switch.sample_type & sample::CALLCHAIN, 0, "none asked");
        assert_eq!(
            (switch.type_, switch.config, switch.sample_period),
            (1, 3, 1)
        );
        assert_ne!(switch.flags & flag::CONTEXT_SWITCH, 0);
        assert_eq!(switch.flags & flag::EXCLUDE_KERNEL, 0);
        assert_eq!(switch.sample_type & sample::STACK_USER, 0, "no stack asked");
        // Every event's records end with the same sample_id fields.
        for a in [a, exit, switch, s.attr(&cpu())] {
            assert_eq!(a.sample_type & SAMPLE_ID_BITS, SAMPLE_ID_BITS);
            assert_eq!(
                a.sample_type & sample::CALLCHAIN != 0,
                a.flags & flag::EXCLUDE_CALLCHAIN_KERNEL != 0
            );
            assert_eq!(a.sample_type & (sample::ID | sample::STREAM_ID), 0);
        }
    }

    #[test]
    fn syscall_filters_name_every_number() {
        assert_eq!(syscall_filter(&[]), None);
        assert_eq!(syscall_filter(&[0, 2]).unwrap(), "id == 0 || id == 2");
        assert_eq!(
            syscall_filter(&[1, 3, 4, 5, 9]).unwrap(),
            "id == 1 || (id >= 3 && id <= 5) || id == 9"
        );
        // Every syscall of an arch fits in a page.
        let all: Vec<u32> = (0..470).collect();
        assert!(syscall_filter(&all).unwrap().len() < 4096);
    }

    #[test]
    fn stack_sizes_are_kernel_valid() {
        assert_eq!(valid_stack_size(65536), 65528);
        assert_eq!(valid_stack_size(8193), 8192);
        assert_eq!(valid_stack_size(0), 0);
    }

    #[test]
    fn frequency_is_clamped_to_the_kernel_maximum() {
        assert_eq!(clamp_frequency(1000, Some(500)), (500, true));
        assert_eq!(clamp_frequency(1000, Some(100_000)), (1000, false));
        assert_eq!(clamp_frequency(1000, None), (1000, false));
    }

    #[test]
    fn root_gets_big_rings_and_full_stacks() {
        let plan = plan_ring(4096, 4096, None, true, Some(516), 65528);
        assert_eq!(
            plan,
            RingPlan {
                pages: 4096,
                stack_size: 65528,
                stack_limited: false,
                bound: RingBound::Default,
            }
        );
    }

    #[test]
    fn a_chosen_ring_size_is_a_power_of_two_pages_held_to_the_mlock_limit() {
        let root = |bytes| plan_ring(4096, 4096, Some(bytes), true, Some(516), 65528);
        // Rounded down to a power of two pages; at least eight pages.
        assert_eq!(root(4 << 20).pages, 1024);
        assert_eq!(root((4 << 20) + (3 << 20)).pages, 1024);
        assert_eq!(root(64 << 20).pages, 16384);
        assert_eq!(root(1).pages, 8);
        let huge = root(u64::MAX);
        assert_eq!((huge.pages, huge.bound), (1 << 18, RingBound::Chosen));
        assert_eq!((huge.stack_size, huge.stack_limited), (65528, false));
        // 64 KiB copies need 32 x (64 KiB + 1 KiB) > 2 MiB: a 1 MiB ring
        // limits them, and says so.
        let plan = root(1 << 20);
        assert_eq!(plan.bound, RingBound::Chosen);
        assert!(plan.stack_limited);
        assert_eq!(plan.stack_size, 31744);
        assert!(!root(4 << 20).stack_limited);
        // A user gets what was asked for if the limit allows it...
        let user = plan_ring(4096, 4096, Some(256 << 10), false, Some(516), 65528);
        assert_eq!((user.pages, user.bound), (64, RingBound::Chosen));
        // ...else the limit.
        let user = plan_ring(4096, 4096, Some(16 << 20), false, Some(516), 65528);
        assert_eq!((user.pages, user.bound), (128, RingBound::MlockLimit));
    }

    #[test]
    fn big_rings_wake_the_drain_half_full_small_ones_a_quarter() {
        let root = plan_ring(4096, 4096, None, true, Some(516), 65528);
        assert_eq!(root.wakeup_bytes(4096), 8 << 20);
        let user = plan_ring(4096, 4096, None, false, Some(516), 65528);
        assert_eq!(user.wakeup_bytes(4096), 128 << 10);
    }

    #[test]
    fn users_are_held_to_the_mlock_limit() {
        // 516 KiB = 129 pages: 128 data pages + the metadata page.
        let plan = plan_ring(4096, 4096, None, false, Some(516), 65528);
        assert_eq!((plan.pages, plan.bound), (128, RingBound::MlockLimit));
        assert_eq!(plan.stack_size, 15360);
        assert!(plan.stack_limited);
        // A small request is left alone.
        let plan = plan_ring(4096, 4096, None, false, Some(516), 8192);
        assert_eq!((plan.stack_size, plan.stack_limited), (8192, false));
        // A raised limit allows full stacks.
        let plan = plan_ring(4096, 4096, None, false, Some(8200), 65528);
        assert_eq!((plan.pages, plan.stack_limited), (2048, false));
    }

    #[test]
    fn system_wide_events_sample_the_kernel_when_asked() {
        let s = AttrSettings {
            system: true,
            kernel: true,
            ..settings()
        };
        let a = s.attr(&cpu());
        assert_eq!(a.flags & flag::INHERIT, 0, "per-CPU events do not inherit");
        assert_eq!(a.flags & flag::EXCLUDE_KERNEL, 0);
        assert_eq!(a.flags & flag::EXCLUDE_CALLCHAIN_KERNEL, 0);
        assert_ne!(a.sample_type & sample::CALLCHAIN, 0);
        // Switch-outs keep where in the kernel the thread blocked.
        let switch_spec = EventSpec {
            callchain: true,
            ..EventSpec::new(Role::Switch, 0)
        };
        let switch = s.attr(&switch_spec);
        assert_eq!(switch.flags & flag::EXCLUDE_CALLCHAIN_KERNEL, 0);
        let user = AttrSettings {
            system: true,
            ..settings()
        };
        assert_ne!(user.attr(&cpu()).flags & flag::EXCLUDE_KERNEL, 0);
        assert_ne!(
            user.attr(&switch_spec).flags & flag::EXCLUDE_CALLCHAIN_KERNEL,
            0
        );
    }

    #[test]
    fn system_advice_names_the_sysctl() {
        let (what, a) = system_advice(true, Some(2), 1000);
        assert_eq!(what, "the whole system");
        assert!(
            a.contains("--all") && a.contains("perf_event_paranoid=0"),
            "{a}"
        );
        assert!(a.contains("it is 2"), "{a}");
        let (what, a) = system_advice(false, Some(2), 1000);
        assert_eq!(what, "kernel code");
        assert!(a.contains("perf_event_paranoid=1"), "{a}");
        let (_, a) = system_advice(true, Some(-1), 1000);
        assert!(a.contains("seccomp"), "{a}");
        assert!(!a.contains('\n'));
    }

    #[test]
    fn advice_names_the_restriction() {
        let advice = |role, paranoid, uid, target| permission_advice(role, paranoid, uid, target);
        assert!(advice(Role::Cpu, Some(2), 1000, Some(0)).contains("belongs to uid 0"));
        let a = advice(Role::Cpu, Some(3), 1000, Some(1000));
        assert!(a.contains("paranoid 2 or lower, and it is 3"), "{a}");
        assert!(advice(Role::Cpu, Some(2), 0, Some(1000)).contains("seccomp"));
        let a = advice(Role::SyscallEnter, Some(2), 1000, Some(1000));
        assert!(a.contains("--syscalls") && a.contains("paranoid=-1"), "{a}");
        let a = advice(Role::Switch, Some(2), 1000, Some(1000));
        assert!(a.contains("--off-cpu") && a.contains("paranoid=1"), "{a}");
    }
}
