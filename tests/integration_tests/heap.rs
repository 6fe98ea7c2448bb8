//! End-to-end tests of allocation sampling (`lrnprof-rec --heap`): the
//! fixtures `tests/fixtures/heap_*` allocate known amounts from known call
//! sites; the tests record them and check what `lrnprof-analyze` gives
//! per site, exactly with `--heap-rate 1` (every allocation), within 10%
//! at a sampling rate that gives thousands of samples per site.
//!
//! Submodules: `sites` (C: every allocator function, threads, constructors,
//! estimates, memory in use at exit, pprof), `phases` (memory in use at a
//! chosen time, `--to`), `languages` (C++ `new`, Rust with the system
//! allocator), `processes` (fork and exec, abort, a static program, `--pid`,
//! the recorder installed alone).

mod languages;
mod phases;
mod processes;
mod sites;

use lrnprof_tests::{lrnprof_analyze, lrnprof_rec_command};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Record `program args` with `--heap` and `extra` flags into
/// `dir/name.lpt`; the recorder must exit with `code` (the program's).
fn record_heap(
    dir: &Path,
    name: &str,
    extra: &[&str],
    program: &Path,
    args: &[&str],
    code: i32,
) -> (PathBuf, Output) {
    let trace = dir.join(format!("{name}.lpt"));
    let out = lrnprof_rec_command()
        .arg("--out")
        .arg(&trace)
        .arg("--heap")
        .args(extra)
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-rec");
    assert_eq!(
        out.status.code(),
        Some(code),
        "lrnprof-rec --heap {extra:?} -- {} {args:?}:\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (trace, out)
}

/// One line of folded output: the thread (`NAME-TID`), the frames from
/// the root to the leaf, and the count.
#[derive(Debug, Clone)]
struct Folded {
    thread: String,
    frames: Vec<String>,
    count: u64,
}

/// `lrnprof-analyze TRACE --format folded --value VALUE`.
fn folded(trace: &Path, value: &str) -> Vec<Folded> {
    folded_with(trace, value, &[])
}

/// `lrnprof-analyze TRACE --format folded --value VALUE EXTRA...`.
fn folded_with(trace: &Path, value: &str, extra: &[&str]) -> Vec<Folded> {
    let out = Command::new(lrnprof_analyze())
        .arg(trace)
        .args(["--format", "folded", "-o", "-", "--value", value])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-analyze");
    assert!(
        out.status.success(),
        "lrnprof-analyze --value {value} {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(|line| {
            // Function names may hold spaces; the count is the last word.
            let (stack, count) = line.rsplit_once(' ').expect("STACK COUNT");
            let mut frames = stack.split(';').map(str::to_string);
            let thread = frames.next().expect("a thread first");
            Folded {
                thread,
                frames: frames.collect(),
                count: count.parse().expect("a count"),
            }
        })
        .collect()
}

/// Whether `frame` names the function `site` (a C name, a Rust path
/// ending in it, or a C++ name with its parameters).
fn is_site(frame: &str, site: &str) -> bool {
    frame == site || frame.ends_with(&format!("::{site}")) || frame.starts_with(&format!("{site}("))
}

/// `value` per site of `sites`: each stack counts for the innermost site
/// it holds (stacks holding none are left out).
fn per_site(lines: &[Folded], sites: &[&str]) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for line in lines {
        let site = line
            .frames
            .iter()
            .rev()
            .find_map(|f| sites.iter().find(|s| is_site(f, s)));
        if let Some(site) = site {
            *totals.entry(site.to_string()).or_insert(0) += line.count;
        }
    }
    totals
}

/// Assert `got` is within `tolerance` (a fraction) of `want`.
fn assert_near(what: &str, got: u64, want: u64, tolerance: f64) {
    let error = (got as f64 - want as f64).abs() / want as f64;
    assert!(
        error <= tolerance,
        "{what}: {got}, expected {want} within {:.0}% (off by {:.1}%)",
        tolerance * 100.0,
        error * 100.0
    );
}
