//! `mach_header_64` and the load commands that follow it, as read from a
//! target's memory (or a file: the layout is the same).

use super::{malformed, Le};
use crate::error::RecordError;

/// `MH_MAGIC_64`: a 64-bit Mach-O in the host's (little-endian) byte order.
const MH_MAGIC_64: u32 = 0xfeed_facf;
/// `MH_CIGAM_64`: a 64-bit Mach-O in the other byte order.
const MH_CIGAM_64: u32 = 0xcffa_edfe;
/// `MH_MAGIC`: a 32-bit Mach-O.
const MH_MAGIC: u32 = 0xfeed_face;
/// `MH_DYLIB_IN_CACHE`: the image lives in the dyld shared cache.
const MH_DYLIB_IN_CACHE: u32 = 0x8000_0000;
/// `CPU_TYPE_X86_64`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const CPU_TYPE_X86_64: u32 = 0x0100_0007;
/// `CPU_TYPE_ARM64`.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) const CPU_TYPE_ARM64: u32 = 0x0100_000c;

/// `LC_SEGMENT_64`.
const LC_SEGMENT_64: u32 = 0x19;
/// `LC_UUID`.
const LC_UUID: u32 = 0x1b;

/// Size of `mach_header_64`, in bytes: the load commands start right after.
pub(crate) const MACH_HEADER_64_LEN: usize = 32;
/// Size of `load_command` (`cmd`, `cmdsize`), the smallest possible command.
const LOAD_COMMAND_LEN: usize = 8;
/// Size of `segment_command_64` without its sections.
const SEGMENT_COMMAND_64_LEN: usize = 72;
/// Size of one `section_64`.
const SECTION_64_LEN: usize = 80;
/// Size of `uuid_command`.
const UUID_COMMAND_LEN: usize = 24;
/// The most bytes of load commands accepted (`sizeofcmds`). Real images
/// have a few KiB; this bounds what a corrupt header can make us read.
pub(crate) const MAX_LOAD_COMMANDS_LEN: usize = 1 << 20;

/// The fields of `mach_header_64` the recorder uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MachHeader {
    /// `cputype`, e.g. [`CPU_TYPE_ARM64`].
    pub cputype: u32,
    /// `filetype` (`MH_EXECUTE` = 2, `MH_DYLIB` = 6, `MH_DYLINKER` = 7, ...).
    pub filetype: u32,
    /// `ncmds`: the number of load commands.
    pub ncmds: u32,
    /// `sizeofcmds`: the bytes of load commands after the header.
    pub sizeofcmds: u32,
    /// `flags`.
    pub flags: u32,
}

impl MachHeader {
    /// Bytes of header plus load commands: what must be read from the
    /// target before [`parse_load_commands`].
    pub fn total_len(&self) -> usize {
        MACH_HEADER_64_LEN + self.sizeofcmds as usize
    }

    /// Whether the image is part of the dyld shared cache (no file on disk).
    pub fn in_shared_cache(&self) -> bool {
        self.flags & MH_DYLIB_IN_CACHE != 0
    }
}

/// A `LC_SEGMENT_64` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// `segname`, e.g. `__TEXT`.
    pub name: String,
    /// `vmaddr`: where the segment starts (SVMA).
    pub vmaddr: u64,
    /// `vmsize`, in bytes.
    pub vmsize: u64,
    /// `fileoff`: where the segment's bytes start in the file.
    pub fileoff: u64,
    /// `initprot`: initial VM protection (`VM_PROT_EXECUTE` = 4).
    pub initprot: u32,
}

/// A `section_64` of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Section {
    /// `segname`, e.g. `__TEXT`.
    pub segment: String,
    /// `sectname`, e.g. `__unwind_info`.
    pub name: String,
    /// `addr`: where the section starts (SVMA).
    pub addr: u64,
    /// `size`, in bytes.
    pub size: u64,
}

