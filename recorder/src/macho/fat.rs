//! Universal ("fat") Mach-O files: several thin images, one per
//! architecture, behind a big-endian header (`<mach-o/fat.h>`). The recorder
//! embeds the one slice the target ran.

use super::{malformed, parse_header};
use crate::error::RecordError;

/// `FAT_MAGIC`, big-endian: 32-bit offsets and sizes.
const FAT_MAGIC: u32 = 0xcafe_babe;
/// `FAT_MAGIC_64`, big-endian: 64-bit offsets and sizes.
const FAT_MAGIC_64: u32 = 0xcafe_babf;
/// Size of `fat_header` (magic, nfat_arch).
const FAT_HEADER_LEN: usize = 8;
/// Size of `fat_arch`.
const FAT_ARCH_LEN: usize = 20;
/// Size of `fat_arch_64`.
const FAT_ARCH_64_LEN: usize = 32;
/// The most slices accepted; real files have two or three.
const MAX_FAT_ARCHS: usize = 64;

fn be_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_be_bytes(
        bytes.get(offset..offset + 4)?.try_into().ok()?,
    ))
}

fn be_u64(bytes: &[u8], offset: usize) -> Option<u64> {
    Some(u64::from_be_bytes(
        bytes.get(offset..offset + 8)?.try_into().ok()?,
    ))
}

