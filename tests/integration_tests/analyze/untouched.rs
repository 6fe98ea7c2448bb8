//! Stack copies that stop at a stack page the thread never touched
//! (`rec_untouched.c`, `rec_untouched.rs`): a thread running in a function
//! with a 32 KiB buffer written only at its ends. The kernel's copy stops at
//! the first untouched page; the recorder reads those pages once, so later
//! copies reach the callers and the thread's samples unwind to its root. A
//! second, deeper gap is read as soon as a copy stops in it.

use super::*;
use lrnprof_analyzer::{analyze, AnalyzeOptions, NoProgress, Profile};
use lrnprof_format::{Record, SampleFlags};
use lrnprof_tests::build_rust;

/// How long the fixtures' threads run, in ms (the C fixture: of each
/// thread's CPU time, so about that many samples per thread at 1 kHz on a
/// loaded machine too): the samples taken before the recorder has seen
/// the first cut-short copy (a drain interval, 20 ms, on an idle machine;
/// up to 80 ms of wall time, a fifth of it on a CPU, seen with two busy
/// loops beside the test suite) must stay under 1% of a thread's samples.
const RUN_MS: &str = "3000";

/// The analysis of `trace` (local files allowed).
fn profile(trace: &Path) -> Profile {
    analyze(trace, &AnalyzeOptions::default(), &NoProgress).expect("analyzing the trace")
}

/// Records `program` like [`record`], keeping what the recorder said.
fn record_saying(dir: &Path, program: &Path, args: &[&str]) -> (PathBuf, String) {
    let (trace, out) = record_output(dir, "u", &[], program, args);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "lrnprof-rec failed: {said}");
    (trace, said)
}

/// When and where thread `tid`'s copies were cut short: their count, the
/// first and last of them in ms after the thread's first sample, and the
/// distinct (stack pointer, bytes copied) among them.
fn cut_short_story(trace: &Path, tid: u32) -> String {
    let Ok(reader) = lrnprof_format::TraceReader::open(trace) else {
        return "the trace does not open".into();
    };
    let mut first = None;
    let mut cut = Vec::new();
    let mut places = BTreeMap::new();
    for r in reader.records() {
        let Ok(Record::Sample(s)) = r else { continue };
        if s.tid.0 != tid {
            continue;
        }
        let t0 = *first.get_or_insert(s.time.0);
        if s.flags.contains(SampleFlags::STACK_CUT_SHORT) {
            cut.push((s.time.0 - t0) as f64 / 1e6);
            *places
                .entry((s.regs.sp(), s.stack.bytes.len()))
                .or_insert(0u32) += 1;
        }
    }
    let places: Vec<String> = places
        .iter()
        .take(6)
        .map(|((sp, len), n)| format!("{n}x sp {sp:#x} {len} B"))
        .collect();
    format!(
        "tid {tid}: {} copies cut short, from {:.1} ms to {:.1} ms after its first sample; {}",
        cut.len(),
        cut.first().copied().unwrap_or(0.0),
        cut.last().copied().unwrap_or(0.0),
        places.join(", ")
    )
}

/// Every thread named `name` has samples, 99% or more of which reached
/// the root; if not, says when its copies were cut short and what the
/// recorder reported (`said`).
fn assert_thread_reaches_root(p: &Profile, name: &str, trace: &Path, said: &str) {
    let threads: Vec<_> = p
        .threads
        .iter()
        .filter(|t| t.name.as_deref() == Some(name))
        .collect();
    assert!(!threads.is_empty(), "no thread named {name}");
    for t in threads {
        assert!(
            t.samples >= 100,
            "{name}: only {} samples; did the fixture run?",
            t.samples
        );
        let pct = 100.0 * t.root_samples as f64 / t.samples as f64;
        assert!(
            pct >= 99.0,
            "{name}: {pct:.1}% of {} samples reached the root ({} cut short, {} of them rooted)\n\
             {}\nlrnprof-rec said: {said}",
            t.samples,
            p.stats.cut_short_samples,
            p.stats.cut_short_root_samples,
            cut_short_story(trace, t.tid.0),
        );
    }
}

#[test]
fn c_threads_with_untouched_stack_pages_reach_their_root() {
    require_perf!();
    let dir = scratch_dir("an-untouched-c");
    let exe = build_c(&["rec_untouched.c"], NO_FP, &dir, "rec_untouched");
    let (trace, said) = record_saying(&dir, &exe, &[RUN_MS]);
    let p = profile(&trace);
    assert_thread_reaches_root(&p, "rec_untouched", &trace, &said);
    assert_thread_reaches_root(&p, "untouched-2", &trace, &said);
    // The gap was there: the first copies in untouched_frame stopped at it
    // (without frame pointers, nothing else could carry them to the root).
    let cut = p.stats.cut_short_samples;
    assert!(cut >= 1, "no stack copy was cut short: {:?}", p.stats);
    assert!(
        cut * 50 <= p.stats.samples,
        "{cut} of {} copies cut short",
        p.stats.samples
    );
    let i = info(&trace, &[]);
    assert_eq!(json_number(&i, "cut_short_samples") as u64, cut, "{i}");
    remove_scratch_dir(&dir);
}

#[test]
fn c_a_second_deeper_gap_is_read_at_once() {
    // Each thread's copies stop first in an outer function's buffer, and
    // 50 ms later in a deeper one's that the first read did not cover: that
    // gap must be read at once, not after a pause (a 250 ms pause per thread
    // once cut ~230 samples of each thread here).
    require_perf!();
    let dir = scratch_dir("an-untouched-nested");
    let exe = build_c(&["rec_untouched.c"], NO_FP, &dir, "rec_untouched");
    let (trace, said) = record_saying(&dir, &exe, &[RUN_MS, "nested"]);
    let p = profile(&trace);
    assert_thread_reaches_root(&p, "rec_untouched", &trace, &said);
    assert_thread_reaches_root(&p, "untouched-2", &trace, &said);
    remove_scratch_dir(&dir);
}

#[test]
fn c_cut_short_samples_continue_with_frame_pointers() {
    require_perf!();
    let dir = scratch_dir("an-untouched-fp");
    let exe = build_c(
        &["rec_untouched.c"],
        &["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"],
        &dir,
        "rec_untouched_fp",
    );
    let trace = record(&dir, "u", &[], &exe, &["1000"]);
    let p = profile(&trace);
    assert!(p.stats.cut_short_samples >= 1, "{:?}", p.stats);
    // Through the kernel's frame-pointer callchain, the cut-short samples
    // themselves reach the root.
    assert_eq!(
        p.stats.cut_short_root_samples, p.stats.cut_short_samples,
        "{:?}",
        p.stats
    );
    remove_scratch_dir(&dir);
}

#[test]
fn rust_threads_with_a_large_local_array_reach_their_root() {
    require_perf!();
    let dir = scratch_dir("an-untouched-rs");
    let flags = ["--edition", "2021", "-O", "-g"];
    let exe = build_rust("rec_untouched.rs", &flags, &dir, "rec_untouched_rs");
    let (trace, said) = record_saying(&dir, &exe, &[RUN_MS]);
    let p = profile(&trace);
    assert_thread_reaches_root(&p, "rec_untouched_r", &trace, &said);
    assert_thread_reaches_root(&p, "untouched-2", &trace, &said);
    remove_scratch_dir(&dir);
}
