//! x86-64 traces.

use super::{walk, Unwound};
use crate::image::SectionBytes;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Module, Unwinder as _};
use lrnprof_format::RegsX86_64;

pub(crate) type Unwinder = UnwinderX86_64<SectionBytes>;
pub(crate) type Cache = CacheX86_64;

pub(crate) fn build(modules: impl Iterator<Item = Module<SectionBytes>>) -> Unwinder {
    let mut u = Unwinder::new();
    for m in modules {
        u.add_module(m);
    }
    u
}

pub(crate) fn unwind<F>(
    u: &Unwinder,
    cache: &mut Cache,
    r: &RegsX86_64,
    read_stack: &mut F,
) -> Unwound
where
    F: FnMut(u64) -> Result<u64, ()>,
{
    walk(
        u,
        r.ip,
        UnwindRegsX86_64::new(r.ip, r.sp, r.bp),
        cache,
        read_stack,
    )
}
