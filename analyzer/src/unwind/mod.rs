//! Unwinding samples with framehop: one module per trace architecture, both
//! always compiled; the trace header picks one at run time.

mod aarch64;
mod block;
mod go;
mod hdr;
mod i386;
mod signal;
mod split;
mod x86_64;

pub(crate) use block::{unwind_block, BlockContext};

use crate::image::{LoadedImage, SectionBytes};
use crate::timeline::Mapping;
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module};
use lrnprof_format::{Arch, Regs, Sample, SampleFlags, StackView};
use signal::{ImageTrampolines, Trampolines};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most frames kept per sample: a guard against unwinding loops.
pub(crate) const MAX_FRAMES: usize = 4096;

/// The frames of one sample: AVMAs, the instruction pointer first, then
/// return addresses (not yet adjusted by -1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Unwound {
    pub frames: Vec<u64>,
    /// The unwinder reached the end of the stack cleanly (framehop detected
    /// the root, or a zero return address / frame pointer).
    pub clean: bool,
    /// Frames were appended from the kernel's frame-pointer callchain.
    pub used_kernel_chain: bool,
}

impl Unwound {
    /// The instruction pointer, then the kernel's callchain beyond it:
    /// where no unwinder can walk the stack.
    pub(crate) fn ip_then_callchain(ip: u64, callchain: &[u64]) -> Unwound {
        let mut frames = vec![ip];
        let used_kernel_chain = continue_with_callchain(&mut frames, callchain);
        Unwound {
            frames,
            clean: false,
            used_kernel_chain,
        }
    }
}

/// A framehop unwinder for one process generation, for the trace's arch,
/// and where its signal handlers return to.
#[derive(Clone)]
pub(crate) struct ArchUnwinder {
    unwinder: ArchKind,
    trampolines: Trampolines,
    /// For the 32-bit samples of an x86-64 trace's i386 process.
    i386: Option<Arc<i386::Unwinder>>,
    /// framehop's modules generations it took: one for the unwinder, one
    /// per module added (see [`MAX_GENERATIONS_SHARING_CACHE`]).
    pub generations: usize,
}

#[derive(Clone)]
enum ArchKind {
    X86_64(x86_64::Unwinder),
    Aarch64(aarch64::Unwinder),
}

/// Per-worker unwind cache.
pub(crate) enum ArchCache {
    X86_64(RuleCaches<x86_64::Cache>),
    Aarch64(RuleCaches<aarch64::Cache>),
}

/// framehop's rule caches used together as one larger cache.
///
/// A framehop cache keeps one unwind rule per slot, the slot being the
/// lookup address modulo 509 (framehop's `CACHE_ENTRY_COUNT`). An
/// interpreter's hot code reaches more addresses than that: on a python
/// workload about a quarter of the rule lookups missed, and each miss
/// searches `.eh_frame_hdr` and evaluates the function's CFI from its
/// start. Choosing one of [`RULE_CACHES`] caches by the address divided by
/// 509 makes them one direct-mapped cache of 509 × [`RULE_CACHES`] slots,
/// which two addresses share only when they are equal modulo that.
pub(crate) struct RuleCaches<C>(Box<[C]>);

/// framehop caches per worker (509 rules each).
const RULE_CACHES: usize = 16;

/// Slots of one framehop cache, for choosing the cache: should framehop
/// change it, the caches still work, only shared less evenly.
const FRAMEHOP_CACHE_SLOTS: u64 = 509;

impl<C> RuleCaches<C> {
    fn new(make: impl Fn() -> C) -> RuleCaches<C> {
        RuleCaches((0..RULE_CACHES).map(|_| make()).collect())
    }

    /// The cache for the rule of `address`.
    fn of(&mut self, address: FrameAddress) -> &mut C {
        let slot = address.address_for_lookup() / FRAMEHOP_CACHE_SLOTS;
        &mut self.0[(slot % RULE_CACHES as u64) as usize]
    }
}

impl ArchCache {
    pub fn new(arch: Arch) -> ArchCache {
        match arch {
            Arch::X86_64 => ArchCache::X86_64(RuleCaches::new(x86_64::Cache::new)),
            Arch::Aarch64 => ArchCache::Aarch64(RuleCaches::new(aarch64::Cache::new)),
        }
    }

    fn arch(&self) -> Arch {
        match self {
            ArchCache::X86_64(_) => Arch::X86_64,
            ArchCache::Aarch64(_) => Arch::Aarch64,
        }
    }

    /// The cache this worker kept from its last block (see
    /// [`keep`](Self::keep)), or a new one.
    pub fn kept(arch: Arch) -> ArchCache {
        KEPT_CACHE
            .with(|k| k.borrow_mut().take())
            .filter(|c| c.arch() == arch)
            .unwrap_or_else(|| ArchCache::new(arch))
    }

    /// Keep this cache for the worker's next block: the unwind rules found
    /// for the addresses of one block serve the next ones, where a new
    /// cache per block looked every rule up again. framehop tags each rule
    /// with its unwinder's modules generation, a process-wide counter that
    /// each new unwinder and each module added moves on, so one cache
    /// serves every unwinder of an analysis (callers keep none when an
    /// analysis moves the 16-bit counter so far that it could wrap).
    pub fn keep(self) {
        KEPT_CACHE.with(|k| *k.borrow_mut() = Some(self));
    }
}

