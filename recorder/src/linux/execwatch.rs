//! Command lines of processes read the moment they exec.
//!
//! The kernel's perf records say that a process exec'd and its new name,
//! not its command line; the recorder reads that from `/proc/PID/cmdline`
//! when the writer handles the exec, tens of milliseconds later, when a
//! short-lived program (a compiler run by a build, a shell pipeline's
//! stages) has often exited. The kernel's process events connector
//! (netlink, `NETLINK_CONNECTOR` / `CN_IDX_PROC`) tells a listener of every
//! exec as it happens: a thread here reads the command line and executable
//! then, and the converter takes them when it handles the matching perf
//! record (same process, nearest time: both carry `CLOCK_MONOTONIC`).
//!
//! The connector tells of every process on the machine; when one process
//! tree is recorded, the thread follows that tree through the fork and
//! exit events and reads only its processes' command lines.
//!
//! Listening needs `CAP_NET_ADMIN` (root); without it, or on a kernel
//! without the connector, nothing is heard and the converter reads `/proc`
//! itself as before.

use super::{procfs, sys};
use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// `NETLINK_CONNECTOR`.
const NETLINK_CONNECTOR: i32 = 11;
/// The process events connector's index and value (`CN_IDX_PROC`,
/// `CN_VAL_PROC`); also the multicast group to join.
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
/// `PROC_CN_MCAST_LISTEN`.
const PROC_CN_MCAST_LISTEN: u32 = 1;
/// `PROC_EVENT_FORK`, `PROC_EVENT_EXEC`, `PROC_EVENT_EXIT`.
const PROC_EVENT_FORK: u32 = 1;
const PROC_EVENT_EXEC: u32 = 2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `NLMSG_DONE`, the type of every connector message.
const NLMSG_DONE: u16 = 3;
/// Bytes of `struct nlmsghdr` and `struct cn_msg`.
const NLMSG_HDR: usize = 16;
const CN_MSG_HDR: usize = 20;

/// Execs remembered at most until the converter takes them.
const MAX_PENDING: usize = 8192;
/// An exec heard this long (ns) before the newest is forgotten: its perf
/// record has been handled, or never will be (another process's exec, in
/// a recording of one process tree).
const MAX_AGE_NS: u64 = 10_000_000_000;
/// A heard exec and a perf exec record of the same process belong
/// together when their times differ by less than this (ns).
const MATCH_WINDOW_NS: u64 = 100_000_000;

/// One exec, as read when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExecSeen {
    /// The process.
    pub pid: u32,
    /// When (`CLOCK_MONOTONIC` ns, the kernel's event time).
    pub time: u64,
    /// Its command line; empty if it could not be read.
    pub command: Vec<String>,
    /// Its executable, if readable.
    pub executable: Option<String>,
}

/// Execs heard and not taken yet, oldest first.
#[derive(Debug, Default)]
struct Heard {
    execs: VecDeque<ExecSeen>,
}

impl Heard {
    fn push(&mut self, seen: ExecSeen) {
        let newest = seen.time;
        while self.execs.len() >= MAX_PENDING
            || self
                .execs
                .front()
                .is_some_and(|e| newest.saturating_sub(e.time) > MAX_AGE_NS)
        {
            self.execs.pop_front();
        }
        self.execs.push_back(seen);
    }

    /// The exec of `pid` nearest `time`, within the window; it and the
    /// older execs of `pid` are forgotten.
    fn take(&mut self, pid: u32, time: u64) -> Option<ExecSeen> {
        let (index, _) = self
            .execs
            .iter()
            .enumerate()
            .filter(|(_, e)| e.pid == pid && e.time.abs_diff(time) < MATCH_WINDOW_NS)
            .min_by_key(|(_, e)| e.time.abs_diff(time))?;
        let found = self.execs.remove(index)?;
        self.execs.retain(|e| e.pid != pid || e.time > found.time);
        Some(found)
    }
}

