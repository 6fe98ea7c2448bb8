//! Tiny wrappers around the system calls the Linux backend needs. Each
//! `unsafe` block states why it is sound; everything else lives in pure
//! functions elsewhere.

use crate::error::RecordError;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// `struct perf_event_attr` up to `sig_data` (`PERF_ATTR_SIZE_VER7`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PerfEventAttr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    /// `sample_period`, or `sample_freq` when the `freq` flag is set.
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    /// The bit fields (`disabled`, `inherit`, ...): see `attr::flag`.
    pub flags: u64,
    /// `wakeup_events`, or `wakeup_watermark` when the `watermark` flag is set.
    pub wakeup: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved_2: u16,
    pub aux_sample_size: u32,
    pub reserved_3: u32,
    pub sig_data: u64,
}

/// `PERF_ATTR_SIZE_VER7`.
pub(crate) const PERF_ATTR_SIZE: u32 = 128;
const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == PERF_ATTR_SIZE as usize);

const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
/// `_IOW('$', 6, char *)`.
const PERF_EVENT_IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;
/// `_IOR('$', 7, __u64 *)`.
const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// `perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)`.
pub(crate) fn perf_event_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    // Safety: attr points to a valid, fully initialized perf_event_attr of
    // the size it declares; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn ioctl(fd: &OwnedFd, request: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // Safety: perf event ioctls take an integer argument and touch no memory.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Start sampling (also the copies inherited by threads created since).
pub(crate) fn perf_enable(fd: &OwnedFd) -> io::Result<()> {
    ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
}

/// Stop counting/sampling.
pub(crate) fn perf_disable(fd: &OwnedFd) -> io::Result<()> {
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
}

/// Send `fd`'s records to `target`'s ring buffer (same CPU).
pub(crate) fn perf_set_output(fd: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    ioctl(
        fd,
        PERF_EVENT_IOC_SET_OUTPUT,
        target.as_raw_fd() as libc::c_ulong,
    )
}

