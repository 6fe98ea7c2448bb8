//! A direct reader of the one record a block is mostly made of: a
//! delta-encoded sample, in the records' bincode encoding (varint
//! integers, little endian).
//!
//! Reading samples through serde's generic deserializer costs a limit
//! check, a `Result` and a visitor call per field, which made record
//! decoding the largest part of an analysis. This reader walks the same
//! bytes by hand. It accepts exactly what the serde path accepts and
//! yields the same values; on anything it does not take (another record
//! kind, a malformed field, a short block) it returns `None` and the
//! cursor reads the record through serde, which gives the error. So it
//! changes no result, only how fast valid samples are read.

use crate::cursor::WireSampleIn;
use crate::records::{Regs, RegsAarch64, RegsX86_64, SampleDetail, SampleFlags, SampleKind};
use crate::stack::{SegmentIn, WireStackIn};
use crate::types::{Pid, Tid, Timestamp};

/// Variant index of `WireRecordIn::Sample`.
const SAMPLE_VARIANT: u32 = 1;

/// bincode's varint markers: a 2-, 4- or 8-byte little-endian integer
/// follows.
const U16_MARKER: u8 = 251;
const U32_MARKER: u8 = 252;
const U64_MARKER: u8 = 253;

/// Read a delta-encoded sample record from the start of `bytes`, and
/// how many bytes it takes. The
/// snapshot's segments go into `segments` (cleared first), whose buffer
/// the caller gets back in the result. With `keep_kernel` false the
/// kernel callchain and kernel frames are checked and left empty, as the
/// serde path of a metadata pass does.
pub(crate) fn read_sample<'a>(
    bytes: &'a [u8],
    keep_kernel: bool,
    mut segments: Vec<SegmentIn<'a>>,
) -> Option<(WireSampleIn<'a>, usize)> {
    let mut r = Reader { rest: bytes };
    if r.u32()? != SAMPLE_VARIANT {
        return None;
    }
    let time = Timestamp(r.u64()?);
    let pid = Pid(r.u32()?);
    let tid = Tid(r.u32()?);
    let cpu = match r.byte()? {
        0 => None,
        1 => Some(r.u32()?),
        _ => return None,
    };
    let kind = match r.u32()? {
        0 => SampleKind::CpuTime,
        1 => SampleKind::Cycles,
        2 => SampleKind::WallTime,
        3 => SampleKind::Allocation,
        4 => SampleKind::Syscall,
        5 => SampleKind::OffCpu,
        _ => return None,
    };
    let weight = r.u64()?;
    let regs = match r.u32()? {
        0 => Regs::X86_64(RegsX86_64 {
            ip: r.u64()?,
            sp: r.u64()?,
            bp: r.u64()?,
        }),
        1 => Regs::Aarch64(RegsAarch64 {
            pc: r.u64()?,
            sp: r.u64()?,
            fp: r.u64()?,
            lr: r.u64()?,
        }),
        _ => return None,
    };
    let start = r.u64()?;
    let len = r.u32()?;
    let base = r.byte()?;
    let count = r.len()?;
    // Each segment takes at least two bytes: a claim beyond the block is
    // left to the serde path to refuse.
    if count > r.rest.len() / 2 {
        return None;
    }
    segments.clear();
    for _ in 0..count {
        segments.push(match r.u32()? {
            0 => SegmentIn::Same(r.u32()?),
            1 => {
                let n = r.len()?;
                SegmentIn::Literal(r.take(n)?)
            }
            _ => return None,
        });
    }
    let kernel_callchain = r.u64s(keep_kernel)?;
    let frames = r.u64s(true)?;
    let kernel_frames = r.u64s(keep_kernel)?;
    let flags = SampleFlags(r.u32()?);
    let detail = match r.u32()? {
        0 => SampleDetail::None,
        1 => SampleDetail::Allocation { address: r.u64()? },
        2 => SampleDetail::Syscall {
            nr: r.u32()?,
            args: [r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?],
        },
        3 => SampleDetail::OffCpu {
            preempted: match r.byte()? {
                0 => false,
                1 => true,
                _ => return None,
            },
        },
        _ => return None,
    };
    let sample = WireSampleIn {
        time,
        pid,
        tid,
        cpu,
        kind,
        weight,
        regs,
        stack: WireStackIn {
            start,
            len,
            base,
            segments,
        },
        kernel_callchain,
        frames,
        kernel_frames,
        flags,
        detail,
    };
    Some((sample, bytes.len() - r.rest.len()))
}

