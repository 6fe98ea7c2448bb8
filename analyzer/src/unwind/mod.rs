//! Unwinding samples with framehop: one module per trace architecture, both
//! always compiled; the trace header picks one at run time.

mod aarch64;
mod x86_64;

use crate::image::{LoadedImage, SectionBytes};
use crate::timeline::Mapping;
use framehop::{ExplicitModuleSectionInfo, Module};
use lrnprof_format::{Arch, Regs, Sample};
use std::collections::HashMap;
use std::sync::Mutex;

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

/// A framehop unwinder for one process generation, for the trace's arch.
#[derive(Clone)]
pub(crate) enum ArchUnwinder {
    X86_64(x86_64::Unwinder),
    Aarch64(aarch64::Unwinder),
}

/// Per-worker unwind cache.
pub(crate) enum ArchCache {
    X86_64(Box<x86_64::Cache>),
    Aarch64(Box<aarch64::Cache>),
}

impl ArchCache {
    pub fn new(arch: Arch) -> ArchCache {
        match arch {
            Arch::X86_64 => ArchCache::X86_64(Box::new(x86_64::Cache::new())),
            Arch::Aarch64 => ArchCache::Aarch64(Box::new(aarch64::Cache::new())),
        }
    }
}

/// (image, AVMA start, AVMA end, bias).
type ModuleKey = (u32, u64, u64, u64);

/// Builds framehop modules once per (image, mapping) and reuses them
/// across the generations of a process.
#[derive(Default)]
pub(crate) struct ModuleCache {
    modules: Mutex<HashMap<ModuleKey, Module<SectionBytes>>>,
}

impl ModuleCache {
    fn module(&self, m: &Mapping, image: &LoadedImage) -> Option<Module<SectionBytes>> {
        let data = image.data.as_ref()?;
        if !data.has_unwind_data() {
            return None;
        }
        let bias = data.bias(m);
        let key = (m.image, m.start, m.end, bias);
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(module) = modules.get(&key) {
            return Some(module.clone());
        }
        let range = |name: &str| {
            data.section(name)
                .map(|s| s.svma..s.svma.saturating_add(s.size))
        };
        let bytes = |name: &str| {
            data.section(name)
                .filter(|s| !s.bytes.is_empty())
                .map(|s| s.bytes.clone())
        };
        let info = ExplicitModuleSectionInfo {
            base_svma: data.base_svma,
            text_svma: range(".text"),
            text: bytes(".text"),
            stubs_svma: range("__stubs"),
            stub_helper_svma: range("__stub_helper"),
            got_svma: range(".got"),
            unwind_info: bytes("__unwind_info"),
            eh_frame_svma: range(".eh_frame"),
            eh_frame: bytes(".eh_frame"),
            eh_frame_hdr_svma: range(".eh_frame_hdr"),
            eh_frame_hdr: bytes(".eh_frame_hdr"),
            debug_frame: bytes(".debug_frame"),
            text_segment_svma: range("__TEXT"),
            text_segment: bytes("__TEXT"),
        };
        // Section ranges may come from an untrusted trace: should framehop
        // panic on them, the image is unwound without its data.
        let module = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Module::new(
                image.key.path.clone(),
                m.start..m.end,
                bias.wrapping_add(data.base_svma),
                info,
            )
        }))
        .ok()?;
        modules.insert(key, module.clone());
        Some(module)
    }
}

impl ArchUnwinder {
    /// An unwinder knowing the executable mappings of one generation.
    pub fn build(
        arch: Arch,
        mappings: &[Mapping],
        images: &[LoadedImage],
        cache: &ModuleCache,
    ) -> ArchUnwinder {
        let modules = mappings
            .iter()
            .filter(|m| m.executable)
            .filter_map(|m| cache.module(m, &images[m.image as usize]));
        match arch {
            Arch::X86_64 => ArchUnwinder::X86_64(x86_64::build(modules)),
            Arch::Aarch64 => ArchUnwinder::Aarch64(aarch64::build(modules)),
        }
    }

    /// Unwind `sample` from its registers and stack copy; continue with the
    /// kernel callchain where the copy ends.
    pub fn unwind(&self, cache: &mut ArchCache, sample: &Sample, little_endian: bool) -> Unwound {
        let stack = &sample.stack;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(stack.start).ok_or(())?;
            let off = usize::try_from(off).map_err(|_| ())?;
            let b = stack
                .bytes
                .get(off..off.checked_add(8).ok_or(())?)
                .ok_or(())?;
            let a: [u8; 8] = b.try_into().map_err(|_| ())?;
            Ok(if little_endian {
                u64::from_le_bytes(a)
            } else {
                u64::from_be_bytes(a)
            })
        };
        let mut u = match (self, cache, &sample.regs) {
            (ArchUnwinder::X86_64(un), ArchCache::X86_64(c), Regs::X86_64(r)) => {
                x86_64::unwind(un, c, r, &mut read_stack)
            }
            (ArchUnwinder::Aarch64(un), ArchCache::Aarch64(c), Regs::Aarch64(r)) => {
                aarch64::unwind(un, c, r, &mut read_stack)
            }
            // Registers of another arch than the header says: keep the ip.
            _ => Unwound {
                frames: vec![sample.regs.ip()],
                clean: false,
                used_kernel_chain: false,
            },
        };
        if !u.clean {
            u.used_kernel_chain = continue_with_callchain(&mut u.frames, &sample.kernel_callchain);
        }
        u
    }
}

/// Drive a framehop iterator to the end. Returns the frames and whether the
/// end was clean.
pub(crate) fn walk<U, F>(
    unwinder: &U,
    pc: u64,
    regs: U::UnwindRegs,
    cache: &mut U::Cache,
    read_stack: &mut F,
) -> Unwound
where
    U: framehop::Unwinder,
    F: FnMut(u64) -> Result<u64, ()>,
{
    let mut frames = Vec::new();
    let mut iter = unwinder.iter_frames(pc, regs, cache, read_stack);
    let clean = loop {
        match iter.next() {
            Ok(Some(f)) => {
                if frames.len() >= MAX_FRAMES {
                    break false;
                }
                frames.push(f.address());
            }
            Ok(None) => break true,
            Err(framehop::Error::ReturnAddressIsNull) => break true,
            Err(_) => break false,
        }
    };
    Unwound {
        frames,
        clean,
        used_kernel_chain: false,
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
    // take the occurrence nearest to the same depth.
    let depth = frames.len() - 1;
    let Some(pos) = chain
        .iter()
        .enumerate()
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

    #[test]
    fn callchain_not_matching_is_ignored() {
        let mut frames = vec![0x10, 0x20];
        assert!(!continue_with_callchain(&mut frames, &[0x99, 0x98]));
        assert_eq!(frames, vec![0x10, 0x20]);
    }
}
