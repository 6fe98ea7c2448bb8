//! Unwind rules made from x86-64 machine code that has no CFI.
//!
//! musl is built without unwind tables (its `libc.so` and `libc.a` carry
//! CFI for a handful of assembly entry points only), and so is other code
//! built with `-fno-asynchronous-unwind-tables`. In an Alpine container or
//! a static musl program, every sample taken in `memcpy`, `malloc` or a
//! `qsort` comparison lost its callers: without a rule the unwinder can
//! only follow frame pointers, which this code does not keep, and read
//! stack data as return addresses.
//!
//! Compilers move the stack pointer in few ways (`push`, `pop`, `sub` and
//! `add` of constants, `lea`, `leave`, a frame pointer set from it), so the
//! frame address (CFA) is found at every instruction the way a debugger
//! does without CFI: follow each function's instructions from its entry,
//! along its branches, counting what it took of the stack, and where it
//! saved the caller's `rbp`. The result is written as `.debug_frame` (the
//! CIE and FDEs of [`crate::cfi_write`]), which the analyzer reads beside
//! the image's `.eh_frame` for the code that table leaves out, and which
//! the recorder embeds like any unwind table.
//!
//! Where the code does anything not followed (the stack pointer written
//! from a register without a frame pointer, paths that meet with different
//! frames), or shows the frame followed wrong (a `leave` where no frame
//! pointer was set, a `ret` away from the return address), the function
//! or the part of it concerned gets no rule: a missing rule ends a stack
//! where a wrong one would invent callers.
//!
//! A call followed by `nop`s and then by code no jump of the function goes
//! to does not return (`__stack_chk_fail`, `abort`): compilers pad only
//! before functions, loop heads and code that only jumps reach, so what
//! follows is not followed from the call.
//!
//! Functions start at symbols, at the targets of direct calls, at code
//! addresses taken by `lea` or (in a program loaded at a fixed address)
//! moved as constants, at the addresses the dynamic relocations put in
//! data (function pointers of a shared library), and where code begins
//! after padding; code no path from a start reaches (a jump table's
//! cases) has the frame of the function's indirect jumps.
//!
//! Only images where the FDEs leave a stretch of at least [`MIN_CODE`]
//! bytes (in images with many FDEs, [`MIN_CODE_MANY_FDES`]) get rules:
//! every image gcc links has about 200 bytes of C runtime code without
//! CFI, and deciding must cost next to nothing for the images whose
//! tables describe everything (the `.eh_frame_hdr` table and a few FDEs
//! are read, no instruction decoded).

use crate::cfi_write::{advance, entry, fde_header, push_uleb, X86_64_CIE};
use gimli::{
    BaseAddresses, CieOrFde, EhFrame, EndianSlice, FrameDescriptionEntry, LittleEndian,
    UnwindOffset, UnwindSection,
};
use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};
use object::{Object, ObjectSection, ObjectSymbol, ReadRef, RelocationFlags, SectionKind};
use std::ops::Range;

/// Most bytes of code without CFI decoded in one image (musl's `libc.so`
/// has 0.4 MB).
const MAX_CODE: u64 = 64 << 20;

/// An image gets rules where the FDEs leave at least one stretch of code
/// this long (padding included), then for all it leaves of 16 bytes or
/// more. The C runtime's functions without CFI that gcc links into every
/// image take 199-206 bytes in one stretch: of 1,622 x86-64 ELF images of
/// a Debian 12 system, 1,573 leave no longer one. A small program built
/// with `-fno-asynchronous-unwind-tables` adds its own code to that
/// stretch.
const MIN_CODE: u64 = 256;

/// In an image with more FDEs than this, a stretch of
/// [`MIN_CODE_MANY_FDES`] is needed: telling shorter ones apart reads the
/// lengths of many more FDEs (python3.11's 10,221: 0.070 ms a check
/// against 0.055). A small program built without unwind tables has a few
/// FDEs only, its C runtime's; code without CFI in an image with many is
/// a library's or a program's whole code, or its hand-written parts,
/// mostly far longer.
const MANY_FDES: u32 = 64;

/// See [`MANY_FDES`].
const MIN_CODE_MANY_FDES: u64 = 1024;

/// Functions that never return, by name (sorted): a call to one ends its
/// path, also where no padding follows it (the next function may begin
/// right after the call).
const NO_RETURN: &[&str] = &[
    "_Exit",
    "_Unwind_Resume",
    "_ZSt9terminatev",
    "__assert_fail",
    "__assert_perror_fail",
    "__chk_fail",
    "__cxa_bad_cast",
    "__cxa_bad_typeid",
    "__cxa_rethrow",
    "__cxa_throw",
    "__cxa_throw_bad_array_new_length",
    "__fortify_fail",
    "__libc_fatal",
    "__longjmp_chk",
    "__stack_chk_fail",
    "__stack_chk_fail_local",
    "_exit",
    "_longjmp",
    "abort",
    "err",
    "errx",
    "exit",
    "longjmp",
    "pthread_exit",
    "quick_exit",
    "siglongjmp",
    "thrd_exit",
    "verr",
    "verrx",
];

/// The addresses of the functions of [`NO_RETURN`] in `obj`, and of its
/// PLT stubs for them, sorted; of those, only the ones in `called`
/// (sorted): the code decoded calls no other, and reading every symbol's
/// name took half of the rules' time in a recording of Node.js (182,000
/// symbols).
fn no_return_addresses<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
    called: &[u64],
) -> Vec<u64> {
    let named = |name: &str| NO_RETURN.binary_search(&name).is_ok();
    let is_called = |a: u64| called.binary_search(&a).is_ok();
    let mut out: Vec<u64> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition())
        .filter(|s| is_called(s.address()) && s.name().is_ok_and(named))
        .map(|s| s.address())
        .collect();
    out.extend(
        crate::symbols::plt_symbols_of(obj)
            .into_iter()
            .filter(|s| is_called(s.svma) && s.name.strip_suffix("@plt").is_some_and(named))
            .map(|s| s.svma),
    );
    out.sort_unstable();
    out.dedup();
    out
}

/// The address ranges of the FDEs of `section`, non-empty ones, sorted by
/// start; `None` if the section is malformed.
pub fn fde_ranges<'a, S>(section: &S, bases: &BaseAddresses) -> Option<Vec<Range<u64>>>
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let mut ranges = Vec::new();
    for_each_fde(section, bases, |fde| {
        let start = fde.initial_address();
        if let Some(end) = start.checked_add(fde.len()).filter(|&end| end > start) {
            ranges.push(start..end);
        }
    })?;
    ranges.sort_by_key(|r| r.start);
    Some(ranges)
}

/// Each FDE of `section`, parsed, in the section's order; `None` (after
/// those before it) at the first entry that does not parse.
pub fn for_each_fde<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    mut each: impl FnMut(FrameDescriptionEntry<EndianSlice<'a, LittleEndian>>),
) -> Option<()>
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let mut entries = section.entries(bases);
    // FDEs mostly follow their CIE: parse each CIE once.
    let mut last_cie = None;
    while let Some(entry) = entries.next().ok()? {
        let partial = match entry {
            CieOrFde::Cie(cie) => {
                last_cie = Some(cie);
                continue;
            }
            CieOrFde::Fde(partial) => partial,
        };
        let fde = partial
            .parse(|s, b, offset| match &last_cie {
                Some(cie) if cie.offset() == UnwindOffset::<usize>::into(offset) => Ok(cie.clone()),
                _ => s.cie_from_offset(b, offset),
            })
            .ok()?;
        each(fde);
    }
    Some(())
}