/// framehop modules generations an analysis may take
/// ([`ArchUnwinder::generations`]) for workers to keep their caches
/// between blocks: below framehop's 16-bit counter. An image split into
/// many modules (see [`split`]) takes one per module in every unwinder
/// that maps it.
pub(crate) const MAX_GENERATIONS_SHARING_CACHE: usize = u16::MAX as usize;

thread_local! {
    static KEPT_CACHE: std::cell::RefCell<Option<ArchCache>> = const { std::cell::RefCell::new(None) };
}

/// (image, AVMA start, AVMA end, bias).
type ModuleKey = (u32, u64, u64, u64);

/// Builds framehop modules once per (image, mapping) and reuses them
/// across the generations of a process.
#[derive(Default)]
pub(crate) struct ModuleCache {
    modules: Mutex<HashMap<ModuleKey, Arc<[Module<SectionBytes>]>>>,
    /// What framehop reads of each image's tables ([`TablesUse`]), worked out once
    /// per image, whatever the number of processes mapping it.
    tables: Mutex<HashMap<u32, Arc<TablesUse>>>,
    /// Signal trampolines by image, searched for on first use.
    trampolines: Mutex<HashMap<u32, Arc<ImageTrampolines>>>,
    /// The unwind tables of i386 processes' images.
    i386_tables: i386::TablesCache,
}

/// What framehop reads of an image's unwind tables besides its sections
/// as they are: parts of `.debug_frame`, an `.eh_frame_hdr` made here.
#[derive(Default)]
struct TablesUse {
    /// Its bytes, inflated, where the image has no `.eh_frame`.
    bytes: Option<SectionBytes>,
    /// Where the image also has `.eh_frame`: the SVMA ranges only
    /// `.debug_frame` describes, each with a `.debug_frame` of the FDEs in
    /// it (see [`split`]).
    only: Vec<std::ops::Range<u64>>,
    cut: Vec<SectionBytes>,
    /// An `.eh_frame_hdr` made for an `.eh_frame` without one (see
    /// [`hdr`]), at `.eh_frame`'s address.
    made_hdr: Option<SectionBytes>,
}

impl TablesUse {
    fn of(data: &crate::image::ImageData) -> TablesUse {
        let made_hdr = made_eh_frame_hdr(data);
        TablesUse {
            made_hdr,
            ..TablesUse::debug_frame_of(data)
        }
    }

    fn debug_frame_of(data: &crate::image::ImageData) -> TablesUse {
        let Some(debug_frame) = data.section(".debug_frame").filter(|s| s.has_bytes()) else {
            return TablesUse::default();
        };
        let eh_frame = data.section(".eh_frame").filter(|s| !s.bytes.is_empty());
        if eh_frame.is_some() && data.is_macho {
            // framehop reads compact unwind info or `__eh_frame` there.
            return TablesUse::default();
        }
        // framehop reads `.debug_frame` only where there is no `.eh_frame`
        // (Go's linker writes none), and, split off, for the code
        // `.eh_frame` leaves to it. Unlike `.eh_frame` it is not loaded,
        // so a linker may compress it, as Go's does by default: inflate it,
        // or those frames would be found by frame pointer alone.
        let bytes = debug_frame.read();
        let Some(eh_frame) = eh_frame else {
            return TablesUse {
                bytes,
                ..TablesUse::default()
            };
        };
        let Some(debug_frame) = bytes else {
            return TablesUse::default();
        };
        let only = split::debug_frame_only(&split::Tables {
            eh_frame: &eh_frame.bytes,
            eh_frame_bases: data.eh_frame_bases(eh_frame.svma),
            debug_frame: &debug_frame,
        });
        if only.is_empty() {
            return TablesUse::default();
        }
        match split::cut_debug_frame(&debug_frame, &only) {
            Some(cut) => TablesUse {
                bytes: None,
                only,
                cut: cut
                    .into_iter()
                    .map(|c| SectionBytes::whole(Arc::new(c)))
                    .collect(),
                made_hdr: None,
            },
            None => TablesUse::default(),
        }
    }
}

/// An `.eh_frame_hdr` for an ELF image whose `.eh_frame` has none here
/// (one from a trace), so that framehop looks its FDEs up as in the file.
fn made_eh_frame_hdr(data: &crate::image::ImageData) -> Option<SectionBytes> {
    if data.is_macho
        || data
            .section(".eh_frame_hdr")
            .is_some_and(|s| !s.bytes.is_empty())
    {
        return None;
    }
    let eh_frame = data.section(".eh_frame").filter(|s| !s.bytes.is_empty())?;
    let bases = data.eh_frame_bases(eh_frame.svma);
    let made = hdr::eh_frame_hdr(&eh_frame.bytes, eh_frame.svma, &bases)?;
    Some(SectionBytes::whole(Arc::new(made)))
}

