//! Write, read back, compare.

use crate::fixtures::*;
use lrnprof_format::*;
use rayon::prelude::*;

#[test]
fn every_record_kind_round_trips() {
    let records = every_kind();
    for block_size in [1, 64, 1 << 20] {
        let data = write_trace(&records, block_size);
        let reader = TraceReader::new(&data[..]).unwrap();
        assert_eq!(reader.header(), &TraceHeader::example());
        assert_eq!(reader.version(), VERSION);
        assert!(reader.report().finished);
        assert_eq!(reader.report().lost_bytes(), 0);
        assert_eq!(read_all(&data), records, "block size {block_size}");
    }
}

#[test]
fn each_kind_alone_round_trips() {
    for record in every_kind() {
        let data = write_trace(std::slice::from_ref(&record), 1 << 20);
        assert_eq!(read_all(&data), vec![record]);
    }
}

#[test]
fn samples_across_many_blocks_round_trip_in_order() {
    let records = many_samples(3000);
    let data = write_trace(&records, 64 * 1024);
    let reader = TraceReader::new(&data[..]).unwrap();
    assert!(
        reader.blocks().len() > 10,
        "{} blocks",
        reader.blocks().len()
    );
    assert_eq!(read_all(&data), records);

    // The parallel decoder gives the same records in the same order.
    let parallel: Vec<Record> = reader
        .par_decode_blocks()
        .map(|(_, r)| r.unwrap())
        .collect::<Vec<_>>()
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(parallel, records);

    // Block headers carry the time range and count of their records.
    let mut total = 0;
    for block in reader.blocks() {
        let decoded = reader.decode_block(block).unwrap();
        total += decoded.len();
        assert_eq!(decoded.len() as u32, block.header.record_count);
        let times: Vec<u64> = decoded
            .iter()
            .filter_map(|r| r.time())
            .map(|t| t.0)
            .collect();
        assert_eq!(block.header.first_time, *times.iter().min().unwrap());
        assert_eq!(block.header.last_time, *times.iter().max().unwrap());
    }
    assert_eq!(total, records.len());
}

#[test]
fn stack_deltas_make_samples_small() {
    // 2000 samples of 8 KiB stacks whose root part does not change: the
    // encoded trace must be far smaller than the raw stack bytes.
    let records: Vec<Record> = (0..2000)
        .map(|i| Record::Sample(sample(i, 7, 8192)))
        .collect();
    let raw_stack_bytes: usize = 2000 * 8192;
    let data = write_trace(&records, 1 << 20);
    assert!(
        data.len() * 20 < raw_stack_bytes,
        "{} bytes for {} raw stack bytes",
        data.len(),
        raw_stack_bytes
    );
    assert_eq!(read_all(&data), records);
}

#[test]
fn interleaved_threads_delta_against_their_own_previous_stack() {
    let records: Vec<Record> = (0..300)
        .map(|i| Record::Sample(sample(i, (i % 5) as u32, 1024 + (i as usize % 7) * 512)))
        .collect();
    let data = write_trace(&records, 1 << 20);
    assert_eq!(read_all(&data), records);
}

#[test]
fn an_unfinished_writer_leaves_whole_blocks_readable() {
    let records = many_samples(500);
    let mut out = Vec::new();
    let options = WriterOptions {
        block_size: 16 * 1024,
        ..Default::default()
    };
    let mut w = TraceWriter::new(&mut out, &TraceHeader::example(), options).unwrap();
    for r in &records {
        w.write(r).unwrap();
    }
    // Dropped without finish(), as when the recorder is killed: the records
    // still buffered are lost, every flushed block is readable.
    drop(w);
    let reader = TraceReader::new(&out[..]).unwrap();
    assert!(!reader.report().finished);
    assert!(reader.report().skipped.is_empty());
    let read: Vec<Record> = reader.records().map(Result::unwrap).collect();
    assert!(!read.is_empty() && read.len() < records.len());
    assert_eq!(read[..], records[..read.len()]);
}

