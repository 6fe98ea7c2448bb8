//! The layout table: an image's loadable segments and sections, embedded as
//! the blob [`LAYOUT_SECTION`] so an analyzer can map AVMAs to SVMAs and
//! give the unwinder the `.text` / `.got` ranges without the file.
//!
//! Writer ([`Layout::to_bytes`]) and reader ([`Layout::parse`]) are side by
//! side here; `docs/format.md` ("The layout table") specifies the bytes:
//! UTF-8 text, one entry per line ending in `\n`, fields separated by one
//! space, numbers in lowercase hex without `0x` or leading zeros:
//!
//! ```text
//! segment FILE_OFFSET FILE_SIZE SVMA MEM_SIZE
//! section NAME SVMA SIZE
//! ```

use object::{Object, ObjectSection, ObjectSegment};
use std::fmt::Write as _;

/// Name of the layout table's blob (`BlobKind::Section`, `svma` 0, not
/// compressed).
pub const LAYOUT_SECTION: &str = ".lrnprof.layout";

/// A loadable segment: which file bytes land at which SVMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutSegment {
    /// Offset in the file of the segment's first byte.
    pub file_offset: u64,
    /// Bytes of the segment in the file (0 for e.g. Mach-O `__PAGEZERO`).
    pub file_size: u64,
    /// Address of the segment's first byte as the file states it.
    pub svma: u64,
    /// Bytes of the segment once mapped.
    pub mem_size: u64,
}

/// A section's name and address range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutSection {
    /// The name as in the file (`.text`, Mach-O `__text`): never empty,
    /// never with white space.
    pub name: String,
    /// Address of the section's first byte as the file states it.
    pub svma: u64,
    /// Bytes of the section once mapped.
    pub size: u64,
}

/// An image's segments and sections, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// The loadable segments (ELF `PT_LOAD`, Mach-O `LC_SEGMENT_64`).
    pub segments: Vec<LayoutSegment>,
    /// The sections whose names can be written (see [`LayoutSection::name`]).
    pub sections: Vec<LayoutSection>,
}

impl Layout {
    /// The layout of a parsed image. Sections whose name is not UTF-8, is
    /// empty or has white space are left out: the table could not hold them.
    pub(crate) fn of<'data>(file: &impl Object<'data>) -> Layout {
        let segments = file
            .segments()
            .map(|seg| {
                let (file_offset, file_size) = seg.file_range();
                LayoutSegment {
                    file_offset,
                    file_size,
                    svma: seg.address(),
                    mem_size: seg.size(),
                }
            })
            .collect();
        let sections = file
            .sections()
            .filter_map(|section| {
                let name = section.name().ok()?;
                writable_name(name).then(|| LayoutSection {
                    name: name.to_string(),
                    svma: section.address(),
                    size: section.size(),
                })
            })
            .collect();
        Layout { segments, sections }
    }

    /// The SVMA of the byte at `offset` in the file: through the segment
    /// whose bytes in the file hold it (one with a `file_size` of 0 holds
    /// none). `None` if no segment does.
    pub fn svma_of_file_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.file_offset && offset - s.file_offset < s.file_size)
            .map(|s| s.svma.wrapping_add(offset - s.file_offset))
    }

    /// The offset in the file of the byte at `svma`: through the segment
    /// whose bytes in the file hold it. `None` if no segment does (an
    /// address in no segment, or in the part of one not in the file).
    pub fn file_offset_of_svma(&self, svma: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| svma >= s.svma && svma - s.svma < s.file_size)
            .map(|s| s.file_offset + (svma - s.svma))
    }

    /// The table's bytes: every segment, then every section. Sections with
    /// names the table cannot hold (see [`LayoutSection::name`]) are left
    /// out.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut text = String::new();
        for s in &self.segments {
            // Writing to a String cannot fail.
            let _ = writeln!(
                text,
                "segment {:x} {:x} {:x} {:x}",
                s.file_offset, s.file_size, s.svma, s.mem_size
            );
        }
        for s in self.sections.iter().filter(|s| writable_name(&s.name)) {
            let _ = writeln!(text, "section {} {:x} {:x}", s.name, s.svma, s.size);
        }
        text.into_bytes()
    }

    /// Read a table. Lines that are not UTF-8 or not one of the two forms
    /// are skipped, so a reader accepts tables with entries it does not
    /// know; the order of the entries is kept.
    pub fn parse(bytes: &[u8]) -> Layout {
        let mut layout = Layout::default();
        for line in bytes.split(|&b| b == b'\n') {
            let Ok(line) = std::str::from_utf8(line) else {
                continue;
            };
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                ["segment", offset, size, svma, mem_size] => {
                    if let (Some(file_offset), Some(file_size), Some(svma), Some(mem_size)) =
                        (hex(offset), hex(size), hex(svma), hex(mem_size))
                    {
                        layout.segments.push(LayoutSegment {
                            file_offset,
                            file_size,
                            svma,
                            mem_size,
                        });
                    }
                }
                ["section", name, svma, size] if writable_name(name) => {
                    if let (Some(svma), Some(size)) = (hex(svma), hex(size)) {
                        layout.sections.push(LayoutSection {
                            name: name.to_string(),
                            svma,
                            size,
                        });
                    }
                }
                _ => {}
            }
        }
        layout
    }
}

