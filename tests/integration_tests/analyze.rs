//! End-to-end tests of `lrnprof-analyze`: record the fixture programs
//! (`tests/fixtures/rec_*.c` from the recorder tests and `an_*.c`) with
//! `lrnprof-rec`, analyze them, and check the call trees, the share of
//! samples that unwound to the thread's root, determinism, and that the
//! outputs open in `go tool pprof` and in speedscope itself.
//!
//! Submodules: `viewers` (pprof and speedscope opened in their tools),
//! `views` (flame graph SVG in Chromium, Firefox Profiler structure, `top`,
//! `diff`, `--open`),
//! `go` (Go binaries: compressed `.debug_frame`, Go build ID), `i386`
//! (32-bit x86 programs), `musl`
//! (programs built against musl, whose libc has no unwind tables),
//! `post_mortem` (embedded data, pack, --offline, strip, --symbols),
//! `synthetic` (hand-built traces of non-host architectures), `untouched`
//! (stack copies cut short at pages their thread never touched).
//!
//! "Reached the root" (as `info` counts it): the outermost frame is the
//! thread's entry (`_start`/`__libc_start_main` for the main thread,
//! `_dl_start_user` while the dynamic loader runs constructors,
//! `clone`/`clone3`/`start_thread` for the others), or the unwinder stopped
//! cleanly at a zero return address / frame pointer.

mod debuginfod;
mod dwz;
mod go;
#[cfg(target_arch = "x86_64")]
mod i386;
mod mini_debug_info;
mod musl;
mod post_mortem;
mod split_dwarf;
mod synthetic;
mod untouched;
mod viewers;
mod views;

