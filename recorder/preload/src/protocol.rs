//! What the allocation sampler (in the target) and `lrnprof-rec` agree on:
//! how the sampler finds the shared memory, the control block at its
//! start, and the records in the ring after it.
//!
//! # Finding the ring
//!
//! `lrnprof-rec` creates a memory file (`memfd`), lays out the control
//! block ([`Control`], [`CONTROL_SIZE`] bytes) and the data ring
//! (`1 << data_log2` bytes right after it), and launches the command with
//! the file descriptor left open and the environment variable [`ENV_VAR`]
//! set to `FD:COOKIE`: the descriptor in decimal, then the control block's
//! `cookie` as 16 lowercase hex digits. The sampler maps the file only if
//! the descriptor holds a control block with [`MAGIC`], [`VERSION`] and
//! that cookie, so a descriptor number reused by the program for another
//! file is never mistaken for the ring. Children inherit both the variable
//! and the descriptor, across `fork` and `exec`.
//!
//! # Records
//!
//! A record is a header word, then its body, in native byte order, 8-byte
//! aligned at ring position `pos` (byte `pos % size` of the data; a record
//! may wrap around the end). The header word ([`header_word`]) holds the
//! record's whole length (header included, a multiple of 8), its kind, the
//! lap (`pos / size`, so a word left from an earlier lap is never taken
//! for a new one) and, once the body is written, [`COMMITTED`]. Bodies,
//! by kind, as 64-bit words:
//!
//! | kind | body |
//! |---|---|
//! | [`kind::ALLOC`] | time, pid \| tid << 32, address, size, the four registers [`Regs`], stack length `n`, then `n` bytes of stack from `sp` up (padded to 8) |
//! | [`kind::FREE`] | time, pid \| tid << 32, address |
//! | [`kind::HELLO`] | time, pid \| tid << 32: the sampler started in this process |
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, the clock of the recorder's
//! other events.

use core::sync::atomic::{AtomicU32, AtomicU64};

/// The environment variable that tells the sampler where the ring is.
pub const ENV_VAR: &str = "LRNPROF_HEAP";

/// `Control::magic`: "LRNPHEAP" read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"LRNPHEAP");

/// `Control::version`: changes whenever anything in this module does.
pub const VERSION: u32 = 1;

/// Bytes before the data ring in the shared file (one page on every
/// platform lrnprof supports, so the ring can be mapped on its own).
pub const CONTROL_SIZE: usize = 4096;

/// The most bytes of stack an allocation record carries.
pub const MAX_STACK: usize = 65536;

/// Words of an allocation record's body before its stack bytes.
pub const ALLOC_FIXED_WORDS: usize = 9;

/// The longest record: an allocation with [`MAX_STACK`] bytes of stack.
pub const MAX_RECORD: usize = 8 + ALLOC_FIXED_WORDS * 8 + MAX_STACK;

/// The smallest and largest data ring (`data_log2`).
pub const MIN_DATA_LOG2: u32 = 18;
/// See [`MIN_DATA_LOG2`].
pub const MAX_DATA_LOG2: u32 = 30;

/// [`Control::state`] values.
pub mod state {
    /// The recorder takes records.
    pub const RECORDING: u32 = 1;
    /// The recorder has stopped: write nothing more.
    pub const STOPPED: u32 = 2;
}

/// Record kinds (see the module docs).
pub mod kind {
    /// A sampled allocation.
    pub const ALLOC: u8 = 1;
    /// A sampled allocation was freed.
    pub const FREE: u8 = 2;
    /// The sampler started in a process.
    pub const HELLO: u8 = 3;
}

/// The header bit set once a record's body is complete.
pub const COMMITTED: u64 = 1 << 63;

const LAP_BITS: u32 = 23;

/// A value on a cache line of its own: producers in many threads and the
/// recorder each write their own counters without sharing a line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

