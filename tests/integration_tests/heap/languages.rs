//! C++ `new` and `delete`, and Rust with the system allocator: both end in
//! malloc and free, so the sampler sees them; each site is found below the
//! language's own allocation functions. Go allocates from its own heap:
//! the recorder says so.

use super::{folded, per_site, record_heap};
use lrnprof_tests::{fixture_source, remove_scratch_dir, require_perf, scratch_dir, skip};
use std::collections::BTreeMap;
use std::process::Command;

#[test]
fn cxx_new_and_delete_are_recorded_per_site() {
    require_perf!();
    let dir = scratch_dir("heap-cxx");
    let exe = dir.join("heap_cxx");
    let built = Command::new(std::env::var("CXX").unwrap_or_else(|_| "g++".into()))
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(fixture_source("heap_cxx.cc"))
        .output();
    match built {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("g++ failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => skip!("cannot run g++ ({e}): install g++ or set CXX"),
    }
    let (trace, _) = record_heap(&dir, "cxx", &["--heap-rate", "1"], &exe, &[], 0);
    let sites = ["new_object_site", "new_array_site", "vector_site"];
    let space = folded(&trace, "alloc_space");
    // `operator new` is the leaf: the sampler's own frames are gone.
    for line in space.iter().filter(|l| {
        l.frames
            .iter()
            .any(|f| f.starts_with("new_object_site") || f.starts_with("new_array_site"))
    }) {
        let leaf = line.frames.last().unwrap();
        assert!(leaf.starts_with("operator new"), "{:?}", line.frames);
    }
    // The vector doubles from 1 to 131072 ints, and is itself 24 bytes.
    let vector: u64 = 24 + (0..=17).map(|k| 4u64 << k).sum::<u64>();
    assert_eq!(
        per_site(&space, &sites),
        BTreeMap::from([
            ("new_array_site".to_string(), 300 * 4000),
            ("new_object_site".to_string(), 2000 * 96),
            ("vector_site".to_string(), vector),
        ])
    );
    assert_eq!(
        per_site(&folded(&trace, "inuse_space"), &sites),
        BTreeMap::from([("vector_site".to_string(), 24 + (4 << 17))])
    );
    remove_scratch_dir(&dir);
}

#[test]
fn rust_with_the_system_allocator_is_recorded_per_site() {
    require_perf!();
    let dir = scratch_dir("heap-rust");
    let exe = dir.join("heap_rust");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let built = Command::new(rustc)
        .args(["-O", "-g", "--edition", "2021", "-o"])
        .arg(&exe)
        .arg(fixture_source("heap_rust.rs"))
        .output();
    match built {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("rustc failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => skip!("cannot run rustc ({e})"),
    }
    let (trace, _) = record_heap(&dir, "rust", &["--heap-rate", "1"], &exe, &[], 0);
    let sites = ["boxed_site", "vec_site", "kept_site"];
    assert_eq!(
        per_site(&folded(&trace, "alloc_space"), &sites),
        BTreeMap::from([
            ("boxed_site".to_string(), 3000 * 128),
            ("kept_site".to_string(), 1_000_000),
            ("vec_site".to_string(), 500 * 10_000),
        ])
    );
    assert_eq!(
        per_site(&folded(&trace, "inuse_space"), &sites),
        BTreeMap::from([("kept_site".to_string(), 1_000_000)])
    );
    remove_scratch_dir(&dir);
}

#[test]
fn a_go_program_with_c_code_is_told_its_go_allocations_are_not_seen() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        skip!("`go` is not installed (Debian: golang-go)");
    }
    let dir = scratch_dir("heap-go");
    // Linked with C code, so dynamic: the sampler is loaded.
    let exe = lrnprof_tests::build_go_spin(&dir, "gospin-c", &["-tags", "with_c"], None);
    let (_, out) = record_heap(&dir, "go", &[], &exe, &["100"], 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warning = stderr.lines().find(|l| l.contains("own allocator"));
    assert!(
        warning.is_some_and(|w| w.contains("Go runtime") && w.contains("malloc")),
        "{stderr}"
    );
    remove_scratch_dir(&dir);
}