/// [`fde_ranges`] of an `.eh_frame` (`data`, at `svma`) whose FDEs all
/// give their addresses as compilers and linkers write them (pc-relative
/// 4-byte), read straight from each FDE's header, in the order of the
/// sorted table of its `.eh_frame_hdr` (`hdr`: its bytes and address)
/// where it has one as linkers write it, else in the section's order and
/// then sorted: a tenth of the time of parsing each FDE and sorting, for
/// the images whose whole code the section describes. With
/// `approximate` (`Some(min)`), an FDE followed by another less than `min`
/// bytes on is taken to cover the code up to it, unread: every stretch of
/// `min` bytes or more that the FDEs leave is still found, with the table
/// and a few FDEs read. `None` for anything else (then parse them).
fn eh_frame_ranges(
    eh_frame: &EhFrame<EndianSlice<'_, LittleEndian>>,
    data: &[u8],
    svma: u64,
    bases: &BaseAddresses,
    hdr: Option<(&[u8], u64)>,
    approximate: Option<u64>,
) -> Option<Vec<Range<u64>>> {
    const PCREL_SDATA4: u8 = 0x1b;
    const DATAREL_SDATA4: u8 = 0x3b;
    const UDATA4: u8 = 0x03;
    let u32_in = |bytes: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    // The FDE pointer encoding of each CIE seen, by offset.
    let mut cies: Vec<(usize, u8)> = Vec::new();
    // The range of the FDE at offset `at`, `None` if it is no such FDE.
    let mut fde_at = |at: usize| -> Option<Option<Range<u64>>> {
        let length = u32_in(data, at)? as usize;
        // 64-bit DWARF entries: leave them to the parser.
        if length == 0xffff_ffff || length < 12 {
            return None;
        }
        let id = u32_in(data, at + 4)? as usize;
        if id == 0 {
            return Some(None);
        }
        let cie = (at + 4).checked_sub(id)?;
        let encoding = match cies.iter().find(|(o, _)| *o == cie) {
            Some(&(_, e)) => e,
            None => {
                let parsed = eh_frame
                    .cie_from_offset(bases, gimli::EhFrameOffset(cie))
                    .ok()?;
                let e = parsed.fde_address_encoding().map_or(0, |e| e.0);
                cies.push((cie, e));
                e
            }
        };
        if encoding != PCREL_SDATA4 {
            return None;
        }
        let begin = u32_in(data, at + 8)? as i32;
        let len = u64::from(u32_in(data, at + 12)?);
        let start = svma
            .checked_add(at as u64 + 8)?
            .checked_add_signed(i64::from(begin))?;
        Some(
            start
                .checked_add(len)
                .filter(|&end| end > start)
                .map(|end| start..end),
        )
    };
    let mut ranges = Vec::new();
    if let Some((h, h_at)) = hdr {
        // version 1, pointer encodings, the section's address, the count,
        // then (initial address, FDE address) pairs relative to the header.
        if h.get(..4)? != [1, PCREL_SDATA4, UDATA4, DATAREL_SDATA4] {
            return None;
        }
        let frame_at = h_at
            .checked_add(4)?
            .checked_add_signed(i64::from(u32_in(h, 4)? as i32))?;
        if frame_at != svma {
            return None;
        }
        let count = u32_in(h, 8)? as usize;
        if count > h.len() / 8 {
            return None;
        }
        let mut last = 0;
        for i in 0..count {
            let entry = 12 + 8 * i;
            let initial = h_at.checked_add_signed(i64::from(u32_in(h, entry)? as i32))?;
            let fde = h_at.checked_add_signed(i64::from(u32_in(h, entry + 4)? as i32))?;
            if initial < last {
                return None;
            }
            last = initial;
            if let Some(min) = approximate.filter(|_| i + 1 < count) {
                let next = h_at.checked_add_signed(i64::from(u32_in(h, entry + 8)? as i32))?;
                if next > initial && next - initial < min {
                    // No stretch of `min` fits before the next FDE.
                    ranges.push(initial..next);
                    continue;
                }
            }
            let at = usize::try_from(fde.checked_sub(svma)?).ok()?;
            match fde_at(at)? {
                Some(r) if r.start == initial => ranges.push(r),
                Some(_) => return None,
                None => {}
            }
        }
        return Some(ranges);
    }
    let mut at = 0usize;
    while at < data.len() {
        let length = u32_in(data, at)? as usize;
        if length == 0 {
            break;
        }
        if let Some(r) = fde_at(at)? {
            ranges.push(r);
        }
        at = at.checked_add(4)?.checked_add(length)?;
    }
    ranges.sort_by_key(|r| r.start);
    Some(ranges)
}

/// The `.debug_frame` of an x86-64 ELF image with rules for the code that
/// neither its `.eh_frame` nor its own `.debug_frame` describes, made from
/// the instructions (see the module's documentation): the image's own
/// entries, then a CIE and the FDEs made. Only the functions holding one
/// of `svmas` (sorted), or all with `None`. `None` where the image is no
/// such file, is a Go binary (see [`crate::go_debug_frame`]), its unwind
/// tables do not parse, or all its code is described.
pub fn code_debug_frame<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
    svmas: Option<&[u64]>,
) -> Option<Vec<u8>> {
    if obj.architecture() != object::Architecture::X86_64
        || obj.format() != object::BinaryFormat::Elf
        || !obj.is_little_endian()
        || obj.section_by_name(".gopclntab").is_some()
    {
        return None;
    }
    let mut code: Vec<_> = obj
        .sections()
        .filter(|sec| {
            // The linker writes the PLT's CFI; its entries are no functions.
            sec.kind() == SectionKind::Text
                && !sec.name().unwrap_or("").starts_with(".plt")
                // Addresses past the end of the address space: no code.
                && sec.address().checked_add(sec.size()).is_some()
        })
        .collect();
    code.sort_by_key(|sec| sec.address());
    let code_ranges: Vec<Range<u64>> = code
        .iter()
        .map(|sec| sec.address()..sec.address().saturating_add(sec.size()))
        .collect();
    // A separate debug file (its code NOBITS): nothing to read further.
    if code.is_empty() {
        return None;
    }
    let own = match obj.section_by_name(".debug_frame") {
        Some(sec) => {
            if sec.compressed_data().ok()?.uncompressed_size > MAX_CODE {
                return None;
            }
            sec.uncompressed_data().ok()?.into_owned()
        }
        None => Vec::new(),
    };
    let mut covered = Vec::new();
    let mut min_code = MIN_CODE;
    if !own.is_empty() {
        let mut debug_frame = gimli::DebugFrame::new(&own, LittleEndian);
        debug_frame.set_address_size(8);
        covered = fde_ranges(&debug_frame, &BaseAddresses::default())?;
    }
    if let Some(sec) = obj.section_by_name(".eh_frame") {
        let data = sec.data().ok()?;
        let mut bases = BaseAddresses::default().set_eh_frame(sec.address());
        if let Some(text) = obj.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = obj.section_by_name(".got") {
            bases = bases.set_got(got.address());
        }
        let mut eh_frame = EhFrame::new(data, LittleEndian);
        eh_frame.set_address_size(8);
        let hdr = obj
            .section_by_name(".eh_frame_hdr")
            .and_then(|h| Some((h.data().ok()?, h.address())));
        let ranges = |hdr, approximate| {
            eh_frame_ranges(&eh_frame, data, sec.address(), &bases, hdr, approximate)
        };
        let fdes = hdr.and_then(|(h, _)| Some(u32::from_le_bytes(h.get(8..12)?.try_into().ok()?)));
        if fdes.is_some_and(|n| n > MANY_FDES) {
            min_code = MIN_CODE_MANY_FDES;
        }
        // Most images' FDEs leave no stretch of code that long: found from
        // the header's table alone.
        if let Some(mut approximate) = hdr.and_then(|_| ranges(hdr, Some(min_code))) {
            approximate.extend(covered.iter().cloned());
            approximate.sort_by_key(|r| r.start);
            let longest = uncovered(&code_ranges, &approximate)
                .into_iter()
                .map(|(_, gap)| gap.end - gap.start)
                .max();
            if longest.is_none_or(|l| l < min_code) {
                return None;
            }
        }
        // By the header's table, else in the section's order, else parsed.
        let exact = match hdr
            .and_then(|_| ranges(hdr, None))
            .or_else(|| ranges(None, None))
        {
            Some(r) => r,
            None => fde_ranges(&eh_frame, &bases)?,
        };
        covered.extend(exact);
        covered.sort_by_key(|r| r.start);
    }
    let mut uncovered_code = Vec::new();
    let (mut total, mut longest) = (0u64, 0u64);
    // Gaps shorter than a function's alignment are padding between
    // functions (an image with CFI has thousands).
    for (k, gap) in uncovered(&code_ranges, &covered) {
        if gap.end - gap.start >= 16 {
            total = total.saturating_add(gap.end - gap.start);
            longest = longest.max(gap.end - gap.start);
            uncovered_code.push((code[k].index(), gap));
        }
    }
    // The C runtime's start-up and exit functions, in every image gcc
    // links, have no CFI and take about 200 bytes: not worth decoding (a
    // decoder's tables take about half a millisecond to set up, and
    // reading every FDE's length more).
    if longest < min_code || total > MAX_CODE {
        return None;
    }
    // No function wanted holds code without CFI: nothing to decode.
    if let Some(svmas) = svmas {
        let held = uncovered_code.iter().any(|(_, gap)| {
            let i = svmas.partition_point(|&a| a < gap.start);
            svmas.get(i).is_some_and(|&a| a < gap.end)
        });
        if !held {
            return None;
        }
    }
    let mut gaps = Vec::new();
    for (i, gap) in uncovered_code {
        let Ok(sec) = obj.section_by_index(i) else {
            continue;
        };
        let Ok(Some(bytes)) = sec.data_range(gap.start, gap.end - gap.start) else {
            continue;
        };
        gaps.push(Code::decode(gap.start, bytes));
    }
    gaps.retain(|code| code.insns.iter().any(is_code));
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable_by_key(|g| g.range().start);
    let ranges: Vec<Range<u64>> = gaps.iter().map(Code::range).collect();
    let in_gaps = |a: u64| {
        let i = ranges.partition_point(|r| r.end <= a);
        ranges.get(i).is_some_and(|r| r.contains(&a))
    };
    let mut starts: Vec<u64> = Vec::new();
    // The parts of functions that gcc moves out of their way (`f.cold`,
    // `f.part.0.cold`): entered by jumps from their function, at its frame.
    let mut fragments: Vec<u64> = Vec::new();
    // Starts that symbols name as functions.
    let mut named: Vec<u64> = Vec::new();
    for sym in obj.symbols().chain(obj.dynamic_symbols()) {
        if sym.kind() == object::SymbolKind::Text && in_gaps(sym.address()) {
            starts.push(sym.address());
            if sym.name().is_ok_and(is_cold_part) {
                fragments.push(sym.address());
            } else {
                named.push(sym.address());
            }
        }
    }
    // Code addresses in data (function pointers of a shared library) and
    // taken by code: functions, unless the code also branches there (a
    // constant that happens to fall in the code, a label).
    let mut taken = Vec::new();
    if let Some(relocations) = obj.dynamic_relocations() {
        for (_, r) in relocations {
            let RelocationFlags::Elf { r_type } = r.flags() else {
                continue;
            };
            if r_type == object::elf::R_X86_64_RELATIVE || r_type == object::elf::R_X86_64_IRELATIVE
            {
                let a = r.addend() as u64;
                if in_gaps(a) {
                    taken.push(a);
                }
            }
        }
    }
    let fixed = obj.kind() == object::ObjectKind::Executable;
    let mut refs = References::default();
    for code in &gaps {
        code.referenced(fixed, &in_gaps, &mut refs);
    }
    // What calls enter and addresses taken are functions, not pieces of
    // others.
    starts.extend(&refs.firsts);
    starts.extend(&refs.calls);
    let mut entered = std::mem::take(&mut refs.calls);
    let branched = &mut refs.branched;
    branched.sort_unstable();
    taken.append(&mut refs.taken);
    taken.retain(|t| branched.binary_search(t).is_err());
    entered.extend(&taken);
    let fragments = fragments_of(fragments, named, &refs.firsts, entered);
    starts.extend(taken);
    starts.sort_unstable();
    starts.dedup();
    // Only instruction boundaries of the decoded code.
    starts.retain(|&s| {
        let i = ranges.partition_point(|r| r.end <= s);
        gaps.get(i)
            .is_some_and(|g| g.insns.binary_search_by_key(&s, Instruction::ip).is_ok())
    });
    // The image's own entries, then a CIE and the FDEs made here.
    let cie = u32::try_from(own.len()).ok()?;
    let mut out = own;
    entry(&mut out, X86_64_CIE);
    let made = out.len();
    let mut called: Vec<u64> = gaps
        .iter()
        .flat_map(|code| &code.insns)
        .filter(|i| i.flow_control() == FlowControl::Call && i.op0_kind() == OpKind::NearBranch64)
        .map(Instruction::near_branch_target)
        .collect();
    called.sort_unstable();
    called.dedup();
    let no_return = no_return_addresses(obj, &called);
    let functions = Functions {
        starts: &starts,
        no_return: &no_return,
        fragments: &fragments,
    };
    write_fdes(&gaps, &functions, svmas, cie, &mut out);
    (out.len() > made).then_some(out)
}

