//! The functions the preloaded library exports in place of the C
//! library's: every allocation and free of the program goes through them,
//! C++ `operator new` and `delete` included (they call these).
//!
//! Each calls the real function and does the least it can besides: an
//! allocation subtracts its size from the thread's countdown (a sample is
//! taken when it runs out), a free asks the table whether its block was
//! sampled. A sampled block's free is recorded before the block is given
//! back, so a new block at the same address always comes after it.
//!
//! The names are exported only in the shared library the recorder's build
//! script makes (`--cfg lrnprof_preload_exports`); elsewhere these are
//! ordinary functions, so linking this crate replaces nobody's `malloc`.

#![cfg_attr(not(lrnprof_preload_exports), allow(dead_code))]

use crate::sampler::{
    arena_alloc, arena_size, countdown_ran_out, ensure_started, in_arena, record_free, REAL, TABLE,
};
use crate::sys::{self, PthreadAttr};
use crate::thread;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Calloc = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type Realloc = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type FreeSized = unsafe extern "C" fn(*mut c_void, usize);
type FreeAlignedSized = unsafe extern "C" fn(*mut c_void, usize, usize);
type PosixMemalign = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type Aligned = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type GetAttr = unsafe extern "C" fn(usize, *mut PthreadAttr) -> c_int;

/// The real function in `slot`, starting the sampler first if needed;
/// `None` while it is being looked up.
#[inline(always)]
fn real<F: Copy>(slot: &AtomicUsize) -> Option<F> {
    let mut f = slot.load(Ordering::Acquire);
    if f == 0 {
        ensure_started();
        f = slot.load(Ordering::Acquire);
        if f == 0 {
            return None;
        }
    }
    debug_assert_eq!(core::mem::size_of::<F>(), core::mem::size_of::<usize>());
    // Safety: the slots hold functions found by `dlsym` under the C name
    // whose signature F is (see the callers).
    Some(unsafe { core::mem::transmute_copy::<usize, F>(&f) })
}

/// An allocation of `size` bytes at `p` happened: count it down.
#[inline(always)]
fn allocated(p: *mut c_void, size: usize) {
    if p.is_null() {
        return;
    }
    let t = thread::state();
    let left = t.countdown.get().wrapping_sub(size as i64);
    t.countdown.set(left);
    if left <= 0 {
        countdown_ran_out(p, size, t);
    }
}

/// A block at `p` is about to be given back: record it if it was sampled.
#[inline(always)]
fn freeing(p: *mut c_void) {
    if TABLE.may_hold(p as u64) {
        freeing_maybe_sampled(p);
    }
}

/// Apart from `free`, which then needs no stack frame of its own.
#[cold]
#[inline(never)]
fn freeing_maybe_sampled(p: *mut c_void) {
    if TABLE.remove(p as u64) {
        record_free(p, sys::monotonic_ns());
    }
}

/// `malloc`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(f) = real::<Malloc>(&REAL.malloc) else {
        return arena_alloc(size);
    };
    // Safety: the real malloc.
    let p = unsafe { f(size) };
    allocated(p, size);
    p
}

/// `calloc`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(f) = real::<Calloc>(&REAL.calloc) else {
        // `dlsym` allocates with calloc: arena memory is zeroed.
        return match n.checked_mul(size) {
            Some(total) => arena_alloc(total),
            None => core::ptr::null_mut(),
        };
    };
    // Safety: the real calloc.
    let p = unsafe { f(n, size) };
    // It succeeded, so n * size did not overflow.
    allocated(p, n.wrapping_mul(size));
    p
}

/// `realloc(p, size)` through `call`, the real function: `p` is freed (if
/// sampled, recorded) and a new block allocated, as far as the profile is
/// concerned, even when the block grows in place.
#[inline(always)]
fn reallocate(
    p: *mut c_void,
    size: usize,
    call: impl FnOnce(*mut c_void) -> *mut c_void,
) -> *mut c_void {
    if in_arena(p) {
        // A block from start-up, moved to the real allocator.
        // Safety: our own malloc; the old block is an arena block of
        // `arena_size` bytes, never reused.
        unsafe {
            let q = malloc(size);
            if !q.is_null() {
                let n = arena_size(p).min(size);
                core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), n);
            }
            return q;
        }
    }
    let sampled = !p.is_null() && TABLE.remove(p as u64);
    // Taken before the real call, which may hand the address to another
    // thread once it gives the block back.
    let time = if sampled { sys::monotonic_ns() } else { 0 };
    let q = call(p);
    if sampled {
        if q.is_null() && size != 0 {
            // Failed: the old block is still allocated.
            TABLE.insert(p as u64);
        } else {
            record_free(p, time);
        }
    }
    allocated(q, size);
    q
}

