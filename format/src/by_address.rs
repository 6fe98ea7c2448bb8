//! Bytes kept by address: a thread's stack copies written one over the
//! other, so that the next copy can be compared with what the earlier ones
//! held at the same addresses, and updated by writing only what changed.
//!
//! The trace writer keeps one per thread as the base of its next stack
//! delta; the recorder keeps them on both sides of its stack delta
//! pipeline.

/// Widest address range held per thread: a whole Linux stack copy (just
/// under 64 KiB) and room to grow. A copy that would widen it further
/// starts it afresh (one longer than this is held alone).
pub const MAX_HELD_SPAN: u64 = (64 + 4) << 10;

/// Room added below the bytes held when a copy reaches lower: a stack
/// deepening copy by copy does not move them each time.
const GROW: u64 = 4 << 10;

/// Bytes held by address: what the copies written over them held, the
/// later ones over the earlier. Bytes no copy has held are zero.
#[derive(Debug, Default)]
pub struct ByAddress {
    /// AVMA of `bytes[0]`.
    start: u64,
    bytes: Vec<u8>,
}

impl ByAddress {
    /// Whether `len` bytes at `sp` can be held: they end far enough below
    /// the top of the address space for the range held to grow around
    /// them (a stack always does; a malformed record might not).
    pub fn can_hold(sp: u64, len: u64) -> bool {
        sp.checked_add(len)
            .and_then(|end| end.checked_add(MAX_HELD_SPAN))
            .is_some()
    }

    /// Widen the range held to cover `len` bytes at `sp` (which
    /// [`can_hold`](Self::can_hold)), with word boundaries where `sp`'s
    /// are; start afresh (all zero) when that cannot be. Returns whether
    /// what was held is kept.
    pub fn cover(&mut self, sp: u64, len: u64) -> bool {
        let end = self.start + self.bytes.len() as u64;
        let (lo, hi) = (self.start.min(sp), end.max(sp.saturating_add(len)));
        if self.bytes.is_empty()
            || !(sp.wrapping_sub(self.start)).is_multiple_of(8)
            || hi - lo > MAX_HELD_SPAN
        {
            self.start = sp;
            self.bytes.clear();
            self.bytes.resize(len as usize, 0);
            return false;
        }
        if lo < self.start {
            // Grow downwards with room to spare (within the span, above
            // address zero, whole words).
            let spare = MAX_HELD_SPAN - (hi - lo);
            let grow = self.start - lo + (GROW.min(spare).min(lo) & !7);
            self.bytes
                .splice(0..0, std::iter::repeat_n(0, grow as usize));
            self.start -= grow;
        }
        let need = (hi - self.start) as usize;
        if need > self.bytes.len() {
            self.bytes.resize(need, 0);
        }
        true
    }

    /// The `len` bytes held at `sp`, which [`cover`](Self::cover) covered.
    pub fn at(&mut self, sp: u64, len: usize) -> &mut [u8] {
        let off = (sp - self.start) as usize;
        &mut self.bytes[off..off + len]
    }

    /// The `len` bytes held at `sp`, if held.
    pub fn view(&self, sp: u64, len: usize) -> Option<&[u8]> {
        let off = usize::try_from(sp.checked_sub(self.start)?).ok()?;
        self.bytes.get(off..off.checked_add(len)?)
    }
}