/// The starts that are pieces of other functions (sorted): the cold parts
/// symbols name (`cold`), and the first code of each run without CFI
/// (`firsts`) that no symbol names as a function (`named`), where
/// jumps into it say so (a stripped image's cold parts, which `.text`
/// begins with); none that a call enters or an address takes (`entered`).
fn fragments_of(
    mut cold: Vec<u64>,
    mut named: Vec<u64>,
    firsts: &[u64],
    mut entered: Vec<u64>,
) -> Vec<u64> {
    named.sort_unstable();
    entered.sort_unstable();
    cold.extend(
        firsts
            .iter()
            .filter(|f| named.binary_search(f).is_err())
            .copied(),
    );
    cold.retain(|f| entered.binary_search(f).is_err());
    cold.sort_unstable();
    cold.dedup();
    cold
}

/// Whether a symbol names the cold part of a function (`f.cold`,
/// `f.cold.12`, `f.part.0.cold`), which gcc's hot/cold splitting moves
/// away from the function and enters by jumps.
fn is_cold_part(name: &str) -> bool {
    name.ends_with(".cold") || name.contains(".cold.")
}

/// The `.debug_frame` that [`code_debug_frame`] makes for x86-64 `code`
/// loaded at `address` whose functions begin at `starts` (sorted; the
/// first instruction after padding begins one too): a CIE at offset 0,
/// then the FDEs.
pub fn debug_frame_of_code(address: u64, code: &[u8], starts: &[u64]) -> Vec<u8> {
    debug_frame_of_code_calling(address, code, starts, &[])
}

/// [`debug_frame_of_code`], where calls to `no_return` (sorted) do not
/// return.
fn debug_frame_of_code_calling(
    address: u64,
    code: &[u8],
    starts: &[u64],
    no_return: &[u64],
) -> Vec<u8> {
    let mut out = Vec::new();
    entry(&mut out, X86_64_CIE);
    // Code that would run past the end of the address space has no rules.
    if address.checked_add(code.len() as u64).is_none() {
        return out;
    }
    let code = Code::decode(address, code);
    let mut all = starts.to_vec();
    if let Some(first) = code.insns.iter().find(|i| is_code(i)) {
        all.push(first.ip());
    }
    all.sort_unstable();
    all.dedup();
    let functions = Functions {
        starts: &all,
        no_return,
        fragments: &[],
    };
    write_fdes(&[code], &functions, None, 0, &mut out);
    out
}

/// Append the FDEs of the functions of `gaps` that hold one of `svmas`,
/// or of all with `None`, each naming the CIE at offset `cie`.
///
/// Code that a function enters by a jump from another (a cold part gcc
/// moved away from its function, a block it shares) runs at the frame of
/// that jump, not at an entry's: the functions that jump into the wanted
/// ones are followed first, and the frames at their jumps seed the code
/// jumped to where its own function does not reach it.
fn write_fdes(
    gaps: &[Code],
    functions: &Functions,
    svmas: Option<&[u64]>,
    cie: u32,
    out: &mut Vec<u8>,
) {
    let mut program = Vec::new();
    let mut info = InstructionInfoFactory::new();
    let parts: Vec<Vec<Function>> = gaps.iter().map(|c| c.functions(functions, svmas)).collect();
    // Wanted functions' ranges, to find the jumps into them.
    let mut wanted: Vec<Range<u64>> = gaps
        .iter()
        .zip(&parts)
        .flat_map(|(code, fs)| {
            fs.iter()
                .filter(|f| f.wanted)
                .map(move |f| code.function_range(f))
        })
        .collect();
    wanted.sort_unstable_by_key(|r| r.start);
    let into_wanted = |t: u64| {
        let i = wanted.partition_point(|r| r.end <= t);
        wanted.get(i).is_some_and(|r| r.contains(&t))
    };
    // The frame at each jump from one function into another's code, where
    // it is known and not an entry's (that is a tail call).
    let mut jumps: Vec<(u64, Option<Frame>)> = Vec::new();
    // Each wanted function's FDEs as first written (their range in
    // `written`), and whether seeds may change them.
    let mut written = Vec::new();
    let mut firsts: Vec<Vec<(Range<usize>, bool)>> = Vec::with_capacity(gaps.len());
    for (code, fs) in gaps.iter().zip(&parts) {
        let mut pieces = Vec::with_capacity(fs.len());
        for f in fs {
            let insns = &code.insns[f.first..f.first + f.count];
            let range = code.function_range(f);
            let out_of = |i: &Instruction| {
                matches!(
                    i.flow_control(),
                    FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
                ) && i.op0_kind() == OpKind::NearBranch64
                    && !range.contains(&i.near_branch_target())
            };
            let jumps_into_wanted = || {
                insns
                    .iter()
                    .any(|i| out_of(i) && into_wanted(i.near_branch_target()))
            };
            if !f.wanted && !jumps_into_wanted() {
                pieces.push((0..0, false));
                continue;
            }
            let mut unreached = false;
            let frames = follow(insns, functions, &|_| None, &mut info, &mut unreached);
            // A cold part's frame is not known before its seeds are: its
            // jumps (back into its function) tell nothing yet.
            let fragment = functions.fragments.binary_search(&range.start).is_ok();
            if let Some(frames) = frames.as_ref().filter(|_| !fragment) {
                for (insn, frame) in insns.iter().zip(frames) {
                    // Where the frame is lost the jump tells nothing.
                    if out_of(insn) && frame.is_some_and(|f| f != Frame::ENTRY) {
                        jumps.push((insn.near_branch_target(), *frame));
                    }
                }
            }
            let at = written.len();
            if let Some(frames) = frames.filter(|_| f.wanted) {
                write_function(insns, &frames, cie, &mut written, &mut program);
            }
            // Seeds matter only to a cold part's start and to code its
            // function does not reach.
            pieces.push((at..written.len(), unreached || fragment));
        }
        firsts.push(pieces);
    }
    // Jumps that disagree on the frame tell none: the code there is
    // followed as it was without them.
    jumps.sort_unstable_by_key(|&(t, _)| t);
    let mut seeds: Vec<(u64, Frame)> = Vec::new();
    for same in jumps.chunk_by(|a, b| a.0 == b.0) {
        if let (t, Some(frame)) = same[0] {
            if same.iter().all(|&(_, f)| f == Some(frame)) {
                seeds.push((t, frame));
            }
        }
    }
    let seed = |ip: u64| -> Option<Frame> {
        let i = seeds.binary_search_by_key(&ip, |&(t, _)| t).ok()?;
        Some(seeds[i].1)
    };
    for ((code, fs), pieces) in gaps.iter().zip(&parts).zip(firsts) {
        for (f, (piece, may_change)) in fs.iter().zip(pieces) {
            if !f.wanted {
                continue;
            }
            let range = code.function_range(f);
            let first = seeds.partition_point(|&(t, _)| t < range.start);
            let seeded = may_change && seeds.get(first).is_some_and(|&(t, _)| t < range.end);
            if !seeded {
                out.extend_from_slice(&written[piece]);
                continue;
            }
            let insns = &code.insns[f.first..f.first + f.count];
            match follow(insns, functions, &seed, &mut info, &mut false) {
                Some(frames) => write_function(insns, &frames, cie, out, &mut program),
                // Where a jump's frame makes paths disagree, it is the
                // jump's frame that is in doubt (a block shared by
                // functions at different frames, an address taken that is
                // no function's start): the rules without seeds stand.
                None => out.extend_from_slice(&written[piece]),
            }
        }
    }
}

/// One function of a [`Code`]: `count` instructions from `first`, and
/// whether its FDE is wanted.
struct Function {
    first: usize,
    count: usize,
    wanted: bool,
}

