//! A tiny eBPF instruction encoder: the few instructions the syscall
//! programs use, so no compiler toolchain is needed to build them. The
//! encoding is the kernel's (`include/uapi/linux/bpf.h`,
//! Documentation/bpf/standardization/instruction-set.rst): 8 bytes per
//! instruction, `ld_imm64` takes two.

/// A register: `R0` return value, `R1`-`R5` arguments (clobbered by
/// calls), `R6`-`R9` kept across calls, `R10` the read-only frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reg(pub u8);

pub(crate) const R0: Reg = Reg(0);
pub(crate) const R1: Reg = Reg(1);
pub(crate) const R2: Reg = Reg(2);
pub(crate) const R3: Reg = Reg(3);
pub(crate) const R4: Reg = Reg(4);
pub(crate) const R6: Reg = Reg(6);
pub(crate) const R7: Reg = Reg(7);
pub(crate) const R8: Reg = Reg(8);
pub(crate) const R9: Reg = Reg(9);
pub(crate) const R10: Reg = Reg(10);

/// One encoded instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    pub code: u8,
    /// `src_reg << 4 | dst_reg`.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// The 8 bytes the kernel reads, in the host's byte order.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_ne_bytes());
        b[4..8].copy_from_slice(&self.imm.to_ne_bytes());
        b
    }
}

// Instruction classes.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
// Operand source.
const K: u8 = 0x00;
const X: u8 = 0x08;
// Load and store modes.
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;

/// Access sizes of loads and stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    W = 0x00,
    DW = 0x18,
}

/// 64-bit arithmetic operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alu {
    Add = 0x00,
    Sub = 0x10,
    And = 0x50,
    Rsh = 0x70,
    Mod = 0x90,
    Mov = 0xb0,
}

/// Conditional jumps (unsigned comparisons unless named otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cond {
    Eq = 0x10,
    Gt = 0x20,
    Set = 0x40,
    Ne = 0x50,
    Lt = 0xa0,
}

/// Kernel helpers the programs call (`enum bpf_func_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Helper {
    MapLookupElem = 1,
    MapUpdateElem = 2,
    KtimeGetNs = 5,
    GetCurrentPidTgid = 14,
}

fn regs(dst: Reg, src: Reg) -> u8 {
    (src.0 << 4) | (dst.0 & 0x0f)
}

/// `dst op= imm` (64-bit).
pub(crate) fn alu_imm(op: Alu, dst: Reg, imm: i32) -> Insn {
    Insn {
        code: ALU64 | op as u8 | K,
        regs: regs(dst, Reg(0)),
        off: 0,
        imm,
    }
}

/// `dst op= src` (64-bit).
pub(crate) fn alu_reg(op: Alu, dst: Reg, src: Reg) -> Insn {
    Insn {
        code: ALU64 | op as u8 | X,
        regs: regs(dst, src),
        off: 0,
        imm: 0,
    }
}

/// `dst = imm` (sign-extended to 64 bits).
pub(crate) fn mov_imm(dst: Reg, imm: i32) -> Insn {
    alu_imm(Alu::Mov, dst, imm)
}

/// `dst = src`.
pub(crate) fn mov_reg(dst: Reg, src: Reg) -> Insn {
    alu_reg(Alu::Mov, dst, src)
}

/// `dst = *(size *)(src + off)`, zero-extended.
pub(crate) fn load(size: Size, dst: Reg, src: Reg, off: i16) -> Insn {
    Insn {
        code: LDX | size as u8 | MEM,
        regs: regs(dst, src),
        off,
        imm: 0,
    }
}

/// `*(size *)(dst + off) = src`.
pub(crate) fn store_reg(size: Size, dst: Reg, off: i16, src: Reg) -> Insn {
    Insn {
        code: STX | size as u8 | MEM,
        regs: regs(dst, src),
        off,
        imm: 0,
    }
}

/// `*(size *)(dst + off) = imm` (sign-extended for `DW`).
pub(crate) fn store_imm(size: Size, dst: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code: ST | size as u8 | MEM,
        regs: regs(dst, Reg(0)),
        off,
        imm,
    }
}

