//! Folded stacks: one `thread;root;...;leaf COUNT` line per unique stack,
//! sorted, as flamegraph.pl and inferno read them. The root frame is the
//! thread's label (`NAME-TID`), so threads stay apart. COUNT is the
//! selected value, by default the number of CPU samples (or, in a trace
//! without them, its primary value, e.g. bytes in use).

use super::ProfileWriter;
use crate::profile::{Profile, ThreadProfile, ValueKind};
use std::collections::BTreeMap;
use std::io::{self, Write};

/// Writes folded stacks (counts are the selected value, by default samples).
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldedWriter;

/// Frame names may not hold the separator or line breaks.
fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// The value folded output counts: the selected one, else CPU samples,
/// else the profile's primary value.
fn counted_value(profile: &Profile) -> Option<ValueKind> {
    profile.selected.or_else(|| {
        if profile.value_index(ValueKind::Samples).is_some() {
            Some(ValueKind::Samples)
        } else {
            profile.primary_value()
        }
    })
}

/// Folded stacks of `profile`, `root;...;leaf` -> the total of value
/// `index`, sorted, stacks worth nothing left out. `root` names a thread's
/// frame below the stack: stacks whose roots have the same name add up.
pub(crate) fn folded_lines(
    profile: &Profile,
    index: usize,
    root: impl Fn(&ThreadProfile) -> String,
) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &profile.stacks {
        let count = stack.values[index];
        if count == 0 {
            continue;
        }
        let mut line = clean(&root(&profile.threads[stack.thread as usize]));
        for name in profile.stack_names(stack) {
            line.push(';');
            line.push_str(&clean(name));
        }
        let sum = lines.entry(line).or_default();
        *sum = sum.saturating_add(count);
    }
    lines
}

impl ProfileWriter for FoldedWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let Some(index) = counted_value(profile).and_then(|v| profile.value_index(v)) else {
            return Ok(());
        };
        for (line, count) in folded_lines(profile, index, ThreadProfile::label) {
            writeln!(out, "{line} {count}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};

    #[test]
    fn expected_output() {
        let mut out = Vec::new();
        FoldedWriter.write(&profile(), &mut out).unwrap();
        check_expected("small.folded", &out);
    }
}