/// The parts of `ranges` (sorted, apart) that no range of `covered`
/// (sorted by start; one may lie inside another) overlaps, each with the
/// index of its range in `ranges`.
fn uncovered(ranges: &[Range<u64>], covered: &[Range<u64>]) -> Vec<(usize, Range<u64>)> {
    let mut gaps = Vec::new();
    // The ranges starting before the current one, and the furthest end
    // among them.
    let (mut before, mut reach) = (0, 0);
    for (k, range) in ranges.iter().enumerate() {
        while covered.get(before).is_some_and(|c| c.start < range.start) {
            reach = reach.max(covered[before].end);
            before += 1;
        }
        let mut at = range.start.max(reach).min(range.end);
        for c in &covered[before..] {
            if c.start >= range.end {
                break;
            }
            if c.start > at {
                gaps.push((k, at..c.start));
            }
            at = at.max(c.end).min(range.end);
        }
        if at < range.end {
            gaps.push((k, at..range.end));
        }
    }
    gaps
}

/// `nop`s (`xchg ax, ax` too) and `int3`s between functions.
fn is_padding(i: &Instruction) -> bool {
    match i.mnemonic() {
        Mnemonic::Nop | Mnemonic::Int3 => true,
        Mnemonic::Xchg => {
            i.op_count() == 2
                && i.op0_kind() == OpKind::Register
                && i.op1_kind() == OpKind::Register
                && i.op0_register() == i.op1_register()
        }
        _ => false,
    }
}

/// An instruction that is neither padding nor undecodable (data, or
/// bytes cut off at the end of a run).
fn is_code(i: &Instruction) -> bool {
    !is_padding(i) && !i.is_invalid()
}

/// A run of code without CFI, decoded from its start.
struct Code {
    insns: Vec<Instruction>,
}

impl Code {
    fn decode(start: u64, bytes: &[u8]) -> Code {
        let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
        let mut insns = Vec::new();
        let mut insn = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut insn);
            insns.push(insn);
        }
        Code { insns }
    }

    fn range(&self) -> Range<u64> {
        match (self.insns.first(), self.insns.last()) {
            (Some(first), Some(last)) => first.ip()..last.next_ip(),
            _ => 0..0,
        }
    }

    /// Add the addresses this code refers to that `in_gaps` holds to
    /// `refs` (see [`References`]); `fixed`: the image is loaded at a fixed
    /// address, so constants moved to a register may be code addresses.
    fn referenced(&self, fixed: bool, in_gaps: &impl Fn(u64) -> bool, refs: &mut References) {
        if let Some(first) = self.insns.iter().find(|i| is_code(i)) {
            refs.firsts.push(first.ip());
        }
        for insn in &self.insns {
            let (list, t) = match insn.flow_control() {
                FlowControl::Call if insn.op0_kind() == OpKind::NearBranch64 => {
                    (&mut refs.calls, insn.near_branch_target())
                }
                FlowControl::ConditionalBranch if insn.op0_kind() == OpKind::NearBranch64 => {
                    (&mut refs.branched, insn.near_branch_target())
                }
                _ if insn.mnemonic() == Mnemonic::Lea && insn.is_ip_rel_memory_operand() => {
                    (&mut refs.taken, insn.ip_rel_memory_address())
                }
                _ if fixed && insn.mnemonic() == Mnemonic::Mov && insn.op_count() == 2 => {
                    match insn.op1_kind() {
                        OpKind::Immediate32 => (&mut refs.taken, u64::from(insn.immediate32())),
                        OpKind::Immediate32to64 => (&mut refs.taken, insn.immediate32to64() as u64),
                        _ => continue,
                    }
                }
                _ => continue,
            };
            if in_gaps(t) {
                list.push(t);
            }
        }
    }

    /// The functions of this code (they begin at `functions.starts`), each
    /// wanted if it holds one of `svmas` or `svmas` is `None`; those
    /// without code are left out.
    fn functions(&self, functions: &Functions, svmas: Option<&[u64]>) -> Vec<Function> {
        let range = self.range();
        let mut all = Vec::new();
        let mut first = 0;
        while first < self.insns.len() {
            let ip = self.insns[first].ip();
            // The function runs to the next start.
            let starts = functions.starts;
            let next = starts.partition_point(|&s| s <= ip);
            let end = starts.get(next).map_or(range.end, |&s| s.min(range.end));
            let count = self.insns[first..].partition_point(|i| i.ip() < end).max(1);
            let insns = &self.insns[first..first + count];
            let Some(last) = insns.last() else { break };
            let wanted = svmas.is_none_or(|svmas| {
                let i = svmas.partition_point(|&s| s < ip);
                svmas.get(i).is_some_and(|&s| s < last.next_ip())
            });
            if insns.iter().any(is_code) {
                all.push(Function {
                    first,
                    count,
                    wanted,
                });
            }
            first += count;
        }
        all
    }

    /// The addresses of function `f`'s instructions.
    fn function_range(&self, f: &Function) -> Range<u64> {
        let first = &self.insns[f.first];
        let last = &self.insns[f.first + f.count - 1];
        first.ip()..last.next_ip()
    }
}

/// Where the functions of code without CFI begin (sorted), and the
/// functions that do not return (sorted).
struct Functions<'a> {
    starts: &'a [u64],
    no_return: &'a [u64],
    /// Starts that are cold parts of functions (sorted), entered by jumps.
    fragments: &'a [u64],
}

/// The code addresses that code without CFI refers to.
#[derive(Default)]
struct References {
    /// Where each run of code begins.
    firsts: Vec<u64>,
    /// Targets of direct calls.
    calls: Vec<u64>,
    /// Addresses taken by `lea` (and constants, where the image is loaded
    /// at a fixed address).
    taken: Vec<u64>,
    /// Targets of conditional jumps.
    branched: Vec<u64>,
}

/// What a function has done to its frame at an instruction, before it
/// runs: the CFA as an offset from `rsp` (`sp`) and, once `rbp` was set
/// from `rsp`, from `rbp` (`fp`); where the caller's `rbp` is saved (at
/// CFA − `saved_bp`) while it is not in `rbp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    sp: Option<i64>,
    fp: Option<i64>,
    saved_bp: Option<i64>,
}

impl Frame {
    /// At a function's first instruction: the return address just pushed.
    const ENTRY: Frame = Frame {
        sp: Some(8),
        fp: None,
        saved_bp: None,
    };

    /// Whether the CFA can be told (above the stack pointer).
    fn known(&self) -> bool {
        self.sp.is_some_and(|sp| sp >= 8) || self.fp.is_some_and(|fp| fp >= 8)
    }

    /// The frame where two paths meet: what they agree on, `None` if that
    /// does not tell the CFA or they disagree on where the caller's `rbp`
    /// is. (A frame pointer tells the CFA where the stack pointer differs,
    /// as after a variable-length array on one path; `rbp` set from `rsp`
    /// on one path only was no frame pointer.)
    fn meet(self, other: Frame) -> Option<Frame> {
        if self.saved_bp != other.saved_bp {
            return None;
        }
        let same = |a: Option<i64>, b: Option<i64>| if a == b { a } else { None };
        Some(Frame {
            sp: same(self.sp, other.sp),
            fp: same(self.fp, other.fp),
            saved_bp: self.saved_bp,
        })
        .filter(Frame::known)
    }

    /// Whether running `insn` in this frame shows that the frame is not
    /// what the function's code has: a `leave` where the function set no
    /// frame pointer, or a `ret` where the stack pointer is not at the
    /// return address. Then what was taken for the function's entry is
    /// none (a piece of another function's epilogue after padding, as the
    /// return-type cases of libffi's `ffi_call_unix64`, reached through a
    /// jump table that `rsp` set from a register hides), or a call was
    /// taken to return that does not. No rules beat wrong ones there: the
    /// frame pointer that `leave` takes may still be followed.
    fn contradicted_by(&self, insn: &Instruction) -> bool {
        match insn.mnemonic() {
            Mnemonic::Leave => self.fp.is_none(),
            Mnemonic::Ret => self.sp.is_some_and(|sp| sp != 8),
            _ => false,
        }
    }

