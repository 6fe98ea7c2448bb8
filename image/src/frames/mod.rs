//! The frame table (`BlobKind::Table { name: "frames" }`): for exactly the
//! addresses of an image that a trace can need, what they resolved to on
//! the recording machine (inline levels with file and line, or the
//! symbol), so a trace names its frames anywhere as it did there, without
//! carrying the image's DWARF.
//!
//! The bytes are specified in `docs/format.md` ("The frame table"); this
//! module writes ([`FrameTable::to_bytes`]) and reads
//! ([`FrameTable::parse`]) them, and [`frame_table_for_file`] builds a
//! table from an image file and its separate debug file.

mod build;
mod cache;

pub use build::{frame_table_for_file, FrameRequest, FrameTableBuilt, MAX_DWARF_BYTES};
pub use cache::FrameCache;

use crate::resolve::FrameLine;
use crate::ImageError;
use bincode::Options;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// `name` of the frame table's `BlobKind::Table`.
pub const FRAMES_TABLE: &str = "frames";

/// The table layout that does not say how its names were resolved.
const VERSION_1: u32 = 1;

/// The table layout that says whether its names came from DWARF. This
/// crate writes it for tables that know ([`FrameTable::with_dwarf`]),
/// reads both, and reads tables of other versions as empty.
const VERSION_2: u32 = 2;

/// For some SVMAs of an image, their function levels, innermost first
/// (what [`Resolver::lookup`](crate::Resolver::lookup) gave with inline
/// levels; empty when nothing was known).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrameTable {
    /// Sorted by SVMA, each once.
    entries: Vec<(u64, Vec<FrameLine>)>,
    /// Whether the names came from the image's DWARF (its own or its
    /// debug file's) rather than its symbol tables alone; `None` where
    /// the table does not say (version 1).
    dwarf: Option<bool>,
}

/// The encoded table: strings interned, addresses as deltas.
#[derive(Serialize, Deserialize)]
struct Wire {
    version: u32,
    strings: Vec<String>,
    entries: Vec<WireEntry>,
}

/// Version 2: version 1 with how the names were resolved.
#[derive(Serialize, Deserialize)]
struct Wire2 {
    version: u32,
    /// Whether the names came from DWARF.
    dwarf: bool,
    strings: Vec<String>,
    entries: Vec<WireEntry>,
}

#[derive(Serialize, Deserialize)]
struct WireEntry {
    /// SVMA minus the previous entry's (the first: the SVMA).
    delta: u64,
    frames: Vec<WireFrame>,
}

#[derive(Serialize, Deserialize)]
struct WireFrame {
    /// Index into `strings`.
    function: u32,
    /// Index into `strings`.
    file: Option<u32>,
    line: Option<u32>,
}

/// The encoding of records (`docs/format.md`, "Encoding of records"),
/// reading at most `limit` bytes' worth.
fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_varint_encoding()
        .with_little_endian()
        .with_limit(limit)
}

impl FrameTable {
    /// A table of `entries` (in any order; of equal SVMAs the last wins).
    pub fn new(entries: impl IntoIterator<Item = (u64, Vec<FrameLine>)>) -> FrameTable {
        let map: HashMap<u64, Vec<FrameLine>> = entries.into_iter().collect();
        let mut entries: Vec<(u64, Vec<FrameLine>)> = map.into_iter().collect();
        entries.sort_by_key(|e| e.0);
        FrameTable {
            entries,
            dwarf: None,
        }
    }

    /// This table, saying whether its names came from DWARF (`true`) or
    /// from the image's symbol tables alone (`false`). Its bytes are then
    /// version 2.
    pub fn with_dwarf(mut self, dwarf: bool) -> FrameTable {
        self.dwarf = Some(dwarf);
        self
    }

    /// Whether the names came from DWARF; `None` where the table does not
    /// say (read from version 1 bytes, or built without
    /// [`with_dwarf`](Self::with_dwarf)).
    pub fn resolved_with_dwarf(&self) -> Option<bool> {
        self.dwarf
    }

    /// The levels resolved for `svma`, if the table has it.
    pub fn get(&self, svma: u64) -> Option<&[FrameLine]> {
        let i = self.entries.binary_search_by_key(&svma, |e| e.0).ok()?;
        Some(&self.entries[i].1)
    }

    /// How many addresses the table has.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no address.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, by increasing SVMA.
    pub fn entries(&self) -> &[(u64, Vec<FrameLine>)] {
        &self.entries
    }

