//! Decompressed blocks the first pass keeps for the second, so that a
//! short trace's blocks are decompressed once.
//!
//! The kept blocks share one anonymous mapping, the [`KeptArena`], sized
//! from the block headers before the first pass: the blocks at the start
//! of the trace whose decompressed bytes fit in a budget. Memory stays
//! bounded whatever the trace's length; the blocks past the budget are
//! decompressed again by the second pass.
//!
//! One mapping instead of a buffer per block: a buffer per block was
//! faulted in one 4 KiB page at a time (on a python trace of 14 MB of
//! decompressed blocks, about 3,500 page faults, the largest part of the
//! kernel's 19 % of the analysis). The arena is aligned to 2 MiB and
//! advised for transparent huge pages where the kernel offers them, which
//! makes those faults a few; elsewhere it is faulted as before.

use lrnprof_format::{BlockInfo, FormatError, RawBlock, TraceReader};
use std::sync::Mutex;

/// Alignment of the arena's first block: a transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// A block kept by the first pass, read from its part of the arena.
pub(crate) type KeptBlock<'a> = RawBlock<&'a mut [u8]>;

/// The mapping that holds the kept blocks' decompressed bytes.
#[derive(Default)]
pub(crate) struct KeptArena {
    map: Option<memmap2::MmapMut>,
    /// Where the first block starts in `map` (2 MiB aligned).
    start: usize,
    /// Decompressed length of each kept block: blocks `0..lens.len()`.
    lens: Vec<usize>,
}

impl KeptArena {
    /// An arena for the blocks at the start of `blocks` whose decompressed
    /// lengths add up to at most `budget` bytes. Without memory for it,
    /// none are kept.
    pub fn new(blocks: &[BlockInfo], budget: u64) -> KeptArena {
        let mut lens = Vec::new();
        let mut total = 0u64;
        for b in blocks {
            let len = u64::from(b.header.raw_len);
            if total + len > budget {
                break;
            }
            total += len;
            lens.push(len as usize);
        }
        let total = total as usize;
        if total == 0 {
            return KeptArena::default();
        }
        // Below a huge page, one is not worth it. Above, room to start at
        // a huge page boundary and to end at one (a huge page must lie
        // wholly inside the mapping); the pages before the start and after
        // the last block are never touched, so they take no memory unless
        // a huge page covers them.
        let huge = total >= HUGE_PAGE;
        let rounded = if huge {
            total.div_ceil(HUGE_PAGE) * HUGE_PAGE
        } else {
            total
        };
        let slack = if huge { HUGE_PAGE } else { 0 };
        let Ok(map) = memmap2::MmapMut::map_anon(rounded + slack) else {
            return KeptArena::default();
        };
        let start = if huge {
            (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE
        } else {
            0
        };
        #[cfg(target_os = "linux")]
        if huge {
            // Advice only: where the kernel has no huge pages for this
            // mapping, it is faulted in small pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, start, rounded);
        }
        KeptArena {
            map: Some(map),
            start,
            lens,
        }
    }

    /// The kept blocks' buffers, each empty until the first pass
    /// decompresses its block into it.
    pub fn blocks(&mut self) -> KeptBlocks<'_> {
        let mut buffers = Vec::with_capacity(self.lens.len());
        if let Some(map) = self.map.as_mut() {
            let mut rest = &mut map[self.start..];
            for &len in &self.lens {
                let (buf, tail) = rest.split_at_mut(len);
                buffers.push(Mutex::new(Some(buf)));
                rest = tail;
            }
        }
        KeptBlocks {
            buffers,
            blocks: Mutex::default(),
        }
    }
}

/// The first pass's kept blocks, by block index: the buffers not yet
/// decompressed into, and the blocks decompressed.
#[derive(Default)]
pub(crate) struct KeptBlocks<'a> {
    buffers: Vec<Mutex<Option<&'a mut [u8]>>>,
    blocks: Mutex<Vec<Option<KeptBlock<'a>>>>,
}

/// A block decompressed by the first pass: into its part of the arena if
/// it is kept, else into a buffer of its own.
pub(crate) enum Decompressed<'a> {
    Kept(KeptBlock<'a>),
    Own(RawBlock),
}

impl Decompressed<'_> {
    pub fn records(&self, mode: lrnprof_format::StackMode) -> lrnprof_format::BlockCursor<'_> {
        match self {
            Decompressed::Kept(raw) => raw.records(mode),
            Decompressed::Own(raw) => raw.records(mode),
        }
    }

    pub fn record_count(&self) -> u32 {
        match self {
            Decompressed::Kept(raw) => raw.record_count(),
            Decompressed::Own(raw) => raw.record_count(),
        }
    }
}

