//! Damaged traces: truncation anywhere, flipped bits, hostile lengths.

use crate::fixtures::*;
use lrnprof_format::raw::{FILE_HEADER_LEN, FOOTER_LEN};
use lrnprof_format::*;

fn trace() -> (Vec<Record>, Vec<u8>) {
    let records = many_samples(400);
    let data = write_trace(&records, 8 * 1024);
    (records, data)
}

#[test]
fn truncated_anywhere_reads_whole_blocks_and_says_what_was_lost() {
    let (records, data) = trace();
    let reader = TraceReader::new(&data[..]).unwrap();
    let blocks = reader.blocks().to_vec();
    let header_end = blocks[0].offset.0 as usize;
    // Every cut point inside the body, a few bytes apart, plus every block edge.
    let mut cuts: Vec<usize> = (header_end..data.len()).step_by(1013).collect();
    cuts.extend(blocks.iter().map(|b| b.offset.0 as usize));
    cuts.push(data.len() - FOOTER_LEN);
    cuts.push(data.len() - 1);
    for cut in cuts {
        let cut_data = &data[..cut];
        let reader = TraceReader::new(cut_data).unwrap();
        assert!(!reader.report().finished, "cut at {cut}");
        let whole = blocks
            .iter()
            .filter(|b| b.offset.0 + b.header.total_len() <= cut as u64)
            .count();
        assert_eq!(reader.blocks().len(), whole, "cut at {cut}");
        let read: Vec<Record> = reader.records().map(Result::unwrap).collect();
        assert_eq!(read[..], records[..read.len()], "cut at {cut}");
        // Bytes of a cut-off records block are reported lost; a cut-off
        // index loses no records.
        let body_end = blocks
            .last()
            .map_or(0, |b| b.offset.0 + b.header.total_len());
        let readable_end = blocks
            .get(whole)
            .map_or(body_end.min(cut as u64), |b| b.offset.0.min(cut as u64));
        let lost = reader.report().lost_bytes();
        if (cut as u64) <= body_end {
            assert_eq!(lost, cut as u64 - readable_end, "cut at {cut}");
        } else {
            assert_eq!(read.len(), records.len(), "cut at {cut}");
            assert!(lost <= cut as u64 - body_end, "cut at {cut}");
        }
    }
}