use lrnprof_format::{TraceReader, TraceWriter, WriterOptions};
use lrnprof_tests::{
    build_c, cannot_check, lrnprof_analyze, lrnprof_rec_command, remove_scratch_dir, require_perf,
    scratch_dir, skip,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Flags that make unwinding depend on DWARF CFI.
const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-pthread"];

/// Record without embedded image data (the recorder embeds by default).
const EMBED_NONE: &[&str] = &["--embed", "none"];

/// Record `program args` into `dir/name.lpt`.
fn record(dir: &Path, name: &str, extra: &[&str], program: &Path, args: &[&str]) -> PathBuf {
    record_output(dir, name, extra, program, args).0
}

/// [`record`], also returning what lrnprof-rec printed.
fn record_output(
    dir: &Path,
    name: &str,
    extra: &[&str],
    program: &Path,
    args: &[&str],
) -> (PathBuf, Output) {
    let trace = dir.join(format!("{name}.lpt"));
    let out = lrnprof_rec_command()
        // Fixtures that know it (rec_threads) then run for CPU time, not
        // wall time: the samples a test counts do not depend on load.
        .env("REC_CPU_TIME", "1")
        // and say what they did (rec_threads: the CPU time in each parent).
        .env("REC_TRUTH_FILE", dir.join(format!("{name}.truth")))
        .arg("--out")
        .arg(&trace)
        .args(extra)
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-rec");
    assert!(
        trace.exists(),
        "lrnprof-rec wrote no trace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (trace, out)
}

fn analyze(args: &[&str]) -> Output {
    Command::new(lrnprof_analyze())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-analyze")
}

/// `lrnprof-analyze ARGS`, which must succeed.
pub(crate) fn ok(args: &[&str]) -> Output {
    let out = analyze(args);
    assert!(
        out.status.success(),
        "lrnprof-analyze {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `tool` (binutils, `dwz`, ...) with `args`; panics with its message
/// if it fails.
fn run_tool<S: AsRef<std::ffi::OsStr>>(tool: &str, args: impl IntoIterator<Item = S>) {
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
    let out = Command::new(tool)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Folded output of `trace` with `extra` flags: stack (thread first) -> count.
fn folded(trace: &Path, extra: &[&str]) -> BTreeMap<Vec<String>, u64> {
    let mut args = vec![trace.to_str().unwrap(), "--format", "folded", "-o", "-"];
    args.extend(extra);
    let out = ok(&args);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (stack, count) = l.rsplit_once(' ').expect("`stack count` lines");
            (
                stack.split(';').map(str::to_string).collect(),
                count.parse().expect("a count"),
            )
        })
        .collect()
}

/// `info --json` of `trace`, as text.
fn info(trace: &Path, extra: &[&str]) -> String {
    let mut args = vec!["info", trace.to_str().unwrap(), "--json"];
    args.extend(extra);
    String::from_utf8(ok(&args).stdout).expect("info prints UTF-8")
}

/// The number after the first `"key":` in a JSON text (the tests package
/// has no JSON parser; the keys used here are unique in `info --json`).
fn json_number(json: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let at = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + pat.len();
    let rest = json[at..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

/// Samples whose stack contains `a` immediately followed by `b`.
fn calls(f: &BTreeMap<Vec<String>, u64>, thread_prefix: &str, a: &str, b: &str) -> u64 {
    f.iter()
        .filter(|(s, _)| s[0].starts_with(thread_prefix))
        .filter(|(s, _)| s.windows(2).any(|w| w[0] == a && w[1] == b))
        .map(|(_, c)| c)
        .sum()
}

/// Samples of `f` whose stack ends with the frames `tail`.
fn ending_with(f: &BTreeMap<Vec<String>, u64>, tail: &[&str]) -> u64 {
    f.iter()
        .filter(|(s, _)| s.len() >= tail.len() && s[s.len() - tail.len()..] == *tail)
        .map(|(_, c)| c)
        .sum()
}

/// Whether the samples in `outer` (called from `main`) name `inner`, a
/// function inlined into it: at least 100 samples end `main;outer;inner`
/// and at most one in twenty of them ends in `outer` alone. A few of
/// `outer`'s own instructions (its entry test, the arithmetic after the
/// inlined loop) lie outside the inlined range, and a sample there rightly
/// ends in `outer`; when the inline frames are not found, every sample does.
fn names_inlined(f: &BTreeMap<Vec<String>, u64>, outer: &str, inner: &str) -> bool {
    let inlined = ending_with(f, &["main", outer, inner]);
    let alone = ending_with(f, &["main", outer]);
    inlined >= 100 && alone * 20 <= inlined
}

/// A copy of `exe` at `out` without its symbol table and debug sections
/// (`strip -s`); returns `out`.
fn strip_all(exe: &Path, out: &Path) -> PathBuf {
    let result = Command::new("strip")
        .arg("-s")
        .arg("-o")
        .arg(out)
        .arg(exe)
        .output()
        .expect("binutils' strip");
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out.to_path_buf()
}

fn total(f: &BTreeMap<Vec<String>, u64>) -> u64 {
    f.values().sum()
}

fn root_pct(info: &str) -> f64 {
    json_number(info, "unwound_to_root_pct")
}

/// `worker-a ONE_MS TWO_MS` lines of rec_threads' `REC_TRUTH_FILE`: the
/// CPU time each worker spent in each parent, by worker name.
fn truth_of(path: &Path) -> BTreeMap<String, (f64, f64)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("rec_threads wrote no {}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let ms = |i: usize| f.get(i).and_then(|v| v.parse().ok());
            match (f.first(), ms(1), ms(2)) {
                (Some(name), Some(one), Some(two)) => (name.to_string(), (one, two)),
                _ => panic!("not a truth line: {l:?}"),
            }
        })
        .collect()
}

#[test]
fn threads_call_tree_ratio_and_roots() {
    require_perf!();
    let dir = scratch_dir("an-threads");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "t", &[], &exe, &["1500"]);
    let truth = truth_of(&dir.join("t.truth"));
    let f = folded(&trace, &[]);
    for worker in ["worker-a", "worker-b"] {
        let prefix = format!("{worker}-");
        let one = calls(&f, &prefix, "parent_one", "leaf_work");
        let two = calls(&f, &prefix, "parent_two", "leaf_work");
        assert!(one >= 20, "{worker}: too few samples in parent_one: {f:?}");
        // The program spends about twice the CPU time in parent_two (1:2
        // work), and says how much it did spend in each: the samples
        // must split alike. About 1,500 samples per worker at 1 kHz; in
        // 58 workers recorded on a loaded machine the sampled ratio came
        // within 0.86-1.18 of the program's.
        let (one_ms, two_ms) = *truth
            .get(worker)
            .unwrap_or_else(|| panic!("rec_threads said nothing of {worker}: {truth:?}"));
        let spent = two_ms / one_ms;
        let sampled = two as f64 / one as f64;
        assert!(
            (0.75..=1.33).contains(&(sampled / spent)),
            "{worker}: samples in parent_two:parent_one {two}:{one} ({sampled:.2}) where the \
             program spent {two_ms:.0}:{one_ms:.0} ms ({spent:.2}); trace {} (kept until the \
             next test run); stacks: {f:?}",
            trace.display()
        );
        for (stack, _) in f.iter().filter(|(s, _)| s[0].starts_with(&prefix)) {
            assert!(
                ["clone3", "clone", "start_thread"].contains(&stack[1].as_str()),
                "worker stack does not start at the thread entry: {stack:?}"
            );
        }
    }
    let i = info(&trace, &[]);
    assert!(root_pct(&i) >= 99.0, "{i}");
}

#[test]
fn deep_recursion_and_big_frame_reach_the_root() {
    require_perf!();
    let dir = scratch_dir("an-deep");
    let deep = build_c(&["rec_deep.c"], NO_FP, &dir, "rec_deep");
    let big = build_c(&["rec_bigframe.c"], NO_FP, &dir, "rec_bigframe");
    let deep_trace = record(&dir, "deep", &[], &deep, &["1000", "300"]);
    let big_trace = record(&dir, "big", &[], &big, &["1000"]);

    let f = folded(&deep_trace, &[]);
    let full: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start" && s.iter().filter(|n| *n == "descend").count() >= 300)
        .map(|(_, c)| c)
        .sum();
    assert!(
        full as f64 >= 0.99 * total(&f) as f64,
        "only {full} of {} samples unwound through 300 descend frames to _start",
        total(&f)
    );
    assert!(root_pct(&info(&deep_trace, &[])) >= 99.0);

    let f = folded(&big_trace, &[]);
    let through = calls(&f, "", "main", "big_frame") + calls(&f, "", "big_frame", "frame_leaf");
    assert!(calls(&f, "", "big_frame", "frame_leaf") > 0, "{f:?}");
    assert!(through > 0);
    let rooted: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start")
        .map(|(_, c)| c)
        .sum();
    assert!(rooted as f64 >= 0.99 * total(&f) as f64, "{f:?}");
}

/// The analyzer unwinds a sample only down to where it joins the earlier
/// sample its stack was delta-encoded against, and takes that sample's
/// outer frames; `strip` unwinds every sample in full. Both must give the
/// same stacks: on a 300-frame recursion and on threads whose leaves
/// change, sampled fast so that consecutive samples share most frames.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "written for x86-64 glibc's __restore_rt; the AArch64 signal frame (the vDSO's trampoline) has a unit test only"
)]
fn signal_handlers_unwind_into_the_code_they_interrupted() {
    require_perf!();
    let dir = scratch_dir("an-signal");
    let exe = build_c(&["an_signal.c"], NO_FP, &dir, "an_signal");
    let trace = record(&dir, "sig", &[], &exe, &["800"]);
    let f = folded(&trace, &[]);
    let in_handler: Vec<(&Vec<String>, u64)> = f
        .iter()
        .filter(|(s, _)| s.ends_with(&["on_signal".to_string(), "handler_work".to_string()]))
        .map(|(s, c)| (s, *c))
        .collect();
    let handled: u64 = in_handler.iter().map(|(_, c)| c).sum();
    assert!(handled >= 20, "{handled} samples in the handler: {f:?}");
    // Through the signal frame (the trampoline between the interrupted
    // function and on_signal) to the root, with the interrupted function
    // itself: spin_leaf has no frame pointer to skip it by.
    let rooted: u64 = in_handler
        .iter()
        .filter(|(s, _)| s[1] == "_start" && s.windows(2).any(|w| w == ["main", "spin"]))
        .map(|(_, c)| c)
        .sum();
    assert!(
        rooted as f64 >= 0.95 * handled as f64,
        "{rooted} of {handled} handler samples reach main: {in_handler:?}"
    );
    let from_leaf: u64 = in_handler
        .iter()
        .filter(|(s, _)| s[s.len() - 4] == "spin_leaf")
        .map(|(_, c)| c)
        .sum();
    assert!(
        from_leaf >= 5,
        "{from_leaf} handler samples interrupted spin_leaf: {in_handler:?}"
    );
    // The trampoline is named, though the handler returns to its first
    // byte and a return address is looked up a byte before (libc's local
    // symbols are in its debug file).
    if post_mortem::libc_has_debug_file() {
        let named: u64 = in_handler
            .iter()
            .filter(|(s, _)| s[s.len() - 3] == "__restore_rt")
            .map(|(_, c)| c)
            .sum();
        assert_eq!(named, handled, "{in_handler:?}");
    } else {
        cannot_check("libc has no debug file here to name __restore_rt (Debian: libc6-dbg)");
    }
    // The trampoline's unwind entry is in the trace's embedded data.
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

/// A `makecontext` context's stack ends in glibc's `__start_context`,
/// planted as its function's return address: named (a byte after where a
/// return address is looked up) and counted as the root, locally and
/// offline.
#[test]
fn makecontext_stacks_end_at_start_context() {
    require_perf!();
    let dir = scratch_dir("an-context");
    let exe = build_c(&["an_context.c"], NO_FP, &dir, "an_context");
    let trace = record(&dir, "ctx", &[], &exe, &["600"]);
    let f = folded(&trace, &[]);
    let in_co: u64 = f
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == "co_work"))
        .map(|(_, c)| c)
        .sum();
    assert!(in_co >= 100, "{in_co} samples in co_work: {f:?}");
    if post_mortem::libc_has_debug_file() {
        let whole: u64 = f
            .iter()
            .filter(|(s, _)| s[1..] == ["__start_context", "co_body", "co_work"])
            .map(|(_, c)| c)
            .sum();
        assert!(
            whole as f64 >= 0.95 * in_co as f64,
            "{whole} of {in_co} samples in co_work start at __start_context: {f:?}"
        );
        assert!(root_pct(&info(&trace, &[])) >= 99.0);
    } else {
        cannot_check("libc has no debug file here to name __start_context (Debian: libc6-dbg)");
    }
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