    /// The frame after `insn`, which `info` describes; `None` once the
    /// CFA is lost.
    fn step(self, insn: &Instruction, info: &mut InstructionInfoFactory) -> Option<Frame> {
        let mut f = self;
        let op0 = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
            .then(|| insn.op0_register());
        let op1 = (insn.op_count() > 1 && insn.op1_kind() == OpKind::Register)
            .then(|| insn.op1_register());
        let imm1 = (insn.op_count() > 1)
            .then(|| match insn.op1_kind() {
                OpKind::Immediate8to64 | OpKind::Immediate32to64 => Some(insn.immediate(1) as i64),
                OpKind::Immediate32 | OpKind::Immediate8 => Some(insn.immediate(1) as i64),
                _ => None,
            })
            .flatten();
        match (insn.mnemonic(), op0, op1) {
            (Mnemonic::Sub, Some(Register::RSP), None) if imm1.is_some() => {
                f.sp = f.sp.and_then(|sp| sp.checked_add(imm1?));
                return Some(f).filter(Frame::known);
            }
            (Mnemonic::Add, Some(Register::RSP), None) if imm1.is_some() => {
                f.sp = f.sp.and_then(|sp| sp.checked_sub(imm1?));
                return Some(f).filter(Frame::known);
            }
            (Mnemonic::Lea, Some(Register::RSP), None) if insn.memory_index() == Register::None => {
                let d = insn.memory_displacement64() as i64;
                f.sp = match insn.memory_base() {
                    Register::RSP => f.sp.and_then(|sp| sp.checked_sub(d)),
                    Register::RBP => f.fp.and_then(|fp| fp.checked_sub(d)),
                    _ => None,
                };
                return Some(f).filter(Frame::known);
            }
            (Mnemonic::Mov, Some(Register::RBP), Some(Register::RSP)) => {
                f.fp = f.sp;
                return Some(f).filter(Frame::known);
            }
            (Mnemonic::Lea, Some(Register::RBP), None)
                if insn.memory_base() == Register::RSP && insn.memory_index() == Register::None =>
            {
                // rbp = rsp + d: the CFA is rbp + (sp - d).
                let d = insn.memory_displacement64() as i64;
                f.fp = f.sp.and_then(|sp| sp.checked_sub(d));
                return Some(f).filter(Frame::known);
            }
            (Mnemonic::Mov, Some(Register::RSP), Some(Register::RBP)) => {
                f.sp = f.fp;
                return Some(f).filter(Frame::known);
            }
            (Mnemonic::Leave, _, _) => {
                // mov rsp, rbp; pop rbp.
                let sp = f.fp?;
                if f.saved_bp == Some(sp) {
                    f.saved_bp = None;
                }
                f.sp = sp.checked_sub(8);
                f.fp = None;
                return Some(f).filter(Frame::known);
            }
            _ => {}
        }
        let calls = matches!(
            insn.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall
        );
        let pushed = if calls {
            0
        } else {
            insn.stack_pointer_increment()
        };
        if pushed != 0 {
            let pushes_bp = insn.mnemonic() == Mnemonic::Push && op0 == Some(Register::RBP);
            let pops = insn.mnemonic() == Mnemonic::Pop;
            // The slot a pop reads, as an offset below the CFA.
            let slot = f.sp;
            f.sp = f.sp.and_then(|sp| sp.checked_sub(i64::from(pushed)));
            if pushes_bp && f.saved_bp.is_none() {
                f.saved_bp = f.sp;
            }
            if pops && op0 == Some(Register::RBP) {
                if f.saved_bp.is_some() && f.saved_bp == slot {
                    f.saved_bp = None;
                }
                f.fp = None;
            }
            if pops && op0 == Some(Register::RSP) {
                f.sp = None;
            }
            if insn.mnemonic() == Mnemonic::Push || pops {
                return Some(f).filter(Frame::known);
            }
        }
        // Anything else that writes rsp or rbp: only instructions that
        // name either, or move the stack pointer, can.
        let names = (0..insn.op_count()).any(|i| {
            insn.op_kind(i) == OpKind::Register
                && matches!(
                    insn.op_register(i).full_register(),
                    Register::RSP | Register::RBP
                )
        });
        if !names && pushed == 0 && !calls && insn.mnemonic() != Mnemonic::Enter {
            return Some(f).filter(Frame::known);
        }
        let (mut writes_sp, mut writes_bp) = (false, false);
        for used in info.info(insn).used_registers() {
            let writes = matches!(
                used.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            );
            if !writes {
                continue;
            }
            match used.register().full_register() {
                Register::RSP => writes_sp = true,
                Register::RBP => writes_bp = true,
                _ => {}
            }
        }
        if writes_sp && pushed == 0 && !calls {
            f.sp = None;
        }
        if writes_bp {
            f.fp = None;
        }
        Some(f).filter(Frame::known)
    }
}

/// The frame before each of `insns` (one function, in address order),
/// followed along its branches from its entry; code no path from the
/// entry reaches (switch cases reached through a jump table, functions
/// found by no reference, a cold part no symbol marks) is followed from
/// its first instruction with the frame `seed` gives there (that of other
/// functions' jumps to it, where they agree), else with
/// the frame at the function's indirect jumps, or as an entry where it
/// has none; `unreached` is set where there is such code. A function that
/// is a cold part (its start in `functions.fragments`) starts at the frame
/// `seed` gives it, as an entry's where it gives none. Calls to
/// `functions.no_return` end their path. A call may not return (`exit`,
/// `abort`, `__stack_chk_fail`): where paths meet, the one through the
/// fewest returns of calls gives the frame. `None` where paths meet with
/// frames that disagree, or where an instruction shows the frame wrong
/// ([`Frame::contradicted_by`]). Instructions where the frame is lost are
/// `None` in the result.
fn follow(
    insns: &[Instruction],
    functions: &Functions,
    seed: &dyn Fn(u64) -> Option<Frame>,
    info: &mut InstructionInfoFactory,
    unreached: &mut bool,
) -> Option<Vec<Option<Frame>>> {
    let no_return = functions.no_return;
    let mut seen: Vec<Option<Reach>> = vec![None; insns.len()];
    let mut at_indirect: Option<Option<Frame>> = None;
    // The targets of this function's direct jumps.
    let mut targets: Vec<u64> = insns
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            ) && i.op0_kind() == OpKind::NearBranch64
        })
        .map(Instruction::near_branch_target)
        .collect();
    targets.sort_unstable();
    // Whether the call at `i` returns. Compilers pad code with `nop`s
    // only before a function, a loop's head and code that only jumps
    // reach: a call followed by `nop`s, then by code none of the
    // function's jumps goes to, does not return (`__stack_chk_fail`,
    // `abort`), and what follows is another function (a static one that
    // no symbol or call marks) or a jump table's case. (An `int3` after a
    // call is no such sign: V8 marks calls that do not return there so,
    // and code that runs follows.)
    let nop = |i: &Instruction| is_padding(i) && i.mnemonic() != Mnemonic::Int3;
    let returns = |i: usize| {
        let insn = &insns[i];
        if insn.op0_kind() == OpKind::NearBranch64
            && no_return.binary_search(&insn.near_branch_target()).is_ok()
        {
            return false;
        }
        if !insns.get(i + 1).is_some_and(nop) {
            return true;
        }
        insns[i + 1..]
            .iter()
            .find(|n| !nop(n))
            .is_some_and(|n| targets.binary_search(&n.ip()).is_ok())
    };
    // A cold part starts at the frame of the jumps into it, where known.
    let start = insns.first().map_or(0, Instruction::ip);
    let entry = match functions.fragments.binary_search(&start) {
        Ok(_) => Some(seed(start).unwrap_or(Frame::ENTRY)),
        Err(_) => Some(Frame::ENTRY),
    };
    let entry = Reach {
        frame: entry,
        calls: 0,
    };
    let mut work: Vec<(usize, Reach)> = vec![(0, entry)];
    let mut seeded = 0;
    loop {
        while let Some((i, reach)) = work.pop() {
            let now = match seen[i] {
                None => reach,
                Some(had) => had.join(reach)?,
            };
            if seen[i] == Some(now) {
                continue;
            }
            seen[i] = Some(now);
            let frame = now.frame;
            let insn = &insns[i];
            // Not code, or not decoded from an instruction's start (or an
            // AVX-512 instruction, which the decoder is built without):
            // what follows is lost.
            let after = match insn.is_invalid() {
                true => None,
                false => frame.and_then(|f| f.step(insn, info)),
            };
            let target = |t: u64| insns.binary_search_by_key(&t, Instruction::ip).ok();
            let mut succ = |j: Option<usize>, call: bool| {
                if let Some(j) = j {
                    let calls = now.calls.saturating_add(u32::from(call));
                    work.push((
                        j,
                        Reach {
                            frame: after,
                            calls,
                        },
                    ));
                }
            };
            let next = (i + 1 < insns.len()).then_some(i + 1);
            match insn.flow_control() {
                _ if insn.is_invalid() => succ(next, false),
                FlowControl::Return | FlowControl::Exception => {}
                FlowControl::UnconditionalBranch => {
                    // A jump out of the function is a tail call.
                    if insn.op0_kind() == OpKind::NearBranch64 {
                        succ(target(insn.near_branch_target()), false);
                    }
                }
                FlowControl::IndirectBranch => {
                    // A jump table's cases, or a tail call through a
                    // pointer (at the entry's frame).
                    if frame != Some(Frame::ENTRY) {
                        at_indirect = match at_indirect {
                            None => Some(frame),
                            Some(f) if f == frame => Some(f),
                            Some(_) => Some(None),
                        };
                    }
                }
                FlowControl::ConditionalBranch => {
                    succ(next, false);
                    if insn.op0_kind() == OpKind::NearBranch64 {
                        succ(target(insn.near_branch_target()), false);
                    }
                }
                FlowControl::Call | FlowControl::IndirectCall => {
                    if returns(i) {
                        succ(next, true);
                    }
                }
                _ => succ(next, false),
            }
        }
        // Code not reached from the entry.
        while seeded < insns.len() && (seen[seeded].is_some() || is_padding(&insns[seeded])) {
            seeded += 1;
        }
        if seeded >= insns.len() {
            break;
        }
        *unreached = true;
        let frame = match (seed(insns[seeded].ip()), at_indirect) {
            // Code other functions jump to (a cold part after its function
            // where no symbol marks it).
            (Some(f), _) => Some(f),
            (None, None) => Some(Frame::ENTRY),
            // Jump tables at different frames, or where the frame was
            // lost: which one is not known.
            (None, Some(f)) => f,
        };
        work.push((seeded, Reach { frame, calls: 0 }));
    }
    let frames: Vec<Option<Frame>> = seen
        .into_iter()
        .zip(insns)
        .map(|(s, insn)| s.filter(|_| !insn.is_invalid()).and_then(|s| s.frame))
        .collect();
    let contradicted = frames
        .iter()
        .zip(insns)
        .any(|(f, insn)| f.is_some_and(|f| f.contradicted_by(insn)));
    (!contradicted).then_some(frames)
}

/// How [`follow`] reached an instruction: with which frame (`None`: lost)
/// and through the returns of how many calls, on the path with fewest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reach {
    frame: Option<Frame>,
    calls: u32,
}

