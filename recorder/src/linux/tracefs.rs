//! The kernel's tracing filesystem: where it is mounted, the ids of the
//! tracepoints the syscall events use, and the layout of their payloads
//! (read from each tracepoint's `format` file rather than assumed, so a
//! kernel that lays them out differently is parsed right or refused).
//! Parsing is pure; the readers are thin.

use crate::error::RecordError;
use std::io;
use std::path::{Path, PathBuf};

/// Where tracefs is mounted on current systems, and the older place
/// under debugfs.
const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// How to mount tracefs, for error messages.
const MOUNT_ADVICE: &str = "mount it as root with `mount -t tracefs nodev /sys/kernel/tracing` \
     (or add `tracefs /sys/kernel/tracing tracefs defaults 0 0` to /etc/fstab)";

/// One field of a tracepoint's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    pub name: String,
    /// Byte offset in the payload.
    pub offset: usize,
    /// Bytes (for arrays, of the whole array).
    pub size: usize,
}

/// Parse a tracepoint's `format` file: its fields, common ones included.
/// Lines that are not fields are skipped.
pub(crate) fn parse_format(text: &str) -> Vec<Field> {
    text.lines().filter_map(parse_field_line).collect()
}

/// `\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;`
fn parse_field_line(line: &str) -> Option<Field> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    for part in line.split(';').map(str::trim) {
        if let Some(d) = part.strip_prefix("field:") {
            decl = Some(d);
        } else if let Some(o) = part.strip_prefix("offset:") {
            offset = o.trim().parse().ok();
        } else if let Some(s) = part.strip_prefix("size:") {
            size = s.trim().parse().ok();
        }
    }
    // The name is the declaration's last word, without an array suffix.
    let name = decl?.split_whitespace().last()?;
    let name = name.split('[').next()?;
    Some(Field {
        name: name.to_string(),
        offset: offset?,
        size: size?,
    })
}

/// Where the raw_syscalls tracepoints keep what the recorder reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyscallPayloads {
    /// `sys_enter`: the syscall number (a `long`).
    pub enter_id: usize,
    /// `sys_enter`: the six arguments (`unsigned long args[6]`).
    pub enter_args: usize,
    /// `sys_exit`: the syscall number.
    pub exit_id: usize,
    /// `sys_exit`: the return value (a `long`).
    pub exit_ret: usize,
}

impl SyscallPayloads {
    /// The offsets from the two tracepoints' fields; `None` if a field is
    /// missing or not the 8-byte `long` this recorder reads.
    pub fn from_fields(enter: &[Field], exit: &[Field]) -> Option<SyscallPayloads> {
        let find = |fields: &[Field], name: &str, size: usize| {
            fields
                .iter()
                .find(|f| f.name == name && f.size == size)
                .map(|f| f.offset)
        };
        Some(SyscallPayloads {
            enter_id: find(enter, "id", 8)?,
            enter_args: find(enter, "args", 48)?,
            exit_id: find(exit, "id", 8)?,
            exit_ret: find(exit, "ret", 8)?,
        })
    }

    /// A `sys_enter` payload: the syscall number and arguments.
    pub fn enter(&self, raw: &[u8]) -> Option<(i64, [u64; 6])> {
        let id = read_i64(raw, self.enter_id)?;
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = read_i64(raw, self.enter_args + 8 * i)? as u64;
        }
        Some((id, args))
    }

    /// A `sys_exit` payload: the syscall number and return value.
    pub fn exit(&self, raw: &[u8]) -> Option<(i64, i64)> {
        Some((read_i64(raw, self.exit_id)?, read_i64(raw, self.exit_ret)?))
    }
}

fn read_i64(raw: &[u8], at: usize) -> Option<i64> {
    let bytes = raw.get(at..at.checked_add(8)?)?;
    Some(i64::from_ne_bytes(bytes.try_into().ok()?))
}

/// The tracefs mount point in `/proc/self/mounts` text, if any.
pub(crate) fn mount_point(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        // Mount points with spaces are octal-escaped; tracefs's never are
        // in practice, and such a line is simply not used.
        (fstype == "tracefs").then(|| PathBuf::from(dir))
    })
}

/// A tracepoint's id and payload fields.
#[derive(Debug, Clone)]
pub(crate) struct Tracepoint {
    /// `perf_event_attr.config` for `PERF_TYPE_TRACEPOINT`.
    pub id: u64,
    pub fields: Vec<Field>,
}

/// The mounted tracefs: the first mount listed, else the usual places.
pub(crate) fn find() -> Result<PathBuf, RecordError> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if let Some(dir) = mount_point(&mounts) {
        return Ok(dir);
    }
    CANDIDATES
        .iter()
        .map(Path::new)
        .find(|d| d.join("events").is_dir())
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            RecordError::Tracing(format!(
                "tracefs, the kernel's tracing filesystem, is not mounted: {MOUNT_ADVICE}"
            ))
        })
}

