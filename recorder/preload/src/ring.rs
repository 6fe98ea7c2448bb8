//! The ring in shared memory: many producers (every thread of every
//! process the sampler runs in), one consumer (the recorder).
//!
//! A producer reserves space with a compare-and-swap on `head`, writes the
//! record's header word at once (so the consumer knows its length even if
//! the producer dies before finishing), writes the body, then sets the
//! header's [`COMMITTED`] bit. The consumer takes committed records in
//! ring order, zeroes their space and moves `tail`, which frees it.
//!
//! A producer never waits here: [`Ring::reserve`] fails when the ring is
//! full, and the caller decides whether to retry. A producer that dies
//! between reserving and committing (its process exits from another
//! thread, or is killed) would stop the consumer forever; after
//! `patience` the consumer drops such a record, or, if not even its header
//! was written, gives up on the ring ([`Pop::Broken`]).

use crate::protocol::{header_word, lap, Control, Header, COMMITTED, MAX_RECORD};
use core::sync::atomic::{AtomicU64, Ordering};

/// Record kind of space a producer reserved and then gave up on: the
/// consumer skips it.
pub const KIND_SKIP: u8 = 0;

/// A ring: the control block and the data after it.
#[derive(Debug)]
pub struct Ring {
    control: *const Control,
    data: *mut u8,
    log2: u32,
}

// Safety: the ring is shared memory, only accessed through atomics and
// through space a reservation owns.
unsafe impl Send for Ring {}
// Safety: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// A ring over `control` and `1 << control.settings.data_log2` bytes
    /// at `data`.
    ///
    /// # Safety
    /// Both must stay mapped, readable and writable for the life of the
    /// ring; `data` must be 8-byte aligned; `data_log2` must be at least
    /// [`crate::protocol::MIN_DATA_LOG2`] and below 64.
    pub unsafe fn new(control: *const Control, data: *mut u8) -> Ring {
        // Safety: the caller guarantees `control` is valid.
        let log2 = unsafe { (*control).settings.data_log2 };
        Ring {
            control,
            data,
            log2,
        }
    }

    /// The control block.
    pub fn control(&self) -> &Control {
        // Safety: valid for the ring's life (see `new`).
        unsafe { &*self.control }
    }

    fn size(&self) -> u64 {
        1 << self.log2
    }

    fn at(&self, pos: u64) -> *mut u8 {
        // Safety: the offset is below the data size (masked).
        unsafe { self.data.add((pos & (self.size() - 1)) as usize) }
    }

    fn header(&self, pos: u64) -> &AtomicU64 {
        // Safety: positions of records are 8-aligned and the data is
        // 8-aligned, so the word is aligned and inside the ring; it is only
        // accessed atomically while a record lives there.
        unsafe { AtomicU64::from_ptr(self.at(pos).cast()) }
    }

    /// Reserve `len` bytes (header included; a multiple of 8, at most
    /// [`MAX_RECORD`]) for a record of `kind`. `None` if the ring has no
    /// room now.
    pub fn reserve(&self, len: usize, kind: u8) -> Option<Reservation<'_>> {
        if !len.is_multiple_of(8) || !(8..=MAX_RECORD).contains(&len) {
            return None;
        }
        let control = self.control();
        let mut head = control.head.0.load(Ordering::Relaxed);
        loop {
            // Acquire: the space the consumer freed, and zeroed, is ours.
            let tail = control.tail.0.load(Ordering::Acquire);
            if head.wrapping_sub(tail).saturating_add(len as u64) > self.size() {
                return None;
            }
            match control.head.0.compare_exchange_weak(
                head,
                head.wrapping_add(len as u64),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        let word = header_word(len as u32, kind, head, self.log2);
        self.header(head).store(word, Ordering::Release);
        Some(Reservation {
            ring: self,
            pos: head,
            len,
            word,
            at: 8,
            committed: false,
        })
    }

    fn copy_out(&self, pos: u64, out: &mut [u8]) {
        let first = (self.size() - (pos & (self.size() - 1))).min(out.len() as u64) as usize;
        // Safety: both parts lie inside the ring (the first ends at its
        // end at most, the second starts at its start), and `out` is ours.
        unsafe {
            core::ptr::copy_nonoverlapping(self.at(pos), out.as_mut_ptr(), first);
            core::ptr::copy_nonoverlapping(
                self.data,
                out.as_mut_ptr().add(first),
                out.len() - first,
            );
        }
    }

    fn zero(&self, pos: u64, len: usize) {
        self.header(pos).store(0, Ordering::Relaxed);
        let body = pos.wrapping_add(8);
        let n = len - 8;
        let first = (self.size() - (body & (self.size() - 1))).min(n as u64) as usize;
        // Safety: as in `copy_out`; the space belongs to the consumer until
        // it moves `tail`.
        unsafe {
            core::ptr::write_bytes(self.at(body), 0, first);
            core::ptr::write_bytes(self.data, 0, n - first);
        }
    }
}

