//! Reading only the DWARF a set of addresses needs: the compilation units
//! that hold them, so that addr2line parses only those, and the sections
//! it reads, inflated by zlib-rs. The analyzer's symbolizer and the
//! recorder's frame tables both read DWARF this way.
//!
//! addr2line parses every unit of an image when its context is built (each
//! unit's abbreviation table and line program header): for a C library's
//! debug file with two thousand units that is most of an analysis's fixed
//! cost, although the samples fall in a few dozen. `.debug_aranges` says
//! which addresses each unit covers without parsing the unit. The other
//! units are hidden from addr2line by pointing their abbreviation offset
//! past the end of `.debug_abbrev` in a copy of `.debug_info`: addr2line
//! skips a unit it cannot parse, as if it were not there.
//!
//! The result is the same as with every unit when
//! - every unit that addr2line would find an address in lists it in
//!   `.debug_aranges` (compilers emit the same ranges in both; a unit that
//!   lists no range there is always kept), and
//! - no kept unit refers to DIEs of another unit (`DW_FORM_ref_addr` and
//!   the supplementary-file forms, used by LTO and dwz): an image whose
//!   kept units' abbreviations use such a form keeps every unit.

use gimli::{DebugAbbrevOffset, EndianSlice, Reader as _, RunTimeEndian};

/// DWARF sections the resolver never reads: variable locations, macros
/// and name indexes.
pub fn unused_dwarf(name: &str) -> bool {
    matches!(
        name,
        ".debug_loc"
            | ".debug_loclists"
            | ".debug_macro"
            | ".debug_macinfo"
            | ".debug_pubnames"
            | ".debug_pubtypes"
            | ".debug_gnu_pubnames"
            | ".debug_gnu_pubtypes"
    )
}

/// Inflate the zlib stream `stream` of a compressed section that holds
/// `size` bytes once inflated; `None` if the stream is corrupt, inflates
/// to another length, or `size` bytes cannot be allocated. About twice as
/// fast as `object`'s own inflating (miniz_oxide).
pub fn inflate_zlib(stream: &[u8], size: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    out.try_reserve_exact(size).ok()?;
    out.resize(size, 0);
    let (done, rc) = zlib_rs::decompress_slice(&mut out, stream, zlib_rs::InflateConfig::default());
    (rc == zlib_rs::ReturnCode::Ok && done.len() == size).then_some(out)
}

/// Forms that refer outside their unit, or whose form is only known per
/// DIE (`DW_FORM_indirect`, which could be one of them).
const CROSS_UNIT_FORMS: &[u64] = &[
    0x10,   // DW_FORM_ref_addr
    0x16,   // DW_FORM_indirect
    0x1c,   // DW_FORM_ref_sup4
    0x24,   // DW_FORM_ref_sup8
    0x1f20, // DW_FORM_GNU_ref_alt
];

/// `DW_FORM_implicit_const`: its abbreviation entry carries a value.
const FORM_IMPLICIT_CONST: u64 = 0x21;

