//! The allocation sampler's shared library: built from `recorder/preload`
//! by this crate's build script, embedded in the recorder, and written at
//! start to a private directory (once per content), so an installed
//! `lrnprof-rec` needs nothing beside it.

use crate::error::RecordError;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The library's bytes; empty when the build script could not build it
/// (an unsupported target, or no linker for it).
static LIBRARY: &[u8] = include_bytes!(env!("LRNPROF_PRELOAD_LIB"));

/// 64-bit FNV-1a: names the file after its content, so recorders of
/// different versions never share one.
fn content_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether the dynamic loader can take `path` in `LD_PRELOAD` (which it
/// splits at spaces and colons).
fn preloadable(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|s| !s.contains([' ', ':', '\t', '\n']))
}

/// A directory only `euid` can write to (created if missing), fit for
/// `LD_PRELOAD`: nobody else may replace what the target will load.
fn private_dir(dir: &Path, euid: u32) -> Option<PathBuf> {
    if !preloadable(dir) {
        return None;
    }
    let _ = std::fs::DirBuilder::new().mode(0o755).create(dir);
    let meta = std::fs::symlink_metadata(dir).ok()?;
    (meta.is_dir() && meta.uid() == euid && meta.mode() & 0o022 == 0).then(|| dir.to_owned())
}

/// Write the library (if not there already, with the same bytes) and
/// return its path.
pub(crate) fn install(euid: u32) -> Result<PathBuf, RecordError> {
    if LIBRARY.is_empty() {
        return Err(RecordError::Unsupported(
            "this lrnprof-rec was built without the allocation sampler (its build script could \
             not compile recorder/preload for this target): --heap is not available"
                .into(),
        ));
    }
    let candidates = [
        std::env::var_os("XDG_RUNTIME_DIR").map(|d| PathBuf::from(d).join("lrnprof")),
        Some(std::env::temp_dir().join(format!("lrnprof-{euid}"))),
    ];
    let dir =
        candidates
            .into_iter()
            .flatten()
            .find_map(|d| private_dir(&d, euid))
            .ok_or_else(|| {
                RecordError::Unsupported(format!(
                "no private directory to put the allocation sampler in: {} must be a directory \
                 owned by uid {euid}, writable only by it, with no space or colon in its path \
                 (or set XDG_RUNTIME_DIR or TMPDIR to one)",
                std::env::temp_dir().join(format!("lrnprof-{euid}")).display()
            ))
            })?;
    let path = dir.join(format!(
        "liblrnprof_preload-{:016x}.so",
        content_hash(LIBRARY)
    ));
    if std::fs::read(&path).is_ok_and(|b| b == LIBRARY) {
        return Ok(path);
    }
    let failed = |source| RecordError::Sys {
        what: format!("writing the allocation sampler to {}", path.display()),
        source,
    };
    // Written whole under another name, then renamed: a target never
    // loads a half-written file, and concurrent recorders do not clash.
    let temp = dir.join(format!(".liblrnprof_preload-{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&temp)
        .map_err(failed)?;
    file.write_all(LIBRARY).map_err(failed)?;
    drop(file);
    std::fs::rename(&temp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        failed(e)
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_embedded_and_exports_malloc() {
        assert!(LIBRARY.starts_with(b"\x7fELF"), "built by build.rs");
        let needle = b"posix_memalign\0";
        assert!(LIBRARY.windows(needle.len()).any(|w| w == needle));
    }

    #[test]
    fn installs_once_into_a_private_directory() {
        // Safety: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        let base = std::env::temp_dir().join(format!("lrnprof-lib-test-{}", std::process::id()));
        let dir = private_dir(&base, euid).unwrap();
        assert_eq!(dir, base);
        // Group-writable: refused.
        std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o775))
            .unwrap();
        assert_eq!(private_dir(&base, euid), None);
        assert_eq!(private_dir(Path::new("/tmp/with space"), euid), None);
        let _ = std::fs::remove_dir_all(&base);
        let a = install(euid).unwrap();
        let b = install(euid).unwrap();
        assert_eq!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), LIBRARY);
        assert!(preloadable(&a));
    }
}
