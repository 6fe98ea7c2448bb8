//! The frame table a recorder embeds per image (`BlobKind::Table { name:
//! "frames" }`): untrusted bytes the analyzer decodes. Whatever decodes
//! must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lrnprof_image::FrameTable;

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = FrameTable::parse(data) {
        if !table.is_empty() {
            let bytes = table.to_bytes();
            assert_eq!(FrameTable::parse(&bytes).ok(), Some(table));
        }
    }
});
