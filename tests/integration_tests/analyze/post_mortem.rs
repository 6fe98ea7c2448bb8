//! Traces analyzed where the binaries are gone: embedded data (`pack`,
//! `lrnprof-rec --embed`), `--offline`, refused mismatched files, `strip`,
//! and `--symbols` directories.

use super::*;

/// Record an_inline living with its library in `dir/app`, analyze it, pack
/// it (with and without DWARF) and delete `dir/app`. Returns (trace,
/// packed, packed with debug info, folded before, folded --no-inline
/// before).
fn packed_post_mortem(dir: &Path) -> (PathBuf, PathBuf, PathBuf, String, String) {
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = build_inline_fixture(&app, NO_FP);
    let trace = record(dir, "pm", EMBED_NONE, &exe, &["800"]);
    let before = folded_text(&trace, &[]);
    let before_no_inline = folded_text(&trace, &["--no-inline"]);
    assert!(before.contains("hot_outer;mix_step") && before.contains("lib_entry;lib_leaf"));
    let packed = dir.join("packed.lpt");
    let packed_debug = dir.join("packed-debug.lpt");
    let t = trace.to_str().unwrap();
    ok(&["pack", t, "-o", packed.to_str().unwrap()]);
    ok(&["pack", t, "--debug", "-o", packed_debug.to_str().unwrap()]);
    std::fs::remove_dir_all(&app).unwrap();
    (trace, packed, packed_debug, before, before_no_inline)
}

