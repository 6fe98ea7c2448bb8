//! dyld's image list: `struct dyld_all_image_infos` (found through
//! `task_info(TASK_DYLD_INFO)`) and its `dyld_image_info` array, in their
//! 64-bit layout (`<mach-o/dyld_images.h>`).

use super::{malformed, Le};
use crate::error::RecordError;

/// Bytes of `dyld_all_image_infos` read from the target: through
/// `infoArrayChangeTimestamp` and `dyldPath` (version 15 and later), which
/// every macOS since 10.12 provides.
pub(crate) const DYLD_ALL_IMAGE_INFOS_LEN: usize = 200;
/// Size of one 64-bit `dyld_image_info`.
pub(crate) const DYLD_IMAGE_INFO_LEN: usize = 24;
/// The most images accepted in the list. Large apps load about a thousand;
/// this bounds what a corrupt count can make us read.
pub(crate) const MAX_IMAGE_COUNT: u32 = 1 << 16;
/// The most bytes read for one path (`MAXPATHLEN` is 1024).
pub(crate) const MAX_PATH_LEN: usize = 4096;

/// Field offsets in the 64-bit `dyld_all_image_infos`.
mod off {
    pub const VERSION: usize = 0;
    pub const INFO_ARRAY_COUNT: usize = 4;
    pub const INFO_ARRAY: usize = 8;
    pub const DYLD_IMAGE_LOAD_ADDRESS: usize = 32;
    pub const SHARED_CACHE_SLIDE: usize = 152;
    pub const SHARED_CACHE_BASE_ADDRESS: usize = 176;
    pub const INFO_ARRAY_CHANGE_TIMESTAMP: usize = 184;
    pub const DYLD_PATH: usize = 192;
}

/// The fields of `dyld_all_image_infos` the recorder uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AllImageInfos {
    /// `version` of the structure.
    pub version: u32,
    /// `infoArrayCount`: entries in the image array.
    pub info_array_count: u32,
    /// `infoArray`: AVMA of the image array. Zero while dyld is changing
    /// the list: read again later.
    pub info_array: u64,
    /// `dyldImageLoadAddress`: AVMA of dyld's own Mach-O header (dyld is
    /// not in the image array).
    pub dyld_image_load_address: u64,
    /// `sharedCacheSlide` (version 12+), else 0.
    pub shared_cache_slide: u64,
    /// `sharedCacheBaseAddress` (version 15+), else 0.
    pub shared_cache_base_address: u64,
    /// `infoArrayChangeTimestamp` (version 15+): moves whenever the image
    /// list changes. `None` on older systems, where the list must be
    /// compared instead.
    pub info_array_change_timestamp: Option<u64>,
    /// `dyldPath` (version 15+): AVMA of dyld's path string, 0 if unknown.
    pub dyld_path: u64,
}

impl AllImageInfos {
    /// Whether the image array may be read now (dyld is not mid-update).
    pub fn is_stable(&self) -> bool {
        self.info_array != 0
    }

    /// Bytes of the image array, bounded by [`MAX_IMAGE_COUNT`].
    pub fn info_array_len(&self) -> Result<usize, RecordError> {
        if self.info_array_count > MAX_IMAGE_COUNT {
            return Err(malformed(
                "dyld_all_image_infos",
                off::INFO_ARRAY_COUNT,
                format!(
                    "infoArrayCount {} exceeds the limit of {MAX_IMAGE_COUNT}",
                    self.info_array_count
                ),
            ));
        }
        Ok(self.info_array_count as usize * DYLD_IMAGE_INFO_LEN)
    }
}

/// One 64-bit `dyld_image_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DyldImageInfo {
    /// `imageLoadAddress`: AVMA of the image's Mach-O header.
    pub load_address: u64,
    /// `imageFilePath`: AVMA of the path string.
    pub file_path: u64,
    /// `imageFileModDate`: the file's mtime, 0 for shared-cache images.
    pub file_mod_date: u64,
}

/// Parse the first [`DYLD_ALL_IMAGE_INFOS_LEN`] bytes (fewer for versions
/// before 15) of a 64-bit `dyld_all_image_infos`.
pub(crate) fn parse_all_image_infos(bytes: &[u8]) -> Result<AllImageInfos, RecordError> {
    let le = Le::new(bytes, "dyld_all_image_infos");
    let version = le.u32(off::VERSION)?;
    if version == 0 {
        return Err(malformed(
            "dyld_all_image_infos",
            off::VERSION,
            "version 0: not a dyld image list",
        ));
    }
    let (shared_cache_slide, shared_cache_base_address, info_array_change_timestamp, dyld_path) =
        if version >= 15 {
            (
                le.u64(off::SHARED_CACHE_SLIDE)?,
                le.u64(off::SHARED_CACHE_BASE_ADDRESS)?,
                Some(le.u64(off::INFO_ARRAY_CHANGE_TIMESTAMP)?),
                le.u64(off::DYLD_PATH)?,
            )
        } else if version >= 12 {
            (le.u64(off::SHARED_CACHE_SLIDE)?, 0, None, 0)
        } else {
            (0, 0, None, 0)
        };
    Ok(AllImageInfos {
        version,
        info_array_count: le.u32(off::INFO_ARRAY_COUNT)?,
        info_array: le.u64(off::INFO_ARRAY)?,
        dyld_image_load_address: if version >= 2 {
            le.u64(off::DYLD_IMAGE_LOAD_ADDRESS)?
        } else {
            0
        },
        shared_cache_slide,
        shared_cache_base_address,
        info_array_change_timestamp,
        dyld_path,
    })
}