/// Listens to the kernel's exec events on its own thread until dropped.
pub(crate) struct ExecWatch {
    heard: Arc<Mutex<Heard>>,
    /// Readable once the thread is to stop: it waits on this and the
    /// socket, so that a recording ends without waiting for a timeout.
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl ExecWatch {
    /// Subscribe to the kernel's process events and start listening, to
    /// the process tree of `root` (its descendants from now on), or to
    /// every process with `None`. Fails when the connector is missing or
    /// the socket cannot be made; a subscription the kernel refuses for
    /// want of `CAP_NET_ADMIN` starts too, and hears nothing.
    pub fn start(root: Option<u32>) -> io::Result<ExecWatch> {
        let socket = subscribe(root.is_some())?;
        let scope = Scope::new(root);
        let heard = Arc::new(Mutex::new(Heard::default()));
        let stop = Arc::new(sys::eventfd().map_err(|e| io::Error::other(e.to_string()))?);
        let thread = {
            let heard = Arc::clone(&heard);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("lrnprof-execs".into())
                .spawn(move || listen(&socket, scope, &heard, &stop))?
        };
        Ok(ExecWatch {
            heard,
            stop,
            thread: Some(thread),
        })
    }

    /// What was read when `pid` exec'd at about `time`, if it was heard.
    pub fn take(&self, pid: u32, time: u64) -> Option<ExecSeen> {
        self.heard.lock().ok()?.take(pid, time)
    }
}

impl Drop for ExecWatch {
    fn drop(&mut self) {
        sys::eventfd_add(&self.stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A netlink connector socket subscribed to process events, with the
/// kernel dropping those the watch would ignore (see [`event_filter`]):
/// `tree` says whether a process tree is followed.
fn subscribe(tree: bool) -> io::Result<OwnedFd> {
    // Safety: plain socket creation; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: fd is a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // Safety: sockaddr_nl is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = CN_IDX_PROC;
    // Safety: addr is a valid sockaddr_nl of the given length.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // Bursts of execs (a build starting) must not overflow the socket; a
    // smaller buffer only loses more of them (they fall back to /proc).
    let buffer: libc::c_int = 4 << 20;
    // Safety: buffer is a live c_int of the given length.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&buffer as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    // Without the filter (a kernel that refuses it) every event comes up
    // and is ignored here instead.
    let mut filter = event_filter(tree);
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // Safety: program points at filter, live for the call; the kernel
    // copies it.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&program as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    let message = listen_message();
    // Safety: message is a live buffer of its length.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// The netlink message that subscribes to process events:
/// `nlmsghdr`, `cn_msg` and the `PROC_CN_MCAST_LISTEN` operation.
fn listen_message() -> Vec<u8> {
    let payload = PROC_CN_MCAST_LISTEN.to_ne_bytes();
    let total = NLMSG_HDR + CN_MSG_HDR + payload.len();
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&NLMSG_DONE.to_ne_bytes()); // nlmsg_type
    m.extend_from_slice(&0u16.to_ne_bytes()); // nlmsg_flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_seq
    m.extend_from_slice(&std::process::id().to_ne_bytes()); // nlmsg_pid
    m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes()); // cn_msg.id.idx
    m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes()); // cn_msg.id.val
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // ack
    m.extend_from_slice(&(payload.len() as u16).to_ne_bytes()); // len
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&payload);
    m
}

/// A classic BPF socket filter that passes only the events the watch
/// uses: execs; with a `tree` to follow, also forks that make a process
/// (not a thread) and exits of a whole process (not of one thread). The
/// connector tells of every process and thread on the machine, and on a
/// busy one (a build running) waking for each event the watch ignores
/// cost the recorder more than the events it uses.
fn event_filter(tree: bool) -> Vec<libc::sock_filter> {
    // The filter reads words big-endian; the connector writes them in the
    // machine's order.
    let word = |v: u32| u32::from_be_bytes(v.to_ne_bytes());
    let at = |offset: usize| (NLMSG_HDR + CN_MSG_HDR + offset) as u32;
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let load = |offset: usize| op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, at(offset));
    let jeq = |k: u32, jt: u8, jf: u8| op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, jt, jf, k);
    let jeq_x = |jt: u8, jf: u8| op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_X, jt, jf, 0);
    let tax = op(libc::BPF_MISC | libc::BPF_TAX, 0, 0, 0);
    let accept = op(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX);
    let drop = op(libc::BPF_RET | libc::BPF_K, 0, 0, 0);
    // proc_event: what at 0, then the event's data at 16 (see
    // `parse_event`).
    if !tree {
        return vec![load(0), jeq(word(PROC_EVENT_EXEC), 0, 1), accept, drop];
    }
    vec![
        /* 0 */ load(0),
        /* 1 */ jeq(word(PROC_EVENT_EXEC), 10, 0),
        /* 2 */ jeq(word(PROC_EVENT_FORK), 1, 0),
        /* 3 */ jeq(word(PROC_EVENT_EXIT), 4, 9),
        // A fork: child_pid == child_tgid.
        /* 4 */ load(16 + 12),
        /* 5 */ tax,
        /* 6 */ load(16 + 8),
        /* 7 */ jeq_x(4, 5),
        // An exit: process_pid == process_tgid.
        /* 8 */ load(16 + 4),
        /* 9 */ tax,
        /* 10 */ load(16),
        /* 11 */ jeq_x(0, 1),
        /* 12 */ accept,
        /* 13 */ drop,
    ]
}

