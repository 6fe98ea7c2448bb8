//! Go binaries, as Go's own linker writes them: no `.eh_frame`, a
//! zlib-compressed `.debug_frame`, and Go's build ID note instead of a GNU
//! build id; stripped (`-ldflags=-s -w`), named and unwound by their
//! `.gopclntab` alone; linked with C code by the system linker (cgo), with
//! `.eh_frame` for the C code beside the `.debug_frame` of the Go code
//! (`tests/fixtures/go_spin`).

use super::*;
use lrnprof_tests::build_go_spin as build_go_spin_for;
use object::{Object, ObjectSection};

/// Build the `go_spin` fixture into `dir/name` with `flags`.
fn build_go_spin(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    build_go_spin_for(dir, name, flags, None)
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
    assert_chain(&before, "gospin/spin.Spin");
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

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "the Go fixture's spin is x86_64 assembly"
)]
fn cgo_binaries_unwind_go_code_by_debug_frame_and_c_code_by_eh_frame() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        skip!("`go` is not installed (Debian: golang-go)");
    }
    let dir = scratch_dir("an-go-cgo");
    let exe = build_go_spin(&dir, "gospin-c", &["-tags", "with_c"]);
    let bytes = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    for both in [".eh_frame", ".debug_frame"] {
        assert!(
            file.section_by_name(both).is_some(),
            "no {both}: was the fixture built without cgo (CGO_ENABLED=0, no C compiler)?"
        );
    }
    drop(file);

    let trace = record(&dir, "go-c", &[], &exe, &["800"]);
    let before = folded(&trace, &[]);
    // Go code: only `.debug_frame` leads past spin.Spin's frame pointer.
    assert_chain(&before, "gospin/spin.Spin");
    // C code: `.eh_frame` leads from go_spin_c (no frame pointer) through
    // cgo's wrapper to the Go function that switched to the system stack,
    // where the stack ends (the goroutine's frames are on another stack).
    let c_chain = |s: &[String]| match s {
        [_thread, call, wrapper, leaf] => {
            leaf == "go_spin_c"
                && wrapper.starts_with("_cgo_")
                && wrapper.ends_with("_Cfunc_go_spin_c")
                && call == "runtime.asmcgocall"
        }
        _ => false,
    };
    let in_c: u64 = before
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|l| l == "go_spin_c"))
        .map(|(_, c)| c)
        .sum();
    let whole: u64 = before
        .iter()
        .filter(|(s, _)| c_chain(s))
        .map(|(_, c)| c)
        .sum();
    assert!(in_c >= 100, "{in_c} samples in go_spin_c: {before:?}");
    assert!(
        whole as f64 >= 0.95 * in_c as f64,
        "{whole} of {in_c} samples in go_spin_c end at runtime.asmcgocall: {before:?}"
    );
    // No stack goes on past a stack switch into stale data.
    let switches = ["runtime.asmcgocall", "runtime.systemstack", "runtime.mcall"];
    for stack in before.keys() {
        let past = stack.iter().skip(2).any(|f| switches.contains(&f.as_str()));
        assert!(!past, "a frame above a stack switch: {stack:?}");
    }
    // The same from what the recorder embedded, once the binary is gone.
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
fn stripped_go_binaries_are_named_and_unwound_from_their_pclntab() {
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

    // Through spin, which overwrites the frame pointer: only the CFI the
    // stack-pointer tables give finds main.level2.
    let trace = record(&dir, "go-s", &[], &exe, &["600"]);
    let before = folded(&trace, &[]);
    assert_chain(&before, "gospin/spin.Spin");
    // The names are in the frame table the recorder embedded, the CFI of
    // the functions the trace reaches in a `.debug_frame` blob.
    let t = trace.to_str().unwrap();
    for gone in [false, true] {
        if gone {
            std::fs::remove_file(&exe).unwrap();
            assert_eq!(folded(&trace, &[]), before);
        }
        let source = match gone {
            false => exe.display().to_string(),
            true => "embedded in trace".to_string(),
        };
        let i = info(&trace, &[]);
        assert!(i.contains(&format!(r#""unwind_data": "{source}""#)), "{i}");
        assert!(
            i.contains("unwind rules made from the Go binary's stack-pointer tables"),
            "{i}"
        );
        let out = ok(&[t, "--format", "folded", "-o", "-"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("missing"), "{stderr}");
    }
    remove_scratch_dir(&dir);
}

/// The rules of a `.debug_frame` (`sp`: the stack pointer's DWARF
/// register, `ra`: the return address's) as (start, end, CFA offset from
/// `sp`, the return address's rule), rows with equal rules that follow
/// each other merged.
fn cfa_rows(
    debug_frame: &[u8],
    sp: gimli::Register,
    ra: gimli::Register,
) -> Vec<(u64, u64, i64, String)> {
    use gimli::{BaseAddresses, CfaRule, CieOrFde, DebugFrame, LittleEndian, UnwindSection};
    let mut section = DebugFrame::new(debug_frame, LittleEndian);
    section.set_address_size(8);
    let bases = BaseAddresses::default();
    let mut context = gimli::UnwindContext::new();
    let mut rows = Vec::new();
    let mut entries = section.entries(&bases);
    while let Some(entry) = entries.next().unwrap() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|s, b, o| s.cie_from_offset(b, o)).unwrap();
        let mut table = fde.rows(&section, &bases, &mut context).unwrap();
        while let Some(row) = table.next_row().unwrap() {
            let CfaRule::RegisterAndOffset { register, offset } = row.cfa() else {
                panic!("a CFA expression at {:#x}", row.start_address());
            };
            assert_eq!(*register, sp);
            let ra_rule = format!("{:?}", row.register(ra));
            rows.push((row.start_address(), row.end_address(), *offset, ra_rule));
        }
    }
    rows.sort_unstable();
    let mut merged: Vec<(u64, u64, i64, String)> = Vec::new();
    for (start, end, offset, ra_rule) in rows {
        match merged.last_mut() {
            Some(last) if last.1 == start && last.2 == offset && last.3 == ra_rule => last.1 = end,
            _ => merged.push((start, end, offset, ra_rule)),
        }
    }
    merged
}

#[test]
fn the_cfi_made_from_gopclntab_is_the_cfi_go_writes() {
    if Command::new("go").arg("version").output().is_err() {
        skip!("`go` is not installed (Debian: golang-go)");
    }
    let dir = scratch_dir("an-go-cfi");
    // Read, never run: any host checks both.
    let arches = [
        ("amd64", gimli::X86_64::RSP, gimli::X86_64::RA),
        ("arm64", gimli::AArch64::SP, gimli::AArch64::X30),
    ];
    for (arch, sp, ra) in arches {
        let exe = build_go_spin_for(&dir, &format!("gospin-{arch}"), &[], Some(arch));
        let bytes = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let written = file
            .section_by_name(".debug_frame")
            .unwrap()
            .uncompressed_data()
            .unwrap();
        // The same code built without DWARF (-w): no .debug_frame, every
        // function where it was (the test compares rows by address).
        let bare = build_go_spin_for(
            &dir,
            &format!("gospin-{arch}-w"),
            &["-ldflags=-w"],
            Some(arch),
        );
        let bare_bytes = std::fs::read(&bare).unwrap();
        let bare_file = object::File::parse(&*bare_bytes).unwrap();
        let made = lrnprof_image::go_debug_frame(&bare_file, None).expect("CFI from .gopclntab");
        let (written, made) = (cfa_rows(&written, sp, ra), cfa_rows(&made, sp, ra));
        assert!(written.len() > 1000, "{arch}: {} rows", written.len());
        let differ = (0..written.len().max(made.len())).find(|&i| written.get(i) != made.get(i));
        if let Some(i) = differ {
            let around = |v: &[(u64, u64, i64, String)]| {
                v[i.saturating_sub(2)..(i + 3).min(v.len())].to_vec()
            };
            panic!(
                "{arch}: rows differ from #{i} of {} / {}: Go's {:x?}, made {:x?}",
                written.len(),
                made.len(),
                around(&written),
                around(&made)
            );
        }
        // A binary with its own unwind table gets none made.
        assert_eq!(lrnprof_image::go_debug_frame(&file, None), None);
    }
    remove_scratch_dir(&dir);
}
