//! Universal ("fat") Mach-O files: several thin images, one per
//! architecture, behind a big-endian header. The recorder embeds the slice
//! the target ran; the analyzer uses the slice whose UUID was recorded.

use crate::ImageError;
use object::macho::MachHeader64;
use object::read::macho::{FatArch, MachHeader, MachOFatFile32, MachOFatFile64};
use object::{Endianness, FileKind};

/// One architecture's image inside a universal file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniversalSlice<'data> {
    /// The slice's `cputype` (`CPU_TYPE_ARM64`, `CPU_TYPE_X86_64`, ...).
    pub cputype: u32,
    /// The slice's bytes: a thin image. `None` if the header places it
    /// past the end of the file.
    pub data: Option<&'data [u8]>,
    /// Its offset in the file, as the header states it.
    pub offset: u64,
    /// Its size, as the header states it.
    pub size: u64,
}

/// The slices of `data` in header order, or `Ok(None)` if `data` is not a
/// universal file.
pub fn universal_slices(data: &[u8]) -> Result<Option<Vec<UniversalSlice<'_>>>, ImageError> {
    fn slices<'data, Fat: FatArch>(
        arches: &[Fat],
        data: &'data [u8],
    ) -> Vec<UniversalSlice<'data>> {
        arches
            .iter()
            .map(|arch| UniversalSlice {
                cputype: arch.cputype(),
                data: arch.data(data).ok(),
                offset: arch.offset().into(),
                size: arch.size().into(),
            })
            .collect()
    }
    let malformed = |e: object::Error| ImageError::MalformedUniversal(e.to_string());
    Ok(match FileKind::parse(data) {
        Ok(FileKind::MachOFat32) => Some(slices(
            MachOFatFile32::parse(data).map_err(malformed)?.arches(),
            data,
        )),
        Ok(FileKind::MachOFat64) => Some(slices(
            MachOFatFile64::parse(data).map_err(malformed)?.arches(),
            data,
        )),
        _ => None,
    })
}

/// The thin 64-bit Mach-O image for `cputype` in `data`: `data` itself if
/// it is thin, else the matching slice of a universal file. Errors if
/// there is none, or if it is not a 64-bit Mach-O image of that `cputype`.
pub fn thin_slice(data: &[u8], cputype: u32) -> Result<&[u8], ImageError> {
    let Some(slices) = universal_slices(data)? else {
        check_thin(data, cputype)?;
        return Ok(data);
    };
    let (index, slice) = slices
        .iter()
        .enumerate()
        .find(|(_, s)| s.cputype == cputype)
        .ok_or(ImageError::NoSlice {
            cputype,
            count: slices.len(),
        })?;
    let thin = slice.data.ok_or(ImageError::SlicePastEnd {
        index,
        offset: slice.offset,
        size: slice.size,
        len: data.len(),
    })?;
    check_thin(thin, cputype)?;
    Ok(thin)
}

/// That `data` starts with a 64-bit Mach-O header of `cputype`.
fn check_thin(data: &[u8], cputype: u32) -> Result<(), ImageError> {
    let header = MachHeader64::<Endianness>::parse(data, 0)
        .map_err(|e| ImageError::NotMachO64(e.to_string()))?;
    let endian = header
        .endian()
        .map_err(|e| ImageError::NotMachO64(e.to_string()))?;
    match header.cputype(endian) {
        found if found == cputype => Ok(()),
        found => Err(ImageError::WrongArch {
            found,
            expected: cputype,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::macho::{CPU_TYPE_ARM64, CPU_TYPE_X86_64};

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
        assert_eq!(thin_slice(&file, CPU_TYPE_ARM64).unwrap(), &file[..]);
        let msg = thin_slice(&file, CPU_TYPE_X86_64).unwrap_err().to_string();
        assert!(msg.contains("expected 0x1000007"), "{msg}");
        assert_eq!(universal_slices(&file).unwrap(), None);
    }

    #[test]
    fn picks_the_slice_of_the_arch() {
        let file = fat();
        let arm = thin_slice(&file, CPU_TYPE_ARM64).unwrap();
        assert_eq!(arm.len(), 48);
        assert_eq!(arm[40], 0xa6);
        assert_eq!(thin_slice(&file, CPU_TYPE_X86_64).unwrap()[40], 0x86);
        let msg = thin_slice(&file, 0x0100_0012).unwrap_err().to_string();
        assert!(
            msg.contains("no slice for cputype 0x1000012 among the 2"),
            "{msg}"
        );
        let slices = universal_slices(&file).unwrap().unwrap();
        assert_eq!(slices.len(), 2);
        assert_eq!(
            (slices[0].cputype, slices[0].offset, slices[0].size),
            (CPU_TYPE_X86_64, 64, 48)
        );
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
        assert_eq!(thin_slice(&b, CPU_TYPE_ARM64).unwrap()[40], 7);
    }

    #[test]
    fn slices_past_the_end_and_huge_counts_are_errors() {
        let mut file = fat();
        file[8 + 20 + 12..8 + 20 + 16].copy_from_slice(&u32::MAX.to_be_bytes());
        let msg = thin_slice(&file, CPU_TYPE_ARM64).unwrap_err().to_string();
        assert!(msg.contains("past the end"), "{msg}");
        // The other slice is still there.
        assert!(thin_slice(&file, CPU_TYPE_X86_64).is_ok());
        let mut file = fat();
        file[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(thin_slice(&file, CPU_TYPE_ARM64).is_err());
        assert!(universal_slices(&file).is_err());
        assert!(thin_slice(&fat()[..150], CPU_TYPE_ARM64).is_err());
    }

    #[test]
    fn every_prefix_and_byte_flip_is_an_error_or_ok_never_a_panic() {
        let file = fat();
        for len in 0..file.len() {
            let _ = thin_slice(&file[..len], CPU_TYPE_ARM64);
            let _ = universal_slices(&file[..len]);
        }
        for i in 0..file.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut b = file.clone();
                b[i] ^= flip;
                let _ = thin_slice(&b, CPU_TYPE_ARM64);
                let _ = universal_slices(&b);
            }
        }
    }
}