/// `realloc`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    let Some(f) = real::<Realloc>(&REAL.realloc) else {
        // Still starting up: stay in the arena.
        let q = arena_alloc(size);
        if !p.is_null() && in_arena(p) && !q.is_null() {
            // Safety: both are arena blocks of at least the sizes copied.
            unsafe {
                let n = arena_size(p).min(size);
                core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), n);
            }
        }
        return q;
    };
    // Safety: the real realloc, with the caller's arguments.
    reallocate(p, size, |p| unsafe { f(p, size) })
}

/// `reallocarray`: `realloc` with the product checked, which is what the
/// C library's own is. Not passed to the real `reallocarray`: glibc's
/// calls `realloc` through its PLT, which is this library's again, and
/// the block would be counted twice (and its second sample, for an
/// address already in the table, lost).
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        sys::set_errno(sys::ENOMEM);
        return core::ptr::null_mut();
    };
    // Safety: as the C function.
    unsafe { realloc(p, total) }
}

/// `free`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // A null `p` passes through: the table never holds 0.
    if in_arena(p) {
        return;
    }
    freeing(p);
    if let Some(f) = real::<Free>(&REAL.free) {
        // Safety: the real free of a block it handed out.
        unsafe { f(p) };
    }
}

/// A free through `call`, the real function if there is one, else `free`.
#[inline(always)]
fn free_through<F: Copy>(p: *mut c_void, slot: &AtomicUsize, call: impl FnOnce(F)) {
    if in_arena(p) {
        return;
    }
    freeing(p);
    match real::<F>(slot) {
        Some(f) => call(f),
        None => {
            if let Some(f) = real::<Free>(&REAL.free) {
                // Safety: the real free.
                unsafe { f(p) };
            }
        }
    }
}

/// `free_sized` (C23).
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn free_sized(p: *mut c_void, size: usize) {
    // Safety: the real function with the caller's arguments.
    free_through(p, &REAL.free_sized, |f: FreeSized| unsafe { f(p, size) });
}

/// `free_aligned_sized` (C23).
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn free_aligned_sized(p: *mut c_void, align: usize, size: usize) {
    free_through(p, &REAL.free_aligned_sized, |f: FreeAlignedSized| {
        // Safety: the real function with the caller's arguments.
        unsafe { f(p, align, size) }
    });
}

/// `posix_memalign`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    let Some(f) = real::<PosixMemalign>(&REAL.posix_memalign) else {
        return sys::ENOMEM;
    };
    // Safety: the real function with the caller's arguments.
    let rc = unsafe { f(out, align, size) };
    if rc == 0 {
        // Safety: on success the real function stored the block in *out.
        allocated(unsafe { *out }, size);
    }
    rc
}

/// An aligned allocation through `slot`'s real function.
#[inline(always)]
fn aligned(slot: &AtomicUsize, align: usize, size: usize) -> *mut c_void {
    let Some(f) = real::<Aligned>(slot) else {
        return core::ptr::null_mut();
    };
    // Safety: the real function with the caller's arguments.
    let p = unsafe { f(align, size) };
    allocated(p, size);
    p
}

/// `aligned_alloc`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    aligned(&REAL.aligned_alloc, align, size)
}

/// `memalign`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(&REAL.memalign, align, size)
}

/// An allocation through `slot`'s real function of one size argument.
#[inline(always)]
fn sized(slot: &AtomicUsize, size: usize) -> *mut c_void {
    let Some(f) = real::<Malloc>(slot) else {
        return core::ptr::null_mut();
    };
    // Safety: the real function.
    let p = unsafe { f(size) };
    allocated(p, size);
    p
}

/// `valloc`.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    sized(&REAL.valloc, size)
}

/// `pvalloc`: counted as the bytes asked for, not the whole pages given.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    sized(&REAL.pvalloc, size)
}

/// `pthread_getattr_np`, noting that the program is inside it: it holds
/// the thread's lock while it allocates, so the sampler must not look up
/// the thread's stack (with the same function) from those allocations.
///
/// # Safety
/// As the C function.
#[cfg_attr(lrnprof_preload_exports, no_mangle)]
pub unsafe extern "C" fn pthread_getattr_np(thread: usize, attr: *mut PthreadAttr) -> c_int {
    let Some(f) = real::<GetAttr>(&REAL.pthread_getattr_np) else {
        return sys::ENOSYS;
    };
    let t = thread::state();
    t.in_getattr.set(t.in_getattr.get() + 1);
    // Safety: the real function with the caller's arguments.
    let rc = unsafe { f(thread, attr) };
    t.in_getattr.set(t.in_getattr.get() - 1);
    rc
}

/// Run when the library is loaded (after the C library's own start-up):
/// start the sampler before `main`, if no allocation has already.
#[cfg(lrnprof_preload_exports)]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[cfg(lrnprof_preload_exports)]
extern "C" fn on_load() {
    ensure_started();
}