/// What the recorder decides before the target starts; read-only after.
#[repr(C, align(64))]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`VERSION`].
    pub version: u32,
    /// The data ring holds `1 << data_log2` bytes.
    pub data_log2: u32,
    /// Random; also in [`ENV_VAR`].
    pub cookie: u64,
    /// Mean bytes allocated between two sampled allocations (exponentially
    /// distributed); 1 samples every allocation.
    pub mean_interval: u64,
    /// The most bytes of stack copied per sampled allocation.
    pub stack_size: u32,
    /// Each process's table of sampled blocks (to notice their frees)
    /// has `1 << table_log2` buckets of [`crate::table::BUCKET_SLOTS`] blocks.
    pub table_log2: u32,
}

/// The control block at the start of the shared file.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Control {
    /// Fixed settings.
    pub settings: Settings,
    /// [`state`]: written by the recorder.
    pub state: Padded<AtomicU32>,
    /// When the recorder last took records (`CLOCK_MONOTONIC` ns): a
    /// sampler finding the ring full waits only for a recorder that is alive.
    pub heartbeat_ns: Padded<AtomicU64>,
    /// Ring position up to which producers have reserved space.
    pub head: Padded<AtomicU64>,
    /// Ring position up to which the recorder has taken records.
    pub tail: Padded<AtomicU64>,
    /// Events the samplers dropped (ring full, table full).
    pub lost: Padded<AtomicU64>,
}

const _: () = assert!(core::mem::size_of::<Control>() <= CONTROL_SIZE);
const _: () = assert!(MAX_RECORD.is_multiple_of(8));
const _: () = assert!(1 << MIN_DATA_LOG2 >= 2 * MAX_RECORD);

/// The registers of an allocation record, as the sampler reads them in
/// itself: x86-64 `[rip, rsp, rbp, 0]`, AArch64 `[pc, sp, x29, x30]`.
pub type Regs = [u64; 4];

/// Index of the stack pointer in [`Regs`].
pub const SP: usize = 1;

/// A header word: `len` bytes in all, `kind`, written at ring position
/// `pos` of a ring of `1 << data_log2` bytes; not yet committed.
pub fn header_word(len: u32, kind: u8, pos: u64, data_log2: u32) -> u64 {
    u64::from(len) | u64::from(kind) << 32 | lap(pos, data_log2) << 40
}

/// The lap field of a header at ring position `pos`.
pub fn lap(pos: u64, data_log2: u32) -> u64 {
    (pos >> data_log2) & ((1 << LAP_BITS) - 1)
}

/// A header word's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes of the record, header included.
    pub len: u32,
    /// Its kind.
    pub kind: u8,
    /// Its lap.
    pub lap: u64,
    /// Whether its body is complete.
    pub committed: bool,
}

impl Header {
    /// Split a header word.
    pub fn parse(word: u64) -> Header {
        Header {
            len: word as u32,
            kind: (word >> 32) as u8,
            lap: (word >> 40) & ((1 << LAP_BITS) - 1),
            committed: word & COMMITTED != 0,
        }
    }
}

/// `n` rounded up to a multiple of 8.
pub const fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// The length of an allocation record carrying `stack` bytes of stack.
pub const fn alloc_len(stack: usize) -> usize {
    8 + ALLOC_FIXED_WORDS * 8 + align8(stack)
}

/// The length of a free or hello record.
pub const SMALL_LEN: usize = 8 + 3 * 8;

/// A sampled allocation, as read back from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alloc<'a> {
    /// `CLOCK_MONOTONIC` ns.
    pub time: u64,
    /// The process.
    pub pid: u32,
    /// The allocating thread.
    pub tid: u32,
    /// The block's address (AVMA).
    pub address: u64,
    /// Bytes asked for.
    pub size: u64,
    /// The sampler's registers where it copied the stack.
    pub regs: Regs,
    /// The stack from `regs[SP]` up.
    pub stack: &'a [u8],
}

/// A record read back from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A sampled allocation.
    Alloc(Alloc<'a>),
    /// A sampled block was freed.
    Free {
        /// `CLOCK_MONOTONIC` ns.
        time: u64,
        /// The process.
        pid: u32,
        /// The freeing thread.
        tid: u32,
        /// The block's address.
        address: u64,
    },
    /// The sampler started in a process.
    Hello {
        /// `CLOCK_MONOTONIC` ns.
        time: u64,
        /// The process.
        pid: u32,
        /// The thread it started in.
        tid: u32,
    },
}

