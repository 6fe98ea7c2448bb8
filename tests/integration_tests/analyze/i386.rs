//! 32-bit x86 programs (i386 processes on x86-64): the recorder flags
//! their samples `ABI_32` and looks up their 4-byte stack words, and the
//! analyzer unwinds them by their images' `.eh_frame` (framehop has no
//! i386 unwinder), locally and offline (`tests/fixtures/an_i386.c`, built
//! with `gcc -m32`).

use super::*;
use lrnprof_format::{Record, SampleFlags};

/// Build the fixture with `gcc -m32` into `dir/an_i386`; `None` where gcc
/// cannot build 32-bit programs here (Debian: `gcc-multilib`).
fn build_i386(dir: &Path) -> Option<PathBuf> {
    let exe = dir.join("an_i386");
    let out = Command::new("gcc")
        .args(["-m32", "-Wl,--build-id"])
        .args(NO_FP)
        .arg("-o")
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source("an_i386.c"))
        .output()
        .ok()?;
    out.status.success().then_some(exe)
}

#[test]
fn stacks_of_a_32_bit_program_reach_the_root_locally_and_offline() {
    require_perf!();
    let dir = scratch_dir("an-i386");
    let Some(exe) = build_i386(&dir) else {
        skip!("gcc -m32 cannot build 32-bit programs here (Debian: gcc-multilib)");
    };
    let trace = record(&dir, "i386", &[], &exe, &["600"]);

    // Every sample of the program is flagged as 32-bit.
    let reader = TraceReader::open(&trace).unwrap();
    let (mut flagged, mut samples) = (0, 0);
    for r in reader.records() {
        if let Record::Sample(s) = r.unwrap() {
            samples += 1;
            flagged += u64::from(s.flags.contains(SampleFlags::ABI_32));
        }
    }
    assert!(
        samples > 100 && flagged == samples,
        "{flagged} of {samples}"
    );

    let i = info(&trace, &[]);
    // `info` says the process is 32-bit.
    assert!(i.contains("\"abi32\": true"), "{i}");
    // Before the i386 unwinder this held too (each stack was its leaf
    // alone, counted as reaching the root): the stacks below are what
    // tell. It guards the walk's end: the rules' `_start`, and the leaf
    // rule that misses a push in 32-bit glibc's memcpy.
    assert!(root_pct(&i) >= 95.0, "{i}");
    let f = folded(&trace, &[]);
    for phase in ["i386_sort", "i386_copy", "i386_deep", "i386_write"] {
        assert!(
            calls(&f, "", "main", phase) >= 5,
            "main -> {phase}: {}",
            hottest(&f)
        );
    }
    // Through 32-bit libc: qsort calling back (its merge sort recursing),
    // and memcpy, whose CFI misses a push.
    let under_sort: u64 = f
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == "by_value"))
        .filter(|(s, _)| s.windows(3).any(|w| w == ["main", "i386_sort", "qsort"]))
        .map(|(_, c)| c)
        .sum();
    assert!(under_sort >= 5, "{}", hottest(&f));
    let copies: u64 = f
        .iter()
        .filter(|(s, _)| s.windows(2).any(|w| w == ["main", "i386_copy"]))
        .map(|(_, c)| c)
        .sum();
    assert!(copies >= 20, "{}", hottest(&f));
    // The recursion, 150 calls deep (gcc may fold a level or two), from
    // main.
    let deep = f
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == "i386_deep_leaf"))
        .filter(|(s, _)| s.iter().any(|x| x == "main"))
        .map(|(s, _)| s.iter().filter(|x| *x == "i386_deep").count())
        .max()
        .unwrap_or(0);
    assert!(deep >= 140, "{}", hottest(&f));
    // The thread, from its start.
    assert!(
        ending_with(&f, &["i386_worker", "i386_spin"]) >= 20,
        "{}",
        hottest(&f)
    );
    // No stack goes through a made-up frame in the first page.
    assert!(
        !f.keys()
            .flatten()
            .any(|x| x.len() <= 5 && x.starts_with("0x")),
        "{}",
        hottest(&f)
    );

    // Offline, from the data the recorder embedded: the same profile.
    assert_eq!(folded(&trace, &["--offline"]), f);
    remove_scratch_dir(&dir);
}

/// The 30 stacks with the most samples, one per line, runs of a
/// recursion shortened: for failure messages.
fn hottest(f: &BTreeMap<Vec<String>, u64>) -> String {
    let mut v: Vec<(&Vec<String>, &u64)> = f.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .take(30)
        .map(|(s, c)| {
            let mut line: Vec<&str> = Vec::new();
            for x in s.iter() {
                if line.last() != Some(&x.as_str()) {
                    line.push(x);
                }
            }
            format!("{c} {}", line.join(";"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn system_calls_of_a_32_bit_program_are_named_by_its_own_numbers() {
    require_perf!();
    lrnprof_tests::require_tracing!();
    let dir = scratch_dir("an-i386-syscalls");
    let Some(exe) = build_i386(&dir) else {
        skip!("gcc -m32 cannot build 32-bit programs here (Debian: gcc-multilib)");
    };
    let trace = record(&dir, "calls", &["--syscalls"], &exe, &["100"]);
    let json = String::from_utf8(ok(&["syscalls", trace.to_str().unwrap(), "--json"]).stdout)
        .expect("UTF-8");
    // i386's write is 4, x86-64's 4 is stat: before, every write of the
    // fixture was reported as stat.
    assert!(json.contains("\"syscall\": \"write (i386)\""), "{json}");
    assert!(!json.contains("\"syscall\": \"stat\""), "{json}");
    // Its call site, from the 32-bit stack at the call's entry.
    let text =
        String::from_utf8(ok(&["syscalls", trace.to_str().unwrap(), "--syscall", "write"]).stdout)
            .expect("UTF-8");
    assert!(text.contains("i386_write (an_i386.c:"), "{text}");
    // A name only i386 has selects its calls (the C library maps memory
    // with mmap2).
    let text =
        String::from_utf8(ok(&["syscalls", trace.to_str().unwrap(), "--syscall", "mmap2"]).stdout)
            .expect("UTF-8");
    assert!(text.contains("mmap2 (i386)"), "{text}");

    // --syscall-filter chooses by 64-bit numbers: said, for the process,
    // also where no call of it passed the filter (x86-64's openat is 257,
    // which the fixture never calls by i386's numbers).
    let (_, out) = record_output(
        &dir,
        "filtered",
        &["--syscall-filter", "openat"],
        &exe,
        &["100"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("runs 32-bit code: --syscall-filter chose its calls by their 64-bit"),
        "{stderr}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn heap_profiling_says_a_32_bit_child_is_not_sampled() {
    require_perf!();
    let dir = scratch_dir("an-i386-heap");
    let Some(exe) = build_i386(&dir) else {
        skip!("gcc -m32 cannot build 32-bit programs here (Debian: gcc-multilib)");
    };
    // A 64-bit shell starts the 32-bit program: only the recording can
    // tell that the sampler did not load in it.
    let script = format!("{} 50; true", exe.display());
    let (_, out) = record_output(
        &dir,
        "heap",
        &["--heap"],
        Path::new("/bin/sh"),
        &["-c", &script],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("an_i386 (pid ")
            && stderr.contains("runs 32-bit code: its allocations are not recorded"),
        "{stderr}"
    );
    remove_scratch_dir(&dir);
}