/// An image with `.eh_frame` for some of its code and `.debug_frame` for
/// the rest: each part is unwound by its own table (framehop alone reads
/// `.eh_frame` only, and found the `.debug_frame` code's callers by frame
/// pointer), locally and from the trace's embedded data.
#[test]
fn code_described_only_by_debug_frame_beside_eh_frame_is_unwound_by_it() {
    require_perf!();
    let dir = scratch_dir("an-mixed");
    let cfi_only = [
        "-c",
        "-O2",
        "-g",
        "-fomit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
    ];
    let object = build_c(&["an_mixed_cfi.c"], &cfi_only, &dir, "an_mixed_cfi.o");
    let sources = ["an_mixed.c", object.to_str().unwrap()];
    let exe = build_c(&sources, &["-O2", "-fomit-frame-pointer"], &dir, "an_mixed");
    {
        use object::Object;
        let bytes = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        for both in [".eh_frame", ".debug_frame"] {
            assert!(file.section_by_name(both).is_some(), "no {both}");
        }
    }
    let trace = record(&dir, "mixed", &[], &exe, &["600"]);
    let f = folded(&trace, &[]);
    let in_leaf: u64 = f
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == "leaf"))
        .map(|(_, c)| c)
        .sum();
    let whole: u64 = f
        .iter()
        .filter(|(s, _)| {
            s[1] == "_start"
                && s.windows(3).any(|w| w == ["main", "top", "deep"])
                && s.ends_with(&["deep".to_string(), "leaf".to_string()])
        })
        .map(|(_, c)| c)
        .sum();
    assert!(in_leaf >= 200, "{in_leaf} samples in leaf: {f:?}");
    assert!(
        whole as f64 >= 0.95 * in_leaf as f64,
        "{whole} of {in_leaf} samples in leaf reach _start through top: {f:?}"
    );
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the fixture's _start is x86_64 assembly"
)]
fn images_without_unwind_tables_are_unwound_by_frame_pointers_without_a_warning() {
    require_perf!();
    let dir = scratch_dir("an-bare");
    let flags = [
        "-O0",
        "-nostdlib",
        "-static",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
        "-fno-omit-frame-pointer",
    ];
    let exe = build_c(&["an_bare.c"], &flags, &dir, "an_bare");
    let bytes = std::fs::read(&exe).unwrap();
    {
        use object::{Object, ObjectSection};
        let file = object::File::parse(&*bytes).unwrap();
        for s in file.sections() {
            let name = s.name().unwrap();
            assert!(!name.contains("frame"), "the fixture has {name}");
        }
    }
    let trace = record(&dir, "bare", &[], &exe, &[]);
    let t = trace.to_str().unwrap();
    let before = folded(&trace, &[]);
    let chain = ["_start", "bare_main", "bare_mid", "bare_leaf"].map(String::from);
    let whole: u64 = before
        .iter()
        .filter(|(s, _)| s[1..] == chain)
        .map(|(_, c)| c)
        .sum();
    assert!(
        whole >= 200,
        "{whole} samples of the whole chain: {before:?}"
    );
    // With the file and without it (its layout table in the trace says it
    // has no unwind table): nothing is missing, no warning.
    for gone in [false, true] {
        if gone {
            std::fs::remove_file(&exe).unwrap();
            assert_eq!(folded(&trace, &[]), before);
        }
        let i = info(&trace, &[]);
        assert!(i.contains("none in the image (frame pointers)"), "{i}");
        let out = ok(&[t, "--format", "folded", "-o", "-"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("missing"), "{stderr}");
    }
    remove_scratch_dir(&dir);
}

#[test]
fn unwinding_only_what_changed_gives_the_stacks_of_full_walks() {
    require_perf!();
    let dir = scratch_dir("an-incremental");
    let deep = build_c(&["rec_deep.c"], NO_FP, &dir, "rec_deep");
    let threads = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    // What each full walk must show, so that the comparison is not of
    // empty or shallow profiles: the whole recursion (all samples may be
    // in its one leaf), and the threads' two changing leaves.
    let deep_enough = |folded: &str| {
        folded
            .lines()
            .any(|l| l.matches(";descend").count() >= 300 && l.contains(";main;"))
    };
    let both_leaves = |folded: &str| {
        folded.contains("parent_one;leaf_work") && folded.contains("parent_two;leaf_work")
    };
    // 600 frames of about 112 bytes are more than the 64 KiB stack copy:
    // every walk ends at its copy's end, and a sample reuses the earlier
    // one's frames only where both copies end at the same address.
    let cut_short = |folded: &str| {
        folded
            .lines()
            .any(|l| l.matches(";descend").count() >= 500 && !l.contains(";main;"))
    };
    type Shows<'a> = &'a dyn Fn(&str) -> bool;
    let cases: [(&str, &Path, &[&str], Shows); 3] = [
        ("deep", &deep, &["400", "300"], &deep_enough),
        ("threads", &threads, &["400"], &both_leaves),
        ("cut", &deep, &["400", "600"], &cut_short),
    ];
    for (name, exe, args, shows) in cases {
        let trace = record(&dir, name, &["--freq", "4000"], exe, args);
        let stripped = dir.join(format!("{name}-stripped.lpt"));
        ok(&[
            "strip",
            trace.to_str().unwrap(),
            "-o",
            stripped.to_str().unwrap(),
        ]);
        let whole = folded_text(&stripped, &[]);
        assert!(shows(&whole), "{name}: {whole}");
        assert_eq!(folded_text(&trace, &[]), whole, "{name}");
        assert_eq!(folded_text(&trace, &["--jobs", "2"]), whole, "{name}");
        // Walks that stop at the end of a full copy are counted and
        // explained; no others are. (rec_deep has one thread: the first
        // `trace_samples` in the JSON, its thread's, is all of them.)
        let i = info(&trace, &[]);
        let past = json_number(&i, "past_copy_samples");
        if name == "cut" {
            assert!(past >= 0.9 * json_number(&i, "trace_samples"), "{i}");
            assert!(i.contains("deeper than the copy"), "{i}");
        } else {
            assert_eq!(past, 0.0, "{name}: {i}");
            assert!(!i.contains("deeper than the copy"), "{name}: {i}");
        }
    }
    remove_scratch_dir(&dir);
}

#[test]
fn dlopened_library_resolves() {
    require_perf!();
    let dir = scratch_dir("an-dlopen");
    let exe = build_c(
        &["rec_dlopen.c"],
        &["-O2", "-g", "-fomit-frame-pointer", "-ldl"],
        &dir,
        "rec_dlopen",
    );
    let plugin = build_c(
        &["rec_plugin.c"],
        &["-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC"],
        &dir,
        "librec_plugin.so",
    );
    let trace = record(&dir, "dl", &[], &exe, &["1000", plugin.to_str().unwrap()]);
    let f = folded(&trace, &[]);
    assert!(calls(&f, "", "main", "before_load") > 20, "{f:?}");
    assert!(calls(&f, "", "main", "plugin_work") > 20, "{f:?}");
    assert!(calls(&f, "", "plugin_work", "plugin_leaf") > 20, "{f:?}");
    assert!(root_pct(&info(&trace, &[])) >= 99.0);
}

/// Build an_inline and its library libanlib.so into `dir`.
fn build_inline_fixture(dir: &Path, flags: &[&str]) -> PathBuf {
    build_with_library(
        dir,
        flags,
        ("an_inline.c", "an_inline"),
        ("an_lib.c", "libanlib.so"),
    )
}

/// Build the shared library `lib` (source, file name) and the program
/// `exe` (source, file name) linked with it into `dir`, with `flags`; the
/// program finds the library next to it (rpath `$ORIGIN`).
fn build_with_library(dir: &Path, flags: &[&str], exe: (&str, &str), lib: (&str, &str)) -> PathBuf {
    let mut lib_flags = flags.to_vec();
    lib_flags.extend(["-shared", "-fPIC"]);
    let lib = build_c(&[lib.0], &lib_flags, dir, lib.1);
    // The library goes after the source (linkers using --as-needed care),
    // which build_c cannot express: call cc directly.
    let (source, exe) = (exe.0, dir.join(exe.1));
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(flags)
        .arg("-I")
        .arg(lrnprof_tests::workspace_root().join("tests/fixtures"))
        .arg("-o")
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source(source))
        .arg(&lib)
        .arg("-Wl,-rpath,$ORIGIN")
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn inline_frames_and_shared_library() {
    require_perf!();
    let dir = scratch_dir("an-inline");
    let exe = build_inline_fixture(&dir, NO_FP);
    let trace = record(&dir, "inl", &[], &exe, &["1000"]);
    let f = folded(&trace, &[]);
    assert!(calls(&f, "", "hot_outer", "mix_step") > 20, "{f:?}");
    assert!(calls(&f, "", "main", "lib_entry") > 20, "{f:?}");
    assert!(calls(&f, "", "lib_entry", "lib_leaf") > 20, "{f:?}");
    let no_inline = folded(&trace, &["--no-inline"]);
    assert_eq!(calls(&no_inline, "", "hot_outer", "mix_step"), 0);
    assert!(calls(&no_inline, "", "main", "hot_outer") > 20);
    assert_eq!(total(&f), total(&no_inline));
    assert!(root_pct(&info(&trace, &[])) >= 99.0);
}

#[test]
fn kernel_callchain_continues_a_short_stack_copy() {
    require_perf!();
    let dir = scratch_dir("an-callchain");
    // Frame pointers kept, so the kernel's callchain is whole (the kernel
    // caps it at perf_event_max_stack, 127 by default: stay below); a 1 KiB
    // stack copy cannot hold 80 frames of ~128 bytes.
    let exe = build_c(
        &["rec_deep.c"],
        &["-O2", "-g", "-fno-omit-frame-pointer"],
        &dir,
        "rec_deep_fp",
    );
    let trace = record(&dir, "cc", &["--stack-size", "1024"], &exe, &["800", "80"]);
    let i = info(&trace, &[]);
    assert!(
        json_number(&i, "kernel_callchain_samples") > 0.0,
        "no sample used the kernel callchain: {i}"
    );
    assert!(root_pct(&i) >= 99.0, "{i}");
    let f = folded(&trace, &[]);
    // glibc has no frame pointers: the kernel's walk ends in
    // __libc_start_call_main, which counts as the main thread's root.
    let roots = ["_start", "__libc_start_main", "__libc_start_call_main"];
    let whole: u64 = f
        .iter()
        .filter(|(s, _)| roots.contains(&s[1].as_str()) && s.contains(&"main".to_string()))
        .filter(|(s, _)| s.iter().filter(|n| *n == "descend").count() >= 80)
        .map(|(_, c)| c)
        .sum();
    assert!(whole as f64 >= 0.99 * total(&f) as f64, "{f:?}");
}

#[test]
fn output_is_identical_at_any_job_count() {
    require_perf!();
    let dir = scratch_dir("an-determinism");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "d", &[], &exe, &["600"]);
    let t = trace.to_str().unwrap();
    for format in ["pprof", "folded", "speedscope", "svg", "firefox"] {
        let a = dir.join(format!("a.{format}"));
        let b = dir.join(format!("b.{format}"));
        ok(&[
            t,
            "--format",
            format,
            "--jobs",
            "1",
            "-o",
            a.to_str().unwrap(),
        ]);
        ok(&[
            t,
            "--format",
            format,
            "--jobs",
            "2",
            "-o",
            b.to_str().unwrap(),
        ]);
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert!(!a.is_empty());
        assert!(
            a == b,
            "{format} output differs between --jobs 1 and --jobs 2"
        );
    }
}

