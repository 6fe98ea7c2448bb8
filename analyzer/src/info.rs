//! `lrnprof-analyze info`: what is in a trace, as text or JSON.

use crate::profile::{ImageInfo, ProcessInfo, Profile, Stats};
use lrnprof_format::{Arch, Os, SampleEvent, TraceHeader};
use serde::Serialize;
use std::fmt::Write as _;

/// A summary of a trace and its analysis.
#[derive(Debug, Clone, Serialize)]
pub struct TraceInfo {
    /// Recorder name and version.
    pub recorder: String,
    /// `x86_64` or `aarch64`.
    pub arch: String,
    /// `linux` or `macos`.
    pub os: String,
    /// Recording host.
    pub hostname: String,
    /// Wall-clock start, ns since the Unix epoch.
    pub start_wall_ns: u64,
    /// What was recorded: the CPU sampling event (`cpu-clock`, `cycles`,
    /// `timer`) and the other event kinds, as a phrase.
    pub events: String,
    /// Totals of every value the trace has, in profile order.
    pub values: Vec<ValueTotal>,
    /// Requested sampling frequency, Hz.
    pub frequency_hz: u32,
    /// Largest stack copy per sample, bytes.
    pub stack_size: u32,
    /// Processes.
    pub processes: Vec<ProcessInfo>,
    /// Whether the trace recorded every process of the machine.
    pub system: bool,
    /// Threads.
    pub threads: Vec<ThreadInfo>,
    /// Images.
    pub images: Vec<ImageInfo>,
    /// Totals.
    pub stats: Stats,
    /// Trace bytes per sample.
    pub bytes_per_sample: f64,
    /// Percentage of samples that unwound to their thread's root.
    pub unwound_to_root_pct: f64,
    /// Most bytes of stack copied at each system call's entry, where the
    /// trace traced system calls.
    pub syscall_stack_size: Option<u32>,
    /// Warnings of the analysis.
    pub warnings: Vec<String>,
}

/// The total of one value in [`TraceInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct ValueTotal {
    /// The value's name (pprof sample type, `--value` name).
    pub name: String,
    /// Its unit: `count`, `nanoseconds` or `bytes`.
    pub unit: String,
    /// The total over the analyzed samples.
    pub total: u64,
}

/// What the trace recorded, in words.
fn describe_events(h: &TraceHeader) -> String {
    let mut parts = Vec::new();
    if h.events.cpu {
        parts.push(match h.sampling.event {
            SampleEvent::CpuClock => {
                format!(
                    "CPU samples of cpu-clock at {} Hz (weights: ns on CPU)",
                    h.sampling.frequency_hz
                )
            }
            SampleEvent::Cycles => format!(
                "CPU samples of the cycle counter at {} Hz (weights: cycles)",
                h.sampling.frequency_hz
            ),
            SampleEvent::Timer => format!(
                "CPU samples of a {} Hz timer (weights: ns on CPU)",
                h.sampling.frequency_hz
            ),
        });
    }
    if let Some(heap) = &h.events.heap {
        parts.push(if heap.mean_interval <= 1 {
            "every allocation".to_string()
        } else {
            format!(
                "allocations sampled every {} allocated on average (heap values are estimates)",
                human(heap.mean_interval, "bytes")
            )
        });
    }
    if let Some(s) = &h.events.syscalls {
        let which = if s.filter.is_empty() {
            "every system call".to_string()
        } else {
            format!("{} kinds of system call", s.filter.len())
        };
        parts.push(format!("{which} (stacks up to {} bytes)", s.stack_size));
    }
    if let Some(o) = &h.events.off_cpu {
        parts.push(format!(
            "context switches (off-CPU time; stacks up to {} bytes)",
            o.stack_size
        ));
    }
    if parts.is_empty() {
        "nothing".to_string()
    } else {
        parts.join(", ")
    }
}

/// `total` in its unit, for people.
fn human(total: u64, unit: &str) -> String {
    match unit {
        "nanoseconds" => format!("{:.3} s", total as f64 / 1e9),
        "bytes" if total >= 1 << 20 => format!("{:.1} MiB", total as f64 / (1u64 << 20) as f64),
        "bytes" if total >= 1 << 10 => format!("{:.1} KiB", total as f64 / 1024.0),
        "bytes" => format!("{total} bytes"),
        _ => total.to_string(),
    }
}

