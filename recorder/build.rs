//! Builds the allocation sampler (`recorder/preload`) into the shared
//! library that `lrnprof-rec --heap` preloads into the command it
//! launches. The recorder embeds the library's bytes, so an installed
//! `lrnprof-rec` (`cargo install --path recorder`) needs nothing beside it.
//!
//! The sampler has no dependencies, so plain `rustc` builds it (no cargo
//! inside cargo, no second lock on the target directory). Where it cannot
//! be built (macOS, which has no `--heap`, or a cross build without a
//! linker) an empty file is embedded and `--heap` says it is unavailable.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let sources = manifest.join("preload/src");
    println!("cargo:rerun-if-changed={}", sources.display());
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let library = out_dir.join("liblrnprof_preload.so");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let supported = os == "linux" && matches!(arch.as_str(), "x86_64" | "aarch64");
    if !(supported && build(&sources.join("lib.rs"), &library)) {
        std::fs::write(&library, b"").expect("writing to OUT_DIR");
    }
    println!("cargo:rustc-env=LRNPROF_PRELOAD_LIB={}", library.display());
}

/// Compile the sampler into `out`; false (with a cargo warning) if that fails.
fn build(lib_rs: &Path, out: &Path) -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("set by cargo");
    let mut cmd = Command::new(rustc);
    cmd.args([
        "--edition",
        "2021",
        "--crate-name",
        "lrnprof_preload",
        "--crate-type",
        "cdylib",
        // Export malloc and friends under their C names.
        "--cfg",
        "lrnprof_preload_exports",
        "-C",
        "opt-level=3",
        "-C",
        "panic=abort",
        // The analyzer unwinds through the sampler's own frames (then
        // drops them) with its unwind tables. No forced frame pointers:
        // the allocator's fast paths stay without a stack frame.
        "-C",
        "force-unwind-tables=yes",
        "-C",
        "debuginfo=0",
        "-C",
        "strip=debuginfo",
        "--target",
        &target,
        "-o",
    ])
    .arg(out)
    .arg(lib_rs);
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        let mut flag = std::ffi::OsString::from("linker=");
        flag.push(linker);
        cmd.arg("-C").arg(flag);
    }
    match cmd.output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            let stderr = String::from_utf8_lossy(&o.stderr);
            let why = stderr
                .lines()
                .find(|l| l.starts_with("error"))
                .unwrap_or("rustc failed");
            println!(
                "cargo:warning=the allocation sampler could not be built ({why}); \
                 lrnprof-rec --heap will not be available"
            );
            false
        }
        Err(e) => {
            println!(
                "cargo:warning=cannot run rustc to build the allocation sampler ({e}); \
                 lrnprof-rec --heap will not be available"
            );
            false
        }
    }
}
