//! `tests/fixtures/heap_sites.c`: every allocator function, two threads,
//! an allocation in the executable's constructor and one in a shared
//! library's, recorded exactly and sampled.

use super::{assert_near, folded, per_site, record_heap, Folded};
use lrnprof_format::{Record, SampleDetail, SampleKind};
use lrnprof_tests::{
    build_c, lrnprof_analyze, remove_scratch_dir, require_perf, scratch_dir, skip,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const SITES: &[&str] = &[
    "early_site",
    "heap_lib_ctor_site",
    "malloc_site",
    "calloc_site",
    "realloc_site",
    "memalign_site",
    "aligned_site",
    "mixed_site",
    "array_site",
    "oldalign_site",
    "valloc_site",
    "pvalloc_site",
    "leak_site",
    "thread_site",
];

/// Bytes and blocks each site allocates with `scale` as argv[1], as the
/// fixture's comment states.
fn sites_truth(scale: u64) -> BTreeMap<&'static str, (u64, u64)> {
    let mixed: u64 = std::iter::successors(Some(16u64), |n| Some(n * 3))
        .take_while(|&n| n < 65536)
        .sum();
    let realloc: u64 = (1..=64).map(|k| k * 256).sum();
    BTreeMap::from([
        ("early_site", (12345, 1)),
        ("heap_lib_ctor_site", (4321, 1)),
        ("malloc_site", (1024 * 1000 * scale, 1024 * scale)),
        ("calloc_site", (512 * 4000 * scale, 512 * scale)),
        ("realloc_site", (realloc * scale, 64 * scale)),
        ("memalign_site", (256 * 3000 * scale, 256 * scale)),
        ("aligned_site", (256 * 2048 * scale, 256 * scale)),
        ("mixed_site", (64 * mixed * scale, 64 * 8 * scale)),
        ("array_site", (128 * 3000 * scale, 128 * scale)),
        ("oldalign_site", (128 * 1500 * scale, 128 * scale)),
        ("valloc_site", (64 * 2500 * scale, 64 * scale)),
        ("pvalloc_site", (64 * 700 * scale, 64 * scale)),
        ("leak_site", (100 * 7000, 100)),
        ("thread_site", (2 * 1000 * 500 * scale, 2 * 1000 * scale)),
    ])
}

/// What is still allocated at exit.
fn leaked() -> BTreeMap<&'static str, u64> {
    BTreeMap::from([
        ("early_site", 12345),
        ("heap_lib_ctor_site", 4321),
        ("leak_site", 700_000),
    ])
}

/// Build the shared library and the program that loads it into `dir`.
fn build_sites(dir: &Path) -> PathBuf {
    build_c(
        &["heap_lib.c"],
        &["-O2", "-g", "-fPIC", "-shared"],
        dir,
        "libheap_lib.so",
    );
    let lib_dir = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    build_c(
        &["heap_sites.c"],
        &[
            "-O2",
            "-g",
            "-pthread",
            "-Wl,--no-as-needed",
            &lib_dir,
            "-lheap_lib",
            &rpath,
        ],
        dir,
        "heap_sites",
    )
}

/// The sites' totals of `value`.
fn totals(lines: &[Folded]) -> BTreeMap<String, u64> {
    per_site(lines, SITES)
}