/// What the kernel told, as far as the watch cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Process `parent` made `child` (a process or, with the same id, a
    /// thread).
    Fork { parent: u32, child: u32 },
    /// Process `pid` exec'd at `time` (`CLOCK_MONOTONIC` ns).
    Exec { pid: u32, time: u64 },
    /// Thread `tid` of process `pid` exited.
    Exit { pid: u32, tid: u32 },
}

/// The event in one received datagram (`nlmsghdr`, `cn_msg`,
/// `proc_event`); `None` for other events and anything malformed.
fn parse_event(datagram: &[u8]) -> Option<Event> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(
            datagram.get(at..at + 4)?.try_into().ok()?,
        ))
    };
    let event = NLMSG_HDR + CN_MSG_HDR;
    // proc_event: what (u32), cpu (u32), timestamp_ns (u64), then the
    // event's data: for fork parent_pid, parent_tgid, child_pid,
    // child_tgid; for exec and exit process_pid (the thread),
    // process_tgid (the process), ...
    let data = event + 16;
    match u32_at(event)? {
        PROC_EVENT_FORK => Some(Event::Fork {
            parent: u32_at(data + 4)?,
            child: u32_at(data + 12)?,
        }),
        PROC_EVENT_EXEC => Some(Event::Exec {
            pid: u32_at(data + 4)?,
            time: u64::from_ne_bytes(datagram.get(event + 8..event + 16)?.try_into().ok()?),
        }),
        PROC_EVENT_EXIT => Some(Event::Exit {
            pid: u32_at(data + 4)?,
            tid: u32_at(data)?,
        }),
        _ => None,
    }
}

/// The processes whose execs are read.
#[derive(Debug)]
struct Scope {
    /// `None`: all of them.
    tree: Option<HashSet<u32>>,
}

impl Scope {
    fn new(root: Option<u32>) -> Scope {
        Scope {
            tree: root.map(|r| HashSet::from([r])),
        }
    }

    /// Follow `event`; whether it is an exec to read.
    fn follow(&mut self, event: Event) -> bool {
        let Some(tree) = &mut self.tree else {
            return matches!(event, Event::Exec { .. });
        };
        match event {
            Event::Fork { parent, child } => {
                if tree.contains(&parent) {
                    tree.insert(child);
                }
                false
            }
            Event::Exec { pid, .. } => tree.contains(&pid),
            Event::Exit { pid, tid } => {
                if pid == tid {
                    tree.remove(&pid);
                }
                false
            }
        }
    }
}

/// Datagrams received at most between two checks for the stop.
const MAX_BATCH: usize = 64;