impl ModuleCache {
    /// The framehop modules of mapping `m` of `image`: one, or one per
    /// range of an image split between its `.eh_frame` and `.debug_frame`.
    fn modules(&self, m: &Mapping, image: &LoadedImage) -> Option<Arc<[Module<SectionBytes>]>> {
        let data = image.data.as_ref()?;
        if !data.has_unwind_data() {
            return None;
        }
        let bias = data.bias(m);
        let key = (m.image, m.start, m.end, bias);
        if let Some(modules) = self.lock_modules().get(&key) {
            return Some(modules.clone());
        }
        // Worked out outside the lock (it parses every FDE of the image),
        // so generations being built in parallel wait for none but their
        // own; two working out the same image keep the first.
        let lock_tables = || self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let known = lock_tables().get(&m.image).cloned();
        let tables = known.unwrap_or_else(|| {
            let tables = Arc::new(TablesUse::of(data));
            lock_tables().entry(m.image).or_insert(tables).clone()
        });
        let range = |name: &str| {
            data.section(name)
                .map(|s| s.svma..s.svma.saturating_add(s.size))
        };
        let bytes = |name: &str| {
            data.section(name)
                .filter(|s| !s.bytes.is_empty())
                .map(|s| s.bytes.clone())
        };
        // `Some(range)`: a module reading that range's `.debug_frame`.
        let info = |only: Option<usize>| {
            let reads_debug_frame = only.is_some();
            let eh = |name: &str| bytes(name).filter(|_| !reads_debug_frame);
            ExplicitModuleSectionInfo {
                base_svma: data.base_svma,
                text_svma: range(".text"),
                text: bytes(".text"),
                stubs_svma: range("__stubs"),
                stub_helper_svma: range("__stub_helper"),
                got_svma: range(".got"),
                unwind_info: bytes("__unwind_info"),
                eh_frame_svma: range(".eh_frame"),
                eh_frame: eh(".eh_frame"),
                eh_frame_hdr_svma: match &tables.made_hdr {
                    Some(made) => range(".eh_frame")
                        .map(|r| r.start..r.start.saturating_add(made.len() as u64)),
                    None => range(".eh_frame_hdr"),
                },
                eh_frame_hdr: match &tables.made_hdr {
                    Some(made) => Some(made.clone()).filter(|_| !reads_debug_frame),
                    None => eh(".eh_frame_hdr"),
                },
                debug_frame: match only {
                    Some(i) => tables.cut.get(i).cloned(),
                    None => tables.bytes.clone(),
                },
                text_segment_svma: range("__TEXT"),
                text_segment: bytes("__TEXT"),
            }
        };
        let base_avma = bias.wrapping_add(data.base_svma);
        // Section ranges may come from an untrusted trace: should framehop
        // panic on them, the image is unwound without its data.
        let modules: Arc<[Module<SectionBytes>]> =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                split::segments(m.start..m.end, &tables.only, bias)
                    .into_iter()
                    .map(|(avma, only)| {
                        let info = info(only);
                        Module::new(image.key.path.clone(), avma, base_avma, info)
                    })
                    .collect()
            }))
            .ok()?;
        self.lock_modules().insert(key, modules.clone());
        Some(modules)
    }

    fn lock_modules(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ModuleKey, Arc<[Module<SectionBytes>]>>> {
        self.modules.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ArchUnwinder {
    /// An unwinder knowing the executable mappings of one generation; with
    /// `abi32` (the process ran 32-bit code in an x86-64 trace), one for
    /// its i386 samples too.
    pub fn build(
        arch: Arch,
        mappings: &[Mapping],
        images: &[LoadedImage],
        cache: &ModuleCache,
        abi32: bool,
    ) -> ArchUnwinder {
        let mut generations = 1;
        let modules = mappings
            .iter()
            .filter(|m| m.executable)
            .filter_map(|m| cache.modules(m, &images[m.image as usize]))
            .flat_map(|modules| modules.to_vec())
            .inspect(|_| generations += 1);
        let unwinder = match arch {
            Arch::X86_64 => ArchKind::X86_64(x86_64::build(modules)),
            Arch::Aarch64 => ArchKind::Aarch64(aarch64::build(modules)),
        };
        let trampolines = Trampolines::new(mappings, images, |i| {
            let mut map = cache.trampolines.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(i)
                .or_insert_with(|| Arc::new(ImageTrampolines::of(&images[i as usize])))
                .clone()
        });
        let i386 = (abi32 && arch == Arch::X86_64)
            .then(|| Arc::new(i386::Unwinder::build(mappings, images, &cache.i386_tables)));
        ArchUnwinder {
            unwinder,
            trampolines,
            i386,
            generations,
        }
    }

    /// Unwind a sample flagged [`SampleFlags::ABI_32`] (over `stack`, its
    /// stack copy): an i386 sample by its own walk, another (AArch32) to
    /// its instruction pointer and the kernel's callchain.
    pub fn unwind_32(&self, sample: &Sample, stack: &StackView<'_>) -> Unwound {
        match &self.i386 {
            Some(u) => u.unwind(&sample.regs, stack, &sample.kernel_callchain),
            None => Unwound::ip_then_callchain(sample.regs.ip(), &sample.kernel_callchain),
        }
    }

    /// Unwind `sample` from its registers and stack copy; continue with the
    /// kernel callchain where the copy ends.
    pub fn unwind(&self, cache: &mut ArchCache, sample: &Sample, little_endian: bool) -> Unwound {
        let stack = StackView::of_snapshot(&sample.stack);
        if sample.flags.contains(SampleFlags::ABI_32) {
            return self.unwind_32(sample, &stack);
        }
        let t = &self.trampolines;
        let mut u = match (&self.unwinder, cache) {
            (ArchKind::X86_64(un), ArchCache::X86_64(c)) => {
                walk_whole::<X86_64Arch>(un, t, c, &sample.regs, &stack, little_endian)
            }
            (ArchKind::Aarch64(un), ArchCache::Aarch64(c)) => {
                walk_whole::<Aarch64Arch>(un, t, c, &sample.regs, &stack, little_endian)
            }
            _ => None,
        }
        // Registers of another arch than the header says: keep the ip.
        .unwrap_or_else(|| Unwound {
            frames: vec![sample.regs.ip()],
            clean: false,
            used_kernel_chain: false,
        });
        if !u.clean {
            u.used_kernel_chain = continue_with_callchain(&mut u.frames, &sample.kernel_callchain);
        }
        u
    }
}

/// Walk a whole stack (no earlier sample to reuse) into frames.
fn walk_whole<A: UnwindArch>(
    unwinder: &A::Unwinder,
    trampolines: &Trampolines,
    cache: &mut RuleCaches<A::Cache>,
    regs: &Regs,
    stack: &StackView<'_>,
    little_endian: bool,
) -> Option<Unwound> {
    let (pc, regs) = A::start(unwinder, regs)?;
    let mut arena = Vec::new();
    let walked = walk::<A>(
        unwinder,
        trampolines,
        cache,
        pc,
        regs,
        stack,
        little_endian,
        None,
        &mut arena,
    );
    let mut frames = Vec::with_capacity(walked.len as usize);
    frames.extend(chain(&arena, walked.leaf).map(|n| n.address.address()));
    Some(Unwound {
        frames,
        clean: walked.clean,
        used_kernel_chain: false,
    })
}

/// What the unwinder of a trace architecture is made of, so that one
/// incremental walk serves both.
pub(crate) trait UnwindArch {
    type Regs: Copy + PartialEq + 'static;
    /// What of [`Self::Regs`] the unwind rules of this arch read: two
    /// frames at the same address whose states are equal unwind the same
    /// way over the same bytes. Kept per walked frame, so small.
    type State: Copy + PartialEq + 'static;
    type Cache;
    type Unwinder: framehop::Unwinder<UnwindRegs = Self::Regs, Cache = Self::Cache>;
    /// The unwinder of this arch in `u`, if it is of this arch.
    fn unwinder(u: &ArchUnwinder) -> Option<&Self::Unwinder>;
    /// The cache of this arch in `c`, if it is of this arch.
    fn cache(c: &mut ArchCache) -> Option<&mut RuleCaches<Self::Cache>>;
    /// The instruction pointer and unwind registers of a sample's
    /// registers, if they are of this arch.
    fn start(u: &Self::Unwinder, regs: &Regs) -> Option<(u64, Self::Regs)>;
    /// The state of `regs` that later unwinding depends on.
    fn state(regs: &Self::Regs) -> Self::State;
    /// The stack pointer of a state.
    fn sp(state: &Self::State) -> u64;
    /// The interrupted instruction pointer and registers a signal frame
    /// saved, read through `read`, where `regs` are those a handler
    /// returned to its trampoline with. `None` where not known.
    fn signal_return(
        regs: &Self::Regs,
        read: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<(u64, Self::Regs)>;
    /// This worker thread's spare walk arenas of this arch.
    fn spare_arenas() -> &'static std::thread::LocalKey<SpareArenas<Self::State>>;
}

/// Walk arenas a worker keeps between blocks: a block's unwinder starts
/// every thread's arena empty, and growing one to its working size (a few
/// thousand frames) again for every block cost 3-4% of the analysis in
/// reallocation alone.
pub(crate) struct SpareArenas<R>(std::cell::RefCell<Vec<Vec<Node<R>>>>);

/// Arenas kept per worker at most, and the largest kept (in frames).
const SPARE_ARENAS: usize = 32;
const SPARE_ARENA_FRAMES: usize = 16 * 1024;

impl<R> SpareArenas<R> {
    pub(crate) const fn new() -> SpareArenas<R> {
        SpareArenas(std::cell::RefCell::new(Vec::new()))
    }

    /// An empty arena, with the capacity of an earlier one if there is one.
    pub(crate) fn take(&self) -> Vec<Node<R>> {
        self.0.borrow_mut().pop().unwrap_or_default()
    }

    /// Keep `arena` for a later block, unless enough are kept or it is
    /// unusually large.
    pub(crate) fn give(&self, mut arena: Vec<Node<R>>) {
        let mut spare = self.0.borrow_mut();
        if spare.len() < SPARE_ARENAS && arena.capacity() <= SPARE_ARENA_FRAMES {
            arena.clear();
            spare.push(arena);
        }
    }
}

thread_local! {
    static X86_64_ARENAS: SpareArenas<SpBp> = const { SpareArenas::new() };
    static AARCH64_ARENAS: SpareArenas<framehop::aarch64::UnwindRegsAarch64> =
        const { SpareArenas::new() };
}

pub(crate) struct X86_64Arch;
pub(crate) struct Aarch64Arch;

/// The x86-64 state a walked frame keeps. framehop's x86-64 rules read
/// only the stack and frame pointers (and the instruction pointer, which
/// is the frame's address): the other registers it carries (restored by
/// Mach-O compact unwind's register pops) change no later step, so two
/// frames that agree on these unwind alike. 16 bytes against the
/// registers' 136: a walked frame takes 56 bytes instead of 176, and each
/// worker's walk arenas a third of the memory (page faults on a
/// deep-stack trace 1,275 to 1,016 with one job).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpBp {
    sp: u64,
    bp: u64,
}

impl UnwindArch for X86_64Arch {
    type Regs = framehop::x86_64::UnwindRegsX86_64;
    type State = SpBp;
    type Cache = x86_64::Cache;
    type Unwinder = x86_64::Unwinder;
    fn unwinder(u: &ArchUnwinder) -> Option<&Self::Unwinder> {
        match &u.unwinder {
            ArchKind::X86_64(u) => Some(u),
            ArchKind::Aarch64(_) => None,
        }
    }
    fn cache(c: &mut ArchCache) -> Option<&mut RuleCaches<Self::Cache>> {
        match c {
            ArchCache::X86_64(c) => Some(c),
            ArchCache::Aarch64(_) => None,
        }
    }
    fn start(_: &Self::Unwinder, regs: &Regs) -> Option<(u64, Self::Regs)> {
        match regs {
            Regs::X86_64(r) => Some(x86_64::start(r)),
            Regs::Aarch64(_) => None,
        }
    }
    fn state(regs: &Self::Regs) -> Self::State {
        SpBp {
            sp: regs.sp(),
            bp: regs.bp(),
        }
    }
    fn sp(state: &Self::State) -> u64 {
        state.sp
    }
    fn signal_return(
        regs: &Self::Regs,
        read: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<(u64, Self::Regs)> {
        let uc = regs.sp();
        let [bp, sp, ip] = signal::X86_64_UCONTEXT_BP_SP_IP.map(|at| read(uc.wrapping_add(at)));
        let (bp, sp, ip) = (bp.ok()?, sp.ok()?, ip.ok()?);
        Some((ip, framehop::x86_64::UnwindRegsX86_64::new(ip, sp, bp)))
    }
    fn spare_arenas() -> &'static std::thread::LocalKey<SpareArenas<Self::State>> {
        &X86_64_ARENAS
    }
}

impl UnwindArch for Aarch64Arch {
    type Regs = framehop::aarch64::UnwindRegsAarch64;
    /// All of it: the link register, stack and frame pointers (and the
    /// pointer-authentication mask), each read by some rule.
    type State = framehop::aarch64::UnwindRegsAarch64;
    type Cache = aarch64::Cache;
    type Unwinder = aarch64::Unwinder;
    fn unwinder(u: &ArchUnwinder) -> Option<&Self::Unwinder> {
        match &u.unwinder {
            ArchKind::Aarch64(u) => Some(u),
            ArchKind::X86_64(_) => None,
        }
    }
    fn cache(c: &mut ArchCache) -> Option<&mut RuleCaches<Self::Cache>> {
        match c {
            ArchCache::Aarch64(c) => Some(c),
            ArchCache::X86_64(_) => None,
        }
    }
    fn start(u: &Self::Unwinder, regs: &Regs) -> Option<(u64, Self::Regs)> {
        match regs {
            Regs::Aarch64(r) => Some(aarch64::start(u, r)),
            Regs::X86_64(_) => None,
        }
    }
    fn state(regs: &Self::Regs) -> Self::State {
        *regs
    }
    fn sp(state: &Self::State) -> u64 {
        state.sp()
    }
    /// The vDSO's `__kernel_rt_sigreturn`: the kernel's `rt_sigframe` is at
    /// the stack pointer the handler returned with, and its
    /// `uc_mcontext` holds the interrupted `x29`, `x30`, `sp` and `pc`.
    /// (The trampoline's own CFI goes through the frame record the kernel
    /// put above the sigframe, to the interrupted function's caller: it
    /// skips the interrupted function, and a leaf's return address, still
    /// in `x30`, with it.)
    fn signal_return(
        regs: &Self::Regs,
        read: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<(u64, Self::Regs)> {
        let frame = regs.sp();
        let [fp, lr, sp, pc] =
            signal::AARCH64_SIGFRAME_FP_LR_SP_PC.map(|at| read(frame.wrapping_add(at)));
        let (fp, lr, sp, pc) = (fp.ok()?, lr.ok()?, sp.ok()?, pc.ok()?);
        Some((
            pc,
            framehop::aarch64::UnwindRegsAarch64::new_with_ptr_auth_mask(
                regs.lr_mask(),
                lr,
                sp,
                fp,
            ),
        ))
    }
    fn spare_arenas() -> &'static std::thread::LocalKey<SpareArenas<Self::State>> {
        &AARCH64_ARENAS
    }
}

/// No node: the end of a chain.
pub(crate) const NONE: u32 = u32::MAX;

/// How far past the end of a stack copy a failed read still counts as the
/// walk running off its end (one large frame).
const PAST_END_REACH: u64 = 64 * 1024;

/// One frame of a walk: where it is, the state of the registers the
/// unwinder had there ([`UnwindArch::State`]), and the stack bytes that
/// unwinding from it to the end of the walk read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<S> {
    pub address: FrameAddress,
    pub state: S,
    /// Lowest AVMA read from this frame on.
    pub lo: u64,
    /// One past the highest AVMA read from this frame on.
    pub hi: u64,
    /// The caller's node, or [`NONE`] for the last frame.
    pub parent: u32,
}

/// The frames of an earlier sample of the same thread and process image
/// map, and which of its stack bytes the new sample still has.
pub(crate) struct Reuse {
    /// Its innermost node.
    pub leaf: u32,
    /// Its number of frames.
    pub len: u32,
    /// Its walk ended cleanly.
    pub clean: bool,
    /// Bytes from this AVMA to `end` are the earlier sample's.
    pub unchanged_from: u64,
    /// End of the new sample's stack copy.
    pub end: u64,
    /// End of the earlier sample's stack copy.
    pub base_end: u64,
    /// The earlier sample's walk stopped at a read past its copy's end.
    pub past_end: bool,
}

/// How a walk went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walked {
    /// Innermost node of the sample's frames.
    pub leaf: u32,
    /// Frames (at most [`MAX_FRAMES`]).
    pub len: u32,
    pub clean: bool,
    /// Stopped at [`MAX_FRAMES`] with more to go.
    pub truncated: bool,
    /// When the outer frames are an earlier sample's: how many frames of
    /// that sample were not reused (its node at that depth is where the
    /// new frames join it), and how many new frames there are.
    pub joined: Option<(u32, u32)>,
    /// It stopped because a read at or past the end of the stack copy
    /// failed: the stack is deeper than the copy.
    pub past_end: bool,
}

