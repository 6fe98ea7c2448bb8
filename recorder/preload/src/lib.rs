//! lrnprof's allocation sampler: a small library that `lrnprof-rec --heap`
//! preloads into the command it launches.
//!
//! It wraps the allocator (`malloc`, `calloc`, `realloc`, `reallocarray`,
//! `free`, `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`,
//! `pvalloc`, and so C++ `operator new` and `delete`, which call them) and
//! samples allocations by bytes: the gaps between sampled bytes are drawn
//! from an exponential distribution of the recording's mean, as tcmalloc
//! and jemalloc do ([`interval`]). Per sampled allocation it writes the
//! time, process, thread, size, address, its registers and a raw copy of
//! the live stack into a ring in memory shared with the recorder
//! ([`ring`], [`protocol`]); the analyzer unwinds that copy later, like
//! any CPU sample's. The frees of sampled blocks are written too, so what
//! is still allocated, at the end or at any time, is known ([`table`]).
//!
//! What it must never do inside an allocator function: allocate (it has
//! no allocator: `no_std`), take a lock (a `fork` in another thread would
//! leave it taken in the child), or wait long for the recorder (a full
//! ring is waited on for at most a few milliseconds, then the event is
//! counted as lost). The C library's own allocations made on its behalf
//! (looking up the thread's stack) pass through unsampled; those made by
//! `dlsym` while it looks up the real allocator come from a small static
//! arena.
//!
//! The recorder uses this crate for the [`protocol`] and the consumer side
//! of the [`ring`]. The allocator functions are exported under their C
//! names only in the shared library the recorder's build script builds
//! (with `--cfg lrnprof_preload_exports`), never when this crate is linked
//! as a library.

#![cfg_attr(not(test), no_std)]
#![deny(missing_docs)]

pub mod env;
pub mod interval;
pub mod protocol;
pub mod ring;
pub mod table;

/// Declares modules that exist only in the shared library (and in this
/// crate's tests): the C library glue, for Linux on x86-64 and AArch64.
macro_rules! sampler_modules {
    ($($name:ident),*) => {$(
        #[cfg(all(
            any(test, lrnprof_preload_exports),
            target_os = "linux",
            any(target_arch = "x86_64", target_arch = "aarch64")
        ))]
        mod $name;
    )*};
}

sampler_modules!(hooks, sampler, sys, thread);

/// In the shared library a panic (none is expected) ends the process, as
/// an allocator failure would.
#[cfg(all(lrnprof_preload_exports, not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // Safety: abort has no preconditions.
    unsafe { sys::abort() }
}

// The precompiled `core` names Rust's unwinding personality in its unwind
// tables even though nothing unwinds here (panics abort). Define it, hidden,
// so the library links without exporting a symbol a Rust program's own
// runtime provides.
#[cfg(all(lrnprof_preload_exports, not(test), target_arch = "x86_64"))]
core::arch::global_asm!(
    ".pushsection .text.rust_eh_personality,\"ax\",@progbits",
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality,@function",
    "rust_eh_personality:",
    "ud2",
    ".size rust_eh_personality,.-rust_eh_personality",
    ".popsection",
);
#[cfg(all(lrnprof_preload_exports, not(test), target_arch = "aarch64"))]
core::arch::global_asm!(
    ".pushsection .text.rust_eh_personality,\"ax\",%progbits",
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality,%function",
    "rust_eh_personality:",
    "brk #0",
    ".size rust_eh_personality,.-rust_eh_personality",
    ".popsection",
);