fn word(body: &[u8], i: usize) -> Option<u64> {
    let b = body.get(i * 8..i * 8 + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_ne_bytes(a))
}

/// Decode a record body of `kind` (the bytes after its header word).
/// `None` if it is too short or of an unknown kind: the ring is written by
/// the target, so its bytes are not trusted.
pub fn decode(kind: u8, body: &[u8]) -> Option<Event<'_>> {
    let ids = word(body, 1)?;
    let (pid, tid) = (ids as u32, (ids >> 32) as u32);
    match kind {
        kind::ALLOC => {
            let stack_len = usize::try_from(word(body, 8)?).ok()?;
            let start = ALLOC_FIXED_WORDS * 8;
            let stack = body.get(start..start.checked_add(stack_len)?)?;
            Some(Event::Alloc(Alloc {
                time: word(body, 0)?,
                pid,
                tid,
                address: word(body, 2)?,
                size: word(body, 3)?,
                regs: [
                    word(body, 4)?,
                    word(body, 5)?,
                    word(body, 6)?,
                    word(body, 7)?,
                ],
                stack,
            }))
        }
        kind::FREE => Some(Event::Free {
            time: word(body, 0)?,
            pid,
            tid,
            address: word(body, 2)?,
        }),
        kind::HELLO => Some(Event::Hello {
            time: word(body, 0)?,
            pid,
            tid,
        }),
        _ => None,
    }
}

/// Parse the value of [`ENV_VAR`]: `FD:COOKIE` (decimal, 16 hex digits).
pub fn parse_env_value(value: &[u8]) -> Option<(i32, u64)> {
    let colon = value.iter().position(|&b| b == b':')?;
    let (fd, cookie) = (&value[..colon], &value[colon + 1..]);
    if fd.is_empty() || fd.len() > 9 || cookie.len() != 16 {
        return None;
    }
    let mut n: i32 = 0;
    for &b in fd {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + i32::from(b - b'0');
    }
    let mut c: u64 = 0;
    for &b in cookie {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        c = c << 4 | u64::from(digit);
    }
    Some((n, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_words_round_trip() {
        let w = header_word(120, kind::ALLOC, 5 << 20 | 64, 20);
        let h = Header::parse(w);
        assert_eq!(
            h,
            Header {
                len: 120,
                kind: kind::ALLOC,
                lap: 5,
                committed: false
            }
        );
        assert!(Header::parse(w | COMMITTED).committed);
    }

    #[test]
    fn env_values_parse_strictly() {
        assert_eq!(
            parse_env_value(b"107:00000000deadbeef"),
            Some((107, 0xdead_beef))
        );
        for bad in [
            &b""[..],
            b"107",
            b":0000000000000001",
            b"1x:0000000000000001",
            b"1:00000000000000001",
            b"1:000000000000000G",
            b"1:000000000000000F",
        ] {
            assert_eq!(parse_env_value(bad), None, "{bad:?}");
        }
    }

    #[rustfmt::skip]
    #[test]
    fn bodies_decode_and_short_ones_do_not() {
        let mut body = Vec::new();
        for w in [
            77u64,              // time
            5 | 6 << 32,        // pid 5, tid 6
            0x1000,             // address
            48,                 // size
            1, 2, 3, 4,         // registers
            9,                  // stack length
        ] {
            body.extend(w.to_ne_bytes());
        }
        body.extend(b"ABCDEFGHI\0\0\0\0\0\0\0");
        let Some(Event::Alloc(a)) = decode(kind::ALLOC, &body) else { panic!() };
        assert_eq!((a.time, a.pid, a.tid, a.address, a.size), (77, 5, 6, 0x1000, 48));
        assert_eq!(a.regs, [1, 2, 3, 4]);
        assert_eq!(a.stack, b"ABCDEFGHI");
        assert_eq!(decode(kind::ALLOC, &body[..72 + 8]), None, "stack cut short");
        assert_eq!(
            decode(kind::FREE, &body[..24]),
            Some(Event::Free { time: 77, pid: 5, tid: 6, address: 0x1000 })
        );
        assert_eq!(decode(kind::FREE, &body[..16]), None);
        assert_eq!(decode(99, &body), None);
    }
}