impl Reach {
    /// The instruction reached both ways; `None` where the frames
    /// disagree.
    fn join(self, other: Reach) -> Option<Reach> {
        // The path through fewer calls, one of which may not have
        // returned, says more (a loop's way back has more too).
        if self.calls != other.calls {
            return Some(if self.calls < other.calls {
                self
            } else {
                other
            });
        }
        let frame = match (self.frame, other.frame) {
            (Some(a), Some(b)) => Some(a.meet(b)?),
            // Lost on one path: lost.
            _ => None,
        };
        Some(Reach {
            frame,
            calls: self.calls,
        })
    }
}

/// Append FDEs for `insns` (one function) with their `frames`: one per
/// run of consecutive instructions whose frame is known (padding between
/// them, which never runs, taken into the run).
fn write_function(
    insns: &[Instruction],
    frames: &[Option<Frame>],
    cie: u32,
    out: &mut Vec<u8>,
    program: &mut Vec<u8>,
) {
    let mut i = 0;
    while i < insns.len() {
        if frames[i].is_none() || is_padding(&insns[i]) {
            i += 1;
            continue;
        }
        // The run, up to its last instruction that is not padding.
        let mut end = i;
        let mut j = i;
        while j < insns.len() && (frames[j].is_some() || is_padding(&insns[j])) {
            if !is_padding(&insns[j]) {
                end = j + 1;
            }
            j += 1;
        }
        let start = insns[i].ip();
        fde_header(program, cie, start, insns[end - 1].next_ip() - start);
        let mut now = Frame::ENTRY;
        let mut pc = start;
        for (insn, frame) in insns[i..end].iter().zip(&frames[i..end]) {
            let Some(frame) = *frame else { continue };
            if frame != now {
                advance(program, insn.ip() - pc);
                pc = insn.ip();
                change(program, now, frame);
                now = frame;
            }
        }
        entry(out, program);
        i = j;
    }
}

