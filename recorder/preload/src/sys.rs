//! The C library functions and constants the sampler uses (glibc on
//! Linux, x86-64 and AArch64), declared by hand: see `Cargo.toml` for why
//! this crate has no dependencies. Every one of them is safe to call from
//! inside an allocator function: none takes a lock that an allocation
//! could be holding, except `pthread_getattr_np`, which the hooks call
//! only outside the program's own calls to it.

use core::ffi::{c_char, c_int, c_long, c_void};

/// `struct timespec`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Timespec {
    /// Seconds.
    pub tv_sec: i64,
    /// Nanoseconds.
    pub tv_nsec: i64,
}

/// `struct iovec`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Iovec {
    /// Start.
    pub base: *mut c_void,
    /// Bytes.
    pub len: usize,
}

/// `pthread_attr_t`: 56 bytes on x86-64, 64 on AArch64, 8-aligned.
#[repr(C, align(8))]
#[derive(Debug)]
pub struct PthreadAttr(pub [u8; 64]);

/// `RTLD_NEXT` (glibc).
pub const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
/// `CLOCK_MONOTONIC`.
pub const CLOCK_MONOTONIC: c_int = 1;
/// `PROT_READ`.
pub const PROT_READ: c_int = 1;
/// `PROT_WRITE`.
pub const PROT_WRITE: c_int = 2;
/// `MAP_SHARED`.
pub const MAP_SHARED: c_int = 1;
/// `MAP_PRIVATE`.
pub const MAP_PRIVATE: c_int = 2;
/// `MAP_ANONYMOUS` (x86-64 and AArch64).
pub const MAP_ANONYMOUS: c_int = 0x20;
/// `MAP_NORESERVE` (x86-64 and AArch64).
pub const MAP_NORESERVE: c_int = 0x4000;
/// `MAP_FAILED`.
pub const MAP_FAILED: *mut c_void = !0usize as *mut c_void;
/// `O_RDONLY`.
pub const O_RDONLY: c_int = 0;
/// `O_CLOEXEC` (x86-64 and AArch64).
pub const O_CLOEXEC: c_int = 0o2_000_000;
/// `ENOSYS`.
pub const ENOSYS: c_int = 38;
/// `ENOMEM`.
pub const ENOMEM: c_int = 12;

/// `SYS_gettid`.
#[cfg(target_arch = "x86_64")]
pub const SYS_GETTID: c_long = 186;
/// `SYS_gettid`.
#[cfg(target_arch = "aarch64")]
pub const SYS_GETTID: c_long = 178;

#[link(name = "c")]
extern "C" {
    /// The program's environment.
    pub static environ: *const *const c_char;
    pub fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    pub fn syscall(number: c_long, ...) -> c_long;
    pub fn getpid() -> c_int;
    pub fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    pub fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    pub fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    pub fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    pub fn pread(fd: c_int, buf: *mut c_void, n: usize, offset: i64) -> isize;
    pub fn close(fd: c_int) -> c_int;
    pub fn pthread_self() -> usize;
    pub fn pthread_attr_getstack(
        attr: *const PthreadAttr,
        addr: *mut *mut c_void,
        size: *mut usize,
    ) -> c_int;
    pub fn pthread_attr_destroy(attr: *mut PthreadAttr) -> c_int;
    pub fn process_vm_readv(
        pid: c_int,
        local: *const Iovec,
        local_count: usize,
        remote: *const Iovec,
        remote_count: usize,
        flags: usize,
    ) -> isize;
    /// The initial stack pointer of the main thread (the dynamic loader's).
    pub static __libc_stack_end: *const c_void;
    pub fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
    pub fn nanosleep(request: *const Timespec, remaining: *mut Timespec) -> c_int;
    pub fn __errno_location() -> *mut c_int;
    #[cfg(lrnprof_preload_exports)]
    pub fn abort() -> !;
}

/// `CLOCK_MONOTONIC` in nanoseconds (through the vDSO: no system call).
pub fn monotonic_ns() -> u64 {
    let mut ts = Timespec::default();
    // Safety: `ts` is a valid timespec to write.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // Safety: gettid takes no arguments and cannot fail.
    unsafe { syscall(SYS_GETTID) as u32 }
}

/// The calling process's id.
pub fn pid() -> u32 {
    // Safety: getpid cannot fail.
    unsafe { getpid() as u32 }
}

/// Sleep about `ns` nanoseconds.
pub fn sleep_ns(ns: u64) {
    let ts = Timespec {
        tv_sec: 0,
        tv_nsec: ns.min(999_999_999) as i64,
    };
    // Safety: valid timespec; an interrupted sleep is fine.
    unsafe { nanosleep(&ts, core::ptr::null_mut()) };
}

/// The calling thread's `errno`, to restore after work that may change it:
/// a successful `malloc` leaves `errno` alone.
pub fn errno() -> c_int {
    // Safety: the thread's errno location is always valid.
    unsafe { *__errno_location() }
}

/// Set the calling thread's `errno`.
pub fn set_errno(value: c_int) {
    // Safety: as above.
    unsafe { *__errno_location() = value };
}