/// Parse `count` 64-bit `dyld_image_info` entries from `bytes`.
pub(crate) fn parse_image_info_array(
    bytes: &[u8],
    count: u32,
) -> Result<Vec<DyldImageInfo>, RecordError> {
    const WHAT: &str = "dyld_image_info array";
    if count > MAX_IMAGE_COUNT {
        return Err(malformed(
            WHAT,
            0,
            format!("{count} images exceed the limit of {MAX_IMAGE_COUNT}"),
        ));
    }
    let needed = count as usize * DYLD_IMAGE_INFO_LEN;
    if bytes.len() < needed {
        return Err(malformed(
            WHAT,
            bytes.len(),
            format!(
                "truncated: {count} images need {needed} bytes, only {} present",
                bytes.len()
            ),
        ));
    }
    bytes[..needed]
        .chunks_exact(DYLD_IMAGE_INFO_LEN)
        .map(|entry| {
            let le = Le::new(entry, WHAT);
            Ok(DyldImageInfo {
                load_address: le.u64(0)?,
                file_path: le.u64(8)?,
                file_mod_date: le.u64(16)?,
            })
        })
        .collect()
}

/// The NUL-terminated string at the start of `bytes` (a path read from the
/// target with some slack after it). Invalid UTF-8 is replaced, as macOS
/// paths are UTF-8 in practice.
pub(crate) fn parse_c_string(bytes: &[u8]) -> Result<String, RecordError> {
    let bytes = &bytes[..bytes.len().min(MAX_PATH_LEN)];
    let len = bytes.iter().position(|&b| b == 0).ok_or_else(|| {
        malformed(
            "path string",
            bytes.len(),
            format!("no terminating NUL in the first {} bytes", bytes.len()),
        )
    })?;
    Ok(String::from_utf8_lossy(&bytes[..len]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 17 `dyld_all_image_infos` with three images.
    #[rustfmt::skip]
    fn all_image_infos() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&17u32.to_le_bytes());                     //   0 version
        b.extend_from_slice(&3u32.to_le_bytes());                      //   4 infoArrayCount
        b.extend_from_slice(&0x6000_0000_1000_u64.to_le_bytes());      //   8 infoArray
        b.extend_from_slice(&0x1_8000_4000_u64.to_le_bytes());         //  16 notification
        b.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);                //  24 processDetachedFromSharedRegion, libSystemInitialized, padding
        b.extend_from_slice(&0x1_0010_0000_u64.to_le_bytes());         //  32 dyldImageLoadAddress
        b.extend_from_slice(&[0; 8 * 14]);                             //  40 jitInfo .. errorSymbol
        b.extend_from_slice(&0x0b00_0000_u64.to_le_bytes());           // 152 sharedCacheSlide
        b.extend_from_slice(&[0xaa; 16]);                              // 160 sharedCacheUUID
        b.extend_from_slice(&0x1_8b00_0000_u64.to_le_bytes());         // 176 sharedCacheBaseAddress
        b.extend_from_slice(&0x1234_5678_9abc_u64.to_le_bytes());      // 184 infoArrayChangeTimestamp
        b.extend_from_slice(&0x1_0010_8000_u64.to_le_bytes());         // 192 dyldPath
        b.extend_from_slice(&[0; 32]);                                 // 200 notifyPorts[8]
        b
    }

    #[rustfmt::skip]
    fn image_array() -> Vec<u8> {
        let mut b = Vec::new();
        // [0] the executable
        b.extend_from_slice(&0x1_0000_0000_u64.to_le_bytes()); // imageLoadAddress
        b.extend_from_slice(&0x6000_0000_2000_u64.to_le_bytes()); // imageFilePath
        b.extend_from_slice(&1_700_000_000u64.to_le_bytes());  // imageFileModDate
        // [1] libSystem, in the shared cache
        b.extend_from_slice(&0x1_8b12_3000_u64.to_le_bytes()); // imageLoadAddress
        b.extend_from_slice(&0x1_8b00_8000_u64.to_le_bytes()); // imageFilePath
        b.extend_from_slice(&0u64.to_le_bytes());              // imageFileModDate
        // [2] a plugin
        b.extend_from_slice(&0x1_0200_0000_u64.to_le_bytes()); // imageLoadAddress
        b.extend_from_slice(&0x6000_0000_3000_u64.to_le_bytes()); // imageFilePath
        b.extend_from_slice(&1_700_000_123u64.to_le_bytes());  // imageFileModDate
        b
    }

    #[test]
    fn parses_a_version_17_header() {
        let infos = parse_all_image_infos(&all_image_infos()).unwrap();
        assert_eq!(infos.version, 17);
        assert_eq!(infos.info_array_count, 3);
        assert_eq!(infos.info_array, 0x6000_0000_1000);
        assert!(infos.is_stable());
        assert_eq!(infos.dyld_image_load_address, 0x1_0010_0000);
        assert_eq!(infos.shared_cache_slide, 0x0b00_0000);
        assert_eq!(infos.shared_cache_base_address, 0x1_8b00_0000);
        assert_eq!(infos.info_array_change_timestamp, Some(0x1234_5678_9abc));
        assert_eq!(infos.dyld_path, 0x1_0010_8000);
        assert_eq!(infos.info_array_len().unwrap(), 72);
        assert_eq!(all_image_infos().len(), DYLD_ALL_IMAGE_INFOS_LEN + 32);
    }

    #[test]
    fn old_versions_have_no_timestamp_and_need_fewer_bytes() {
        let mut bytes = all_image_infos();
        bytes[..4].copy_from_slice(&11u32.to_le_bytes());
        let infos = parse_all_image_infos(&bytes[..152]).unwrap();
        assert_eq!(infos.info_array_change_timestamp, None);
        assert_eq!(infos.shared_cache_slide, 0);
        // A version 15 structure cut before the timestamp is truncated.
        bytes[..4].copy_from_slice(&15u32.to_le_bytes());
        assert!(parse_all_image_infos(&bytes[..190]).is_err());
    }

    #[test]
    fn mid_update_list_is_not_stable() {
        let mut bytes = all_image_infos();
        bytes[8..16].fill(0);
        assert!(!parse_all_image_infos(&bytes).unwrap().is_stable());
    }

    #[test]
    fn rejects_version_0_and_huge_counts() {
        let mut bytes = all_image_infos();
        bytes[..4].fill(0);
        assert!(parse_all_image_infos(&bytes).is_err());
        let mut bytes = all_image_infos();
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let infos = parse_all_image_infos(&bytes).unwrap();
        let msg = infos.info_array_len().unwrap_err().to_string();
        assert!(msg.contains("infoArrayCount"), "{msg}");
        assert!(parse_image_info_array(&[], u32::MAX).is_err());
    }

    #[test]
    fn parses_the_image_array() {
        let images = parse_image_info_array(&image_array(), 3).unwrap();
        assert_eq!(images.len(), 3);
        assert_eq!(images[1].load_address, 0x1_8b12_3000);
        assert_eq!(images[1].file_path, 0x1_8b00_8000);
        assert_eq!(images[1].file_mod_date, 0);
        assert_eq!(images[2].file_mod_date, 1_700_000_123);
        // Fewer entries than present is fine; more is truncation.
        assert_eq!(parse_image_info_array(&image_array(), 2).unwrap().len(), 2);
        let msg = parse_image_info_array(&image_array()[..70], 3)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("truncated"), "{msg}");
    }

    #[test]
    fn every_prefix_and_byte_flip_is_an_error_or_ok_never_a_panic() {
        let infos = all_image_infos();
        for len in 0..infos.len() {
            if let Ok(parsed) = parse_all_image_infos(&infos[..len]) {
                // Only a complete version 17 structure parses.
                assert!(
                    len >= DYLD_ALL_IMAGE_INFOS_LEN,
                    "parsed {len} bytes: {parsed:?}"
                );
            }
        }
        for i in 0..infos.len() {
            let mut b = infos.clone();
            b[i] ^= 0xff;
            if let Ok(parsed) = parse_all_image_infos(&b) {
                let _ = parsed.info_array_len();
            }
        }
        let array = image_array();
        for len in 0..array.len() {
            assert!(parse_image_info_array(&array[..len], 3).is_err());
        }
    }

    #[test]
    fn c_strings() {
        assert_eq!(
            parse_c_string(b"/usr/lib/libSystem.B.dylib\0garbage").unwrap(),
            "/usr/lib/libSystem.B.dylib"
        );
        assert_eq!(parse_c_string(b"\0").unwrap(), "");
        assert!(parse_c_string(b"no nul").is_err());
        assert!(parse_c_string(&[b'a'; MAX_PATH_LEN + 10]).is_err());
    }
}