/// The unread bytes of a record. Its reads are inlined into
/// [`read_sample`]: called once per field (some 25 per sample), they were
/// not, and the calls were a good part of what reading a sample cost.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    #[inline(always)]
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(b)
    }

    #[inline(always)]
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    #[inline(always)]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A varint, as bincode reads one (non-minimal encodings included;
    /// the 16-byte marker is refused, as for a u64 there).
    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0..=250 => Some(b.into()),
            U16_MARKER => Some(u16::from_le_bytes(self.array()?).into()),
            U32_MARKER => Some(u32::from_le_bytes(self.array()?).into()),
            U64_MARKER => Some(u64::from_le_bytes(self.array()?)),
            _ => None,
        }
    }

    #[inline(always)]
    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    #[inline(always)]
    fn len(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }

    /// A list of varints; with `keep` false read past, left empty.
    #[inline(always)]
    fn u64s(&mut self, keep: bool) -> Option<Vec<u64>> {
        let n = self.len()?;
        // At least a byte each.
        if n > self.rest.len() {
            return None;
        }
        if !keep {
            for _ in 0..n {
                self.u64()?;
            }
            return Some(Vec::new());
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.u64()?);
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::bincode_options;
    use crate::cursor::{Skipped, WireRecordIn};
    use crate::records::{Record, Sample, StackSnapshot, ThreadEvent, ThreadRecord};
    use crate::{TraceHeader, TraceReader, TraceWriter, WriterOptions};
    use bincode::Options;

    /// What serde reads from exactly `bytes` (trailing bytes refused),
    /// kernel stacks kept or skipped.
    fn by_serde(bytes: &[u8], keep_kernel: bool) -> Option<WireSampleIn<'_>> {
        let o = bincode_options().reject_trailing_bytes();
        if keep_kernel {
            match o.deserialize::<WireRecordIn>(bytes).ok()? {
                WireRecordIn::Sample(w) => Some(w),
                WireRecordIn::Plain(_) => None,
            }
        } else {
            match o.deserialize::<WireRecordIn<Skipped>>(bytes).ok()? {
                WireRecordIn::Sample(w) => Some(w.without_kernel_stacks()),
                WireRecordIn::Plain(_) => None,
            }
        }
    }

    /// Every sample `read_sample` takes from the start of `bytes` is what
    /// serde reads from the same bytes, to the same end.
    fn check_same(bytes: &[u8]) -> Option<usize> {
        let mut used = None;
        for keep in [true, false] {
            let Some((fast, len)) = read_sample(bytes, keep, Vec::new()) else {
                continue;
            };
            assert_eq!(by_serde(&bytes[..len], keep).as_ref(), Some(&fast));
            used = Some(len);
        }
        used
    }

    fn samples() -> Vec<Record> {
        let mut out = vec![Record::Thread(ThreadRecord {
            time: Timestamp(1),
            pid: Pid(7),
            tid: Tid(7),
            event: ThreadEvent::Existing,
            name: Some("main".into()),
        })];
        let details = [
            (SampleKind::CpuTime, SampleDetail::None),
            (SampleKind::Cycles, SampleDetail::None),
            (SampleKind::WallTime, SampleDetail::None),
            (
                SampleKind::Allocation,
                SampleDetail::Allocation { address: u64::MAX },
            ),
            (
                SampleKind::Syscall,
                SampleDetail::Syscall {
                    nr: 300,
                    args: [0, 250, 251, 65_536, u32::MAX.into(), u64::MAX],
                },
            ),
            (SampleKind::OffCpu, SampleDetail::OffCpu { preempted: true }),
        ];
        for i in 0..60u64 {
            let (kind, detail) = details[i as usize % details.len()];
            let regs = if i % 5 == 0 {
                Regs::Aarch64(RegsAarch64 {
                    pc: 0x4000 + i,
                    sp: 0x7fff_0000,
                    fp: 1 << 40,
                    lr: 0,
                })
            } else {
                Regs::X86_64(RegsX86_64 {
                    ip: 0x5555_0000_0000 + i * 977,
                    sp: 0x7ffd_0000 - (i % 4) * 64,
                    bp: u64::MAX - i,
                })
            };
            let mut bytes: Vec<u8> = (0..2048 + (i % 4) * 64)
                .map(|b| (b as u8).wrapping_mul(31))
                .collect();
            bytes[(i as usize * 53) % 2000] ^= 0x5a;
            out.push(Record::Sample(Sample {
                time: Timestamp(1_000_000_000 + i * 250_000),
                pid: Pid(7),
                tid: Tid(7 + (i % 3) as u32),
                cpu: (i % 2 == 0).then_some(i as u32 * 100),
                kind,
                weight: [1, 250, 251, 70_000, 1 << 40][i as usize % 5],
                regs,
                stack: StackSnapshot {
                    start: 0x7ffd_0000 - (i % 4) * 64,
                    bytes,
                },
                kernel_callchain: (0..i % 4).map(|k| 0xffff_ffff_8100_0000 + k).collect(),
                frames: if i % 7 == 0 {
                    vec![1, 300, 1 << 33]
                } else {
                    vec![]
                },
                kernel_frames: (0..i % 3).map(|k| 0xffff_ffff_8200_0000 + k).collect(),
                flags: SampleFlags(i as u32 % 4),
                detail,
            }));
        }
        out
    }

    /// The records of the first block of a trace of `records`.
    fn block_bytes(records: &[Record]) -> Vec<u8> {
        let mut file = Vec::new();
        let mut w =
            TraceWriter::new(&mut file, &TraceHeader::example(), WriterOptions::default()).unwrap();
        for r in records {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let reader = TraceReader::new(&file[..]).unwrap();
        assert_eq!(reader.blocks().len(), 1);
        reader.raw_block(&reader.blocks()[0]).unwrap().bytes
    }

    #[test]
    fn reads_every_sample_as_serde_does() {
        let records = samples();
        let bytes = block_bytes(&records);
        let mut at = 0;
        let mut read = 0;
        for r in &records {
            let len = match check_same(&bytes[at..]) {
                Some(len) => {
                    read += 1;
                    len
                }
                None => {
                    assert!(!matches!(r, Record::Sample(_)), "a sample left to serde");
                    // The `Plain` variant's index, then the record.
                    1 + bincode_options().serialized_size(r).unwrap() as usize
                }
            };
            at += len;
        }
        assert_eq!(at, bytes.len());
        assert_eq!(read, records.len() - 1);
    }

    /// Damaged samples: whatever `read_sample` still takes, serde reads
    /// alike; the rest it leaves to serde (whose error the cursor gives).
    #[test]
    fn damaged_samples_read_as_serde_does_or_not_at_all() {
        let records = samples();
        let bytes = block_bytes(&records);
        let mut rest = &bytes[..];
        // Past the thread record.
        while read_sample(rest, true, Vec::new()).is_none() {
            rest = &rest[1..];
        }
        let (_, record_len) = read_sample(rest, true, Vec::new()).unwrap();
        let record = &rest[..record_len];
        let mut taken = 0;
        // The fields before the stack's literal bytes, and some of those.
        for at in 0..record.len().min(160) {
            for value in [0u8, 1, 2, 6, 250, 251, 252, 253, 254, 255] {
                let mut damaged = record.to_vec();
                damaged[at] = value;
                taken += usize::from(check_same(&damaged).is_some());
                // Cut short.
                check_same(&damaged[..at]);
            }
        }
        assert!(taken > 0);
    }
}
