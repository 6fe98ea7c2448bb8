//! Writing `.debug_frame` entries: the few encodings the CFI that lrnprof
//! makes for code without unwind tables needs (Go's stack-pointer tables,
//! x86-64 machine code), 32-bit DWARF with 8-byte addresses.

/// The CIE of x86-64 CFI made here, at offset 0 of the section: version
/// 3, no augmentation, code alignment 1, data alignment -8, return address
/// in column 16 (rip); `DW_CFA_def_cfa rsp+8`, `DW_CFA_offset rip` at
/// cfa-8: the state at a function's first instruction.
pub(crate) const X86_64_CIE: &[u8] = &[
    0xff, 0xff, 0xff, 0xff, 3, 0, 1, 0x78, 16, 0x0c, 7, 8, 0x90, 1,
];

/// Append a CFI entry of `body`: its length, the body, and `DW_CFA_nop`s
/// up to a multiple of 8 bytes.
pub(crate) fn entry(out: &mut Vec<u8>, body: &[u8]) {
    let padded = (4 + body.len()).next_multiple_of(8) - 4;
    out.extend((padded as u32).to_le_bytes());
    out.extend(body);
    out.resize(out.len() + padded - body.len(), 0);
}

/// Start an FDE's body in `program` (cleared): its CIE's offset in the
/// section, the initial address and the length of the code it covers.
pub(crate) fn fde_header(program: &mut Vec<u8>, cie: u32, start: u64, len: u64) {
    program.clear();
    program.extend(cie.to_le_bytes());
    program.extend(start.to_le_bytes());
    program.extend(len.to_le_bytes());
}

/// `DW_CFA_advance_loc` (or its 1-, 2- and 4-byte forms) by `step` bytes.
pub(crate) fn advance(program: &mut Vec<u8>, step: u64) {
    match step {
        0 => {}
        1..=0x3f => program.push(0x40 | step as u8),
        0x40..=0xff => program.extend([0x02, step as u8]),
        0x100..=0xffff => {
            program.push(0x03);
            program.extend((step as u16).to_le_bytes());
        }
        _ => {
            program.push(0x04);
            program.extend((step.min(u64::from(u32::MAX)) as u32).to_le_bytes());
        }
    }
}

pub(crate) fn push_sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if (v == 0 && b & 0x40 == 0) || (v == -1 && b & 0x40 != 0) {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

pub(crate) fn push_uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}
