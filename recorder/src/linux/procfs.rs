//! Reading `/proc`: pure parsers with unit tests, and thin readers.

use std::path::PathBuf;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapsEntry {
    /// First address (AVMA).
    pub start: u64,
    /// One past the last address (AVMA).
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    /// Offset in the file of the byte mapped at `start`.
    pub offset: u64,
    pub inode: u64,
    /// Path or pseudo-name (`[vdso]`, `[stack]`); empty for anonymous memory.
    pub path: String,
}

/// Parse `/proc/PID/maps`; lines that do not parse are skipped.
pub(crate) fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    // address perms offset dev inode pathname; the path may contain spaces.
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start();
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field().as_bytes().to_vec();
    let offset = field();
    let _dev = field();
    let inode = field();
    let path = rest.trim_start().to_string();
    let (start, end) = range.split_once('-')?;
    if perms.len() < 3 {
        return None;
    }
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path,
    })
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `Z`, ...). The command
/// name in parentheses may contain anything, so look after the last `)`.
pub(crate) fn parse_stat_state(text: &str) -> Option<char> {
    let after = &text[text.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// A `Key:\tvalue` field of `/proc/PID/status`, first value only.
pub(crate) fn parse_status_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.split_whitespace().next().unwrap_or(""))
    })
}

/// `/proc/PID/cmdline`: NUL-separated arguments.
pub(crate) fn parse_cmdline(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// A kernel CPU list such as `0-3,8,10-11`; malformed parts are skipped.
pub(crate) fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let range = match part.split_once('-') {
            Some((a, b)) => a.parse::<u32>().ok().zip(b.parse::<u32>().ok()),
            None => part.parse::<u32>().ok().map(|a| (a, a)),
        };
        if let Some((a, b)) = range {
            // Bounded: no machine has more than this many CPUs.
            cpus.extend((a..=b).take(1 << 16));
        }
    }
    cpus
}

/// The online CPUs (all configured ones if the list is unreadable).
pub(crate) fn online_cpus(configured: usize) -> Vec<u32> {
    match std::fs::read_to_string("/sys/devices/system/cpu/online") {
        Ok(s) if !parse_cpu_list(&s).is_empty() => parse_cpu_list(&s),
        _ => (0..configured as u32).collect(),
    }
}