/// The trace's events per kind, when it holds more than CPU samples:
/// `106 CPU samples, 52406 sampled allocations, 52297 frees; lost: 3 by
/// the allocation sampler`.
fn events_line(e: &crate::profile::EventCounts) -> Option<String> {
    let mut parts = Vec::new();
    let mut add = |n: u64, what: &str| {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    };
    add(e.cpu_samples, "CPU samples");
    add(e.allocations, "sampled allocations");
    add(e.frees, "frees of sampled allocations");
    add(e.syscalls, "system calls");
    add(e.off_cpu, "switch-outs");
    let only_cpu = e.allocations + e.frees + e.syscalls + e.off_cpu == 0;
    let mut lost = Vec::new();
    for (n, by) in [
        (e.lost_kernel, "by the kernel"),
        (e.lost_recorder, "by the recorder"),
        (e.lost_heap_sampler, "by the allocation sampler"),
    ] {
        if n > 0 {
            lost.push(format!("{n} {by}"));
        }
    }
    if only_cpu && e.lost_heap_sampler == 0 {
        return None;
    }
    let mut line = if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    };
    if !lost.is_empty() {
        line.push_str(&format!("; lost: {}", lost.join(", ")));
    }
    Some(line)
}

/// A thread in [`TraceInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct ThreadInfo {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Last known name.
    pub name: Option<String>,
    /// Names it had before that during the recording, oldest first
    /// (`--thread-name` selects by each for its time).
    pub earlier_names: Vec<String>,
    /// Samples.
    pub samples: u64,
    /// Samples that unwound to the root.
    pub root_samples: u64,
    /// Sampling ticks at which the thread was idle and not sampled (macOS).
    pub idle_ticks: u64,
}

impl TraceInfo {
    /// Summarize `profile`.
    pub fn new(profile: &Profile) -> TraceInfo {
        let h = &profile.header;
        let stats = profile.stats.clone();
        TraceInfo {
            recorder: h.recorder.clone(),
            arch: match h.arch {
                Arch::X86_64 => "x86_64",
                Arch::Aarch64 => "aarch64",
            }
            .into(),
            os: match h.os {
                Os::Linux => "linux",
                Os::MacOs => "macos",
            }
            .into(),
            hostname: h.hostname.clone(),
            start_wall_ns: h.start_wall_ns,
            events: describe_events(h),
            values: profile
                .value_kinds
                .iter()
                .zip(profile.totals())
                .map(|(k, total)| ValueTotal {
                    name: k.name().to_string(),
                    unit: k.unit().to_string(),
                    total,
                })
                .collect(),
            frequency_hz: h.sampling.frequency_hz,
            stack_size: h.sampling.stack_size,
            processes: profile.processes.clone(),
            system: profile.header.target == lrnprof_format::Target::System,
            threads: profile
                .threads
                .iter()
                .map(|t| ThreadInfo {
                    pid: t.pid.0,
                    tid: t.tid.0,
                    name: t.name.clone(),
                    earlier_names: t.earlier_names(),
                    samples: t.trace_samples,
                    root_samples: t.root_samples,
                    idle_ticks: t.idle_ticks,
                })
                .collect(),
            images: profile.images.clone(),
            bytes_per_sample: if stats.trace_samples == 0 {
                0.0
            } else {
                stats.trace_bytes as f64 / stats.trace_samples as f64
            },
            unwound_to_root_pct: stats.root_pct(),
            syscall_stack_size: h.events.syscalls.as_ref().map(|c| c.stack_size),
            stats,
            warnings: profile.warnings.clone(),
        }
    }