#[test]
fn blocks_built_elsewhere_can_be_written() {
    let records = every_kind();
    let mut builder = BlockBuilder::new();
    for r in &records {
        builder.push(r).unwrap();
    }
    let block = std::thread::spawn(move || builder.finish(3).unwrap())
        .join()
        .expect("compression thread");
    let mut out = Vec::new();
    let mut w =
        TraceWriter::new(&mut out, &TraceHeader::example(), WriterOptions::default()).unwrap();
    w.write_block(&block).unwrap();
    w.finish().unwrap();
    assert_eq!(read_all(&out), records);
    assert_eq!(
        decode_standalone_block(VERSION, &block.bytes).unwrap(),
        records
    );
}

#[test]
fn a_record_larger_than_a_block_is_refused() {
    let huge = Record::Blob(Blob {
        build_id: BuildId(vec![1]),
        kind: BlobKind::Image,
        compressed: false,
        offset: 0,
        total_len: 65 << 20,
        data: vec![0; 65 << 20],
    });
    let mut out = Vec::new();
    let mut w =
        TraceWriter::new(&mut out, &TraceHeader::example(), WriterOptions::default()).unwrap();
    w.write(&every_kind()[0]).unwrap();
    assert!(matches!(
        w.write(&huge),
        Err(FormatError::RecordTooLarge { .. })
    ));
    // The writer is still usable and the earlier record survives.
    w.finish().unwrap();
    assert_eq!(read_all(&out), vec![every_kind()[0].clone()]);
}

#[test]
fn writing_to_a_full_disk_is_an_error() {
    #[derive(Debug)]
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "disk full",
            ))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let err =
        TraceWriter::new(Full, &TraceHeader::example(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, FormatError::Io(_)), "{err}");
}

/// A block with more threads than a reader keeps snapshots for: writer
/// and reader forget every thread at the same sample (the 4,097th thread
/// in the block), so the threads seen again afterwards are stored whole
/// and the block reads back. A writer that kept a thread the reader
/// forgot would refer to a snapshot the reader no longer has.
#[test]
fn a_block_of_more_threads_than_kept_reads_back() {
    let template = sample(1, 1, 0);
    let threads = 4096 + 8;
    let mut records = Vec::new();
    for round in 0..2u64 {
        for t in 0..threads {
            let start = 0x7000_0000 + u64::from(t) * 0x1000;
            records.push(Record::Sample(Sample {
                time: Timestamp(1 + round * 10_000 + u64::from(t)),
                tid: Tid(t),
                regs: Regs::X86_64(RegsX86_64 {
                    ip: 0x40_1000,
                    sp: start,
                    bp: 0,
                }),
                stack: StackSnapshot {
                    start,
                    bytes: pattern(64, u64::from(t)),
                },
                ..template.clone()
            }));
        }
    }
    let mut builder = BlockBuilder::new();
    for r in &records {
        builder.push(r).unwrap();
    }
    let block = builder.finish(3).unwrap();
    assert_eq!(
        decode_standalone_block(VERSION, &block.bytes).unwrap(),
        records
    );
}

/// The writer deltas against a thread's latest snapshot only; a thread
/// going back to an older stack stores it as literals, which compression
/// finds again in the block.
#[test]
fn a_thread_returning_to_an_older_stack_costs_little_once_compressed() {
    let records = alternating_stacks(12);
    let mut builder = BlockBuilder::new();
    for r in &records {
        builder.push(r).unwrap();
    }
    assert!(builder.raw_len() > 12 * 2048, "every stack stored");
    let block = builder.finish(3).unwrap();
    // Two stacks of random bytes, then only small records: far less than
    // the 12 x 2 KiB stored.
    assert!(
        block.bytes.len() < 2 * 2048 + 12 * 128,
        "block of {} bytes",
        block.bytes.len()
    );
    assert_eq!(
        decode_standalone_block(VERSION, &block.bytes).unwrap(),
        records
    );
}
