//! `lrnprof-analyze diff BASE NEW`: which functions got slower or faster
//! between two profiles, as a table and as a differential flame graph.
//!
//! Each profile is normalized by its total of the shown value, so a
//! longer or busier recording does not make everything look slower:
//! functions are compared by their *share* of their profile (self and
//! total, as [`top`](crate::TopReport) counts them), and ranked by how
//! much their self share changed, like `pprof -diff_base -normalize`.
//! Functions are matched by name, threads (the graph's bottom frames) by
//! name without their tids, which differ between recordings.

use crate::output::{folded_lines, thread_root, FlameGraph};
use crate::profile::{Profile, ValueKind};
use crate::top::{costs, function_label, write_table};
use crate::units::{describe, percent, with_unit};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};

/// One function of a [`DiffReport`]: its shares of each profile's total,
/// in percent.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffRow {
    /// The function's name.
    pub name: String,
    /// Its source file, when known (in the new profile, else the base).
    pub file: Option<String>,
    /// Self share in the base profile.
    pub base_self: f64,
    /// Self share in the new profile.
    pub new_self: f64,
    /// Total share in the base profile.
    pub base_total: f64,
    /// Total share in the new profile.
    pub new_total: f64,
}

impl DiffRow {
    /// Change of the self share, in percentage points (positive: slower).
    pub fn self_change(&self) -> f64 {
        self.new_self - self.base_self
    }
    /// Change of the total share, in percentage points.
    pub fn total_change(&self) -> f64 {
        self.new_total - self.base_total
    }
}

/// What changed between two profiles.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffReport {
    /// The value compared.
    pub value: ValueKind,
    /// The base trace's file name and total of the value.
    pub base: (String, u64),
    /// The new trace's file name and total of the value.
    pub new: (String, u64),
    /// Functions with a changed share, the largest change of self share
    /// first (then of total share), at most the limit asked for.
    pub rows: Vec<DiffRow>,
    /// Functions compared (in either profile).
    pub functions: usize,
}

/// A function's self and total amounts and its source file.
type NamedCosts<'a> = (u64, u64, Option<&'a str>);

/// Per function name: its [`NamedCosts`] of `kind`; and the total of `kind`.
fn by_name(profile: &Profile, kind: ValueKind) -> (HashMap<&str, NamedCosts<'_>>, u64) {
    let Some(index) = profile.value_index(kind) else {
        return (HashMap::new(), 0);
    };
    let mut names: HashMap<&str, u32> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let group: Vec<u32> = profile
        .functions
        .iter()
        .map(|f| {
            *names.entry(&f.name).or_insert_with(|| {
                order.push(&f.name);
                order.len() as u32 - 1
            })
        })
        .collect();
    let mut files: Vec<Option<&str>> = vec![None; order.len()];
    for (f, &g) in profile.functions.iter().zip(&group) {
        files[g as usize] = files[g as usize].or(f.file.as_deref());
    }
    let costs = costs(profile, index, &group, order.len());
    let total = profile
        .stacks
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.values[index]));
    let map = order
        .iter()
        .zip(costs)
        .zip(files)
        .filter(|((_, c), _)| c.total_value > 0)
        .map(|((&name, c), file)| (name, (c.self_value, c.total_value, file)))
        .collect();
    (map, total)
}

impl DiffReport {
    /// Compare value `kind` of `base` and `new`; keep the `limit` largest
    /// changes (0: all).
    pub fn new(base: &Profile, new: &Profile, kind: ValueKind, limit: usize) -> DiffReport {
        let (b, base_total) = by_name(base, kind);
        let (n, new_total) = by_name(new, kind);
        let share = |v: u64, total: u64| percent(v as f64, total as f64);
        let mut names: Vec<&str> = b.keys().chain(n.keys()).copied().collect();
        names.sort_unstable();
        names.dedup();
        let functions = names.len();
        let mut rows: Vec<DiffRow> = names
            .into_iter()
            .map(|name| {
                let (bs, bt, bf) = b.get(name).copied().unwrap_or_default();
                let (ns, nt, nf) = n.get(name).copied().unwrap_or_default();
                DiffRow {
                    name: name.to_string(),
                    file: nf.or(bf).map(str::to_string),
                    base_self: share(bs, base_total),
                    new_self: share(ns, new_total),
                    base_total: share(bt, base_total),
                    new_total: share(nt, new_total),
                }
            })
            .filter(|r| r.self_change() != 0.0 || r.total_change() != 0.0)
            .collect();
        rows.sort_by(|x, y| {
            let key = |r: &DiffRow| (r.self_change().abs(), r.total_change().abs());
            key(y)
                .partial_cmp(&key(x))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| x.name.cmp(&y.name))
        });
        if limit > 0 {
            rows.truncate(limit);
        }
        DiffReport {
            value: kind,
            base: (base.trace_name.clone(), base_total),
            new: (new.trace_name.clone(), new_total),
            rows,
            functions,
        }
    }

    /// The table as text for a terminal.
    pub fn to_text(&self) -> String {
        let kind = self.value;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {} -> {} {}: {} ({}) as shares of each total; {} of {} functions by change of self share",
            self.base.0,
            with_unit(kind, self.base.1 as f64),
            self.new.0,
            with_unit(kind, self.new.1 as f64),
            describe(kind),
            kind.name(),
            self.rows.len(),
            self.functions,
        );
        let pct = |v: f64| format!("{v:.1}%");
        let change = |v: f64| match format!("{v:+.1}%") {
            // No sign on what did not change (or less than it shows).
            c if c == "+0.0%" || c == "-0.0%" => "0.0%".to_string(),
            c => c,
        };
        let cells: Vec<[String; 7]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    change(r.self_change()),
                    pct(r.base_self),
                    pct(r.new_self),
                    change(r.total_change()),
                    pct(r.base_total),
                    pct(r.new_total),
                    function_label(&r.name, r.file.as_deref(), None),
                ]
            })
            .collect();
        let header = [
            "Δself",
            "base self",
            "new self",
            "Δtotal",
            "base total",
            "new total",
            "function",
        ];
        write_table(&mut out, &header, &cells);
        out
    }
}

