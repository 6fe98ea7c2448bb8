//! Traces written by earlier versions of lrnprof stay readable.
//!
//! `format/tests/data/v1.lpt` was written by format version 1 and is kept
//! forever. Regenerate it only when its contents change on purpose, with
//! `LRNPROF_BLESS=1 cargo test -p lrnprof-format`, and never for a version
//! that has shipped: add a new `vN.lpt` instead.

use crate::fixtures::*;
use lrnprof_format::*;
use std::path::PathBuf;

fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn v1_records() -> Vec<Record> {
    let mut records = every_kind_in_committed_v1();
    let summary = records.pop().unwrap();
    records.extend(many_samples(40));
    records.push(summary);
    records
}

#[test]
fn committed_v1_trace_reads() {
    let path = data_path("v1.lpt");
    if std::env::var_os("LRNPROF_BLESS").is_some() {
        std::fs::write(&path, write_trace(&v1_records(), 16 * 1024)).unwrap();
    }
    let reader = TraceReader::open(&path).unwrap();
    assert_eq!(reader.version(), 1);
    assert!(reader.report().finished);
    assert_eq!(reader.header(), &TraceHeader::example());
    let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records, v1_records());
}
