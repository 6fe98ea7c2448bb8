//! Unwind rules made from x86-64 machine code without CFI
//! (`lrnprof_image::debug_frame_of_code`): any bytes, read as code with
//! two function starts given by the first two bytes (so that jumps from
//! one function into the other are followed too), must give a
//! `.debug_frame` whose every FDE parses and whose every row puts the
//! frame address above the stack or frame pointer.
#![no_main]

use gimli::{BaseAddresses, CfaRule, DebugFrame, LittleEndian, UnwindContext, UnwindSection};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, code)) = data.split_first_chunk::<2>() else {
        return;
    };
    let address = 0x1000u64;
    let start = |n: u16| address + u64::from(n) % (code.len() as u64 + 1);
    let mut starts = [
        start(u16::from_le_bytes(*head)),
        start(u16::from_be_bytes(*head)),
    ];
    starts.sort_unstable();
    let made = lrnprof_image::debug_frame_of_code(address, code, &starts);
    let mut frame = DebugFrame::new(&made, LittleEndian);
    frame.set_address_size(8);
    let bases = BaseAddresses::default();
    let mut ctx = UnwindContext::new();
    let mut entries = frame.entries(&bases);
    while let Some(entry) = entries.next().expect("entries parse") {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial
            .parse(DebugFrame::cie_from_offset)
            .expect("FDE parses");
        assert!(fde.initial_address() >= address);
        assert!(fde.initial_address() + fde.len() <= address + code.len() as u64);
        let mut rows = fde.rows(&frame, &bases, &mut ctx).expect("rows");
        while let Some(row) = rows.next_row().expect("row") {
            let CfaRule::RegisterAndOffset { offset, .. } = *row.cfa() else {
                panic!("CFA by expression");
            };
            assert!(offset >= 8, "CFA offset {offset}");
        }
    }
});