#[test]
fn a_renamed_thread_is_selected_by_each_name_for_its_time() {
    require_perf!();
    let dir = scratch_dir("an-rename");
    let exe = build_c(&["an_rename.c"], NO_FP, &dir, "an_rename");
    let trace = record(&dir, "rename", &[], &exe, &["200"]);
    let t = trace.to_str().unwrap();
    let in_phase = |name: &str, phase: &str| -> u64 {
        folded(&trace, &["--thread-name", name])
            .iter()
            .filter(|(s, _)| s.iter().any(|f| f == phase))
            .map(|(_, c)| c)
            .sum()
    };
    // Before, only the last name selected anything, and all of the
    // thread's samples.
    assert!(in_phase("loader", "phase_load") >= 20);
    assert_eq!(in_phase("loader", "phase_crunch"), 0);
    assert!(in_phase("cruncher", "phase_crunch") >= 20);
    assert_eq!(in_phase("cruncher", "phase_load"), 0);
    // `perf script` text names each sample's thread as it was then.
    let script = String::from_utf8(ok(&[t, "-f", "script", "-o", "-"]).stdout).unwrap();
    let named = |name: &str, phase: &str| {
        script
            .split_terminator("\n\n")
            .filter(|b| b.starts_with(&format!("{name} ")) && b.contains(phase))
            .count()
    };
    assert!(named("loader", "phase_load") >= 20 && named("loader", "phase_crunch") == 0);
    assert!(named("cruncher", "phase_crunch") >= 20 && named("cruncher", "phase_load") == 0);
    // `info` lists the names a thread had.
    let text = String::from_utf8(ok(&["info", t]).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("cruncher (before: ") && l.contains("loader")),
        "{text}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn default_output_path_and_filters() {
    require_perf!();
    let dir = scratch_dir("an-filters");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "f", &[], &exe, &["500"]);
    let t = trace.to_str().unwrap();
    ok(&[t, "--format", "folded"]);
    assert!(dir.join("f.lpt.folded").exists());
    // Without --format, -o's name says the format; else pprof.
    let named = |name: &str| {
        let out = dir.join(name);
        ok(&[t, "-o", out.to_str().unwrap()]);
        std::fs::read(&out).unwrap()
    };
    assert!(named("fg.svg").starts_with(b"<?xml"));
    assert_eq!(
        named("s.folded"),
        std::fs::read(dir.join("f.lpt.folded")).unwrap()
    );
    assert!(named("s.speedscope.json").starts_with(b"{"));
    assert!(named("p.pb.gz").starts_with(&[0x1f, 0x8b]));
    assert!(named("profile").starts_with(&[0x1f, 0x8b]));
    let json = analyze(&[t, "-o", dir.join("p.json").to_str().unwrap()]);
    let msg = String::from_utf8_lossy(&json.stderr);
    assert!(!json.status.success());
    assert!(
        msg.contains("says JSON but not which: give --format speedscope or --format firefox"),
        "{msg}"
    );
    assert!(!dir.join("p.json").exists());
    // A --format the name contradicts is used, with a warning.
    let out = dir.join("odd.svg");
    let odd = ok(&[t, "--format", "folded", "-o", out.to_str().unwrap()]);
    let msg = String::from_utf8_lossy(&odd.stderr);
    assert!(
        msg.contains(&format!(
            "warning: writing folded to {}, whose name says svg",
            out.display()
        )),
        "{msg}"
    );
    assert!(!std::fs::read(&out).unwrap().starts_with(b"<?xml"));
    let only_a = folded(&trace, &["--thread-name", "worker-a"]);
    assert!(!only_a.is_empty());
    assert!(only_a.keys().all(|s| s[0].starts_with("worker-a-")));
    let early = folded(&trace, &["--to", "0.2"]);
    let all = folded(&trace, &[]);
    assert!(total(&early) < total(&all));
    let none = analyze(&[
        t,
        "--format",
        "folded",
        "--thread-name",
        "no-such-thread",
        "-o",
        "-",
    ]);
    assert!(!none.status.success());
    let msg = String::from_utf8_lossy(&none.stderr);
    assert!(msg.contains("no samples left after filtering"), "{msg}");
    assert_eq!(msg.trim().lines().count(), 1, "{msg}");
    // --focus and --ignore select samples by the functions on their stacks.
    let has = |stack: &Vec<String>, f: &str| stack.iter().any(|x| x == f);
    let sum_with = |f: &str| -> u64 { all.iter().filter(|(s, _)| has(s, f)).map(|(_, c)| c).sum() };
    let focused = folded(&trace, &["--focus", "parent_one"]);
    assert!(sum_with("parent_one") > 0);
    assert_eq!(
        focused,
        all.iter()
            .filter(|(s, _)| has(s, "parent_one"))
            .map(|(s, c)| (s.clone(), *c))
            .collect(),
    );
    // A part of the name does; repeated, any of them.
    let either = folded(&trace, &["--focus", "_one", "--focus", "arent_tw"]);
    assert_eq!(
        total(&either),
        sum_with("parent_one") + sum_with("parent_two")
    );
    let ignored = folded(&trace, &["--ignore", "parent_one"]);
    assert!(ignored.keys().all(|s| !has(s, "parent_one")));
    assert_eq!(total(&ignored), total(&all) - sum_with("parent_one"));
    let both = folded(&trace, &["--focus", "leaf_work", "--ignore", "parent_two"]);
    assert!(!both.is_empty());
    assert_eq!(
        both,
        all.iter()
            .filter(|(s, _)| has(s, "leaf_work") && !has(s, "parent_two"))
            .map(|(s, c)| (s.clone(), *c))
            .collect(),
    );
    // Every view sees the same samples: top's total, speedscope's samples.
    let top = ok(&["top", t, "--focus", "parent_one", "--value", "samples"]);
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.lines()
            .next()
            .unwrap()
            .contains(&format!(" {} samples of ", total(&focused))),
        "{top}"
    );
    let speedscope = ok(&[
        t,
        "--format",
        "speedscope",
        "--value",
        "samples",
        "--focus",
        "parent_one",
        "-o",
        "-",
    ]);
    let speedscope = String::from_utf8_lossy(&speedscope.stdout);
    let weights: u64 = speedscope
        .split("\"weights\":[")
        .skip(1)
        .flat_map(|w| {
            w[..w.find(']').unwrap()]
                .split(',')
                .map(|n| n.parse::<u64>().unwrap_or(0))
        })
        .sum();
    assert_eq!(weights, total(&focused));
    let none = analyze(&[
        t,
        "--format",
        "folded",
        "--focus",
        "no_such_function",
        "-o",
        "-",
    ]);
    assert!(!none.status.success());
    let msg = String::from_utf8_lossy(&none.stderr);
    assert!(
        msg.contains("--focus \"no_such_function\": no stack has functions so named"),
        "{msg}"
    );
    // A launched command's trace records no cgroups: --cgroup says so.
    let none = analyze(&[t, "--format", "folded", "--cgroup", "docker", "-o", "-"]);
    assert!(!none.status.success());
    let msg = String::from_utf8_lossy(&none.stderr);
    assert!(
        msg.contains(
            "--cgroup \"docker\": the trace recorded no cgroups; only `lrnprof-rec --all`"
        ),
        "{msg}"
    );
}