/// The nodes of a chain, innermost first.
pub(crate) fn chain<R: Copy>(arena: &[Node<R>], leaf: u32) -> impl Iterator<Item = &Node<R>> {
    let mut at = leaf;
    std::iter::from_fn(move || {
        let n = arena.get(at as usize)?;
        at = n.parent;
        Some(n)
    })
}

/// Unwind from `pc` and `regs` over `stack`, appending the new frames to
/// `arena`. With `reuse`, stop as soon as a frame is one of the earlier
/// sample's in the same state (address and registers) and every stack
/// byte that unwinding it read is unchanged: from there on the walk would
/// repeat the earlier one, so the earlier frames are joined instead.
/// Frames, `clean` and the [`MAX_FRAMES`] bound come out as a full walk's
/// would.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk<A: UnwindArch>(
    unwinder: &A::Unwinder,
    trampolines: &Trampolines,
    cache: &mut RuleCaches<A::Cache>,
    pc: u64,
    mut regs: A::Regs,
    stack: &StackView<'_>,
    little_endian: bool,
    reuse: Option<&Reuse>,
    arena: &mut Vec<Node<A::State>>,
) -> Walked {
    use framehop::Unwinder as _;
    // New frames go straight to the arena, each the parent of the one
    // before; the last one's parent is set when the walk ends.
    let first = arena.len();
    let mut address = FrameAddress::InstructionPointer(pc);
    // The earlier sample's frame not below the current one, and its depth.
    let mut other = reuse.map_or(NONE, |r| r.leaf);
    let mut other_depth = 0u32;
    let mut joined = None;
    let mut hit_bound = false;
    let mut past_end = false;
    let end = stack.end();
    // Looked up once per walk, not per frame.
    let traps = trampolines.ranges();
    let go_switches = trampolines.go_switches();
    let mut words = stack.reader(little_endian);
    let clean = loop {
        // The frame's state, to compare with the earlier walk's and to
        // keep in its node.
        let state = A::state(&regs);
        if let Some(r) = reuse {
            let sp = A::sp(&state);
            while let Some(n) = arena.get(other as usize) {
                if A::sp(&n.state) >= sp {
                    break;
                }
                other = n.parent;
                other_depth += 1;
            }
            let (mut at, mut depth) = (other, other_depth);
            while let Some(n) = arena.get(at as usize) {
                if A::sp(&n.state) != sp {
                    break;
                }
                // Reads at or past the end fail: if both copies end at the
                // same address, the earlier walk's failed where this one's
                // would (a stack deeper than the copy, whose walks stop at
                // its end), else it must have read only unchanged bytes.
                if n.address == address
                    && n.state == state
                    && n.lo >= r.unchanged_from
                    && (n.hi <= r.end || r.base_end == r.end)
                {
                    joined = Some((at, depth));
                    break;
                }
                at = n.parent;
                depth += 1;
            }
            if joined.is_some() {
                break r.clean;
            }
        }
        if arena.len() - first >= MAX_FRAMES {
            hit_bound = true;
            break false;
        }
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let this = address;
        let this_regs = regs;
        let mut read = |addr: u64| -> Result<u64, ()> {
            lo = lo.min(addr);
            hi = hi.max(addr.saturating_add(8));
            words.read_u64(addr).ok_or(())
        };
        // A handler returning into a signal trampoline: on from the
        // instruction the signal interrupted, whose unwind rule is looked
        // up at its own address (as a leaf's). (framehop cannot evaluate
        // the trampoline's rules: it would stop, or follow the frame
        // pointer past the interrupted function.) It is named as a return
        // address is, by the byte before it, as the recorder's frame table
        // names every code address found on the stack.
        let signal = match this {
            FrameAddress::ReturnAddress(ra) if signal::returns_into(traps, ra.get()) => {
                A::signal_return(&this_regs, &mut read)
            }
            // A sample in the trampoline itself has the same stack
            // pointer: its `rt_sigreturn` call (whose saved instruction
            // pointer is just past the system call instruction, the
            // trampoline's last, so outside every unwind table), or a CPU
            // sample there.
            FrameAddress::InstructionPointer(ip) if signal::returns_into(traps, ip) => {
                A::signal_return(&this_regs, &mut read)
            }
            _ => None,
        };
        // The next frame's address; `None` at a null return address, and
        // at a Go stack switch, whose caller is not above it (see `go`).
        let next = match signal {
            _ if go::in_switch(go_switches, this.address_for_lookup()) => Ok(None),
            Some((ip, saved)) => {
                regs = saved;
                Ok(Some(FrameAddress::from_instruction_pointer(ip)))
            }
            None => unwinder
                .unwind_frame(this, &mut regs, cache.of(this), &mut read)
                .map(|ra| ra.and_then(FrameAddress::from_return_address)),
        };
        let parent = arena.len() as u32 + 1;
        arena.push(Node {
            address: this,
            state,
            lo,
            hi,
            parent,
        });
        match next {
            Ok(Some(a)) => address = a,
            Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => break true,
            Err(_) => {
                // A read at or past the end fails and ends the frame's
                // reads, so it is the frame's highest: just past the end,
                // as the next frame up would be, not a wild address read
                // through a bad rule.
                past_end = hi > end && hi.saturating_sub(8) < end.saturating_add(PAST_END_REACH);
                break false;
            }
        }
    };
    let new = (arena.len() - first) as u32;
    let (tail, tail_len) = match (joined, reuse) {
        (Some((node, depth)), Some(r)) => (node, r.len.saturating_sub(depth)),
        _ => (NONE, 0),
    };
    // Reads from each new frame to the end of the walk.
    let (mut lo, mut hi) = arena
        .get(tail as usize)
        .map_or((u64::MAX, 0), |n| (n.lo, n.hi));
    if let Some(last) = arena[first..].last_mut() {
        last.parent = tail;
    }
    for n in arena[first..].iter_mut().rev() {
        lo = lo.min(n.lo);
        hi = hi.max(n.hi);
        n.lo = lo;
        n.hi = hi;
    }
    let leaf = if new > 0 { first as u32 } else { tail };
    let total = new + tail_len;
    Walked {
        leaf,
        len: total.min(MAX_FRAMES as u32),
        // Past the bound a full walk would have stopped unclean.
        clean: clean && total <= MAX_FRAMES as u32,
        truncated: hit_bound || total > MAX_FRAMES as u32,
        joined: joined.map(|(_, depth)| (depth, new)),
        // A joined walk ends as the earlier one did.
        past_end: match (joined, reuse) {
            (Some(_), Some(r)) => r.past_end,
            _ => past_end,
        },
    }
}