/// Space reserved for one record, written front to back, then committed.
/// Dropped without [`commit`](Self::commit), it becomes a record the
/// consumer skips.
#[derive(Debug)]
pub struct Reservation<'r> {
    ring: &'r Ring,
    pos: u64,
    len: usize,
    word: u64,
    /// Bytes written so far, the header included.
    at: usize,
    committed: bool,
}

impl Reservation<'_> {
    /// Bytes left to write.
    pub fn remaining(&self) -> usize {
        self.len - self.at
    }

    /// Bytes written so far, the header included: an offset for
    /// [`set_u64`](Self::set_u64).
    pub fn offset(&self) -> usize {
        self.at
    }

    /// Overwrite the word at `offset` (8-aligned, after the header, before
    /// the end; others are ignored), for a value known only later.
    pub fn set_u64(&mut self, offset: usize, v: u64) {
        if offset >= 8 && offset.is_multiple_of(8) && offset + 8 <= self.len {
            let p = self.ring.at(self.pos.wrapping_add(offset as u64));
            // Safety: an aligned word of this reservation's space.
            unsafe { p.cast::<u64>().write(v) };
        }
    }

    /// Append a word (the reservation has room for it, checked).
    pub fn put_u64(&mut self, v: u64) {
        if self.remaining() >= 8 {
            let p = self.ring.at(self.pos.wrapping_add(self.at as u64));
            // Safety: 8-aligned (records and their words are), inside the
            // ring, and ours until committed.
            unsafe { p.cast::<u64>().write(v) };
            self.at += 8;
        }
    }

    /// Append `n` bytes from `src` (at most what remains).
    ///
    /// # Safety
    /// `src` must be readable for `n` bytes.
    pub unsafe fn put_bytes(&mut self, src: *const u8, n: usize) {
        let n = n.min(self.remaining());
        let [(a, a_len), (b, b_len)] = self.next_segments(n);
        // Safety: the segments are ours; the caller vouches for `src`.
        unsafe {
            core::ptr::copy_nonoverlapping(src, a, a_len);
            core::ptr::copy_nonoverlapping(src.add(a_len), b, b_len);
        }
        self.at += n;
    }

    /// The next `n` bytes of the record (at most what remains) as at most
    /// two writable ranges of the ring, for a caller that fills them
    /// itself (then calls [`skip`](Self::skip)).
    pub fn next_segments(&self, n: usize) -> [(*mut u8, usize); 2] {
        let n = n.min(self.remaining());
        let start = self.pos.wrapping_add(self.at as u64);
        let size = self.ring.size();
        let first = (size - (start & (size - 1))).min(n as u64) as usize;
        [(self.ring.at(start), first), (self.ring.data, n - first)]
    }

    /// Move past `n` bytes (filled through [`next_segments`](Self::next_segments),
    /// or left as padding).
    pub fn skip(&mut self, n: usize) {
        self.at += n.min(self.remaining());
    }

    /// Publish the record.
    pub fn commit(mut self) {
        self.ring
            .header(self.pos)
            .store(self.word | COMMITTED, Ordering::Release);
        self.committed = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            let word = header_word(self.len as u32, KIND_SKIP, self.pos, self.ring.log2);
            self.ring
                .header(self.pos)
                .store(word | COMMITTED, Ordering::Release);
        }
    }
}

/// What [`Consumer::pop`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pop {
    /// A record of `kind`; its body (after the header word) is the first
    /// `len` bytes of the caller's buffer.
    Record {
        /// The record's kind.
        kind: u8,
        /// Bytes of its body.
        len: usize,
    },
    /// Nothing reserved.
    Empty,
    /// The next record is being written.
    Waiting,
    /// The next record was reserved but not committed within the patience
    /// given: it was dropped.
    Dropped,
    /// The ring cannot be read on: space was reserved and no header
    /// written within the patience given, or a header makes no sense.
    Broken,
}

/// The consumer side.
#[derive(Debug)]
pub struct Consumer {
    ring: Ring,
    /// Ring position and time (ns) since which the next record has not
    /// been ready.
    stalled: Option<(u64, u64)>,
    broken: bool,
}

