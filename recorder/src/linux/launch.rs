//! Launching the command to record: fork, let the child wait until the
//! events are attached to it, then exec (events enable on exec, so no
//! sample is missed).

use super::sys;
use crate::error::RecordError;
use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Find `program` like `execvp` would: as given if it contains a slash,
/// else in the directories of `path_var`. `Err(true)` means found but not
/// executable, `Err(false)` not found.
pub(crate) fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
    is_executable: impl Fn(&Path) -> Option<bool>,
) -> Result<PathBuf, bool> {
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return match is_executable(&p) {
            Some(true) => Ok(p),
            Some(false) => Err(true),
            None => Err(false),
        };
    }
    let mut found_unexecutable = false;
    for dir in std::env::split_paths(path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin")))
    {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        match is_executable(&candidate) {
            Some(true) => return Ok(candidate),
            Some(false) => found_unexecutable = true,
            None => {}
        }
    }
    Err(found_unexecutable)
}

/// `Some(executable?)` for a regular file, `None` if missing or not a file.
fn file_is_executable(p: &Path) -> Option<bool> {
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_file() {
        return None;
    }
    Some(meta.permissions().mode() & 0o111 != 0)
}

/// A forked child waiting for [`Launched::release`] before it execs.
pub(crate) struct Launched {
    /// The child's pid.
    pub pid: u32,
    /// The program it will exec, found like `execvp` does.
    pub path: PathBuf,
    go: Option<OwnedFd>,
    status: Option<OwnedFd>,
    command: String,
}

/// What the command gets besides the recorder's environment.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// Variables to set (replacing the recorder's of the same name).
    pub env: Vec<(OsString, OsString)>,
    /// A close-on-exec descriptor of the recorder the command inherits.
    pub inherit_fd: Option<RawFd>,
}

/// The environment `base` with `set` applied, as `NAME=VALUE` C strings.
fn environment(
    base: impl Iterator<Item = (OsString, OsString)>,
    set: &[(OsString, OsString)],
) -> Vec<CString> {
    let mut vars: Vec<(OsString, OsString)> = base
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
        .collect();
    vars.extend(set.iter().cloned());
    vars.into_iter()
        .filter_map(|(k, v)| {
            let mut entry = k.into_vec();
            entry.push(b'=');
            entry.extend(v.into_vec());
            CString::new(entry).ok()
        })
        .collect()
}

/// Fork the command, stopped before `execve`.
pub(crate) fn spawn_waiting(
    command: &[OsString],
    extras: &Extras,
) -> Result<Launched, RecordError> {
    let display = command[0].to_string_lossy().into_owned();
    if command[0].as_bytes().contains(&b'/') && Path::new(&command[0]).is_dir() {
        return Err(RecordError::CommandNotExecutable {
            command: display,
            source: std::io::Error::from_raw_os_error(libc::EISDIR),
        });
    }
    let path = resolve_program(
        &command[0],
        std::env::var_os("PATH").as_deref(),
        file_is_executable,
    )
    .map_err(|found| {
        if found {
            RecordError::CommandNotExecutable {
                command: display.clone(),
                source: std::io::Error::from_raw_os_error(libc::EACCES),
            }
        } else {
            RecordError::CommandNotFound {
                command: display.clone(),
            }
        }
    })?;
    let to_c = |s: &OsStr| {
        CString::new(s.as_bytes())
            .map_err(|_| RecordError::InvalidOption(format!("argument {s:?} contains a NUL byte")))
    };
    let c_path = to_c(path.as_os_str())?;
    let c_args = command
        .iter()
        .map(|a| to_c(a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut child = sys::ChildSetup {
        inherit_fd: extras.inherit_fd,
        ..Default::default()
    };
    if !extras.env.is_empty() {
        child.env_strings = environment(std::env::vars_os(), &extras.env);
        let mut envp: Vec<*const libc::c_char> =
            child.env_strings.iter().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        child.envp = Some(envp);
    }
    let (go_read, go_write) = sys::pipe()?;
    let (status_read, status_write) = sys::pipe()?;
    let pid = sys::fork_exec_when_told(
        &c_path,
        &argv,
        (&go_read, &go_write),
        (&status_read, &status_write),
        &child,
    )?;
    Ok(Launched {
        pid,
        path,
        go: Some(go_write),
        status: Some(status_read),
        command: display,
    })
}

impl Launched {
    /// Let the child exec; fails if `execve` failed.
    pub fn release(&mut self) -> Result<(), RecordError> {
        let go = self.go.take().expect("released once");
        let mut file = std::fs::File::from(go);
        std::io::Write::write_all(&mut file, b"x").map_err(|e| RecordError::Sys {
            what: "starting the command".into(),
            source: e,
        })?;
        drop(file);
        let mut status = std::fs::File::from(self.status.take().expect("released once"));
        let mut errno = [0u8; 4];
        // EOF means the exec succeeded (the pipe closed on exec).
        if status.read_exact(&mut errno).is_ok() {
            let _ = sys::wait(self.pid);
            let code = i32::from_ne_bytes(errno);
            let source = std::io::Error::from_raw_os_error(code);
            return Err(if code == libc::ENOENT {
                // The program was found: what is missing is what it names.
                RecordError::CommandNotExecutable {
                    command: self.command.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        crate::error::missing_interpreter(&self.path),
                    ),
                }
            } else {
                RecordError::CommandNotExecutable {
                    command: self.command.clone(),
                    source,
                }
            });
        }
        Ok(())
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        // Never released: closing the pipe makes the child exit; reap it.
        if self.go.take().is_some() {
            let _ = sys::wait(self.pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_fs(p: &Path) -> Option<bool> {
        match p.to_str()? {
            "/bin/ls" | "./tool" => Some(true),
            "/usr/bin/data" | "/opt/data" => Some(false),
            _ => None,
        }
    }

    #[test]
    fn searches_path_like_execvp() {
        let path = Some(OsStr::new("/usr/bin:/bin"));
        assert_eq!(
            resolve_program(OsStr::new("ls"), path, fake_fs),
            Ok("/bin/ls".into())
        );
        assert_eq!(
            resolve_program(OsStr::new("data"), path, fake_fs),
            Err(true)
        );
        assert_eq!(
            resolve_program(OsStr::new("nope"), path, fake_fs),
            Err(false)
        );
    }

    #[test]
    fn the_environment_is_the_recorders_with_overrides() {
        let base = [("A", "1"), ("LD_PRELOAD", "old.so"), ("B", "2")]
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let set = [(
            OsString::from("LD_PRELOAD"),
            OsString::from("new.so:old.so"),
        )];
        let env = environment(base, &set);
        let env: Vec<&str> = env.iter().map(|e| e.to_str().unwrap()).collect();
        assert_eq!(env, ["A=1", "B=2", "LD_PRELOAD=new.so:old.so"]);
    }

    #[test]
    fn paths_with_slashes_are_taken_as_given() {
        assert_eq!(
            resolve_program(OsStr::new("./tool"), None, fake_fs),
            Ok("./tool".into())
        );
        assert_eq!(
            resolve_program(OsStr::new("/opt/data"), None, fake_fs),
            Err(true)
        );
        assert_eq!(
            resolve_program(OsStr::new("./missing"), None, fake_fs),
            Err(false)
        );
    }
}
