//! Go binaries, as Go's own linker writes them: no `.eh_frame`, a
//! zlib-compressed `.debug_frame`, and Go's build ID note instead of a GNU
//! build id; stripped (`-ldflags=-s -w`), named by their `.gopclntab`
//! alone (`tests/fixtures/go_spin`).

use super::*;
use object::{Object, ObjectSection};

/// Build the `go_spin` fixture into `dir/name` with `flags` and a private
/// build cache, offline (it uses the standard library only).
fn build_go_spin(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let out = Command::new("go")
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(".")
        .current_dir(lrnprof_tests::workspace_root().join("tests/fixtures/go_spin"))
        .env("HOME", dir)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("running go build");
    assert!(
        out.status.success(),
        "go build of tests/fixtures/go_spin failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the Go fixture's spin is x86_64 assembly"
)]
fn go_binaries_unwind_through_their_compressed_debug_frame_after_they_are_gone() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        skip!("`go` is not installed (Debian: golang-go)");
    }
    let dir = scratch_dir("an-go");
    let exe = build_go_spin(&dir, "gospin", &[]);

    // What the test stands on: had Go's linker changed, say so rather than
    // pass without checking it.
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    assert!(
        file.section_by_name(".eh_frame").is_none(),
        "Go wrote .eh_frame"
    );
    let debug_frame = file.section_by_name(".debug_frame").expect(".debug_frame");
    let compressed = debug_frame.compressed_file_range().unwrap().format;
    assert_ne!(
        compressed,
        object::CompressionFormat::None,
        "plain .debug_frame"
    );
    assert_eq!(file.build_id().unwrap(), None, "Go wrote a GNU build id");
    drop(file);

    let trace = record(&dir, "go", &[], &exe, &["600"]);
    let before = folded(&trace, &[]);
    // With the frame pointer overwritten, only the CFI finds main.level2.
    assert_chain(&before, "main.spin");
    let i = info(&trace, &[]);
    let compact: String = i.split_whitespace().collect();
    assert!(
        !compact.contains(r#""build_id":null"#),
        "an image without an id: {i}"
    );

    // The Go build ID keys the data the recorder embedded: the same
    // profile once the binary is gone.
    std::fs::remove_file(&exe).unwrap();
    assert_eq!(folded(&trace, &[]), before);
    remove_scratch_dir(&dir);
}

/// At least 200 samples in `leaf`, and 95 % of them with the whole chain
/// from runtime.main.
fn assert_chain(f: &BTreeMap<Vec<String>, u64>, leaf: &str) {
    let in_leaf: u64 = f
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == leaf))
        .map(|(_, c)| c)
        .sum();
    let chain = [
        "runtime.main",
        "main.main",
        "main.level1",
        "main.level2",
        leaf,
    ];
    let whole: u64 = f
        .iter()
        .filter(|(s, _)| s.ends_with(&chain.map(String::from)))
        .map(|(_, c)| c)
        .sum();
    assert!(in_leaf >= 200, "{in_leaf} samples in {leaf}: {f:?}");
    assert!(
        whole as f64 >= 0.95 * in_leaf as f64,
        "{whole} of {in_leaf} samples in {leaf} reach runtime.main: {f:?}"
    );
}

#[test]
fn stripped_go_binaries_are_named_from_their_pclntab() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        skip!("`go` is not installed (Debian: golang-go)");
    }
    let dir = scratch_dir("an-go-stripped");
    let exe = build_go_spin(&dir, "gospin-s", &["-ldflags=-s -w"]);
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    for gone in [".symtab", ".debug_frame", ".debug_info"] {
        assert!(file.section_by_name(gone).is_none(), "-s -w left {gone}");
    }
    assert!(
        file.section_by_name(".gopclntab").is_some(),
        "no .gopclntab"
    );
    drop(file);

    // The Go loop, which frame pointers unwind: this binary has no CFI.
    let trace = record(&dir, "go-s", &[], &exe, &["600", "go"]);
    let before = folded(&trace, &[]);
    assert_chain(&before, "main.spinGo");
    // The names are in the frame table the recorder embedded. The image
    // has no unwind tables, here or not: nothing to look for, no warning.
    let t = trace.to_str().unwrap();
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
