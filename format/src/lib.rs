//! The lrnprof trace format (`.lpt`).
//!
//! A trace is a fixed file header, a bincode-encoded [`TraceHeader`], then a
//! stream of independently decodable blocks. Each block is a fixed 40-byte
//! header (kind, lengths, record count, time range, CRC-32) and a zstd frame
//! holding bincode-encoded [`Record`]s. A cleanly finished trace ends with an
//! index block and a footer; a trace cut short stays readable up to its last
//! whole block. Stack snapshots are delta-encoded against one of the last
//! few snapshots of the same thread in the same block. `docs/format.md` in the
//! repository is the byte-level specification.
//!
//! Writers create a [`TraceWriter`], call [`TraceWriter::write`] per record
//! and [`TraceWriter::finish`] at the end. Readers open a [`TraceReader`],
//! check its [`ReadReport`], then iterate [`TraceReader::records`] or decode
//! blocks in parallel with [`TraceReader::par_decode_blocks`].
//!
//! ```
//! use lrnprof_format::*;
//! let mut file = Vec::new();
//! let mut w = TraceWriter::new(&mut file, &TraceHeader::example(), WriterOptions::default())?;
//! w.write(&Record::Thread(ThreadRecord {
//!     time: Timestamp(5),
//!     pid: Pid(1),
//!     tid: Tid(1),
//!     event: ThreadEvent::Existing,
//!     name: Some("main".into()),
//! }))?;
//! w.finish()?;
//!
//! let r = TraceReader::new(&file[..])?;
//! for record in r.records() {
//!     println!("{:?}", record?);
//! }
//! # Ok::<(), FormatError>(())
//! ```
//!
//! A trace is untrusted input: every length is checked against the bytes
//! that follow and a fixed bound before anything is allocated, and damage
//! produces a [`FormatError`], never a panic.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod block;
mod by_address;
mod cursor;
mod error;
pub mod raw;
mod read;
mod records;
mod sample_in;
mod stack;
mod syscall_names;
mod types;
mod v1;
mod write;

pub use block::{BlockBuilder, EncodedBlock, MAX_BLOCK_DECODED_LEN};
pub use by_address::{ByAddress, MAX_HELD_SPAN};
pub use cursor::{
    BlockCursor, RawBlock, RecordRef, SampleRef, StackBase, StackMode, StackReader, StackView,
};
pub use error::FormatError;
pub use raw::{BlockHeader, BlockKind, Codec, MAGIC, OLDEST_READABLE_VERSION, VERSION};
pub use read::{BlockInfo, ReadReport, SkippedRange, TraceReader};
pub use records::{
    Blob, BlobKind, FreeRecord, IdleRecord, ImageKind, ImageMapRecord, ImageUnmapRecord,
    LostRecord, LostSource, ProcessEvent, ProcessRecord, Record, Regs, RegsAarch64, RegsX86_64,
    Sample, SampleDetail, SampleFlags, SampleKind, StackSnapshot, Summary, SwitchInRecord,
    SyscallExitRecord, SyscallTallyRecord, ThreadEvent, ThreadRecord,
};
pub use stack::{
    common_prefix_len, same_runs, SameRuns, StackHint, MAX_BASES, MAX_STACK_LEN, MIN_SAME_RUN,
};
pub use syscall_names::{
    errno_name, is_syscall_error, resolve_known_syscalls, resolve_syscall_filter,
    syscall_filter_words, syscall_name, syscall_number, syscall_table, SyscallAbi, SyscallClass,
    UnknownSyscall,
};
pub use types::{
    Arch, BlockOffset, BuildId, Clock, Endian, EventSettings, HeapSettings, OffCpuSettings, Os,
    Pid, SampleEvent, SamplingSettings, SyscallSettings, Target, Tid, Timestamp, TraceHeader,
    CONTENT_ID_PREFIX,
};
pub use write::{TraceWriter, WriterOptions};

/// Decode one block's payload without a file around it: for fuzzing and
/// tools that carry blocks elsewhere. `bytes` is a block header followed by
/// its payload, written by format `version`.
pub fn decode_standalone_block(version: u16, bytes: &[u8]) -> Result<Vec<Record>, FormatError> {
    if !(OLDEST_READABLE_VERSION..=VERSION).contains(&version) {
        return Err(if version < OLDEST_READABLE_VERSION {
            FormatError::VersionTooOld {
                found: version,
                oldest: OLDEST_READABLE_VERSION,
                newest: VERSION,
            }
        } else {
            FormatError::VersionTooNew {
                found: version,
                newest: VERSION,
            }
        });
    }
    let header = BlockHeader::parse(bytes, 0)?;
    let payload = &bytes[raw::BLOCK_HEADER_LEN..][..header.compressed_len as usize];
    let raw = RawBlock {
        offset: BlockOffset(0),
        version,
        count: header.record_count,
        bytes: block::decompress(BlockOffset(0), &header, payload)?,
    };
    block::decode_records(&raw)
}