impl Consumer {
    /// The consumer of `ring` (there must be only one).
    pub fn new(ring: Ring) -> Consumer {
        Consumer {
            ring,
            stalled: None,
            broken: false,
        }
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Take the next record into `out` (at least [`MAX_RECORD`] bytes).
    /// `now_ns` is the caller's clock; a record not ready for longer than
    /// `patience_ns` is given up on (0: at once, for the last drain).
    pub fn pop(&mut self, out: &mut [u8], now_ns: u64, patience_ns: u64) -> Pop {
        if self.broken || out.len() < MAX_RECORD {
            return Pop::Broken;
        }
        let ring = &self.ring;
        let control = ring.control();
        let tail = control.tail.0.load(Ordering::Relaxed);
        let head = control.head.0.load(Ordering::Acquire);
        let available = head.wrapping_sub(tail);
        if available == 0 {
            self.stalled = None;
            return Pop::Empty;
        }
        if available > ring.size() || !available.is_multiple_of(8) {
            self.broken = true;
            return Pop::Broken;
        }
        let word = ring.header(tail).load(Ordering::Acquire);
        let h = Header::parse(word);
        if word == 0 || h.lap != lap(tail, ring.log2) {
            // Reserved, header not written yet.
            if self.waited_too_long(tail, now_ns, patience_ns) {
                self.broken = true;
                return Pop::Broken;
            }
            return Pop::Waiting;
        }
        let len = h.len as usize;
        if len < 8 || !len.is_multiple_of(8) || len > MAX_RECORD || len as u64 > available {
            self.broken = true;
            return Pop::Broken;
        }
        if !h.committed {
            if !self.waited_too_long(tail, now_ns, patience_ns) {
                return Pop::Waiting;
            }
            self.release(tail, len);
            return Pop::Dropped;
        }
        ring.copy_out(tail.wrapping_add(8), &mut out[..len - 8]);
        self.release(tail, len);
        Pop::Record {
            kind: h.kind,
            len: len - 8,
        }
    }

    fn release(&mut self, tail: u64, len: usize) {
        self.stalled = None;
        self.ring.zero(tail, len);
        // Release: the zeroed space goes to the producers.
        self.ring
            .control()
            .tail
            .0
            .store(tail.wrapping_add(len as u64), Ordering::Release);
    }

    fn waited_too_long(&mut self, tail: u64, now_ns: u64, patience_ns: u64) -> bool {
        match self.stalled {
            Some((pos, since)) if pos == tail => now_ns.saturating_sub(since) >= patience_ns,
            _ => {
                self.stalled = Some((tail, now_ns));
                patience_ns == 0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{kind, Settings, MIN_DATA_LOG2};
    use std::sync::Arc;

    /// A ring in ordinary memory.
    struct Mem {
        control: Box<Control>,
        data: Vec<u64>,
    }

    impl Mem {
        fn new(log2: u32) -> Arc<Mem> {
            let control = Box::new(Control {
                settings: Settings {
                    data_log2: log2,
                    ..Settings::default()
                },
                ..Control::default()
            });
            Arc::new(Mem {
                control,
                data: vec![0; (1 << log2) / 8],
            })
        }

        fn ring(&self) -> Ring {
            // Safety: the memory lives as long as the test's Arc; data is
            // u64-aligned and of the declared size.
            unsafe { Ring::new(&*self.control, self.data.as_ptr() as *mut u8) }
        }
    }

    fn put(ring: &Ring, kind: u8, words: &[u64]) -> bool {
        let Some(mut r) = ring.reserve(8 + words.len() * 8, kind) else {
            return false;
        };
        for &w in words {
            r.put_u64(w);
        }
        r.commit();
        true
    }

    fn words(out: &[u8], len: usize) -> Vec<u64> {
        out[..len]
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn records_wrap_around_and_come_back_in_order() {
        let mem = Mem::new(MIN_DATA_LOG2);
        let ring = mem.ring();
        let mut consumer = Consumer::new(mem.ring());
        let mut out = vec![0u8; MAX_RECORD];
        let big = vec![7u8; 40_000];
        for round in 0..20u64 {
            // Three records of ~40 KB fill most of the 256 KiB ring;
            // over the rounds they cross its end at every offset.
            for i in 0..3 {
                let mut r = ring.reserve(8 + 8 + 40_000, kind::ALLOC).unwrap();
                r.put_u64(round * 10 + i);
                // Safety: `big` has 40,000 bytes.
                unsafe { r.put_bytes(big.as_ptr(), big.len()) };
                r.commit();
            }
            assert!(put(&ring, kind::FREE, &[round]));
            for i in 0..3 {
                match consumer.pop(&mut out, 0, u64::MAX) {
                    Pop::Record { kind, len } => {
                        assert_eq!((kind, len), (kind::ALLOC, 40_008));
                        assert_eq!(words(&out, 8), [round * 10 + i]);
                        assert!(out[8..len].iter().all(|&b| b == 7));
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(
                consumer.pop(&mut out, 0, u64::MAX),
                Pop::Record {
                    kind: kind::FREE,
                    len: 8
                }
            );
            assert_eq!(consumer.pop(&mut out, 0, u64::MAX), Pop::Empty);
        }
        // Consumed space is zero again.
        assert!(mem.data.iter().all(|&w| w == 0));
    }

    #[test]
    fn a_full_ring_refuses_and_bad_lengths_are_refused() {
        let mem = Mem::new(MIN_DATA_LOG2);
        let ring = mem.ring();
        let n = (1usize << MIN_DATA_LOG2) / MAX_RECORD;
        let held: Vec<_> = (0..n)
            .map(|_| ring.reserve(MAX_RECORD, kind::ALLOC).unwrap())
            .collect();
        assert!(ring.reserve(MAX_RECORD, kind::ALLOC).is_none());
        assert!(
            ring.reserve(12, kind::FREE).is_none(),
            "not a multiple of 8"
        );
        assert!(ring.reserve(MAX_RECORD + 8, kind::ALLOC).is_none());
        // Dropped reservations become records the consumer skips.
        drop(held);
        let mut consumer = Consumer::new(mem.ring());
        let mut out = vec![0u8; MAX_RECORD];
        for _ in 0..n {
            assert!(matches!(
                consumer.pop(&mut out, 0, 1),
                Pop::Record {
                    kind: KIND_SKIP,
                    ..
                }
            ));
        }
        assert_eq!(consumer.pop(&mut out, 0, 1), Pop::Empty);
    }

    #[test]
    fn a_producer_that_never_commits_is_given_up_on() {
        let mem = Mem::new(MIN_DATA_LOG2);
        let ring = mem.ring();
        let stuck = ring.reserve(32, kind::FREE).unwrap();
        assert!(put(&ring, kind::HELLO, &[1, 2, 3]));
        let mut consumer = Consumer::new(mem.ring());
        let mut out = vec![0u8; MAX_RECORD];
        assert_eq!(consumer.pop(&mut out, 100, 50), Pop::Waiting);
        assert_eq!(consumer.pop(&mut out, 140, 50), Pop::Waiting);
        assert_eq!(consumer.pop(&mut out, 150, 50), Pop::Dropped);
        assert_eq!(
            consumer.pop(&mut out, 150, 50),
            Pop::Record {
                kind: kind::HELLO,
                len: 24
            }
        );
        // Its late commit lands in freed space and is never read.
        stuck.commit();
        assert_eq!(consumer.pop(&mut out, 150, 50), Pop::Empty);
        // A reservation whose header never appeared: nothing after it can
        // be found, the ring is given up.
        mem.control.head.0.fetch_add(16, Ordering::Relaxed);
        assert_eq!(consumer.pop(&mut out, 200, 10), Pop::Waiting);
        assert_eq!(consumer.pop(&mut out, 210, 10), Pop::Broken);
        assert_eq!(consumer.pop(&mut out, 210, 10), Pop::Broken);
    }

    #[test]
    fn many_threads_write_one_reads_everything_in_each_threads_order() {
        let mem = Mem::new(MIN_DATA_LOG2);
        const THREADS: u64 = 4;
        const EACH: u64 = 20_000;
        let producers: Vec<_> = (0..THREADS)
            .map(|t| {
                let mem = Arc::clone(&mem);
                std::thread::spawn(move || {
                    let ring = mem.ring();
                    for i in 0..EACH {
                        // Vary the length so records cross the end anywhere.
                        let words = vec![t << 32 | i; 1 + (i % 5) as usize];
                        while !put(&ring, kind::FREE, &words) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut consumer = Consumer::new(mem.ring());
        let mut out = vec![0u8; MAX_RECORD];
        let mut next = [0u64; THREADS as usize];
        let mut seen = 0;
        while seen < THREADS * EACH {
            match consumer.pop(&mut out, 0, u64::MAX) {
                Pop::Record { kind, len } => {
                    assert_eq!(kind, kind::FREE);
                    let w = words(&out, len);
                    let (t, i) = ((w[0] >> 32) as usize, w[0] & 0xffff_ffff);
                    assert_eq!(i, next[t], "thread {t} out of order");
                    assert!(w.iter().all(|&x| x == w[0]));
                    next[t] += 1;
                    seen += 1;
                }
                Pop::Empty | Pop::Waiting => std::thread::yield_now(),
                other => panic!("{other:?}"),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
    }
}
