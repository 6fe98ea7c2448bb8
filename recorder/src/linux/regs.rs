//! Which user registers to ask perf for, and turning them into trace
//! registers. Both architectures are always compiled (and tested); the
//! backend picks the native one where the module is declared.

use lrnprof_format::{Arch, Regs, RegsAarch64, RegsX86_64};

/// The registers of one architecture.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArchRegs {
    /// The trace architecture.
    pub arch: Arch,
    /// `sample_regs_user`.
    pub mask: u64,
    /// Values arrive in mask bit order.
    pub convert: fn(&[u64]) -> Option<Regs>,
    /// Which of the values is the stack pointer.
    pub sp_index: usize,
}

/// x86-64: `PERF_REG_X86_BP` (6), `SP` (7), `IP` (8).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const X86_64: ArchRegs = ArchRegs {
    arch: Arch::X86_64,
    mask: (1 << 6) | (1 << 7) | (1 << 8),
    convert: x86_64,
    sp_index: 1,
};

/// AArch64: `PERF_REG_ARM64_X29` (29), `LR` (30), `SP` (31), `PC` (32).
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) const AARCH64: ArchRegs = ArchRegs {
    arch: Arch::Aarch64,
    mask: 0xf << 29,
    convert: aarch64,
    sp_index: 2,
};

/// The registers the allocation sampler records (`lrnprof_preload`'s
/// `Regs`: x86-64 `[rip, rsp, rbp, 0]`, AArch64 `[pc, sp, x29, x30]`).
pub(crate) fn from_sampler(arch: Arch, r: [u64; 4]) -> Regs {
    match arch {
        Arch::X86_64 => Regs::X86_64(RegsX86_64 {
            ip: r[0],
            sp: r[1],
            bp: r[2],
        }),
        Arch::Aarch64 => Regs::Aarch64(RegsAarch64 {
            pc: r[0] & AARCH64_ADDRESS_MASK,
            sp: r[1],
            fp: r[2],
            lr: r[3] & AARCH64_ADDRESS_MASK,
        }),
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn x86_64(v: &[u64]) -> Option<Regs> {
    match *v {
        [bp, sp, ip] => Some(Regs::X86_64(RegsX86_64 { ip, sp, bp })),
        _ => None,
    }
}

/// User addresses on AArch64 Linux fit in 48 bits (52 with LVA, which
/// user space must opt into); higher bits of a return address are a
/// pointer-authentication code.
const AARCH64_ADDRESS_MASK: u64 = (1 << 48) - 1;

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
fn aarch64(v: &[u64]) -> Option<Regs> {
    match *v {
        [fp, lr, sp, pc] => Some(Regs::Aarch64(RegsAarch64 {
            pc,
            sp,
            fp,
            lr: lr & AARCH64_ADDRESS_MASK,
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_64_values_come_in_mask_order() {
        assert_eq!(X86_64.mask.count_ones(), 3);
        let r = (X86_64.convert)(&[0xb0, 0x5b, 0x1b]).unwrap();
        assert_eq!(
            r,
            Regs::X86_64(RegsX86_64 {
                ip: 0x1b,
                sp: 0x5b,
                bp: 0xb0
            })
        );
        assert_eq!((X86_64.convert)(&[1, 2]), None);
        assert_eq!(r.sp(), [0xb0, 0x5b, 0x1b][X86_64.sp_index]);
    }

    #[test]
    fn aarch64_strips_pointer_authentication() {
        assert_eq!(AARCH64.mask.count_ones(), 4);
        let r = (AARCH64.convert)(&[0xf0, 0x00ab_0000_0040_1234, 0x5000, 0x40_0000]).unwrap();
        assert_eq!(
            r,
            Regs::Aarch64(RegsAarch64 {
                pc: 0x40_0000,
                sp: 0x5000,
                fp: 0xf0,
                lr: 0x40_1234
            })
        );
        assert_eq!(r.sp(), [0xf0, 0, 0x5000, 0][AARCH64.sp_index]);
    }

    #[test]
    fn sampler_registers_keep_their_order() {
        assert_eq!(
            from_sampler(Arch::X86_64, [1, 2, 3, 0]),
            Regs::X86_64(RegsX86_64 {
                ip: 1,
                sp: 2,
                bp: 3
            })
        );
        assert_eq!(
            from_sampler(Arch::Aarch64, [0x40_0000, 2, 3, 0x00ab_0000_0040_1234]),
            Regs::Aarch64(RegsAarch64 {
                pc: 0x40_0000,
                sp: 2,
                fp: 3,
                lr: 0x40_1234
            })
        );
    }
}