/// Receive events until `stop` is readable; read the command line of
/// each exec.
fn listen(socket: &OwnedFd, mut scope: Scope, heard: &Mutex<Heard>, stop: &OwnedFd) {
    let mut buf = vec![0u8; 4096];
    let fds = [socket.as_raw_fd(), stop.as_raw_fd()];
    loop {
        match sys::poll_readable(&fds, -1) {
            Ok(ready) if ready.iter().any(|&(i, _)| i == 1) => return,
            Ok(_) => {}
            Err(_) => return,
        }
        // Every event queued (a burst when a build starts), then poll
        // again: one wake-up for them all.
        for _ in 0..MAX_BATCH {
            // Safety: buf is a live buffer of its length.
            let n = unsafe {
                libc::recv(
                    socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // Nothing more for now.
                    Some(libc::EAGAIN) => break,
                    // Interrupted, or events dropped in a burst (those
                    // execs fall back to /proc later).
                    Some(libc::EINTR | libc::ENOBUFS) => continue,
                    _ => return,
                }
            }
            if hear(&buf[..n as usize], &mut scope, heard).is_err() {
                return;
            }
        }
    }
}

/// Follow the event in `datagram`; of an exec to read, read the command
/// line and executable into `heard` (`Err` if its lock is poisoned).
fn hear(datagram: &[u8], scope: &mut Scope, heard: &Mutex<Heard>) -> Result<(), ()> {
    let Some(event) = parse_event(datagram) else {
        return Ok(());
    };
    let (true, Event::Exec { pid, time }) = (scope.follow(event), event) else {
        return Ok(());
    };
    let seen = ExecSeen {
        pid,
        time,
        command: procfs::command_line(pid),
        executable: procfs::executable(pid),
    };
    heard.lock().map_err(|_| ())?.push(seen);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pid: u32, time: u64, arg: &str) -> ExecSeen {
        ExecSeen {
            pid,
            time,
            command: vec![arg.into()],
            executable: None,
        }
    }

    #[test]
    fn execs_are_matched_by_process_and_nearest_time() {
        let mut h = Heard::default();
        // A shell that execs twice in a row, and another process.
        h.push(seen(7, 1_000_000, "sh"));
        h.push(seen(8, 1_500_000, "other"));
        h.push(seen(7, 2_000_000, "cc"));
        assert_eq!(h.take(7, 2_000_100).unwrap().command, ["cc"]);
        // The earlier exec of 7 went with it (its record came first or
        // never will); 8 stays.
        assert_eq!(h.take(7, 1_000_000), None);
        assert_eq!(h.take(8, 1_400_000).unwrap().command, ["other"]);
        // Too far apart in time: not the same exec.
        h.push(seen(9, 1_000_000, "x"));
        assert_eq!(h.take(9, 1_000_000 + MATCH_WINDOW_NS), None);
    }

    #[test]
    fn old_and_excess_execs_are_forgotten() {
        let mut h = Heard::default();
        h.push(seen(1, 0, "old"));
        h.push(seen(2, MAX_AGE_NS + 1, "new"));
        assert_eq!(h.execs.len(), 1);
        for i in 0..MAX_PENDING as u64 + 10 {
            h.push(seen(3, MAX_AGE_NS + 2 + i, "many"));
        }
        assert_eq!(h.execs.len(), MAX_PENDING);
    }

    /// A datagram holding the event `what` with data words `data`.
    fn datagram(what: u32, time: u64, data: &[u32]) -> Vec<u8> {
        let mut d = vec![0u8; NLMSG_HDR + CN_MSG_HDR];
        d.extend_from_slice(&what.to_ne_bytes());
        d.extend_from_slice(&1u32.to_ne_bytes()); // cpu
        d.extend_from_slice(&time.to_ne_bytes());
        for w in data {
            d.extend_from_slice(&w.to_ne_bytes());
        }
        d
    }

    /// Run `filter` on `packet` as the kernel does, for the instructions
    /// `event_filter` uses: whether the packet is passed.
    fn passes(filter: &[libc::sock_filter], packet: &[u8]) -> bool {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        loop {
            let i = filter[pc];
            pc += 1;
            match u32::from(i.code) {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let k = i.k as usize;
                    let Some(w) = packet.get(k..k + 4) else {
                        return false;
                    };
                    a = u32::from_be_bytes(w.try_into().unwrap());
                }
                c if c == libc::BPF_MISC | libc::BPF_TAX => x = a,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf });
                }
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_X => {
                    pc += usize::from(if a == x { i.jt } else { i.jf });
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k != 0,
                c => panic!("instruction {c:#x} not run here"),
            }
        }
    }

    /// The kernel passes what the watch uses and drops the rest: a thread
    /// made or gone, another kind of event, a packet cut short.
    #[test]
    fn the_kernel_drops_events_the_watch_ignores() {
        let tree = event_filter(true);
        let all = event_filter(false);
        let exec = datagram(PROC_EVENT_EXEC, 1, &[4001, 4000]);
        let process_fork = datagram(PROC_EVENT_FORK, 1, &[10, 10, 11, 11]);
        // A process's thread forking a process: still a process.
        let fork_by_thread = datagram(PROC_EVENT_FORK, 1, &[12, 10, 13, 13]);
        let thread_made = datagram(PROC_EVENT_FORK, 1, &[10, 10, 14, 10]);
        let process_exit = datagram(PROC_EVENT_EXIT, 1, &[11, 11, 0, 0]);
        let thread_exit = datagram(PROC_EVENT_EXIT, 1, &[14, 10, 0, 0]);
        let uid_change = datagram(4, 1, &[1, 1, 0, 0]);
        for (packet, by_tree, by_all) in [
            (&exec, true, true),
            (&process_fork, true, false),
            (&fork_by_thread, true, false),
            (&thread_made, false, false),
            (&process_exit, true, false),
            (&thread_exit, false, false),
            (&uid_change, false, false),
        ] {
            let event = parse_event(packet);
            assert_eq!(passes(&tree, packet), by_tree, "{event:?}");
            assert_eq!(passes(&all, packet), by_all, "{event:?}");
        }
        assert!(!passes(&tree, &exec[..NLMSG_HDR + CN_MSG_HDR + 2]));
        assert!(!passes(&tree, &process_fork[..process_fork.len() - 2]));
        // What passes is what the watch follows: a thread's fork or exit
        // changes no tree.
        let mut scope = Scope::new(Some(10));
        for p in [&thread_made, &thread_exit] {
            let before = scope.tree.clone();
            scope.follow(parse_event(p).unwrap());
            assert_eq!(scope.tree, before);
        }
    }

    #[test]
    fn events_are_parsed_and_others_ignored() {
        let exec = datagram(PROC_EVENT_EXEC, 123_456, &[4001, 4000]);
        assert_eq!(
            parse_event(&exec),
            Some(Event::Exec {
                pid: 4000,
                time: 123_456
            })
        );
        // Cut short: nothing.
        assert_eq!(parse_event(&exec[..exec.len() - 2]), None);
        let fork = datagram(PROC_EVENT_FORK, 1, &[10, 10, 11, 11]);
        assert_eq!(
            parse_event(&fork),
            Some(Event::Fork {
                parent: 10,
                child: 11
            })
        );
        let exit = datagram(PROC_EVENT_EXIT, 1, &[12, 11, 0, 0]);
        assert_eq!(parse_event(&exit), Some(Event::Exit { pid: 11, tid: 12 }));
        // A uid change (what = 4).
        assert_eq!(parse_event(&datagram(4, 1, &[1, 1, 0, 0])), None);
        // The subscription message is one whole nlmsghdr + cn_msg + op.
        let m = listen_message();
        assert_eq!(m.len(), NLMSG_HDR + CN_MSG_HDR + 4);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
    }

    #[test]
    fn a_process_tree_is_followed_through_forks_and_exits() {
        let exec = |pid| Event::Exec { pid, time: 0 };
        let mut all = Scope::new(None);
        assert!(all.follow(exec(99)));
        let mut tree = Scope::new(Some(10));
        assert!(tree.follow(exec(10)));
        assert!(!tree.follow(exec(20)), "not in the tree");
        tree.follow(Event::Fork {
            parent: 10,
            child: 11,
        });
        tree.follow(Event::Fork {
            parent: 11,
            child: 12,
        });
        tree.follow(Event::Fork {
            parent: 20,
            child: 21,
        });
        assert!(tree.follow(exec(12)), "a grandchild");
        assert!(!tree.follow(exec(21)));
        // A thread of 12 exits: 12 stays; then 12 itself.
        tree.follow(Event::Exit { pid: 12, tid: 13 });
        assert!(tree.follow(exec(12)));
        tree.follow(Event::Exit { pid: 12, tid: 12 });
        assert!(!tree.follow(exec(12)), "gone, its pid may be reused");
    }

    #[test]
    fn a_watch_that_hears_nothing_stops_when_dropped() {
        // Nothing waits for an event or a timeout to stop: dropping the
        // watch of a tree that never execs returns once its thread has
        // seen the stop.
        let Ok(watch) = ExecWatch::start(Some(u32::MAX)) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs on Linux with the process events connector"
            );
            return;
        };
        assert!(watch.thread.as_ref().is_some_and(|t| !t.is_finished()));
        let (done, dropped) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(watch);
            let _ = done.send(());
        });
        assert!(
            dropped
                .recv_timeout(std::time::Duration::from_secs(60))
                .is_ok(),
            "the watch's thread did not stop within 60 s of the drop"
        );
    }

    /// Whether this test can listen to process events (root); under CI
    /// it must.
    fn can_listen() -> bool {
        // Safety: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // The kernel sends process events to CAP_NET_ADMIN only.
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: process events must be heard"
            );
            return false;
        }
        true
    }

    /// The first exec heard whose command line has `marker`, waiting up
    /// to 60 s for it.
    fn heard_with(watch: &ExecWatch, marker: &str) -> Option<ExecSeen> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let heard = watch.heard.lock().unwrap();
            if let Some(seen) = heard
                .execs
                .iter()
                .find(|e| e.command.iter().any(|a| a == marker))
            {
                return Some(seen.clone());
            }
            drop(heard);
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Listening to our own tree, run `sh` with `args` as our child, its
    /// stdin a pipe that it (or its child) waits on so that command lines
    /// stay readable until heard; the first exec heard with `marker`, and
    /// the child's pid.
    fn hear_from_shell(args: &[&str], marker: &str) -> (ExecWatch, u32, ExecSeen) {
        let watch =
            ExecWatch::start(Some(std::process::id())).expect("subscribing to process events");
        let mut child = std::process::Command::new("sh")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let found = heard_with(&watch, marker);
        drop(child.stdin.take());
        let _ = child.wait();
        let seen = found.unwrap_or_else(|| panic!("no exec with {marker} heard within 60 s"));
        (watch, child.id(), seen)
    }

    #[test]
    fn an_exec_is_heard_with_its_command_line_before_the_program_exits() {
        if !can_listen() {
            return;
        }
        // The child itself execs.
        let (watch, pid, seen) = hear_from_shell(
            &[
                "-c",
                "read line; exit 0",
                "lrnprof-execwatch-test",
                "marker-arg",
            ],
            "marker-arg",
        );
        assert_eq!(seen.pid, pid);
        // The executable is the shell's (sh is a link to it).
        assert!(seen.executable.is_some(), "{seen:?}");
        // The converter finds it by process and time.
        assert_eq!(watch.take(pid, seen.time + 1_000), Some(seen));
    }

    /// A grandchild's exec is heard: the fork that made it (by the child,
    /// not by us) passes the kernel-side filter and the tree follows it.
    #[test]
    fn a_grandchild_exec_is_heard_through_the_childs_fork() {
        if !can_listen() {
            return;
        }
        // The `; exit 0` keeps the child from exec'ing its last command in
        // place: it forks the grandchild, which execs.
        let (_watch, pid, seen) = hear_from_shell(
            &[
                "-c",
                "sh -c 'read line; exit 0' grandchild-marker; exit 0",
                "lrnprof-execwatch-test",
            ],
            "grandchild-marker",
        );
        assert_ne!(seen.pid, pid, "{seen:?}");
    }
}
