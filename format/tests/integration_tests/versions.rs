//! Traces written by earlier versions of lrnprof stay readable.
//!
//! `format/tests/data/vN.lpt` was written by format version N and is kept
//! forever. `v3.lpt` was written when the writer still deltaed stacks
//! against a thread's older snapshots (`base` 1 to 3), which readers keep
//! reading. `v3-written.lpt` is what today's writer writes for the same
//! records: regenerate it, when the writer's bytes change on purpose,
//! with `LRNPROF_BLESS=1 cargo test -p lrnprof-format`; a new format
//! version gets a new `vN.lpt`.

use crate::fixtures::*;
use lrnprof_format::*;
use std::path::PathBuf;

fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// What `v1.lpt` holds, as today's reader returns it.
fn v1_records() -> Vec<Record> {
    let mut records = every_kind_in_committed_v1();
    let summary = records.pop().unwrap();
    records.extend(many_samples(40));
    records.push(summary);
    records
}

/// What `v2.lpt` holds: every record kind and variant, and a thread that
/// goes back and forth between two stacks, so snapshots are encoded against
/// older bases.
fn v2_records() -> Vec<Record> {
    let mut records = every_kind_of_v2();
    let summary = records.pop().unwrap();
    records.extend(many_samples(40));
    records.extend(alternating_stacks(12));
    records.push(summary);
    records
}

#[test]
fn committed_v1_trace_reads() {
    let reader = TraceReader::open(data_path("v1.lpt")).unwrap();
    assert_eq!(reader.version(), 1);
    assert!(reader.report().finished);
    // Version 1 had no event settings: it reads as CPU samples only.
    assert_eq!(reader.header(), &TraceHeader::example());
    let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records, v1_records());
}

/// What `v3.lpt` holds: every record kind and variant (syscall tallies
/// added), and the same back-and-forth stacks.
fn v3_records() -> Vec<Record> {
    let mut records = every_kind();
    let summary = records.pop().unwrap();
    records.extend(many_samples(40));
    records.extend(alternating_stacks(12));
    records.push(summary);
    records
}

#[test]
fn committed_v2_trace_reads() {
    let reader = TraceReader::open(data_path("v2.lpt")).unwrap();
    assert_eq!(reader.version(), 2);
    assert!(reader.report().finished);
    assert_eq!(reader.header(), &TraceHeader::example());
    let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records, v2_records());
}

#[test]
fn committed_v3_trace_reads() {
    assert_eq!(VERSION, 3, "a new version needs its own committed trace");
    let written_path = data_path("v3-written.lpt");
    if std::env::var_os("LRNPROF_BLESS").is_some() {
        std::fs::write(&written_path, write_trace(&v3_records(), 16 * 1024)).unwrap();
    }
    for path in [data_path("v3.lpt"), written_path.clone()] {
        let reader = TraceReader::open(&path).unwrap();
        assert_eq!(reader.version(), 3);
        assert!(reader.report().finished);
        assert_eq!(reader.header(), &TraceHeader::example());
        let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
        assert_eq!(records, v3_records(), "{}", path.display());
    }
    // Today's writer still writes version 3 byte for byte: the same block
    // payloads before compression (compressed bytes may differ with the
    // zstd library, the format does not).
    let written = write_trace(&v3_records(), 16 * 1024);
    assert_eq!(
        payloads(&TraceReader::open(&written_path).unwrap()),
        payloads(&TraceReader::new(written).unwrap())
    );
}

/// Each block's payload as it was before compression.
fn payloads<D: AsRef<[u8]>>(reader: &TraceReader<D>) -> Vec<Vec<u8>> {
    reader
        .blocks()
        .iter()
        .map(|b| {
            let mut raw = vec![0; b.header.raw_len as usize];
            reader.raw_block_in(b, &mut raw[..]).unwrap();
            raw
        })
        .collect()
}
