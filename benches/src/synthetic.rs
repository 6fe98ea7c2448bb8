//! Deterministic synthetic samples for the micro-benchmarks.

use lrnprof_format::{
    Pid, Record, Regs, RegsX86_64, Sample, SampleDetail, SampleFlags, SampleKind, StackSnapshot,
    Tid, Timestamp,
};

/// A small deterministic generator (xorshift64*), so every run benchmarks
/// the same bytes.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a non-zero seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// One stack word as a real stack holds them: return addresses into a few
/// code ranges, pointers into the stack, small integers and zeros.
fn stack_word(rng: &mut Rng, stack_top: u64) -> u64 {
    match rng.below(8) {
        0 | 1 => 0x5555_5555_0000 + rng.below(0x4_0000),
        2 => 0x7f12_3400_0000 + rng.below(0x20_0000),
        3 | 4 => stack_top - rng.below(0x1_0000) * 8,
        5 => rng.below(256),
        _ => 0,
    }
}

/// `count` CPU-time samples spread round-robin over `threads` threads of one
/// process, with stacks of `stack_len` bytes (a multiple of 8). Consecutive
/// samples of a thread share their outer frames and differ in a leaf region
/// of random depth, the way a CPU-bound program's stacks do.
pub fn samples(count: usize, threads: u32, stack_len: usize, seed: u64) -> Vec<Record> {
    let mut rng = Rng::new(seed);
    let stack_top = 0x7ffd_0000_0000u64;
    let threads = threads.max(1);
    let words = stack_len / 8;
    let mut stacks: Vec<Vec<u8>> = (0..threads)
        .map(|_| {
            (0..words)
                .flat_map(|_| stack_word(&mut rng, stack_top).to_le_bytes())
                .collect()
        })
        .collect();
    (0..count)
        .map(|i| {
            let t = i as u32 % threads;
            let stack = &mut stacks[t as usize];
            let changed = (rng.below(words.max(1) as u64 / 4 + 1) as usize).min(words);
            for w in 0..changed {
                stack[w * 8..w * 8 + 8]
                    .copy_from_slice(&stack_word(&mut rng, stack_top).to_le_bytes());
            }
            let thread_top = stack_top - u64::from(t) * 0x10_0000;
            let start = thread_top - stack.len() as u64;
            Record::Sample(Sample {
                time: Timestamp(1_000_000 * i as u64),
                pid: Pid(100),
                tid: Tid(100 + t),
                cpu: Some(t % 2),
                kind: SampleKind::CpuTime,
                weight: 1_000_000,
                regs: Regs::X86_64(RegsX86_64 {
                    ip: 0x5555_5555_0000 + rng.below(0x4_0000),
                    sp: start,
                    bp: start + 64,
                }),
                stack: StackSnapshot {
                    start,
                    bytes: stack.clone(),
                },
                kernel_callchain: Vec::new(),
                frames: Vec::new(),
                kernel_frames: Vec::new(),
                flags: SampleFlags::default(),
                detail: SampleDetail::None,
            })
        })
        .collect()
}

/// Bytes of stack copies in `records`: the input size the format benchmarks
/// report throughput against.
pub fn stack_bytes(records: &[Record]) -> u64 {
    records
        .iter()
        .map(|r| match r {
            Record::Sample(s) => s.stack.bytes.len() as u64,
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_deterministic_and_sized() {
        let a = samples(10, 2, 4096, 7);
        let b = samples(10, 2, 4096, 7);
        assert_eq!(a, b);
        assert_eq!(stack_bytes(&a), 10 * 4096);
        let Record::Sample(s) = &a[1] else {
            panic!("not a sample")
        };
        assert_eq!(s.tid, Tid(101));
        assert_eq!(s.stack.end(), 0x7ffd_0000_0000 - 0x10_0000);
    }

    #[test]
    fn consecutive_stacks_of_a_thread_share_their_outer_part() {
        let recs = samples(4, 1, 8192, 3);
        let (Record::Sample(a), Record::Sample(b)) = (&recs[0], &recs[1]) else {
            panic!("not samples")
        };
        let same_tail = a
            .stack
            .bytes
            .iter()
            .rev()
            .zip(b.stack.bytes.iter().rev())
            .take_while(|(x, y)| x == y)
            .count();
        assert!(
            same_tail >= 8192 * 3 / 4 - 8,
            "only {same_tail} bytes shared"
        );
        assert_ne!(a.stack.bytes, b.stack.bytes);
    }
}
