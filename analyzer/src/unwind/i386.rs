//! 32-bit x86 processes (the i386 ABI) in x86-64 traces.
//!
//! framehop unwinds x86-64 and AArch64 code only, so the samples a recorder
//! flags [`SampleFlags::ABI_32`](lrnprof_format::SampleFlags::ABI_32) are
//! walked here: by the rules of the images' `.eh_frame` and `.debug_frame`,
//! read with gimli, and by frame pointers where no rule covers the code. A
//! walk reads the stack and frame pointers besides the instruction pointer,
//! as framehop's x86-64 walks do (what the recorder keeps), and is not
//! incremental: each sample of a 32-bit process is walked in full.

use super::{continue_with_callchain, Unwound, MAX_FRAMES};
use crate::image::{ImageData, LoadedImage, SectionBytes};
use crate::timeline::Mapping;
use gimli::{
    BaseAddresses, CfaRule, DebugFrame, EhFrame, EndianSlice, EvaluationResult, LittleEndian,
    Location, Register, RegisterRule, UnwindContext, UnwindSection, Value, X86,
};
use lrnprof_format::{Regs, StackView};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Addresses, registers and stack words of an i386 process are 32-bit.
const MASK: u64 = 0xffff_ffff;

/// No return address is below this: the first page is never mapped.
const LOWEST_CODE: u64 = 0x1000;

/// Words a leaf's rule may have missed pushing (see
/// [`Unwinder::missed_push`]).
const MAX_MISSED_PUSHES: u64 = 2;

/// Registers and stack words a CFA expression may ask for at most (the
/// PLT's asks for two registers).
const MAX_EVALUATION_STEPS: usize = 64;

/// Operations a CFA expression may run at most (the PLT's runs nine): a
/// trace is untrusted, and a branch back (`DW_OP_skip`) would loop.
const MAX_OPERATIONS: u32 = 1000;

/// `ebp` of a frame whose caller's `ebp` the rules do not give: no frame
/// pointer (a 32-bit value never is this).
const UNKNOWN_BP: u64 = u64::MAX;

/// The registers a walk follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Regs32 {
    ip: u64,
    sp: u64,
    bp: u64,
}

/// What one step of a walk found.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The caller's registers.
    Caller(Regs32),
    /// The rules say this frame is the outermost (the return address is
    /// undefined, as in `_start`).
    Root,
    /// No table has a rule for the address.
    NoRule,
    /// A rule could not be followed (a read outside the stack copy, a rule
    /// this walk does not follow).
    Fail,
}

/// Which kind of unwind table a [`Table`] is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    EhFrame,
    DebugFrame,
}

/// `$body` with `$section` the gimli section of kind `$kind` over
/// `$bytes` (each kind is its own type).
macro_rules! with_section {
    ($kind:expr, $bytes:expr, |$section:ident| $body:expr) => {
        match $kind {
            Kind::EhFrame => {
                let $section = &eh_frame($bytes);
                $body
            }
            Kind::DebugFrame => {
                let $section = &debug_frame($bytes);
                $body
            }
        }
    };
}

/// One unwind table of an image and the SVMA ranges of its FDEs.
struct Table {
    /// Given to no other table (see [`RULES`]).
    id: u64,
    kind: Kind,
    bytes: SectionBytes,
    bases: BaseAddresses,
    /// (start SVMA, end SVMA, offset of the FDE), sorted by start.
    fdes: Vec<(u64, u64, usize)>,
}

/// The unwind tables of one image.
pub(crate) struct Tables {
    /// `.eh_frame` first, then `.debug_frame`.
    tables: Vec<Table>,
}