impl<'a> KeptBlocks<'a> {
    /// Decompress block `index` of `reader`: into its part of the arena
    /// if it is to be kept (once; a second call gets its own buffer).
    pub fn decompress<D: AsRef<[u8]>>(
        &self,
        reader: &TraceReader<D>,
        index: usize,
    ) -> Result<Decompressed<'a>, FormatError> {
        let block = &reader.blocks()[index];
        let buf = self.buffers.get(index).and_then(|b| lock(b).take());
        match buf {
            Some(buf) => reader.raw_block_in(block, buf).map(Decompressed::Kept),
            None => reader.raw_block(block).map(Decompressed::Own),
        }
    }

    /// Keep block `index`, if it went into the arena.
    pub fn keep(&self, index: usize, block: Decompressed<'a>) {
        let Decompressed::Kept(raw) = block else {
            return;
        };
        let mut blocks = lock(&self.blocks);
        if blocks.len() <= index {
            blocks.resize_with(index + 1, || None);
        }
        blocks[index] = Some(raw);
    }

    /// Block `index` if it was kept; it is not kept any longer.
    pub fn take(&self, index: usize) -> Option<KeptBlock<'a>> {
        lock(&self.blocks).get_mut(index)?.take()
    }

    /// Block `index` as kept ([`take`](Self::take)), else decompressed
    /// again into a buffer of its own.
    pub fn take_or_decompress<D: AsRef<[u8]>>(
        &self,
        reader: &TraceReader<D>,
        index: usize,
    ) -> Result<Decompressed<'a>, FormatError> {
        match self.take(index) {
            Some(raw) => Ok(Decompressed::Kept(raw)),
            None => reader
                .raw_block(&reader.blocks()[index])
                .map(Decompressed::Own),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{Record, RecordRef, StackMode, TraceHeader, TraceWriter, WriterOptions};

    /// A trace of `n` thread records in blocks of `block_size` bytes.
    fn trace_of(n: u32, block_size: usize) -> Vec<u8> {
        let mut file = Vec::new();
        let options = WriterOptions {
            block_size,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::new(&mut file, &TraceHeader::example(), options).unwrap();
        for i in 0..n {
            let name = format!("thread-{i}-{}", "x".repeat(200));
            w.write(&Record::Thread(lrnprof_format::ThreadRecord {
                time: lrnprof_format::Timestamp(u64::from(i)),
                pid: lrnprof_format::Pid(1),
                tid: lrnprof_format::Tid(i),
                name: Some(name),
                event: lrnprof_format::ThreadEvent::Start,
            }))
            .unwrap();
        }
        w.finish().unwrap();
        file
    }

    /// 4 KiB blocks of about 18 records each.
    fn trace() -> Vec<u8> {
        trace_of(200, 4 << 10)
    }

    fn names(records: &mut lrnprof_format::BlockCursor<'_>) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(r) = records.next() {
            if let RecordRef::Record(Record::Thread(t)) = r.unwrap() {
                out.push(t.name.unwrap());
            }
        }
        out
    }

    /// The blocks that fit the budget are decompressed into the arena and
    /// read as blocks in buffers of their own do; the rest are not kept.
    #[test]
    fn blocks_within_the_budget_are_kept_in_the_arena() {
        let file = trace();
        let reader = TraceReader::new(&file[..]).unwrap();
        let blocks = reader.blocks();
        assert!(blocks.len() >= 6);
        let first_three: u64 = blocks[..3]
            .iter()
            .map(|b| u64::from(b.header.raw_len))
            .sum();
        let mut arena = KeptArena::new(blocks, first_three);
        let kept = arena.blocks();
        for (i, b) in blocks.iter().enumerate() {
            let d = kept.decompress(&reader, i).unwrap();
            assert_eq!(matches!(d, Decompressed::Kept(_)), i < 3, "block {i}");
            let own = reader.raw_block(b).unwrap();
            assert_eq!(
                names(&mut d.records(StackMode::Bytes)),
                names(&mut own.records(StackMode::Bytes))
            );
            kept.keep(i, d);
        }
        for (i, b) in blocks.iter().enumerate() {
            let taken = kept.take(i);
            assert_eq!(taken.is_some(), i < 3, "block {i}");
            if let Some(raw) = taken {
                let own = reader.raw_block(b).unwrap();
                assert_eq!(
                    names(&mut raw.records(StackMode::Bytes)),
                    names(&mut own.records(StackMode::Bytes))
                );
            }
            assert!(kept.take(i).is_none(), "taken once");
        }
        // A block decompressed twice: the second time into its own buffer.
        let mut arena = KeptArena::new(blocks, u64::MAX);
        let kept = arena.blocks();
        assert!(matches!(
            kept.decompress(&reader, 0),
            Ok(Decompressed::Kept(_))
        ));
        assert!(matches!(
            kept.decompress(&reader, 0),
            Ok(Decompressed::Own(_))
        ));
        // No budget: nothing is kept.
        let mut arena = KeptArena::new(blocks, 0);
        let kept = arena.blocks();
        assert!(matches!(
            kept.decompress(&reader, 0),
            Ok(Decompressed::Own(_))
        ));
    }

    /// An arena of several MiB starts its blocks at a huge page boundary
    /// and holds every block whole.
    #[test]
    fn a_large_arena_is_aligned_to_huge_pages() {
        let file = trace_of(20_000, 1 << 20);
        let reader = TraceReader::new(&file[..]).unwrap();
        let blocks = reader.blocks();
        let total: u64 = blocks.iter().map(|b| u64::from(b.header.raw_len)).sum();
        assert!(total > 2 * HUGE_PAGE as u64, "{total} bytes");
        let mut arena = KeptArena::new(blocks, total);
        let map = arena.map.as_ref().unwrap();
        assert_eq!((map.as_ptr() as usize + arena.start) % HUGE_PAGE, 0);
        assert!(arena.start + total as usize <= map.len());
        let kept = arena.blocks();
        for (i, b) in blocks.iter().enumerate() {
            let d = kept.decompress(&reader, i).unwrap();
            assert!(matches!(d, Decompressed::Kept(_)), "block {i}");
            let own = reader.raw_block(b).unwrap();
            assert_eq!(
                names(&mut d.records(StackMode::Bytes)),
                names(&mut own.records(StackMode::Bytes))
            );
        }
    }
}
