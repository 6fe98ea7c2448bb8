//! Interactive flame graphs: one self-contained SVG (inferno, the Rust port
//! of flamegraph.pl) with its script for search (Ctrl-F) and click to
//! zoom. Widths are the shown value (`--value`, CPU time by default); the
//! frame below each stack is its thread's name, without the tid, so that
//! the workers of a pool add up into one tower.

use super::folded::folded_lines;
use super::ProfileWriter;
use crate::profile::{Profile, ThreadProfile, ValueKind};
use crate::units::{describe, flame_scale, with_unit};
use inferno::flamegraph::{self, Options};
use std::io::{self, Write};

/// Writes a flame graph SVG of the shown value.
#[derive(Debug, Clone, Copy, Default)]
pub struct SvgWriter;

/// A thread's frame in flame graphs: its name without the tid, so that
/// threads of one name, and the same thread in two recordings (`diff`),
/// share a tower.
pub(crate) fn thread_root(thread: &ThreadProfile) -> String {
    thread
        .name
        .clone()
        .unwrap_or_else(|| "(unnamed thread)".to_string())
}

/// What a flame graph shows, besides its stacks.
pub(crate) struct FlameGraph<'a> {
    /// The title line.
    pub title: String,
    /// The line under it.
    pub subtitle: String,
    /// The value the counts are amounts of.
    pub kind: ValueKind,
    /// The sum of the counts (of the second column, in a differential
    /// graph), which picks the unit shown.
    pub total: u64,
    /// Folded lines, `root;...;leaf COUNT` or, differential,
    /// `root;...;leaf BEFORE AFTER`.
    pub lines: &'a [String],
}

impl FlameGraph<'_> {
    /// Draw it into `out`.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let (factor, unit) = flame_scale(self.kind, self.total);
        let mut options = Options::default();
        options.title = self.title.clone();
        options.subtitle = Some(self.subtitle.clone());
        options.count_name = unit.to_string();
        options.factor = factor;
        // Colors from the names' hashes: the same function gets the same
        // color in every graph, and output is byte-identical (inferno's
        // default draws them from a generator whose state lives on).
        options.hash = true;
        flamegraph::from_lines(&mut options, self.lines.iter().map(String::as_str), out)
    }
}

impl ProfileWriter for SvgWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let kind = profile
            .shown_value()
            .ok_or_else(|| io::Error::other("the trace recorded no value to draw"))?;
        let index = profile
            .value_index(kind)
            .ok_or_else(|| io::Error::other(format!("the trace has no {} value", kind.name())))?;
        let folded = folded_lines(profile, index, thread_root);
        if folded.is_empty() {
            return Err(io::Error::other(if profile.stats.samples == 0 {
                "nothing to draw: no samples".to_string()
            } else {
                format!(
                    "nothing to draw: no sample of the selection has any {} (choose another --value)",
                    kind.name()
                )
            }));
        }
        let total = folded.values().fold(0u64, |a, &c| a.saturating_add(c));
        let threads = profile
            .threads
            .iter()
            .filter(|t| t.values.get(index).is_some_and(|&v| v > 0))
            .count();
        let lines: Vec<String> = folded.iter().map(|(s, c)| format!("{s} {c}")).collect();
        FlameGraph {
            title: format!("{}: {}", profile.trace_name, describe(kind)),
            subtitle: format!(
                "{} in {threads} thread{}. Click a frame to zoom, Ctrl-F to search.",
                with_unit(kind, total as f64),
                if threads == 1 { "" } else { "s" }
            ),
            kind,
            total,
            lines: &lines,
        }
        .write(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};

    #[test]
    fn expected_output() {
        let mut out = Vec::new();
        SvgWriter.write(&profile(), &mut out).unwrap();
        check_expected("small.svg", &out);
        let text = String::from_utf8(out.clone()).unwrap();
        for name in ["main", "work", "leaf", "other", "0x1234", "t.lpt: CPU time"] {
            assert!(text.contains(name), "{name} missing");
        }
        // The same bytes a second time in the same process (inferno's
        // default colors would differ).
        let mut again = Vec::new();
        SvgWriter.write(&profile(), &mut again).unwrap();
        assert!(out == again);
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let mut p = profile();
        for s in &mut p.stacks {
            s.values = vec![0, 0];
        }
        let err = SvgWriter.write(&p, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("nothing to draw"), "{err}");
    }
}
