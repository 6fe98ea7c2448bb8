//! Writing output files whole or not at all: a temporary name in the same
//! directory, renamed into place once complete.
//!
//! The file is not synced to disk before the rename. An output is derived
//! from its trace and written again by the next analysis; against the
//! analyzer failing or being killed half way, the rename is what keeps a
//! partial file from the output's name, and other programs read the
//! renamed file whole from the page cache at once. The `fsync` cost 1 ms
//! of a 40 ms analysis on a quiet machine and 2–33 ms on a busy one, on
//! the one thread left once the profile is built.

use crate::error::AnalyzeError;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// `TRACE.EXT`: the trace path with `ext` appended to its file name.
pub fn default_output_path(trace: &Path, ext: &str) -> PathBuf {
    let mut name = trace.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(ext);
    trace.with_file_name(name)
}

/// Write to `path` through `f`; `-` is stdout. A failure leaves no file
/// at `path` (and the temporary one is removed).
pub fn write_atomically(
    path: &Path,
    f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), AnalyzeError> {
    write_marked(
        path,
        f,
        #[cfg(unix)]
        &unfinished::WRITING,
    )
}

/// [`write_atomically`], with the temporary file marked in `writing`
/// while it is written.
fn write_marked(
    path: &Path,
    f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    #[cfg(unix)] writing: &unfinished::Registry,
) -> Result<(), AnalyzeError> {
    let err = |source| AnalyzeError::Write {
        path: path.to_path_buf(),
        source,
    };
    if path == Path::new("-") {
        let stdout = std::io::stdout();
        let mut lock = BufWriter::new(stdout.lock());
        return f(&mut lock)
            .and_then(|_| lock.flush())
            .map_err(AnalyzeError::Stdout);
    }
    // A device or FIFO (`-o /dev/null`, a named pipe) is written in place:
    // renaming a temporary file over it would replace the device itself.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(err)?;
        let mut w = BufWriter::new(file);
        return f(&mut w).and_then(|_| w.flush()).map_err(err);
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    #[cfg(unix)]
    let _marked = writing.mark(&tmp);
    let result = (|| {
        let file = std::fs::File::create(&tmp)?;
        let mut w = BufWriter::new(file);
        f(&mut w)?;
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// The temporary files outputs are being written to, so that a process
/// stopped by a signal (Ctrl-C) leaves none behind: the program's handler
/// calls [`remove_unfinished_output`].
#[cfg(unix)]
mod unfinished {
    use std::ffi::{c_char, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicPtr, Ordering};

    /// Outputs written at once (a library user may write several on
    /// threads of its own); past that, a file is not marked, and a signal
    /// leaves it behind.
    const SLOTS: usize = 8;

    /// Paths being written, a slot each, null when free. The strings are
    /// leaked, never freed: a handler may read one at any moment.
    pub(super) struct Registry {
        slots: [AtomicPtr<c_char>; SLOTS],
    }

    /// This process's outputs.
    pub(super) static WRITING: Registry = Registry::new();

    /// A slot of a [`Registry`] holding a path until dropped.
    pub(super) struct Mark<'a> {
        registry: &'a Registry,
        slot: Option<usize>,
    }

    impl Registry {
        pub(super) const fn new() -> Registry {
            Registry {
                slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS],
            }
        }

        /// Hold `path` in a free slot until the mark is dropped.
        pub(super) fn mark(&self, path: &Path) -> Mark<'_> {
            let slot = CString::new(path.as_os_str().as_bytes())
                .ok()
                .and_then(|c| {
                    let c = c.into_raw();
                    let slot = self.slots.iter().position(|s| {
                        let free = std::ptr::null_mut();
                        s.compare_exchange(free, c, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                    });
                    if slot.is_none() {
                        // Safety: from into_raw just above, never shared.
                        drop(unsafe { CString::from_raw(c) });
                    }
                    slot
                });
            Mark {
                registry: self,
                slot,
            }
        }

        /// Unlink every path held. Async-signal-safe: atomic swaps and
        /// `unlink`.
        pub(super) fn remove_all(&self) {
            for s in &self.slots {
                let path = s.swap(std::ptr::null_mut(), Ordering::SeqCst);
                if !path.is_null() {
                    // Safety: a NUL-terminated string that is never freed.
                    unsafe {
                        libc::unlink(path);
                    }
                }
            }
        }
    }

    impl Drop for Mark<'_> {
        fn drop(&mut self) {
            if let Some(i) = self.slot {
                self.registry.slots[i].store(std::ptr::null_mut(), Ordering::SeqCst);
            }
        }
    }
}

/// Remove the temporary files of the outputs being written, if any: for a
/// SIGINT or SIGTERM handler, so that an interrupted analysis leaves no
/// file behind. Async-signal-safe (atomic swaps and `unlink`).
#[cfg(unix)]
pub fn remove_unfinished_output() {
    unfinished::WRITING.remove_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a signal handler removes is the file being written, and only
    /// while it is. A registry of the test's own: other tests write
    /// outputs at the same time through the process's.
    #[test]
    #[cfg(unix)]
    fn an_interrupted_write_leaves_no_file() {
        let writing = unfinished::Registry::new();
        let dir = std::env::temp_dir().join(format!("lrnprof-wf-int-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("p.pb.gz");
        let interrupted = |w: &mut dyn Write| {
            w.write_all(b"partial")?;
            assert_eq!(
                std::fs::read_dir(&dir).unwrap().count(),
                1,
                "the temporary file"
            );
            writing.remove_all();
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
            Ok(())
        };
        // The rename finds no file: an error, and nothing at `out`.
        assert!(write_marked(&out, interrupted, &writing).is_err());
        assert!(!out.exists());
        // Outside a write there is nothing to remove.
        write_marked(&out, |w| w.write_all(b"whole"), &writing).unwrap();
        writing.remove_all();
        assert_eq!(std::fs::read(&out).unwrap(), b"whole");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_path_appends_extension() {
        assert_eq!(
            default_output_path(Path::new("/x/t.lpt"), "pb.gz"),
            PathBuf::from("/x/t.lpt.pb.gz")
        );
    }

    #[test]
    fn failed_write_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("lrnprof-wf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.folded");
        let r = write_atomically(&path, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(r.is_err());
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        write_atomically(&path, |w| w.write_all(b"whole")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let null = Path::new("/dev/null");
        write_atomically(null, |w| w.write_all(b"discarded")).unwrap();
        let meta = std::fs::metadata(null).unwrap();
        assert!(meta.file_type().is_char_device(), "/dev/null was replaced");
    }
}