/// What the recorder needs from one image's header and load commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MachOImage {
    /// The header.
    pub header: MachHeader,
    /// The `LC_UUID`, when present.
    pub uuid: Option<[u8; 16]>,
    /// Every `LC_SEGMENT_64`, in load-command order.
    pub segments: Vec<Segment>,
    /// Every section of every segment, in load-command order.
    pub sections: Vec<Section>,
}

impl MachOImage {
    /// The `__TEXT` segment: the one mapped at the image's load address.
    pub fn text_segment(&self) -> Option<&Segment> {
        self.segments.iter().find(|s| s.name == "__TEXT")
    }

    /// The section `segment,name`, e.g. `("__TEXT", "__unwind_info")`.
    pub fn section(&self, segment: &str, name: &str) -> Option<&Section> {
        self.sections
            .iter()
            .find(|s| s.segment == segment && s.name == name)
    }

    /// How far the image was moved from its linked address: the AVMA of its
    /// Mach-O header (`load_address`) minus the `__TEXT` SVMA. Adding the
    /// slide to an SVMA gives the AVMA. `None` without a `__TEXT` segment.
    pub fn slide(&self, load_address: u64) -> Option<u64> {
        self.text_segment()
            .map(|t| load_address.wrapping_sub(t.vmaddr))
    }
}

/// Parse the 32-byte `mach_header_64` at the start of `bytes`.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<MachHeader, RecordError> {
    const WHAT: &str = "Mach-O header";
    let le = Le::new(bytes, WHAT);
    let magic = le.u32(0)?;
    match magic {
        MH_MAGIC_64 => {}
        MH_CIGAM_64 => return Err(malformed(WHAT, 0, "big-endian Mach-O is not supported")),
        MH_MAGIC => return Err(malformed(WHAT, 0, "32-bit Mach-O is not supported")),
        other => return Err(malformed(WHAT, 0, format!("bad magic {other:#010x}"))),
    }
    let header = MachHeader {
        cputype: le.u32(4)?,
        filetype: le.u32(12)?,
        ncmds: le.u32(16)?,
        sizeofcmds: le.u32(20)?,
        flags: le.u32(24)?,
    };
    // `reserved` at 28 completes the header; require it so a header that
    // stops early is reported as truncated.
    le.u32(28)?;
    if header.sizeofcmds as usize > MAX_LOAD_COMMANDS_LEN {
        return Err(malformed(
            WHAT,
            20,
            format!(
                "sizeofcmds {} exceeds the {MAX_LOAD_COMMANDS_LEN}-byte limit",
                header.sizeofcmds
            ),
        ));
    }
    Ok(header)
}

/// Parse a header and its load commands: `bytes` starts with the
/// `mach_header_64` and holds at least [`MachHeader::total_len`] bytes.
///
/// Each command is stepped by its `cmdsize`, which must be at least 8 and
/// stay within `sizeofcmds`; `ncmds` commands are read, so a huge `ncmds`
/// fails at the end of the bytes instead of looping.
pub(crate) fn parse_load_commands(bytes: &[u8]) -> Result<MachOImage, RecordError> {
    const WHAT: &str = "Mach-O load commands";
    let header = parse_header(bytes)?;
    let end = header.total_len();
    let commands = bytes.get(..end).ok_or_else(|| {
        malformed(
            WHAT,
            bytes.len(),
            format!(
                "truncated: sizeofcmds says {end} bytes with the header, only {} present",
                bytes.len()
            ),
        )
    })?;
    let mut image = MachOImage {
        header,
        uuid: None,
        segments: Vec::new(),
        sections: Vec::new(),
    };
    let mut offset = MACH_HEADER_64_LEN;
    for index in 0..header.ncmds {
        if end - offset < LOAD_COMMAND_LEN {
            return Err(malformed(
                WHAT,
                offset,
                format!(
                    "ncmds is {} but command {index} would start past sizeofcmds",
                    header.ncmds
                ),
            ));
        }
        let le = Le::new(&commands[offset..], WHAT);
        let cmd = le.u32(0)?;
        let cmdsize = le.u32(4)? as usize;
        if cmdsize < LOAD_COMMAND_LEN {
            return Err(malformed(
                WHAT,
                offset + 4,
                format!("command {index} ({cmd:#x}) has cmdsize {cmdsize}, less than 8"),
            ));
        }
        if cmdsize > end - offset {
            return Err(malformed(
                WHAT,
                offset + 4,
                format!("command {index} ({cmd:#x}) has cmdsize {cmdsize}, past sizeofcmds"),
            ));
        }
        let body = &commands[offset..offset + cmdsize];
        match cmd {
            LC_SEGMENT_64 => parse_segment(body, offset, &mut image)?,
            LC_UUID => {
                if cmdsize < UUID_COMMAND_LEN {
                    return Err(malformed(
                        WHAT,
                        offset + 4,
                        format!("LC_UUID has cmdsize {cmdsize}, less than {UUID_COMMAND_LEN}"),
                    ));
                }
                image.uuid = Some(Le::new(body, WHAT).array::<16>(8)?);
            }
            _ => {}
        }
        offset += cmdsize;
    }
    Ok(image)
}