/// A differential flame graph of value `kind` (inferno's, after Brendan
/// Gregg's): frames as wide as in `new`, red where they grew since `base`
/// and blue where they shrank, `base` scaled to `new`'s total first.
pub fn write_diff_svg(
    base: &Profile,
    new: &Profile,
    kind: ValueKind,
    out: &mut dyn Write,
) -> io::Result<()> {
    let folded = |p: &Profile| -> (String, u64) {
        let Some(index) = p.value_index(kind) else {
            return (String::new(), 0);
        };
        let mut text = String::new();
        let mut total = 0u64;
        for (stack, count) in folded_lines(p, index, thread_root) {
            let _ = writeln!(text, "{stack} {count}");
            total = total.saturating_add(count);
        }
        (text, total)
    };
    let (before, _) = folded(base);
    let (after, total) = folded(new);
    if total == 0 {
        return Err(io::Error::other(format!(
            "nothing to draw: {} has no {} (choose another --value)",
            new.trace_name,
            kind.name()
        )));
    }
    let mut merged = Vec::new();
    let options = inferno::differential::Options {
        normalize: true,
        strip_hex: false,
    };
    inferno::differential::from_readers(options, before.as_bytes(), after.as_bytes(), &mut merged)?;
    let merged = String::from_utf8(merged).map_err(io::Error::other)?;
    let lines: Vec<String> = merged.lines().map(str::to_string).collect();
    FlameGraph {
        title: format!(
            "{} → {}: {}",
            base.trace_name,
            new.trace_name,
            describe(kind)
        ),
        subtitle: format!(
            "Widths: {}; red grew, blue shrank, as shares of each total. Click a frame to zoom, Ctrl-F to search.",
            new.trace_name
        ),
        kind,
        total,
        lines: &lines,
    }
    .write(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};

    /// The test profile with `other` (main -> other) `factor` times as
    /// heavy.
    fn heavier_other(factor: u64) -> Profile {
        let mut p = profile();
        p.trace_name = "new.lpt".into();
        for v in &mut p.stacks[1].values {
            *v *= factor;
        }
        p
    }

    #[test]
    fn the_function_that_grew_comes_first() {
        let base = profile();
        let new = heavier_other(4);
        let r = DiffReport::new(&base, &new, ValueKind::Cpu, 0);
        // other: 1 of 5 -> 4 of 8 of the total.
        assert_eq!(r.rows[0].name, "other");
        assert!((r.rows[0].base_self - 20.0).abs() < 1e-9);
        assert!((r.rows[0].new_self - 50.0).abs() < 1e-9);
        let leaf = r.rows.iter().find(|x| x.name == "leaf").unwrap();
        assert!(leaf.self_change() < 0.0);
        check_expected("small.diff.txt", r.to_text().as_bytes());
        // Twice the whole recording: no change at all.
        let mut twice = profile();
        for s in &mut twice.stacks {
            for v in &mut s.values {
                *v *= 2;
            }
        }
        assert!(DiffReport::new(&base, &twice, ValueKind::Cpu, 0)
            .rows
            .is_empty());
    }

    #[test]
    fn differential_flame_graph() {
        let mut out = Vec::new();
        write_diff_svg(&profile(), &heavier_other(4), ValueKind::Cpu, &mut out).unwrap();
        check_expected("small.diff.svg", &out);
        let text = String::from_utf8(out).unwrap();
        // inferno's tooltips carry the change: other grew by 30 points.
        assert!(text.contains("other ("), "{text}");
        assert!(text.contains("+3"), "no positive change in {text}");
    }
}
