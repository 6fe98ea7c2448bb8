//! The trace writer's stack deltas: a sequence of samples whose stacks
//! move, grow, shrink and change, as the input says, written with their
//! bytes in the sample or apart (`write_sample`), with hints that fit or
//! name another snapshot, across block boundaries; read back, the trace
//! holds every sample as it was, and the written bytes are those of the
//! same samples written plainly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lrnprof_format::{
    same_runs, Pid, Record, Regs, RegsX86_64, Sample, SampleDetail, SampleFlags, SampleKind,
    StackHint, StackSnapshot, Tid, Timestamp, TraceHeader, TraceReader, TraceWriter, WriterOptions,
};

/// The input, read a byte or a word at a time (zeros once it runs out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let block_size = 256 << (input.byte() % 8);
    // Per thread: its last stack and the id its hint gave it.
    let mut threads: Vec<(StackSnapshot, u64)> = (0..3)
        .map(|t| {
            let start = 0x7fff_0000_0000 - (t as u64) * 0x100_0000;
            (
                StackSnapshot {
                    start,
                    bytes: Vec::new(),
                },
                0,
            )
        })
        .collect();
    let mut samples = Vec::new();
    let mut hints = Vec::new();
    let mut apart = Vec::new();
    let mut id = 0u64;
    while !input.0.is_empty() && samples.len() < 2000 {
        let op = input.byte();
        let t = usize::from(op % 3);
        let (prev, prev_id) = threads[t].clone();
        let mut stack = prev.clone();
        // Move the stack pointer by a few words (or odd bytes), then
        // change some bytes.
        let moved = i64::from(input.byte() as i8) * if op & 0x40 != 0 { 1 } else { 8 };
        let len = usize::from(input.u16() % 9000);
        stack.start = prev.start.wrapping_add_signed(moved);
        let mut bytes = vec![0u8; len];
        for (i, b) in bytes.iter_mut().enumerate() {
            // The old bytes where the old stack reached, as a stack keeps
            // its deep frames.
            let addr = stack.start.wrapping_add(i as u64);
            *b = addr
                .checked_sub(prev.start)
                .and_then(|o| prev.bytes.get(o as usize))
                .copied()
                .unwrap_or(addr as u8);
        }
        for _ in 0..input.byte() % 8 {
            if len == 0 {
                break;
            }
            let at = usize::from(input.u16()) % len;
            let n = usize::from(input.byte());
            let v = input.byte();
            for b in bytes.iter_mut().skip(at).take(n) {
                *b ^= v | 1;
            }
        }
        stack.bytes = bytes;
        id += 1;
        let hint = match op >> 6 {
            // The runs equal to the thread's last stack, as the recorder
            // finds them (against bytes that are the base's where it
            // reaches).
            0 | 1 => {
                let mut held = stack.bytes.clone();
                for (i, h) in held.iter_mut().enumerate() {
                    let addr = stack.start.wrapping_add(i as u64);
                    if let Some(b) = addr
                        .checked_sub(prev.start)
                        .and_then(|o| prev.bytes.get(o as usize))
                    {
                        *h = *b;
                    }
                }
                let mut runs = Vec::new();
                same_runs(&stack.bytes, &held, |from, len| {
                    runs.push((from as u32, len as u32))
                });
                Some(StackHint {
                    id,
                    base: (prev_id != 0).then_some(prev_id),
                    runs,
                })
            }
            // Runs claimed against a snapshot that is not the latest.
            2 => Some(StackHint {
                id,
                base: Some(prev_id + 1000),
                runs: vec![(0, len as u32)],
            }),
            _ => None,
        };
        threads[t] = (stack.clone(), id);
        samples.push(Record::Sample(Sample {
            time: Timestamp(1_000 + samples.len() as u64),
            pid: Pid(100),
            tid: Tid(100 + t as u32),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight: 1,
            regs: Regs::X86_64(RegsX86_64 {
                ip: 0x40_1000,
                sp: stack.start,
                bp: 0,
            }),
            stack,
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        }));
        hints.push(hint);
        apart.push(op & 0x20 != 0);
    }
    let options = || WriterOptions {
        block_size,
        zstd_level: 1,
    };
    let mut plain = Vec::new();
    let mut w = TraceWriter::new(&mut plain, &TraceHeader::example(), options()).unwrap();
    for r in &samples {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    let mut given = Vec::new();
    let mut w = TraceWriter::new(&mut given, &TraceHeader::example(), options()).unwrap();
    for ((r, hint), &apart) in samples.iter().zip(&hints).zip(&apart) {
        match r {
            Record::Sample(s) if apart => {
                let mut bare = s.clone();
                let bytes = std::mem::take(&mut bare.stack.bytes);
                w.write_sample(&bare, &bytes, hint.as_ref()).unwrap();
            }
            _ => w.write_hinted(r, hint.as_ref()).unwrap(),
        }
    }
    w.finish().unwrap();
    let read: Vec<Record> = TraceReader::new(&given[..])
        .unwrap()
        .records()
        .map(Result::unwrap)
        .collect();
    assert_eq!(read, samples);
    let payloads = |file: &[u8]| -> Vec<Vec<u8>> {
        let reader = TraceReader::new(file).unwrap();
        reader
            .blocks()
            .iter()
            .map(|b| {
                let mut raw = vec![0; b.header.raw_len as usize];
                reader.raw_block_in(b, &mut raw[..]).unwrap();
                raw
            })
            .collect()
    };
    assert_eq!(payloads(&given), payloads(&plain));
});