impl Tables {
    /// The tables of `data`, if it has any with FDEs.
    fn of(data: &ImageData) -> Option<Tables> {
        let mut bases = BaseAddresses::default();
        if let Some(text) = data.section(".text") {
            bases = bases.set_text(text.svma);
        }
        if let Some(got) = data.section(".got") {
            bases = bases.set_got(got.svma);
        }
        let mut tables = Vec::new();
        if let Some(s) = data.section(".eh_frame").filter(|s| !s.bytes.is_empty()) {
            let bases = bases.clone().set_eh_frame(s.svma);
            tables.extend(Table::new(Kind::EhFrame, s.bytes.clone(), bases));
        }
        if let Some(bytes) = data.section(".debug_frame").and_then(|s| s.read()) {
            tables.extend(Table::new(Kind::DebugFrame, bytes, bases));
        }
        (!tables.is_empty()).then_some(Tables { tables })
    }

    /// One step from the frame at `regs`, whose rule is that of `svma`.
    fn step(&self, svma: u64, regs: Regs32, stack: &StackView<'_>) -> Step {
        for t in &self.tables {
            let at = t.fdes.partition_point(|&(start, _, _)| start <= svma);
            let Some(&(_, end, offset)) = at.checked_sub(1).and_then(|i| t.fdes.get(i)) else {
                continue;
            };
            if svma < end {
                let rule = RULES.with(|rules| {
                    let mut rules = rules.borrow_mut();
                    if rules.len() >= MAX_RULES {
                        rules.clear();
                    }
                    *rules
                        .entry((t.id, svma))
                        .or_insert_with(|| t.rule(offset, svma))
                });
                return match rule {
                    Rule::Plain(plain) => plain.step(regs, stack),
                    Rule::Expression(then) => {
                        match t.cfa_by_expression(offset, svma, regs, stack) {
                            Some(cfa) => then.step(cfa, regs, stack),
                            None => Step::Fail,
                        }
                    }
                    Rule::Root => Step::Root,
                    Rule::Uncovered => Step::NoRule,
                    Rule::Unfollowed => Step::Fail,
                };
            }
        }
        Step::NoRule
    }
}

impl Table {
    /// Index the FDEs of `bytes`; `None` if it has none.
    fn new(kind: Kind, bytes: SectionBytes, bases: BaseAddresses) -> Option<Table> {
        let fdes = with_section!(kind, &bytes, |section| index(section, &bases));
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        (!fdes.is_empty()).then_some(Table {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            kind,
            bytes,
            bases,
            fdes,
        })
    }

    /// The rule of the FDE at `offset` for `svma`.
    fn rule(&self, offset: usize, svma: u64) -> Rule {
        with_section!(self.kind, &self.bytes, |section| {
            rule_of(section, &self.bases, offset, svma)
        })
    }

    /// The CFA of the frame at `regs`, where the row of the FDE at
    /// `offset` for `svma` gives it as an expression.
    fn cfa_by_expression(
        &self,
        offset: usize,
        svma: u64,
        regs: Regs32,
        stack: &StackView<'_>,
    ) -> Option<u64> {
        with_section!(self.kind, &self.bytes, |section| {
            cfa_by_expression(section, &self.bases, offset, svma, regs, stack)
        })
    }
}

fn eh_frame(bytes: &[u8]) -> EhFrame<Slice<'_>> {
    let mut s = EhFrame::new(bytes, LittleEndian);
    s.set_address_size(4);
    s
}

fn debug_frame(bytes: &[u8]) -> DebugFrame<Slice<'_>> {
    let mut s = DebugFrame::new(bytes, LittleEndian);
    s.set_address_size(4);
    s
}

/// The FDEs of `section` that parse: (start, end, offset), sorted.
fn index<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
) -> Vec<(u64, u64, usize)> {
    let mut fdes = Vec::new();
    let mut entries = section.entries(bases);
    // A corrupt entry ends the walk over the section: the FDEs before it
    // are kept.
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        if fde.len() > 0 {
            fdes.push((start, start.saturating_add(fde.len()), fde.offset()));
        }
    }
    fdes.sort_unstable();
    fdes
}