/// One `LC_SEGMENT_64` (`body` is the whole command) and its sections.
fn parse_segment(body: &[u8], at: usize, image: &mut MachOImage) -> Result<(), RecordError> {
    const WHAT: &str = "Mach-O LC_SEGMENT_64";
    let le = Le::new(body, WHAT);
    if body.len() < SEGMENT_COMMAND_64_LEN {
        return Err(malformed(
            WHAT,
            at + 4,
            format!(
                "cmdsize {} is less than {SEGMENT_COMMAND_64_LEN}",
                body.len()
            ),
        ));
    }
    let segment = Segment {
        name: le.name16(8)?,
        vmaddr: le.u64(24)?,
        vmsize: le.u64(32)?,
        fileoff: le.u64(40)?,
        initprot: le.u32(60)?,
    };
    let nsects = le.u32(64)? as usize;
    // Checked before the loop so a huge nsects is rejected, not iterated.
    let room = (body.len() - SEGMENT_COMMAND_64_LEN) / SECTION_64_LEN;
    if nsects > room {
        return Err(malformed(
            WHAT,
            at + 64,
            format!(
                "segment {} claims {nsects} sections but cmdsize {} holds {room}",
                segment.name,
                body.len()
            ),
        ));
    }
    for i in 0..nsects {
        let s = Le::new(&body[SEGMENT_COMMAND_64_LEN + i * SECTION_64_LEN..], WHAT);
        image.sections.push(Section {
            name: s.name16(0)?,
            segment: s.name16(16)?,
            addr: s.u64(32)?,
            size: s.u64(40)?,
        });
    }
    image.segments.push(segment);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal arm64 executable's header and load commands: `__TEXT` with
    /// `__text` and `__unwind_info`, then `LC_UUID`.
    #[rustfmt::skip]
    fn fixture() -> Vec<u8> {
        let mut b = Vec::new();
        // mach_header_64
        b.extend_from_slice(&0xfeed_facf_u32.to_le_bytes()); // magic: MH_MAGIC_64
        b.extend_from_slice(&0x0100_000c_u32.to_le_bytes()); // cputype: CPU_TYPE_ARM64
        b.extend_from_slice(&0u32.to_le_bytes());            // cpusubtype: ALL
        b.extend_from_slice(&2u32.to_le_bytes());            // filetype: MH_EXECUTE
        b.extend_from_slice(&2u32.to_le_bytes());            // ncmds
        b.extend_from_slice(&(72 + 2 * 80 + 24u32).to_le_bytes()); // sizeofcmds
        b.extend_from_slice(&0x0020_0085_u32.to_le_bytes()); // flags: PIE|TWOLEVEL|DYLDLINK|NOUNDEFS
        b.extend_from_slice(&0u32.to_le_bytes());            // reserved
        // segment_command_64
        b.extend_from_slice(&0x19u32.to_le_bytes());         // cmd: LC_SEGMENT_64
        b.extend_from_slice(&(72 + 2 * 80u32).to_le_bytes()); // cmdsize
        b.extend_from_slice(b"__TEXT\0\0\0\0\0\0\0\0\0\0");  // segname
        b.extend_from_slice(&0x1_0000_0000_u64.to_le_bytes()); // vmaddr
        b.extend_from_slice(&0x4000_u64.to_le_bytes());      // vmsize
        b.extend_from_slice(&0u64.to_le_bytes());            // fileoff
        b.extend_from_slice(&0x4000_u64.to_le_bytes());      // filesize
        b.extend_from_slice(&5u32.to_le_bytes());            // maxprot: r-x
        b.extend_from_slice(&5u32.to_le_bytes());            // initprot: r-x
        b.extend_from_slice(&2u32.to_le_bytes());            // nsects
        b.extend_from_slice(&0u32.to_le_bytes());            // flags
        // section_64 #0
        b.extend_from_slice(b"__text\0\0\0\0\0\0\0\0\0\0");  // sectname
        b.extend_from_slice(b"__TEXT\0\0\0\0\0\0\0\0\0\0");  // segname
        b.extend_from_slice(&0x1_0000_02f0_u64.to_le_bytes()); // addr
        b.extend_from_slice(&0x70u64.to_le_bytes());         // size
        b.extend_from_slice(&0x2f0u32.to_le_bytes());        // offset
        b.extend_from_slice(&2u32.to_le_bytes());            // align: 2^2
        b.extend_from_slice(&[0; 8]);                        // reloff, nreloc
        b.extend_from_slice(&0x8000_0400_u32.to_le_bytes()); // flags: PURE_INSTRUCTIONS|SOME_INSTRUCTIONS
        b.extend_from_slice(&[0; 12]);                       // reserved1..3
        // section_64 #1
        b.extend_from_slice(b"__unwind_info\0\0\0");         // sectname
        b.extend_from_slice(b"__TEXT\0\0\0\0\0\0\0\0\0\0");  // segname
        b.extend_from_slice(&0x1_0000_0360_u64.to_le_bytes()); // addr
        b.extend_from_slice(&0x103c_u64.to_le_bytes());      // size
        b.extend_from_slice(&0x360u32.to_le_bytes());        // offset
        b.extend_from_slice(&2u32.to_le_bytes());            // align
        b.extend_from_slice(&[0; 8]);                        // reloff, nreloc
        b.extend_from_slice(&0u32.to_le_bytes());            // flags
        b.extend_from_slice(&[0; 12]);                       // reserved1..3
        // uuid_command
        b.extend_from_slice(&0x1bu32.to_le_bytes());         // cmd: LC_UUID
        b.extend_from_slice(&24u32.to_le_bytes());           // cmdsize
        b.extend_from_slice(&[0x4c, 0x4c, 0x44, 0x79, 0x55, 0x55, 0x31, 0x44,
                              0xa1, 0xe2, 0xb4, 0x98, 0xf9, 0x8e, 0x18, 0x56]); // uuid
        b
    }

    /// Offset of the first load command's `cmdsize` field.
    const FIRST_CMDSIZE: usize = MACH_HEADER_64_LEN + 4;

    fn set_u32(bytes: &mut [u8], offset: usize, value: u32) {
        bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn reason(result: Result<MachOImage, RecordError>) -> String {
        match result {
            Err(e @ RecordError::MalformedMachO { .. }) => e.to_string(),
            other => panic!("expected a MalformedMachO error, got {other:?}"),
        }
    }

    #[test]
    fn parses_segments_sections_and_uuid() {
        let image = parse_load_commands(&fixture()).unwrap();
        assert_eq!(image.header.cputype, CPU_TYPE_ARM64);
        assert_eq!(image.header.filetype, 2);
        assert!(!image.header.in_shared_cache());
        assert_eq!(image.header.total_len(), 32 + 72 + 160 + 24);
        let text = image.text_segment().unwrap();
        assert_eq!(
            (text.vmaddr, text.vmsize, text.fileoff),
            (0x1_0000_0000, 0x4000, 0)
        );
        assert_eq!(text.initprot, 5);
        let unwind = image.section("__TEXT", "__unwind_info").unwrap();
        assert_eq!((unwind.addr, unwind.size), (0x1_0000_0360, 0x103c));
        assert_eq!(image.section("__TEXT", "__text").unwrap().size, 0x70);
        assert!(image.section("__TEXT", "__eh_frame").is_none());
        assert_eq!(image.uuid.unwrap()[..4], [0x4c, 0x4c, 0x44, 0x79]);
        assert_eq!(image.slide(0x1_0400_0000), Some(0x400_0000));
    }

    #[test]
    fn shared_cache_flag() {
        let mut bytes = fixture();
        set_u32(&mut bytes, 24, 0x8000_0000);
        assert!(parse_header(&bytes).unwrap().in_shared_cache());
    }

    #[test]
    fn rejects_bad_magic_32_bit_and_big_endian() {
        for (magic, expect) in [
            (0x1234_5678, "bad magic"),
            (0xfeed_face, "32-bit"),
            (0xcffa_edfe, "big-endian"),
        ] {
            let mut bytes = fixture();
            set_u32(&mut bytes, 0, magic);
            let msg = reason(parse_load_commands(&bytes));
            assert!(msg.contains(expect), "{msg}");
        }
    }

    #[test]
    fn rejects_truncated_header_and_commands() {
        let bytes = fixture();
        for len in [0, 4, 31] {
            let msg = reason(parse_load_commands(&bytes[..len]));
            assert!(msg.contains("truncated"), "{msg}");
        }
        let msg = reason(parse_load_commands(&bytes[..bytes.len() - 1]));
        assert!(msg.contains("sizeofcmds says"), "{msg}");
    }

    #[test]
    fn rejects_cmdsize_zero_and_past_end() {
        let mut bytes = fixture();
        set_u32(&mut bytes, FIRST_CMDSIZE, 0);
        assert!(reason(parse_load_commands(&bytes)).contains("less than 8"));
        set_u32(&mut bytes, FIRST_CMDSIZE, 0x10_0000);
        assert!(reason(parse_load_commands(&bytes)).contains("past sizeofcmds"));
    }

    #[test]
    fn huge_ncmds_fails_at_the_end_of_the_commands() {
        let mut bytes = fixture();
        set_u32(&mut bytes, 16, u32::MAX);
        assert!(reason(parse_load_commands(&bytes)).contains("past sizeofcmds"));
    }

    #[test]
    fn huge_sizeofcmds_is_refused_before_reading() {
        let mut bytes = fixture();
        set_u32(&mut bytes, 20, u32::MAX);
        assert!(reason(parse_load_commands(&bytes)).contains("limit"));
    }

    #[test]
    fn huge_nsects_is_refused() {
        let mut bytes = fixture();
        set_u32(&mut bytes, MACH_HEADER_64_LEN + 64, u32::MAX);
        assert!(reason(parse_load_commands(&bytes)).contains("sections"));
    }

    #[test]
    fn short_uuid_and_segment_commands_are_refused() {
        let mut bytes = fixture();
        let uuid_cmdsize = bytes.len() - 24 + 4;
        set_u32(&mut bytes, uuid_cmdsize, 16);
        // Shrink sizeofcmds to match so the short command is what fails.
        let sizeofcmds = (bytes.len() - 32 - 8) as u32;
        set_u32(&mut bytes, 20, sizeofcmds);
        assert!(reason(parse_load_commands(&bytes)).contains("LC_UUID"));

        let mut bytes = fixture();
        set_u32(&mut bytes, FIRST_CMDSIZE, 64);
        assert!(reason(parse_load_commands(&bytes)).contains("less than 72"));
    }

    #[test]
    fn every_prefix_and_every_byte_flip_is_an_error_or_ok_never_a_panic() {
        let bytes = fixture();
        for len in 0..bytes.len() {
            assert!(parse_load_commands(&bytes[..len]).is_err());
        }
        for i in 0..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                let _ = parse_load_commands(&b);
            }
        }
    }
}
