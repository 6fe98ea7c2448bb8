//! Names and classes of system call numbers, per trace architecture.
//!
//! A trace stores syscall numbers as its architecture numbers them
//! ([`SampleDetail::Syscall`](crate::SampleDetail::Syscall),
//! [`SyscallExitRecord`](crate::SyscallExitRecord),
//! [`SyscallSettings::filter`](crate::SyscallSettings::filter)): the
//! recorder resolves the names a user filters by with this module, and the
//! analyzer names the numbers it shows, for the trace's architecture
//! whatever machine it runs on. The tables come from the `syscalls` crate
//! (generated from the kernel's own tables); the classes follow strace's
//! (`%file`, `%network`, ...) so filters mean the same in both tools.

use crate::Arch;
use std::fmt;
use std::str::FromStr;

/// Whose numbering a syscall number is in: a trace architecture's, or that
/// of the 32-bit processes it runs, whose samples are flagged
/// [`SampleFlags::ABI_32`](crate::SampleFlags::ABI_32) (i386 on x86-64,
/// AArch32 on AArch64). An [`Arch`] stands for its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyscallAbi {
    /// x86-64.
    X86_64,
    /// 32-bit x86 processes on x86-64.
    I386,
    /// AArch64.
    Aarch64,
    /// 32-bit Arm (EABI) processes on AArch64.
    Arm,
}

impl SyscallAbi {
    /// The numbering of `arch`'s processes, or with `abi32` of its 32-bit
    /// ones.
    pub fn of(arch: Arch, abi32: bool) -> SyscallAbi {
        match (arch, abi32) {
            (Arch::X86_64, false) => SyscallAbi::X86_64,
            (Arch::X86_64, true) => SyscallAbi::I386,
            (Arch::Aarch64, false) => SyscallAbi::Aarch64,
            (Arch::Aarch64, true) => SyscallAbi::Arm,
        }
    }

    /// Whether this is a 32-bit numbering.
    pub fn is_32(self) -> bool {
        matches!(self, SyscallAbi::I386 | SyscallAbi::Arm)
    }

    /// Its name (`x86_64`, `i386`, `aarch64`, `arm`).
    pub fn name(self) -> &'static str {
        match self {
            SyscallAbi::X86_64 => "x86_64",
            SyscallAbi::I386 => "i386",
            SyscallAbi::Aarch64 => "aarch64",
            SyscallAbi::Arm => "arm",
        }
    }
}

impl From<Arch> for SyscallAbi {
    fn from(arch: Arch) -> SyscallAbi {
        SyscallAbi::of(arch, false)
    }
}

/// `$body` with `Sysno` the `syscalls` crate's type of `$abi`.
macro_rules! with_sysno {
    ($abi:expr, $body:expr) => {
        match $abi {
            SyscallAbi::X86_64 => {
                use syscalls::x86_64::Sysno;
                $body
            }
            SyscallAbi::I386 => {
                use syscalls::x86::Sysno;
                $body
            }
            SyscallAbi::Aarch64 => {
                use syscalls::aarch64::Sysno;
                $body
            }
            SyscallAbi::Arm => {
                use syscalls::arm::Sysno;
                $body
            }
        }
    };
}

/// The name of syscall `nr` in `abi`'s numbering (an [`Arch`] or a
/// [`SyscallAbi`]): `write`, `openat`, if it has one.
pub fn syscall_name(abi: impl Into<SyscallAbi>, nr: u32) -> Option<&'static str> {
    let nr = usize::try_from(nr).ok()?;
    with_sysno!(abi.into(), Sysno::new(nr).map(|s| s.name()))
}

/// The number of the syscall called `name` in `abi`'s numbering, if there
/// is one.
pub fn syscall_number(abi: impl Into<SyscallAbi>, name: &str) -> Option<u32> {
    let id = with_sysno!(abi.into(), Sysno::from_str(name).ok()?.id());
    u32::try_from(id).ok()
}