/// The number of threads running or ready to run on the machine now: the
/// fourth field of `/proc/loadavg` ("RUNNING/TOTAL").
pub(crate) fn parse_loadavg_running(text: &str) -> Option<u32> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// See [`parse_loadavg_running`].
pub(crate) fn running_threads() -> Option<u32> {
    parse_loadavg_running(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

/// Path of a file of process `pid` as seen from the host: through
/// `/proc/PID/root`, so files inside containers resolve.
pub(crate) fn root_path(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// Read a `/proc` file as text. A process's files may hold bytes that are
/// not UTF-8 (its name in `stat`, `status` and `comm`, paths in `maps`):
/// those become U+FFFD rather than making the read fail, which made a
/// running process look gone.
fn read_lossy(path: String) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Read `/proc/PID/maps` (through a thread still running once the main
/// one has ended, see [`other_live_thread`]).
pub(crate) fn read_maps(pid: u32) -> std::io::Result<Vec<MapsEntry>> {
    // A path that is not UTF-8 keeps U+FFFD in place of those bytes, and
    // its file is read through its mapping instead.
    let read = |id: u32| read_lossy(format!("/proc/{id}/maps"));
    let text = read(pid)?;
    // Every running process has mappings; kernel threads have none.
    let other = text.is_empty().then(|| other_live_thread(pid)).flatten();
    Ok(parse_maps(
        &other.and_then(|tid| read(tid).ok()).unwrap_or(text),
    ))
}

/// A thread of process `pid` other than the main one that has not ended,
/// if the main one has (`pthread_exit`) while others run. The process's
/// own files under `/proc/PID` (`maps`, `cmdline`, `exe`, `root`, `mem`)
/// are then empty or gone, but `/proc/TID` of a running thread serves
/// them. Asked only once a read of those files gave nothing.
pub(crate) fn other_live_thread(pid: u32) -> Option<u32> {
    let stat = read_lossy(format!("/proc/{pid}/stat")).ok()?;
    if parse_stat_state(&stat) != Some('Z') || stat_says_exited(&stat) {
        return None;
    }
    list_tasks(pid).ok()?.into_iter().find(|&tid| {
        tid != pid
            && read_lossy(format!("/proc/{pid}/task/{tid}/stat"))
                .is_ok_and(|s| !matches!(parse_stat_state(&s), Some('Z' | 'X') | None))
    })
}

/// The thread ids of process `pid`, sorted.
pub(crate) fn list_tasks(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// A thread's name, if it is still there.
pub(crate) fn thread_name(pid: u32, tid: u32) -> Option<String> {
    let s = read_lossy(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    Some(s.trim_end_matches('\n').to_string())
}

/// A process's argv, empty if unknown.
pub(crate) fn command_line(pid: u32) -> Vec<String> {
    let read = |id: u32| {
        std::fs::read(format!("/proc/{id}/cmdline"))
            .map(|b| parse_cmdline(&b))
            .unwrap_or_default()
    };
    let argv = read(pid);
    match argv.is_empty().then(|| other_live_thread(pid)).flatten() {
        Some(tid) => read(tid),
        None => argv,
    }
}

/// A process's executable path, if readable.
pub(crate) fn executable(pid: u32) -> Option<String> {
    let read = |id: u32| {
        std::fs::read_link(format!("/proc/{id}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    };
    read(pid).or_else(|| read(other_live_thread(pid)?))
}

/// A process's parent pid, if known.
pub(crate) fn parent_pid(pid: u32) -> Option<u32> {
    let s = read_lossy(format!("/proc/{pid}/status")).ok()?;
    parse_status_field(&s, "PPid")?.parse().ok()
}

/// The process a thread belongs to (its thread group), if known: the
/// thread's own id for a process's main thread.
pub(crate) fn thread_group(tid: u32) -> Option<u32> {
    let s = read_lossy(format!("/proc/{tid}/status")).ok()?;
    parse_status_field(&s, "Tgid")?.parse().ok()
}

/// The pid a process has in its own PID namespace (the last of
/// `NSpid`), if that is not `pid`: a process in a container knows itself
/// by it, and names its perf map after it.
pub(crate) fn namespaced_pid(pid: u32) -> Option<u32> {
    let s = read_lossy(format!("/proc/{pid}/status")).ok()?;
    parse_namespaced_pid(&s).filter(|&own| own != pid)
}

/// The last pid of the `NSpid` field of a `/proc/PID/status` text.
pub(crate) fn parse_namespaced_pid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix("NSpid:")?;
        v.split_whitespace().last()?.parse().ok()
    })
}

/// The real uid owning a process, if known.
pub(crate) fn owner_uid(pid: u32) -> Option<u32> {
    let s = read_lossy(format!("/proc/{pid}/status")).ok()?;
    parse_status_field(&s, "Uid")?.parse().ok()
}

/// Whether the process will not run again: gone, dead, or a zombie with
/// no thread left (see [`stat_says_exited`]).
pub(crate) fn has_exited(pid: u32) -> bool {
    match read_lossy(format!("/proc/{pid}/stat")) {
        Ok(s) => stat_says_exited(&s),
        Err(_) => true,
    }
}

/// Whether a `/proc/PID/stat` text is that of a process that will not run
/// again. A process whose main thread ended (`pthread_exit`) while others
/// run shows as a zombie too, but with more than one thread (field 20,
/// `num_threads`, counts the zombie leader).
pub(crate) fn stat_says_exited(text: &str) -> bool {
    match parse_stat_state(text) {
        Some('X') | None => true,
        Some('Z') => parse_stat_field(text, 20).is_none_or(|threads| threads <= 1),
        Some(_) => false,
    }
}

/// Numeric field `n` (counted from 1, as in proc(5): 9 `flags`, 20
/// `num_threads`) of a `/proc/PID/stat` text.
fn parse_stat_field(text: &str, n: usize) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    // The state is field 3, the first after the name.
    after
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// Whether a `/proc/PID/stat` text is that of a kernel thread
/// (`PF_KTHREAD` in its flags): it runs no user code.
pub(crate) fn stat_says_kernel_thread(text: &str) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    parse_stat_field(text, 9).is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// Whether process `pid` is a kernel thread (see
/// [`stat_says_kernel_thread`]); `false` if unknown.
pub(crate) fn is_kernel_thread(pid: u32) -> bool {
    read_lossy(format!("/proc/{pid}/stat")).is_ok_and(|s| stat_says_kernel_thread(&s))
}

/// Every process's pid, ascending (`/proc/[0-9]*`).
pub(crate) fn list_pids() -> std::io::Result<Vec<u32>> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// A process's cgroup (see [`parse_cgroup`]), if readable.
pub(crate) fn cgroup(pid: u32) -> Option<String> {
    let text = read_lossy(format!("/proc/{pid}/cgroup")).ok()?;
    parse_cgroup(&text)
}

/// The cgroup a `/proc/PID/cgroup` text puts its process in: the unified
/// hierarchy's path (`0::/system.slice/x.service`), or, where that is the
/// root and cgroup v1 controllers place the process deeper (a v1 or hybrid
/// host running containers), the first such controller's path.
pub(crate) fn parse_cgroup(text: &str) -> Option<String> {
    let mut unified = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" {
            unified = Some(path);
        } else if path != "/" && v1.is_none() {
            v1 = Some(path);
        }
    }
    match (unified, v1) {
        (Some(u), _) if u != "/" => Some(u.to_string()),
        (_, Some(v)) => Some(v.to_string()),
        (u, None) => u.map(str::to_string),
    }
}

/// A small integer from a `/proc/sys` file.
pub(crate) fn read_sysctl(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_threads_from_loadavg() {
        assert_eq!(
            parse_loadavg_running("0.52 0.58 0.59 3/467 12345\n"),
            Some(3)
        );
        assert_eq!(parse_loadavg_running("0.52 0.58 0.59"), None);
        assert_eq!(parse_loadavg_running("0.52 0.58 0.59 x/4 1"), None);
        assert!(running_threads().is_some_and(|n| n >= 1));
    }

    #[test]
    fn namespaced_pid_is_the_innermost() {
        let status = "Name:\tnode\nTgid:\t4242\nNSpid:\t4242\t7\nNSpgid:\t4242\t7\n";
        assert_eq!(parse_namespaced_pid(status), Some(7));
        assert_eq!(parse_namespaced_pid("NSpid:\t99\n"), Some(99));
        assert_eq!(parse_namespaced_pid("Name:\tx\n"), None);
    }

    #[test]
    fn cgroup_is_the_unified_path_or_the_deepest_v1_one() {
        assert_eq!(
            parse_cgroup("0::/system.slice/nginx.service\n").as_deref(),
            Some("/system.slice/nginx.service")
        );
        let hybrid = "9:name=systemd:/\n4:memory:/docker/abc123\n1:cpu:/\n0::/\n";
        assert_eq!(parse_cgroup(hybrid).as_deref(), Some("/docker/abc123"));
        assert_eq!(parse_cgroup("0::/\n").as_deref(), Some("/"));
        assert_eq!(parse_cgroup("garbage"), None);
    }

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234                       /usr/bin/my prog
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234                       /usr/bin/my prog
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7fff5a1d8000-7fff5a1f9000 rw-p 00000000 00:00 0                          [stack]
7fff5a1fc000-7fff5a1fe000 r-xp 00000000 00:00 0                          [vdso]
7f0000000000-7f0000001000 r-xp 00000000 fe:01 99                         /tmp/gone.so (deleted)
garbage line
";

    #[test]
    fn parses_maps_lines() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 6);
        assert_eq!(m[1].start, 0x55d0c0a01000);
        assert_eq!(m[1].end, 0x55d0c0a02000);
        assert!(m[1].exec && m[1].read && !m[1].write);
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(m[1].inode, 1234);
        assert_eq!(m[1].path, "/usr/bin/my prog");
        assert_eq!(m[2].path, "");
        assert_eq!(m[3].path, "[stack]");
        assert_eq!(m[4].path, "[vdso]");
        assert_eq!(m[5].path, "/tmp/gone.so (deleted)");
    }

    #[test]
    fn stat_state_survives_odd_names() {
        assert_eq!(parse_stat_state("42 (a) b) c) Z 1 2"), Some('Z'));
        assert_eq!(parse_stat_state("42 (sleep) S 1"), Some('S'));
        assert_eq!(parse_stat_state("nonsense"), None);
    }

    #[test]
    fn a_zombie_leader_with_threads_left_has_not_exited() {
        // Fields 3 to 20: state, ppid, pgrp, session, tty_nr, tpgid, flags,
        // minflt, cminflt, majflt, cmajflt, utime, stime, cutime, cstime,
        // priority, nice, num_threads.
        let stat = |state: char, threads: u32| {
            format!("42 (a (b) c) {state} 1 42 42 0 -1 4194560 90 0 0 0 7 3 0 0 20 0 {threads} 0 9")
        };
        assert!(!stat_says_exited(&stat('Z', 2)));
        assert!(stat_says_exited(&stat('Z', 1)));
        assert!(stat_says_exited(&stat('X', 1)));
        assert!(!stat_says_exited(&stat('R', 1)));
        assert!(stat_says_exited("42 (a) Z 1 2"));
        assert!(stat_says_exited("nonsense"));
    }

    #[test]
    fn kernel_threads_by_their_flags() {
        let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 1 0 0 20 0 1 0 9";
        let bash = "9827 (bash) S 1 9827 9827 0 -1 4194560 90 0 0 0 7 3 0 0 20 0 1 0 9";
        assert!(stat_says_kernel_thread(kthreadd));
        assert!(!stat_says_kernel_thread(bash));
        assert!(!stat_says_kernel_thread("2 (x) S"));
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tcat\nPPid:\t17\nUid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(parse_status_field(s, "PPid"), Some("17"));
        assert_eq!(parse_status_field(s, "Uid"), Some("1000"));
        assert_eq!(parse_status_field(s, "Gid"), None);
    }

    #[test]
    fn cmdline_splits_on_nul() {
        assert_eq!(parse_cmdline(b"./a\0--x\0y z\0"), ["./a", "--x", "y z"]);
        assert!(parse_cmdline(b"").is_empty());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("0"), [0]);
        assert_eq!(parse_cpu_list("x,2"), [2]);
    }

    #[test]
    fn root_path_goes_through_proc() {
        assert_eq!(
            root_path(7, "/usr/lib/libc.so.6"),
            PathBuf::from("/proc/7/root/usr/lib/libc.so.6")
        );
    }
}