/// perf marks context switches in callchains with values at the very top of
/// the address space (`PERF_CONTEXT_*`).
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;

/// Append the part of the kernel's frame-pointer callchain (innermost
/// first) that lies beyond the last frame the unwinder found. Returns
/// whether anything was appended.
pub(crate) fn continue_with_callchain(frames: &mut Vec<u64>, chain: &[u64]) -> bool {
    let chain: Vec<u64> = chain
        .iter()
        .copied()
        .filter(|&a| a < PERF_CONTEXT_MAX && a != 0)
        .collect();
    let Some(&last) = frames.last() else {
        frames.extend(chain.iter().take(MAX_FRAMES));
        return !chain.is_empty();
    };
    // Where the chain holds our outermost frame. Recursion repeats
    // addresses, and the frame-pointer walk may skip a frame or two, so
    // take the occurrence nearest to the same depth. The chain's first
    // entry is the sample's instruction pointer, so only a walk that found
    // nothing past it ends there: a deeper frame at the same address (the
    // instruction a signal interrupted, where the handler's own leaf is the
    // same instruction) is not the chain's leaf, and what follows the leaf
    // in the chain is the handler's callers, not the interrupted code's.
    let depth = frames.len() - 1;
    let Some(pos) = chain
        .iter()
        .enumerate()
        .skip(usize::from(depth > 0))
        .filter(|(_, &a)| a == last)
        .map(|(i, _)| i)
        .min_by_key(|&i| i.abs_diff(depth))
    else {
        return false;
    };
    let rest = &chain[pos + 1..];
    let room = MAX_FRAMES.saturating_sub(frames.len());
    frames.extend(rest.iter().take(room));
    !rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// From the vDSO's signal trampoline on AArch64, the walk goes on at
    /// the interrupted `pc` with the registers the kernel saved (the link
    /// register kept through the pointer-authentication mask in use).
    #[test]
    fn an_aarch64_signal_frame_gives_the_interrupted_registers() {
        use framehop::aarch64::{PtrAuthMask, UnwindRegsAarch64};
        let frame = 0x7fff_0000u64;
        let saved = [
            (544, 0x7fff_1000), // x29
            (552, 0x0040_1234), // x30
            (560, 0x7fff_0f00), // sp
            (568, 0x0040_5678), // pc
        ];
        let mask = PtrAuthMask::from_max_known_address(0x00ff_ffff);
        let regs = UnwindRegsAarch64::new_with_ptr_auth_mask(mask, 0x0050_0000, frame, 0);
        let mut read = |addr: u64| {
            saved
                .iter()
                .find(|(at, _)| frame + at == addr)
                .map(|(_, v)| *v)
                .ok_or(())
        };
        let (pc, out) = Aarch64Arch::signal_return(&regs, &mut read).unwrap();
        assert_eq!(pc, 0x0040_5678);
        assert_eq!(
            (out.lr(), out.sp(), out.fp()),
            (0x0040_1234, 0x7fff_0f00, 0x7fff_1000)
        );
        assert_eq!(out.lr_mask(), mask);
        // A frame whose words cannot be read ends the walk there.
        let mut none = |_: u64| Err(());
        assert!(Aarch64Arch::signal_return(&regs, &mut none).is_none());
    }

    /// Addresses share a framehop cache slot (one evicting the other) only
    /// when equal modulo 509 × RULE_CACHES; a return address is looked up
    /// one byte back, as framehop does.
    #[test]
    fn rule_caches_act_as_one_larger_cache() {
        let mut caches = RuleCaches::new(|| 0u32);
        let mut pick = |a: FrameAddress| caches.of(a) as *mut u32 as usize;
        let ip = |a: u64| FrameAddress::InstructionPointer(a);
        let span = FRAMEHOP_CACHE_SLOTS * RULE_CACHES as u64;
        let first = pick(ip(0x40_1000));
        assert_eq!(pick(ip(0x40_1000 + span)), first);
        assert_eq!(pick(ip(0x40_1000 + 3 * span)), first);
        let mut used = HashSet::new();
        for i in 0..RULE_CACHES as u64 {
            used.insert(pick(ip(0x40_1000 + i * FRAMEHOP_CACHE_SLOTS)));
        }
        assert_eq!(used.len(), RULE_CACHES);
        let ra = FrameAddress::from_return_address(0x40_1001).unwrap();
        assert_eq!(pick(ra), first);
    }

    #[test]
    fn callchain_continues_after_the_last_unwound_frame() {
        let mut frames = vec![0x10, 0x20, 0x30];
        let chain = [PERF_CONTEXT_MAX + 0x200, 0x10, 0x20, 0x30, 0x40, 0x50];
        assert!(continue_with_callchain(&mut frames, &chain));
        assert_eq!(frames, vec![0x10, 0x20, 0x30, 0x40, 0x50]);
    }

    #[test]
    fn callchain_in_recursion_aligns_by_depth() {
        // Unwound 3 frames of a recursion; the chain goes on to the root.
        let mut frames = vec![0x10, 0x20, 0x20];
        let chain = [0x10, 0x20, 0x20, 0x20, 0x20, 0x30, 0x40];
        assert!(continue_with_callchain(&mut frames, &chain));
        assert_eq!(frames, vec![0x10, 0x20, 0x20, 0x20, 0x20, 0x30, 0x40]);
    }

    /// A signal interrupted the instruction the handler's sample is at
    /// (both in the vDSO's clock_gettime): the walk crossed the signal
    /// frame and stopped at that instruction, outside the copy of the
    /// handler's alternate stack. The chain's leaf is the same address,
    /// but what follows it there is the handler's callers.
    #[test]
    fn callchain_leaf_does_not_continue_a_deeper_frame() {
        let mut frames = vec![0xbe1, 0xcf438, 0x1189, 0x11f9, 0x3c04f, 0xbe1];
        let chain = [PERF_CONTEXT_MAX + 0x200, 0xbe1, 0xcf438, 0xcf438];
        assert!(!continue_with_callchain(&mut frames, &chain));
        assert_eq!(frames, vec![0xbe1, 0xcf438, 0x1189, 0x11f9, 0x3c04f, 0xbe1]);
        // A walk that found only the leaf goes on with the chain.
        let mut frames = vec![0xbe1];
        assert!(continue_with_callchain(&mut frames, &chain));
        assert_eq!(frames, vec![0xbe1, 0xcf438, 0xcf438]);
    }

    #[test]
    fn callchain_not_matching_is_ignored() {
        let mut frames = vec![0x10, 0x20];
        assert!(!continue_with_callchain(&mut frames, &[0x99, 0x98]));
        assert_eq!(frames, vec![0x10, 0x20]);
    }
}
