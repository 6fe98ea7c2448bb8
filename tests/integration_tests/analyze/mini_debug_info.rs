//! MiniDebugInfo: a stripped binary whose local functions are named by the
//! xz-compressed ELF file in its `.gnu_debugdata` section, as Fedora and
//! RHEL ship binaries (`tests/fixtures/an_minidebug.c`).

use super::*;
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// Build the fixture into `dir` and give it MiniDebugInfo the way
/// distributions make it: the symbols of the functions `.dynsym` lacks,
/// kept in a copy of its debug-only file, xz-compressed into
/// `.gnu_debugdata` of the stripped binary.
fn build_with_mini_debug_info(dir: &Path) -> PathBuf {
    let exe = build_c(
        &["an_minidebug.c"],
        &["-O2", "-fomit-frame-pointer"],
        dir,
        "an_minidebug",
    );
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let dynamic: Vec<&str> = file
        .dynamic_symbols()
        .filter_map(|s| s.name().ok())
        .collect();
    let keep: Vec<&str> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
        .filter_map(|s| s.name().ok())
        .filter(|n| !dynamic.contains(n))
        .collect();
    assert!(keep.iter().any(|n| n.starts_with("mini_leaf")), "{keep:?}");
    let keep_file = dir.join("keep");
    std::fs::write(&keep_file, keep.join("\n") + "\n").unwrap();
    let (full, mini) = (dir.join("mini.full"), dir.join("mini"));
    let os = |p: &Path| p.as_os_str().to_owned();
    let keep_arg = format!("--keep-symbols={}", keep_file.display());
    run_tool(
        "objcopy",
        [&os("--only-keep-debug".as_ref()), &os(&exe), &os(&full)],
    );
    run_tool(
        "objcopy",
        [
            "-S".as_ref(),
            "--remove-section".as_ref(),
            ".comment".as_ref(),
            keep_arg.as_ref(),
            full.as_os_str(),
            mini.as_os_str(),
        ],
    );
    run_tool(
        "strip",
        [
            "--strip-all".as_ref(),
            "-R".as_ref(),
            ".comment".as_ref(),
            exe.as_os_str(),
        ],
    );
    let mut xz = Vec::new();
    lzma_rs::xz_compress(&mut &std::fs::read(&mini).unwrap()[..], &mut xz).unwrap();
    let compressed = dir.join("mini.xz");
    std::fs::write(&compressed, xz).unwrap();
    let add = format!(".gnu_debugdata={}", compressed.display());
    run_tool(
        "objcopy",
        ["--add-section".as_ref(), add.as_ref(), exe.as_os_str()],
    );
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    assert!(file.section_by_name(".symtab").is_none(), "not stripped");
    assert!(file
        .section_by_name(".gnu_debugdata")
        .is_some_and(|s| s.size() > 0));
    exe
}

/// Samples whose stack ends `main`, `mini_mid`, `mini_leaf` (gcc may add
/// a suffix such as `.constprop.0`), and all samples.
fn named_and_all(f: &BTreeMap<Vec<String>, u64>) -> (u64, u64) {
    let named = f
        .iter()
        .filter(|(s, _)| {
            s.len() >= 3 && {
                let tail = &s[s.len() - 3..];
                tail[0] == "main"
                    && tail[1].starts_with("mini_mid")
                    && tail[2].starts_with("mini_leaf")
            }
        })
        .map(|(_, c)| c)
        .sum();
    (named, f.values().sum())
}

#[test]
fn local_functions_of_a_stripped_binary_are_named_by_its_mini_debug_info() {
    require_perf!();
    let dir = scratch_dir("an-minidebug");
    let exe = build_with_mini_debug_info(&dir);
    // The frame table lrnprof-rec builds, here and offline.
    let trace = record(&dir, "mini", &[], &exe, &["400"]);
    let f = folded(&trace, &[]);
    let (named, all) = named_and_all(&f);
    assert!(
        named >= 100 && named as f64 >= 0.9 * all as f64,
        "{named} of {all}: {f:?}"
    );
    assert_eq!(folded(&trace, &["--offline"]), f);
    // No frame table: the symbols `pack` embeds, offline.
    let bare = record(&dir, "bare", &["--embed", "none"], &exe, &["400"]);
    let packed = dir.join("packed.lpt");
    ok(&[
        "pack",
        bare.to_str().unwrap(),
        "-o",
        packed.to_str().unwrap(),
    ]);
    let f = folded(&packed, &["--offline"]);
    let (named, all) = named_and_all(&f);
    assert!(
        named >= 100 && named as f64 >= 0.9 * all as f64,
        "packed: {named} of {all}: {f:?}"
    );
    remove_scratch_dir(&dir);
}