/// Read tracepoint `system:name` under the tracefs at `root`.
pub(crate) fn tracepoint(root: &Path, system: &str, name: &str) -> Result<Tracepoint, RecordError> {
    let dir = root.join("events").join(system).join(name);
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read_to_string(&path).map_err(|e| read_error(&path, system, name, &e))
    };
    let id_text = read("id")?;
    let id = id_text.trim().parse().map_err(|_| {
        RecordError::Tracing(format!(
            "{} holds {:?}, not a tracepoint id",
            dir.join("id").display(),
            id_text.trim()
        ))
    })?;
    let fields = parse_format(&read("format")?);
    Ok(Tracepoint { id, fields })
}

fn read_error(path: &Path, system: &str, name: &str, e: &io::Error) -> RecordError {
    RecordError::Tracing(match e.kind() {
        io::ErrorKind::NotFound => format!(
            "the kernel has no {system}:{name} tracepoint ({} does not exist): it needs \
             CONFIG_FTRACE_SYSCALLS (syscalls) or CONFIG_TRACEPOINTS",
            path.display()
        ),
        io::ErrorKind::PermissionDenied => format!(
            "cannot read {}: tracefs is readable by root only; record as root, or give this \
             user CAP_PERFMON and read access (`mount -o remount,mode=755 {}`)",
            path.display(),
            path.ancestors().nth(4).unwrap_or(path).display()
        ),
        _ => format!("cannot read {}: {e}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYS_ENTER: &str = "name: sys_enter
ID: 443
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;
\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;

print fmt: \"NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)\", REC->id, REC->args[0]
";

    const SYS_EXIT: &str = "name: sys_exit
ID: 442
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;
\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;
";

    #[test]
    fn parses_format_files() {
        let f = parse_format(SYS_ENTER);
        assert_eq!(f.len(), 6);
        assert_eq!(
            f[5],
            Field {
                name: "args".into(),
                offset: 16,
                size: 48
            }
        );
        assert_eq!(f[4].name, "id");
    }

    #[rustfmt::skip]
    #[test]
    fn decodes_syscall_payloads() {
        let p = SyscallPayloads::from_fields(&parse_format(SYS_ENTER), &parse_format(SYS_EXIT))
            .unwrap();
        let mut enter = vec![0u8; 8];                    // common fields
        enter.extend(1i64.to_ne_bytes());                // id: write
        for a in [3u64, 0x1000, 5, 0, 0, 0] {            // args
            enter.extend(a.to_ne_bytes());
        }
        assert_eq!(p.enter(&enter), Some((1, [3, 0x1000, 5, 0, 0, 0])));
        assert_eq!(p.enter(&enter[..40]), None, "cut short");
        let mut exit = vec![0u8; 8];                     // common fields
        exit.extend(1i64.to_ne_bytes());                 // id
        exit.extend((-9i64).to_ne_bytes());              // ret: -EBADF
        assert_eq!(p.exit(&exit), Some((1, -9)));
        // A layout without the fields read is refused.
        assert_eq!(SyscallPayloads::from_fields(&parse_format(SYS_EXIT), &[]), None);
    }

    #[test]
    fn finds_the_mount_point() {
        let mounts = "sysfs /sys sysfs rw 0 0\n\
                      tracefs /sys/kernel/tracing tracefs rw,relatime 0 0\n";
        assert_eq!(
            mount_point(mounts),
            Some(PathBuf::from("/sys/kernel/tracing"))
        );
        assert_eq!(mount_point("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn missing_tracepoints_say_what_the_kernel_lacks() {
        let dir = std::env::temp_dir().join(format!("lrnprof-tracefs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tp = dir.join("events/raw_syscalls/sys_enter");
        std::fs::create_dir_all(&tp).unwrap();
        std::fs::write(tp.join("id"), "443\n").unwrap();
        std::fs::write(tp.join("format"), SYS_ENTER).unwrap();
        let t = tracepoint(&dir, "raw_syscalls", "sys_enter").unwrap();
        assert_eq!((t.id, t.fields.len()), (443, 6));
        let err = tracepoint(&dir, "raw_syscalls", "sys_exit").unwrap_err();
        assert!(err.to_string().contains("CONFIG_FTRACE_SYSCALLS"), "{err}");
        std::fs::write(tp.join("id"), "x").unwrap();
        let err = tracepoint(&dir, "raw_syscalls", "sys_enter").unwrap_err();
        assert!(err.to_string().contains("not a tracepoint id"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
