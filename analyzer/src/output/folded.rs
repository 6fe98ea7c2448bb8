//! Folded stacks: one `thread;root;...;leaf COUNT` line per unique stack,
//! sorted, as flamegraph.pl and inferno read them. The root frame is the
//! thread's label (`NAME-TID`), so threads stay apart.

use super::ProfileWriter;
use crate::profile::Profile;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// Writes folded stacks (counts are samples).
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldedWriter;

/// Frame names may not hold the separator or line breaks.
fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

impl ProfileWriter for FoldedWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        for stack in &profile.stacks {
            let mut line = clean(&profile.threads[stack.thread as usize].label());
            for name in profile.stack_names(stack) {
                line.push(';');
                line.push_str(&clean(name));
            }
            *lines.entry(line).or_default() += stack.samples;
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