#[test]
fn packed_trace_analyzes_after_the_binaries_are_gone() {
    require_perf!();
    let dir = scratch_dir("an-postmortem");
    let (trace, packed, packed_debug, before, before_no_inline) = packed_post_mortem(&dir);

    // Unpacked, the executable and its library are now unknown.
    let lost = folded_text(&trace, &["--no-inline"]);
    assert_ne!(lost, before_no_inline);
    assert!(
        lost.contains("an_inline+0x") || lost.contains("libanlib.so+0x"),
        "{lost}"
    );

    // Symbol tables and unwind sections: the same stacks (without inline
    // frames, which need DWARF).
    assert_eq!(folded_text(&packed, &["--no-inline"]), before_no_inline);
    // With DWARF embedded: inline frames too, and file:line in speedscope.
    assert_eq!(folded_text(&packed_debug, &[]), before);
    let p = packed_debug.to_str().unwrap();
    let json = String::from_utf8(ok(&[p, "--format", "speedscope", "-o", "-"]).stdout).unwrap();
    assert!(
        json.contains(r#""name":"mix_step","file":""#) && json.contains("an_inline.c"),
        "{json}"
    );
    let i = info(&packed_debug, &[]);
    assert!(i.contains("embedded in trace"), "{i}");
}

#[test]
fn recorder_embedded_debug_data_suffices() {
    require_perf!();
    let dir = scratch_dir("an-embed-debug");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = build_inline_fixture(&app, NO_FP);
    let trace = record(&dir, "ed", &["--embed", "debug"], &exe, &["800"]);
    let before = folded_text(&trace, &[]);
    assert!(before.contains("hot_outer;mix_step"), "{before}");
    std::fs::remove_dir_all(&app).unwrap();
    assert_eq!(folded_text(&trace, &[]), before);
    let p = trace.to_str().unwrap();
    let json = String::from_utf8(ok(&[p, "--format", "speedscope", "-o", "-"]).stdout).unwrap();
    assert!(json.contains("an_inline.c"), "no file names: {json}");
    // Packed now, the program cannot be read: pack says so, and that what
    // the recorder embedded stays, which the packed trace shows.
    let packed = dir.join("packed.lpt");
    let out = ok(&["pack", p, "-o", packed.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("warning: not embedded: ") && l.contains("an_inline"))
        .unwrap_or_else(|| panic!("no warning about the program: {stderr}"));
    assert!(
        warning.ends_with("; what the recorder embedded of it stays in the trace"),
        "{warning}"
    );
    assert_eq!(folded_text(&packed, &[]), before);
}

#[test]
fn offline_uses_only_embedded_data() {
    require_perf!();
    let dir = scratch_dir("an-offline");
    let (_, packed, packed_debug, before, _) = packed_post_mortem(&dir);
    // libc, ld.so and the vDSO are still here, but --offline must not read
    // them: everything comes from the trace, with the same result.
    assert_eq!(folded_text(&packed_debug, &["--offline"]), before);
    let i = info(&packed_debug, &["--offline"]);
    assert!(
        !i.contains("\"unwind_data\": \"/"),
        "a local file was used: {i}"
    );
    // Without DWARF in the trace, offline libc names come from its symbol
    // tables: still every frame known.
    let out = ok(&[
        packed.to_str().unwrap(),
        "--offline",
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("0.0% unknown frames"), "{stderr}");
}

#[test]
fn local_file_with_another_build_id_is_not_used() {
    require_perf!();
    let dir = scratch_dir("an-mismatch");
    let (_, _, packed_debug, before, _) = packed_post_mortem(&dir);
    // Same path, different program: another build id.
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    build_inline_fixture(&app, &["-O1", "-g"]);
    let out = ok(&[
        packed_debug.to_str().unwrap(),
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), before);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not using") && stderr.contains("differs from the recorded"),
        "{stderr}"
    );
    let i = info(&packed_debug, &[]);
    assert!(i.contains("differs from the recorded"), "{i}");
}

#[test]
fn stripped_trace_has_no_stack_bytes_and_the_same_stacks() {
    require_perf!();
    let dir = scratch_dir("an-strip");
    let (_, _, packed_debug, before, _) = packed_post_mortem(&dir);
    let stripped = dir.join("stripped.lpt");
    ok(&[
        "strip",
        packed_debug.to_str().unwrap(),
        "-o",
        stripped.to_str().unwrap(),
    ]);
    let reader = TraceReader::open(&stripped).unwrap();
    let mut samples = 0;
    for r in reader.records() {
        if let lrnprof_format::Record::Sample(s) = r.unwrap() {
            samples += 1;
            assert!(
                s.stack.bytes.is_empty(),
                "stack bytes left in a stripped sample"
            );
            assert!(s.kernel_callchain.is_empty());
            assert!(!s.frames.is_empty());
        }
    }
    assert!(samples > 0);
    assert_eq!(folded_text(&stripped, &["--offline"]), before);
}

#[test]
fn symbols_dir_with_build_id_layout_names_a_stripped_binary() {
    require_perf!();
    let dir = scratch_dir("an-symbols");
    let exe = build_inline_fixture(&dir, NO_FP);
    // Keep the DWARF in DIR/.build-id/xx/rest.debug, strip the binary.
    let syms = dir.join("syms");
    let debug = dir.join("an_inline.debug");
    let run = |args: &[&str]| {
        let out = Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect("running binutils");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    run(&[
        "objcopy",
        "--only-keep-debug",
        exe.to_str().unwrap(),
        debug.to_str().unwrap(),
    ]);
    run(&["strip", "--strip-debug", exe.to_str().unwrap()]);
    let notes = run(&["readelf", "-n", exe.to_str().unwrap()]);
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the fixture has a build id")
        .trim()
        .to_string();
    let sub = syms.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::rename(&debug, sub.join(format!("{}.debug", &id[2..]))).unwrap();

    let trace = record(&dir, "sy", EMBED_NONE, &exe, &["600"]);
    let without = folded_text(&trace, &[]);
    assert!(!without.contains("mix_step"), "{without}");
    let with = folded_text(&trace, &["--symbols", syms.to_str().unwrap()]);
    assert!(with.contains("hot_outer;mix_step"), "{with}");
    let i = info(&trace, &["--symbols", syms.to_str().unwrap()]);
    assert!(i.contains(".build-id"), "{i}");
    // A symbols directory that does not exist is a clear error.
    let bad = analyze(&[
        trace.to_str().unwrap(),
        "--symbols",
        "/no/such/dir",
        "-o",
        "-",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("symbols directory"));
}

/// The separate debug file of this machine's dynamic loader (Debian:
/// libc6-dbg), if any: only its full symbol table names the loader's entry
/// code.
fn loader_debug_file() -> Option<PathBuf> {
    use object::Object;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let loader = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/ld-linux"))?;
    let bytes = std::fs::read(loader).ok()?;
    let id = object::File::parse(&*bytes).ok()?.build_id().ok()??;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let file = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    file.exists().then_some(file)
}

/// Code that no function symbol covers, sampled on purpose (an_stubs.c):
/// an untyped assembly label and PLT stubs in the program, and the dynamic
/// loader's entry code running a library constructor. A sample taken while
/// the loader starts a process ends in such code (`_start`, a label); it
/// used to stay unnamed locally and offline, and made
/// `offline_uses_only_embedded_data` fail whenever a loaded machine let one
/// be taken.
#[test]
fn code_without_function_symbols_is_named_locally_and_offline() {
    require_perf!();
    let dir = scratch_dir("an-stubs");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = build_with_library(
        &app,
        &["-O2", "-g"],
        ("an_stubs.c", "an_stubs"),
        ("an_stubs_lib.c", "libanstubs.so"),
    );
    let embedded = record(&dir, "emb", &[], &exe, &[]);
    let bare = record(&dir, "bare", EMBED_NONE, &exe, &[]);
    let packed = dir.join("packed.lpt");
    ok(&[
        "pack",
        bare.to_str().unwrap(),
        "-o",
        packed.to_str().unwrap(),
    ]);
    let local = folded(&embedded, &[]);
    std::fs::remove_dir_all(&app).unwrap();
    let offline = folded(&embedded, &["--offline"]);
    let packed_offline = folded(&packed, &["--offline"]);

    let pairs = [
        ("main", "spin_untyped"),
        ("call_tiny", "tiny_call@plt"),
        ("call_tiny", "tiny_call"),
    ];
    for (a, b) in pairs {
        // The same trace, unwound from the same bytes: the same counts.
        let n = calls(&local, "", a, b);
        assert!(n >= 10, "{a};{b}: {n} samples: {local:?}");
        assert_eq!(calls(&offline, "", a, b), n, "{a};{b}: {offline:?}");
        assert!(
            calls(&packed_offline, "", a, b) >= 10,
            "{a};{b}: {packed_offline:?}"
        );
    }
    for f in [&local, &offline, &packed_offline] {
        let unnamed: Vec<_> = f
            .keys()
            .flatten()
            .filter(|n| n.starts_with("an_stubs+") || n.starts_with("libanstubs.so+"))
            .collect();
        assert!(unnamed.is_empty(), "unnamed program frames: {unnamed:?}");
    }

    // The loader's entry labels live in its full symbol table: in its debug
    // file, which pack embeds and local analysis reads.
    if loader_debug_file().is_none() {
        skip!("the dynamic loader has no debug file to name its entry code (Debian: libc6-dbg)");
    }
    for f in [&local, &packed_offline] {
        let in_constructor: Vec<_> = f
            .iter()
            .filter(|(s, _)| s.last().is_some_and(|n| n == "in_constructor"))
            .collect();
        let n: u64 = in_constructor.iter().map(|(_, c)| **c).sum();
        assert!(n >= 10, "{n} samples in the constructor: {f:?}");
        for (stack, _) in in_constructor {
            assert_eq!(stack[1], "_dl_start_user", "{stack:?}");
            assert!(!stack.iter().any(|n| n.contains("+0x")), "{stack:?}");
        }
    }
    remove_scratch_dir(&dir);
}

/// The three outputs of `trace` with `extra` flags: folded text, pprof
/// bytes (gzip with mtime 0: deterministic), speedscope JSON.
fn all_outputs(trace: &Path, extra: &[&str]) -> [Vec<u8>; 3] {
    ["folded", "pprof", "speedscope"].map(|format| {
        let mut args = vec![trace.to_str().unwrap(), "--format", format, "-o", "-"];
        args.extend(extra);
        ok(&args).stdout
    })
}

/// Bytes of the frame tables and of everything else embedded in `trace`.
fn embedded_bytes(trace: &Path) -> (u64, u64) {
    let reader = TraceReader::open(trace).unwrap();
    let (mut tables, mut rest) = (0, 0);
    for r in reader.records() {
        if let lrnprof_format::Record::Blob(b) = r.unwrap() {
            match b.kind {
                lrnprof_format::BlobKind::Table { .. } => tables += b.data.len() as u64,
                _ => rest += b.data.len() as u64,
            }
        }
    }
    (tables, rest)
}

/// Whether this machine has libc's separate debug file (Debian:
/// libc6-dbg), which alone names libc's local functions (`start_thread`,
/// `__restore_rt`, `__start_context`).
pub(super) fn libc_has_debug_file() -> bool {
    use object::Object;
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let Some(libc) = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
    else {
        return false;
    };
    let Ok(bytes) = std::fs::read(libc) else {
        return false;
    };
    let Some(id) = object::File::parse(&*bytes)
        .ok()
        .and_then(|f| f.build_id().ok().flatten())
    else {
        return false;
    };
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Path::new(&format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ))
    .exists()
}

/// Record `exe` (living in `app`) with the recorder's defaults, analyze
/// it, delete `app`, analyze it `--offline`: the folded text, the pprof
/// profile (functions, inline frames, file:line, mappings) and the
/// speedscope profile are byte for byte the same. Returns the folded text.
fn same_profile_without_the_files(dir: &Path, app: &Path, exe: &Path) -> String {
    let trace = record(dir, "t", &[], exe, &["1500"]);
    let before = all_outputs(&trace, &[]);
    std::fs::remove_dir_all(app).unwrap();
    let after = all_outputs(&trace, &["--offline"]);
    let folded = String::from_utf8(before[0].clone()).unwrap();
    assert_eq!(String::from_utf8(after[0].clone()).unwrap(), folded);
    assert!(after[1] == before[1], "pprof output differs offline");
    assert!(after[2] == before[2], "speedscope output differs offline");
    let json = String::from_utf8(after[2].clone()).unwrap();
    assert!(json.contains("\"line\":"), "no file:line: {json}");
    // What it costs: the frame tables add less than the rest of what is
    // embedded, so the default stays within twice what it was without them.
    let (tables, rest) = embedded_bytes(&trace);
    assert!(
        tables > 0 && tables <= rest,
        "{tables} bytes of tables, {rest} of the rest"
    );
    if libc_has_debug_file() {
        assert!(folded.contains(";start_thread;"), "{folded}");
    } else {
        lrnprof_tests::cannot_check(
            "libc has no debug file here to name start_thread (Debian: libc6-dbg)",
        );
    }
    folded
}

#[test]
fn default_trace_gives_the_same_c_profile_without_the_files() {
    require_perf!();
    let dir = scratch_dir("an-same-c");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = build_c(&["an_threads_inline.c"], NO_FP, &app, "an_threads_inline");
    let folded = same_profile_without_the_files(&dir, &app, &exe);
    // Static helpers inlined into their callers, named from DWARF only.
    assert!(
        folded.contains(";worker_main;crunch;mix_round "),
        "{folded}"
    );
    assert!(folded.contains(";main;checksum "), "{folded}");
    remove_scratch_dir(&dir);
}

#[test]
fn default_trace_gives_the_same_rust_profile_without_the_files() {
    require_perf!();
    let dir = scratch_dir("an-same-rs");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = lrnprof_tests::build_rust(
        "an_threads_inline.rs",
        &["--edition", "2021", "-O", "-g"],
        &app,
        "an_threads_inline_rs",
    );
    let folded = same_profile_without_the_files(&dir, &app, &exe);
    // Inlined functions, closures and the standard library's generic
    // code, named from DWARF only.
    assert!(
        folded.contains("an_threads_inline::crunch::{{closure}};an_threads_inline::mix_round;"),
        "{folded}"
    );
    assert!(
        folded.contains(";an_threads_inline::main;an_threads_inline::checksum;"),
        "{folded}"
    );
    remove_scratch_dir(&dir);
}

/// Built with line tables only, a Rust program's DWARF names functions
/// without their paths (`crunch`, `{closure#0}`): a function that was not
/// inlined takes its symbol's name (`an_threads_inline::crunch`), here
/// and without the files alike; inlined ones keep DWARF's.
#[test]
fn line_tables_only_name_functions_by_their_symbols() {
    require_perf!();
    let dir = scratch_dir("an-line-tables");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = lrnprof_tests::build_rust(
        "an_threads_inline.rs",
        &[
            "--edition",
            "2021",
            "-O",
            "-C",
            "debuginfo=line-tables-only",
        ],
        &app,
        "an_threads_inline_rs",
    );
    let folded = same_profile_without_the_files(&dir, &app, &exe);
    assert!(
        folded.contains(";an_threads_inline::crunch;fold<core::ops::range::Range<u64>,"),
        "{folded}"
    );
    assert!(
        folded.contains(";an_threads_inline::main;checksum;"),
        "{folded}"
    );
    remove_scratch_dir(&dir);
}

/// A program whose DWARF lives in a separate debug file that only its
/// `.gnu_debuglink` names (`.debug/NAME` next to it, as `objcopy
/// --only-keep-debug` and `--add-gnu-debuglink` leave it): recorded with
/// defaults, the frame table is built from that file, so with the program
/// and its debug file deleted, `--offline` still gives the inline frames
/// and file:line of the analysis that read them.
#[test]
fn debug_file_named_by_gnu_debuglink_travels_in_the_frame_table() {
    require_perf!();
    let dir = scratch_dir("an-debuglink");
    let app = dir.join("app");
    std::fs::create_dir_all(app.join(".debug")).unwrap();
    let exe = build_c(&["an_threads_inline.c"], NO_FP, &app, "an_threads_inline");
    let debug = app.join(".debug").join("an_threads_inline.debug");
    let (exe_s, debug_s) = (exe.to_str().unwrap(), debug.to_str().unwrap());
    for args in [
        &["objcopy", "--only-keep-debug", exe_s, debug_s][..],
        &["strip", "--strip-debug", "--strip-unneeded", exe_s],
        &["objcopy", &format!("--add-gnu-debuglink={debug_s}"), exe_s],
    ] {
        let out = Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect("running binutils");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let folded = same_profile_without_the_files(&dir, &app, &exe);
    // Only the debug file has the inlined static helpers and the static
    // functions' names.
    assert!(
        folded.contains(";worker_main;crunch;mix_round "),
        "{folded}"
    );
    remove_scratch_dir(&dir);
}

/// A stripped program's functions, which no symbol names once `.symtab`
/// is gone, are each one frame named by where their unwind entry starts,
/// not one per address sampled, and alike from the trace alone.
#[test]
fn functions_no_symbol_names_are_one_frame_each() {
    use object::{Object, ObjectSymbol};
    require_perf!();
    let dir = scratch_dir("an-unnamed");
    let exe = build_c(&["an_cold.c"], &["-O2"], &dir, "an_cold");
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let starts: Vec<u64> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| s.address())
        .collect();
    let work = file
        .symbols()
        .find(|s| s.name() == Ok("work.cold"))
        .map(|s| s.address())
        .expect("gcc made no work.cold of tests/fixtures/an_cold.c");
    drop(file);
    let stripped = strip_all(&exe, &dir.join("an_cold_stripped"));
    let trace = record(&dir, "unnamed", &[], &stripped, &["400"]);
    let f = folded(&trace, &[]);
    assert_eq!(folded(&trace, &["--offline"]), f);
    let unnamed = |frame: &str| {
        frame
            .strip_prefix("an_cold_stripped+0x")
            .map(|a| u64::from_str_radix(a, 16).unwrap())
    };
    for frame in f.keys().flatten() {
        if let Some(a) = unnamed(frame) {
            assert!(starts.contains(&a), "{frame} is no function's start: {f:?}");
        }
    }
    // The loop, in `work.cold` (a function of its own, at `work`'s frame),
    // is the leaf of most samples, as one frame.
    let work_name = format!("an_cold_stripped+{work:#x}");
    let under_work: u64 = f
        .iter()
        .filter(|(s, _)| s.last() == Some(&work_name))
        .map(|(_, c)| c)
        .sum();
    assert!(
        under_work as f64 >= 0.9 * total(&f) as f64,
        "{work_name}: {f:?}"
    );
    remove_scratch_dir(&dir);
}

/// A program linked without a build id note is identified by its content:
/// its data travels in the trace as any image's, so the trace alone names
/// and unwinds it as its file does, and a different file at its path is
/// refused, not used to name the trace's addresses.
#[test]
fn a_program_without_a_build_id_is_identified_by_its_content() {
    require_perf!();
    let dir = scratch_dir("an-no-build-id");
    let flags = ["-O2", "-g", "-Wl,--build-id=none"];
    let exe = build_c(&["an_cold.c"], &flags, &dir, "an_cold");
    let id = lrnprof_image::build_id_of_file(&exe).expect("an id");
    assert!(id.is_content_id(), "{id}");
    let trace = record(&dir, "noid", &[], &exe, &["400"]);
    let here = folded(&trace, &[]);
    let in_work: u64 = here
        .iter()
        .filter(|(s, _)| s.ends_with(&["main".to_string(), "work".to_string()]))
        .map(|(_, c)| c)
        .sum();
    assert!(in_work as f64 >= 0.9 * total(&here) as f64, "{here:?}");
    assert_eq!(folded(&trace, &["--offline"]), here);
    // pprof would take it for a build id that a local binary must have.
    let pprof = dir.join("noid.pb.gz");
    ok(&[trace.to_str().unwrap(), "-o", pprof.to_str().unwrap()]);
    let raw = Command::new("gzip")
        .arg("-dc")
        .arg(&pprof)
        .output()
        .expect("gzip");
    let raw = String::from_utf8_lossy(&raw.stdout);
    assert!(raw.contains("an_cold") && !raw.contains(&id.to_hex()));
    // Another program in its place.
    build_c(&["an_signal.c"], &flags, &dir, "an_cold");
    assert_eq!(folded(&trace, &[]), here);
    let i = info(&trace, &[]);
    assert!(
        i.contains(&format!("differs from the recorded {id}")),
        "{i}"
    );
    assert!(i.contains(&format!("\"build_id\": \"{id}\"")), "{i}");
    remove_scratch_dir(&dir);
}

/// A stripped program without a build id note finds its DWARF in the debug
/// file its `.gnu_debuglink` names, checked by the link's CRC-32, by the
/// recorder for the frame table and by the analyzer: a debug file of
/// another build at that name is not used.
#[test]
fn the_debug_file_of_a_program_without_a_build_id_is_checked_by_its_crc() {
    require_perf!();
    let dir = scratch_dir("an-no-build-id-link");
    let flags = ["-O2", "-g", "-Wl,--build-id=none"];
    let exe = build_c(&["an_cold.c"], &flags, &dir, "an_cold");
    let objcopy = |args: &[&str]| {
        let out = Command::new("objcopy")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("binutils' objcopy");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    objcopy(&["--only-keep-debug", "an_cold", "an_cold.debug"]);
    objcopy(&[
        "--strip-debug",
        "--add-gnu-debuglink=an_cold.debug",
        "an_cold",
    ]);
    // The loop's frame: `work` by DWARF, `work.cold` by the symbol table.
    let leaf = |f: &BTreeMap<Vec<String>, u64>| {
        let mut leaves: Vec<&String> = f.keys().filter_map(|s| s.last()).collect();
        leaves.sort();
        leaves.dedup();
        if leaves.contains(&&"work".to_string()) {
            "work"
        } else if leaves.contains(&&"work.cold".to_string()) {
            "work.cold"
        } else {
            panic!("no loop frame: {f:?}")
        }
    };
    let trace = record(&dir, "link", &[], &exe, &["300"]);
    assert_eq!(leaf(&folded(&trace, &["--offline"])), "work");
    let bare = record(&dir, "link-bare", EMBED_NONE, &exe, &["300"]);
    assert_eq!(leaf(&folded(&bare, &[])), "work");
    // A debug file of another build under the linked name.
    let other = build_c(
        &["an_cold.c"],
        &["-O1", "-g", "-Wl,--build-id=none"],
        &dir,
        "other",
    );
    let out = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&other)
        .arg(dir.join("an_cold.debug"))
        .output()
        .expect("binutils' objcopy");
    assert!(out.status.success());
    assert_eq!(leaf(&folded(&bare, &[])), "work.cold");
    let stale = record(&dir, "link-stale", &[], &exe, &["300"]);
    assert_eq!(leaf(&folded(&stale, &["--offline"])), "work.cold");
    remove_scratch_dir(&dir);
}