#[test]
fn every_allocator_function_is_recorded_exactly_per_site() {
    require_perf!();
    let dir = scratch_dir("heap-exact");
    let exe = build_sites(&dir);
    let (trace, out) = record_heap(&dir, "exact", &["--heap-rate", "1"], &exe, &["1"], 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("warning"), "{stderr}");
    let truth = sites_truth(1);
    let space = folded(&trace, "alloc_space");
    let objects = folded(&trace, "alloc_objects");
    for (site, (bytes, blocks)) in &truth {
        assert_eq!(
            totals(&space).get(*site),
            Some(bytes),
            "alloc_space of {site}"
        );
        assert_eq!(
            totals(&objects).get(*site),
            Some(blocks),
            "alloc_objects of {site}"
        );
    }
    // The sampler's own frames are dropped: a site is the leaf of its
    // stacks, the caller of the allocator.
    for line in &space {
        if let Some(leaf) = line.frames.last() {
            assert!(!leaf.contains("lrnprof"), "{:?}", line.frames);
        }
        let holds = |s: &str| line.frames.iter().any(|f| f == s);
        if SITES.iter().any(|s| holds(s)) {
            assert!(SITES.contains(&line.frames.last().unwrap().as_str()));
        }
    }
    // What was never freed is in use at exit, and only that.
    let inuse = totals(&folded(&trace, "inuse_space"));
    let expected: BTreeMap<String, u64> = leaked()
        .into_iter()
        .map(|(s, b)| (s.to_string(), b))
        .collect();
    assert_eq!(inuse, expected);
    // The two workers' allocations are theirs, and each made half.
    let threads: BTreeMap<&str, u64> = space
        .iter()
        .filter(|l| l.frames.last().is_some_and(|f| f == "thread_site"))
        .map(|l| (l.thread.as_str(), l.count))
        .collect();
    assert_eq!(threads.len(), 2, "{threads:?}");
    for (thread, bytes) in threads {
        assert!(thread.starts_with("alloc-worker-"), "{thread}");
        assert_eq!(bytes, 500_000);
    }
    // In the trace: sampled allocations with stacks, their frees.
    let reader = lrnprof_format::TraceReader::open(&trace).unwrap();
    assert!(reader.report().finished);
    let events = reader.header().events.clone();
    assert!(events.cpu, "CPU sampling stays on with --heap");
    assert_eq!(events.heap.map(|h| h.mean_interval), Some(1));
    let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
    let allocations: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) if s.kind == SampleKind::Allocation => Some(s),
            _ => None,
        })
        .collect();
    assert!(allocations.iter().all(|s| !s.stack.bytes.is_empty()
        && s.stack.start == s.regs.sp()
        && matches!(s.detail, SampleDetail::Allocation { address } if address != 0)));
    let frees = records
        .iter()
        .filter(|r| matches!(r, Record::Free(_)))
        .count();
    let freed_blocks: u64 = truth.values().map(|&(_, n)| n).sum::<u64>() - 102;
    assert!(frees as u64 >= freed_blocks, "{frees} frees");
    assert!(!records.iter().any(|r| matches!(r, Record::Lost(_))));
    let times: Vec<u64> = records
        .iter()
        .filter_map(|r| r.time())
        .map(|t| t.0)
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "time order");
    remove_scratch_dir(&dir);
}

#[test]
fn sampled_estimates_are_within_ten_percent_per_site() {
    require_perf!();
    let dir = scratch_dir("heap-sampled");
    let exe = build_sites(&dir);
    // 64 KiB between samples and 400 times the base amounts: at least
    // 3,000 samples per site below (a standard error under 2%).
    let (trace, _) = record_heap(&dir, "sampled", &["--heap-rate", "64K"], &exe, &["400"], 0);
    let truth = sites_truth(400);
    let space = totals(&folded(&trace, "alloc_space"));
    let objects = totals(&folded(&trace, "alloc_objects"));
    for site in [
        "malloc_site",
        "calloc_site",
        "realloc_site",
        "memalign_site",
        "aligned_site",
        "mixed_site",
        "thread_site",
    ] {
        let (bytes, blocks) = truth[site];
        assert_near(&format!("alloc_space of {site}"), space[site], bytes, 0.10);
        // Counts are estimated well where blocks are small next to the
        // interval (a 35 KB block stands for fewer blocks).
        if site != "mixed_site" && site != "realloc_site" {
            assert_near(
                &format!("alloc_objects of {site}"),
                objects[site],
                blocks,
                0.10,
            );
        }
    }
    // Memory in use at exit is only where it leaked.
    let inuse = totals(&folded(&trace, "inuse_space"));
    let leaking: BTreeSet<String> = leaked().keys().map(|s| s.to_string()).collect();
    for (site, bytes) in &inuse {
        assert!(leaking.contains(site), "{site} holds {bytes} bytes at exit");
    }
    remove_scratch_dir(&dir);
}

#[test]
fn heap_profiles_open_in_pprof_by_sample_type() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        skip!("go is not installed (Debian: golang-go); it reads the pprof output");
    }
    let dir = scratch_dir("heap-pprof");
    let exe = build_sites(&dir);
    let (trace, _) = record_heap(&dir, "pprof", &["--heap-rate", "1"], &exe, &["1"], 0);
    let profile = dir.join("heap.pb.gz");
    let out = Command::new(lrnprof_analyze())
        .arg(&trace)
        .arg("-o")
        .arg(&profile)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (index, top, absent) in [
        ("inuse_space", "leak_site", "malloc_site"),
        ("alloc_space", "mixed_site", "nothing-absent"),
        ("alloc_objects", "thread_site", "nothing-absent"),
    ] {
        let out = Command::new("go")
            .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
            .arg(&profile)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(&format!("Type: {index}")), "{text}");
        // The first function listed is the top one.
        let first = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("flat"))
            .nth(1)
            .unwrap_or("");
        assert!(first.ends_with(top), "{index}: {first}\n{text}");
        assert!(!text.contains(absent), "{index}: {text}");
    }
    remove_scratch_dir(&dir);
}