/// Every syscall of `abi` as (number, name), by number.
pub fn syscall_table(abi: impl Into<SyscallAbi>) -> Vec<(u32, &'static str)> {
    with_sysno!(
        abi.into(),
        Sysno::iter().map(|s| (s.id() as u32, s.name())).collect()
    )
}

/// A group of related syscalls, as strace groups them for its `-e trace=`
/// filters (`%file` and so on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyscallClass {
    /// Syscalls that take a file name (`openat`, `stat`, `unlink`, `execve`, ...).
    File,
    /// Sockets (`socket`, `connect`, `sendto`, ...).
    Network,
    /// Process lifecycle (`clone`, `execve`, `wait4`, `exit_group`, `kill`, ...).
    Process,
    /// Memory mapping (`mmap`, `munmap`, `brk`, `mprotect`, ...).
    Memory,
    /// Signals (`rt_sigaction`, `rt_sigprocmask`, `kill`, ...).
    Signal,
    /// System V IPC (`msgsnd`, `semop`, `shmat`, ...).
    Ipc,
}

impl SyscallClass {
    /// Every class.
    pub const ALL: [SyscallClass; 6] = [
        SyscallClass::File,
        SyscallClass::Network,
        SyscallClass::Process,
        SyscallClass::Memory,
        SyscallClass::Signal,
        SyscallClass::Ipc,
    ];

    /// The class's name as filters spell it (`file`, `network`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SyscallClass::File => "file",
            SyscallClass::Network => "network",
            SyscallClass::Process => "process",
            SyscallClass::Memory => "memory",
            SyscallClass::Signal => "signal",
            SyscallClass::Ipc => "ipc",
        }
    }

    /// The names of the class's syscalls (some exist in one numbering
    /// only, as i386's `mmap2`).
    pub fn members(self) -> &'static [&'static str] {
        match self {
            SyscallClass::File => FILE,
            SyscallClass::Network => NETWORK,
            SyscallClass::Process => PROCESS,
            SyscallClass::Memory => MEMORY,
            SyscallClass::Signal => SIGNAL,
            SyscallClass::Ipc => IPC,
        }
    }

    /// Whether the syscall called `name` is in this class.
    pub fn contains(self, name: &str) -> bool {
        self.members().contains(&name)
    }

    /// The numbers of the class's syscalls in `abi`'s numbering,
    /// ascending.
    pub fn numbers(self, abi: impl Into<SyscallAbi>) -> Vec<u32> {
        let abi = abi.into();
        let mut v: Vec<u32> = self
            .members()
            .iter()
            .filter_map(|n| syscall_number(abi, n))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

impl fmt::Display for SyscallClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SyscallClass {
    type Err = ();

    /// `file` or `%file`; strace's `%net` is accepted for `network`.
    fn from_str(s: &str) -> Result<Self, ()> {
        let s = s.strip_prefix('%').unwrap_or(s);
        if s == "net" {
            return Ok(SyscallClass::Network);
        }
        SyscallClass::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or(())
    }
}

/// A syscall filter that names no syscall or class of `arch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownSyscall {
    /// The word as given.
    pub word: String,
}

impl fmt::Display for UnknownSyscall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is neither a syscall of this architecture nor a class (file, network, \
             process, memory, signal, ipc; written file or %file)",
            self.word
        )
    }
}

/// The syscall numbers of `abi` that a comma-separated list of syscall
/// names and classes (`write,openat,%network`) selects, ascending. A word
/// that is both a syscall's name and a class's is the syscall, unless
/// written with `%`.
pub fn resolve_syscall_filter<'a>(
    abi: impl Into<SyscallAbi>,
    words: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<u32>, UnknownSyscall> {
    resolve(abi.into(), words, false)
}

/// [`resolve_syscall_filter`] for another numbering than the one the
/// words were checked against: a word that names nothing of `abi`
/// selects nothing (the 32-bit numberings lack some 64-bit calls).
pub fn resolve_known_syscalls<'a>(
    abi: impl Into<SyscallAbi>,
    words: impl IntoIterator<Item = &'a str>,
) -> Vec<u32> {
    resolve(abi.into(), words, true).unwrap_or_default()
}

