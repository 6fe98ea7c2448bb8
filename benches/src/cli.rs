//! What the benchmark binaries share: where the repository and the
//! lrnprof binaries are, and writing the markdown they print, and
//! building the C programs they run.

use crate::error::BenchError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (the parent of `benches/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `name` in the directory of the running program, where cargo puts every
/// binary of the workspace (`lrnprof-rec`, `lrnprof-analyze`).
pub fn beside_this_program(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Print `text`, and write it to `path` when one is given.
pub fn emit_markdown(text: &str, path: Option<&Path>) -> Result<(), BenchError> {
    print!("{text}");
    match path {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| BenchError::io(format!("write {}", path.display()), e)),
        None => Ok(()),
    }
}

/// Compile the C file `source` into `exe` with `cc -O2` (or `$CC`).
pub fn build_c_program(source: &Path, exe: &Path) -> Result<(), BenchError> {
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let out = Command::new(&cc)
        .args(["-O2", "-o"])
        .arg(exe)
        .arg(source)
        .output()
        .map_err(|e| BenchError::io(format!("run {} (install gcc)", cc.to_string_lossy()), e))?;
    if !out.status.success() {
        return Err(BenchError::CommandFailed {
            command: format!("{} -O2 {}", cc.to_string_lossy(), source.display()),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}
