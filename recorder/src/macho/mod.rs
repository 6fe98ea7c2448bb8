//! Everything of the macOS backend that does not need a Mac, so it is
//! compiled and unit-tested on every host (Linux included):
//!
//! - pure parsers for what the backend reads out of a target task: Mach-O
//!   headers and load commands (through object's raw Mach-O structures),
//!   the dyld image list, thread states (universal files and UUIDs of image
//!   files are `lrnprof_image`'s);
//! - the image tracker ([`Images`]) and one sampling round
//!   ([`ThreadSampler`]), written against the [`TaskMemory`] and
//!   [`TaskThreads`] traits that `crate::macos` implements with Mach calls
//!   and the tests with a pretend task.
//!
//! Bytes from another process are untrusted: every length is checked
//! against the bytes present and a fixed bound, and malformed input gives
//! [`RecordError::MalformedMachO`], never a panic or an unbounded loop.
//!
//! Only 64-bit little-endian Mach-O is handled: macOS has run nothing else
//! since 10.15 on x86_64 and ever on arm64.

// Only the macOS backend calls these; elsewhere they are built for their
// unit tests alone.
#![cfg_attr(not(target_os = "macos"), allow(dead_code, unused_imports))]

mod dyld;
mod images;
mod load_commands;
mod sampling;
mod thread_state;

pub(crate) use dyld::{
    parse_all_image_infos, parse_c_string, parse_image_info_array, AllImageInfos,
    DYLD_ALL_IMAGE_INFOS_LEN, MAX_PATH_LEN,
};
pub(crate) use images::{embed_file, FileToEmbed, Images, TaskMemory};
pub(crate) use load_commands::{
    fuzz as fuzz_load_commands, parse_header, parse_load_commands, MachOImage, MACH_HEADER_64_LEN,
};
pub(crate) use sampling::{effective_stack_size, TaskThreads, ThreadSampler};
pub(crate) use thread_state::strip_pac;
// Each macOS build records its own architecture; the other one's thread
// state conversion is built for its unit tests.
#[cfg_attr(not(target_arch = "aarch64"), allow(unused_imports))]
pub(crate) use {
    load_commands::CPU_TYPE_ARM64,
    thread_state::{regs_from_arm_thread_state64, ARM_THREAD_STATE64_LEN},
};
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
pub(crate) use {
    load_commands::CPU_TYPE_X86_64,
    thread_state::{regs_from_x86_thread_state64, X86_THREAD_STATE64_LEN},
};

use crate::error::RecordError;

/// A [`RecordError::MalformedMachO`] for `what` at `offset`.
fn malformed(what: &'static str, offset: usize, reason: impl Into<String>) -> RecordError {
    RecordError::MalformedMachO {
        what,
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Little-endian reads at fixed offsets of one structure, each checked
/// against the slice so that truncated input is an error.
#[derive(Clone, Copy)]
struct Le<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Le<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Le<'a> {
        Le { bytes, what }
    }

    fn array<const N: usize>(&self, offset: usize) -> Result<[u8; N], RecordError> {
        offset
            .checked_add(N)
            .and_then(|end| self.bytes.get(offset..end))
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| {
                malformed(
                    self.what,
                    offset,
                    format!(
                        "truncated: needs {N} bytes here, only {} present",
                        self.bytes.len().saturating_sub(offset)
                    ),
                )
            })
    }

    fn u32(&self, offset: usize) -> Result<u32, RecordError> {
        self.array::<4>(offset).map(u32::from_le_bytes)
    }

    fn u64(&self, offset: usize) -> Result<u64, RecordError> {
        self.array::<8>(offset).map(u64::from_le_bytes)
    }
}
