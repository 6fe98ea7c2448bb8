//! Thread states from `thread_get_state` to trace registers.
//!
//! The kernel fills an array of `natural_t` (u32); the backend hands its
//! bytes here. Layouts are `arm_thread_state64_t` (`ARM_THREAD_STATE64`) and
//! `x86_thread_state64_t` (`x86_THREAD_STATE64`) from `<mach/*/_structs.h>`.

use super::{malformed, Le};
use crate::error::RecordError;
use lrnprof_format::{RegsAarch64, RegsX86_64};

/// Size of `arm_thread_state64_t`: x0-x28, fp, lr, sp, pc, cpsr, flags.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) const ARM_THREAD_STATE64_LEN: usize = 272;
/// Size of `x86_thread_state64_t`: 21 64-bit registers.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const X86_THREAD_STATE64_LEN: usize = 168;

/// Mask of the address bits of a user pointer on arm64 macOS, whose user
/// address space is 47 bits wide. On arm64e the upper bits of pc, lr, fp
/// and sp (and of return addresses on the stack) may hold a
/// pointer-authentication signature instead.
const ARM64_ADDRESS_MASK: u64 = (1 << 47) - 1;

/// Remove a pointer-authentication signature from an arm64 user pointer.
pub(crate) fn strip_pac(pointer: u64) -> u64 {
    pointer & ARM64_ADDRESS_MASK
}

/// `arm_thread_state64_t` bytes to registers, with pointer-authentication
/// bits stripped (the trace stores plain addresses).
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) fn regs_from_arm_thread_state64(bytes: &[u8]) -> Result<RegsAarch64, RecordError> {
    let le = Le::new(bytes, "ARM_THREAD_STATE64");
    if bytes.len() < ARM_THREAD_STATE64_LEN {
        return Err(malformed(
            "ARM_THREAD_STATE64",
            bytes.len(),
            format!(
                "truncated: {} bytes, expected {ARM_THREAD_STATE64_LEN}",
                bytes.len()
            ),
        ));
    }
    Ok(RegsAarch64 {
        fp: strip_pac(le.u64(29 * 8)?),
        lr: strip_pac(le.u64(30 * 8)?),
        sp: strip_pac(le.u64(31 * 8)?),
        pc: strip_pac(le.u64(32 * 8)?),
    })
}

/// `x86_thread_state64_t` bytes to registers.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn regs_from_x86_thread_state64(bytes: &[u8]) -> Result<RegsX86_64, RecordError> {
    let le = Le::new(bytes, "x86_THREAD_STATE64");
    if bytes.len() < X86_THREAD_STATE64_LEN {
        return Err(malformed(
            "x86_THREAD_STATE64",
            bytes.len(),
            format!(
                "truncated: {} bytes, expected {X86_THREAD_STATE64_LEN}",
                bytes.len()
            ),
        ));
    }
    Ok(RegsX86_64 {
        bp: le.u64(6 * 8)?,
        sp: le.u64(7 * 8)?,
        ip: le.u64(16 * 8)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    fn arm_state() -> Vec<u8> {
        let mut b = Vec::new();
        for i in 0..29u64 {
            b.extend_from_slice(&(0x100 + i).to_le_bytes());        // x0..x28
        }
        b.extend_from_slice(&0x0000_0001_6fdf_f0a0_u64.to_le_bytes()); // fp (x29)
        b.extend_from_slice(&0x2d3c_0001_0000_0354_u64.to_le_bytes()); // lr (x30), PAC-signed
        b.extend_from_slice(&0x0000_0001_6fdf_f080_u64.to_le_bytes()); // sp
        b.extend_from_slice(&0x7f12_0001_0000_02fc_u64.to_le_bytes()); // pc, PAC-signed
        b.extend_from_slice(&0x6000_0000_u32.to_le_bytes());           // cpsr
        b.extend_from_slice(&0u32.to_le_bytes());                      // flags (arm64e)
        b
    }

    #[rustfmt::skip]
    fn x86_state() -> Vec<u8> {
        let regs: [u64; 21] = [
            1, 2, 3, 4, 5, 6,       // rax rbx rcx rdx rdi rsi
            0x7ff7_bfef_f6b0,       // rbp
            0x7ff7_bfef_f690,       // rsp
            8, 9, 10, 11, 12, 13, 14, 15, // r8..r15
            0x1_0000_3f2a,          // rip
            0x246,                  // rflags
            0x2b, 0, 0,             // cs fs gs
        ];
        regs.iter().flat_map(|r| r.to_le_bytes()).collect()
    }

    #[test]
    fn arm64_state_to_regs_strips_pac() {
        let state = arm_state();
        assert_eq!(state.len(), ARM_THREAD_STATE64_LEN);
        let regs = regs_from_arm_thread_state64(&state).unwrap();
        assert_eq!(
            regs,
            RegsAarch64 {
                pc: 0x1_0000_02fc,
                sp: 0x1_6fdf_f080,
                fp: 0x1_6fdf_f0a0,
                lr: 0x1_0000_0354,
            }
        );
    }

    #[test]
    fn x86_64_state_to_regs() {
        let regs = regs_from_x86_thread_state64(&x86_state()).unwrap();
        assert_eq!(
            regs,
            RegsX86_64 {
                ip: 0x1_0000_3f2a,
                sp: 0x7ff7_bfef_f690,
                bp: 0x7ff7_bfef_f6b0,
            }
        );
    }

    #[test]
    fn truncated_states_are_errors() {
        let arm = arm_state();
        assert!(regs_from_arm_thread_state64(&arm[..ARM_THREAD_STATE64_LEN - 8]).is_err());
        assert!(regs_from_arm_thread_state64(&[]).is_err());
        let x86 = x86_state();
        let msg = regs_from_x86_thread_state64(&x86[..100])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("truncated"), "{msg}");
    }

    #[test]
    fn strip_pac_keeps_plain_addresses() {
        assert_eq!(strip_pac(0x1_0000_0354), 0x1_0000_0354);
        assert_eq!(strip_pac(0x7fff_ffff_ffff), 0x7fff_ffff_ffff);
        assert_eq!(strip_pac(0xffff_8000_0000_0000), 0);
    }
}
