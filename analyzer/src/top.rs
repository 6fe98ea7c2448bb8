//! `lrnprof-analyze top`: the hottest functions of a profile as a table
//! for the terminal, like `perf report --stdio` or `pprof -top`.
//!
//! A function's *self* amount is what the samples in which it is the leaf
//! (the innermost inline level of the innermost frame) weigh; its *total*
//! what the samples weigh in which it is anywhere on the stack, each
//! stack counted once however often the function recurs in it.

use crate::profile::{Profile, ValueKind};
use crate::units::{describe, human, percent, with_unit};
use std::fmt::Write as _;
use std::path::Path;

/// What `top` sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TopOrder {
    /// Self amounts: where the time (or memory, ...) is spent.
    #[default]
    SelfValue,
    /// Total amounts: what the function and its callees cost.
    Total,
}

/// Options of [`TopReport::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopOptions {
    /// Rows to show at most; 0 for every function.
    pub limit: usize,
    /// The sort order.
    pub by: TopOrder,
}

impl Default for TopOptions {
    fn default() -> TopOptions {
        TopOptions {
            limit: 20,
            by: TopOrder::SelfValue,
        }
    }
}

/// What samples of one function (or group of functions) add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Costs {
    pub self_value: u64,
    pub total_value: u64,
    pub self_samples: u64,
    pub total_samples: u64,
}

/// The [`Costs`] of value `index` per group of functions: `group[f]` is
/// the group of function `f`, `groups` their number. Stacks worth nothing
/// of the value are left out.
pub(crate) fn costs(profile: &Profile, index: usize, group: &[u32], groups: usize) -> Vec<Costs> {
    let mut out = vec![Costs::default(); groups];
    // Samples of the value's own kind: a stack that system calls and CPU
    // samples share counts only its calls in a syscall view.
    let slot = profile.value_kinds[index].event_kind().index();
    // The last stack (+1) that counted each group's total: once per stack.
    let mut counted = vec![0u32; groups];
    for (id, stack) in profile.stacks.iter().enumerate() {
        let value = stack.values[index];
        if value == 0 {
            continue;
        }
        let stamp = id as u32 + 1;
        let leaf = stack
            .locations
            .first()
            .and_then(|&l| profile.locations[l as usize].lines.first());
        if let Some(leaf) = leaf {
            let c = &mut out[group[leaf.function as usize] as usize];
            c.self_value = c.self_value.saturating_add(value);
            c.self_samples += stack.kind_samples[slot];
        }
        for &loc in &stack.locations {
            for line in &profile.locations[loc as usize].lines {
                let g = group[line.function as usize] as usize;
                if counted[g] != stamp {
                    counted[g] = stamp;
                    out[g].total_value = out[g].total_value.saturating_add(value);
                    out[g].total_samples += stack.kind_samples[slot];
                }
            }
        }
    }
    out
}

/// One function of a [`TopReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopRow {
    /// The function's name.
    pub name: String,
    /// Its source file and first sampled line, when known.
    pub file: Option<String>,
    /// The lowest sampled line in it, when known.
    pub line: Option<u32>,
    /// Amount of the value in samples where it is the leaf.
    pub self_value: u64,
    /// Amount of the value in samples where it is on the stack.
    pub total_value: u64,
    /// Samples (events) counted in the sorted column: where it is the
    /// leaf (by self) or on the stack (by total).
    pub samples: u64,
}

/// The hottest functions of a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct TopReport {
    /// The trace's file name.
    pub trace_name: String,
    /// The value shown, `None` if the trace recorded none.
    pub value: Option<ValueKind>,
    /// The value's total over the profile.
    pub total: u64,
    /// Samples (events) with some of the value.
    pub samples: u64,
    /// Threads with some of the value.
    pub threads: usize,
    /// The sort order.
    pub by: TopOrder,
    /// Functions with some of the value.
    pub functions: usize,
    /// The rows, hottest first, at most [`TopOptions::limit`].
    pub rows: Vec<TopRow>,
}