/// Units of `debug_info` that hold none of `svmas` (sorted), by their
/// offset, or `None` when every unit must be kept (no usable
/// `.debug_aranges`, nothing to leave out, or a kept unit that may refer
/// into another one).
pub fn units_to_hide(
    debug_info: &[u8],
    debug_abbrev: &[u8],
    debug_aranges: &[u8],
    endian: RunTimeEndian,
    svmas: &[u64],
) -> Option<Vec<usize>> {
    // Per unit offset: whether one of its ranges holds an address.
    let mut covered: Vec<(usize, bool)> = Vec::new();
    let mut headers = gimli::DebugAranges::new(debug_aranges, endian).headers();
    while let Ok(Some(header)) = headers.next() {
        let unit = header.debug_info_offset().0;
        let mut hit = false;
        let mut any = false;
        let mut entries = header.entries();
        loop {
            match entries.next() {
                Ok(Some(e)) if e.length() == 0 => {}
                Ok(Some(e)) => {
                    any = true;
                    let r = e.range();
                    let i = svmas.partition_point(|&a| a < r.begin);
                    hit |= svmas.get(i).is_some_and(|&a| a < r.end);
                }
                Ok(None) => break,
                // addr2line skips an entry it cannot read (an overflowing
                // range) and otherwise stops at the first error: be safe
                // and call the unit unknown.
                Err(_) => {
                    any = false;
                    break;
                }
            }
        }
        if any {
            covered.push((unit, hit));
        } else {
            covered.push((unit, true));
        }
    }
    if covered.is_empty() {
        return None;
    }
    covered.sort_unstable();
    // A unit is hidden only if it lists ranges and none holds an address
    // (with several range sets for one unit, all must miss).
    let hidden_unit = |offset: usize| {
        let i = covered.partition_point(|c| c.0 < offset);
        let mine = &covered[i..covered.partition_point(|c| c.0 <= offset)];
        !mine.is_empty() && mine.iter().all(|c| !c.1)
    };
    let mut hide = Vec::new();
    let mut units = gimli::DebugInfo::new(debug_info, endian).units();
    loop {
        let header = match units.next() {
            Ok(Some(h)) => h,
            Ok(None) => break,
            // addr2line gives up on the whole section here too.
            Err(_) => return None,
        };
        let offset = header.debug_info_offset()?;
        if hidden_unit(offset.0) {
            hide.push(offset.0);
        } else if refers_outside(debug_abbrev, header.debug_abbrev_offset(), endian) {
            return None;
        }
    }
    (!hide.is_empty()).then_some(hide)
}

/// Whether the abbreviation table at `offset` uses a form that refers
/// outside its unit (or cannot be read: then assume it does).
fn refers_outside(
    debug_abbrev: &[u8],
    offset: DebugAbbrevOffset<usize>,
    endian: RunTimeEndian,
) -> bool {
    let Some(bytes) = debug_abbrev.get(offset.0..) else {
        return false; // addr2line cannot parse this unit either
    };
    let mut r = EndianSlice::new(bytes, endian);
    let scan = |r: &mut EndianSlice<RunTimeEndian>| -> gimli::Result<bool> {
        loop {
            if r.read_uleb128()? == 0 {
                return Ok(false);
            }
            r.read_uleb128()?; // tag
            r.read_u8()?; // children
            loop {
                let name = r.read_uleb128()?;
                let form = r.read_uleb128()?;
                if name == 0 && form == 0 {
                    break;
                }
                if CROSS_UNIT_FORMS.contains(&form) {
                    return Ok(true);
                }
                if form == FORM_IMPLICIT_CONST {
                    r.read_sleb128()?;
                }
            }
        }
    };
    scan(&mut r).unwrap_or(true)
}

/// Make the units of `debug_info` at `hide` (offsets of unit headers)
/// point their abbreviations past the end of any `.debug_abbrev`, so that
/// addr2line skips them. Returns `false`, with `debug_info` unchanged, if
/// a header is not where `hide` says.
pub fn hide_units(debug_info: &mut [u8], hide: &[usize]) -> bool {
    let fields: Option<Vec<(usize, usize)>> = hide
        .iter()
        .map(|&at| abbrev_offset_field(debug_info, at))
        .collect();
    let Some(fields) = fields else {
        return false;
    };
    for (at, len) in fields {
        debug_info[at..at + len].fill(0xff);
    }
    true
}