/// `dst = &map` (the file descriptor `fd` of a map): two instructions.
pub(crate) fn load_map_fd(dst: Reg, fd: i32) -> [Insn; 2] {
    /// `BPF_PSEUDO_MAP_FD`: the immediate is a map's file descriptor.
    const PSEUDO_MAP_FD: u8 = 1;
    [
        Insn {
            code: LD | Size::DW as u8 | IMM,
            regs: regs(dst, Reg(PSEUDO_MAP_FD)),
            off: 0,
            imm: fd,
        },
        Insn {
            code: 0,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ]
}

/// `if dst cond imm goto +off` (`off` instructions after the next).
pub(crate) fn jump_imm(cond: Cond, dst: Reg, imm: i32, off: i16) -> Insn {
    Insn {
        code: JMP | cond as u8 | K,
        regs: regs(dst, Reg(0)),
        off,
        imm,
    }
}

/// `if dst cond src goto +off`.
pub(crate) fn jump_reg(cond: Cond, dst: Reg, src: Reg, off: i16) -> Insn {
    Insn {
        code: JMP | cond as u8 | X,
        regs: regs(dst, src),
        off,
        imm: 0,
    }
}

/// `goto +off`.
pub(crate) fn jump(off: i16) -> Insn {
    Insn {
        code: JMP,
        regs: 0,
        off,
        imm: 0,
    }
}

/// Call a kernel helper: arguments in `R1`-`R5`, result in `R0`.
pub(crate) fn call(helper: Helper) -> Insn {
    Insn {
        code: JMP | 0x80,
        regs: 0,
        off: 0,
        imm: helper as i32,
    }
}

/// Return `R0`.
pub(crate) fn exit() -> Insn {
    Insn {
        code: JMP | 0x90,
        regs: 0,
        off: 0,
        imm: 0,
    }
}

/// A program under construction, with named forward jumps so offsets are
/// never counted by hand.
#[derive(Debug, Default)]
pub(crate) struct Program {
    insns: Vec<Insn>,
    /// (instruction index, label) of jumps whose offset is not known yet.
    fixups: Vec<(usize, &'static str)>,
    labels: Vec<(&'static str, usize)>,
}

impl Program {
    /// Append instructions.
    pub fn push(&mut self, insns: impl IntoIterator<Item = Insn>) -> &mut Self {
        self.insns.extend(insns);
        self
    }

    /// Append a jump (made with offset 0) to `label`, placed later.
    pub fn jump_to(&mut self, insn: Insn, label: &'static str) -> &mut Self {
        self.fixups.push((self.insns.len(), label));
        self.insns.push(insn);
        self
    }

    /// The next instruction is `label`.
    pub fn label(&mut self, label: &'static str) -> &mut Self {
        self.labels.push((label, self.insns.len()));
        self
    }

    /// The instructions, every jump resolved; `None` if a label is
    /// missing, placed twice, or lies before its jump (the programs only
    /// jump forward).
    pub fn finish(mut self) -> Option<Vec<Insn>> {
        for (i, (label, _)) in self.labels.iter().enumerate() {
            if self.labels[..i].iter().any(|(l, _)| l == label) {
                return None;
            }
        }
        for &(at, label) in &self.fixups {
            let target = self.labels.iter().find(|(l, _)| *l == label)?.1;
            let off = target.checked_sub(at + 1)?;
            self.insns[at].off = i16::try_from(off).ok()?;
        }
        Some(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected bytes from the kernel's own macros (include/linux/filter.h)
    // for the same instructions, as `bpftool prog dump xlated` shows them.
    #[rustfmt::skip]
    #[test]
    fn encodes_like_the_kernel_macros() {
        // BPF_MOV64_IMM(BPF_REG_0, 1)
        assert_eq!(mov_imm(R0, 1).to_bytes(), [0xb7, 0x00, 0, 0, 1, 0, 0, 0]);
        // BPF_MOV64_REG(BPF_REG_6, BPF_REG_1)
        assert_eq!(mov_reg(R6, R1).to_bytes(), [0xbf, 0x16, 0, 0, 0, 0, 0, 0]);
        // BPF_ALU64_IMM(BPF_RSH, BPF_REG_0, 32)
        assert_eq!(alu_imm(Alu::Rsh, R0, 32).to_bytes(), [0x77, 0x00, 0, 0, 32, 0, 0, 0]);
        // BPF_ALU64_IMM(BPF_MOD, BPF_REG_1, 16)
        assert_eq!(alu_imm(Alu::Mod, R1, 16).to_bytes(), [0x97, 0x01, 0, 0, 16, 0, 0, 0]);
        // BPF_ALU64_REG(BPF_SUB, BPF_REG_0, BPF_REG_1)
        assert_eq!(alu_reg(Alu::Sub, R0, R1).to_bytes(), [0x1f, 0x10, 0, 0, 0, 0, 0, 0]);
        // BPF_LDX_MEM(BPF_DW, BPF_REG_1, BPF_REG_6, 8)
        assert_eq!(load(Size::DW, R1, R6, 8).to_bytes(), [0x79, 0x61, 8, 0, 0, 0, 0, 0]);
        // BPF_LDX_MEM(BPF_W, BPF_REG_2, BPF_REG_8, 12)
        assert_eq!(load(Size::W, R2, R8, 12).to_bytes(), [0x61, 0x82, 12, 0, 0, 0, 0, 0]);
        // BPF_STX_MEM(BPF_W, BPF_REG_10, BPF_REG_0, -8)
        assert_eq!(store_reg(Size::W, R10, -8, R0).to_bytes(), [0x63, 0x0a, 0xf8, 0xff, 0, 0, 0, 0]);
        // BPF_ST_MEM(BPF_DW, BPF_REG_10, -16, 0)
        assert_eq!(store_imm(Size::DW, R10, -16, 0).to_bytes(), [0x7a, 0x0a, 0xf0, 0xff, 0, 0, 0, 0]);
        // BPF_JMP_IMM(BPF_JEQ, BPF_REG_0, 0, 3)
        assert_eq!(jump_imm(Cond::Eq, R0, 0, 3).to_bytes(), [0x15, 0x00, 3, 0, 0, 0, 0, 0]);
        // BPF_JMP_REG(BPF_JNE, BPF_REG_1, BPF_REG_2, 1)
        assert_eq!(jump_reg(Cond::Ne, R1, R2, 1).to_bytes(), [0x5d, 0x21, 1, 0, 0, 0, 0, 0]);
        // BPF_JMP_A(2)
        assert_eq!(jump(2).to_bytes(), [0x05, 0x00, 2, 0, 0, 0, 0, 0]);
        // BPF_EMIT_CALL(BPF_FUNC_map_lookup_elem), BPF_EXIT_INSN()
        assert_eq!(call(Helper::MapLookupElem).to_bytes(), [0x85, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(exit().to_bytes(), [0x95, 0, 0, 0, 0, 0, 0, 0]);
        // BPF_LD_MAP_FD(BPF_REG_1, 7)
        let [lo, hi] = load_map_fd(R1, 7);
        assert_eq!(lo.to_bytes(), [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(hi.to_bytes(), [0; 8]);
    }

    #[test]
    fn labels_resolve_forward_jumps() {
        let mut p = Program::default();
        p.jump_to(jump_imm(Cond::Eq, R0, 0, 0), "out")
            .push([mov_imm(R0, 2), exit()])
            .label("out")
            .push([mov_imm(R0, 1), exit()]);
        let insns = p.finish().unwrap();
        assert_eq!(insns[0].off, 2, "skips the two instructions after it");
        let mut missing = Program::default();
        missing.jump_to(jump(0), "nowhere");
        assert!(missing.finish().is_none());
        let mut twice = Program::default();
        twice.jump_to(jump(0), "a").label("a").label("a");
        assert!(twice.finish().is_none());
        let mut backward = Program::default();
        backward
            .label("b")
            .push([mov_imm(R0, 0)])
            .jump_to(jump(0), "b");
        assert!(backward.finish().is_none());
    }
}
