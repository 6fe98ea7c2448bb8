//! `tests/fixtures/heap_phases.c`: memory in use at a chosen time. The
//! fixture allocates and frees in four phases and writes the time each
//! phase ended (`CLOCK_MONOTONIC`, the trace's clock) to a file; the
//! analyzer, asked with `--to` for the memory in use at each of those
//! times, must give exactly what the fixture held then.

use super::{folded_with, per_site, record_heap};
use lrnprof_format::{Clock, TraceReader};
use lrnprof_tests::{build_c, remove_scratch_dir, require_perf, scratch_dir};
use std::collections::BTreeMap;
use std::path::Path;

const SITES: &[&str] = &["first_site", "second_site", "third_site"];

/// Bytes and blocks in use per site at the end of each phase, as the
/// fixture's comment states.
fn held(phase: usize) -> BTreeMap<String, (u64, u64)> {
    let sites: &[(&str, u64, u64)] = match phase {
        1 => &[("first_site", 10_000, 10)],
        2 => &[("first_site", 5_000, 5), ("second_site", 60_000, 20)],
        3 => &[("first_site", 5_000, 5), ("third_site", 200_000, 4)],
        _ => &[],
    };
    sites
        .iter()
        .map(|&(s, bytes, blocks)| (s.to_string(), (bytes, blocks)))
        .collect()
}

/// The phases' end times the fixture wrote, `PHASE NANOSECONDS` a line.
fn read_marks(path: &Path) -> Vec<(usize, u64)> {
    let text = std::fs::read_to_string(path).expect("the fixture's marks file");
    text.lines()
        .map(|line| {
            let (phase, ns) = line.split_once(' ').expect("PHASE NS");
            (phase.parse().expect("a phase"), ns.parse().expect("ns"))
        })
        .collect()
}

/// `secs` as `--to` takes it: seconds with every nanosecond written out.
fn secs_arg(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

#[test]
fn memory_in_use_at_a_chosen_time_is_what_the_program_held_then() {
    require_perf!();
    let dir = scratch_dir("heap-phases");
    let exe = build_c(&["heap_phases.c"], &["-O2", "-g"], &dir, "heap_phases");
    let marks_file = dir.join("marks.txt");
    let marks_arg = marks_file.to_str().expect("a UTF-8 scratch path");
    let (trace, _) = record_heap(&dir, "phases", &["--heap-rate", "1"], &exe, &[marks_arg], 0);
    let reader = TraceReader::open(&trace).unwrap();
    // The fixture's marks and the trace's times are on one clock.
    assert_eq!(reader.header().clock, Clock::Monotonic);
    let start = reader.header().start_time.0;
    let marks = read_marks(&marks_file);
    assert_eq!(
        marks.iter().map(|&(p, _)| p).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    for (phase, ns) in marks {
        assert!(ns > start, "phase {phase} ended before the recording began");
        let to = secs_arg(ns - start);
        let lines = |value| folded_with(&trace, value, &["--to", &to]);
        let space = per_site(&lines("inuse_space"), SITES);
        let objects = per_site(&lines("inuse_objects"), SITES);
        let got: BTreeMap<String, (u64, u64)> = space
            .iter()
            .map(|(site, &bytes)| {
                let blocks = objects.get(site).copied().unwrap_or(0);
                (site.clone(), (bytes, blocks))
            })
            .collect();
        assert_eq!(
            got,
            held(phase),
            "in use at the end of phase {phase} (--to {to})"
        );
    }
    // Without --to: at the end of the recording, nothing is left.
    let end = per_site(&folded_with(&trace, "inuse_space", &[]), SITES);
    assert!(end.is_empty(), "{end:?}");
    remove_scratch_dir(&dir);
}