/// Where the abbreviation offset of the unit header at `at` is, and its
/// length in bytes.
fn abbrev_offset_field(debug_info: &[u8], at: usize) -> Option<(usize, usize)> {
    let bytes = |o: usize, n: usize| debug_info.get(at.checked_add(o)?..at.checked_add(o + n)?);
    // 32-bit DWARF: a 4-byte length; 64-bit: 0xffffffff then 8 bytes.
    let (offset_size, after_length) = if bytes(0, 4)? == [0xff; 4] {
        (8, 12)
    } else {
        (4, 4)
    };
    let version = bytes(after_length, 2)?;
    // Either byte order: versions are 2 to 5.
    let field = match version[0].max(version[1]) {
        2..=4 => after_length + 2,
        // DWARF 5: unit type and address size come first.
        5 => after_length + 4,
        _ => return None,
    };
    bytes(field, offset_size)?;
    Some((at + field, offset_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two DWARF 4 units (32-bit, little endian), each with the same
    /// one-entry abbreviation table: a compile unit with no attributes.
    #[rustfmt::skip]
    fn two_units() -> (Vec<u8>, Vec<u8>) {
        let unit = [
            8, 0, 0, 0, // unit_length: 8 bytes follow
            4, 0,       // version 4
            0, 0, 0, 0, // debug_abbrev_offset 0
            8,          // address size
            1,          // DIE with abbreviation 1
        ];
        let info = [unit, unit].concat();
        let abbrev = vec![
            1,    // code 1
            0x11, // DW_TAG_compile_unit
            0,    // no children
            0, 0, // end of attributes
            0,    // end of table
        ];
        (info, abbrev)
    }

    /// One address range set per unit: unit 0 covers 0x1000..0x1100, unit
    /// 12 covers 0x2000..0x2100.
    #[rustfmt::skip]
    fn aranges() -> Vec<u8> {
        let set = |unit: u8, begin: u8| {
            vec![
                44, 0, 0, 0,      // unit_length: 44 bytes follow
                2, 0,             // version 2
                unit, 0, 0, 0,    // debug_info_offset
                8,                // address size
                0,                // segment selector size
                0, 0, 0, 0,       // padding to twice the address size
                0, begin, 0, 0, 0, 0, 0, 0, // address
                0, 1, 0, 0, 0, 0, 0, 0,     // length 0x100
                0, 0, 0, 0, 0, 0, 0, 0,     // terminator
                0, 0, 0, 0, 0, 0, 0, 0,
            ]
        };
        [set(0, 0x10), set(12, 0x20)].concat()
    }

    const LE: RunTimeEndian = RunTimeEndian::Little;

    #[test]
    fn units_without_sampled_addresses_are_hidden() {
        let (info, abbrev) = two_units();
        let ar = aranges();
        assert_eq!(
            units_to_hide(&info, &abbrev, &ar, LE, &[0x1010]),
            Some(vec![12])
        );
        assert_eq!(
            units_to_hide(&info, &abbrev, &ar, LE, &[0x2000]),
            Some(vec![0])
        );
        // Both needed: nothing to hide.
        assert_eq!(
            units_to_hide(&info, &abbrev, &ar, LE, &[0x1000, 0x20ff]),
            None
        );
        // No aranges: every unit is kept.
        assert_eq!(units_to_hide(&info, &abbrev, &[], LE, &[0x1000]), None);
        // Only unit 0 listed: unit 12, with no ranges listed, is kept.
        assert_eq!(
            units_to_hide(&info, &abbrev, &ar[..48], LE, &[0x3000]),
            Some(vec![0])
        );
    }

    #[test]
    fn a_kept_unit_that_may_refer_to_others_keeps_every_unit() {
        let (info, mut abbrev) = two_units();
        // An attribute of form DW_FORM_ref_addr in the shared table.
        abbrev.splice(3..3, [0x31, 0x10]);
        assert_eq!(
            units_to_hide(&info, &abbrev, &aranges(), LE, &[0x1010]),
            None
        );
    }

    #[test]
    fn hidden_units_cannot_be_parsed_and_the_others_are_unchanged() {
        let (info, abbrev) = two_units();
        let mut patched = info.clone();
        assert!(hide_units(&mut patched, &[12]));
        assert_eq!(patched[..12], info[..12]);
        let mut units = gimli::DebugInfo::new(&patched[..], LE).units();
        let abbrevs = gimli::DebugAbbrev::new(&abbrev[..], LE);
        let first = units.next().unwrap().unwrap();
        assert!(first.abbreviations(&abbrevs).is_ok());
        let second = units.next().unwrap().unwrap();
        assert!(second.abbreviations(&abbrevs).is_err());
        assert!(units.next().unwrap().is_none());
        // A header that is not there: nothing changes.
        let mut unchanged = info.clone();
        assert!(!hide_units(&mut unchanged, &[0, 20]));
        assert_eq!(unchanged, info);
    }
}