/// The CFA instructions from frame `from` to frame `to`.
fn change(program: &mut Vec<u8>, from: Frame, to: Frame) {
    // DWARF registers: rbp 6, rsp 7.
    let cfa = |f: Frame| match (f.sp, f.fp) {
        (Some(sp), _) if sp >= 8 => Some((7, sp)),
        (_, Some(fp)) if fp >= 8 => Some((6, fp)),
        _ => None,
    };
    match (cfa(from), cfa(to)) {
        (Some((r0, _)), Some((r1, off))) if r0 == r1 => {
            // DW_CFA_def_cfa_offset.
            program.push(0x0e);
            push_uleb(program, off as u64);
        }
        (_, Some((r1, off))) => {
            // DW_CFA_def_cfa.
            program.extend([0x0c, r1]);
            push_uleb(program, off as u64);
        }
        (_, None) => {}
    }
    if from.saved_bp != to.saved_bp {
        match to.saved_bp {
            Some(at) if at > 0 && at % 8 == 0 => {
                // DW_CFA_offset rbp: at cfa - at (data alignment -8).
                program.push(0x80 | 6);
                push_uleb(program, (at / 8) as u64);
            }
            // DW_CFA_same_value rbp.
            _ => program.extend([0x08, 6]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{CfaRule, DebugFrame, RegisterRule, UnwindContext};

    /// Where the CFA is and where the caller's `rbp` is saved, at `address`
    /// of the CFI made for `code` (at address 0, functions at `starts`):
    /// (register, offset, rbp's offset from the CFA); `None` without a rule.
    fn rule_at(code: &[u8], starts: &[u64], address: u64) -> Option<(u16, i64, Option<i64>)> {
        rule_in(&debug_frame_of_code(0, code, starts), address)
    }

    /// [`rule_at`] in the `.debug_frame` `out`.
    fn rule_in(out: &[u8], address: u64) -> Option<(u16, i64, Option<i64>)> {
        let mut frame = DebugFrame::new(out, LittleEndian);
        frame.set_address_size(8);
        let mut ctx = UnwindContext::new();
        let row = frame
            .unwind_info_for_address(
                &BaseAddresses::default(),
                &mut ctx,
                address,
                DebugFrame::cie_from_offset,
            )
            .ok()?;
        let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
            panic!("CFA by expression");
        };
        let bp = match row.register(gimli::X86_64::RBP) {
            Some(RegisterRule::Offset(o)) => Some(o),
            None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => None,
            other => panic!("rbp: {other:?}"),
        };
        Some((register.0, offset, bp))
    }

    const RSP: u16 = 7;
    const RBP: u16 = 6;

    /// f1 (0x0): two pushes, a frame, an early return, a loop after
    /// calls. f2 (0x30): a frame pointer, the stack aligned and grown by a
    /// register, given back through `lea rsp, [rbp-8]`. f3 (0x50): `rbp`
    /// set from `rsp` on one path only, as a general register. Assembled
    /// (GNU as, Intel syntax) from:
    ///
    /// ```text
    /// f1: push rbp; push rbx; sub rsp, 0x18; test edi, edi; je 1f
    ///     call f2; add rsp, 0x18; pop rbx; pop rbp; ret
    /// 1:  call f2; mov eax, 1; call f2
    /// 2:  xor eax, eax; jmp 2b; .p2align 4
    /// f2: push rbp; mov rbp, rsp; push r12; and rsp, -32; sub rsp, rdi
    ///     call f1; lea rsp, [rbp-8]; pop r12; pop rbp; ret; .p2align 4
    /// f3: push rbp; sub rsp, 16; mov rbp, rsp; test edi, edi; jne 3f
    ///     mov rbp, rdi
    /// 3:  add rsp, 16; pop rbp; ret
    /// ```
    const FUNCTIONS: &[u8] = &[
        0x55, 0x53, 0x48, 0x83, 0xec, 0x18, 0x85, 0xff, 0x74, 0x0c, 0xe8, 0x21, 0x00, 0x00, 0x00,
        0x48, 0x83, 0xc4, 0x18, 0x5b, 0x5d, 0xc3, 0xe8, 0x15, 0x00, 0x00, 0x00, 0xb8, 0x01, 0x00,
        0x00, 0x00, 0xe8, 0x0b, 0x00, 0x00, 0x00, 0x31, 0xc0, 0xeb, 0xfc, 0x0f, 0x1f, 0x80, 0x00,
        0x00, 0x00, 0x00, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0x83, 0xe4, 0xe0, 0x48, 0x29,
        0xfc, 0xe8, 0xbe, 0xff, 0xff, 0xff, 0x48, 0x8d, 0x65, 0xf8, 0x41, 0x5c, 0x5d, 0xc3, 0x66,
        0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55, 0x48, 0x83, 0xec, 0x10, 0x48, 0x89, 0xe5, 0x85, 0xff,
        0x75, 0x03, 0x48, 0x89, 0xfd, 0x48, 0x83, 0xc4, 0x10, 0x5d, 0xc3,
    ];

    #[test]
    fn pushes_frames_and_early_returns_are_followed() {
        let at = |a| rule_at(FUNCTIONS, &[0, 0x30, 0x50], a);
        assert_eq!(at(0x0), Some((RSP, 8, None)));
        assert_eq!(at(0x1), Some((RSP, 16, Some(-16))));
        assert_eq!(at(0x2), Some((RSP, 24, Some(-16))));
        // The frame, the return address of the first call, the epilogue.
        assert_eq!(at(0x6), Some((RSP, 48, Some(-16))));
        assert_eq!(at(0xf), Some((RSP, 48, Some(-16))));
        assert_eq!(at(0x13), Some((RSP, 24, Some(-16))));
        assert_eq!(at(0x15), Some((RSP, 8, None)));
        // The branch taken before the epilogue, and the loop after it.
        assert_eq!(at(0x16), Some((RSP, 48, Some(-16))));
        assert_eq!(at(0x25), Some((RSP, 48, Some(-16))));
        assert_eq!(at(0x27), Some((RSP, 48, Some(-16))));
    }

    #[test]
    fn a_frame_pointer_gives_the_frame_where_the_stack_pointer_is_lost() {
        let at = |a| rule_at(FUNCTIONS, &[0, 0x30, 0x50], a);
        assert_eq!(at(0x31), Some((RSP, 16, Some(-16))));
        assert_eq!(at(0x34), Some((RSP, 16, Some(-16))));
        assert_eq!(at(0x36), Some((RSP, 24, Some(-16))));
        // `and rsp`, `sub rsp, rdi`: rbp + 16 from there on.
        assert_eq!(at(0x3a), Some((RBP, 16, Some(-16))));
        assert_eq!(at(0x42), Some((RBP, 16, Some(-16))));
        assert_eq!(at(0x46), Some((RSP, 24, Some(-16))));
        assert_eq!(at(0x48), Some((RSP, 16, Some(-16))));
        assert_eq!(at(0x49), Some((RSP, 8, None)));
    }

    #[test]
    fn rbp_set_from_rsp_on_one_path_is_no_frame_pointer() {
        let at = |a| rule_at(FUNCTIONS, &[0, 0x30, 0x50], a);
        assert_eq!(at(0x50), Some((RSP, 8, None)));
        assert_eq!(at(0x58), Some((RSP, 32, Some(-16))));
        assert_eq!(at(0x5c), Some((RSP, 32, Some(-16))));
        // Where the paths meet, the stack pointer still tells.
        assert_eq!(at(0x5f), Some((RSP, 32, Some(-16))));
        assert_eq!(at(0x63), Some((RSP, 16, Some(-16))));
        assert_eq!(at(0x64), Some((RSP, 8, None)));
    }

    /// f4 (0x0): an argument pushed for a call that does not return, and
    /// a branch past it. f5 (0x10): a jump through a register to a case
    /// at 0x20 that no direct jump reaches. f6 (0x30): `pop rsp`.
    ///
    /// ```text
    /// f4: push rbx; test edi, edi; je 5f; push 0; call f4
    /// 5:  pop rbx; ret; .p2align 4
    /// f5: push rbx; sub rsp, 16; mov rax, rdi; jmp rax; .p2align 4
    ///     add rsp, 16; pop rbx; ret; int3; .p2align 4
    /// f6: push rbx; mov rbx, rsp; push rbx; pop rsp; pop rbx; ret
    /// ```
    const JUMPS: &[u8] = &[
        0x53, 0x85, 0xff, 0x74, 0x07, 0x6a, 0x00, 0xe8, 0xf4, 0xff, 0xff, 0xff, 0x5b, 0xc3, 0x66,
        0x90, 0x53, 0x48, 0x83, 0xec, 0x10, 0x48, 0x89, 0xf8, 0xff, 0xe0, 0x66, 0x0f, 0x1f, 0x44,
        0x00, 0x00, 0x48, 0x83, 0xc4, 0x10, 0x5b, 0xc3, 0xcc, 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x53, 0x48, 0x89, 0xe3, 0x53, 0x5c, 0x5b, 0xc3,
    ];

    #[test]
    fn the_frame_after_a_call_gives_way_to_a_branch_there() {
        let at = |a| rule_at(JUMPS, &[0, 0x10, 0x30], a);
        assert_eq!(at(0x7), Some((RSP, 24, None)));
        // Reached by `je` with one push, and after the call with two.
        assert_eq!(at(0xc), Some((RSP, 16, None)));
        assert_eq!(at(0xd), Some((RSP, 8, None)));
    }

    #[test]
    fn code_reached_through_a_jump_table_has_the_frame_of_the_jump() {
        let at = |a| rule_at(JUMPS, &[0, 0x10, 0x30], a);
        assert_eq!(at(0x18), Some((RSP, 32, None)));
        assert_eq!(at(0x20), Some((RSP, 32, None)));
        assert_eq!(at(0x24), Some((RSP, 16, None)));
        assert_eq!(at(0x25), Some((RSP, 8, None)));
        // Without starts, a function after one with no indirect jump
        // begins at an entry frame.
        assert_eq!(rule_at(JUMPS, &[0], 0x10), Some((RSP, 8, None)));
    }

    #[test]
    fn a_stack_pointer_loaded_from_memory_ends_the_rules() {
        let at = |a| rule_at(JUMPS, &[0, 0x10, 0x30], a);
        assert_eq!(at(0x34), Some((RSP, 16, None)));
        assert_eq!(at(0x35), Some((RSP, 24, None)));
        assert_eq!(at(0x36), None);
        assert_eq!(at(0x37), None);
    }

    #[test]
    fn code_at_the_end_of_the_address_space_gets_no_rules() {
        let mut cie_only = Vec::new();
        entry(&mut cie_only, X86_64_CIE);
        assert_eq!(debug_frame_of_code(u64::MAX - 8, FUNCTIONS, &[]), cie_only);
        assert_ne!(debug_frame_of_code(0, FUNCTIONS, &[]), cie_only);
    }

    #[test]
    fn paths_that_disagree_give_the_function_no_rules() {
        // push rbx; test edi, edi; je 1f; push rbx; 1: pop rbx; ret
        let code = [0x53, 0x85, 0xff, 0x74, 0x01, 0x53, 0x5b, 0xc3];
        assert_eq!(rule_at(&code, &[0], 0x0), None);
        assert_eq!(rule_at(&code, &[0], 0x6), None);
    }

    /// f1 (0x0): a call that does not return (`nop`s follow it), then g
    /// (0x20), which no symbol or call marks. f2 (0x30): a call, `nop`s,
    /// then a loop's head. f3 (0x50): `rbp` set from `rsp` with an offset
    /// and `rsp` given back from it. f4 (0x70): a piece of an epilogue
    /// (as libffi's return-type cases): `leave` with no frame pointer set.
    /// Assembled (GNU as, Intel syntax) from:
    ///
    /// ```text
    /// f1: push rbx; sub rsp, 0x20; test edi, edi; je 1f
    ///     add rsp, 0x20; pop rbx; ret
    /// 1:  call f1; .p2align 4
    /// g:  push r12; push rbp; mov eax, edi; pop rbp; pop r12; ret
    ///     .p2align 4
    /// f2: push rbx; call f1; .p2align 4
    /// 2:  sub edi, 1; jne 2b; pop rbx; ret; .p2align 4
    /// f3: push rbp; sub rsp, 0x20; lea rbp, [rsp + 0x10]; and rsp, -32
    ///     call f1; mov rsp, rbp; add rsp, 0x10; pop rbp; ret; .p2align 4
    /// f4: movsxd rax, eax; mov [r8], rax; leave; ret
    /// ```
    const PADDED: &[u8] = &[
        0x53, 0x48, 0x83, 0xec, 0x20, 0x85, 0xff, 0x74, 0x06, 0x48, 0x83, 0xc4, 0x20, 0x5b, 0xc3,
        0xe8, 0xec, 0xff, 0xff, 0xff, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x90, 0x41, 0x54, 0x55, 0x89, 0xf8, 0x5d, 0x41, 0x5c, 0xc3, 0x0f, 0x1f, 0x80, 0x00,
        0x00, 0x00, 0x00, 0x53, 0xe8, 0xca, 0xff, 0xff, 0xff, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x83, 0xef, 0x01, 0x75, 0xfb, 0x5b, 0xc3, 0x66, 0x0f, 0x1f, 0x84,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x55, 0x48, 0x83, 0xec, 0x20, 0x48, 0x8d, 0x6c, 0x24, 0x10,
        0x48, 0x83, 0xe4, 0xe0, 0xe8, 0x9d, 0xff, 0xff, 0xff, 0x48, 0x89, 0xec, 0x48, 0x83, 0xc4,
        0x10, 0x5d, 0xc3, 0x0f, 0x1f, 0x40, 0x00, 0x48, 0x63, 0xc0, 0x49, 0x89, 0x00, 0xc9, 0xc3,
    ];
    const PADDED_STARTS: &[u64] = &[0, 0x30, 0x50, 0x70];

    #[test]
    fn code_after_a_call_and_padding_begins_another_function() {
        let at = |a| rule_at(PADDED, PADDED_STARTS, a);
        assert_eq!(at(0xf), Some((RSP, 48, None)));
        // g, at an entry's frame, not at f1's after the call.
        assert_eq!(at(0x20), Some((RSP, 8, None)));
        assert_eq!(at(0x22), Some((RSP, 16, None)));
        assert_eq!(at(0x23), Some((RSP, 24, Some(-24))));
        assert_eq!(at(0x28), Some((RSP, 8, None)));
    }

    #[test]
    fn a_loop_head_after_a_call_and_padding_keeps_the_frame() {
        let at = |a| rule_at(PADDED, PADDED_STARTS, a);
        assert_eq!(at(0x40), Some((RSP, 16, None)));
        assert_eq!(at(0x45), Some((RSP, 16, None)));
        assert_eq!(at(0x46), Some((RSP, 8, None)));
    }

    #[test]
    fn rbp_set_from_rsp_with_an_offset_tells_the_frame() {
        let at = |a| rule_at(PADDED, PADDED_STARTS, a);
        assert_eq!(at(0x5a), Some((RSP, 48, Some(-16))));
        // The stack aligned: the CFA from rbp (rsp + 0x10 at CFA - 48).
        assert_eq!(at(0x5e), Some((RBP, 32, Some(-16))));
        assert_eq!(at(0x63), Some((RBP, 32, Some(-16))));
        assert_eq!(at(0x66), Some((RSP, 32, Some(-16))));
        assert_eq!(at(0x6b), Some((RSP, 8, None)));
    }

    #[test]
    fn leave_without_a_frame_pointer_gives_the_function_no_rules() {
        let at = |a| rule_at(PADDED, PADDED_STARTS, a);
        assert_eq!(at(0x70), None);
        assert_eq!(at(0x76), None);
        // A `ret` where the stack pointer is not at the return address:
        // push rbx; ret
        assert_eq!(rule_at(&[0x53, 0xc3], &[0], 0), None);
    }

    #[test]
    fn a_cold_part_runs_at_the_frame_of_the_jump_into_it() {
        // W:    ret; nop x3
        // cold: mov edi, 1; jmp back          (f's, placed before f)
        //       nop x2
        // f:    push rbx; sub rsp, 0x10; test edi, edi; je cold
        // back: add rsp, 0x10; pop rbx; ret
        let code = [
            0xc3, 0x90, 0x90, 0x90, 0xbf, 0x01, 0x00, 0x00, 0x00, 0xe9, 0x0f, 0x00, 0x00, 0x00,
            0x90, 0x90, 0x53, 0x48, 0x83, 0xec, 0x10, 0x85, 0xff, 0x0f, 0x84, 0xe7, 0xff, 0xff,
            0xff, 0x48, 0x83, 0xc4, 0x10, 0x5b, 0xc3,
        ];
        let at = |starts: &[u64], fragments: &[u64], address| {
            let mut out = Vec::new();
            entry(&mut out, X86_64_CIE);
            let functions = Functions {
                starts,
                no_return: &[],
                fragments,
            };
            write_fdes(&[Code::decode(0, &code)], &functions, None, 0, &mut out);
            rule_in(&out, address)
        };
        // f's frame: its return address, rbx and 16 bytes.
        assert_eq!(at(&[0, 0x10], &[], 0x1d), Some((RSP, 32, None)));
        // Stripped: the cold part is code W does not reach.
        assert_eq!(at(&[0, 0x10], &[], 0x04), Some((RSP, 32, None)));
        assert_eq!(at(&[0, 0x10], &[], 0x09), Some((RSP, 32, None)));
        // Named by a symbol (`f.cold`).
        assert_eq!(at(&[0, 0x04, 0x10], &[0x04], 0x04), Some((RSP, 32, None)));
        assert_eq!(at(&[0, 0x04, 0x10], &[0x04], 0x09), Some((RSP, 32, None)));
        // Taken for a function of its own: an entry's frame, as before.
        assert_eq!(at(&[0, 0x04, 0x10], &[], 0x04), Some((RSP, 8, None)));
        assert!(is_cold_part("f.cold") && is_cold_part("f.part.0.cold.3"));
        assert!(!is_cold_part("coldstart") && !is_cold_part("f.colder"));
    }

    #[test]
    fn cold_parts_are_named_or_runs_no_function_begins() {
        // 0x10 `f.cold`; runs without CFI begin at 0x10 (the cold part),
        // 0x40 (`g`, named) and 0x80 (nameless); 0x90 `h.cold` is called.
        let cold = vec![0x90, 0x10];
        let named = vec![0x40];
        let firsts = [0x10, 0x40, 0x80];
        assert_eq!(
            fragments_of(cold.clone(), named.clone(), &firsts, vec![0x90]),
            [0x10, 0x80]
        );
        // A nameless run that a call enters is a function.
        assert_eq!(fragments_of(cold, named, &firsts, vec![0x80, 0x90]), [0x10]);
    }

    #[test]
    fn a_jump_whose_frame_makes_paths_disagree_leaves_the_rules_as_they_were() {
        // W: jmp ret_; nop; (code W does not reach:) push rax; pop rax;
        //    jmp ret_; ret_: ret; nop x8
        // G: push rbx; jmp (the code W does not reach)
        let code = [
            0xeb, 0x05, 0x90, 0x50, 0x58, 0xeb, 0x00, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
            0x90, 0x90, 0x53, 0xe9, 0xed, 0xff, 0xff, 0xff,
        ];
        // G's frame there meets W's at `ret_` with 8 bytes more: the jump is
        // what is in doubt, so W keeps the rules it has without it.
        let at = |a| rule_at(&code, &[0, 0x10], a);
        assert_eq!(at(0x00), Some((RSP, 8, None)));
        assert_eq!(at(0x03), Some((RSP, 8, None)));
        assert_eq!(at(0x04), Some((RSP, 16, None)));
        assert_eq!(at(0x07), Some((RSP, 8, None)));
        assert_eq!(at(0x11), Some((RSP, 16, None)));
    }

    #[test]
    fn a_call_to_a_function_that_does_not_return_ends_its_path() {
        // f: push rbx; call g
        // h: push rbp; mov eax, edi; pop rbp; ret   (no padding before it)
        // g: ud2
        let code = [
            0x53, 0xe8, 0x05, 0x00, 0x00, 0x00, 0x55, 0x89, 0xf8, 0x5d, 0xc3, 0x0f, 0x0b,
        ];
        let at = |no_return: &[u64], address| {
            let out = debug_frame_of_code_calling(0, &code, &[0, 0xb], no_return);
            rule_in(&out, address)
        };
        // g does not return: h begins at an entry's frame.
        assert_eq!(at(&[0xb], 0x1), Some((RSP, 16, None)));
        assert_eq!(at(&[0xb], 0x6), Some((RSP, 8, None)));
        assert_eq!(at(&[0xb], 0x9), Some((RSP, 16, Some(-16))));
        assert_eq!(at(&[0xb], 0xa), Some((RSP, 8, None)));
        // Taken to return, h's `ret` shows f's frame wrong: no rules.
        assert_eq!(at(&[], 0x1), None);
        assert_eq!(at(&[], 0x6), None);
    }

    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
    fn functions_that_do_not_return_are_found_by_name() {
        // The names are sorted, as their binary search needs.
        assert!(NO_RETURN.windows(2).all(|w| w[0] < w[1]));
        // This test program calls `_Unwind_Resume` (unwinding panics)
        // through its PLT, and `malloc` (which returns).
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let obj = object::File::parse(&*bytes).unwrap();
        let stubs = crate::symbols::plt_symbols_of(&obj);
        let stub = |name: &str| stubs.iter().find(|s| s.name == name).map(|s| s.svma);
        let resume = stub("_Unwind_Resume@plt").expect("no _Unwind_Resume@plt");
        let malloc = stub("malloc@plt");
        let mut called: Vec<u64> = [Some(resume), malloc].into_iter().flatten().collect();
        called.sort_unstable();
        let found = no_return_addresses(&obj, &called);
        assert!(found.binary_search(&resume).is_ok(), "{found:x?}");
        if let Some(malloc) = malloc {
            assert!(found.binary_search(&malloc).is_err());
        }
        // Only what is called is looked up.
        assert!(no_return_addresses(&obj, &[]).is_empty());
    }

    #[test]
    fn fde_ranges_read_from_headers_are_those_parsed() {
        let Ok(bytes) = std::fs::read("/proc/self/exe") else {
            return;
        };
        let obj = object::File::parse(&*bytes).unwrap();
        let Some(sec) = obj.section_by_name(".eh_frame") else {
            return;
        };
        let data = sec.data().unwrap();
        let bases = BaseAddresses::default().set_eh_frame(sec.address());
        let mut eh_frame = EhFrame::new(data, LittleEndian);
        eh_frame.set_address_size(8);
        let parsed = fde_ranges(&eh_frame, &bases);
        let read = eh_frame_ranges(&eh_frame, data, sec.address(), &bases, None, None).unwrap();
        assert!(read.len() > 100, "{}", read.len());
        assert_eq!(Some(read), parsed);
        let hdr = obj.section_by_name(".eh_frame_hdr").unwrap();
        let hdr = Some((hdr.data().unwrap(), hdr.address()));
        let by_hdr = eh_frame_ranges(&eh_frame, data, sec.address(), &bases, hdr, None).unwrap();
        assert_eq!(Some(by_hdr), parsed);
        let parsed = parsed.unwrap();
        // Taken to cover up to the next FDE where less than `min`
        // follows: the same stretches of `min` or more uncovered.
        for min in [MIN_CODE, MIN_CODE_MANY_FDES] {
            let approximate =
                eh_frame_ranges(&eh_frame, data, sec.address(), &bases, hdr, Some(min)).unwrap();
            let long = |ranges: &[Range<u64>]| -> Vec<Range<u64>> {
                let all = ranges[0].start..ranges[ranges.len() - 1].end + min;
                uncovered(std::slice::from_ref(&all), ranges)
                    .into_iter()
                    .map(|(_, g)| g)
                    .filter(|g| g.end - g.start >= min)
                    .collect()
            };
            assert_eq!(long(&approximate), long(&parsed), "{min}");
        }
    }

    #[test]
    fn uncovered_ranges_are_what_no_fde_covers() {
        let gaps = |ranges: &[Range<u64>], covered: &[Range<u64>]| -> Vec<(usize, Range<u64>)> {
            uncovered(ranges, covered)
        };
        let whole = 0x100..0x200;
        let text = std::slice::from_ref(&whole);
        assert_eq!(
            gaps(text, &[0x80..0x110, 0x120..0x130, 0x130..0x1f0]),
            vec![(0, 0x110..0x120), (0, 0x1f0..0x200)]
        );
        assert_eq!(gaps(text, &[]), vec![(0, 0x100..0x200)]);
        // An FDE inside another's range.
        assert_eq!(
            gaps(text, &[0x0..0x180, 0x10..0x20, 0x30..0x40]),
            vec![(0, 0x180..0x200)]
        );
        assert_eq!(gaps(text, &[0x0..0x180, 0x180..0x300]), vec![]);
        // Several sections; an FDE across the space between two.
        assert_eq!(
            gaps(
                &[0x0..0x10, 0x20..0x40, 0x50..0x60],
                &[0x8..0x28, 0x30..0x38]
            ),
            vec![
                (0, 0x0..0x8),
                (1, 0x28..0x30),
                (1, 0x38..0x40),
                (2, 0x50..0x60)
            ]
        );
    }
    #[test]
    fn every_rule_puts_the_frame_address_above_the_pointer_it_counts_from() {
        // Found by fuzzing: `lea rsp, [rbp+12]` left 4 bytes between
        // `rsp` and the CFA while `rbp` still told it.
        let code = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0x0a, 0x74, 0x0c, 0xe8, 0x21, 0x00, 0x00, 0xeb, 0xfc,
            0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48,
            0x83, 0xe4, 0xe0, 0x48, 0x29, 0xfc, 0xe8, 0xbe, 0xff, 0xff, 0xff, 0x48, 0x8d, 0x65,
            0x0c, 0xe8, 0x21, 0x00, 0x00, 0xeb, 0xfc, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00,
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0xe4, 0x48, 0x83, 0x89, 0xfd, 0x48, 0x83,
            0xc4, 0x10, 0x5d, 0xc3,
        ];
        let made = debug_frame_of_code(0x1000, &code, &[0x1000 + 60]);
        let mut frame = DebugFrame::new(&made, LittleEndian);
        frame.set_address_size(8);
        let mut ctx = UnwindContext::new();
        let mut rows = 0;
        for address in 0x1000..0x1000 + code.len() as u64 {
            let Ok(row) = frame.unwind_info_for_address(
                &BaseAddresses::default(),
                &mut ctx,
                address,
                DebugFrame::cie_from_offset,
            ) else {
                continue;
            };
            let CfaRule::RegisterAndOffset { offset, .. } = *row.cfa() else {
                panic!("CFA by expression");
            };
            assert!(offset >= 8, "{offset} at {address:#x}");
            rows += 1;
        }
        assert!(rows > 0);
    }
}