/// The id the kernel writes in `fd`'s samples (`PERF_SAMPLE_IDENTIFIER`),
/// also for the copies inherited by new threads.
pub(crate) fn perf_event_id(fd: &OwnedFd) -> io::Result<u64> {
    let mut id = 0u64;
    // Safety: PERF_EVENT_IOC_ID writes one u64 to the pointer given, which
    // points to a live u64.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ID as _, &mut id as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

/// Set a tracepoint event's filter (`id == 1 || id == 2`).
pub(crate) fn perf_set_filter(fd: &OwnedFd, filter: &CStr) -> io::Result<()> {
    // Safety: the kernel reads a NUL-terminated string from the pointer,
    // which points to a live CStr.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_FILTER as _,
            filter.as_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A perf ring buffer: one metadata page, then `data_size` bytes of data.
pub(crate) struct RingMap {
    base: *mut u8,
    len: usize,
    data_offset: usize,
    data_size: usize,
}

// Safety: the mapping is plain shared memory; access goes through &mut self
// or atomics.
unsafe impl Send for RingMap {}

/// Offsets in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

impl RingMap {
    /// Map `1 + data_pages` pages of `fd` (data_pages a power of two).
    pub fn new(fd: &OwnedFd, page_size: usize, data_pages: usize) -> io::Result<RingMap> {
        let len = page_size * (1 + data_pages);
        let base = map_shared(fd, len)?;
        let mut ring = RingMap {
            base,
            len,
            data_offset: page_size,
            data_size: page_size * data_pages,
        };
        // Kernels since 4.1 say where the data is; older ones use page 1.
        let offset = ring.meta(DATA_OFFSET).load(Ordering::Relaxed) as usize;
        let size = ring.meta(DATA_SIZE).load(Ordering::Relaxed) as usize;
        if size != 0 && offset + size <= len {
            ring.data_offset = offset;
            ring.data_size = size;
        }
        Ok(ring)
    }

    fn meta(&self, offset: usize) -> &AtomicU64 {
        // Safety: offsets are inside the first page, 8-aligned, and the
        // kernel updates these words atomically.
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    /// Bytes of the data area.
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// Bytes the kernel has written and not been released yet.
    pub fn pending(&self) -> usize {
        let head = self.meta(DATA_HEAD).load(Ordering::Acquire);
        let tail = self.meta(DATA_TAIL).load(Ordering::Relaxed);
        (head.saturating_sub(tail) as usize).min(self.data_size)
    }

    /// Call `each` with every complete record in the buffer, read in
    /// place (a record that wraps around the end is put together in
    /// `wrapped` first), giving each record's space back to the kernel as
    /// soon as `each` returns, so a caller that blocks in `each` (on a
    /// full channel to the writer) holds no ring space. Returns the bytes
    /// released.
    pub fn drain_records(&mut self, wrapped: &mut Vec<u8>, mut each: impl FnMut(&[u8])) -> usize {
        let head = self.meta(DATA_HEAD).load(Ordering::Acquire);
        let tail = self.meta(DATA_TAIL).load(Ordering::Relaxed);
        // Safety: the data area is mapped for data_size bytes and only the
        // kernel writes it, outside [tail, head) until we move the tail;
        // the tail moves past a record only after `each` is done with it.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.data_offset), self.data_size) };
        let release = self.meta(DATA_TAIL);
        let n = super::ring::for_each_record(data, tail, head, wrapped, |rec, done| {
            each(rec);
            release.store(tail + done as u64, Ordering::Release);
        });
        // What could not be split into records (a malformed header) is
        // given back too.
        release.store(head, Ordering::Release);
        n
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // Safety: unmaps exactly the mapping created in new().
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Wait until one of `fds` is readable or `timeout_ms` passes; returns the
/// indexes that are readable or hung up.
pub(crate) fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<(usize, bool)>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // Safety: pfds is a valid array of pollfd of the given length.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(Vec::new());
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, p)| (i, p.revents & libc::POLLHUP != 0))
        .collect())
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of every trace timestamp.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of this whole process (every thread), in nanoseconds.
pub(crate) fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Safety: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nice value of the recorder's threads when real-time scheduling is
/// not permitted.
const RECORDER_NICE: i32 = -10;

/// A thread's scheduling: policy, real-time priority and nice value.
#[derive(Clone, Copy)]
pub(crate) struct Scheduling {
    policy: i32,
    param: libc::sched_param,
    nice: i32,
}

impl Scheduling {
    /// The calling thread's; `None` if it cannot be read.
    pub fn of_this_thread() -> Option<Scheduling> {
        Scheduling::of_thread(0)
    }

    /// Thread `tid`'s (0: the calling thread); `None` if it cannot be read.
    pub fn of_thread(tid: i32) -> Option<Scheduling> {
        // Safety: the scheduling calls take plain integers and valid
        // sched_param structs; pid 0 means the calling thread on Linux.
        unsafe {
            let policy = libc::sched_getscheduler(tid);
            let mut param: libc::sched_param = std::mem::zeroed();
            libc::sched_getparam(tid, &mut param);
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            (policy >= 0 && *libc::__errno_location() == 0).then_some(Scheduling {
                policy,
                param,
                nice,
            })
        }
    }

    /// Not real-time.
    pub fn is_normal(&self) -> bool {
        self.policy != libc::SCHED_FIFO && self.policy != libc::SCHED_RR
    }

    /// The nice value.
    pub fn nice(&self) -> i32 {
        self.nice
    }

    /// The same policy, priority and nice value.
    #[cfg(test)]
    pub fn same_as(&self, other: &Scheduling) -> bool {
        (self.policy, self.param.sched_priority, self.nice)
            == (other.policy, other.param.sched_priority, other.nice)
    }

    /// Give it to thread `tid` of this process (Linux schedules threads
    /// one by one). Lowering a thread's priority is always permitted.
    pub fn apply(&self, tid: i32) {
        // Safety: plain integers and a valid sched_param.
        unsafe {
            libc::sched_setscheduler(tid, self.policy, &self.param);
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, self.nice);
        }
    }
}

/// Favour thread `tid` of this process, whose nice value is `nice`,
/// over the target's threads: real-time (SCHED_FIFO, lowest priority)
/// where permitted, else nice -10. Whether either was permitted.
pub(crate) fn raise_thread(tid: i32, nice: i32) -> bool {
    // Safety: plain integers and a valid sched_param.
    unsafe {
        let fifo = libc::sched_param { sched_priority: 1 };
        if libc::sched_setscheduler(tid, libc::SCHED_FIFO, &fifo) == 0 {
            return true;
        }
        nice > RECORDER_NICE
            && libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, RECORDER_NICE) == 0
    }
}