/// The thin 64-bit Mach-O image for `cputype` inside `file`: `file` itself
/// if it is thin, else the matching slice of a universal file.
pub(crate) fn thin_image(file: &[u8], cputype: u32) -> Result<&[u8], RecordError> {
    const WHAT: &str = "universal Mach-O header";
    let magic = be_u32(file, 0).ok_or_else(|| malformed(WHAT, 0, "truncated: no magic"))?;
    let entry_len = match magic {
        FAT_MAGIC => FAT_ARCH_LEN,
        FAT_MAGIC_64 => FAT_ARCH_64_LEN,
        _ => {
            let header = parse_header(file)?;
            if header.cputype != cputype {
                return Err(malformed(
                    "Mach-O header",
                    4,
                    format!("cputype {:#x}, expected {cputype:#x}", header.cputype),
                ));
            }
            return Ok(file);
        }
    };
    let count =
        be_u32(file, 4).ok_or_else(|| malformed(WHAT, 4, "truncated: no nfat_arch"))? as usize;
    if count > MAX_FAT_ARCHS {
        return Err(malformed(
            WHAT,
            4,
            format!("nfat_arch {count} exceeds the limit of {MAX_FAT_ARCHS}"),
        ));
    }
    for i in 0..count {
        let at = FAT_HEADER_LEN + i * entry_len;
        let truncated = || malformed(WHAT, at, format!("truncated: fat_arch {i} of {count}"));
        let arch_cputype = be_u32(file, at).ok_or_else(truncated)?;
        let (offset, size) = if magic == FAT_MAGIC {
            (
                u64::from(be_u32(file, at + 8).ok_or_else(truncated)?),
                u64::from(be_u32(file, at + 12).ok_or_else(truncated)?),
            )
        } else {
            (
                be_u64(file, at + 8).ok_or_else(truncated)?,
                be_u64(file, at + 16).ok_or_else(truncated)?,
            )
        };
        if arch_cputype != cputype {
            continue;
        }
        let slice = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(o, s)| file.get(o..o.checked_add(s)?))
            .ok_or_else(|| {
                malformed(
                    WHAT,
                    at + 8,
                    format!(
                        "slice {i} at offset {offset} with size {size} is past the end ({} bytes)",
                        file.len()
                    ),
                )
            })?;
        parse_header(slice)?;
        return Ok(slice);
    }
    Err(malformed(
        WHAT,
        FAT_HEADER_LEN,
        format!("no slice for cputype {cputype:#x} among {count}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::macho::{CPU_TYPE_ARM64, CPU_TYPE_X86_64};

    /// A 32-byte thin header of `cputype` followed by `tag` bytes.
    fn thin(cputype: u32, tag: u8) -> Vec<u8> {
        let mut b = Vec::new();
        for field in [0xfeed_facf, cputype, 0, 2, 0, 0, 0, 0] {
            b.extend_from_slice(&u32::to_le_bytes(field));
        }
        b.extend_from_slice(&[tag; 16]);
        b
    }

    /// A universal file with an x86_64 slice at 64 and an arm64 slice at 128.
    #[rustfmt::skip]
    fn fat() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&0xcafe_babe_u32.to_be_bytes()); // magic: FAT_MAGIC
        b.extend_from_slice(&2u32.to_be_bytes());            // nfat_arch
        // fat_arch #0
        b.extend_from_slice(&0x0100_0007_u32.to_be_bytes()); // cputype: X86_64
        b.extend_from_slice(&3u32.to_be_bytes());            // cpusubtype: ALL
        b.extend_from_slice(&64u32.to_be_bytes());           // offset
        b.extend_from_slice(&48u32.to_be_bytes());           // size
        b.extend_from_slice(&4u32.to_be_bytes());            // align: 2^4
        // fat_arch #1
        b.extend_from_slice(&0x0100_000c_u32.to_be_bytes()); // cputype: ARM64
        b.extend_from_slice(&0u32.to_be_bytes());            // cpusubtype: ALL
        b.extend_from_slice(&128u32.to_be_bytes());          // offset
        b.extend_from_slice(&48u32.to_be_bytes());           // size
        b.extend_from_slice(&4u32.to_be_bytes());            // align
        b.resize(64, 0);                                     // padding
        b.extend_from_slice(&thin(0x0100_0007, 0x86));       // x86_64 slice
        b.resize(128, 0);                                    // padding
        b.extend_from_slice(&thin(0x0100_000c, 0xa6));       // arm64 slice
        b
    }

    #[test]
    fn thin_files_are_returned_whole_if_the_arch_matches() {
        let file = thin(CPU_TYPE_ARM64, 1);
        assert_eq!(thin_image(&file, CPU_TYPE_ARM64).unwrap(), &file[..]);
        assert!(thin_image(&file, CPU_TYPE_X86_64).is_err());
    }

    #[test]
    fn picks_the_slice_of_the_arch() {
        let file = fat();
        let arm = thin_image(&file, CPU_TYPE_ARM64).unwrap();
        assert_eq!(arm.len(), 48);
        assert_eq!(arm[40], 0xa6);
        assert_eq!(thin_image(&file, CPU_TYPE_X86_64).unwrap()[40], 0x86);
        let msg = thin_image(&file, 0x0100_0012).unwrap_err().to_string();
        assert!(msg.contains("no slice"), "{msg}");
    }

    #[test]
    fn fat_64_headers() {
        let mut b = Vec::new();
        b.extend_from_slice(&0xcafe_babf_u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&0x0100_000c_u32.to_be_bytes()); // cputype
        b.extend_from_slice(&0u32.to_be_bytes()); // cpusubtype
        b.extend_from_slice(&64u64.to_be_bytes()); // offset
        b.extend_from_slice(&48u64.to_be_bytes()); // size
        b.extend_from_slice(&[0; 8]); // align, reserved
        b.resize(64, 0);
        b.extend_from_slice(&thin(CPU_TYPE_ARM64, 7));
        assert_eq!(thin_image(&b, CPU_TYPE_ARM64).unwrap()[40], 7);
    }

    #[test]
    fn slices_past_the_end_and_huge_counts_are_errors() {
        let mut file = fat();
        file[8 + 20 + 12..8 + 20 + 16].copy_from_slice(&u32::MAX.to_be_bytes());
        let msg = thin_image(&file, CPU_TYPE_ARM64).unwrap_err().to_string();
        assert!(msg.contains("past the end"), "{msg}");
        let mut file = fat();
        file[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(thin_image(&file, CPU_TYPE_ARM64).is_err());
        for len in 0..fat().len() {
            let _ = thin_image(&fat()[..len], CPU_TYPE_ARM64);
        }
        assert!(thin_image(&fat()[..150], CPU_TYPE_ARM64).is_err());
    }
}