/// The words of syscall filters as given (`--syscall write,%network
/// --syscall file`): split at commas, trimmed, empty ones left out.
pub fn syscall_filter_words<'a>(
    words: impl IntoIterator<Item = &'a str>,
) -> impl Iterator<Item = &'a str> {
    words
        .into_iter()
        .flat_map(|w| w.split(','))
        .map(str::trim)
        .filter(|w| !w.is_empty())
}

fn resolve<'a>(
    abi: SyscallAbi,
    words: impl IntoIterator<Item = &'a str>,
    lenient: bool,
) -> Result<Vec<u32>, UnknownSyscall> {
    let mut numbers = Vec::new();
    for word in syscall_filter_words(words) {
        if !word.starts_with('%') {
            if let Some(nr) = syscall_number(abi, word) {
                numbers.push(nr);
                continue;
            }
        }
        match SyscallClass::from_str(word) {
            Ok(class) => numbers.extend(class.numbers(abi)),
            Err(()) if lenient => {}
            Err(()) => {
                return Err(UnknownSyscall {
                    word: word.to_string(),
                })
            }
        }
    }
    numbers.sort_unstable();
    numbers.dedup();
    Ok(numbers)
}

/// The name of Linux errno `errno` (`ENOENT`), the same on both trace
/// architectures (they use the kernel's generic numbers).
pub fn errno_name(errno: u32) -> Option<&'static str> {
    let errno = i32::try_from(errno).ok()?;
    syscalls::Errno::new(errno).name()
}

/// Whether a raw return value is an error: Linux returns `-errno`, and
/// errnos are below 4096.
pub fn is_syscall_error(ret: i64) -> bool {
    (-4095..=-1).contains(&ret)
}

// The classes' members: syscalls by what they do (their arguments and
// effect), the same grouping strace documents for its classes.

const FILE: &[&str] = &[
    // 32-bit processes' (i386, Arm) variants first.
    "stat64",
    "lstat64",
    "fstatat64",
    "statfs64",
    "truncate64",
    "chown32",
    "lchown32",
    "open",
    "openat",
    "openat2",
    "creat",
    "stat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "chdir",
    "chroot",
    "chmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "lchown",
    "fchownat",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "unlink",
    "unlinkat",
    "rename",
    "renameat",
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "mknod",
    "mknodat",
    "readlink",
    "readlinkat",
    "truncate",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "execve",
    "execveat",
    "mount",
    "umount2",
    "swapon",
    "swapoff",
    "statfs",
    "setxattr",
    "lsetxattr",
    "getxattr",
    "lgetxattr",
    "listxattr",
    "llistxattr",
    "removexattr",
    "lremovexattr",
    "setxattrat",
    "getxattrat",
    "listxattrat",
    "removexattrat",
    "acct",
    "pivot_root",
    "name_to_handle_at",
    "inotify_add_watch",
    "fanotify_mark",
    "uselib",
    "quotactl",
    "open_tree",
    "open_tree_attr",
    "move_mount",
    "mount_setattr",
    "fsmount",
    "fspick",
    "file_getattr",
    "file_setattr",
];

const NETWORK: &[&str] = &[
    "socketcall",
    "socket",
    "socketpair",
    "bind",
    "connect",
    "listen",
    "accept",
    "accept4",
    "getsockname",
    "getpeername",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
    "setsockopt",
    "getsockopt",
];

const PROCESS: &[&str] = &[
    "fork",
    "vfork",
    "clone",
    "clone3",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "unshare",
    "setns",
];

const MEMORY: &[&str] = &[
    "mmap2",
    "brk",
    "mmap",
    "munmap",
    "mremap",
    "mprotect",
    "pkey_mprotect",
    "madvise",
    "process_madvise",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
    "mincore",
    "msync",
    "remap_file_pages",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "set_mempolicy_home_node",
    "migrate_pages",
    "move_pages",
    "shmat",
    "shmdt",
    "map_shadow_stack",
    "mseal",
];