#[test]
fn truncated_inside_the_header_is_an_error() {
    let (_, data) = trace();
    for cut in 0..FILE_HEADER_LEN + 10 {
        let err = TraceReader::new(&data[..cut]).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::BadMagic { .. }
                    | FormatError::TooShort { .. }
                    | FormatError::LengthOutOfBounds { .. }
            ),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn wrong_magic() {
    let (_, mut data) = trace();
    data[0] = b'P';
    let err = TraceReader::new(&data[..]).unwrap_err();
    assert!(matches!(err, FormatError::BadMagic { .. }), "{err}");
    assert!(err.to_string().contains("not an lrnprof trace"));
    let err = TraceReader::new(&b"perf data file"[..]).unwrap_err();
    assert!(matches!(err, FormatError::BadMagic { .. }));
}

#[test]
fn versions_too_new_and_too_old() {
    let (_, mut data) = trace();
    data[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
    let err = TraceReader::new(&data[..]).unwrap_err();
    assert!(matches!(err, FormatError::VersionTooNew { .. }), "{err}");
    assert!(err.to_string().contains("upgrade"));
    data[8..10].copy_from_slice(&0u16.to_le_bytes());
    let err = TraceReader::new(&data[..]).unwrap_err();
    assert!(
        matches!(err, FormatError::VersionTooOld { found: 0, .. }),
        "{err}"
    );
}

#[test]
fn corrupt_trace_header() {
    let (_, mut data) = trace();
    data[FILE_HEADER_LEN + 2] ^= 0x40;
    let err = TraceReader::new(&data[..]).unwrap_err();
    assert!(
        matches!(
            err,
            FormatError::BadChecksum {
                what: "trace header",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn huge_header_length_is_refused_without_allocating() {
    let (_, mut data) = trace();
    data[12..16].copy_from_slice(&(900_000u32).to_le_bytes());
    let err = TraceReader::new(&data[..200]).unwrap_err();
    assert!(
        matches!(err, FormatError::LengthOutOfBounds { .. }),
        "{err}"
    );
    data[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = TraceReader::new(&data[..]).unwrap_err();
    assert!(
        matches!(err, FormatError::LengthOutOfBounds { .. }),
        "{err}"
    );
}

#[test]
fn a_corrupt_block_is_skipped_and_the_rest_is_read() {
    let (records, data) = trace();
    let reader = TraceReader::new(&data[..]).unwrap();
    let blocks = reader.blocks().to_vec();
    assert!(blocks.len() >= 4);
    let victim = blocks[2];
    let per_block: Vec<Vec<Record>> = blocks
        .iter()
        .map(|b| reader.decode_block(b).unwrap())
        .collect();

    // A flipped bit in the payload: checksum mismatch, block skipped.
    let mut bad = data.clone();
    bad[victim.offset.0 as usize + 60] ^= 0x01;
    let reader = TraceReader::new(&bad[..]).unwrap();
    assert!(!reader.report().finished);
    assert_eq!(reader.report().skipped.len(), 1);
    let skipped = &reader.report().skipped[0];
    assert_eq!(skipped.offset, victim.offset.0);
    assert_eq!(skipped.len, victim.header.total_len());
    assert!(skipped.reason.contains("checksum"), "{}", skipped.reason);
    let read: Vec<Record> = reader.records().map(Result::unwrap).collect();
    let expected: Vec<Record> = per_block
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .flat_map(|(_, r)| r.clone())
        .collect();
    assert_eq!(read, expected);
    assert_eq!(read.len(), records.len() - per_block[2].len());

    // A destroyed length field: the reader resynchronizes at the next block.
    let mut bad = data.clone();
    let at = victim.offset.0 as usize + 12;
    bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let reader = TraceReader::new(&bad[..]).unwrap();
    assert_eq!(reader.blocks().len(), blocks.len() - 1);
    assert_eq!(reader.report().skipped[0].offset, victim.offset.0);
}

#[test]
fn bad_records_inside_a_valid_block_are_an_error_not_a_panic() {
    // A block whose checksum is right but whose payload is garbage, as a
    // buggy or hostile writer could make.
    for payload in [
        vec![0xffu8; 64],
        vec![3, 0xff, 0xff, 0xff, 0xff, 0x0f],
        vec![],
    ] {
        let header = BlockHeader {
            kind: BlockKind::Records,
            codec: Codec::None,
            raw_len: payload.len() as u32,
            compressed_len: payload.len() as u32,
            record_count: 5,
            first_time: 0,
            last_time: 0,
        };
        let mut block = header.to_bytes(&payload).to_vec();
        block.extend_from_slice(&payload);
        let err = decode_standalone_block(VERSION, &block).unwrap_err();
        assert!(matches!(err, FormatError::BadRecord { .. }), "{err}");
    }
}

#[test]
fn lying_raw_length_is_caught() {
    let records = every_kind();
    let mut builder = BlockBuilder::new();
    for r in &records {
        builder.push(r).unwrap();
    }
    let block = builder.finish(3).unwrap();
    let payload = &block.bytes[raw::BLOCK_HEADER_LEN..];
    for raw_len in [block.header.raw_len - 1, block.header.raw_len + 1, 64 << 20] {
        let header = BlockHeader {
            raw_len,
            ..block.header
        };
        let mut bytes = header.to_bytes(payload).to_vec();
        bytes.extend_from_slice(payload);
        let err = decode_standalone_block(VERSION, &bytes).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::Decompress { .. } | FormatError::RawLengthMismatch { .. }
            ),
            "raw_len {raw_len}: {err}"
        );
    }
    let header = BlockHeader {
        raw_len: (64 << 20) + 1,
        ..block.header
    };
    let mut bytes = header.to_bytes(payload).to_vec();
    bytes.extend_from_slice(payload);
    assert!(matches!(
        decode_standalone_block(VERSION, &bytes),
        Err(FormatError::LengthOutOfBounds { .. })
    ));
}

#[test]
fn damaged_index_falls_back_to_scanning() {
    let (records, data) = trace();
    let n = data.len();
    // Point the footer somewhere wrong.
    let mut bad = data.clone();
    bad[n - FOOTER_LEN..n - FOOTER_LEN + 8].copy_from_slice(&7u64.to_le_bytes());
    let reader = TraceReader::new(&bad[..]).unwrap();
    assert_eq!(read_all(&bad), records);
    assert!(!reader.report().finished);
}

/// Inputs the fuzzers found, kept so the bugs stay fixed.
#[test]
fn fuzz_regressions() {
    #[rustfmt::skip]
    let cases: &[&[u8]] = &[
        // A stack claiming 4 GiB in a tiny block: was preallocated unchecked.
        &[12, 66, 76, 75, 1, 1, 0, 0, 0, 0, 17, 0, 91, 0, 252, 252, 252, 252, 252, 252, 252, 252,
          252, 49, 252, 7, 252, 252, 252, 0, 0, 1, 1, 1, 1, 0, 1, 1, 252, 240, 223, 255, 255, 124,
          131],
    ];
    for case in cases {
        let _ = decode_standalone_block(VERSION, case);
        // The fuzz target also wraps the input in valid headers.
        let (count, payload) = case.split_at(4);
        let record_count = u32::from_le_bytes(count.try_into().unwrap()) % 4096;
        let header = BlockHeader {
            kind: BlockKind::Records,
            codec: Codec::None,
            raw_len: payload.len() as u32,
            compressed_len: payload.len() as u32,
            record_count,
            first_time: 0,
            last_time: 0,
        };
        let mut block = header.to_bytes(payload).to_vec();
        block.extend_from_slice(payload);
        assert!(decode_standalone_block(VERSION, &block).is_err());
    }
}

#[test]
fn same_segments_cannot_blow_up_memory() {
    // Thousands of samples of one thread, each "the same 8 MiB as before":
    // tiny on disk, gigabytes decoded. The reader refuses the block.
    let big = Sample {
        stack: StackSnapshot {
            start: 0x1000_0000,
            bytes: vec![7; MAX_STACK_LEN as usize],
        },
        ..sample(1, 1, 16)
    };
    let mut builder = BlockBuilder::new();
    for i in 0..40 {
        builder
            .push(&Record::Sample(Sample {
                time: Timestamp(i),
                ..big.clone()
            }))
            .unwrap();
    }
    assert!(builder.decoded_len() > MAX_BLOCK_DECODED_LEN);
    let block = builder.finish(1).unwrap();
    assert!(
        block.bytes.len() < 1 << 20,
        "{} bytes on disk",
        block.bytes.len()
    );
    let err = decode_standalone_block(VERSION, &block.bytes).unwrap_err();
    assert!(err.to_string().contains("decodes to more than"), "{err}");

    // The writer cuts blocks before that, so what it writes reads back.
    let records: Vec<Record> = (0..40)
        .map(|i| {
            Record::Sample(Sample {
                time: Timestamp(i),
                ..big.clone()
            })
        })
        .collect();
    let data = write_trace(&records, 1 << 20);
    assert_eq!(read_all(&data).len(), 40);

    // A stack over the limit is refused when written.
    let too_big = Sample {
        stack: StackSnapshot {
            start: 0,
            bytes: vec![0; MAX_STACK_LEN as usize + 1],
        },
        ..sample(1, 1, 16)
    };
    let mut builder = BlockBuilder::new();
    assert!(matches!(
        builder.push(&Record::Sample(too_big)),
        Err(FormatError::RecordTooLarge { .. })
    ));
}