impl TopReport {
    /// The table of `profile`'s shown value
    /// ([`Profile::shown_value`], the `--value` option).
    pub fn new(profile: &Profile, options: &TopOptions) -> TopReport {
        let value = profile.shown_value();
        let mut report = TopReport {
            trace_name: profile.trace_name.clone(),
            value,
            total: 0,
            samples: 0,
            threads: 0,
            by: options.by,
            functions: 0,
            rows: Vec::new(),
        };
        let Some(index) = value.and_then(|v| profile.value_index(v)) else {
            return report;
        };
        let slot = profile.value_kinds[index].event_kind().index();
        for s in profile.stacks.iter().filter(|s| s.values[index] > 0) {
            report.total = report.total.saturating_add(s.values[index]);
            report.samples += s.kind_samples[slot];
        }
        report.threads = profile
            .threads
            .iter()
            .filter(|t| t.values[index] > 0)
            .count();
        let identity: Vec<u32> = (0..profile.functions.len() as u32).collect();
        let costs = costs(profile, index, &identity, identity.len());
        let mut rows: Vec<TopRow> = costs
            .iter()
            .zip(&profile.functions)
            .filter(|(c, _)| c.total_value > 0)
            .map(|(c, f)| TopRow {
                name: f.name.clone(),
                file: f.file.clone(),
                line: f.first_line,
                self_value: c.self_value,
                total_value: c.total_value,
                samples: match options.by {
                    TopOrder::SelfValue => c.self_samples,
                    TopOrder::Total => c.total_samples,
                },
            })
            .collect();
        report.functions = rows.len();
        // Ties by the other amount, then by name: the order never depends
        // on the order functions were first seen in.
        rows.sort_by(|a, b| {
            let key = |r: &TopRow| match options.by {
                TopOrder::SelfValue => (r.self_value, r.total_value),
                TopOrder::Total => (r.total_value, r.self_value),
            };
            key(b)
                .cmp(&key(a))
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| a.file.cmp(&b.file))
        });
        if options.limit > 0 {
            rows.truncate(options.limit);
        }
        report.rows = rows;
        report
    }

    /// The table as text for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let Some(kind) = self.value else {
            return "the trace recorded no value to show\n".to_string();
        };
        let by = match self.by {
            TopOrder::SelfValue => "self",
            TopOrder::Total => "total",
        };
        let samples = match kind {
            ValueKind::Samples => String::new(),
            _ => format!(" in {} samples", self.samples),
        };
        let _ = writeln!(
            out,
            "{}: {} ({}), {}{samples} of {} thread{}; {} of {} functions by {by}",
            self.trace_name,
            describe(kind),
            kind.name(),
            with_unit(kind, self.total as f64),
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.rows.len(),
            self.functions,
        );
        let total = self.total as f64;
        let cells: Vec<[String; 6]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    human(kind, r.self_value as f64),
                    format!("{:.1}%", percent(r.self_value as f64, total)),
                    human(kind, r.total_value as f64),
                    format!("{:.1}%", percent(r.total_value as f64, total)),
                    r.samples.to_string(),
                    function_label(&r.name, r.file.as_deref(), r.line),
                ]
            })
            .collect();
        let header = ["self", "self%", "total", "total%", "samples", "function"];
        write_table(&mut out, &header, &cells);
        out
    }
}

/// `name (file.c:12)`, with the file's name only, or `name`.
pub(crate) fn function_label(name: &str, file: Option<&str>, line: Option<u32>) -> String {
    match (file, line) {
        (Some(f), line) => {
            let f = Path::new(f)
                .file_name()
                .map_or_else(|| f.to_string(), |n| n.to_string_lossy().into_owned());
            match line {
                Some(l) => format!("{name} ({f}:{l})"),
                None => format!("{name} ({f})"),
            }
        }
        (None, _) => name.to_string(),
    }
}

/// Columns right-aligned to their widest cell, the last one left-aligned
/// and unpadded (function names of any length).
pub(crate) fn write_table<const N: usize>(
    out: &mut String,
    header: &[&str; N],
    rows: &[[String; N]],
) {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
                text.push_str("  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};
    use crate::profile::EventKind;

    #[test]
    fn self_and_total() {
        let p = profile();
        let r = TopReport::new(&p, &TopOptions::default());
        assert_eq!(r.value, Some(ValueKind::Cpu));
        assert_eq!(r.total, 5_000_000);
        let row = |name: &str| r.rows.iter().find(|x| x.name == name).unwrap().clone();
        // leaf (inlined into work) is the leaf of 3 of 5 samples.
        assert_eq!(r.rows[0].name, "leaf");
        assert_eq!(row("leaf").self_value, 3_000_000);
        assert_eq!(row("work").self_value, 0);
        assert_eq!(row("work").total_value, 3_000_000);
        assert_eq!(row("main").total_value, 4_000_000);
        assert_eq!(row("other").self_value, 1_000_000);
        assert_eq!(r.functions, 5);
        check_expected("small.top.txt", r.to_text().as_bytes());

        let by_total = TopReport::new(
            &p,
            &TopOptions {
                limit: 2,
                by: TopOrder::Total,
            },
        );
        let names: Vec<&str> = by_total.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["main", "leaf"]);
        assert_eq!(by_total.rows[0].samples, 4);
    }

    #[test]
    fn recursion_counts_once_in_total() {
        let mut p = profile();
        // main -> work -> leaf, main again below (recursion).
        p.stacks[0].locations = vec![0, 1, 1];
        let r = TopReport::new(&p, &TopOptions::default());
        let main = r.rows.iter().find(|x| x.name == "main").unwrap();
        assert_eq!(main.total_value, 4_000_000);
    }

    #[test]
    fn the_value_follows_the_selection() {
        let mut p = profile();
        p.selected = Some(ValueKind::Samples);
        let r = TopReport::new(&p, &TopOptions::default());
        assert_eq!(r.total, 5);
        assert!(r
            .to_text()
            .contains("CPU samples (samples), 5 samples of 2 threads"));
    }

    /// Where system calls and CPU samples share a stack, a syscall view
    /// counts the calls only, and the CPU view the CPU samples only.
    #[test]
    fn samples_are_counted_of_the_value_s_own_kind() {
        let mut p = profile();
        p.value_kinds
            .extend([ValueKind::Syscalls, ValueKind::SyscallTime]);
        for (stack, calls) in p.stacks.iter_mut().zip([2u64, 0, 0]) {
            stack.samples += calls;
            stack.kind_samples[EventKind::Syscalls.index()] = calls;
            stack.values.extend([calls, calls * 500]);
        }
        for (thread, calls) in p.threads.iter_mut().zip([2u64, 0]) {
            thread.values.extend([calls, calls * 500]);
        }
        let cpu = TopReport::new(&p, &TopOptions::default());
        assert_eq!((cpu.samples, cpu.rows[0].samples), (5, 3));
        p.selected = Some(ValueKind::SyscallTime);
        let calls = TopReport::new(&p, &TopOptions::default());
        assert_eq!(calls.total, 1_000);
        assert_eq!(calls.samples, 2);
        assert_eq!(calls.rows[0].name, "leaf");
        assert_eq!(calls.rows[0].samples, 2);
    }
}
