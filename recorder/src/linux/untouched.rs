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
//! read of at most 16 pages takes microseconds, and a thread is read at
//! most once per [`REREAD_INTERVAL`].

use super::sys;
use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

/// A thread whose stack was read is read again only after this long: the
/// samples already in flight when it was read are cut short at the same
/// place, and reading again would not help them.
const REREAD_INTERVAL: Duration = Duration::from_millis(250);

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

/// Reads the untouched stack pages of threads, once each.
pub(crate) struct UntouchedPages {
    page_size: u64,
    last_read: HashMap<(u32, u32), Instant>,
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

    /// A sample of thread `tid` of `pid` was cut short before `missing`:
    /// read one byte of each of its pages, unless the thread was read
    /// recently.
    pub fn cut_short(&mut self, pid: u32, tid: u32, missing: Range<u64>) {
        self.stats.cut_short += 1;
        let now = Instant::now();
        if self
            .last_read
            .get(&(pid, tid))
            .is_some_and(|t| now.duration_since(*t) < REREAD_INTERVAL)
        {
            return;
        }
        if self.last_read.len() >= MAX_THREADS {
            self.last_read.clear();
        }
        self.last_read.insert((pid, tid), now);
        let pages = page_starts(missing, self.page_size);
        self.stats.reads += 1;
        match sys::read_one_byte_each(pid, &pages) {
            Ok(_) => {}
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
    fn reads_are_rate_limited_per_thread() {
        let mut u = UntouchedPages::new(PAGE);
        // Our own process: reading our pages works.
        let pid = std::process::id();
        let buf = vec![1u8; 3 * PAGE as usize];
        let start = buf.as_ptr() as u64;
        u.cut_short(pid, 1, start..start + 2 * PAGE);
        u.cut_short(pid, 1, start..start + 2 * PAGE);
        u.cut_short(pid, 2, start..start + 2 * PAGE);
        assert_eq!(u.stats.cut_short, 3);
        assert_eq!(u.stats.reads, 2);
        assert_eq!(u.stats.failed, 0, "{:?}", u.stats.first_error);
        u.thread_exited(pid, 1);
        u.cut_short(pid, 1, start..start + PAGE);
        assert_eq!(u.stats.reads, 3);
        // Unmapped memory: the read fails and says why.
        u.cut_short(pid, 3, 0..PAGE);
        assert_eq!(u.stats.failed, 1);
        assert!(u.stats.first_error.is_some());
    }
}
