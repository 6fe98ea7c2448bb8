//! One block: header, decompression, records, stack deltas.
//!
//! Raw bytes hit the checksum almost always, so the input is also wrapped in
//! a valid header (codec none, then zstd) to reach the record decoder. Every
//! readable format version decodes each input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lrnprof_format::{
    decode_standalone_block, BlockHeader, BlockKind, Codec, OLDEST_READABLE_VERSION, VERSION,
};

fuzz_target!(|data: &[u8]| {
    for version in OLDEST_READABLE_VERSION..=VERSION {
        let _ = decode_standalone_block(version, data);
    }
    if data.len() < 4 {
        return;
    }
    let (count, payload) = data.split_at(4);
    let record_count = u32::from_le_bytes([count[0], count[1], count[2], count[3]]) % 4096;
    for codec in [Codec::None, Codec::Zstd] {
        let header = BlockHeader {
            kind: BlockKind::Records,
            codec,
            raw_len: if codec == Codec::None { payload.len() as u32 } else { (payload.len() as u32).saturating_mul(4) },
            compressed_len: payload.len() as u32,
            record_count,
            first_time: 0,
            last_time: 0,
        };
        let mut block = header.to_bytes(payload).to_vec();
        block.extend_from_slice(payload);
        for version in OLDEST_READABLE_VERSION..=VERSION {
            let _ = decode_standalone_block(version, &block);
        }
    }
});