thread_local! {
    /// The CFI evaluation state, kept for the worker's next lookups.
    static CONTEXT: RefCell<UnwindContext<usize>> = RefCell::new(UnwindContext::new());
    /// The rules found, by table and SVMA: evaluating a row from its FDE's
    /// start took a third of an analysis's time.
    static RULES: RefCell<FxHashMap<(u64, u64), Rule>> = RefCell::new(FxHashMap::default());
}

/// Rules a worker keeps at most (about 40 bytes each); then it starts
/// over.
const MAX_RULES: usize = 1 << 16;

/// What a table's row for one address says, as the walk follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// A register plus an offset for the CFA.
    Plain(PlainRule),
    /// The CFA is a DWARF expression, evaluated at each step; then the
    /// return address and `ebp` as the rule says.
    Expression(CallerRule),
    /// The return address is undefined: the outermost frame.
    Root,
    /// No row for the address.
    Uncovered,
    /// A rule the walk does not follow (a register it does not know).
    Unfollowed,
}

/// CFA = `esp` (or `ebp`) + `cfa_offset`, then `then`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlainRule {
    cfa_from_bp: bool,
    cfa_offset: i64,
    then: CallerRule,
}

/// The return address at CFA + `ra`; the caller's `ebp` by `bp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CallerRule {
    ra: i64,
    bp: BpRule,
}

/// Where the caller's `ebp` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BpRule {
    Same,
    At(i64),
    Value(i64),
    Unknown,
}

impl PlainRule {
    fn step(&self, regs: Regs32, stack: &StackView<'_>) -> Step {
        let base = if self.cfa_from_bp { regs.bp } else { regs.sp };
        if base == UNKNOWN_BP {
            return Step::Fail;
        }
        self.then.step(
            base.wrapping_add(self.cfa_offset as u64) & MASK,
            regs,
            stack,
        )
    }
}

impl CallerRule {
    /// The caller of the frame at `regs` whose CFA is `cfa`.
    fn step(&self, cfa: u64, regs: Regs32, stack: &StackView<'_>) -> Step {
        let at = |offset: i64| cfa.wrapping_add(offset as u64) & MASK;
        let bp = match self.bp {
            BpRule::Same => Some(regs.bp),
            BpRule::At(o) => read32(stack, at(o)),
            BpRule::Value(o) => Some(at(o)),
            // Not followed: the frame pointer is unknown from here on.
            BpRule::Unknown => Some(UNKNOWN_BP),
        };
        match (read32(stack, at(self.ra)), bp) {
            (Some(ip), Some(bp)) => Step::Caller(Regs32 { ip, sp: cfa, bp }),
            _ => Step::Fail,
        }
    }
}

/// The rule of the FDE at `offset` for `svma`.
fn rule_of<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    svma: u64,
) -> Rule {
    let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
    else {
        return Rule::Unfollowed;
    };
    CONTEXT.with(|ctx| {
        let mut ctx = ctx.borrow_mut();
        let Ok(row) = fde.unwind_info_for_address(section, bases, &mut ctx, svma) else {
            return Rule::Uncovered;
        };
        let ra = match row.register(X86::RA) {
            Some(RegisterRule::Offset(o)) => o,
            Some(RegisterRule::Undefined) => return Rule::Root,
            _ => return Rule::Unfollowed,
        };
        let bp = match row.register(X86::EBP) {
            None | Some(RegisterRule::SameValue) => BpRule::Same,
            Some(RegisterRule::Offset(o)) => BpRule::At(o),
            Some(RegisterRule::ValOffset(o)) => BpRule::Value(o),
            Some(_) => BpRule::Unknown,
        };
        let then = CallerRule { ra, bp };
        let (cfa_from_bp, cfa_offset) = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => match *register {
                X86::ESP => (false, *offset),
                X86::EBP => (true, *offset),
                _ => return Rule::Unfollowed,
            },
            CfaRule::Expression(_) => return Rule::Expression(then),
        };
        Rule::Plain(PlainRule {
            cfa_from_bp,
            cfa_offset,
            then,
        })
    })
}