/// `lrnprof-analyze ARGS`, which must succeed: its standard output.
fn analyze_ok(args: &[&str]) -> String {
    String::from_utf8(crate::analyze::ok(args).stdout).expect("UTF-8 output")
}

#[test]
fn heap_values_reach_every_view() {
    require_perf!();
    let dir = scratch_dir("heap-views");
    let exe = build_sites(&dir);
    let (trace, _) = record_heap(&dir, "views", &["--heap-rate", "1"], &exe, &["1"], 0);
    let t = trace.to_str().expect("a UTF-8 scratch path");
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let leaked_bytes: u64 = leaked().values().sum();
    // top: the leaking site first, in bytes.
    let top = analyze_ok(&["top", t, "--value", "inuse_space", "-n", "3"]);
    assert!(
        top.contains("bytes in use (estimated) (inuse_space)"),
        "{top}"
    );
    let first = top.lines().nth(2).unwrap_or("");
    assert!(first.contains("leak_site"), "{top}");
    assert!(first.trim_start().starts_with("683.6KiB"), "{top}");
    // info: a total per value.
    let info: serde_json::Value =
        serde_json::from_str(&analyze_ok(&["info", t, "--json"])).unwrap();
    let total = |name: &str| {
        info["values"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .and_then(|v| v["total"].as_u64())
            .unwrap_or_else(|| panic!("no {name} in {info}"))
    };
    let allocated: u64 = sites_truth(1).values().map(|&(bytes, _)| bytes).sum();
    // The C library allocates a little on its own (thread start-up).
    assert!(total("alloc_space") >= allocated, "{info}");
    assert!(total("alloc_space") < allocated + 64 * 1024, "{info}");
    assert!(total("inuse_space") >= leaked_bytes, "{info}");
    assert!(total("inuse_space") < leaked_bytes + 16 * 1024, "{info}");
    // Flame graph, Firefox profile and speedscope weigh bytes or counts.
    let svg = out("views.svg");
    analyze_ok(&[t, "--format", "svg", "--value", "alloc_space", "-o", &svg]);
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        svg.contains("malloc_site (1,024,000 bytes"),
        "no malloc_site bytes in the SVG"
    );
    let firefox = out("views.json");
    analyze_ok(&[
        t,
        "--format",
        "firefox",
        "--value",
        "inuse_space",
        "-o",
        &firefox,
    ]);
    let firefox: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(firefox).unwrap()).unwrap();
    let mut weight = 0;
    for thread in firefox["threads"].as_array().unwrap() {
        assert_eq!(thread["samples"]["weightType"], "bytes");
        weight += thread["samples"]["weight"]
            .as_array()
            .map_or(0, |w| w.iter().filter_map(|v| v.as_u64()).sum::<u64>());
    }
    assert_eq!(weight, total("inuse_space"));
    let speedscope = analyze_ok(&[
        t,
        "--format",
        "speedscope",
        "--value",
        "alloc_objects",
        "-o",
        "-",
    ]);
    let speedscope: serde_json::Value = serde_json::from_str(&speedscope).unwrap();
    assert_eq!(speedscope["profiles"][0]["unit"], "none");
    // diff: compares the value asked for.
    let diff = analyze_ok(&["diff", t, t, "--value", "alloc_space", "-o", &out("d.svg")]);
    assert!(
        diff.contains("bytes allocated (estimated) (alloc_space)"),
        "{diff}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn allocations_alone_are_recorded_and_unwound_with_no_cpu() {
    require_perf!();
    let dir = scratch_dir("heap-no-cpu");
    let exe = build_sites(&dir);
    let (trace, out) = record_heap(
        &dir,
        "no-cpu",
        &["--heap-rate", "1", "--no-cpu"],
        &exe,
        &["1"],
        0,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(", 0 lost"), "{stderr}");
    let reader = lrnprof_format::TraceReader::open(&trace).unwrap();
    let header = reader.header();
    assert!(!header.events.cpu);
    assert!(header.sampling.stack_size > 0, "{:?}", header.sampling);
    let space = totals(&folded(&trace, "alloc_space"));
    for (site, (bytes, _)) in sites_truth(1) {
        assert_eq!(space.get(site), Some(&bytes), "alloc_space of {site}");
    }
    remove_scratch_dir(&dir);
}
