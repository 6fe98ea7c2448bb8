//! AArch64 traces.

use crate::image::SectionBytes;
use framehop::aarch64::{CacheAarch64, PtrAuthMask, UnwindRegsAarch64, UnwinderAarch64};
use framehop::{Module, Unwinder as _};
use lrnprof_format::RegsAarch64;

pub(crate) type Unwinder = UnwinderAarch64<SectionBytes>;
pub(crate) type Cache = CacheAarch64;

pub(crate) fn build(modules: impl Iterator<Item = Module<SectionBytes>>) -> Unwinder {
    let mut u = Unwinder::new();
    for m in modules {
        u.add_module(m);
    }
    u
}

pub(crate) fn start(u: &Unwinder, r: &RegsAarch64) -> (u64, UnwindRegsAarch64) {
    // Return addresses may carry pointer-authentication bits: strip what
    // lies above the highest code address the process has mapped.
    let mask = match u.max_known_code_address() {
        0 => PtrAuthMask::new_no_strip(),
        max => PtrAuthMask::from_max_known_address(max),
    };
    (
        r.pc,
        UnwindRegsAarch64::new_with_ptr_auth_mask(mask, r.lr, r.sp, r.fp),
    )
}