#[test]
fn bad_and_truncated_traces() {
    require_perf!();
    let dir = scratch_dir("an-corrupt");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "c", &[], &exe, &["600"]);

    // Not a trace at all: one clear line, no output file.
    let junk = dir.join("junk.lpt");
    std::fs::write(&junk, b"this is not a trace").unwrap();
    let out = analyze(&[junk.to_str().unwrap(), "--format", "folded"]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("cannot read trace") && msg.trim().lines().count() == 1,
        "{msg}"
    );
    assert!(!dir.join("junk.lpt.folded").exists());

    let missing = analyze(&[dir.join("nope.lpt").to_str().unwrap()]);
    assert!(!missing.status.success());

    // Cut in the middle: the readable part is analyzed, with a warning.
    // Rewrite the trace with small blocks first, so that a cut leaves
    // whole blocks behind.
    let reader = TraceReader::open(&trace).unwrap();
    let mut small = Vec::new();
    let options = WriterOptions {
        block_size: 4096,
        ..Default::default()
    };
    let mut w = TraceWriter::new(&mut small, reader.header(), options).unwrap();
    for r in reader.records() {
        // Without embedded blobs (which come last), so that the cut
        // falls among samples.
        match r.unwrap() {
            lrnprof_format::Record::Blob(_) => {}
            r => w.write(&r).unwrap(),
        }
    }
    w.finish().unwrap();
    let small_trace = dir.join("small.lpt");
    std::fs::write(&small_trace, &small).unwrap();
    let whole = total(&folded(&small_trace, &[]));
    assert_eq!(whole, total(&folded(&trace, &[])));
    let cut = dir.join("cut.lpt");
    std::fs::write(&cut, &small[..small.len() * 2 / 3]).unwrap();
    let out = ok(&[cut.to_str().unwrap(), "--format", "folded", "-o", "-"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not finished cleanly"), "{stderr}");
    let cut_total: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert!(cut_total > 0 && cut_total < whole, "{cut_total} of {whole}");
}

#[test]
fn misplaced_and_meaningless_arguments_get_advice() {
    let dir = scratch_dir("an-args");
    let trace = dir.join("t.lpt");
    std::fs::write(&trace, b"").unwrap();
    let t = trace.to_str().unwrap();
    // An output format spelled as a command, as `go tool pprof` is.
    let out = analyze(&["pprof", t]);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{msg}");
    assert_eq!(
        msg.trim(),
        "lrnprof-analyze: error: `pprof` is an output format, not a command: \
         lrnprof-analyze --format pprof TRACE (pprof is the default)"
    );
    let out = analyze(&["svg", "-o", "-", t]);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("lrnprof-analyze --format svg TRACE"), "{msg}");
    // Two traces, or the command after the trace.
    for args in [[t, t], [t, "top"]] {
        let out = analyze(&args);
        let msg = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{msg}");
        assert!(
            msg.contains("tip: lrnprof-analyze takes one trace, after its options"),
            "{msg}"
        );
    }
    // Values that parse but mean nothing.
    for bad in ["--from=nan", "--to=-1", "--from=inf"] {
        let out = analyze(&["top", t, bad]);
        let msg = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {msg}");
        assert!(
            msg.contains("expected seconds into the recording: a number, 0 or more"),
            "{bad}: {msg}"
        );
    }
    // An output over one of its traces would replace it.
    let other = dir.join("other.lpt");
    std::fs::write(&other, b"").unwrap();
    let o = other.to_str().unwrap();
    for args in [
        &[t, "-o", t][..],
        &["diff", t, o, "-o", t],
        &["diff", t, o, "-o", o],
    ] {
        let out = analyze(args);
        let msg = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {msg}");
        assert!(
            msg.contains("is a trace being analyzed: writing the output there would replace it"),
            "{args:?}: {msg}"
        );
    }
    assert_eq!(std::fs::read(&trace).unwrap(), b"");
    // Far more threads than can start: refused, not hung.
    let out = analyze(&["top", t, "-j", "100000"]);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        msg.trim(),
        "lrnprof-analyze: error: cannot start 100000 worker threads: at most 1024 are allowed (--jobs)"
    );
    remove_scratch_dir(&dir);
}