/// The CFA of the frame at `regs` by the expression of the row of the FDE
/// at `offset` for `svma`.
fn cfa_by_expression<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    svma: u64,
    regs: Regs32,
    stack: &StackView<'_>,
) -> Option<u64> {
    let fde = section
        .fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        .ok()?;
    CONTEXT.with(|ctx| {
        let mut ctx = ctx.borrow_mut();
        let row = fde
            .unwind_info_for_address(section, bases, &mut ctx, svma)
            .ok()?;
        match row.cfa() {
            CfaRule::Expression(e) => {
                evaluate(e.get(section).ok()?, fde.cie().encoding(), regs, stack)
            }
            CfaRule::RegisterAndOffset { .. } => None,
        }
    })
}

/// The value of a register the walk follows.
fn register_value(r: Register, regs: Regs32) -> Option<u64> {
    match r {
        X86::ESP => Some(regs.sp),
        X86::EBP => Some(regs.bp).filter(|&bp| bp != UNKNOWN_BP),
        X86::RA => Some(regs.ip),
        _ => None,
    }
}

/// Evaluate the CFA expression `e` (such as the PLT's, which depends on
/// where in its entry the instruction pointer is).
fn evaluate(
    e: gimli::Expression<Slice<'_>>,
    encoding: gimli::Encoding,
    regs: Regs32,
    stack: &StackView<'_>,
) -> Option<u64> {
    let mut eval = e.evaluation(encoding);
    eval.set_max_iterations(MAX_OPERATIONS);
    let mut result = eval.evaluate().ok()?;
    for _ in 0..MAX_EVALUATION_STEPS {
        result = match result {
            EvaluationResult::Complete => {
                return match eval.as_result() {
                    [piece] => match piece.location {
                        Location::Address { address } => Some(address & MASK),
                        _ => None,
                    },
                    _ => None,
                };
            }
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = register_value(register, regs)?;
                eval.resume_with_register(Value::Generic(v)).ok()?
            }
            EvaluationResult::RequiresMemory {
                address, size: 4, ..
            } => {
                let v = read32(stack, address & MASK)?;
                eval.resume_with_memory(Value::Generic(v)).ok()?
            }
            _ => return None,
        };
    }
    None
}

/// The 32-bit word at `addr` of the stack copy.
fn read32(stack: &StackView<'_>, addr: u64) -> Option<u64> {
    let mut word = [0u8; 4];
    stack
        .read(addr, &mut word)
        .then(|| u64::from(u32::from_le_bytes(word)))
}

/// One step by the frame pointer: the caller's frame pointer and return
/// address saved just above it.
fn frame_pointer_step(regs: Regs32, stack: &StackView<'_>) -> Step {
    if regs.bp == UNKNOWN_BP {
        return Step::Fail;
    }
    if regs.bp == 0 {
        // The outermost frame of a frame-pointer chain (`_start` clears it).
        return Step::Root;
    }
    if regs.bp < regs.sp || !regs.bp.is_multiple_of(4) {
        return Step::Fail;
    }
    match (
        read32(stack, regs.bp),
        read32(stack, regs.bp.wrapping_add(4)),
    ) {
        (Some(bp), Some(ip)) => Step::Caller(Regs32 {
            ip,
            sp: regs.bp.wrapping_add(8) & MASK,
            bp,
        }),
        _ => Step::Fail,
    }
}

/// An executable mapping of an image with unwind tables.
struct Module {
    start: u64,
    end: u64,
    bias: u64,
    tables: Arc<Tables>,
}

/// The unwind tables of images, built once per image for every process
/// mapping it.
#[derive(Default)]
pub(crate) struct TablesCache(Mutex<HashMap<u32, Option<Arc<Tables>>>>);

/// An unwinder for the 32-bit samples of one process generation.
pub(crate) struct Unwinder {
    /// Sorted by start.
    modules: Vec<Module>,
    /// The executable mappings, sorted: where return addresses may point.
    code: Vec<(u64, u64)>,
}

