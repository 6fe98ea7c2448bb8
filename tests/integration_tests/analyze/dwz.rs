//! DWARF that `dwz -m` rewrote to refer to a supplementary file
//! (`.gnu_debugaltlink`, or DWARF 5's `.debug_sup`), as Debian's `-dbgsym`
//! and Fedora's `debuginfo` packages ship it (`tests/fixtures/an_dwz.c`).

use super::*;
use object::Object;

/// Samples whose stack ends `main`, `dwz_outer`, `dwz_inner` (the
/// inlined frame, whose abstract instance `dwz` moved to the supplementary
/// file), and those that end in `dwz_outer` without it.
fn inlined_and_not(f: &BTreeMap<Vec<String>, u64>) -> (u64, u64) {
    (
        ending_with(f, &["main", "dwz_outer", "dwz_inner"]),
        ending_with(f, &["main", "dwz_outer"]),
    )
}

/// Build the fixture twice into `dir` and give both builds to `dwz -m`
/// with `flags`; the builds, and the supplementary file it made.
fn dwz_pair(dir: &Path, flags: &[&str]) -> (Vec<PathBuf>, PathBuf) {
    let builds: Vec<PathBuf> = [1, 2]
        .iter()
        .map(|v| {
            let define = format!("-DVARIANT={v}");
            build_c(
                &["an_dwz.c"],
                &["-O2", "-g", &define],
                dir,
                &format!("an_dwz{v}"),
            )
        })
        .collect();
    let common = dir.join("common.debug");
    let files = [
        "-m".as_ref(),
        common.as_os_str(),
        "-M".as_ref(),
        common.as_os_str(),
    ];
    let args = flags.iter().map(|f| f.as_ref()).chain(files);
    run_tool("dwz", args.chain(builds.iter().map(|b| b.as_os_str())));
    (builds, common)
}

#[test]
fn dwarf_in_a_dwz_supplementary_file_names_inline_frames() {
    require_perf!();
    if Command::new("dwz").arg("--version").output().is_err() {
        skip!("`dwz` is not installed (Debian: apt-get install dwz)");
    }
    let dir = scratch_dir("an-dwz");
    let (builds, common) = dwz_pair(&dir, &[]);
    let exe = &builds[0];
    {
        let bytes = std::fs::read(exe).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        assert!(
            file.gnu_debugaltlink().unwrap().is_some(),
            "dwz wrote no .gnu_debugaltlink"
        );
    }
    // The frame table lrnprof-rec builds, here and offline.
    let trace = record(&dir, "dwz", &[], exe, &["400"]);
    let f = folded(&trace, &[]);
    assert!(names_inlined(&f, "dwz_outer", "dwz_inner"), "{f:?}");
    assert_eq!(folded(&trace, &["--offline"]), f);
    // No frame table: the analyzer reads the supplementary file itself.
    let bare = record(&dir, "unwind", &["--embed", "unwind"], exe, &["400"]);
    let f = folded(&bare, &[]);
    assert!(
        names_inlined(&f, "dwz_outer", "dwz_inner"),
        "--embed unwind: {f:?}"
    );

    // Without the file: named without the inline frame, and said.
    let syms = dir.join("syms");
    std::fs::create_dir_all(&syms).unwrap();
    std::fs::rename(&common, syms.join("common.debug")).unwrap();
    let f = folded(&bare, &[]);
    let (inlined, outer) = inlined_and_not(&f);
    assert!(inlined == 0 && outer >= 100, "without the file: {f:?}");
    let notes = info(&bare, &[]);
    assert!(
        notes.contains("supplementary debug file (dwz) that was not found"),
        "{notes}"
    );
    // A --symbols directory that holds it.
    let f = folded(&bare, &["--symbols", syms.to_str().unwrap()]);
    assert!(
        names_inlined(&f, "dwz_outer", "dwz_inner"),
        "--symbols: {f:?}"
    );
    let out = lrnprof_rec_command()
        .env("LRNPROF_CACHE_DIR", dir.join("cache-missing"))
        .arg("--out")
        .arg(dir.join("missing.lpt"))
        .arg("--")
        .arg(exe)
        .arg("100")
        .output()
        .expect("running lrnprof-rec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && stderr.contains("supplementary debug file (dwz) that was not found")
            && stderr.contains(common.to_str().unwrap()),
        "{stderr}"
    );
    // A build stripped of its DWARF keeps its `.gnu_debugaltlink`, as
    // Debian's coreutils and most of Fedora's binaries do: with no DWARF
    // to read, the file it names is not missed, and nothing is said.
    let stripped = dir.join("an_dwz1-stripped");
    run_tool(
        "objcopy",
        [
            "--strip-debug".as_ref(),
            exe.as_os_str(),
            stripped.as_os_str(),
        ],
    );
    {
        let bytes = std::fs::read(&stripped).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        assert!(
            file.gnu_debugaltlink().unwrap().is_some()
                && file.section_by_name(".debug_info").is_none(),
            "objcopy --strip-debug kept DWARF or dropped the link"
        );
    }
    // A copy of the same build (same build id) stripped of every symbol
    // is recorded first: its frame table, named from nothing, must not
    // stand for the copy that keeps its symbol table.
    let bare_all = dir.join("an_dwz1-strip-all");
    run_tool(
        "objcopy",
        [
            "--strip-all".as_ref(),
            exe.as_os_str(),
            bare_all.as_os_str(),
        ],
    );
    let all = record(&dir, "strip-all", &[], &bare_all, &["100"]);
    let f = folded(&all, &[]);
    assert_eq!(
        ending_with(&f, &["main", "dwz_outer"]),
        0,
        "--strip-all: {f:?}"
    );
    let (trace, out) = record_output(&dir, "stripped", &[], &stripped, &["400"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("supplementary debug file"),
        "{stderr}"
    );
    let f = folded(&trace, &[]);
    assert!(
        ending_with(&f, &["main", "dwz_outer"]) >= 100,
        "stripped: {f:?}"
    );

    // DWARF 5's own form (`dwz --dwarf-5`): `.debug_sup` in both files,
    // the supplementary one without a build id.
    let sub = dir.join("dwarf5");
    std::fs::create_dir_all(&sub).unwrap();
    let (builds, _) = dwz_pair(&sub, &["--dwarf-5"]);
    {
        let bytes = std::fs::read(&builds[0]).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        assert!(
            file.section_by_name(".debug_sup").is_some(),
            "dwz wrote no .debug_sup"
        );
    }
    let trace = record(&sub, "dwz5", &[], &builds[0], &["400"]);
    let f = folded(&trace, &[]);
    assert!(
        names_inlined(&f, "dwz_outer", "dwz_inner"),
        ".debug_sup: {f:?}"
    );
    let bare = record(
        &sub,
        "unwind5",
        &["--embed", "unwind"],
        &builds[0],
        &["400"],
    );
    let f = folded(&bare, &[]);
    assert!(
        names_inlined(&f, "dwz_outer", "dwz_inner"),
        ".debug_sup, --embed unwind: {f:?}"
    );
    remove_scratch_dir(&dir);
}
