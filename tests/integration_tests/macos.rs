//! End-to-end tests: macOS traces analyzed on this (Linux) machine.
//!
//! No Mac is involved. Each test builds the Mach-O fixture
//! `tests/fixtures/macho_callchain.c` (arm64, or x86_64) with clang and
//! ld64.lld, reads its symbols and instructions with `object`, and writes a
//! trace whose header says macOS and whose one thread was sampled with the
//! program counter inside `leaf`: registers and a stack copy laid out
//! exactly as the architecture's frame records would be, with the image
//! loaded at a slid address. `lrnprof-analyze` must then unwind and
//! symbolicate it to `start;outer;middle;leaf`.
//!
//! When clang or ld64.lld (Debian packages `clang` and `lld`) or, for
//! some, llvm-strip, dsymutil or llvm-lipo (package `llvm`) are missing,
//! the tests say so and skip, or fail under `CI=true`.

mod fixture;

use fixture::*;
use lrnprof_format::{Arch, Blob, BlobKind, BuildId, ImageKind, Regs};
use lrnprof_tests::{scratch_dir, skip};
use object::Object;
use std::process::Command;

#[test]
fn frame_pointer_chain_is_unwound_and_symbolicated_at_a_slid_address() {
    let dir = scratch_dir("macos-fp");
    // No unwind tables: the linker writes no __unwind_info, so only the
    // frame-pointer chain can link the frames.
    let Some(bin) = build_fixture(
        &dir,
        ARM64,
        "callchain_fp",
        &["-fno-unwind-tables", "-fno-asynchronous-unwind-tables"],
    ) else {
        return;
    };
    let fx = Fixture::load(&bin);
    assert!(
        fx.unwind_info.is_none(),
        "the fixture should have no __unwind_info"
    );
    let trace = dir.join("fp.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        &fx.path.to_string_lossy(),
        Vec::new(),
    );
    assert_single_stack(&analyze_folded(&trace, &[]), &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compact_unwind_image_is_unwound_and_symbolicated() {
    let dir = scratch_dir("macos-compact");
    let Some(bin) = build_fixture(&dir, ARM64, "callchain_cu", &[]) else {
        return;
    };
    let fx = Fixture::load(&bin);
    assert!(
        fx.unwind_info.is_some(),
        "ld64.lld should have written __unwind_info"
    );
    let trace = dir.join("compact.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        &fx.path.to_string_lossy(),
        Vec::new(),
    );
    assert_single_stack(&analyze_folded(&trace, &[]), &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shared_cache_image_unwinds_from_embedded_sections() {
    let dir = scratch_dir("macos-cache");
    let Some(bin) = build_fixture(&dir, ARM64, "callchain_cache", &[]) else {
        return;
    };
    let fx = Fixture::load(&bin);
    let (unwind_svma, unwind_info) = fx.unwind_info.clone().expect("__unwind_info");
    // What the macOS recorder embeds for a dyld-shared-cache image, which
    // has no file: the header with its load commands as `__TEXT` at the
    // segment's SVMA, and the unwind sections.
    let blobs = vec![
        section_blob(&fx, "__TEXT", fx.text.0, fx.header_and_load_commands()),
        section_blob(&fx, "__unwind_info", unwind_svma, unwind_info),
    ];
    let trace = dir.join("cache.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::SharedCache,
        "/System/Library/lrnprof-test/libcallchain.dylib",
        blobs,
    );
    // No file and no symbols: frames are named `IMAGE+OFFSET`.
    assert_frames_at_offsets(
        &analyze_folded(&trace, &["--offline"]),
        &fx,
        "libcallchain.dylib",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stripped_binary_frames_are_named_by_offset() {
    let dir = scratch_dir("macos-stripped");
    let Some(strip) = find_tool("llvm-strip") else {
        skip!("llvm-strip is not installed (Debian: apt-get install llvm)");
    };
    let Some(bin) = build_fixture(&dir, ARM64, "callchain_stripped", &[]) else {
        return;
    };
    // The test takes the function addresses before stripping.
    let fx = Fixture::load(&bin);
    assert!(Command::new(strip).arg(&bin).status().unwrap().success());
    // What is left is `__mh_execute_header`, the address of the Mach-O
    // header, which names no code: frames must not be charged to it.
    let trace = dir.join("stripped.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        &bin.to_string_lossy(),
        Vec::new(),
    );
    assert_frames_at_offsets(&analyze_folded(&trace, &[]), &fx, "callchain_stripped");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dsym_given_with_symbols_names_a_stripped_binary() {
    let dir = scratch_dir("macos-dsym");
    let (Some(dsymutil), Some(strip)) = (find_tool("dsymutil"), find_tool("llvm-strip")) else {
        skip!("dsymutil or llvm-strip is not installed (Debian: apt-get install llvm)");
    };
    let Some(bin) = build_fixture(&dir, ARM64, "callchain", &["-g"]) else {
        return;
    };
    // The dSYM goes to its own folder; the binary keeps its unwind info but
    // loses every function name.
    let symbols = dir.join("symbols");
    std::fs::create_dir_all(&symbols).unwrap();
    let status = Command::new(dsymutil)
        .arg(&bin)
        .arg("-o")
        .arg(symbols.join("callchain.dSYM"))
        .status()
        .unwrap();
    assert!(status.success(), "dsymutil failed");
    assert!(Command::new(strip).arg(&bin).status().unwrap().success());
    let mut fx = Fixture::load(&bin);
    assert!(
        !fx.functions.contains_key("leaf"),
        "the stripped fixture should have no function symbols"
    );
    // The test itself takes function addresses from the dSYM (same UUID,
    // same layout).
    let dsym = std::fs::read(symbols.join("callchain.dSYM/Contents/Resources/DWARF/callchain"))
        .expect("dsymutil wrote the DWARF file");
    let dsym = object::File::parse(&dsym[..]).unwrap();
    assert_eq!(dsym.mach_uuid().unwrap(), Some(fx.uuid));
    fx.functions = function_symbols(&dsym);
    let trace = dir.join("dsym.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        &bin.to_string_lossy(),
        Vec::new(),
    );

    // Without the dSYM no frame has a function name...
    let unnamed = analyze_folded(&trace, &[]);
    assert_eq!(unnamed.len(), 1, "{unnamed:?}");
    for name in EXPECTED {
        assert!(
            !unnamed[0].0.iter().any(|f| f == name),
            "{name} named without the dSYM: {unnamed:?}"
        );
    }
    // ...with it, every frame has.
    let symbols_arg = symbols.to_string_lossy().into_owned();
    let named = analyze_folded(&trace, &["--symbols", &symbols_arg]);
    assert_single_stack(&named, &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn x86_64_frame_chain_with_compact_unwind_is_unwound_and_symbolicated() {
    let dir = scratch_dir("macos-x86_64");
    let Some(bin) = build_fixture(&dir, X86_64, "callchain_x86_64", &[]) else {
        return;
    };
    let fx = Fixture::load(&bin);
    assert_eq!(fx.arch, Arch::X86_64);
    assert!(
        fx.unwind_info.is_some(),
        "ld64.lld should have written __unwind_info"
    );
    let trace = dir.join("x86_64.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        &fx.path.to_string_lossy(),
        Vec::new(),
    );
    assert_single_stack(&analyze_folded(&trace, &[]), &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn embedded_mach_o_image_names_frames_without_the_file() {
    let dir = scratch_dir("macos-embedded");
    let Some(bin) = build_fixture(&dir, ARM64, "callchain_embedded", &[]) else {
        return;
    };
    let fx = Fixture::load(&bin);
    // What the macOS recorder embeds for a touched image that has a file:
    // the whole (thin) Mach-O, keyed by its UUID.
    let blob = Blob {
        build_id: BuildId(fx.uuid.to_vec()),
        kind: BlobKind::Image,
        compressed: false,
        offset: 0,
        total_len: fx.bytes.len() as u64,
        data: fx.bytes.clone(),
    };
    let trace = dir.join("embedded.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        "/Applications/Gone.app/Contents/MacOS/callchain",
        vec![blob],
    );
    assert_single_stack(&analyze_folded(&trace, &["--offline"]), &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn universal_binary_at_the_recorded_path_is_used() {
    let dir = scratch_dir("macos-universal");
    let Some(lipo) = find_tool("llvm-lipo") else {
        skip!("llvm-lipo is not installed (Debian: apt-get install llvm)");
    };
    let (Some(arm), Some(x86)) = (
        build_fixture(&dir, ARM64, "callchain_arm64", &[]),
        build_fixture(&dir, X86_64, "callchain_x86_64", &[]),
    ) else {
        return;
    };
    // Most macOS apps ship as universal files: one slice per architecture.
    let universal = dir.join("callchain");
    let status = Command::new(lipo)
        .arg("-create")
        .args([&arm, &x86])
        .arg("-output")
        .arg(&universal)
        .status()
        .unwrap();
    assert!(status.success(), "llvm-lipo failed");
    let fx = Fixture::load(&arm);
    let trace = dir.join("universal.lpt");
    write_trace(
        &fx,
        &trace,
        ImageKind::File,
        &universal.to_string_lossy(),
        Vec::new(),
    );
    assert_single_stack(&analyze_folded(&trace, &[]), &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pointer_authentication_bits_on_saved_return_addresses_are_stripped() {
    let dir = scratch_dir("macos-pac");
    let Some(bin) = build_fixture(&dir, ARM64, "callchain_pac", &[]) else {
        return;
    };
    let fx = Fixture::load(&bin);
    // On arm64e (system libraries, and apps built for it) the return
    // addresses saved in frame records carry a signature in their upper
    // bits. The recorder strips the registers, not the stack copy.
    let (regs, mut stack) = sample_in_leaf(&fx);
    for word in [1, 3] {
        let at = &mut stack.bytes[word * 8..word * 8 + 8];
        let signed = u64::from_le_bytes(at.try_into().unwrap()) | 0x2b1d_0000_0000_0000;
        at.copy_from_slice(&signed.to_le_bytes());
    }
    let trace = dir.join("pac.lpt");
    let path = fx.path.to_string_lossy().into_owned();
    write_trace_of(
        &fx,
        &trace,
        ImageKind::File,
        &path,
        Vec::new(),
        (regs, stack),
    );
    assert_single_stack(&analyze_folded(&trace, &[]), &EXPECTED);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn embedded_eh_frame_unwinds_code_without_frame_pointers() {
    let dir = scratch_dir("macos-eh-frame");
    let Some(bin) = build_fixture(&dir, ARM64, "callchain_nofp", &["-fomit-frame-pointer"]) else {
        return;
    };
    let fx = Fixture::load(&bin);
    // With -fomit-frame-pointer the functions save fp and lr but never
    // point fp at them: only the CFI can link the frames. The stack is as
    // in `sample_in_leaf`, but no saved fp means anything.
    let (regs, mut stack) = sample_in_leaf(&fx);
    for word in [0, 2, 6] {
        stack.bytes[word * 8..word * 8 + 8].fill(0);
    }
    let Regs::Aarch64(mut regs) = regs else {
        unreachable!()
    };
    regs.fp = 0;
    let eh_svma = fx.text.0 + 0x2000;
    // Named as in the image, as the recorder embeds it (and as the format
    // specifies): the analyzer must find it under that name.
    let blobs = vec![
        section_blob(&fx, "__TEXT", fx.text.0, fx.header_and_load_commands()),
        section_blob(
            &fx,
            "__eh_frame",
            eh_svma,
            eh_frame_for_omit_fp(&fx, eh_svma),
        ),
    ];
    let trace = dir.join("eh_frame.lpt");
    write_trace_of(
        &fx,
        &trace,
        ImageKind::SharedCache,
        "/System/Library/lrnprof-test/libcallchain.dylib",
        blobs,
        (Regs::Aarch64(regs), stack),
    );
    assert_frames_at_offsets(
        &analyze_folded(&trace, &["--offline"]),
        &fx,
        "libcallchain.dylib",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