/// Whether the table can hold a section named `name`.
fn writable_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(char::is_whitespace)
}

/// A number of the table: 1 to 16 hex digits (a reader also accepts
/// uppercase and leading zeros, which writers do not produce).
fn hex(field: &str) -> Option<u64> {
    let digits = field.trim_start_matches('0');
    let ok =
        !field.is_empty() && digits.len() <= 16 && field.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| u64::from_str_radix(field, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Layout {
        Layout {
            segments: vec![
                LayoutSegment {
                    file_offset: 0,
                    file_size: 0x628,
                    svma: 0,
                    mem_size: 0x628,
                },
                LayoutSegment {
                    file_offset: 0x1000,
                    file_size: 0x1c5,
                    svma: 0x1000,
                    mem_size: 0x1c5,
                },
            ],
            sections: vec![
                LayoutSection {
                    name: ".text".into(),
                    svma: 0x1040,
                    size: 0x113,
                },
                LayoutSection {
                    name: ".got".into(),
                    svma: 0x3fd8,
                    size: 0x28,
                },
            ],
        }
    }

    #[test]
    fn writes_the_specified_bytes() {
        assert_eq!(
            String::from_utf8(example().to_bytes()).unwrap(),
            "segment 0 628 0 628\n\
             segment 1000 1c5 1000 1c5\n\
             section .text 1040 113\n\
             section .got 3fd8 28\n"
        );
    }

    #[test]
    fn file_offsets_become_svmas_through_their_segment() {
        let mut layout = example();
        // lld packs text at file offset 0x3b4, SVMA 0x103b4.
        layout.segments = vec![
            LayoutSegment {
                file_offset: 0,
                file_size: 0x3b4,
                svma: 0,
                mem_size: 0x3b4,
            },
            LayoutSegment {
                file_offset: 0x3b4,
                file_size: 0x74,
                svma: 0x103b4,
                mem_size: 0x74,
            },
            LayoutSegment {
                file_offset: 0x428,
                file_size: 0,
                svma: 0x20428,
                mem_size: 0x10,
            },
        ];
        assert_eq!(layout.svma_of_file_offset(0x10), Some(0x10));
        assert_eq!(layout.svma_of_file_offset(0x400), Some(0x10400));
        assert_eq!(layout.svma_of_file_offset(0x428), None);
        assert_eq!(layout.file_offset_of_svma(0x10), Some(0x10));
        assert_eq!(layout.file_offset_of_svma(0x10400), Some(0x400));
        assert_eq!(layout.file_offset_of_svma(0x20428), None);
        assert_eq!(layout.file_offset_of_svma(0x5000), None);
    }

    #[test]
    fn round_trips() {
        let layout = example();
        assert_eq!(Layout::parse(&layout.to_bytes()), layout);
        let max = Layout {
            segments: vec![LayoutSegment {
                file_offset: u64::MAX,
                file_size: u64::MAX,
                svma: u64::MAX,
                mem_size: 0,
            }],
            sections: Vec::new(),
        };
        assert_eq!(Layout::parse(&max.to_bytes()), max);
    }

    #[test]
    fn unknown_and_malformed_lines_are_skipped() {
        let text = b"segment 0 628 0 628\n\
            bad line\n\
            future 1 2 3\n\
            segment 1 2 3\n\
            segment 1  2 3 4\n\
            section .text 0x10 4\n\
            section .data +10 4\n\
            section .bss 1 11111111111111111\n\
            section \xff\xfe 1 2\n\
            section .got 3FD8 00028\n";
        let layout = Layout::parse(text);
        assert_eq!(layout.segments, example().segments[..1]);
        assert_eq!(
            layout.sections,
            vec![LayoutSection {
                name: ".got".into(),
                svma: 0x3fd8,
                size: 0x28
            }]
        );
        assert_eq!(Layout::parse(b""), Layout::default());
    }

    #[test]
    fn names_the_table_cannot_hold_are_left_out() {
        let mut layout = example();
        layout.sections.push(LayoutSection {
            name: "two words".into(),
            svma: 1,
            size: 1,
        });
        layout.sections.push(LayoutSection {
            name: String::new(),
            svma: 1,
            size: 1,
        });
        assert_eq!(Layout::parse(&layout.to_bytes()), example());
    }
}
