//! x86-64 traces.

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

pub(crate) fn start(r: &RegsX86_64) -> (u64, UnwindRegsX86_64) {
    (r.ip, UnwindRegsX86_64::new(r.ip, r.sp, r.bp))
}
