//! The fixed file header and the encoded trace header behind it, with a valid
//! checksum so the bincode decoder is reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lrnprof_format::raw::FileHeader;
use lrnprof_format::{TraceReader, VERSION};

fuzz_target!(|data: &[u8]| {
    let _ = FileHeader::parse(data);
    let fixed = FileHeader {
        version: VERSION,
        flags: 0,
        header_len: data.len() as u32,
        header_crc: crc(data),
    };
    let mut file = fixed.to_bytes().to_vec();
    file.extend_from_slice(data);
    let _ = TraceReader::new(&file[..]);
});

fn crc(data: &[u8]) -> u32 {
    // CRC-32 (IEEE), bitwise: the fuzz crate keeps its dependencies minimal.
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