impl Unwinder {
    /// An unwinder knowing the executable mappings of one generation.
    pub fn build(mappings: &[Mapping], images: &[LoadedImage], cache: &TablesCache) -> Unwinder {
        let mut modules: Vec<Module> = mappings
            .iter()
            .filter(|m| m.executable)
            .filter_map(|m| {
                let data = images.get(m.image as usize)?.data.as_ref()?;
                let tables = cache
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(m.image)
                    .or_insert_with(|| Tables::of(data).map(Arc::new))
                    .clone()?;
                Some(Module {
                    start: m.start,
                    end: m.end,
                    bias: data.bias(m),
                    tables,
                })
            })
            .collect();
        modules.sort_unstable_by_key(|m| m.start);
        let mut code: Vec<(u64, u64)> = mappings
            .iter()
            .filter(|m| m.executable)
            .map(|m| (m.start, m.end))
            .collect();
        code.sort_unstable();
        Unwinder { modules, code }
    }

    /// Unwind a 32-bit sample from its registers and stack copy, then on
    /// with the kernel's callchain (its frame-pointer walk of the 32-bit
    /// stack) where the walk stops before the root.
    pub fn unwind(&self, regs: &Regs, stack: &StackView<'_>, callchain: &[u64]) -> Unwound {
        let Regs::X86_64(r) = regs else {
            return Unwound::ip_then_callchain(regs.ip(), callchain);
        };
        let mut regs = Regs32 {
            ip: r.ip & MASK,
            sp: r.sp & MASK,
            bp: r.bp & MASK,
        };
        let mut frames = vec![regs.ip];
        let clean = loop {
            if frames.len() >= MAX_FRAMES {
                break false;
            }
            // Return addresses are looked up inside their call.
            let lookup = match frames.len() {
                1 => regs.ip,
                _ => regs.ip.wrapping_sub(1),
            };
            let step = match self.module(lookup) {
                Some(m) => m.tables.step(lookup.wrapping_sub(m.bias), regs, stack),
                None => Step::NoRule,
            };
            let step = match step {
                Step::NoRule => frame_pointer_step(regs, stack),
                // (A return address of 0 is the end of the stack.)
                Step::Caller(caller)
                    if frames.len() == 1 && caller.ip != 0 && !self.is_code(caller.ip) =>
                {
                    self.missed_push(caller, stack)
                }
                step => step,
            };
            match step {
                Step::Caller(caller) if caller.ip == 0 => break true,
                // No code is mapped in the first page: a rule that reads a
                // "return address" there is wrong for this address (as the
                // CFI of 32-bit glibc's `memcpy` is after its `push`).
                Step::Caller(caller) if caller.ip < LOWEST_CODE => break false,
                // Each frame's stack pointer is above its callee's.
                Step::Caller(caller) if caller.sp > regs.sp => {
                    frames.push(caller.ip);
                    regs = caller;
                }
                Step::Root => break true,
                Step::Caller(_) | Step::Fail | Step::NoRule => break false,
            }
        };
        let used_kernel_chain = !clean && continue_with_callchain(&mut frames, callchain);
        Unwound {
            frames,
            clean,
            used_kernel_chain,
        }
    }

    /// Where the rule of the sampled instruction gave `caller`, whose
    /// return address is in no code: the rule may miss a push (32-bit
    /// glibc's `memcpy` pushes a register that its CFI does not mention),
    /// so the return address is looked for one or two words further up.
    /// `caller` as it is if neither word is in code.
    fn missed_push(&self, caller: Regs32, stack: &StackView<'_>) -> Step {
        for words in 1..=MAX_MISSED_PUSHES {
            let at = caller.sp.wrapping_add(4 * words) & MASK;
            if let Some(ip) = read32(stack, at.wrapping_sub(4)).filter(|&ip| self.is_code(ip)) {
                return Step::Caller(Regs32 {
                    ip,
                    sp: at,
                    ..caller
                });
            }
        }
        Step::Caller(caller)
    }