/// Folded output as text (`--format folded -o -`).
fn folded_text(trace: &Path, extra: &[&str]) -> String {
    let mut args = vec![trace.to_str().unwrap(), "--format", "folded", "-o", "-"];
    args.extend(extra);
    String::from_utf8(ok(&args).stdout).unwrap()
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the JIT fixture writes x86_64 machine code"
)]
fn jit_frames_are_named_from_the_perf_map() {
    require_perf!();
    let dir = scratch_dir("an-jit");
    let exe = build_c(&["an_jit.c"], NO_FP, &dir, "an_jit");
    let trace = record(&dir, "jit", &[], &exe, &["800"]);
    let json = String::from_utf8(ok(&["info", trace.to_str().unwrap(), "--json"]).stdout).unwrap();
    let pid = json_number(&json, "pid") as u32;
    // The JIT code's mapping is listed as such, not as an image whose data
    // is missing.
    assert!(json.contains(r#""jit": true"#), "{json}");
    let text = String::from_utf8(ok(&["info", trace.to_str().unwrap()]).stdout).unwrap();
    assert!(
        text.contains("//anon (anonymous executable memory: JIT code)"),
        "{text}"
    );
    assert!(!text.contains("unwind: missing"), "{text}");
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let f = folded(&trace, &[]);
    let _ = std::fs::remove_file(&map);
    assert!(calls(&f, "", "call_jit", "jit_loop") > 20, "{f:?}");
    assert!(calls(&f, "", "main", "call_jit") > 20, "{f:?}");
    let rooted: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start")
        .map(|(_, c)| c)
        .sum();
    assert!(rooted as f64 >= 0.99 * total(&f) as f64, "{f:?}");
    let out = ok(&[trace.to_str().unwrap(), "--format", "folded", "-o", "-"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("JIT code"), "{stderr}");

    // No map (Node.js without --perf-basic-prof): the stacks still reach
    // the root by frame pointers, and the analysis says how to name the
    // addresses its hottest code is.
    let trace = record(&dir, "jit-nomap", &[], &exe, &["800", "nomap"]);
    let f = folded(&trace, &[]);
    let unnamed: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start" && s[s.len() - 2] == "call_jit")
        .filter(|(s, _)| s.last().is_some_and(|l| l.starts_with("0x")))
        .map(|(_, c)| c)
        .sum();
    assert!(unnamed as f64 >= 0.8 * total(&f) as f64, "{f:?}");
    let out = ok(&["top", trace.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warning = stderr
        .lines()
        .find(|l| l.contains("are in code that nothing names"));
    assert!(
        warning.is_some_and(|w| w.starts_with("warning: ") && w.contains("--perf-basic-prof")),
        "{stderr}"
    );
    assert!(!stderr.contains("stop short"), "{stderr}");
    remove_scratch_dir(&dir);
}

/// JIT code of a process in a container (a PID namespace of its own, a
/// private `/tmp` that goes when it exits) is named from the perf map it
/// wrote there, under the pid it knows itself by (1).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the JIT fixture writes x86_64 machine code"
)]
fn jit_frames_of_a_process_in_a_container_are_named() {
    require_perf!();
    let dir = scratch_dir("an-jit-ns");
    build_c(&["an_jit.c"], NO_FP, &dir, "an_jit");
    // Run from its directory: the private /tmp hides a scratch directory
    // under /tmp, not the working directory.
    let script = format!(
        "cd {} && mount -t tmpfs tmpfs /tmp && exec ./an_jit 600",
        dir.display()
    );
    let args = ["--pid", "--mount", "--fork", "sh", "-c", &script];
    let trace = record(&dir, "jit-ns", &[], Path::new("unshare"), &args);
    let f = folded(&trace, &[]);
    assert!(
        calls(&f, "", "call_jit", "jit_loop") as f64 >= 0.8 * total(&f) as f64,
        "{f:?}"
    );
    assert!(!Path::new("/tmp/perf-1.map").exists());
    remove_scratch_dir(&dir);
}

/// JIT code that keeps no frame pointer (a JVM's by default): its callers
/// cannot be found, and the analysis says why and what to do.
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the JIT fixture writes x86_64 machine code"
)]
fn stacks_ending_in_jit_code_without_frame_pointers_get_advice() {
    require_perf!();
    let dir = scratch_dir("an-jit-nofp");
    let exe = build_c(&["an_jit.c"], NO_FP, &dir, "an_jit");
    for mode in ["nofp", "nofp-nomap"] {
        let trace = record(&dir, mode, &[], &exe, &["800", mode]);
        let info = ok(&["info", trace.to_str().unwrap(), "--json"]).stdout;
        let pid = json_number(&String::from_utf8(info).unwrap(), "pid") as u32;
        let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let out = ok(&[trace.to_str().unwrap(), "--format", "folded", "-o", "-"]);
        let f = folded(&trace, &[]);
        let _ = std::fs::remove_file(&map);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let warning = |what: &str, advice: &str| {
            stderr
                .lines()
                .find(|l| l.contains(what))
                .is_some_and(|w| w.starts_with("warning: ") && w.contains(advice))
        };
        if mode == "nofp" {
            // Named from the map, and nothing leads on from them.
            let stopped: u64 = f
                .iter()
                .filter(|(s, _)| s.last().is_some_and(|l| l == "jit_inner"))
                .filter(|(s, _)| s[1..].iter().all(|f| f.starts_with("jit_")))
                .map(|(_, c)| c)
                .sum();
            assert!(stopped as f64 >= 0.8 * total(&f) as f64, "{f:?}");
            assert!(warning("in JIT code", "PreserveFramePointer"), "{stderr}");
        } else {
            // No map: unnamed, and the advice says to have one written,
            // once.
            assert!(warning("in unnamed code", "DumpPerfMapAtExit"), "{stderr}");
            assert!(!stderr.contains("code that nothing names"), "{stderr}");
        }
    }
    remove_scratch_dir(&dir);
}
