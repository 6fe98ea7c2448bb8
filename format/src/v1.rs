//! Version 1 of the format, frozen: the types whose encoding changed in
//! version 2, as version 1 wrote them, and their conversion to today's.
//!
//! Every released version stays readable. When a later version changes a
//! type that version 1 shares with today's format (`ThreadRecord`,
//! `ImageMapRecord`, `Blob`, ...: used directly below because their bytes
//! have not changed), freeze its version-1 form here first. Enums that only
//! gained variants at their end (`SampleKind`, `BlobKind`, `Target`) decode
//! version-1 bytes unchanged.

use crate::cursor::WireSampleIn;
use crate::records::{
    Blob, IdleRecord, ImageMapRecord, ImageUnmapRecord, LostRecord, LostSource, ProcessEvent,
    ProcessRecord, Record, Regs, Sample, SampleDetail, SampleFlags, SampleKind, StackSnapshot,
    Summary, ThreadRecord,
};
use crate::stack::{SegmentIn, WireStackIn};
use crate::types::{
    Arch, Clock, Endian, EventSettings, Os, Pid, SamplingSettings, Target, Tid, Timestamp,
    TraceHeader,
};
use serde::Deserialize;

/// A version-1 trace header: today's without `events`.
#[derive(Deserialize)]
pub(crate) struct TraceHeaderV1 {
    arch: Arch,
    os: Os,
    endian: Endian,
    pointer_size: u8,
    page_size: u32,
    clock: Clock,
    sampling: SamplingSettings,
    recorder: String,
    start_wall_ns: u64,
    start_time: Timestamp,
    target: Target,
    hostname: String,
}

impl From<TraceHeaderV1> for TraceHeader {
    fn from(h: TraceHeaderV1) -> TraceHeader {
        TraceHeader {
            arch: h.arch,
            os: h.os,
            endian: h.endian,
            pointer_size: h.pointer_size,
            page_size: h.page_size,
            clock: h.clock,
            sampling: h.sampling,
            recorder: h.recorder,
            start_wall_ns: h.start_wall_ns,
            start_time: h.start_time,
            target: h.target,
            hostname: h.hostname,
            // Version 1 recorded CPU samples only.
            events: EventSettings {
                cpu: true,
                ..EventSettings::default()
            },
        }
    }
}

/// A version-1 wire record, literal stack bytes borrowed from the block.
#[derive(Deserialize)]
pub(crate) enum WireRecordV1In<'a> {
    Plain(RecordV1),
    #[serde(borrow)]
    Sample(WireSampleV1In<'a>),
}

/// A version-1 record: variants 0 to 8 of today's, three of them with
/// fewer fields.
#[derive(Deserialize)]
pub(crate) enum RecordV1 {
    Process(ProcessRecordV1),
    Thread(ThreadRecord),
    ImageMap(ImageMapRecord),
    ImageUnmap(ImageUnmapRecord),
    Sample(SampleV1),
    Lost(LostRecordV1),
    Blob(Blob),
    Summary(Summary),
    Idle(IdleRecord),
}

impl From<RecordV1> for Record {
    fn from(r: RecordV1) -> Record {
        match r {
            RecordV1::Process(p) => Record::Process(ProcessRecord {
                time: p.time,
                pid: p.pid,
                parent: p.parent,
                event: p.event,
                command: p.command,
                executable: p.executable,
                cgroup: None,
            }),
            RecordV1::Thread(t) => Record::Thread(t),
            RecordV1::ImageMap(m) => Record::ImageMap(m),
            RecordV1::ImageUnmap(u) => Record::ImageUnmap(u),
            RecordV1::Sample(s) => Record::Sample(Sample {
                time: s.time,
                pid: s.pid,
                tid: s.tid,
                cpu: s.cpu,
                kind: s.kind,
                weight: s.weight,
                regs: s.regs,
                stack: s.stack,
                kernel_callchain: s.kernel_callchain,
                frames: s.frames,
                kernel_frames: Vec::new(),
                flags: SampleFlags::default(),
                detail: SampleDetail::None,
            }),
            RecordV1::Lost(l) => Record::Lost(LostRecord {
                time: l.time,
                pid: l.pid,
                tid: l.tid,
                count: l.count,
                // Version 1 recorders wrote losses of the perf ring buffers only.
                source: LostSource::Kernel,
            }),
            RecordV1::Blob(b) => Record::Blob(b),
            RecordV1::Summary(s) => Record::Summary(s),
            RecordV1::Idle(i) => Record::Idle(i),
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct ProcessRecordV1 {
    time: Timestamp,
    pid: Pid,
    parent: Option<Pid>,
    event: ProcessEvent,
    command: Vec<String>,
    executable: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct LostRecordV1 {
    time: Timestamp,
    pid: Option<Pid>,
    tid: Option<Tid>,
    count: u64,
}

#[derive(Deserialize)]
pub(crate) struct SampleV1 {
    time: Timestamp,
    pid: Pid,
    tid: Tid,
    cpu: Option<u32>,
    kind: SampleKind,
    weight: u64,
    regs: Regs,
    stack: StackSnapshot,
    kernel_callchain: Vec<u64>,
    frames: Vec<u64>,
}

/// A version-1 delta-encoded sample: no `base` in its stack (always the
/// thread's latest snapshot) and none of version 2's sample fields.
#[derive(Deserialize)]
pub(crate) struct WireSampleV1In<'a> {
    time: Timestamp,
    pid: Pid,
    tid: Tid,
    cpu: Option<u32>,
    kind: SampleKind,
    weight: u64,
    regs: Regs,
    #[serde(borrow)]
    stack: WireStackV1In<'a>,
    kernel_callchain: Vec<u64>,
    frames: Vec<u64>,
}

#[derive(Deserialize)]
struct WireStackV1In<'a> {
    start: u64,
    len: u32,
    #[serde(borrow)]
    segments: Vec<SegmentIn<'a>>,
}

impl<'a> From<WireSampleV1In<'a>> for WireSampleIn<'a> {
    fn from(w: WireSampleV1In<'a>) -> WireSampleIn<'a> {
        WireSampleIn {
            time: w.time,
            pid: w.pid,
            tid: w.tid,
            cpu: w.cpu,
            kind: w.kind,
            weight: w.weight,
            regs: w.regs,
            stack: WireStackIn {
                start: w.stack.start,
                len: w.stack.len,
                base: 0,
                segments: w.stack.segments,
            },
            kernel_callchain: w.kernel_callchain,
            frames: w.frames,
            kernel_frames: Vec::new(),
            flags: SampleFlags::default(),
            detail: SampleDetail::None,
        }
    }
}
