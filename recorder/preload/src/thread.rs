//! Per-thread state, and the registers a sampled allocation starts its
//! stack from.
//!
//! The state lives in thread-local storage of the initial-exec model:
//! one load from the thread pointer's segment and an offset in the GOT.
//! Rust's own thread locals would go through `__tls_get_addr` in a shared
//! library, which after a `dlopen` of a library with thread locals may
//! call `malloc` to grow the thread's table: a loop through our `malloc`.
//! A library loaded at startup (as a preloaded one is) may use initial-exec.

use crate::protocol::Regs;
use core::cell::Cell;

/// What a thread remembers between its allocations. Cells: the sampler
/// may be re-entered in the same thread (the C library allocating or
/// freeing on its behalf), so nothing holds a unique reference to it.
#[repr(C)]
#[derive(Debug)]
pub struct ThreadState {
    /// Bytes left until the next sample; a sample is taken when it drops
    /// to 0 or below.
    pub countdown: Cell<i64>,
    /// The thread's random generator state (0: not started).
    pub rng: Cell<u64>,
    /// Lowest address of the thread's stack, when known.
    pub stack_low: Cell<u64>,
    /// One past its highest address; 0 not looked up yet, [`NO_STACK`]
    /// looked up without success.
    pub stack_high: Cell<u64>,
    /// Non-zero while the sampler itself runs in this thread: allocations
    /// the C library makes for it are passed through, unsampled.
    pub busy: Cell<u32>,
    /// Non-zero while the program's own `pthread_getattr_np` runs in this
    /// thread, which holds a lock the sampler's own call would wait for.
    pub in_getattr: Cell<u32>,
    /// The thread's id and its process's (0: not looked up yet), valid
    /// while `fork_generation` is the process's.
    pub tid: Cell<u32>,
    /// See `tid`.
    pub pid: Cell<u32>,
    /// The process's fork count when `tid` and `pid` were looked up: a
    /// forked child's thread has new ids.
    pub fork_generation: Cell<u32>,
}

/// [`ThreadState::stack_high`] when the stack could not be found.
pub const NO_STACK: u64 = 1;

const _: () = assert!(core::mem::size_of::<ThreadState>() <= 64);

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 4",
    // Global for the other codegen units of this crate, hidden so the
    // shared library does not export it.
    ".globl lrnprof_thread_state",
    ".hidden lrnprof_thread_state",
    ".type lrnprof_thread_state,@tls_object",
    ".size lrnprof_thread_state,64",
    "lrnprof_thread_state:",
    ".zero 64",
    ".popsection",
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",%nobits",
    ".p2align 4",
    ".globl lrnprof_thread_state",
    ".hidden lrnprof_thread_state",
    ".type lrnprof_thread_state,%tls_object",
    ".size lrnprof_thread_state,64",
    "lrnprof_thread_state:",
    ".zero 64",
    ".popsection",
);

/// The calling thread's state (zeroed when the thread starts, which is a
/// valid `ThreadState`). Only for the calling thread, and only while it
/// runs: never kept or handed to another thread.
#[inline(always)]
pub fn state() -> &'static ThreadState {
    let p: *const ThreadState;
    // Safety: reads the thread pointer and the GOT entry the linker made
    // for our own thread-local symbol; writes only the output register.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + lrnprof_thread_state@GOTTPOFF]",
            p = out(reg) p,
            options(nostack, readonly, pure),
        );
    }
    // Safety: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {o}, :gottprel:lrnprof_thread_state",
            "ldr {o}, [{o}, #:gottprel_lo12:lrnprof_thread_state]",
            "add {p}, {p}, {o}",
            p = out(reg) p,
            o = out(reg) _,
            options(nostack, readonly, pure),
        );
    }
    // Safety: the thread's own 64 zero-initialized, 16-aligned bytes of
    // static TLS, alive as long as the thread.
    unsafe { &*p }
}

/// The registers at this point of the calling function: its instruction
/// and stack pointers and its frame pointer (and link register), from
/// which the analyzer unwinds the copied stack. Inlined, so they describe
/// the caller's own frame, which stays in place while it copies the stack.
#[inline(always)]
pub fn registers() -> Regs {
    let (ip, sp, fp): (u64, u64, u64);
    // Safety: only reads registers.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags),
        );
        [ip, sp, fp, 0]
    }
    // Safety: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        let lr: u64;
        core::arch::asm!(
            "adr {ip}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            "mov {lr}, x30",
            ip = out(reg) ip,
            sp = out(reg) sp,
            fp = out(reg) fp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags),
        );
        [ip, sp, fp, lr]
    }
}
