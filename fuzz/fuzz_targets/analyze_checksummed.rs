//! The whole analyzer on a trace whose checksums are made to match its
//! bytes: what a crafted trace, or one written wrong, brings past the
//! checksums that stop nearly every mutation in the `analyze` target. The
//! file header's CRC and each block's are recomputed before analysis, so
//! mutations of the records themselves reach the timeline, the unwinder
//! and the writers. Seed it with traces whose blocks are stored
//! uncompressed (see the README), or mutations land in zstd frames.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "analyze_common.rs"]
mod common;

use lrnprof_format::raw::{BLOCK_HEADER_LEN, BLOCK_MAGIC, FILE_HEADER_LEN};

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Recompute the file header's CRC and that of each block that follows
/// it, one after the other, as far as they are whole.
fn repair_checksums(data: &mut [u8]) {
    let Some(header_len) = u32_at(data, 12) else {
        return;
    };
    let Some(end) = FILE_HEADER_LEN.checked_add(header_len as usize) else {
        return;
    };
    let Some(encoded) = data.get(FILE_HEADER_LEN..end) else {
        return;
    };
    let crc = crc32fast::hash(encoded);
    // The file header ends with its CRC; a block header too.
    data[FILE_HEADER_LEN - 4..FILE_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    let mut at = end;
    while data.get(at..at + 4) == Some(&BLOCK_MAGIC[..]) {
        let Some(len) = u32_at(data, at + 12) else {
            return;
        };
        let payload_at = at + BLOCK_HEADER_LEN;
        let Some(next) = payload_at.checked_add(len as usize) else {
            return;
        };
        if next > data.len() {
            return;
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&data[at..at + BLOCK_HEADER_LEN - 4]);
        h.update(&data[payload_at..next]);
        let crc = h.finalize();
        data[at + BLOCK_HEADER_LEN - 4..at + BLOCK_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        at = next;
    }
}

fuzz_target!(|data: &[u8]| {
    let mut data = data.to_vec();
    repair_checksums(&mut data);
    common::analyze_bytes(&data);
});