    /// The table's bytes, as `docs/format.md` specifies them.
    pub fn to_bytes(&self) -> Vec<u8> {
        fn intern<'a>(
            ids: &mut HashMap<&'a str, u32>,
            strings: &mut Vec<String>,
            s: &'a str,
        ) -> u32 {
            *ids.entry(s).or_insert_with(|| {
                strings.push(s.to_string());
                (strings.len() - 1) as u32
            })
        }
        let mut strings: Vec<String> = Vec::new();
        let mut ids: HashMap<&str, u32> = HashMap::new();
        let mut wire_entries = Vec::with_capacity(self.entries.len());
        let mut previous = 0;
        for (svma, lines) in &self.entries {
            let frames = lines
                .iter()
                .map(|l| WireFrame {
                    function: intern(&mut ids, &mut strings, &l.function),
                    file: l.file.as_deref().map(|f| intern(&mut ids, &mut strings, f)),
                    line: l.line,
                })
                .collect();
            wire_entries.push(WireEntry {
                delta: svma - previous,
                frames,
            });
            previous = *svma;
        }
        let encoded = match self.dwarf {
            None => options(u64::MAX).serialize(&Wire {
                version: VERSION_1,
                strings,
                entries: wire_entries,
            }),
            Some(dwarf) => options(u64::MAX).serialize(&Wire2 {
                version: VERSION_2,
                dwarf,
                strings,
                entries: wire_entries,
            }),
        };
        encoded.expect("encoding to memory cannot fail")
    }

    /// Read a table written by [`to_bytes`](Self::to_bytes). Tables of
    /// another version read as empty; malformed bytes (a string index out
    /// of range, an address past 2^64, bytes left over) are an error. No
    /// length read from `bytes` is allocated beyond `bytes`' own size.
    pub fn parse(bytes: &[u8]) -> Result<FrameTable, ImageError> {
        let bad = |why: String| ImageError::MalformedTable {
            name: FRAMES_TABLE.to_string(),
            reason: why,
        };
        // The version first: a later layout may not decode as this one.
        let version: u32 = options(bytes.len() as u64)
            .allow_trailing_bytes()
            .deserialize(bytes)
            .map_err(|e| bad(e.to_string()))?;
        let limit = options(bytes.len() as u64);
        let (strings, wire_entries, dwarf) = match version {
            VERSION_1 => {
                let w: Wire = limit.deserialize(bytes).map_err(|e| bad(e.to_string()))?;
                (w.strings, w.entries, None)
            }
            VERSION_2 => {
                let w: Wire2 = limit.deserialize(bytes).map_err(|e| bad(e.to_string()))?;
                (w.strings, w.entries, Some(w.dwarf))
            }
            _ => return Ok(FrameTable::default()),
        };
        let string = |i: u32| {
            strings
                .get(i as usize)
                .cloned()
                .ok_or_else(|| bad(format!("string {i} of {}", strings.len())))
        };
        let mut entries = Vec::with_capacity(wire_entries.len());
        let mut svma = 0u64;
        for (n, e) in wire_entries.iter().enumerate() {
            svma = match svma.checked_add(e.delta) {
                Some(next) if n == 0 || e.delta > 0 => next,
                _ => {
                    return Err(bad(format!(
                        "entry {n}: address not after the previous one"
                    )))
                }
            };
            let mut lines = Vec::with_capacity(e.frames.len());
            for f in &e.frames {
                lines.push(FrameLine {
                    function: string(f.function)?,
                    file: f.file.map(string).transpose()?,
                    line: f.line,
                });
            }
            entries.push((svma, lines));
        }
        Ok(FrameTable { entries, dwarf })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(function: &str, file: Option<&str>, line: Option<u32>) -> FrameLine {
        FrameLine {
            function: function.into(),
            file: file.map(Into::into),
            line,
        }
    }

    fn example() -> FrameTable {
        FrameTable::new([
            (
                0x1130,
                vec![
                    line("mix_step", Some("an_inline.c"), Some(18)),
                    line("hot_outer", Some("an_inline.c"), Some(24)),
                ],
            ),
            (0x1000, vec![line("main", Some("an_inline.c"), Some(30))]),
            (0x1200, vec![line("puts", None, None)]),
            (0x1300, Vec::new()),
        ])
    }

    #[rustfmt::skip]
    #[test]
    fn bytes_as_specified() {
        let t = FrameTable::new([
            (0x1000, vec![line("main", Some("a.c"), Some(7))]),
            (0x1010, vec![line("f", Some("a.c"), Some(300)), line("main", Some("a.c"), None)]),
        ]);
        assert_eq!(
            t.to_bytes(),
            [
                1,                                  // version
                3,                                  // 3 strings
                4, b'm', b'a', b'i', b'n',          // 0: "main"
                3, b'a', b'.', b'c',                // 1: "a.c"
                1, b'f',                            // 2: "f"
                2,                                  // 2 entries
                251, 0x00, 0x10,                    // delta 0x1000 (u16 after 251)
                1,                                  // 1 frame
                0, 1, 1, 1, 7,                      // main, Some(a.c), Some(7)
                0x10,                               // delta 0x10
                2,                                  // 2 frames
                2, 1, 1, 1, 251, 0x2c, 0x01,        // f, Some(a.c), Some(300)
                0, 1, 1, 0,                         // main, Some(a.c), None
            ]
        );
    }

    #[test]
    fn round_trip_and_lookup() {
        let t = example();
        let back = FrameTable::parse(&t.to_bytes()).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.len(), 4);
        assert_eq!(back.get(0x1130).unwrap()[0].function, "mix_step");
        assert_eq!(back.get(0x1300), Some(&[][..]));
        assert_eq!(back.get(0x1131), None);
        let svmas: Vec<u64> = back.entries().iter().map(|e| e.0).collect();
        assert_eq!(svmas, [0x1000, 0x1130, 0x1200, 0x1300]);
        assert!(FrameTable::parse(&FrameTable::default().to_bytes())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn malformed_tables_are_errors() {
        let bytes = example().to_bytes();
        for cut in [0, 1, 5, bytes.len() - 1] {
            assert!(FrameTable::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(FrameTable::parse(&longer).is_err());
        // A string index out of range.
        let t = FrameTable::new([(8, vec![line("f", None, None)])]);
        let mut b = t.to_bytes();
        // version, 1 string "f", 1 entry, delta 8, 1 frame, function 0
        assert_eq!(b[..7], [1, 1, 1, b'f', 1, 8, 1]);
        b[7] = 5;
        let msg = FrameTable::parse(&b).unwrap_err().to_string();
        assert!(msg.contains("string 5 of 1"), "{msg}");
        // A huge claimed length allocates nothing.
        assert!(FrameTable::parse(&[1, 253, 255, 255, 255, 255, 255, 255, 255, 127]).is_err());
        // Another version reads as empty.
        assert!(FrameTable::parse(&[3, 9, 9]).unwrap().is_empty());
        // Version 2's flag is a bool: another byte is an error.
        let mut b = example().with_dwarf(true).to_bytes();
        assert_eq!(b[..2], [2, 1]);
        b[1] = 2;
        assert!(FrameTable::parse(&b).is_err());
    }

    #[rustfmt::skip]
    #[test]
    fn version_2_says_how_names_were_resolved() {
        let t = FrameTable::new([(0x1000, vec![line("main", Some("a.c"), Some(7))])]);
        assert_eq!(t.resolved_with_dwarf(), None);
        for dwarf in [false, true] {
            let bytes = t.clone().with_dwarf(dwarf).to_bytes();
            assert_eq!(
                bytes,
                [
                    2,                                  // version
                    u8::from(dwarf),                    // resolved with DWARF
                    2,                                  // 2 strings
                    4, b'm', b'a', b'i', b'n',          // 0: "main"
                    3, b'a', b'.', b'c',                // 1: "a.c"
                    1,                                  // 1 entry
                    251, 0x00, 0x10,                    // delta 0x1000
                    1,                                  // 1 frame
                    0, 1, 1, 1, 7,                      // main, Some(a.c), Some(7)
                ]
            );
            let back = FrameTable::parse(&bytes).unwrap();
            assert_eq!(back.resolved_with_dwarf(), Some(dwarf));
            assert_eq!(back.entries(), t.entries());
        }
        // Version 1 bytes (what earlier recorders wrote) still read, and
        // do not say.
        let v1 = FrameTable::parse(&t.to_bytes()).unwrap();
        assert_eq!(v1.resolved_with_dwarf(), None);
        assert_eq!(v1.entries(), t.entries());
    }
}
