//! Split DWARF (`-gsplit-dwarf`): the binary keeps skeleton units; the
//! functions and inline frames of each unit are in a `.dwo` file beside its
//! object, or in a `.dwp` package (`tests/fixtures/an_split.c`,
//! `an_split_work.c`).

use super::*;

/// Samples whose stack ends `main`, `split_outer`, `split_inner` (the
/// inlined frame), and those that end in `split_outer` without it.
fn inlined_and_not(f: &BTreeMap<Vec<String>, u64>) -> (u64, u64) {
    (
        ending_with(f, &["main", "split_outer", "split_inner"]),
        ending_with(f, &["main", "split_outer"]),
    )
}

/// Compile the fixture's two units with `-gsplit-dwarf` and DWARF
/// `version` into `dir` (each object's `.dwo` beside it) and link them.
fn build_split(dir: &Path, version: u32) -> PathBuf {
    let dwarf = format!("-gdwarf-{version}");
    let flags = ["-c", "-O2", "-g", &dwarf, "-gsplit-dwarf"];
    let objects: Vec<String> = ["an_split", "an_split_work"]
        .iter()
        .map(|unit| {
            let object = build_c(&[&format!("{unit}.c")], &flags, dir, &format!("{unit}.o"));
            let dwo = dir.join(format!("{unit}.dwo"));
            assert!(dwo.is_file(), "the compiler wrote no {}", dwo.display());
            object.to_str().unwrap().to_string()
        })
        .collect();
    let objects: Vec<&str> = objects.iter().map(String::as_str).collect();
    build_c(&objects, &[], dir, "an_split")
}

/// Record `exe` with a frame cache of its own (`cache`, under `dir`), so
/// that names resolved by another recording are not reused.
fn record_fresh(
    dir: &Path,
    name: &str,
    cache: &str,
    extra: &[&str],
    exe: &Path,
) -> (PathBuf, String) {
    let trace = dir.join(format!("{name}.lpt"));
    let out = lrnprof_rec_command()
        .env("LRNPROF_CACHE_DIR", dir.join(cache))
        .arg("--out")
        .arg(&trace)
        .args(extra)
        .arg("--")
        .arg(exe)
        .arg("400")
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-rec");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "lrnprof-rec failed: {stderr}");
    (trace, stderr)
}

#[test]
fn split_dwarf_units_get_their_inline_frames_from_dwo_files_and_packages() {
    require_perf!();
    let dir = scratch_dir("an-split");
    for version in [4, 5] {
        let sub = dir.join(format!("dwarf{version}"));
        std::fs::create_dir_all(&sub).unwrap();
        let exe = build_split(&sub, version);
        // The frame table (built by lrnprof-rec from the `.dwo` files), here
        // and offline.
        let (trace, stderr) = record_fresh(&sub, "split", "cache", &[], &exe);
        assert!(!stderr.contains("split DWARF"), "{stderr}");
        let f = folded(&trace, &[]);
        assert!(
            names_inlined(&f, "split_outer", "split_inner"),
            "DWARF {version}: {f:?}"
        );
        assert_eq!(folded(&trace, &["--offline"]), f);
        // No frame table: the analyzer reads the DWARF and the `.dwo` files.
        let (trace, _) = record_fresh(&sub, "unwind", "cache", &["--embed", "unwind"], &exe);
        let f = folded(&trace, &[]);
        assert!(
            names_inlined(&f, "split_outer", "split_inner"),
            "DWARF {version}, --embed unwind: {f:?}"
        );
    }

    // A package beside the binary, the `.dwo` files gone. (Of Debian 12's
    // packagers, binutils' `dwp` and LLVM 14's `llvm-dwp` both package
    // DWARF 4 units but neither gcc's DWARF 5 ones: the first crashes, the
    // second does not return.)
    let sub = dir.join("dwarf4");
    let exe = sub.join("an_split");
    let dwp = ["dwp", "llvm-dwp", "llvm-dwp-14"]
        .into_iter()
        .find(|t| Command::new(t).arg("--version").output().is_ok());
    let Some(dwp) = dwp else {
        skip!("neither dwp nor llvm-dwp is installed (Debian: binutils, llvm)");
    };
    let package = sub.join("an_split.dwp");
    let made = Command::new(dwp)
        .arg("-e")
        .arg(&exe)
        .arg("-o")
        .arg(&package)
        .output()
        .expect("running the DWARF packager");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let away = sub.join("away");
    std::fs::create_dir_all(&away).unwrap();
    for unit in ["an_split", "an_split_work"] {
        let dwo = format!("{unit}.dwo");
        std::fs::rename(sub.join(&dwo), away.join(&dwo)).unwrap();
    }
    let (trace, stderr) = record_fresh(&sub, "packaged", "cache-packaged", &[], &exe);
    assert!(!stderr.contains("split DWARF"), "{stderr}");
    let f = folded(&trace, &[]);
    assert!(
        names_inlined(&f, "split_outer", "split_inner"),
        "from the package: {f:?}"
    );
    // The analyzer reads the package too (the earlier trace without a
    // frame table).
    let unwind = sub.join("unwind.lpt");
    let f = folded(&unwind, &[]);
    assert!(
        names_inlined(&f, "split_outer", "split_inner"),
        "analyzer, from the package: {f:?}"
    );

    // Neither: the recording says what is missing and where it looked;
    // the functions are still named, without the inline frame.
    std::fs::remove_file(&package).unwrap();
    let (trace, stderr) = record_fresh(&sub, "missing", "cache-missing", &[], &exe);
    assert!(
        stderr.contains("split DWARF")
            && stderr.contains("of 2 of its compilation units was not found")
            && stderr.contains(&format!("{}", sub.display())),
        "{stderr}"
    );
    let f = folded(&trace, &[]);
    let (inlined, outer) = inlined_and_not(&f);
    assert!(inlined == 0 && outer >= 100, "without split DWARF: {f:?}");
    // `--symbols DIR` finds `.dwo` files moved there.
    let f = folded(&unwind, &["--symbols", away.to_str().unwrap()]);
    assert!(
        names_inlined(&f, "split_outer", "split_inner"),
        "--symbols with the .dwo files: {f:?}"
    );
    remove_scratch_dir(&dir);
}
