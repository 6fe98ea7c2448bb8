//! How the views that people read (flame graphs, `top`, `diff`) print
//! amounts of a [`ValueKind`]: time with a unit that fits, bytes in
//! binary multiples, counts as counts.

use crate::profile::ValueKind;

/// What one unit of `kind` is called in a table or a flame graph tooltip.
pub(crate) fn count_name(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Samples => "samples",
        ValueKind::Cycles => "cycles",
        ValueKind::AllocObjects | ValueKind::InuseObjects => "allocations",
        ValueKind::Syscalls => "syscalls",
        ValueKind::AllocSpace | ValueKind::InuseSpace => "bytes",
        ValueKind::Cpu | ValueKind::SyscallTime | ValueKind::OffCpu => "ns",
    }
}

/// What `kind` measures, in words, for titles.
pub(crate) fn describe(kind: ValueKind) -> &'static str {
    match kind {
        ValueKind::Samples => "CPU samples",
        ValueKind::Cpu => "CPU time",
        ValueKind::Cycles => "CPU cycles",
        ValueKind::AllocObjects => "allocations (estimated)",
        ValueKind::AllocSpace => "bytes allocated (estimated)",
        ValueKind::InuseObjects => "allocations in use (estimated)",
        ValueKind::InuseSpace => "bytes in use (estimated)",
        ValueKind::Syscalls => "system calls",
        ValueKind::SyscallTime => "time in system calls",
        ValueKind::OffCpu => "time off CPU",
    }
}

/// For a flame graph whose counts are amounts of `kind` adding up to
/// `total`: the factor that turns a count into the unit shown, and that
/// unit's name. Nanoseconds become µs or ms when the total is large
/// enough that the rounded numbers keep five significant digits.
pub(crate) fn flame_scale(kind: ValueKind, total: u64) -> (f64, &'static str) {
    match count_name(kind) {
        "ns" if total >= 100_000_000_000 => (1e-6, "ms"),
        "ns" if total >= 100_000_000 => (1e-3, "µs"),
        name => (1.0, name),
    }
}

/// `amount` of `kind` for a table cell: `1.25s`, `812.0ms`, `3.4MiB`,
/// `1234`.
pub(crate) fn human(kind: ValueKind, amount: f64) -> String {
    match count_name(kind) {
        "ns" => {
            let a = amount.abs();
            if a >= 1e9 {
                format!("{:.2}s", amount / 1e9)
            } else if a >= 1e6 {
                format!("{:.1}ms", amount / 1e6)
            } else if a >= 1e3 {
                format!("{:.1}µs", amount / 1e3)
            } else {
                format!("{amount:.0}ns")
            }
        }
        "bytes" => {
            let a = amount.abs();
            let (div, unit) = if a >= (1u64 << 30) as f64 {
                ((1u64 << 30) as f64, "GiB")
            } else if a >= (1u64 << 20) as f64 {
                ((1u64 << 20) as f64, "MiB")
            } else if a >= 1024.0 {
                (1024.0, "KiB")
            } else {
                return format!("{amount:.0}B");
            };
            format!("{:.1}{unit}", amount / div)
        }
        _ => format!("{amount:.0}"),
    }
}

/// `amount` of `kind` with its unit, for a sentence: `1.25s`, `3.4MiB`,
/// `1234 samples`.
pub(crate) fn with_unit(kind: ValueKind, amount: f64) -> String {
    match count_name(kind) {
        // human() gives time and bytes their unit already.
        "ns" | "bytes" => human(kind, amount),
        name => format!("{} {name}", human(kind, amount)),
    }
}

/// Share of `part` in `total`, in percent (0 for an empty total).
pub(crate) fn percent(part: f64, total: f64) -> f64 {
    if total == 0.0 {
        0.0
    } else {
        100.0 * part / total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_amounts() {
        assert_eq!(human(ValueKind::Cpu, 1_250_000_000.0), "1.25s");
        assert_eq!(human(ValueKind::Cpu, 812_000_000.0), "812.0ms");
        assert_eq!(human(ValueKind::OffCpu, 1500.0), "1.5µs");
        assert_eq!(human(ValueKind::SyscallTime, 12.0), "12ns");
        assert_eq!(human(ValueKind::InuseSpace, 3.5 * 1048576.0), "3.5MiB");
        assert_eq!(human(ValueKind::AllocSpace, 100.0), "100B");
        assert_eq!(human(ValueKind::Samples, 1234.0), "1234");
        assert_eq!(human(ValueKind::Cpu, -2_000_000.0), "-2.0ms");
    }

    #[test]
    fn flame_units_keep_precision() {
        assert_eq!(flame_scale(ValueKind::Cpu, 5_000_000), (1.0, "ns"));
        assert_eq!(flame_scale(ValueKind::Cpu, 2_000_000_000), (1e-3, "µs"));
        assert_eq!(
            flame_scale(ValueKind::OffCpu, 200_000_000_000),
            (1e-6, "ms")
        );
        assert_eq!(flame_scale(ValueKind::InuseSpace, 1 << 40), (1.0, "bytes"));
    }
}
