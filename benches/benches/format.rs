//! Micro-benchmarks of the trace format's hot paths: encoding samples into a
//! block (stack delta encoding + bincode), compressing it, and decoding a
//! trace back. Throughput is in bytes of stack copies, the bulk of a trace.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use lrnprof_benches::synthetic::{samples, stack_bytes};
use lrnprof_format::{BlockBuilder, Record, TraceHeader, TraceReader, TraceWriter, WriterOptions};
use rayon::prelude::*;
use std::hint::black_box;

/// 1,000 samples of 2 threads with 8 KiB stacks: about one writer block's
/// worth of input at perf's default stack size.
fn workload() -> Vec<Record> {
    samples(1000, 2, 8192, 42)
}

fn encode_trace(records: &[Record]) -> Vec<u8> {
    let mut w = TraceWriter::new(
        Vec::new(),
        &TraceHeader::example(),
        WriterOptions::default(),
    )
    .expect("writer");
    for r in records {
        w.write(r).expect("write");
    }
    w.finish().expect("finish")
}

fn stack_encoding(c: &mut Criterion) {
    let records = workload();
    let mut g = c.benchmark_group("stack_snapshot_encode");
    g.throughput(Throughput::Bytes(stack_bytes(&records)));
    g.bench_function("push_1000_samples_8KiB", |b| {
        b.iter_batched_ref(
            BlockBuilder::new,
            |builder| {
                for r in &records {
                    builder.push(black_box(r)).expect("push");
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn block_encode(c: &mut Criterion) {
    let records = workload();
    let mut g = c.benchmark_group("block_encode");
    g.throughput(Throughput::Bytes(stack_bytes(&records)));
    for level in [1, 3] {
        g.bench_function(format!("push_and_zstd{level}"), |b| {
            b.iter(|| {
                let mut builder = BlockBuilder::new();
                for r in &records {
                    builder.push(r).expect("push");
                }
                black_box(builder.finish(level).expect("finish"))
            })
        });
    }
    g.bench_function("trace_writer_default", |b| {
        b.iter(|| black_box(encode_trace(&records)))
    });
    g.finish();
}

fn block_decode(c: &mut Criterion) {
    let records = samples(4000, 2, 8192, 42);
    let bytes = encode_trace(&records);
    let mut g = c.benchmark_group("block_decode");
    g.throughput(Throughput::Bytes(stack_bytes(&records)));
    g.bench_function("records_sequential", |b| {
        b.iter(|| {
            let r = TraceReader::new(&bytes[..]).expect("open");
            let mut n = 0;
            for record in r.records() {
                black_box(record.expect("record"));
                n += 1;
            }
            n
        })
    });
    g.bench_function("par_decode_blocks", |b| {
        b.iter(|| {
            let r = TraceReader::new(&bytes[..]).expect("open");
            let blocks: Vec<_> = r
                .par_decode_blocks()
                .map(|(_, x)| x.expect("block").len())
                .collect();
            black_box(blocks.iter().sum::<usize>())
        })
    });
    g.finish();
}

criterion_group!(benches, stack_encoding, block_encode, block_decode);
criterion_main!(benches);
