//! The sampled blocks of one process that are still allocated, so that
//! `free` can tell, cheaply and without a lock, whether to record a free.
//!
//! Every `free` asks; almost every answer is no. A small counting filter
//! (4 KiB, which stays in the L1 cache) answers most of them from one
//! byte; the rest look at one bucket of [`BUCKET_SLOTS`] addresses (one
//! cache line) in a table of the process's own memory. A block whose
//! bucket is full cannot be remembered: the caller then does not record
//! the allocation either (and counts it as lost), so no free goes missing.
//!
//! After `fork` the child has a copy, which is right: it inherited the
//! same blocks.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Addresses per bucket: one 64-byte cache line.
pub const BUCKET_SLOTS: usize = 8;

const FILTER_LOG2: u32 = 12;

/// The set of live sampled blocks.
#[derive(Debug)]
pub struct Table {
    slots: AtomicPtr<AtomicU64>,
    log2: AtomicU32,
    live: AtomicUsize,
    filter: [AtomicU8; 1 << FILTER_LOG2],
}

impl Default for Table {
    fn default() -> Self {
        Self::new()
    }
}

#[inline(always)]
fn hash(address: u64) -> u64 {
    // Blocks are at least 16-byte aligned: the low bits carry nothing.
    (address >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Table {
    /// An empty table with no memory yet: remembers nothing.
    pub const fn new() -> Table {
        Table {
            slots: AtomicPtr::new(core::ptr::null_mut()),
            log2: AtomicU32::new(0),
            live: AtomicUsize::new(0),
            filter: [const { AtomicU8::new(0) }; 1 << FILTER_LOG2],
        }
    }

    /// Bytes of memory for a table of `1 << log2` buckets.
    pub const fn bytes(log2: u32) -> usize {
        (1 << log2) * BUCKET_SLOTS * 8
    }

    /// Use `memory` (zeroed, [`bytes`](Self::bytes)`(log2)` long, 8-aligned).
    ///
    /// # Safety
    /// The memory must stay valid and unused by anything else for the
    /// process's life; call once, before any other method.
    pub unsafe fn attach(&self, memory: *mut u64, log2: u32) {
        self.log2.store(log2, Ordering::Relaxed);
        self.slots.store(memory.cast(), Ordering::Release);
    }

    fn bucket(&self, address: u64) -> Option<&[AtomicU64]> {
        let slots = self.slots.load(Ordering::Acquire);
        if slots.is_null() {
            return None;
        }
        let log2 = self.log2.load(Ordering::Relaxed);
        let index = if log2 == 0 {
            0
        } else {
            (hash(address) >> (64 - log2)) as usize
        };
        // Safety: `attach` gave `1 << log2` buckets of BUCKET_SLOTS words.
        Some(unsafe { core::slice::from_raw_parts(slots.add(index * BUCKET_SLOTS), BUCKET_SLOTS) })
    }

    #[inline(always)]
    fn filter(&self, address: u64) -> &AtomicU8 {
        &self.filter[(hash(address) >> (64 - FILTER_LOG2)) as usize]
    }

    /// Remember `address`; `false` if its bucket is full (or it is 0).
    pub fn insert(&self, address: u64) -> bool {
        let Some(bucket) = self.bucket(address).filter(|_| address != 0) else {
            return false;
        };
        let count = self.filter(address);
        // Before the address is findable; a count at 255 stays there.
        let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1));
        for slot in bucket {
            if slot
                .compare_exchange(0, address, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                self.live.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        self.forget(count);
        false
    }

    /// Whether `address` may be remembered: `false` is sure, and is what
    /// almost every `free` hears, from one byte of the filter.
    #[inline(always)]
    pub fn may_hold(&self, address: u64) -> bool {
        self.live.load(Ordering::Relaxed) != 0 && self.filter(address).load(Ordering::Relaxed) != 0
    }

    /// Forget `address` if it is remembered; `true` if it was.
    #[inline(always)]
    pub fn remove(&self, address: u64) -> bool {
        self.may_hold(address) && self.remove_slow(address)
    }

    #[cold]
    #[inline(never)]
    fn remove_slow(&self, address: u64) -> bool {
        // 0 marks a free slot: it is never remembered.
        if address == 0 {
            return false;
        }
        let Some(bucket) = self.bucket(address) else {
            return false;
        };
        for slot in bucket {
            if slot.load(Ordering::Relaxed) == address
                && slot
                    .compare_exchange(address, 0, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.live.fetch_sub(1, Ordering::Relaxed);
                self.forget(self.filter(address));
                return true;
            }
        }
        false
    }

    fn forget(&self, count: &AtomicU8) {
        let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| match c {
            0 | 255 => None,
            c => Some(c - 1),
        });
    }

    /// Blocks remembered now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_removed_and_refuses_when_a_bucket_is_full() {
        let t = Table::new();
        assert!(!t.insert(0x1000), "no memory yet");
        let mut memory = vec![0u64; Table::bytes(0) / 8];
        // Safety: the vector outlives the table's use in this test.
        unsafe { t.attach(memory.as_mut_ptr(), 0) };
        // One bucket: eight addresses fit, the ninth does not.
        for i in 1..=8u64 {
            assert!(t.insert(i << 4));
        }
        assert!(!t.insert(9 << 4));
        assert_eq!(t.live(), 8);
        assert!(!t.remove(9 << 4));
        assert!(t.remove(3 << 4));
        assert!(!t.remove(3 << 4), "already gone");
        assert!(t.insert(9 << 4));
        for i in [1u64, 2, 4, 5, 6, 7, 8, 9] {
            assert!(t.remove(i << 4), "{i}");
        }
        assert_eq!(t.live(), 0);
        assert!(t.filter.iter().all(|c| c.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn many_addresses_in_a_larger_table() {
        let t = Table::new();
        let mut memory = vec![0u64; Table::bytes(10) / 8];
        // Safety: as above.
        unsafe { t.attach(memory.as_mut_ptr(), 10) };
        let addresses: Vec<u64> = (1..4000u64).map(|i| 0x7f00_0000_0000 + i * 48).collect();
        let kept = addresses.iter().filter(|&&a| t.insert(a)).count();
        assert!(kept > 3990, "{kept} of 3999 fit in 8192 slots");
        let removed = addresses.iter().filter(|&&a| t.remove(a)).count();
        assert_eq!(removed, kept);
        assert!(!t.remove(0x1234_5670));
        assert!(!t.insert(0), "0 is a free slot");
        assert!(!t.remove(0));
    }
}