const SIGNAL: &[&str] = &[
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "sigaltstack",
    "kill",
    "tkill",
    "tgkill",
    "signalfd",
    "signalfd4",
    "pause",
    "pidfd_send_signal",
];

const IPC: &[&str] = &[
    "ipc",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_per_arch() {
        assert_eq!(syscall_name(Arch::X86_64, 1), Some("write"));
        assert_eq!(syscall_name(Arch::Aarch64, 64), Some("write"));
        assert_eq!(syscall_name(Arch::Aarch64, 56), Some("openat"));
        assert_eq!(syscall_number(Arch::X86_64, "openat"), Some(257));
        assert_eq!(
            syscall_number(Arch::Aarch64, "open"),
            None,
            "no open on arm64"
        );
        assert_eq!(syscall_name(Arch::X86_64, 100_000), None);
        assert_eq!(syscall_number(Arch::X86_64, "nope"), None);
        let table = syscall_table(Arch::X86_64);
        assert!(table.len() > 300);
        assert!(table.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn names_and_numbers_of_32_bit_processes() {
        let i386 = SyscallAbi::of(Arch::X86_64, true);
        assert_eq!(i386, SyscallAbi::I386);
        assert_eq!(syscall_name(i386, 4), Some("write"));
        assert_eq!(syscall_name(Arch::X86_64, 4), Some("stat"));
        assert_eq!(syscall_number(i386, "socketcall"), Some(102));
        let arm = SyscallAbi::of(Arch::Aarch64, true);
        assert_eq!(syscall_name(arm, 4), Some("write"));
        assert!(arm.is_32() && !SyscallAbi::from(Arch::Aarch64).is_32());
        // A 64-bit-only call selects nothing there; the rest still do.
        assert_eq!(syscall_number(i386, "newfstatat"), None);
        assert_eq!(resolve_known_syscalls(i386, ["newfstatat,write"]), [4]);
        assert!(resolve_syscall_filter(i386, ["newfstatat"]).is_err());
        assert!(resolve_known_syscalls(i386, ["%file"]).contains(&5)); // open
    }

    #[test]
    fn every_class_member_exists_somewhere() {
        for class in SyscallClass::ALL {
            for name in class.members() {
                let abis = [
                    SyscallAbi::X86_64,
                    SyscallAbi::Aarch64,
                    SyscallAbi::I386,
                    SyscallAbi::Arm,
                ];
                assert!(
                    abis.iter().any(|&abi| syscall_number(abi, name).is_some()),
                    "{class}: {name}"
                );
            }
            assert_eq!(SyscallClass::from_str(class.name()), Ok(class));
            assert!(!class.numbers(Arch::Aarch64).is_empty());
        }
    }

    #[test]
    fn filters_mix_names_and_classes() {
        let x = Arch::X86_64;
        assert_eq!(resolve_syscall_filter(x, ["write,read"]), Ok(vec![0, 1]));
        let net = resolve_syscall_filter(x, ["%network", "write"]).unwrap();
        assert!(net.contains(&1) && net.contains(&41), "{net:?}"); // write, socket
        assert_eq!(
            resolve_syscall_filter(x, ["net"]),
            resolve_syscall_filter(x, ["%network"])
        );
        assert_eq!(resolve_syscall_filter(x, [" ", ""]), Ok(vec![]));
        let err = resolve_syscall_filter(x, ["write,wirte"]).unwrap_err();
        assert_eq!(err.word, "wirte");
        assert!(err.to_string().contains("%file"));
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(2), Some("ENOENT"));
        assert_eq!(errno_name(9), Some("EBADF"));
        assert_eq!(errno_name(4000), None);
    }

    #[test]
    fn errors_are_small_negative_returns() {
        assert!(is_syscall_error(-2));
        assert!(is_syscall_error(-4095));
        assert!(!is_syscall_error(-4096), "an address, e.g. from mmap");
        assert!(!is_syscall_error(0));
        assert!(!is_syscall_error(7));
    }
}
