//! `mach_header_64` and the load commands that follow it, as read from a
//! target's memory (or a file: the layout is the same), through object's
//! raw Mach-O structures: object checks every command against `cmdsize`
//! and `sizeofcmds` and every section table against its command, and this
//! module adds the recorder's bound on what a header may make it read.

use super::malformed;
use crate::error::RecordError;
use object::macho::{self, MachHeader64};
use object::read::macho::{MachHeader as _, Section as _, Segment as _};
use object::LittleEndian as LE;

/// `MH_DYLIB_IN_CACHE`: the image lives in the dyld shared cache.
const MH_DYLIB_IN_CACHE: u32 = 0x8000_0000;
/// `CPU_TYPE_X86_64`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const CPU_TYPE_X86_64: u32 = macho::CPU_TYPE_X86_64;
/// `CPU_TYPE_ARM64`.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) const CPU_TYPE_ARM64: u32 = macho::CPU_TYPE_ARM64;

/// Size of `mach_header_64`, in bytes: the load commands start right after.
pub(crate) const MACH_HEADER_64_LEN: usize = std::mem::size_of::<MachHeader64<LE>>();
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

/// The `mach_header_64` at the start of `bytes`, if it is a 64-bit
/// little-endian one whose load commands are within the bound.
fn raw_header(bytes: &[u8]) -> Result<&MachHeader64<LE>, RecordError> {
    const WHAT: &str = "Mach-O header";
    let (header, _) = object::pod::from_bytes::<MachHeader64<LE>>(bytes).map_err(|()| {
        malformed(
            WHAT,
            0,
            format!(
                "truncated: needs {MACH_HEADER_64_LEN} bytes, only {} present",
                bytes.len()
            ),
        )
    })?;
    // object keeps `magic` big-endian to tell the byte orders apart; the
    // constants are for the file's own (here little-endian) order.
    match header.magic.get(object::BigEndian).swap_bytes() {
        macho::MH_MAGIC_64 => {}
        macho::MH_CIGAM_64 => return Err(malformed(WHAT, 0, "big-endian Mach-O is not supported")),
        macho::MH_MAGIC => return Err(malformed(WHAT, 0, "32-bit Mach-O is not supported")),
        other => return Err(malformed(WHAT, 0, format!("bad magic {other:#010x}"))),
    }
    let sizeofcmds = header.sizeofcmds.get(LE);
    if sizeofcmds as usize > MAX_LOAD_COMMANDS_LEN {
        return Err(malformed(
            WHAT,
            20,
            format!("sizeofcmds {sizeofcmds} exceeds the {MAX_LOAD_COMMANDS_LEN}-byte limit"),
        ));
    }
    Ok(header)
}

/// Parse the 32-byte `mach_header_64` at the start of `bytes`.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<MachHeader, RecordError> {
    let h = raw_header(bytes)?;
    Ok(MachHeader {
        cputype: h.cputype(LE),
        filetype: h.filetype(LE),
        ncmds: h.ncmds(LE),
        sizeofcmds: h.sizeofcmds(LE),
        flags: h.flags(LE),
    })
}

/// A fixed-size, NUL-trimmed name such as `segname`.
fn name(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

/// Parse a header and its load commands: `bytes` starts with the
/// `mach_header_64` and holds at least [`MachHeader::total_len`] bytes.
///
/// object steps each command by its `cmdsize`, which must be at least 8 and
/// stay within `sizeofcmds`, and reads `ncmds` commands, so a huge `ncmds`
/// fails at the end of the bytes instead of looping; a segment's `nsects`
/// must fit in its command.
pub(crate) fn parse_load_commands(bytes: &[u8]) -> Result<MachOImage, RecordError> {
    const WHAT: &str = "Mach-O load commands";
    let raw = raw_header(bytes)?;
    let header = parse_header(bytes)?;
    let end = header.total_len();
    let mut commands = raw.load_commands(LE, bytes, 0).map_err(|_| {
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
        let at = |e: object::Error| {
            malformed(
                WHAT,
                offset,
                format!("command {index} of ncmds {}: {e}", header.ncmds),
            )
        };
        let Some(command) = commands.next().map_err(at)? else {
            break;
        };
        if let Some((segment, section_table)) = command.segment_64().map_err(at)? {
            let sections = segment.sections(LE, section_table).map_err(|e| {
                malformed(
                    WHAT,
                    offset,
                    format!(
                        "segment {} claims {} sections, more than cmdsize {} holds: {e}",
                        name(segment.name()),
                        segment.nsects(LE),
                        command.cmdsize()
                    ),
                )
            })?;
            image.sections.extend(sections.iter().map(|s| Section {
                segment: name(s.segment_name()),
                name: name(s.name()),
                addr: s.addr(LE),
                size: s.size(LE),
            }));
            image.segments.push(Segment {
                name: name(segment.name()),
                vmaddr: segment.vmaddr(LE),
                vmsize: segment.vmsize(LE),
                fileoff: segment.fileoff(LE),
                initprot: segment.initprot(LE),
            });
        } else if let Some(uuid) = command.uuid().map_err(at)? {
            image.uuid = Some(uuid.uuid);
        }
        offset += command.cmdsize() as usize;
    }
    Ok(image)
}

/// The body of the `macho_load_commands` fuzz target (see `crate::fuzz`):
/// what the image tracker does with the bytes at an image's load address.
pub(crate) fn fuzz(bytes: &[u8]) {
    let Ok(header) = parse_header(bytes) else {
        assert!(parse_load_commands(bytes).is_err());
        return;
    };
    if let Ok(image) = parse_load_commands(bytes) {
        assert_eq!(image.header, header);
        assert!(header.total_len() <= bytes.len());
        let _ = image.slide(0x1_0400_0000);
        let _ = image.section("__TEXT", "__unwind_info");
    }
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
        for cmdsize in [0, 7, 0x10_0000] {
            set_u32(&mut bytes, FIRST_CMDSIZE, cmdsize);
            let msg = reason(parse_load_commands(&bytes));
            assert!(msg.contains("offset 32: command 0 of ncmds 2"), "{msg}");
            assert!(msg.contains("load command size"), "{msg}");
        }
    }

    #[test]
    fn huge_ncmds_fails_at_the_end_of_the_commands() {
        let mut bytes = fixture();
        set_u32(&mut bytes, 16, u32::MAX);
        let msg = reason(parse_load_commands(&bytes));
        assert!(msg.contains("command 2 of ncmds 4294967295"), "{msg}");
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
        let msg = reason(parse_load_commands(&bytes));
        assert!(msg.contains("command 1 of ncmds 2"), "{msg}");

        let mut bytes = fixture();
        set_u32(&mut bytes, FIRST_CMDSIZE, 64);
        let msg = reason(parse_load_commands(&bytes));
        assert!(msg.contains("offset 32: command 0 of ncmds 2"), "{msg}");
    }

    #[test]
    fn every_prefix_and_every_byte_flip_is_an_error_or_ok_never_a_panic() {
        let bytes = fixture();
        for len in 0..bytes.len() {
            assert!(parse_load_commands(&bytes[..len]).is_err());
            fuzz(&bytes[..len]);
        }
        fuzz(&bytes);
        for i in 0..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                let _ = parse_load_commands(&b);
                fuzz(&b);
            }
        }
    }
}
