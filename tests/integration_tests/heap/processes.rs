//! Processes under the allocation sampler: children it follows through
//! `fork` and `exec`, a program that aborts, one it cannot enter (static),
//! one it cannot be loaded into (`--pid`), and the recorder installed
//! alone, with nothing beside it.

use super::{folded, per_site, record_heap};
use lrnprof_format::{Record, SampleKind, TraceReader};
use lrnprof_tests::{
    build_c, lrnprof_rec, lrnprof_rec_command, remove_scratch_dir, require_perf, scratch_dir, skip,
};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};

const FORK_SITES: &[&str] = &[
    "parent_site",
    "forked_site",
    "exec_child_site",
    "parent_after_site",
];

#[test]
fn forked_and_execed_children_are_followed() {
    require_perf!();
    let dir = scratch_dir("heap-fork");
    let exe = build_c(&["heap_fork.c"], &["-O2", "-g"], &dir, "heap_fork");
    let (trace, _) = record_heap(&dir, "fork", &["--heap-rate", "1"], &exe, &[], 0);
    let space = folded(&trace, "alloc_space");
    assert_eq!(
        per_site(&space, FORK_SITES),
        BTreeMap::from([
            ("exec_child_site".to_string(), 400 * 3000),
            ("forked_site".to_string(), 300 * 2000),
            ("parent_after_site".to_string(), 100 * 1000),
            ("parent_site".to_string(), 200 * 1000),
        ])
    );
    // Each process's allocations are its own: three processes.
    let thread_of = |site: &str| -> BTreeSet<String> {
        space
            .iter()
            .filter(|l| l.frames.last().is_some_and(|f| f == site))
            .map(|l| l.thread.clone())
            .collect()
    };
    let (parent, forked, execed) = (
        thread_of("parent_site"),
        thread_of("forked_site"),
        thread_of("exec_child_site"),
    );
    assert_eq!(parent, thread_of("parent_after_site"));
    for set in [&parent, &forked, &execed] {
        assert_eq!(set.len(), 1, "{parent:?} {forked:?} {execed:?}");
    }
    assert!(parent != forked && forked != execed && parent != execed);
    // What each kept is in use at the end: the forked child's copy of the
    // parent's freed blocks is not counted twice.
    assert_eq!(
        per_site(&folded(&trace, "inuse_space"), FORK_SITES),
        BTreeMap::from([
            ("exec_child_site".to_string(), 5 * 3000),
            ("forked_site".to_string(), 10 * 2000),
            ("parent_after_site".to_string(), 100 * 1000),
        ])
    );
    remove_scratch_dir(&dir);
}

#[test]
fn a_program_that_aborts_leaves_a_readable_trace() {
    require_perf!();
    let dir = scratch_dir("heap-abort");
    let exe = build_c(&["heap_abort.c"], &["-O2", "-g"], &dir, "heap_abort");
    // The recorder passes the signal on: 128 + SIGABRT.
    let (trace, _) = record_heap(&dir, "abort", &["--heap-rate", "1"], &exe, &[], 134);
    let reader = TraceReader::open(&trace).unwrap();
    assert!(reader.report().finished, "{:?}", reader.report());
    assert_eq!(
        per_site(&folded(&trace, "inuse_space"), &["abort_leak_site"]),
        BTreeMap::from([("abort_leak_site".to_string(), 50 * 1000)])
    );
    remove_scratch_dir(&dir);
}

#[test]
fn a_static_program_gets_a_clear_message_and_cpu_samples() {
    require_perf!();
    let dir = scratch_dir("heap-static");
    let exe = dir.join("heap_abort_static");
    let built = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-static", "-o"])
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source("heap_abort.c"))
        .output()
        .expect("running cc");
    if !built.status.success() {
        skip!(
            "cc cannot link statically here (Debian: libc6-dev has libc.a): {}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let (trace, out) = record_heap(&dir, "static", &[], &exe, &[], 134);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warning: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warning.len(), 1, "{stderr}");
    assert!(
        warning[0].contains("statically linked") && warning[0].contains("no allocation"),
        "{stderr}"
    );
    // Recorded all the same: no allocations, the rest as usual.
    let reader = TraceReader::open(&trace).unwrap();
    assert!(reader.report().finished);
    let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
    assert!(!records
        .iter()
        .any(|r| matches!(r, Record::Sample(s) if s.kind == SampleKind::Allocation)));
    assert!(records.iter().any(|r| matches!(r, Record::Process(_))));
    remove_scratch_dir(&dir);
}

#[test]
fn attaching_with_heap_is_refused_in_one_line() {
    let dir = scratch_dir("heap-pid");
    let trace = dir.join("never.lpt");
    let pid = std::process::id().to_string();
    // A running process, and every process of the machine (which
    // recorded until stopped, and then warned that nothing was sampled).
    for (target, named) in [(vec!["--pid", &pid], "--pid"), (vec!["--all"], "--all")] {
        let out = lrnprof_rec_command()
            .arg("--heap")
            .args(&target)
            .arg("--out")
            .arg(&trace)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{target:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("--heap needs a command to launch"),
            "{stderr}"
        );
        assert!(stderr.contains(named), "{stderr}");
        assert!(!trace.exists());
    }
    remove_scratch_dir(&dir);
}

/// What `cargo install --path recorder` gives: the binary alone. It must
/// find its sampler with no manual step (it carries it).
#[test]
fn the_recorder_alone_carries_its_sampler() {
    require_perf!();
    let dir = scratch_dir("heap-installed");
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let rec = bin.join("lrnprof-rec");
    std::fs::copy(lrnprof_rec(), &rec).unwrap();
    // A temporary directory of its own, so the library is written afresh.
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let exe = build_c(&["heap_abort.c"], &["-O2", "-g"], &dir, "heap_abort");
    let trace = dir.join("installed.lpt");
    let out = Command::new(&rec)
        .env("TMPDIR", &tmp)
        .env("LRNPROF_CACHE_DIR", dir.join("cache"))
        .env_remove("XDG_RUNTIME_DIR")
        .args(["--heap", "--heap-rate", "1", "--out"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(134),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Vec<_> = std::fs::read_dir(tmp.join(format!("lrnprof-{}", euid())))
        .expect("the sampler's directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        written.iter().any(|n| n.starts_with("liblrnprof_preload-")),
        "{written:?}"
    );
    assert_eq!(
        per_site(&folded(&trace, "alloc_objects"), &["abort_leak_site"]),
        BTreeMap::from([("abort_leak_site".to_string(), 50)])
    );
    remove_scratch_dir(&dir);
}

fn euid() -> u32 {
    let out = Command::new("id").arg("-u").output().expect("running id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a uid")
}

#[test]
fn a_program_with_its_own_malloc_gets_a_clear_message() {
    require_perf!();
    let dir = scratch_dir("heap-own-malloc");
    let exe = build_c(
        &["heap_own_malloc.c"],
        &["-O2", "-g"],
        &dir,
        "heap_own_malloc",
    );
    let (_, out) = record_heap(&dir, "own", &["--heap-rate", "1"], &exe, &[], 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warning: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warning.len(), 1, "{stderr}");
    assert!(
        warning[0].contains("defines malloc itself") && warning[0].contains("no allocation"),
        "{stderr}"
    );
    remove_scratch_dir(&dir);
}
