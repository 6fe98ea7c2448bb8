//! Which sections of an image lrnprof uses, under which names, and which of
//! them each [`EmbedLevel`] carries in a trace: the one list both the
//! embedding side (recorder, `pack`) and the reading side (analyzer) follow.
//!
//! The analyzer names sections ELF style: `.eh_frame`, `.text`,
//! `.debug_info`. [`canonical_section_name`] maps the names found in a file
//! (`.zdebug_line`, Mach-O `__eh_frame`, `__debug_info`) to those; the
//! Mach-O-only sections keep their names (`__unwind_info`, `__stubs`,
//! `__stub_helper`). [`section_role`] then says what a section is for.

use crate::ImageError;
use std::borrow::Cow;
use std::str::FromStr;

/// ELF sections holding unwind tables, embedded at every level but
/// [`EmbedLevel::None`].
pub const UNWIND_SECTIONS: [&str; 3] = [".eh_frame", ".eh_frame_hdr", ".debug_frame"];

/// ELF symbol tables and their string tables, `.rela.plt` (whose
/// relocations name the PLT stubs) and `.gnu_debugdata` (MiniDebugInfo:
/// the local functions of a stripped binary), embedded from
/// [`EmbedLevel::Symbols`] on.
pub const SYMBOL_SECTIONS: [&str; 6] = [
    ".symtab",
    ".strtab",
    ".dynsym",
    ".dynstr",
    ".rela.plt",
    ".gnu_debugdata",
];

/// Prefix of the DWARF sections embedded at [`EmbedLevel::Debug`]
/// (`.debug_frame` is an unwind section and comes with every level).
pub const DEBUG_SECTION_PREFIX: &str = ".debug_";

/// Mach-O sections, as (segment, section), that a recorder copies out of
/// the memory of an image it does not embed whole (an image of the dyld
/// shared cache has no file of its own), at every level but
/// [`EmbedLevel::None`]. Their blobs keep these section names.
pub const MACHO_UNWIND_SECTIONS: [(&str, &str); 2] =
    [("__TEXT", "__unwind_info"), ("__TEXT", "__eh_frame")];

/// Name of the blob holding a Mach-O image's header and load commands,
/// copied from memory along with [`MACHO_UNWIND_SECTIONS`]; its `svma` is
/// the `__TEXT` segment's vmaddr.
pub const MACHO_HEADER_SECTION: &str = "__TEXT";

/// What lrnprof uses a section for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SectionRole {
    /// Only its address range matters, for the unwinder: `.text`, `.got`,
    /// Mach-O `__stubs` and `__stub_helper`. Never embedded (the layout
    /// table has the ranges).
    Range,
    /// Unwind tables: `.eh_frame`, `.eh_frame_hdr`, `.debug_frame`, Mach-O
    /// `__unwind_info`.
    Unwind,
    /// A symbol table, its strings, or the PLT relocations: [`SYMBOL_SECTIONS`].
    Symbols,
    /// DWARF debug info: `.debug_*` but `.debug_frame`.
    Debug,
}

/// The ELF-style name the analyzer uses for a section named `name` in an
/// ELF (`macho == false`) or Mach-O file: `.zdebug_*` and Mach-O
/// `__debug_*` / `__zdebug_*` become `.debug_*`, Mach-O `__text`,
/// `__eh_frame` and `__got` become `.text`, `.eh_frame` and `.got`. Other
/// names are returned unchanged.
pub fn canonical_section_name(name: &str, macho: bool) -> Cow<'_, str> {
    if macho {
        match name {
            "__text" => ".text".into(),
            "__eh_frame" => ".eh_frame".into(),
            "__got" => ".got".into(),
            n => match n
                .strip_prefix("__zdebug_")
                .or_else(|| n.strip_prefix("__debug_"))
            {
                Some(rest) => format!("{DEBUG_SECTION_PREFIX}{rest}").into(),
                None => n.into(),
            },
        }
    } else {
        match name.strip_prefix(".zdebug_") {
            Some(rest) => format!("{DEBUG_SECTION_PREFIX}{rest}").into(),
            None => name.into(),
        }
    }
}

/// What the section with canonical name `name` (see
/// [`canonical_section_name`]) is for, or `None` if lrnprof never needs it.
pub fn section_role(name: &str) -> Option<SectionRole> {
    match name {
        ".text" | ".got" | "__stubs" | "__stub_helper" => Some(SectionRole::Range),
        "__unwind_info" => Some(SectionRole::Unwind),
        n if UNWIND_SECTIONS.contains(&n) => Some(SectionRole::Unwind),
        n if SYMBOL_SECTIONS.contains(&n) => Some(SectionRole::Symbols),
        n if n.starts_with(DEBUG_SECTION_PREFIX) => Some(SectionRole::Debug),
        _ => None,
    }
}

