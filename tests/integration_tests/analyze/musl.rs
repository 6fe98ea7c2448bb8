//! Code without unwind tables: programs built against musl, whose libc
//! has none, and programs built with `-fno-asynchronous-unwind-tables`.
//! The analyzer unwinds such code by rules made from its instructions
//! (`lrnprof_image::code_debug_frame`), locally and, embedded by the
//! recorder, offline (`tests/fixtures/an_musl.c`, built with `musl-gcc`
//! and with gcc without unwind tables; `tests/fixtures/rec_deep.c`, the
//! same; `tests/fixtures/an_cold.c`, whose loop gcc moves to a cold part;
//! `tests/fixtures/an_musl.rs`, a static Rust program whose bundled musl
//! lost its `.debug_frame` to `-C strip=debuginfo`).

use super::*;
use object::{Object, ObjectSymbol};

/// Build the fixture with `musl-gcc` (dynamic, or static with `-static`)
/// into `dir/name`; `None` where there is no `musl-gcc` (Debian's
/// `musl-tools`).
fn build_musl(dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    let exe = dir.join(name);
    let out = Command::new("musl-gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-Wl,--build-id"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source("an_musl.c"))
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "musl-gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// Samples with `a` directly above `b` in any thread.
fn any_calls(f: &BTreeMap<Vec<String>, u64>, a: &str, b: &str) -> u64 {
    calls(f, "", a, b)
}

/// Each phase of `an_musl.c` called from `main` in at least `min`
/// samples of the profile of build `name`.
fn assert_phases_under_main(f: &BTreeMap<Vec<String>, u64>, name: &str, min: u64) {
    for phase in ["musl_copy", "musl_sort", "musl_print", "musl_alloc"] {
        assert!(
            any_calls(f, "main", phase) >= min,
            "{name}: main -> {phase}: {f:?}"
        );
    }
}

#[test]
fn stacks_through_musl_code_without_unwind_tables_reach_the_root() {
    require_perf!();
    let dir = scratch_dir("an-musl");
    for (name, flags) in [("dynamic", &[][..]), ("static", &["-static"][..])] {
        let Some(exe) = build_musl(&dir, name, flags) else {
            skip!("musl-gcc is not installed (Debian: musl-tools)");
        };
        let trace = record(&dir, name, &[], &exe, &["800"]);
        let i = info(&trace, &[]);
        // Before rules were made for musl's code: 7 % of such samples
        // reached the root, with invented callers.
        assert!(root_pct(&i) >= 95.0, "{name}: {i}");
        let f = folded(&trace, &[]);
        assert_phases_under_main(&f, name, 10);
        // musl's assembly memcpy, and the comparison musl's qsort calls.
        assert!(any_calls(&f, "musl_copy", "memcpy") >= 10, "{name}: {f:?}");
        let compared: u64 = f
            .iter()
            .filter(|(s, _)| s.last().is_some_and(|l| l == "by_value"))
            .map(|(_, c)| c)
            .sum();
        let under_sort: u64 = f
            .iter()
            .filter(|(s, _)| s.last().is_some_and(|l| l == "by_value"))
            .filter(|(s, _)| s.windows(2).any(|w| w == ["main", "musl_sort"]))
            .map(|(_, c)| c)
            .sum();
        assert!(
            compared > 0 && under_sort == compared,
            "{name}: {under_sort} of {compared}: {f:?}"
        );
        if name == "static" {
            // Its symbol table names musl's own functions too.
            assert_eq!(json_number(&i, "unknown_frames"), 0.0, "{i}");
        }
        // The rules travel in the trace.
        assert_eq!(folded(&trace, &["--offline"]), f, "{name}");
    }
    remove_scratch_dir(&dir);
}

/// Whether rustc has the standard library for `target`.
fn rust_target_installed(target: &str) -> bool {
    let sysroot = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    sysroot.is_some_and(|s| s.join("lib/rustlib").join(target).join("lib").is_dir())
}

#[test]
fn a_static_rust_musl_program_stripped_of_debug_info_unwinds_through_musl() {
    require_perf!();
    const TARGET: &str = "x86_64-unknown-linux-musl";
    if !rust_target_installed(TARGET) {
        skip!("rustc has no {TARGET} standard library (rustup target add {TARGET})");
    }
    let dir = scratch_dir("an-musl-rust");
    let exe = lrnprof_tests::build_rust(
        "an_musl.rs",
        &["--target", TARGET, "-O", "-C", "strip=debuginfo"],
        &dir,
        "an_musl_rust",
    );
    let trace = record(&dir, "rust", &[], &exe, &["600"]);
    let i = info(&trace, &[]);
    // Before: 4 % of samples reached the root.
    assert!(root_pct(&i) >= 95.0, "{i}");
    let f = folded(&trace, &[]);
    assert!(any_calls(&f, "an_musl::copy_work", "memcpy") >= 10, "{f:?}");
    assert!(
        f.keys()
            .any(|s| s.iter().any(|n| n == "an_musl::alloc_work")),
        "{f:?}"
    );
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

/// A small program built without unwind tables: its own code is a few
/// hundred bytes beside the C runtime's functions that have no CFI in any
/// image, so an image is given rules from 256 bytes of such code on, not
/// only from long stretches as in musl's libc.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "rules are made from x86-64 code only"
)]
fn small_programs_built_without_unwind_tables_reach_the_root() {
    require_perf!();
    let dir = scratch_dir("an-no-cfi");
    let no_cfi = [
        "-O2",
        "-fomit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
        "-pthread",
    ];
    // Before: no sample reached `main` (perf's DWARF mode: none either;
    // samply's: 1 in 400).
    let phases = build_c(&["an_musl.c"], &no_cfi, &dir, "phases");
    // With `endbr64` at each function's entry, as distributions that
    // build with control-flow protection have it.
    let cet = [&no_cfi[..], &["-fcf-protection=full"]].concat();
    let phases_cet = build_c(&["an_musl.c"], &cet, &dir, "phases_cet");
    for (name, exe) in [("phases", &phases), ("phases_cet", &phases_cet)] {
        let trace = record(&dir, name, &[], exe, &["600"]);
        let i = info(&trace, &[]);
        assert!(root_pct(&i) >= 95.0, "{name}: {i}");
        // `info` says where the rules came from, with the program here
        // (all its functions) and from the trace (those it reaches).
        for extra in [&[][..], &["--offline"]] {
            let i = info(&trace, extra);
            assert!(
                made_rules_noted(&i, exe),
                "{name} {extra:?}: no note of rules made from instructions: {i}"
            );
        }
        let f = folded(&trace, &[]);
        // glibc's merge sort of the 400 values takes about 2 % of the
        // time (9-15 samples of 600 in 600 ms): each phase is reached
        // under `main`; the root share above says how many.
        assert_phases_under_main(&f, name, 1);
        assert_eq!(folded(&trace, &["--offline"]), f, "{name}");
    }
    // 300 frames of recursion, each with a local array (before: 0 % to
    // the root, 75 % unknown frames).
    let deep = build_c(&["rec_deep.c"], &no_cfi, &dir, "rec_deep");
    let trace = record(&dir, "deep", &[], &deep, &["600", "300"]);
    let f = folded(&trace, &[]);
    let full: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start" && s.iter().filter(|n| *n == "descend").count() >= 300)
        .map(|(_, c)| c)
        .sum();
    assert!(full as f64 >= 0.95 * total(&f) as f64, "{f:?}");
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

#[test]
fn cold_parts_of_functions_without_unwind_tables_run_at_their_function_s_frame() {
    require_perf!();
    let dir = scratch_dir("an-cold");
    let flags = [
        "-O2",
        "-fomit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
    ];
    let exe = build_c(&["an_cold.c"], &flags, &dir, "an_cold");
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    assert!(
        file.symbols().any(|s| s.name() == Ok("work.cold")),
        "gcc made no work.cold of tests/fixtures/an_cold.c"
    );
    drop(file);
    // Without symbols the cold part is code no function start reaches.
    let stripped = strip_all(&exe, &dir.join("an_cold_stripped"));
    // The stripped copy has no symbol for its entry code (`_start`), which
    // shows as an address in it: within the entry function.
    let entry = {
        let bytes = std::fs::read(&stripped).unwrap();
        object::File::parse(&*bytes).unwrap().entry()
    };
    let is_start = |frame: &str| {
        frame == "_start"
            || frame
                .strip_prefix("an_cold_stripped+0x")
                .and_then(|a| u64::from_str_radix(a, 16).ok())
                .is_some_and(|a| (entry..entry + 0x40).contains(&a))
    };
    // Before, followed from an entry's frame: every sample ended in
    // `work.cold`, its caller taken from `work`'s locals.
    for (name, exe) in [("cold", &exe), ("cold-stripped", &stripped)] {
        let trace = record(&dir, name, &[], exe, &["500"]);
        for extra in [&[][..], &["--offline"]] {
            let f = folded(&trace, extra);
            // The loop, in the cold part, called from `main` called from
            // libc's start-up.
            let whole: u64 = f
                .iter()
                .filter(|(s, _)| {
                    s.len() >= 4 && s[s.len() - 3] == "__libc_start_call_main" && is_start(&s[1])
                })
                .map(|(_, c)| c)
                .sum();
            assert!(
                whole as f64 >= 0.9 * total(&f) as f64,
                "{name} {extra:?}: {f:?}"
            );
            if name == "cold" {
                assert!(any_calls(&f, "main", "work.cold") as f64 >= 0.9 * total(&f) as f64);
            }
        }
    }
    remove_scratch_dir(&dir);
}

/// Code without unwind tables in more separate stretches than the
/// analyzer once split an image into (16), as in Node.js's V8 builtins
/// (24) and libgmp's assembly (21): all its rules were dropped when read
/// from the file (all its functions), and kept from a trace that reached
/// fewer, so the same trace gave other stacks on another machine.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the fixture is x86-64 assembly, and rules are made from x86-64 code only"
)]
fn many_stretches_of_code_without_unwind_tables_unwind_alike_here_and_offline() {
    require_perf!();
    let dir = scratch_dir("an-hops");
    let flags = [NO_FP, &["-fno-toplevel-reorder"]].concat();
    let exe = build_c(&["an_hops.c"], &flags, &dir, "an_hops");
    let trace = record(&dir, "hops", &[], &exe, &["500"]);
    let chain: Vec<String> = ["main".to_string()]
        .into_iter()
        .chain((0..24).flat_map(|k| [format!("step_{k}"), format!("hop_{k}")]))
        .chain(["spin".to_string()])
        .collect();
    let f = folded(&trace, &[]);
    let whole: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start" && s.ends_with(&chain))
        .map(|(_, c)| c)
        .sum();
    assert!(whole as f64 >= 0.9 * total(&f) as f64, "{f:?}");
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

/// A sample in code below every FDE of its image (the C runtime's
/// `_init`) was unwound one way from the file and another from the trace,
/// whose `.eh_frame` comes without its `.eh_frame_hdr`: framehop's search
/// of the header finds the first FDE and uses its rule for code no FDE
/// covers, its own index of the FDEs finds none and follows the frame
/// pointer. The analyzer now makes the header where there is none.
#[test]
fn code_below_every_fde_unwinds_alike_here_and_offline() {
    require_perf!();
    let dir = scratch_dir("an-init");
    let exe = build_c(&["an_init.c"], NO_FP, &dir, "an_init");
    let trace = record(&dir, "init", &[], &exe, &["500"]);
    let f = folded(&trace, &[]);
    let in_init: u64 = f
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == "_init"))
        .map(|(_, c)| c)
        .sum();
    assert!(in_init as f64 >= 0.3 * total(&f) as f64, "{f:?}");
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

/// Whether `info --json` notes, for the image at `path`, unwind rules made
/// from its instructions.
fn made_rules_noted(info: &str, path: &Path) -> bool {
    let image = format!(r#""path": "{}","#, path.display());
    let Some(at) = info.find(&image) else {
        return false;
    };
    // The image's entry runs to its frame count.
    let entry = &info[at..];
    let entry = &entry[..entry.find(r#""frames":"#).unwrap_or(entry.len())];
    entry.contains("unwind rules made from the instructions of")
}
