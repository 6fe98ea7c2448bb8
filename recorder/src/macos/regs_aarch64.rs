//! Registers of an arm64 thread (`ARM_THREAD_STATE64`).

use super::sys::{thread_state, Kern, Suspended};
use crate::macho::{regs_from_arm_thread_state64, ARM_THREAD_STATE64_LEN};
use lrnprof_format::{Arch, Regs};
use mach2::kern_return::KERN_INVALID_ARGUMENT;

/// The architecture this build records.
pub(super) const ARCH: Arch = Arch::Aarch64;

/// The `cputype` of Mach-O images this build can record.
pub(super) const CPU_TYPE: u32 = crate::macho::CPU_TYPE_ARM64;

/// Read a suspended thread's registers, pointer-authentication bits stripped.
pub(super) fn read_regs(thread: &Suspended) -> Result<Regs, Kern> {
    let mut words = [0u32; ARM_THREAD_STATE64_LEN / 4];
    let filled = thread_state(thread, mach2::thread_status::ARM_THREAD_STATE64, &mut words)?;
    let mut bytes = [0u8; ARM_THREAD_STATE64_LEN];
    for (chunk, word) in bytes.chunks_exact_mut(4).zip(&words[..filled]) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    regs_from_arm_thread_state64(&bytes[..filled * 4])
        .map(Regs::Aarch64)
        .map_err(|_| KERN_INVALID_ARGUMENT)
}
