//! The sampler's process-wide state and its slow paths: starting up
//! (finding the real allocator, connecting to the ring), deciding which
//! allocations to sample, and writing allocation and free records.
//!
//! The fast paths (every allocation and free) live in `hooks`: a
//! thread-local countdown and, on free, a look in the [`Table`].

use crate::env::{self, Scanner};
use crate::interval::{next_interval, Rng};
use crate::protocol::{
    self, alloc_len, kind, state, Control, Settings, CONTROL_SIZE, MAX_DATA_LOG2, MAX_STACK,
    MIN_DATA_LOG2, SMALL_LEN, SP,
};
use crate::ring::{Reservation, Ring};
use crate::sys;
use crate::table::Table;
use crate::thread::{self, ThreadState, NO_STACK};
use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// The allocator functions this library wraps, found with
/// `dlsym(RTLD_NEXT, ...)`: the C library's, or those of an allocator
/// library loaded after this one.
pub struct Real {
    pub malloc: AtomicUsize,
    pub calloc: AtomicUsize,
    pub realloc: AtomicUsize,
    pub free: AtomicUsize,
    pub free_sized: AtomicUsize,
    pub free_aligned_sized: AtomicUsize,
    pub posix_memalign: AtomicUsize,
    pub aligned_alloc: AtomicUsize,
    pub memalign: AtomicUsize,
    pub valloc: AtomicUsize,
    pub pvalloc: AtomicUsize,
    pub pthread_getattr_np: AtomicUsize,
}

/// See [`Real`].
pub static REAL: Real = Real {
    malloc: AtomicUsize::new(0),
    calloc: AtomicUsize::new(0),
    realloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    free_sized: AtomicUsize::new(0),
    free_aligned_sized: AtomicUsize::new(0),
    posix_memalign: AtomicUsize::new(0),
    aligned_alloc: AtomicUsize::new(0),
    memalign: AtomicUsize::new(0),
    valloc: AtomicUsize::new(0),
    pvalloc: AtomicUsize::new(0),
    pthread_getattr_np: AtomicUsize::new(0),
};

/// The sampled blocks still allocated in this process.
pub static TABLE: Table = Table::new();

const NEW: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
static PHASE: AtomicU8 = AtomicU8::new(NEW);

static CONTROL: AtomicPtr<Control> = AtomicPtr::new(core::ptr::null_mut());
static DATA: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());
static MEAN: AtomicU64 = AtomicU64::new(0);
/// Forks of this process (in the child), so threads know their cached ids
/// are stale.
static FORK_GENERATION: AtomicU32 = AtomicU32::new(0);
static STACK_CAP: AtomicU32 = AtomicU32::new(0);

/// How long a sampler waits for room in a full ring, at most, per record.
const MAX_WAIT_NS: u64 = 20_000_000;
/// A recorder that has not taken records for this long is not waited for.
const RECORDER_SILENT_NS: u64 = 1_000_000_000;

/// Memory handed out while the real allocator is being looked up:
/// `dlsym` itself allocates (it calls `calloc`). Never reused; the
/// [`Real`] functions serve everything after.
const ARENA_SIZE: usize = 64 * 1024;

