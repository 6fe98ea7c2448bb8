//! Parsing folded stacks (`lrnprof-analyze --format folded`), to judge
//! lrnprof's stacks by the same rule as perf's.

use crate::perf_text::{StackCompleteness, ROOT_FUNCTIONS};

/// Count samples, and samples with a frame in [`ROOT_FUNCTIONS`], in folded
/// stacks: one `frame;frame;...;leaf COUNT` line per unique stack, root
/// first (the first field names the thread).
pub fn parse_folded(text: &str) -> StackCompleteness {
    let mut out = StackCompleteness::default();
    for line in text.lines() {
        let Some((stack, count)) = line.trim_end().rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        out.samples += count;
        if stack.split(';').any(|f| ROOT_FUNCTIONS.contains(&f)) {
            out.reached_root += count;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_counts_are_weighted() {
        let text = "\
worker-a-1013;clone3;start_thread;worker_main;leaf_work 85
py-7;_start;__libc_start_main_impl;main;eval 10
py-7;python3.11+0x6556cc;eval 5
not a stack line
";
        let c = parse_folded(text);
        assert_eq!(c.samples, 100);
        assert_eq!(c.reached_root, 95);
        assert_eq!(c.lost_events, 0);
    }

    #[test]
    fn a_frame_merely_containing_a_root_name_does_not_count() {
        let c = parse_folded("t-1;my_start_thread;_start_helper 3\n");
        assert_eq!((c.samples, c.reached_root), (3, 0));
    }
}
