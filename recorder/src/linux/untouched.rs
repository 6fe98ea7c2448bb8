//! Stack copies cut short at a page the thread never touched.
//!
//! The kernel copies a sample's user stack without faulting pages in, and
//! stops at the first page that is not present. A thread running in a
//! function with a large local buffer it wrote only in part (an I/O or
//! formatting buffer, an array on the stack) has such pages between its
//! stack pointer and its callers: every copy ends there, and the analyzer
//! cannot unwind past that function. Reading those pages once from here,
//! with `process_vm_readv`, maps them into the target as read-only zero
//! pages; later copies then go through. The target's memory is never
//! written. The sample that showed the gap keeps its short copy, flagged
//! [`SampleFlags::STACK_CUT_SHORT`](lrnprof_format::SampleFlags), and the
//! analyzer continues it with the kernel's frame-pointer callchain where
//! the code has frame pointers.
//!
//! Runs on the writer thread, which already reads `/proc` and files; the
//! read of at most 16 pages takes microseconds. Samples taken before a
//! read are cut short at the same place (they were in flight), so a
//! thread is read again only when a copy stops where the last read did
//! not reach, or when a copy taken after the read still stops inside it
//! (then with a growing pause, so pages that cannot be made present cost
//! a few reads, not one per sample).

use super::sys;
use std::collections::HashMap;
use std::ops::Range;

/// The first pause before a thread whose read did not help is read again
/// at the same place, in ns; it doubles with each read that does not
/// help, up to [`MAX_RETRY_PAUSE_NS`].
const RETRY_PAUSE_NS: u64 = 10_000_000;
const MAX_RETRY_PAUSE_NS: u64 = 1_000_000_000;

/// Threads remembered at most; past it the memory of past reads is
/// forgotten (costing at most one extra read per thread).
const MAX_THREADS: usize = 1 << 16;

/// Bytes of a sample record that the kernel may give to the record's other
/// fields when it sizes the stack copy to fit a record's 64 KiB, beyond
/// those before the copy (its size and `dyn_size` fields, and fields
/// after it).
const RECORD_SLACK: u64 = 128;

/// The part of a thread's stack that a copy did not reach although it was
/// meant to: `Some(start..end)` (AVMAs) when the copy of `copied` bytes
/// from `sp` ended on a page boundary (`page_size`), below the end of the
/// stack's mapping (`stack_end`), and shorter than the kernel had room for
/// (`stack_size` asked for, the copy's size field at `stack_offset` in its
/// record). A copy that simply reached the top of the stack ends at
/// `stack_end`; one the kernel cut to fit its record ends almost never on
/// a page boundary and is as long as the room it had.
pub(crate) fn missing_range(
    sp: u64,
    copied: usize,
    stack_end: u64,
    stack_size: u32,
    stack_offset: usize,
    page_size: u64,
) -> Option<Range<u64>> {
    let end = sp.checked_add(copied as u64)?;
    let room = u64::from(stack_size).min(
        u64::from(u16::MAX)
            .saturating_sub(stack_offset as u64)
            .saturating_sub(RECORD_SLACK),
    );
    let on_page_boundary = page_size.is_power_of_two() && end & (page_size - 1) == 0;
    if copied == 0 || !on_page_boundary || end >= stack_end || copied as u64 >= room {
        return None;
    }
    Some(end..stack_end.min(sp.saturating_add(u64::from(stack_size))))
}

/// What became of the copies that were cut short.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct UntouchedStats {
    /// Samples whose copy was cut short.
    pub cut_short: u64,
    /// Reads made of threads' stacks.
    pub reads: u64,
    /// Reads that failed, and the first failure.
    pub failed: u64,
    pub first_error: Option<String>,
}

/// The last read of one thread's stack.
#[derive(Debug, Clone)]
struct LastRead {
    /// When it was made (`CLOCK_MONOTONIC` ns, the clock of samples).
    time: u64,
    /// What it read (AVMAs).
    range: Range<u64>,
    /// Pause before reading the same place again after a copy taken
    /// after this read still stopped in it.
    retry_pause: u64,
}

/// Reads the untouched stack pages of threads, once each.
pub(crate) struct UntouchedPages {
    page_size: u64,
    last_read: HashMap<(u32, u32), LastRead>,
    pub stats: UntouchedStats,
}

impl UntouchedPages {
    /// For pages of `page_size` bytes.
    pub fn new(page_size: u64) -> UntouchedPages {
        UntouchedPages {
            page_size,
            last_read: HashMap::new(),
            stats: UntouchedStats::default(),
        }
    }