#[repr(C, align(16))]
struct Arena(UnsafeCell<[u8; ARENA_SIZE]>);
// Safety: each byte is handed out once, through an atomic bump.
unsafe impl Sync for Arena {}
static ARENA: Arena = Arena(UnsafeCell::new([0; ARENA_SIZE]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

/// A block of `size` zeroed bytes from the arena (16-aligned), preceded
/// by its size; null when the arena is used up.
pub fn arena_alloc(size: usize) -> *mut c_void {
    let Some(need) = size.checked_add(16 + 15).map(|n| n & !15) else {
        return core::ptr::null_mut();
    };
    let at = ARENA_USED.fetch_add(need, Ordering::Relaxed);
    if at.saturating_add(need) > ARENA_SIZE {
        sys::set_errno(sys::ENOMEM);
        return core::ptr::null_mut();
    }
    let base = ARENA.0.get().cast::<u8>();
    // Safety: [at, at + need) is inside the arena and handed out once.
    unsafe {
        base.add(at).cast::<usize>().write(size);
        base.add(at + 16).cast()
    }
}

/// Whether `p` came from [`arena_alloc`] (one comparison: every `free`
/// asks).
#[inline(always)]
pub fn in_arena(p: *const c_void) -> bool {
    (p as usize).wrapping_sub(ARENA.0.get() as usize) < ARENA_SIZE
}

/// The size asked for an arena block.
///
/// # Safety
/// `p` must come from [`arena_alloc`].
pub unsafe fn arena_size(p: *const c_void) -> usize {
    // Safety: the size sits 16 bytes before the block.
    unsafe { p.cast::<u8>().sub(16).cast::<usize>().read() }
}

/// Start the sampler if nobody has: look up the real allocator, then
/// connect to the recorder's ring if this process was launched by it.
/// Returns at once while another call (or this thread, from inside
/// `dlsym`) is starting it.
pub fn ensure_started() {
    if PHASE.load(Ordering::Acquire) == READY {
        return;
    }
    if PHASE
        .compare_exchange(NEW, STARTING, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let errno = sys::errno();
    let t = thread::state();
    t.busy.set(t.busy.get() + 1);
    resolve();
    connect();
    t.busy.set(t.busy.get() - 1);
    PHASE.store(READY, Ordering::Release);
    sys::set_errno(errno);
}

fn resolve() {
    let slots: [(&AtomicUsize, &CStr); 12] = [
        (&REAL.malloc, c"malloc"),
        (&REAL.calloc, c"calloc"),
        (&REAL.realloc, c"realloc"),
        (&REAL.free, c"free"),
        (&REAL.free_sized, c"free_sized"),
        (&REAL.free_aligned_sized, c"free_aligned_sized"),
        (&REAL.posix_memalign, c"posix_memalign"),
        (&REAL.aligned_alloc, c"aligned_alloc"),
        (&REAL.memalign, c"memalign"),
        (&REAL.valloc, c"valloc"),
        (&REAL.pvalloc, c"pvalloc"),
        (&REAL.pthread_getattr_np, c"pthread_getattr_np"),
    ];
    // Looked up all before any is used: `dlsym`'s own allocations must
    // come from the arena, and frees of arena blocks are ignored.
    let mut found = [0usize; 13];
    for (i, (_, name)) in slots.iter().enumerate() {
        // Safety: a valid C string; RTLD_NEXT is valid in a shared library.
        found[i] = unsafe { sys::dlsym(sys::RTLD_NEXT, name.as_ptr()) } as usize;
    }
    for ((slot, _), f) in slots.iter().zip(found) {
        slot.store(f, Ordering::Release);
    }
}

/// The value of our variable in the environment, into `out`.
fn find_env(out: &mut [u8; 64]) -> Option<usize> {
    let mut copy = |v: &[u8]| {
        let n = v.len().min(out.len());
        out[..n].copy_from_slice(&v[..n]);
        Some(n)
    };
    // Safety: `environ` is the C library's NULL-terminated array of C
    // strings (or null before the library is set up).
    let mut entry = unsafe { sys::environ };
    if !entry.is_null() {
        // Safety: as above: every entry until the null one is a C string.
        unsafe {
            while !(*entry).is_null() {
                if let Some(v) = env::value_of(CStr::from_ptr(*entry).to_bytes()) {
                    return copy(v);
                }
                entry = entry.add(1);
            }
        }
        return None;
    }
    // Too early for `environ`: the environment the kernel gave the process.
    // Safety: a valid C string path; the descriptor is closed below.
    let fd = unsafe {
        sys::open(
            c"/proc/self/environ".as_ptr(),
            sys::O_RDONLY | sys::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut scanner = Scanner::default();
    let mut buf = [0u8; 1024];
    loop {
        // Safety: reading into our own buffer.
        let n = unsafe { sys::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 || scanner.feed(&buf[..n as usize]) {
            break;
        }
    }
    // Safety: our descriptor.
    unsafe { sys::close(fd) };
    scanner.value().and_then(copy)
}

fn map(len: usize, flags: c_int, fd: c_int, offset: i64) -> Option<*mut c_void> {
    // Safety: a new mapping, placed by the kernel.
    let p = unsafe {
        sys::mmap(
            core::ptr::null_mut(),
            len,
            sys::PROT_READ | sys::PROT_WRITE,
            flags,
            fd,
            offset,
        )
    };
    (p != sys::MAP_FAILED).then_some(p)
}

/// Map the ring the recorder named in the environment, if any.
fn connect() {
    let mut value = [0u8; 64];
    let Some(n) = find_env(&mut value) else {
        return;
    };
    let Some((fd, cookie)) = protocol::parse_env_value(&value[..n]) else {
        return;
    };
    // Read the settings with pread first: the descriptor number may have
    // been reused by the program for a pipe or a short file, which must
    // not be mapped.
    let mut settings = Settings::default();
    let size = core::mem::size_of::<Settings>();
    // Safety: reading into a plain struct of `size` bytes.
    let got = unsafe { sys::pread(fd, (&mut settings as *mut Settings).cast(), size, 0) };
    let valid = got == size as isize
        && settings.magic == protocol::MAGIC
        && settings.version == protocol::VERSION
        && settings.cookie == cookie
        && (MIN_DATA_LOG2..=MAX_DATA_LOG2).contains(&settings.data_log2)
        && settings.table_log2 <= 24
        && settings.mean_interval >= 1;
    if !valid {
        return;
    }
    let Some(control) = map(CONTROL_SIZE, sys::MAP_SHARED, fd, 0) else {
        return;
    };
    let Some(data) = map(
        1 << settings.data_log2,
        sys::MAP_SHARED,
        fd,
        CONTROL_SIZE as i64,
    ) else {
        return;
    };
    let table_bytes = Table::bytes(settings.table_log2);
    let Some(table) = map(
        table_bytes,
        sys::MAP_PRIVATE | sys::MAP_ANONYMOUS | sys::MAP_NORESERVE,
        -1,
        0,
    ) else {
        return;
    };
    // Safety: fresh zeroed private memory of the right size, kept forever.
    unsafe { TABLE.attach(table.cast(), settings.table_log2) };
    MEAN.store(settings.mean_interval, Ordering::Relaxed);
    STACK_CAP.store(
        settings.stack_size.min(MAX_STACK as u32) & !7,
        Ordering::Relaxed,
    );
    DATA.store(data.cast(), Ordering::Relaxed);
    CONTROL.store(control.cast(), Ordering::Release);
    // Safety: registers a handler that only increments an atomic; the C
    // library allocates for it, which passes through (the caller is busy).
    unsafe { sys::pthread_atfork(None, None, Some(forked)) };
    if let Some(ring) = ring() {
        if let Some(mut r) = reserve(&ring, SMALL_LEN, kind::HELLO) {
            r.put_u64(sys::monotonic_ns());
            r.put_u64(ids(thread::state()));
            r.put_u64(0);
            r.commit();
        }
    }
}

/// The ring, once connected.
fn ring() -> Option<Ring> {
    let control = CONTROL.load(Ordering::Acquire);
    if control.is_null() {
        return None;
    }
    // Safety: both mappings were made in `connect` and are never unmapped.
    Some(unsafe { Ring::new(control, DATA.load(Ordering::Relaxed)) })
}

extern "C" fn forked() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The process and thread ids, as a record's second word; looked up once
/// per thread and again after a fork.
fn ids(t: &ThreadState) -> u64 {
    let generation = FORK_GENERATION.load(Ordering::Relaxed);
    if t.tid.get() == 0 || t.fork_generation.get() != generation {
        t.pid.set(sys::pid());
        t.tid.set(sys::gettid());
        t.fork_generation.set(generation);
    }
    u64::from(t.pid.get()) | u64::from(t.tid.get()) << 32
}

/// Room for a record, waiting a little for a live recorder when the ring
/// is full; `None` (and the event counted lost) if there is none.
fn reserve(ring: &Ring, len: usize, kind: u8) -> Option<Reservation<'_>> {
    let control = ring.control();
    if control.state.0.load(Ordering::Relaxed) != state::RECORDING {
        return None;
    }
    if let Some(r) = ring.reserve(len, kind) {
        return Some(r);
    }
    let start = sys::monotonic_ns();
    loop {
        let now = sys::monotonic_ns();
        let heartbeat = control.heartbeat_ns.0.load(Ordering::Relaxed);
        if control.state.0.load(Ordering::Relaxed) != state::RECORDING {
            return None;
        }
        if now.saturating_sub(heartbeat) > RECORDER_SILENT_NS
            || now.saturating_sub(start) > MAX_WAIT_NS
        {
            control.lost.0.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        sys::sleep_ns(50_000);
        if let Some(r) = ring.reserve(len, kind) {
            return Some(r);
        }
    }
}

/// The thread's countdown ran out on an allocation of `size` bytes at `p`:
/// sample it, or start the thread's countdown. Not inlined, so its frame
/// holds the registers it records.
#[cold]
#[inline(never)]
pub fn countdown_ran_out(p: *mut c_void, size: usize, t: &ThreadState) {
    if t.busy.get() != 0 {
        // The C library allocating for the sampler: not the program's.
        t.countdown
            .set(t.countdown.get().saturating_add(size as i64));
        return;
    }
    let errno = sys::errno();
    t.busy.set(t.busy.get() + 1);
    ensure_started();
    let mean = MEAN.load(Ordering::Relaxed);
    match ring() {
        None if PHASE.load(Ordering::Acquire) == READY => {
            // Not launched by the recorder: never sample.
            t.countdown.set(i64::MAX / 2);
        }
        None => t.countdown.set(0),
        Some(ring) => {
            if t.rng.get() == 0 {
                // The thread's first interval starts at its first allocation.
                let mut rng = Rng::new(thread_seed(t, p));
                t.countdown.set(
                    t.countdown
                        .get()
                        .saturating_add(next_interval(&mut rng, mean)),
                );
                t.rng.set(rng.next_u64() | 1);
            }
            if t.countdown.get() <= 0 {
                let mut rng = Rng::new(t.rng.get());
                // Memoryless: the next interval starts after this block.
                t.countdown.set(next_interval(&mut rng, mean));
                t.rng.set(rng.next_u64() | 1);
                record_allocation(&ring, p, size, t);
            }
        }
    }
    t.busy.set(t.busy.get() - 1);
    sys::set_errno(errno);
}

fn thread_seed(t: &ThreadState, p: *mut c_void) -> u64 {
    (t as *const ThreadState as u64)
        ^ (p as u64).rotate_left(17)
        ^ sys::monotonic_ns().rotate_left(41)
        ^ u64::from(sys::gettid())
}

/// Look up the thread's stack once.
fn stack_bounds(t: &ThreadState) -> (u64, u64) {
    if t.stack_high.get() == 0 && t.in_getattr.get() == 0 {
        t.stack_high.set(NO_STACK);
        let f = REAL.pthread_getattr_np.load(Ordering::Acquire);
        if f != 0 {
            type GetAttr = unsafe extern "C" fn(usize, *mut sys::PthreadAttr) -> c_int;
            // Safety: `dlsym` found pthread_getattr_np with this signature.
            let get: GetAttr = unsafe { core::mem::transmute::<usize, GetAttr>(f) };
            let mut attr = sys::PthreadAttr([0; 64]);
            let (mut addr, mut size) = (core::ptr::null_mut(), 0usize);
            // Safety: attr is large enough for pthread_attr_t; it is
            // destroyed after use, as pthread_getattr_np requires. The
            // program is not inside its own call in this thread (checked
            // above), so its lock is free.
            unsafe {
                if get(sys::pthread_self(), &mut attr) == 0 {
                    if sys::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0 {
                        t.stack_low.set(addr as u64);
                        t.stack_high.set((addr as u64).saturating_add(size as u64));
                    }
                    sys::pthread_attr_destroy(&mut attr);
                }
            }
            // The main thread's outermost frame (`_start`'s) is where the
            // loader left the stack pointer; above it are only the
            // arguments, the environment and the auxiliary vector.
            // Safety: set by the dynamic loader before any code runs.
            let start = unsafe { sys::__libc_stack_end } as u64;
            if t.stack_low.get() <= start && start < t.stack_high.get() {
                t.stack_high
                    .set(start.saturating_add(64).min(t.stack_high.get()));
            }
        }
    }
    (t.stack_low.get(), t.stack_high.get())
}

/// Write an allocation record: ids, the block, the registers here and a
/// copy of the stack from the stack pointer up.
#[inline(always)]
fn record_allocation(ring: &Ring, p: *mut c_void, size: usize, t: &ThreadState) {
    let regs = thread::registers();
    let sp = regs[SP];
    let cap = u64::from(STACK_CAP.load(Ordering::Relaxed));
    let (low, high) = stack_bounds(t);
    // Inside the thread's known stack: copy exactly the live part. Else
    // (an alternate signal stack, a coroutine's stack, no bounds found)
    // read up to the cap, stopping at the first unreadable page.
    let exact = low <= sp && sp < high;
    let stack_len = if exact { (high - sp).min(cap) } else { cap } as usize;
    if !TABLE.insert(p as u64) {
        ring.control().lost.0.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let Some(mut r) = reserve(ring, alloc_len(stack_len), kind::ALLOC) else {
        TABLE.remove(p as u64);
        return;
    };
    r.put_u64(sys::monotonic_ns());
    r.put_u64(ids(t));
    r.put_u64(p as u64);
    r.put_u64(size as u64);
    for reg in regs {
        r.put_u64(reg);
    }
    if exact {
        r.put_u64(stack_len as u64);
        // Safety: [sp, sp + stack_len) lies in this thread's stack.
        unsafe { r.put_bytes(sp as *const u8, stack_len) };
    } else {
        let length_at = r.offset();
        r.put_u64(0);
        let copied = read_own_memory(sp, &r, stack_len);
        r.skip(copied);
        r.set_u64(length_at, copied as u64);
    }
    r.commit();
}

/// Copy up to `len` bytes from `start` into the reservation's next bytes,
/// stopping at the first page that cannot be read; returns the bytes copied.
fn read_own_memory(start: u64, r: &Reservation<'_>, len: usize) -> usize {
    const PAGE: u64 = 4096;
    let [(a, a_len), (b, b_len)] = r.next_segments(len);
    let local = [
        sys::Iovec {
            base: a.cast(),
            len: a_len,
        },
        sys::Iovec {
            base: b.cast(),
            len: b_len,
        },
    ];
    // One remote range per page, so a partial read stops at a page.
    let mut remote = [const {
        sys::Iovec {
            base: core::ptr::null_mut(),
            len: 0,
        }
    }; (MAX_STACK / 4096) + 2];
    let (mut n, mut at, end) = (0, start, start.saturating_add(len as u64));
    while at < end && n < remote.len() {
        let next = ((at / PAGE) + 1).saturating_mul(PAGE).min(end);
        remote[n] = sys::Iovec {
            base: at as *mut c_void,
            len: (next - at) as usize,
        };
        n += 1;
        at = next;
    }
    // Safety: reading this process's memory into the reservation's space;
    // the kernel checks the remote ranges and stops at a fault.
    let got =
        unsafe { sys::process_vm_readv(sys::getpid(), local.as_ptr(), 2, remote.as_ptr(), n, 0) };
    usize::try_from(got).unwrap_or(0)
}

/// A sampled block at `p` is being freed (or given back by `realloc`) at
/// `time`: record it.
#[cold]
#[inline(never)]
pub fn record_free(p: *mut c_void, time: u64) {
    let Some(ring) = ring() else { return };
    let errno = sys::errno();
    if let Some(mut r) = reserve(&ring, SMALL_LEN, kind::FREE) {
        r.put_u64(time);
        r.put_u64(ids(thread::state()));
        r.put_u64(p as u64);
        r.commit();
    }
    sys::set_errno(errno);
}
