//! Pure parsers of `perf` text output: `perf report --stats` and
//! `perf script`.

/// Functions that only ever sit at the bottom of a user stack: the entry
/// point of the main thread (and the libc functions it calls main from), and
/// the entry points of threads made by `clone`/`pthread_create`.
pub const ROOT_FUNCTIONS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__clone_internal",
    "start_thread",
];

/// Sample counts from `perf report --stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerfStats {
    /// Samples written to the file.
    pub samples: u64,
    /// Samples the kernel dropped (`LOST_SAMPLES` of the event).
    pub lost_samples: u64,
}

/// Read the sample and lost-sample counts from `perf report --stats` output.
///
/// The per-event sections (`cpu-clock stats:`) count samples; the
/// `Aggregated stats:` section counts records, where `LOST_SAMPLES` is the
/// number of records, not of samples, so it is used only for `SAMPLE` and only
/// when no per-event section exists (older perf). `None` if the text is not
/// `--stats` output at all.
pub fn parse_perf_stats(text: &str) -> Option<PerfStats> {
    let mut aggregated_samples = None;
    let mut event_stats: Option<PerfStats> = None;
    let mut in_event_section = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.ends_with("stats:") {
            in_event_section = trimmed != "Aggregated stats:";
            continue;
        }
        let Some((name, rest)) = trimmed.split_once(" events:") else {
            continue;
        };
        let Some(count) = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        match (in_event_section, name.trim()) {
            (false, "SAMPLE") => aggregated_samples = Some(count),
            (true, "SAMPLE") => event_stats.get_or_insert_with(PerfStats::default).samples += count,
            (true, "LOST_SAMPLES") => {
                event_stats
                    .get_or_insert_with(PerfStats::default)
                    .lost_samples += count
            }
            _ => {}
        }
    }
    // A recording without samples has no SAMPLE line at all.
    let any_stats = text
        .lines()
        .any(|l| l.trim_start().starts_with("TOTAL events:"));
    event_stats
        .or(aggregated_samples.map(|samples| PerfStats {
            samples,
            lost_samples: 0,
        }))
        .or(any_stats.then(PerfStats::default))
}

/// How many user stacks of a `perf script` listing reach a root function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackCompleteness {
    /// Samples listed.
    pub samples: u64,
    /// Samples with at least one frame in [`ROOT_FUNCTIONS`].
    pub reached_root: u64,
    /// Events dropped, summed over `PERF_RECORD_LOST` lines (shown with
    /// `--show-lost-events`).
    pub lost_events: u64,
}

impl StackCompleteness {
    /// Percentage of samples that reached a root function.
    pub fn root_pct(&self) -> Option<f64> {
        crate::stats::percent(self.reached_root as f64, self.samples as f64)
    }
}

/// Count samples, samples whose stack reaches a root function, and lost
/// events in default `perf script` output.
///
/// A sample is a header line starting in column 0, followed by its frames,
/// one per indented line (`<address> <symbol>+<offset> (<dso>)`). A frame
/// below a root function can only be a bad unwind step, so any root frame
/// in the stack counts, which is generous to the unwinder.
pub fn parse_perf_script(text: &str) -> StackCompleteness {
    let mut out = StackCompleteness::default();
    let mut in_sample = false;
    let mut sample_reached = false;
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with([' ', '\t']) {
            if in_sample && sample_reached {
                out.reached_root += 1;
            }
            if let Some(lost) = lost_count(line) {
                out.lost_events += lost;
                in_sample = false;
            } else {
                in_sample = !line.contains("PERF_RECORD_");
                if in_sample {
                    out.samples += 1;
                }
            }
            sample_reached = false;
            continue;
        }
        if in_sample && !sample_reached {
            sample_reached = frame_symbol(line).is_some_and(|s| ROOT_FUNCTIONS.contains(&s));
        }
    }
    if in_sample && sample_reached {
        out.reached_root += 1;
    }
    out
}