    /// Whether `avma` is in an executable mapping.
    fn is_code(&self, avma: u64) -> bool {
        let at = self.code.partition_point(|&(start, _)| start <= avma);
        at.checked_sub(1).is_some_and(|i| avma < self.code[i].1)
    }

    fn module(&self, avma: u64) -> Option<&Module> {
        let at = self.modules.partition_point(|m| m.start <= avma);
        let m = self.modules.get(at.checked_sub(1)?)?;
        (avma < m.end).then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{RegsX86_64, StackSnapshot};

    /// A stack copy at 0x8000 holding `words` (32-bit).
    fn stack(words: &[u32]) -> StackSnapshot {
        StackSnapshot {
            start: 0x8000,
            bytes: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        }
    }

    fn unwind(words: &[u32], bp: u64) -> Unwound {
        let u = Unwinder {
            modules: Vec::new(),
            code: vec![(0x1000, 0x2000)],
        };
        let s = stack(words);
        let regs = Regs::X86_64(RegsX86_64 {
            ip: 0x1050,
            sp: 0x8000,
            bp,
        });
        u.unwind(&regs, &StackView::of_snapshot(&s), &[])
    }

    /// An `.eh_frame` at SVMA 0x2000 with one FDE, for 0x1000..0x1040,
    /// whose CFA is the DWARF expression `expr`.
    #[rustfmt::skip]
    fn eh_frame_with_cfa(expr: &[u8]) -> Vec<u8> {
        let mut b = vec![
            20, 0, 0, 0, 0, 0, 0, 0,        // CIE: length, id
            1, b'z', b'R', 0, 1, 0x7c, 8,   // version, "zR", code and data alignment, RA column
            1, 0x1b,                        // augmentation: FDE pointers pcrel sdata4
            0x0c, 4, 4,                     // DW_CFA_def_cfa: esp + 4
            0x88, 1,                        // DW_CFA_offset: eip at cfa - 4
            0, 0,                           // padding
        ];
        // pc_begin (relative to its own SVMA, 0x2020), pc_range, no
        // augmentation data, DW_CFA_def_cfa_expression.
        let mut fde: Vec<u8> = Vec::new();
        fde.extend((0x1000i32 - 0x2020).to_le_bytes());
        fde.extend(0x40i32.to_le_bytes());
        fde.extend([0, 0x0f, expr.len() as u8]);
        fde.extend(expr);
        while !fde.len().is_multiple_of(4) {
            fde.push(0); // DW_CFA_nop
        }
        b.extend(((fde.len() + 4) as u32).to_le_bytes()); // length
        b.extend(28u32.to_le_bytes()); // CIE pointer
        b.extend(fde);
        b.extend([0, 0, 0, 0]); // end
        b
    }

    /// The expression of a PLT entry's CFA: `esp + 4`, plus 4 from the
    /// entry's 11th byte on, after its push.
    #[rustfmt::skip]
    const PLT_CFA: [u8; 11] = [
        0x74, 4, 0x78, 0,                   // esp + 4, eip
        0x3f, 0x1a, 0x3b, 0x2a,             // (eip & 15) >= 11
        0x32, 0x24, 0x22,                   // << 2, +
    ];

    fn tables_of(eh_frame: Vec<u8>) -> Tables {
        let bases = BaseAddresses::default().set_eh_frame(0x2000);
        let bytes = SectionBytes::whole(Arc::new(eh_frame));
        Tables {
            tables: vec![Table::new(Kind::EhFrame, bytes, bases).expect("one FDE")],
        }
    }

    #[test]
    fn cfa_expressions_are_evaluated() {
        let tables = tables_of(eh_frame_with_cfa(&PLT_CFA));
        assert_eq!(tables.tables[0].fdes, [(0x1000, 0x1040, 24)]);
        let s = stack(&[0x1500, 0x1600, 0x1700]);
        let view = StackView::of_snapshot(&s);
        // Twice, from another stack pointer: computed, then from the
        // worker's rules, which must not keep the CFA.
        for (k, sp) in [0x8000u64, 0x8004].into_iter().enumerate() {
            let at = |ip| Regs32 { ip, sp, bp: 0x77 };
            // Before the entry's push the return address is at esp...
            assert_eq!(
                tables.step(0x1004, at(0x1004), &view),
                Step::Caller(Regs32 {
                    ip: [0x1500, 0x1600][k],
                    sp: sp + 4,
                    bp: 0x77
                })
            );
            // ...after it, one word up.
            assert_eq!(
                tables.step(0x103b, at(0x103b), &view),
                Step::Caller(Regs32 {
                    ip: [0x1600, 0x1700][k],
                    sp: sp + 8,
                    bp: 0x77
                })
            );
            assert_eq!(tables.step(0x1040, at(0x1040), &view), Step::NoRule);
        }
    }

    #[test]
    fn an_expression_that_loops_fails_the_step() {
        // DW_OP_skip -3: back to itself, forever.
        let tables = tables_of(eh_frame_with_cfa(&[0x2f, 0xfd, 0xff]));
        let s = stack(&[0x1500]);
        let regs = Regs32 {
            ip: 0x1004,
            sp: 0x8000,
            bp: 0,
        };
        assert_eq!(
            tables.step(0x1004, regs, &StackView::of_snapshot(&s)),
            Step::Fail
        );
    }

    #[test]
    fn a_leaf_rule_that_misses_a_push_is_corrected() {
        let tables = tables_of(eh_frame_with_cfa(&PLT_CFA));
        let u = Unwinder {
            modules: vec![Module {
                start: 0x1000,
                end: 0x2000,
                bias: 0,
                tables: Arc::new(tables),
            }],
            code: vec![(0x1000, 0x2000)],
        };
        // At 0x1004 the rule says the return address is at esp, where the
        // code pushed something else (5); the next word is the address.
        let s = stack(&[5, 0x1500]);
        let regs = Regs::X86_64(RegsX86_64 {
            ip: 0x1004,
            sp: 0x8000,
            bp: 0,
        });
        let got = u.unwind(&regs, &StackView::of_snapshot(&s), &[]);
        assert_eq!(got.frames, [0x1004, 0x1500]);
        assert!(got.clean);
    }

    #[test]
    fn frame_pointers_are_followed_to_a_zero_frame_pointer() {
        // 0x8008: saved bp 0x8010, return 0x1100; 0x8010: bp 0, return 0x1200.
        let u = unwind(&[0, 0, 0x8010, 0x1100, 0, 0x1200], 0x8008);
        assert_eq!(u.frames, [0x1050, 0x1100, 0x1200]);
        assert!(u.clean);
    }

    #[test]
    fn walks_stop_at_return_addresses_in_the_first_page_or_off_the_copy() {
        // A "return address" of 5: not code; the walk stops there.
        let u = unwind(&[0, 0, 0x8010, 0x5, 0, 0x1200], 0x8008);
        assert_eq!((u.frames.as_slice(), u.clean), (&[0x1050][..], false));
        // A frame pointer below the stack pointer, then one past the copy.
        assert!(!unwind(&[0, 0], 0x7ff0).clean);
        let u = unwind(&[0, 0, 0x9000, 0x1100], 0x8008);
        assert_eq!(
            (u.frames.as_slice(), u.clean),
            (&[0x1050, 0x1100][..], false)
        );
    }

    #[test]
    fn registers_of_another_arch_keep_the_instruction_pointer_and_callchain() {
        let u = Unwinder {
            modules: Vec::new(),
            code: Vec::new(),
        };
        let regs = Regs::Aarch64(lrnprof_format::RegsAarch64 {
            pc: 0x1000,
            ..Default::default()
        });
        let s = stack(&[]);
        let got = u.unwind(&regs, &StackView::of_snapshot(&s), &[0x1000, 0x2000]);
        assert_eq!(got.frames, [0x1000, 0x2000]);
        assert!(!got.clean && got.used_kernel_chain);
    }
}