    /// Bytes per page.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// A sample of thread `tid` of `pid` taken at `time` was cut short
    /// before `missing`: read one byte of each of its pages, unless a read
    /// of that place is already on its way to the samples.
    pub fn cut_short(&mut self, pid: u32, tid: u32, time: u64, missing: Range<u64>) {
        self.stats.cut_short += 1;
        let now = sys::monotonic_ns();
        let retry_pause = match self.last_read.get(&(pid, tid)) {
            Some(last) if last.range.contains(&missing.start) => {
                if time <= last.time {
                    // Taken before the read: in flight, nothing to do.
                    return;
                }
                // Taken after the read and still cut at a page it read.
                if now.saturating_sub(last.time) < last.retry_pause {
                    return;
                }
                (last.retry_pause * 2).min(MAX_RETRY_PAUSE_NS)
            }
            // Never read, or the copy stopped where the last read did not
            // reach: read at once.
            _ => RETRY_PAUSE_NS,
        };
        if self.last_read.len() >= MAX_THREADS {
            self.last_read.clear();
        }
        self.last_read.insert(
            (pid, tid),
            LastRead {
                time: now,
                range: missing.clone(),
                retry_pause,
            },
        );
        let pages = page_starts(missing, self.page_size);
        self.stats.reads += 1;
        match sys::read_one_byte_each(pid, &pages) {
            Ok(n) if n == pages.len() => {}
            Ok(n) => {
                self.stats.failed += 1;
                self.stats.first_error.get_or_insert_with(|| {
                    format!("only {n} of {} pages could be read", pages.len())
                });
            }
            // The process is gone: nothing left to complete.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => {
                self.stats.failed += 1;
                self.stats.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// The thread exited: forget it.
    pub fn thread_exited(&mut self, pid: u32, tid: u32) {
        self.last_read.remove(&(pid, tid));
    }

    /// The process exec'd: its address space is new.
    pub fn process_replaced(&mut self, pid: u32) {
        self.last_read.retain(|&(p, _), _| p != pid);
    }
}

/// The start of every page that `range` touches.
fn page_starts(range: Range<u64>, page_size: u64) -> Vec<u64> {
    let mask = !(page_size - 1);
    let mut pages = Vec::new();
    let mut page = range.start & mask;
    while page < range.end {
        pages.push(page);
        match page.checked_add(page_size) {
            Some(next) => page = next,
            None => break,
        }
    }
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    #[test]
    fn a_copy_ending_at_an_untouched_page_is_cut_short() {
        // sp 0x7000_0f00, 0x100 bytes copied: ends at the page 0x7000_1000,
        // the stack mapping goes on to 0x7001_0000.
        let r = missing_range(0x7000_0f00, 0x100, 0x7001_0000, 65528, 104, PAGE);
        assert_eq!(r, Some(0x7000_1000..0x7001_0000));
        // The missing part ends where the copy would have ended.
        let r = missing_range(0x7000_0f00, 0x100, 0x8000_0000, 8192, 104, PAGE);
        assert_eq!(r, Some(0x7000_1000..0x7000_2f00));
    }

    #[test]
    fn whole_copies_are_not_cut_short() {
        // Reached the top of the stack.
        assert_eq!(
            missing_range(0x7000_0f00, 0x100, 0x7000_1000, 65528, 104, PAGE),
            None
        );
        // Not on a page boundary.
        assert_eq!(
            missing_range(0x7000_0f00, 0x108, 0x7001_0000, 65528, 104, PAGE),
            None
        );
        // As long as the record had room for (a deep stack): 8 KiB asked.
        assert_eq!(
            missing_range(0x7000_0000, 8192, 0x7010_0000, 8192, 104, PAGE),
            None
        );
        // The kernel cut a 64 KiB copy to fit a record with a long callchain.
        let offset = 104 + 127 * 8;
        let room = 65535 - offset - 40;
        let sp = 0x7010_0000 - room as u64;
        assert_eq!(
            missing_range(sp, room, 0x7020_0000, 65528, offset, PAGE),
            None
        );
        // Nothing copied: the stack pointer itself was not readable.
        assert_eq!(
            missing_range(0x7000_0000, 0, 0x7001_0000, 65528, 104, PAGE),
            None
        );
    }

    #[test]
    fn pages_of_a_range() {
        assert_eq!(page_starts(0x1000..0x3000, PAGE), vec![0x1000, 0x2000]);
        assert_eq!(page_starts(0x1000..0x2f00, PAGE), vec![0x1000, 0x2000]);
        assert!(page_starts(0x1000..0x1000, PAGE).is_empty());
    }

    #[test]
    fn samples_in_flight_do_not_read_again() {
        let mut u = UntouchedPages::new(PAGE);
        // Our own process: reading our pages works.
        let pid = std::process::id();
        let buf = vec![1u8; 4 * PAGE as usize];
        let start = (buf.as_ptr() as u64 + PAGE - 1) & !(PAGE - 1);
        let t0 = sys::monotonic_ns();
        u.cut_short(pid, 1, t0, start..start + 2 * PAGE);
        assert_eq!(u.stats.reads, 1);
        // Taken before that read: in flight.
        u.cut_short(pid, 1, t0, start + PAGE..start + 2 * PAGE);
        assert_eq!(u.stats.reads, 1);
        // Another thread is read on its own.
        u.cut_short(pid, 2, t0, start..start + 2 * PAGE);
        assert_eq!(u.stats.reads, 2);
        assert_eq!(u.stats.cut_short, 3);
        assert_eq!(u.stats.failed, 0, "{:?}", u.stats.first_error);
    }

    #[test]
    fn a_copy_stopping_beyond_the_last_read_is_read_at_once() {
        let mut u = UntouchedPages::new(PAGE);
        let pid = std::process::id();
        let buf = vec![1u8; 5 * PAGE as usize];
        let start = (buf.as_ptr() as u64 + PAGE - 1) & !(PAGE - 1);
        let t0 = sys::monotonic_ns();
        u.cut_short(pid, 1, t0, start..start + PAGE);
        // An older sample, but stopped where the read did not reach.
        u.cut_short(pid, 1, t0, start + 2 * PAGE..start + 3 * PAGE);
        assert_eq!(u.stats.reads, 2);
    }

    #[test]
    fn a_read_that_did_not_help_is_retried_with_growing_pauses() {
        let mut u = UntouchedPages::new(PAGE);
        let pid = std::process::id();
        let buf = vec![1u8; 3 * PAGE as usize];
        let start = (buf.as_ptr() as u64 + PAGE - 1) & !(PAGE - 1);
        let range = start..start + PAGE;
        u.cut_short(pid, 1, 0, range.clone());
        let read_at = u.last_read[&(pid, 1)].time;
        // Taken after the read, cut at the same place: not within the
        // first pause...
        u.cut_short(pid, 1, read_at + 1, range.clone());
        assert_eq!(u.stats.reads, 1);
        // ...but once it has passed, read again, and wait twice as long
        // before the next.
        u.last_read.get_mut(&(pid, 1)).unwrap().time = read_at - RETRY_PAUSE_NS;
        u.cut_short(pid, 1, read_at + 1, range.clone());
        assert_eq!(u.stats.reads, 2);
        assert_eq!(u.last_read[&(pid, 1)].retry_pause, 2 * RETRY_PAUSE_NS);
        // An exec forgets the process's threads.
        u.process_replaced(pid);
        u.cut_short(pid, 1, 0, range);
        assert_eq!(u.stats.reads, 3);
    }

    #[test]
    fn failed_and_partial_reads_say_why() {
        let mut u = UntouchedPages::new(PAGE);
        let pid = std::process::id();
        // Unmapped memory: the read fails and says why.
        u.cut_short(pid, 3, 0, 0..PAGE);
        assert_eq!(u.stats.failed, 1);
        assert!(u.stats.first_error.is_some());
        // A page that cannot be read in the middle: counted, and the first
        // reason is kept.
        let len = 3 * PAGE as usize;
        // Safety: a fresh private mapping of our own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let start = p as u64;
        // Safety: the middle page of the mapping made above.
        let rc =
            unsafe { libc::mprotect((start + PAGE) as *mut _, PAGE as usize, libc::PROT_NONE) };
        assert_eq!(rc, 0);
        let mut u = UntouchedPages::new(PAGE);
        u.cut_short(pid, 4, 0, start..start + 3 * PAGE);
        assert_eq!(u.stats.failed, 1);
        assert_eq!(
            u.stats.first_error.as_deref(),
            Some("only 1 of 3 pages could be read")
        );
        // Safety: the mapping made above, no longer used.
        unsafe { libc::munmap(p, len) };
    }
}