/// `N` of a `... PERF_RECORD_LOST lost N` line.
fn lost_count(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("PERF_RECORD_LOST lost ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The function name of a `perf script` frame line, without `+0x..` offset.
fn frame_symbol(line: &str) -> Option<&str> {
    let (_address, rest) = line.trim().split_once(' ')?;
    let symbol = match rest.rfind(" (") {
        Some(i) => &rest[..i],
        None => rest,
    };
    Some(match symbol.rfind("+0x") {
        Some(i) => &symbol[..i],
        None => symbol,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const STATS: &str = "
Aggregated stats:
           TOTAL events:         47
            LOST events:         11  (23.4%)
          SAMPLE events:       1767  (95.1%)
    LOST_SAMPLES events:          1  ( 2.1%)
cpu-clock stats:
          SAMPLE events:       1700
    LOST_SAMPLES events:         67
";

    #[test]
    fn stats_prefer_the_event_section() {
        assert_eq!(
            parse_perf_stats(STATS),
            Some(PerfStats {
                samples: 1700,
                lost_samples: 67
            })
        );
    }

    #[test]
    fn stats_without_samples_count_zero() {
        let text = "Aggregated stats:\n  TOTAL events:  12\n   COMM events:  2  (16.7%)\n";
        assert_eq!(parse_perf_stats(text), Some(PerfStats::default()));
    }

    #[test]
    fn stats_fall_back_to_aggregated_samples() {
        let text = "Aggregated stats:\n   TOTAL events: 5\n  SAMPLE events:   42  (9.0%)\n";
        assert_eq!(
            parse_perf_stats(text),
            Some(PerfStats {
                samples: 42,
                lost_samples: 0
            })
        );
        assert_eq!(parse_perf_stats("no data here\n"), None);
    }

    #[rustfmt::skip]
    const SCRIPT: &str = "\
deep 16353   923.420579:    1000000 cpu-clock: 
\t            11b0 leaf+0x20 (/tmp/deep)
\t            1227 rec+0x57 (/tmp/deep)
\t    7f0000001000 __libc_start_call_main+0x7a (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t            1071 _start+0x21 (/tmp/deep)

deep 16353   923.421579:    1000000 cpu-clock: 
\t            11b0 leaf+0x20 (/tmp/deep)
\t            1227 rec+0x57 (/tmp/deep)
\t               0 [unknown] ([unknown])

deep 16353   923.421600: PERF_RECORD_LOST lost 3
worker 16354   923.422579:    1000000 cpu-clock: 
\t            2000 work+0x10 (/tmp/deep)
\t    7f0000002000 start_thread+0xf2 (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t    7f0000003000 clone3+0x2c (/usr/lib/x86_64-linux-gnu/libc.so.6)

deep 16353   923.421700: PERF_RECORD_LOST lost 4
deep 16353   923.422579:    1000000 cpu-clock: 
";

    #[test]
    fn script_counts_roots_samples_and_lost() {
        let c = parse_perf_script(SCRIPT);
        assert_eq!(c.samples, 4, "the frameless last sample counts: {c:?}");
        assert_eq!(c.reached_root, 2, "{c:?}");
        assert_eq!(c.lost_events, 7, "{c:?}");
        assert_eq!(c.root_pct(), Some(50.0));
    }

    #[test]
    fn script_root_in_the_last_sample_counts() {
        let text = "a 1 1.0: 1 cpu-clock:\n\t 10 main+0x1 (/a)\n\t 20 _start+0x2 (/a)\n";
        assert_eq!(parse_perf_script(text).reached_root, 1);
    }

    #[test]
    fn frame_symbols_keep_spaces_and_drop_offsets() {
        assert_eq!(
            frame_symbol("\t 4011 ns::f(int, char) const+0x11 (/bin/x)"),
            Some("ns::f(int, char) const")
        );
        assert_eq!(
            frame_symbol("\t 0 [unknown] ([unknown])"),
            Some("[unknown]")
        );
        assert_eq!(frame_symbol("\t 4011 _start (/bin/x)"), Some("_start"));
        assert_eq!(frame_symbol("\t"), None);
    }
}