/// How much of each image a trace carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum EmbedLevel {
    /// Nothing: the analyzer needs the image files (matching build ids).
    None,
    /// Unwind sections ([`UNWIND_SECTIONS`]) and the layout table: stacks
    /// unwind anywhere, functions show as addresses.
    Unwind,
    /// Unwind sections and symbol tables ([`SYMBOL_SECTIONS`]): function
    /// names anywhere.
    #[default]
    Symbols,
    /// Also the DWARF `.debug_*` sections: file:line and inline frames.
    Debug,
}

impl EmbedLevel {
    /// Whether this level embeds sections of `role`.
    pub fn embeds(self, role: SectionRole) -> bool {
        match role {
            SectionRole::Range => false,
            SectionRole::Unwind => self >= EmbedLevel::Unwind,
            SectionRole::Symbols => self >= EmbedLevel::Symbols,
            SectionRole::Debug => self >= EmbedLevel::Debug,
        }
    }

    /// The name the section `name` of an ELF image is stored under at this
    /// level (its canonical name), or `None` if this level leaves it out.
    pub fn stored_name(self, name: &str) -> Option<Cow<'_, str>> {
        let name = canonical_section_name(name, false);
        // Only ELF names are embedded section by section: Mach-O images
        // travel whole or as [`MACHO_UNWIND_SECTIONS`] copied from memory.
        let elf = !name.starts_with("__");
        let role = section_role(&name)?;
        (elf && self.embeds(role)).then_some(name)
    }
}

impl FromStr for EmbedLevel {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(EmbedLevel::None),
            "unwind" => Ok(EmbedLevel::Unwind),
            "symbols" => Ok(EmbedLevel::Symbols),
            "debug" => Ok(EmbedLevel::Debug),
            other => Err(ImageError::UnknownEmbedLevel(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("debug".parse::<EmbedLevel>().unwrap(), EmbedLevel::Debug);
        let msg = "all".parse::<EmbedLevel>().unwrap_err().to_string();
        assert_eq!(
            msg,
            "unknown embed level \"all\": use none, unwind, symbols or debug"
        );
        assert!(EmbedLevel::Unwind < EmbedLevel::Symbols);
        assert_eq!(EmbedLevel::default(), EmbedLevel::Symbols);
    }

    #[test]
    fn levels_choose_sections() {
        let stored = |name, level: EmbedLevel| level.stored_name(name).map(Cow::into_owned);
        assert_eq!(
            stored(".eh_frame", EmbedLevel::Unwind).as_deref(),
            Some(".eh_frame")
        );
        assert_eq!(stored(".symtab", EmbedLevel::Unwind), None);
        assert_eq!(
            stored(".dynsym", EmbedLevel::Symbols).as_deref(),
            Some(".dynsym")
        );
        assert_eq!(stored(".debug_info", EmbedLevel::Symbols), None);
        assert_eq!(
            stored(".debug_frame", EmbedLevel::Unwind).as_deref(),
            Some(".debug_frame")
        );
        assert_eq!(
            stored(".zdebug_line", EmbedLevel::Debug).as_deref(),
            Some(".debug_line")
        );
        assert_eq!(stored(".text", EmbedLevel::Debug), None);
        assert_eq!(stored(".eh_frame", EmbedLevel::None), None);
        // Mach-O names are not embedded section by section.
        assert_eq!(stored("__unwind_info", EmbedLevel::Debug), None);
        assert_eq!(stored("__eh_frame", EmbedLevel::Debug), None);
    }

    #[rustfmt::skip]
    #[test]
    fn names_are_canonical_and_have_roles() {
        use SectionRole::*;
        for (name, macho, canonical, role) in [
            ("__text",        true,  ".text",         Some(Range)),
            ("__got",         true,  ".got",          Some(Range)),
            ("__stubs",       true,  "__stubs",       Some(Range)),
            ("__eh_frame",    true,  ".eh_frame",     Some(Unwind)),
            ("__unwind_info", true,  "__unwind_info", Some(Unwind)),
            ("__debug_info",  true,  ".debug_info",   Some(Debug)),
            ("__zdebug_line", true,  ".debug_line",   Some(Debug)),
            ("__data",        true,  "__data",        None),
            (".zdebug_line",  false, ".debug_line",   Some(Debug)),
            (".debug_frame",  false, ".debug_frame",  Some(Unwind)),
            (".dynstr",       false, ".dynstr",       Some(Symbols)),
            (".data",         false, ".data",         None),
        ] {
            let c = canonical_section_name(name, macho);
            assert_eq!(c, canonical, "{name}");
            assert_eq!(section_role(&c), role, "{name}");
        }
    }
}
