//! Image data embedded in the trace (`--embed`): unwind and symbol
//! sections, offline analysis without the binaries, programs deleted while
//! recorded or living in another root, and JIT perf maps.

use super::support::{
    assert_complete, assert_exit_code, assert_success, build_id, build_threads, holds_open, images,
    launch, load, load_complete, os, rec, rec_command, root_pid, section_blobs,
};
use lrnprof_format::{ImageKind, Record};
use lrnprof_tests::{
    build_c, has_program, is_root, lrnprof_analyze, remove_scratch_dir, require_perf, scratch_dir,
    skip, wait_until,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[test]
fn embedding_carries_unwind_and_symbol_sections() {
    use object::{Object, ObjectSection};
    require_perf!();
    let dir = scratch_dir("rec-embed");
    let exe = build_threads(&dir);
    let id = build_id(&exe);
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();

    let out = dir.join("symbols.lpt");
    let result = launch(&out, &[], &exe, &["300"]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("embedded image data"), "{stderr}");
    let (_, records) = load_complete(&out);
    let blobs = section_blobs(&records, &id);
    for name in [".eh_frame", ".lrnprof.layout"] {
        assert!(blobs.iter().any(|b| b.0 == name), "{name} not embedded");
    }
    // The frame table names every address of the program in the trace:
    // its symbol tables stay home (but on AArch64, see docs/recorder.md).
    assert!(has_frame_table(&records, &id), "no frame table");
    let symbols = blobs.iter().any(|b| b.0 == ".symtab" || b.0 == ".strtab");
    assert_eq!(symbols, cfg!(target_arch = "aarch64"), "symbol tables");
    // The index of `.eh_frame` is rebuilt from it by the analyzer.
    assert!(
        !blobs.iter().any(|b| b.0 == ".eh_frame_hdr"),
        ".eh_frame_hdr embedded beside .eh_frame"
    );
    for (name, svma, bytes, compressed) in &blobs {
        if let Some(section) = file.section_by_name(name) {
            assert_eq!(*svma, section.address(), "{name}");
            if name == ".eh_frame" {
                // Cut to the FDEs the samples reach, entries where they were.
                assert_eq!(bytes.len(), section.data().unwrap().len());
                assert_ne!(&bytes[..], section.data().unwrap(), "{name} not cut");
            } else {
                assert_eq!(&bytes[..], section.data().unwrap(), "{name}");
            }
            assert!(!compressed);
        }
    }
    assert!(!blobs.iter().any(|b| b.0.starts_with(".debug_info")));
    // Each image once, however many processes and mappings it had.
    let eh_frames = blobs.iter().filter(|b| b.0 == ".eh_frame").count();
    assert_eq!(eh_frames, 1);

    let out = dir.join("debug.lpt");
    assert_exit_code(&launch(&out, &["--embed", "debug"], &exe, &["300"]), 7);
    let (_, records) = load(&out);
    let blobs = section_blobs(&records, &id);
    let debug_info = blobs
        .iter()
        .find(|b| b.0 == ".debug_info")
        .expect(".debug_info embedded at --embed debug");
    assert!(debug_info.3, "DWARF blobs are compressed");
    // The analyzer names frames with the DWARF and the symbol tables then.
    assert!(
        blobs.iter().any(|b| b.0 == ".symtab"),
        "no .symtab at debug"
    );
    // Whole sections at --embed debug.
    let eh_frame = blobs.iter().find(|b| b.0 == ".eh_frame").unwrap();
    let whole = file.section_by_name(".eh_frame").unwrap();
    assert_eq!(&eh_frame.2[..], whole.data().unwrap());

    let out = dir.join("none.lpt");
    assert_exit_code(&launch(&out, &["--embed", "none"], &exe, &["300"]), 7);
    let (_, records) = load(&out);
    assert!(!records.iter().any(|r| matches!(r, Record::Blob(_))));
    remove_scratch_dir(&dir);
}

/// `lrnprof-analyze --offline` (no local files) on `trace`: folded stacks.
fn analyze_offline(trace: &Path) -> String {
    let result = Command::new(lrnprof_analyze())
        .arg(trace)
        .args(["--offline", "--format", "folded", "--output", "-"])
        .output()
        .expect("running lrnprof-analyze");
    assert_success(&result);
    String::from_utf8(result.stdout).unwrap()
}

/// Samples per folded line containing `needle`.
fn folded_count(folded: &str, needle: &str) -> u64 {
    folded
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `lrnprof-analyze trace ARGS --output -`: its stdout.
fn analyze_out(trace: &Path, args: &[&str]) -> Vec<u8> {
    let result = Command::new(lrnprof_analyze())
        .arg(trace)
        .args(args)
        .args(["--output", "-"])
        .output()
        .expect("running lrnprof-analyze");
    assert_success(&result);
    result.stdout
}

/// A program without frame pointers unwinds through `.eh_frame` only: the
/// trace's `.eh_frame`, cut to the FDEs its samples reach, gives offline
/// the folded stacks and pprof profile the local files give.
#[test]
fn the_cut_eh_frame_unwinds_offline_as_the_files_do() {
    require_perf!();
    let dir = scratch_dir("rec-cut-eh-frame");
    let exe = build_threads(&dir);
    offline_is_local(&dir, &exe);
    remove_scratch_dir(&dir);
}

/// Without DWARF (no `-g`), the program's frame table is resolved from its
/// symbol tables, which then stay out of the trace: offline names are
/// still those of the local analysis.
#[test]
fn symbol_tables_give_way_to_a_complete_frame_table() {
    require_perf!();
    let dir = scratch_dir("rec-symbols-table");
    let exe = build_c(
        &["rec_threads.c"],
        &["-O2", "-fomit-frame-pointer", "-pthread"],
        &dir,
        "rec_threads",
    );
    let out = offline_is_local(&dir, &exe);
    let id = build_id(&exe);
    let (_, records) = load_complete(&out);
    let names: Vec<String> = section_blobs(&records, &id)
        .into_iter()
        .map(|b| b.0)
        .collect();
    assert!(names.iter().any(|n| n == ".eh_frame"), "{names:?}");
    let symbols = [".symtab", ".strtab", ".dynsym", ".dynstr", ".rela.plt"];
    if cfg!(target_arch = "aarch64") {
        assert!(names.iter().any(|n| n == ".symtab"), "{names:?}");
    } else {
        assert!(
            !names.iter().any(|n| symbols.contains(&n.as_str())),
            "{names:?}"
        );
    }
    assert!(has_frame_table(&records, &id), "no frame table");
    remove_scratch_dir(&dir);
}

/// Record rec_threads `exe` (exit code 7) into `dir/t.lpt`; its offline
/// folded stacks and pprof profile are those of the local analysis, and
/// the executable's `.eh_frame` was cut. Returns the trace.
fn offline_is_local(dir: &Path, exe: &Path) -> PathBuf {
    let out = dir.join("t.lpt");
    assert_exit_code(&launch(&out, &[], exe, &["800"]), 7);
    let folded = ["--format", "folded"];
    let local = String::from_utf8(analyze_out(&out, &folded)).unwrap();
    assert!(
        folded_count(&local, "parent_one;leaf_work") > 0
            && folded_count(&local, "parent_two;leaf_work") > 0,
        "{local}"
    );
    let offline =
        String::from_utf8(analyze_out(&out, &[&folded[..], &["--offline"]].concat())).unwrap();
    assert_eq!(offline, local);
    let pprof = ["--format", "pprof"];
    let offline = analyze_out(&out, &[&pprof[..], &["--offline"]].concat());
    assert!(
        offline == analyze_out(&out, &pprof),
        "pprof profiles differ"
    );
    // The executable's section was cut indeed.
    let id = build_id(exe);
    let (_, records) = load_complete(&out);
    let blobs = section_blobs(&records, &id);
    let eh_frame = blobs.iter().find(|b| b.0 == ".eh_frame").unwrap();
    let data = std::fs::read(exe).unwrap();
    let whole = {
        use object::{Object, ObjectSection};
        let file = object::File::parse(&*data).unwrap();
        file.section_by_name(".eh_frame")
            .unwrap()
            .data()
            .unwrap()
            .to_vec()
    };
    assert_eq!(eh_frame.2.len(), whole.len());
    // At least rec_threads' never_called is left out. (The others may
    // all be kept: in one run whose main thread was sampled once, in the
    // dynamic linker, none was left out before never_called existed.)
    assert_ne!(eh_frame.2, whole);
    out
}

#[test]
fn embedded_trace_is_analyzed_without_the_binaries() {
    require_perf!();
    let dir = scratch_dir("rec-selfcontained");
    let exe = build_threads(&dir);
    let out = dir.join("t.lpt");
    assert_exit_code(&launch(&out, &[], &exe, &["1500"]), 7);
    let bare = dir.join("bare.lpt");
    assert_exit_code(&launch(&bare, &["--embed", "none"], &exe, &["300"]), 7);
    // As on another machine: the fixture is gone.
    std::fs::remove_file(&exe).unwrap();
    let folded = analyze_offline(&out);
    let one = folded_count(&folded, "parent_one;leaf_work");
    let two = folded_count(&folded, "parent_two;leaf_work");
    assert!(one > 0 && two > 0, "{folded}");
    // leaf_work does twice the work under parent_two.
    let ratio = two as f64 / one as f64;
    assert!((1.2..3.5).contains(&ratio), "ratio {ratio}: {folded}");
    let bare = analyze_offline(&bare);
    assert!(
        !bare.contains("leaf_work"),
        "symbols without embedding: {bare}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn jit_regions_and_perf_maps_are_recorded() {
    require_perf!();
    let dir = scratch_dir("rec-jit");
    let exe = build_c(&["rec_jit.c"], &["-O2", "-g"], &dir, "rec_jit");
    let out = dir.join("t.lpt");
    let result = launch(&out, &[], &exe, &["300"]);
    let (reader, records) = load(&out);
    let pid = root_pid(&reader);
    let map_file = PathBuf::from(format!("/tmp/perf-{}.map", pid.0));
    let map_text = std::fs::read_to_string(&map_file);
    let _ = std::fs::remove_file(&map_file);
    assert_success(&result);
    assert_complete(&reader, &records);
    let map_text = map_text.expect("the fixture wrote its perf map");
    let jit_start = u64::from_str_radix(map_text.split(' ').next().unwrap(), 16).unwrap();
    assert!(
        images(&records).iter().any(|m| m.pid == pid
            && m.kind == ImageKind::Anonymous
            && (m.start..m.end).contains(&jit_start)),
        "the anonymous executable region"
    );
    let embedded = records
        .iter()
        .find_map(|r| match r {
            Record::Blob(b) if b.kind == lrnprof_format::BlobKind::JitMap { pid } => {
                Some(b.data.clone())
            }
            _ => None,
        })
        .expect("the perf map embedded");
    assert_eq!(String::from_utf8(embedded).unwrap(), map_text);
    remove_scratch_dir(&dir);
}

#[test]
fn images_inside_a_changed_root_are_found_through_proc() {
    require_perf!();
    // A chroot stands in for a container: the program's path inside its
    // root (/fx) does not exist on the host.
    if !is_root() || !has_program("chroot") {
        skip!("needs root and chroot");
    }
    let dir = scratch_dir("rec-chroot");
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    // Static, so the root needs no libraries.
    let exe = build_c(
        &["rec_threads.c"],
        &["-O2", "-g", "-static", "-pthread"],
        &root,
        "fx",
    );
    let id = build_id(&exe);
    let out = dir.join("t.lpt");
    let result = rec(&[
        os("--out"),
        out.as_os_str(),
        os("--"),
        os("chroot"),
        root.as_os_str(),
        os("/fx"),
        os("300"),
    ]);
    assert_exit_code(&result, 7);
    let (_, records) = load_complete(&out);
    let fx = images(&records)
        .into_iter()
        .find(|m| m.path == "/fx")
        .expect("the program mapped at its path inside the root");
    assert_eq!(fx.build_id.as_ref().unwrap().0, id);
    assert!(
        section_blobs(&records, &id)
            .iter()
            .any(|b| b.0 == ".eh_frame")
            && has_frame_table(&records, &id),
        "the program's data embedded from inside its root"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn a_program_deleted_while_recorded_is_still_embedded() {
    require_perf!();
    let dir = scratch_dir("rec-deleted");
    let exe = build_threads(&dir);
    let id = build_id(&exe);
    let out = dir.join("t.lpt");
    // The fixture waits for the go file before it works and exits.
    let go = dir.join("go");
    let recorder = rec_command(&out)
        .arg("--")
        .arg(&exe)
        .arg("300")
        .env("REC_GO_FILE", &go)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Deleted once the recorder has opened it (when it saw it mapped).
    wait_until("the recorder opening the program", || {
        holds_open(recorder.id(), &exe)
    });
    std::fs::remove_file(&exe).unwrap();
    std::fs::write(&go, "").unwrap();
    let result = recorder.wait_with_output().unwrap();
    assert_exit_code(&result, 7);
    let (_, records) = load_complete(&out);
    let blobs = section_blobs(&records, &id);
    assert!(blobs.iter().any(|b| b.0 == ".eh_frame"), "{blobs:?}");
    assert!(has_frame_table(&records, &id), "no frame table");
    remove_scratch_dir(&dir);
}

/// Whether `records` hold a frame table of the image with build id `id`.
fn has_frame_table(records: &[Record], id: &[u8]) -> bool {
    records.iter().any(|r| {
        matches!(r, Record::Blob(b) if b.build_id.0 == id
            && matches!(&b.kind, lrnprof_format::BlobKind::Table { name } if name == "frames"))
    })
}

/// The frame cache (`--cache-dir`, `LRNPROF_CACHE_DIR`): a recording keeps
/// the program's resolved frames there, the next one names them offline
/// as the local analysis does, `--no-cache` neither reads nor writes it,
/// and a cache that cannot be written costs the trace nothing.
#[test]
fn frame_tables_are_kept_in_the_cache_between_recordings() {
    require_perf!();
    let dir = scratch_dir("rec-frame-cache");
    let exe = build_threads(&dir);
    let hex: String = build_id(&exe).iter().map(|b| format!("{b:02x}")).collect();
    let cache = dir.join("cache");
    let record = |out: &Path, cache: &Path, extra: &[&str]| {
        let result = rec_command(out)
            .env("LRNPROF_CACHE_DIR", cache)
            .args(extra)
            .arg("--")
            .arg(&exe)
            .arg("300")
            .stdin(Stdio::null())
            .output()
            .expect("running lrnprof-rec");
        assert_exit_code(&result, 7);
        String::from_utf8_lossy(&result.stderr).into_owned()
    };
    // The entry of the program (its own DWARF), in the versioned directory.
    let entry = |cache: &Path| {
        std::fs::read_dir(cache).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join(format!("{hex}.own")))
                .find(|p| p.exists())
        })
    };
    record(&dir.join("none.lpt"), &cache, &["--no-cache"]);
    assert!(!cache.exists(), "--no-cache wrote {}", cache.display());
    record(&dir.join("first.lpt"), &cache, &[]);
    let kept = entry(&cache).expect("the program's frames kept");
    let first = std::fs::read(&kept).unwrap();
    let second = dir.join("second.lpt");
    let stderr = record(&second, &cache, &[]);
    assert!(!stderr.contains("frame cache was not"), "{stderr}");
    // The summary says how much the cache had kept: the program's frames
    // at least.
    let kept_count = stderr
        .split("code addresses for the trace, ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(kept_count.is_some_and(|n| n > 0), "{stderr}");
    let folded = ["--format", "folded"];
    let local = String::from_utf8(analyze_out(&second, &folded)).unwrap();
    assert!(folded_count(&local, "leaf_work") > 0, "{local}");
    let offline = analyze_out(&second, &[&folded[..], &["--offline"]].concat());
    assert_eq!(String::from_utf8(offline).unwrap(), local);
    // The entry now holds what the first recording kept and every frame
    // of the second's table, as the trace has them.
    let parse = |bytes: &[u8]| lrnprof_image::FrameTable::parse(bytes).expect("an entry parses");
    let (first, now) = (parse(&first), parse(&std::fs::read(&kept).unwrap()));
    let (_, records) = load_complete(&second);
    let table = records
        .iter()
        .find_map(|r| match r {
            Record::Blob(b)
                if b.build_id.0 == build_id(&exe)
                    && matches!(&b.kind, lrnprof_format::BlobKind::Table { name } if name == "frames") =>
            {
                // Small enough to be one part, and never compressed.
                assert_eq!((b.offset, b.total_len, b.compressed), (0, b.data.len() as u64, false));
                Some(parse(&b.data))
            }
            _ => None,
        })
        .expect("the second trace's frame table of the program");
    assert!(!table.is_empty());
    for (svma, lines) in first.entries().iter().chain(table.entries()) {
        assert_eq!(now.get(*svma), Some(&lines[..]), "address {svma:#x}");
    }
    // A file where the cache directory should be: one warning, a whole trace.
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let out = dir.join("blocked.lpt");
    let stderr = record(&out, &blocked, &[]);
    assert_eq!(
        stderr.matches("the frame cache was not updated").count(),
        1,
        "{stderr}"
    );
    load_complete(&out);
    remove_scratch_dir(&dir);
}
