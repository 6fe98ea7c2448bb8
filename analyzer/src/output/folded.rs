//! Folded stacks: one `thread;root;...;leaf COUNT` line per unique stack,
//! sorted, as flamegraph.pl and inferno read them. The root frame is the
//! thread's label (`NAME-TID`), so threads stay apart. COUNT is the
//! selected value, by default the number of CPU samples (or, in a trace
//! without them, its primary value, e.g. bytes in use).

use super::ProfileWriter;
use crate::profile::{Profile, ValueKind};
use std::collections::BTreeMap;
use std::io::{self, Write};

/// Writes folded stacks (counts are the selected value, by default samples).
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldedWriter;

/// Frame names may not hold the separator or line breaks.
fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

impl ProfileWriter for FoldedWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let value = profile.selected.or_else(|| {
            if profile.value_index(ValueKind::Samples).is_some() {
                Some(ValueKind::Samples)
            } else {
                profile.primary_value()
            }
        });
        let Some(index) = value.and_then(|v| profile.value_index(v)) else {
            return Ok(());
        };
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        for stack in &profile.stacks {
            let count = stack.values[index];
            if count == 0 {
                continue;
            }
            let mut line = clean(&profile.threads[stack.thread as usize].label());
            for name in profile.stack_names(stack) {
                line.push(';');
                line.push_str(&clean(name));
            }
            *lines.entry(line).or_default() += count;
        }
        for (line, count) in lines {
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