    /// Human-readable text.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let st = &self.stats;
        let _ = writeln!(
            s,
            "recorder:     {} ({}/{}, host {:?})",
            self.recorder, self.os, self.arch, self.hostname
        );
        let _ = writeln!(s, "recorded:     {}", self.events);
        let _ = writeln!(
            s,
            "sampling:     {} Hz, stack copy up to {} bytes",
            self.frequency_hz, self.stack_size
        );
        let values: Vec<String> = self
            .values
            .iter()
            .map(|v| format!("{} {}", v.name, human(v.total, &v.unit)))
            .collect();
        let _ = writeln!(s, "values:       {}", values.join(", "));
        let _ = writeln!(s, "duration:     {:.3} s", st.duration_ns as f64 / 1e9);
        let _ = writeln!(
            s,
            "samples:      {} ({} lost), {:.0} bytes per sample, {} bytes of stack copies",
            st.trace_samples, st.lost_samples, self.bytes_per_sample, st.stack_bytes
        );
        if let Some(line) = events_line(&st.events) {
            let _ = writeln!(s, "events:       {line}");
        }
        let by_kind = st
            .root_by_kind_text()
            .map(|k| format!(" ({k})"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "unwound:      {:.1}% of samples to their thread's root{by_kind}, {:.1}% unknown \
             frames",
            st.root_pct(),
            st.unknown_pct()
        );
        let calls = st.root_by_kind.syscalls;
        if let Some(bytes) = self
            .syscall_stack_size
            .filter(|_| calls.samples > 0 && calls.root_samples * 2 < calls.samples)
        {
            let _ = writeln!(
                s,
                "              system calls' stacks were copied up to {bytes} bytes: most stop \
                 short of the root (lrnprof-rec --syscall-stack-size sets it)"
            );
        }
        if st.cut_short_samples > 0 {
            let _ = writeln!(
                s,
                "cut short:    {} samples' stack copies stopped at a stack page their thread had \
                 never touched ({} of them still reached the root)",
                st.cut_short_samples, st.cut_short_root_samples
            );
        }
        if st.past_copy_samples > 0 {
            let _ = writeln!(
                s,
                "too deep:     {} samples' stacks are deeper than their stack copy: their walks \
                 stop at its end, short of the root",
                st.past_copy_samples
            );
        }
        let _ = writeln!(
            s,
            "trace:        {} bytes, {}",
            st.trace_bytes,
            if st.finished {
                "finished cleanly"
            } else {
                "NOT finished cleanly"
            }
        );
        // A system-wide trace has every process of the machine: list those
        // with samples, most first.
        let mut shown: Vec<_> = self.processes.iter().collect();
        let quiet = if self.system {
            shown.retain(|p| p.samples > 0);
            shown.sort_by_key(|p| std::cmp::Reverse(p.samples));
            self.processes.len() - shown.len()
        } else {
            0
        };
        let _ = writeln!(s, "processes:    (pid samples name cgroup: command)");
        for p in shown {
            let mut command = if p.command.is_empty() {
                p.executable.clone().unwrap_or_default()
            } else {
                p.command.join(" ")
            };
            // One line per process: an argument's newline or tab is shown
            // escaped (`--json` has it as it is).
            if command.contains(char::is_control) {
                let mut escaped = String::with_capacity(command.len() + 8);
                for c in command.chars() {
                    if c.is_control() {
                        escaped.extend(c.escape_default());
                    } else {
                        escaped.push(c);
                    }
                }
                command = escaped;
            }
            if self.system && command.chars().count() > 100 {
                // One line per process; --json has the whole command.
                command = command.chars().take(99).chain(['…']).collect();
            }
            let _ = writeln!(
                s,
                "  {:>7} {:>7}  {}{} {}: {}",
                p.pid,
                p.samples,
                p.name.as_deref().unwrap_or("?"),
                if p.abi32 { " (32-bit)" } else { "" },
                p.cgroup.as_deref().unwrap_or("-"),
                command
            );
        }
        if quiet > 0 {
            let _ = writeln!(s, "  ({quiet} more processes without samples)");
        }
        let _ = writeln!(s, "threads:      (pid tid samples root% name)");
        for t in &self.threads {
            let pct = if t.samples == 0 {
                0.0
            } else {
                100.0 * t.root_samples as f64 / t.samples as f64
            };
            let idle = if t.idle_ticks == 0 {
                String::new()
            } else {
                format!("  (idle at {} ticks, not sampled)", t.idle_ticks)
            };
            let before = match t.earlier_names.is_empty() {
                true => String::new(),
                false => format!(" (before: {})", t.earlier_names.join(", ")),
            };
            let _ = writeln!(
                s,
                "  {:>7} {:>7} {:>8} {:>5.1}%  {}{before}{idle}",
                t.pid,
                t.tid,
                t.samples,
                pct,
                t.name.as_deref().unwrap_or("-")
            );
        }
        let _ = writeln!(s, "images:");
        for i in &self.images {
            if i.jit {
                // No data of its own, and its frames count under no image.
                let _ = writeln!(s, "  {} (anonymous executable memory: JIT code)", i.path);
                let _ = writeln!(
                    s,
                    "      unwind: {}; symbols: {}",
                    i.unwind_data, i.symbol_data
                );
                continue;
            }
            let id = match i.build_id.as_deref() {
                Some(h) if i.content_id => format!("no build id note; content id {h}"),
                Some(h) => format!("build id {h}"),
                None => "build id none".to_string(),
            };
            let _ = writeln!(s, "  {} ({id})", i.path);
            let _ = writeln!(
                s,
                "      unwind: {}; symbols: {}{}; {} frames",
                i.unwind_data,
                i.symbol_data,
                if i.has_debug_info {
                    " (with debug info)"
                } else {
                    ""
                },
                i.frames
            );
            for n in &i.notes {
                let _ = writeln!(s, "      note: {n}");
            }
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}