/// The calling thread's id.
pub(crate) fn thread_id() -> i32 {
    // Safety: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Put the calling thread back to normal scheduling (threads inherit the
/// policy of the thread that created them).
pub(crate) fn normal_thread_priority() {
    // Safety: as above.
    unsafe {
        let param: libc::sched_param = std::mem::zeroed();
        libc::sched_setscheduler(0, libc::SCHED_OTHER, &param);
        libc::setpriority(libc::PRIO_PROCESS, 0, 0);
    }
}

/// The number of configured CPUs.
pub(crate) fn cpu_count() -> usize {
    // Safety: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as usize
}

/// `kill(pid, signal)`.
pub(crate) fn kill(pid: u32, signal: i32) -> io::Result<()> {
    // Safety: kill has no memory preconditions.
    if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reap `pid` if it has exited: `Some(raw wait status)`, `None` while it runs.
pub(crate) fn try_wait(pid: u32) -> io::Result<Option<i32>> {
    let mut status = 0;
    // Safety: status is a valid int to write to.
    let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    match rc {
        0 => Ok(None),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Ok(Some(status)),
    }
}

/// Block until `pid` exits; its raw wait status.
pub(crate) fn wait(pid: u32) -> io::Result<i32> {
    loop {
        let mut status = 0;
        // Safety: status is a valid int to write to.
        let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if rc >= 0 {
            return Ok(status);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A pipe whose ends are closed on exec.
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), RecordError> {
    let mut fds = [0; 2];
    // Safety: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(RecordError::last_os("pipe2"));
    }
    // Safety: pipe2 returned two new descriptors that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Our effective user id.
pub(crate) fn geteuid() -> u32 {
    // Safety: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A non-blocking eventfd, to wake a `poll` from another thread.
pub(crate) fn eventfd() -> Result<OwnedFd, RecordError> {
    // Safety: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(RecordError::last_os("eventfd"));
    }
    // Safety: eventfd returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A descriptor of process `pid` that polls readable once every thread of
/// it has ended (Linux 5.3 and later).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // Safety: pidfd_open takes no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: pidfd_open returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Make an [`eventfd`] readable. Never blocks (the counter cannot
/// overflow from one increment per request).
pub(crate) fn eventfd_add(fd: &OwnedFd) {
    let one = 1u64;
    // Safety: writes the 8 bytes of a live u64.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Make an [`eventfd`] unreadable again.
pub(crate) fn eventfd_reset(fd: &OwnedFd) {
    let mut count = 0u64;
    // Safety: reads at most 8 bytes into a live u64; non-blocking.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

/// Fork; in the child wait for one byte on `go`, then `execv(path, argv)`.
/// On exec failure the child writes its errno to `status` and exits 127.
/// Everything the child touches is prepared before the fork, so it makes
/// only async-signal-safe calls.
pub(crate) fn fork_exec_when_told(
    path: &CStr,
    argv: &[*const libc::c_char],
    go: (&OwnedFd, &OwnedFd),
    status: (&OwnedFd, &OwnedFd),
    child: &ChildSetup,
) -> Result<u32, RecordError> {
    let (go_read, go_write) = (go.0.as_raw_fd(), go.1.as_raw_fd());
    let (status_read, status_write) = (status.0.as_raw_fd(), status.1.as_raw_fd());
    let envp = child.envp.as_ref().map(|e| e.as_ptr());
    // Safety: the child only calls close, read, fcntl, execv(e), write and
    // _exit, which are async-signal-safe, on memory prepared before the fork.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(RecordError::last_os("fork"));
        }
        if pid == 0 {
            libc::close(go_write);
            libc::close(status_read);
            let mut byte = 0u8;
            let n = libc::read(go_read, (&mut byte as *mut u8).cast(), 1);
            if n != 1 {
                libc::_exit(127);
            }
            if let Some(fd) = child.inherit_fd {
                libc::fcntl(fd, libc::F_SETFD, 0);
            }
            match envp {
                Some(envp) => libc::execve(path.as_ptr(), argv.as_ptr(), envp),
                None => libc::execv(path.as_ptr(), argv.as_ptr()),
            };
            let errno = *libc::__errno_location();
            libc::write(status_write, (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
        Ok(pid as u32)
    }
}

/// What a launched command gets besides its arguments, prepared before the
/// fork (the child may not allocate).
#[derive(Debug, Default)]
pub(crate) struct ChildSetup {
    /// Its whole environment, NULL-terminated; `None`: the recorder's.
    pub envp: Option<Vec<*const libc::c_char>>,
    /// Keeps `envp`'s strings alive.
    pub env_strings: Vec<std::ffi::CString>,
    /// A descriptor of the recorder (opened close-on-exec) the command
    /// inherits.
    pub inherit_fd: Option<RawFd>,
}

/// A memory file of `len` bytes, close-on-exec, at descriptor 100 or above
/// where the open-file limit allows, out of the way of the descriptors
/// programs expect to find free.
pub(crate) fn memfd(name: &CStr, len: usize) -> io::Result<OwnedFd> {
    // Safety: a valid name; the kernel returns a new descriptor.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: we own the new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Safety: resizing our own memory file.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // Safety: duplicating our descriptor; the copy is ours.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
    if high < 0 {
        return Ok(fd);
    }
    // Safety: a new descriptor we own (the low one closes on drop).
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Map `len` bytes of `fd` from its start, shared and writable.
fn map_shared(fd: &OwnedFd, len: usize) -> io::Result<*mut u8> {
    // Safety: a fresh shared mapping placed by the kernel, which checks
    // the length against the file; the caller owns and unmaps it.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ptr.cast())
}

/// A shared, writable mapping of a whole file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// Safety: plain shared memory; users access it through atomics or space
// they own.
unsafe impl Send for SharedMap {}

impl SharedMap {
    /// Map `len` bytes of `fd` from its start.
    pub fn new(fd: &OwnedFd, len: usize) -> io::Result<SharedMap> {
        Ok(SharedMap {
            ptr: map_shared(fd, len)?,
            len,
        })
    }

    /// Its first byte (page-aligned).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // Safety: our own mapping, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Read up to `buf.len()` bytes of another process's memory at `addr`.
pub(crate) fn read_process_memory(pid: u32, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, addr)?;
    Ok(buf)
}

/// Read one byte at each address of `addrs` from process `pid` with
/// `process_vm_readv`, which only reads: the target's memory is never
/// written. Pages not yet present in the target are faulted in for
/// reading (an untouched anonymous page becomes the shared zero page).
/// Returns how many addresses were read before the first that could not be.
pub(crate) fn read_one_byte_each(pid: u32, addrs: &[u64]) -> io::Result<usize> {
    if addrs.is_empty() {
        return Ok(0);
    }
    let mut buf = vec![0u8; addrs.len()];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote: Vec<libc::iovec> = addrs
        .iter()
        .map(|&a| libc::iovec {
            iov_base: a as usize as *mut libc::c_void,
            iov_len: 1,
        })
        .collect();
    // Safety: `local` describes `buf`, which lives until the call returns;
    // the remote iovecs are addresses in the other process, which the
    // kernel checks and never dereferences in ours.
    let n = unsafe {
        libc::process_vm_readv(
            pid as libc::pid_t,
            &local,
            1,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
