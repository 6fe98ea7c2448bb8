//! Parsing the records perf writes into its ring buffers. Pure functions
//! over bytes in the machine's byte order (perf records are native-endian;
//! the recorder runs on the machine it records).

use super::attr::Role;
pub(crate) use super::layouts::Layouts;
use std::borrow::Cow;

/// `perf_event_header.type` values.
pub(crate) mod kind {
    pub const MMAP: u32 = 1;
    pub const LOST: u32 = 2;
    pub const COMM: u32 = 3;
    pub const EXIT: u32 = 4;
    pub const THROTTLE: u32 = 5;
    pub const UNTHROTTLE: u32 = 6;
    pub const FORK: u32 = 7;
    pub const SAMPLE: u32 = 9;
    pub const MMAP2: u32 = 10;
    pub const LOST_SAMPLES: u32 = 13;
    pub const SWITCH: u32 = 14;
}

/// `perf_event_attr.sample_type` bits.
pub(crate) mod sample {
    pub const IP: u64 = 1 << 0;
    pub const TID: u64 = 1 << 1;
    pub const TIME: u64 = 1 << 2;
    pub const ADDR: u64 = 1 << 3;
    pub const READ: u64 = 1 << 4;
    pub const CALLCHAIN: u64 = 1 << 5;
    pub const ID: u64 = 1 << 6;
    pub const CPU: u64 = 1 << 7;
    pub const PERIOD: u64 = 1 << 8;
    pub const STREAM_ID: u64 = 1 << 9;
    pub const RAW: u64 = 1 << 10;
    pub const BRANCH_STACK: u64 = 1 << 11;
    pub const REGS_USER: u64 = 1 << 12;
    pub const STACK_USER: u64 = 1 << 13;
    pub const IDENTIFIER: u64 = 1 << 16;
}

/// `PERF_RECORD_MISC_COMM_EXEC`: a COMM record caused by `execve`.
pub(crate) const MISC_COMM_EXEC: u16 = 1 << 13;
/// `PERF_RECORD_MISC_SWITCH_OUT`: a SWITCH record is a switch-out.
pub(crate) const MISC_SWITCH_OUT: u16 = 1 << 13;
/// `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`: the switched-out thread was
/// preempted (still runnable).
pub(crate) const MISC_SWITCH_OUT_PREEMPT: u16 = 1 << 14;
/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: an MMAP2 record carries a build id.
pub(crate) const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
/// Callchain entries at or above this are context markers
/// (`PERF_CONTEXT_USER` etc.), not addresses.
pub(crate) const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;
/// The marker before the kernel part of a callchain.
pub(crate) const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
/// `PERF_SAMPLE_REGS_ABI_32`: a sample's user registers are a 32-bit
/// task's.
const PERF_SAMPLE_REGS_ABI_32: u64 = 1;

/// What the attribute asked for, so records can be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `sample_type`.
    pub sample_type: u64,
    /// Number of bits set in `sample_regs_user`.
    pub user_regs: usize,
}

impl Layout {
    /// Bytes of the `sample_id` trailer that `sample_id_all` adds to
    /// non-sample records.
    pub fn sample_id_len(&self) -> usize {
        let bits = [
            sample::TID,
            sample::TIME,
            sample::ID,
            sample::STREAM_ID,
            sample::CPU,
            sample::IDENTIFIER,
        ];
        bits.iter().filter(|&&b| self.sample_type & b != 0).count() * 8
    }
}

/// The `sample_id` trailer of a non-sample record (fields we ask for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SampleId {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub cpu: Option<u32>,
}

/// One parsed perf record, borrowing from the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PerfRecord<'a> {
    Sample(SampleRecord<'a>),
    Mmap2(Mmap2Record<'a>),
    Comm {
        pid: u32,
        tid: u32,
        name: Cow<'a, str>,
        exec: bool,
        id: SampleId,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
        time: u64,
    },
    Exit {
        pid: u32,
        tid: u32,
        time: u64,
    },
    Lost {
        lost: u64,
        id: SampleId,
    },
    LostSamples {
        lost: u64,
        id: SampleId,
    },
    /// The recorded thread was switched in or out (`PERF_RECORD_SWITCH`).
    Switch {
        out: bool,
        /// A switch-out of a thread that was still runnable.
        preempted: bool,
        id: SampleId,
    },
    Throttle {
        time: u64,
    },
    /// A record type this recorder does not use.
    Other {
        kind: u32,
    },
}

/// A `PERF_RECORD_SAMPLE`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SampleRecord<'a> {
    /// The event the sample comes from.
    pub role: Role,
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: Option<u32>,
    pub period: u64,
    /// User callchain, markers removed, innermost first.
    pub callchain: Vec<u64>,
    /// Kernel callchain (kernel AVMAs, the sampled address first), when
    /// the event samples the kernel; empty otherwise.
    pub kernel_callchain: Vec<u64>,
    /// A tracepoint's payload (`PERF_SAMPLE_RAW`); empty otherwise.
    pub raw: &'a [u8],
    /// User registers in mask bit order; empty if the kernel had none
    /// (e.g. a kernel thread).
    pub regs: UserRegs,
    /// The registers are a 32-bit task's (`PERF_SAMPLE_REGS_ABI_32`: an
    /// i386 process on x86-64, an AArch32 one on AArch64).
    pub abi32: bool,
    /// The live part of the stack copy (`dyn_size` bytes).
    pub stack: &'a [u8],
    /// Offset of the stack copy's size field in the record (perf header
    /// included): the bytes of the record before the copy, which the
    /// kernel subtracts from a record's 64 KiB when it sizes the copy.
    pub stack_offset: usize,
}

/// Most user registers a sample keeps: the recorder asks for 3 (x86-64)
/// or 4 (AArch64).
pub(crate) const MAX_USER_REGS: usize = 8;

/// A sample's user registers, in mask bit order, held in place: parsing
/// a sample allocates nothing for them. A sample with more than
/// [`MAX_USER_REGS`] keeps none, as one whose count does not match the
/// mask converts to none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct UserRegs {
    values: [u64; MAX_USER_REGS],
    len: usize,
}

impl std::ops::Deref for UserRegs {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

/// A `PERF_RECORD_MMAP2` (or `PERF_RECORD_MMAP`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mmap2Record<'a> {
    pub pid: u32,
    pub tid: u32,
    pub addr: u64,
    pub len: u64,
    pub pgoff: u64,
    pub build_id: Option<&'a [u8]>,
    pub prot: u32,
    pub filename: Cow<'a, str>,
    pub id: SampleId,
}

/// Why a record could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseError {
    /// The record type.
    pub kind: u32,
    /// What was wrong.
    pub what: &'static str,
}

/// A little cursor over native-endian fields.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    kind: u32,
}

impl<'a> Cursor<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        match end {
            Some(end) => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(ParseError {
                kind: self.kind,
                what: "record shorter than its fields",
            }),
        }
    }

    fn u64(&mut self) -> Result<u64, ParseError> {
        Ok(u64::from_ne_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, ParseError> {
        Ok(u32::from_ne_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u32_pair(&mut self) -> Result<(u32, u32), ParseError> {
        Ok((self.u32()?, self.u32()?))
    }
}

/// Split a buffer of whole records into (type, misc, record bytes
/// including the 8-byte header). Stops at a malformed header.
pub(crate) fn split_records(buf: &[u8]) -> impl Iterator<Item = (u32, u16, &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let header = buf.get(pos..pos + 8)?;
        let kind = u32::from_ne_bytes(header[0..4].try_into().expect("4 bytes"));
        let misc = u16::from_ne_bytes(header[4..6].try_into().expect("2 bytes"));
        let size = u16::from_ne_bytes(header[6..8].try_into().expect("2 bytes")) as usize;
        if size < 8 {
            return None;
        }
        let record = buf.get(pos..pos + size)?;
        pos += size;
        Some((kind, misc, record))
    })
}

/// Parse one record (with its 8-byte header) of the given type.
pub(crate) fn parse_record<'a>(
    layouts: &Layouts,
    kind: u32,
    misc: u16,
    record: &'a [u8],
) -> Result<PerfRecord<'a>, ParseError> {
    let layout = layouts.trailer();
    let body = &record[8.min(record.len())..];
    let mut c = Cursor {
        data: body,
        pos: 0,
        kind,
    };
    let trailer = |c: &Cursor<'a>| -> Result<SampleId, ParseError> {
        let len = layout.sample_id_len();
        if body.len() < c.pos + len {
            return Err(ParseError {
                kind,
                what: "record shorter than its sample_id",
            });
        }
        parse_sample_id(layout, &body[body.len() - len..], kind)
    };
    Ok(match kind {
        kind::SAMPLE => {
            let (role, layout) = layouts.of_sample(record).ok_or(ParseError {
                kind,
                what: "sample of an event this recording did not open",
            })?;
            let mut s = parse_sample(layout, &mut c)?;
            s.role = role;
            PerfRecord::Sample(s)
        }
        kind::MMAP2 | kind::MMAP => {
            let (pid, tid) = c.u32_pair()?;
            let (addr, len, pgoff) = (c.u64()?, c.u64()?, c.u64()?);
            let mut build_id = None;
            let mut prot = libc::PROT_EXEC as u32;
            if kind == kind::MMAP2 {
                let ids = c.bytes(24)?;
                if misc & MISC_MMAP_BUILD_ID != 0 {
                    let n = (ids[0] as usize).min(20);
                    build_id = Some(&ids[4..4 + n]);
                }
                prot = c.u32()?;
                let _flags = c.u32()?;
            }
            let id = trailer(&c)?;
            let name_end = body.len() - layout.sample_id_len();
            let filename = c_str(&body[c.pos..name_end]);
            PerfRecord::Mmap2(Mmap2Record {
                pid,
                tid,
                addr,
                len,
                pgoff,
                build_id,
                prot,
                filename,
                id,
            })
        }
        kind::COMM => {
            let (pid, tid) = c.u32_pair()?;
            let id = trailer(&c)?;
            let name_end = body.len() - layout.sample_id_len();
            PerfRecord::Comm {
                pid,
                tid,
                name: c_str(&body[c.pos..name_end]),
                exec: misc & MISC_COMM_EXEC != 0,
                id,
            }
        }
        kind::FORK | kind::EXIT => {
            let (pid, ppid) = c.u32_pair()?;
            let (tid, ptid) = c.u32_pair()?;
            let time = c.u64()?;
            if kind == kind::FORK {
                PerfRecord::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                }
            } else {
                PerfRecord::Exit { pid, tid, time }
            }
        }
        kind::LOST => {
            let _id = c.u64()?;
            let lost = c.u64()?;
            PerfRecord::Lost {
                lost,
                id: trailer(&c)?,
            }
        }
        kind::LOST_SAMPLES => {
            let lost = c.u64()?;
            PerfRecord::LostSamples {
                lost,
                id: trailer(&c)?,
            }
        }
        kind::THROTTLE | kind::UNTHROTTLE => PerfRecord::Throttle { time: c.u64()? },
        kind::SWITCH => PerfRecord::Switch {
            out: misc & MISC_SWITCH_OUT != 0,
            preempted: misc & MISC_SWITCH_OUT_PREEMPT != 0,
            id: trailer(&c)?,
        },
        other => PerfRecord::Other { kind: other },
    })
}

/// A NUL-terminated name. Bytes that are not UTF-8 (Linux paths and
/// thread names may hold any) become U+FFFD rather than losing the name:
/// the image is then read through its mapping, not its path.
fn c_str(bytes: &[u8]) -> Cow<'_, str> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
}

fn parse_sample_id(layout: &Layout, data: &[u8], kind: u32) -> Result<SampleId, ParseError> {
    let mut c = Cursor { data, pos: 0, kind };
    let t = layout.sample_type;
    let mut id = SampleId::default();
    if t & sample::TID != 0 {
        let (pid, tid) = c.u32_pair()?;
        id.pid = Some(pid);
        id.tid = Some(tid);
    }
    if t & sample::TIME != 0 {
        id.time = Some(c.u64()?);
    }
    if t & sample::ID != 0 {
        c.u64()?;
    }
    if t & sample::STREAM_ID != 0 {
        c.u64()?;
    }
    if t & sample::CPU != 0 {
        id.cpu = Some(c.u32_pair()?.0);
    }
    Ok(id)
}

fn parse_sample<'a>(layout: &Layout, c: &mut Cursor<'a>) -> Result<SampleRecord<'a>, ParseError> {
    let t = layout.sample_type;
    let unsupported = sample::ADDR | sample::READ | sample::BRANCH_STACK;
    if t & unsupported != 0 {
        return Err(ParseError {
            kind: kind::SAMPLE,
            what: "sample type has fields this parser does not read",
        });
    }
    let mut s = SampleRecord::default();
    if t & sample::IDENTIFIER != 0 {
        c.u64()?;
    }
    if t & sample::IP != 0 {
        c.u64()?;
    }
    if t & sample::TID != 0 {
        (s.pid, s.tid) = c.u32_pair()?;
    }
    if t & sample::TIME != 0 {
        s.time = c.u64()?;
    }
    if t & sample::ID != 0 {
        c.u64()?;
    }
    if t & sample::STREAM_ID != 0 {
        c.u64()?;
    }
    if t & sample::CPU != 0 {
        s.cpu = Some(c.u32_pair()?.0);
    }
    if t & sample::PERIOD != 0 {
        s.period = c.u64()?;
    }
    if t & sample::CALLCHAIN != 0 {
        let nr = c.u64()?;
        // Bounded by the record itself, which is at most 64 KiB.
        if nr > (c.data.len() / 8) as u64 {
            return Err(ParseError {
                kind: kind::SAMPLE,
                what: "callchain longer than the record",
            });
        }
        // One allocation, not one per doubling: the user part is at most
        // the whole chain.
        s.callchain.reserve_exact(nr as usize);
        // Each part of the chain follows its context marker: kernel
        // frames first, then (after PERF_CONTEXT_USER) the user ones.
        let mut in_kernel = false;
        for _ in 0..nr {
            let ip = c.u64()?;
            if ip >= PERF_CONTEXT_MAX {
                in_kernel = ip == PERF_CONTEXT_KERNEL;
            } else if in_kernel {
                s.kernel_callchain.push(ip);
            } else {
                s.callchain.push(ip);
            }
        }
    }
    if t & sample::RAW != 0 {
        // The size counts the padding that aligns the record to 8 bytes.
        let size = c.u32()? as usize;
        s.raw = c.bytes(size)?;
    }
    if t & sample::REGS_USER != 0 {
        let abi = c.u64()?;
        s.abi32 = abi == PERF_SAMPLE_REGS_ABI_32;
        if abi != 0 {
            let keep = layout.user_regs <= MAX_USER_REGS;
            for i in 0..layout.user_regs {
                let value = c.u64()?;
                if keep {
                    s.regs.values[i] = value;
                }
            }
            if keep {
                s.regs.len = layout.user_regs;
            }
        }
    }
    if t & sample::STACK_USER != 0 {
        // The cursor reads the body, after the 8-byte perf header.
        s.stack_offset = 8 + c.pos;
        let size = c.u64()? as usize;
        if size != 0 {
            let data = c.bytes(size)?;
            let dyn_size = (c.u64()? as usize).min(size);
            s.stack = &data[..dyn_size];
        }
    }
    Ok(s)
}

/// The body of the `perf_records` fuzz target (see `crate::fuzz`).
pub(crate) fn fuzz_records(data: &[u8]) {
    let Some((head, buf)) = data.split_first_chunk::<9>() else {
        return;
    };
    let (sample_type, regs) = head.split_at(8);
    let layout = Layouts::single(
        Role::Cpu,
        Layout {
            sample_type: u64::from_le_bytes(sample_type.try_into().expect("8 bytes")),
            // The popcount of a 64-bit register mask.
            user_regs: usize::from(regs[0]) % 65,
        },
    );
    let mut compacted = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let n = super::ring::compact_samples(&layout, &buf[pos..], &mut compacted, 4096);
        assert!(n > 0, "compaction made no progress");
        pos += n;
    }
    let mut after = split_records(&compacted);
    for (kind, misc, record) in split_records(buf) {
        let before = parse_record(&layout, kind, misc, record);
        // Each whole record comes out as one record.
        let (kind2, misc2, record2) = after.next().expect("a record per record");
        assert_eq!((kind, misc), (kind2, misc2));
        if let Ok(PerfRecord::Sample(sample)) = before {
            let again = parse_record(&layout, kind2, misc2, record2);
            assert_eq!(again, Ok(PerfRecord::Sample(sample)));
        }
    }
    // Long stacks taken out whole, or as the blocks that changed since the
    // thread's earlier copies: put together again, they are the same.
    use super::replica::{Followers, Rebuilt, Replicas};
    use super::ring::{Chunk, ChunkPool, Detached, Keeper};
    let pool = ChunkPool::default();
    let mut keeper = Keeper::new(usize::from(regs[0] >> 6));
    let (mut whole, mut delta) = (Chunk::default(), Chunk::default());
    for (_, _, record) in split_records(buf) {
        whole.push_record(&layout, record, &pool, None);
        delta.push_record(&layout, record, &pool, Some(&mut keeper));
    }
    assert_eq!(whole.bytes, delta.bytes);
    assert_eq!(whole.stacks.len(), delta.stacks.len());
    let (mut replicas, mut found) = (Replicas::default(), Rebuilt::default());
    let mut followers = Followers::default();
    for (id, (w, d)) in whole.stacks.iter().zip(&delta.stacks).enumerate() {
        assert_eq!(w.at, d.at);
        let Detached::Whole(bytes) = &w.stack else {
            panic!("a stack without a keeper went as a delta")
        };
        match &d.stack {
            Detached::Whole(b) => assert_eq!(b, bytes),
            Detached::Delta(x) => {
                let again = replicas.rebuild(x, &delta.deltas, id as u64, &mut found);
                assert_eq!(again, Ok(()));
                let held = replicas.view(x.pid, x.tid, x.sp, x.len as usize);
                assert_eq!(held, Some(&bytes[..]));
                // And a second time, as the samples are written.
                let later = followers.log(x, &delta.deltas).expect("logged");
                assert_eq!(followers.bytes(&later), Ok(&bytes[..]));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::linux::attr::SAMPLE_ID_BITS;

    /// The layout the recorder asks for, shared with the ring buffer tests.
    pub(crate) const LAYOUT: Layout = Layout {
        sample_type: sample::TID
            | sample::TIME
            | sample::CPU
            | sample::PERIOD
            | sample::CALLCHAIN
            | sample::REGS_USER
            | sample::STACK_USER,
        user_regs: 3,
    };

    /// The four events of a recording of CPU samples, syscalls and
    /// switches, with ids 1 to 4.
    pub(crate) fn multi() -> Layouts {
        let common = SAMPLE_ID_BITS | sample::CALLCHAIN;
        let regs = sample::REGS_USER | sample::STACK_USER;
        let mut l = Layouts::new();
        for (id, role, sample_type, user_regs) in [
            (1, Role::Cpu, common | sample::PERIOD | regs, 3),
            (2, Role::SyscallEnter, common | sample::RAW | regs, 3),
            (3, Role::SyscallExit, SAMPLE_ID_BITS | sample::RAW, 0),
            (4, Role::Switch, common | regs, 3),
        ] {
            l.insert(
                id,
                role,
                Layout {
                    sample_type,
                    user_regs,
                },
            );
        }
        l
    }

    /// [`LAYOUT`] for every record.
    pub(crate) fn single() -> Layouts {
        Layouts::single(Role::Cpu, LAYOUT)
    }

    fn header(kind: u32, misc: u16, body_len: usize) -> Vec<u8> {
        let mut v = kind.to_ne_bytes().to_vec();
        v.extend(misc.to_ne_bytes());
        v.extend(((body_len + 8) as u16).to_ne_bytes());
        v
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// sample_id trailer: pid 10, tid 11, time 5000, cpu 1 (+ reserved).
    fn trailer() -> Vec<u8> {
        let mut v = u32s(&[10, 11]);
        v.extend(u64s(&[5000]));
        v.extend(u32s(&[1, 0]));
        v
    }

    #[test]
    fn sample_id_length_counts_the_requested_fields() {
        assert_eq!(LAYOUT.sample_id_len(), 24);
    }

    /// A sample as the kernel writes it for [`LAYOUT`], with 8 of its 16
    /// bytes of stack copy live.
    #[rustfmt::skip]
    fn sample_record() -> Vec<u8> {
        let mut body = Vec::new();
        body.extend(u32s(&[10, 11]));           // pid, tid
        body.extend(u64s(&[123_456]));          // time
        body.extend(u32s(&[1, 0]));             // cpu, reserved
        body.extend(u64s(&[1_000_000]));        // period
        body.extend(u64s(&[3]));                // callchain nr
        body.extend(u64s(&[-512i64 as u64]));   // PERF_CONTEXT_USER marker
        body.extend(u64s(&[0x401000, 0x401100])); // ip, return address
        body.extend(u64s(&[2]));                // regs abi: 64-bit
        body.extend(u64s(&[0x7ff0, 0x7fe0, 0x401000])); // bp, sp, ip
        body.extend(u64s(&[16]));               // stack size
        body.extend([7u8; 16]);                 // stack data
        body.extend(u64s(&[8]));                // dyn_size: only 8 live bytes
        let mut rec = header(kind::SAMPLE, 2, body.len());
        rec.extend(&body);
        rec
    }

    #[rustfmt::skip]
    #[test]
    fn parses_a_sample() {
        let rec = sample_record();
        let parsed = parse_record(&single(), kind::SAMPLE, 2, &rec).unwrap();
        let PerfRecord::Sample(s) = parsed else { panic!("not a sample: {parsed:?}") };
        assert_eq!((s.pid, s.tid, s.time, s.cpu, s.period), (10, 11, 123_456, Some(1), 1_000_000));
        assert_eq!(s.callchain, [0x401000, 0x401100]);
        assert_eq!(*s.regs, [0x7ff0, 0x7fe0, 0x401000]);
        assert_eq!(s.stack, &[7u8; 8]);
        // header 8, pid/tid 8, time 8, cpu 8, period 8, callchain 32, regs 32
        assert_eq!(s.stack_offset, 104);
        assert!(!s.abi32);
        // The same registers of a 32-bit task (`PERF_SAMPLE_REGS_ABI_32`).
        let mut rec = rec.clone();
        rec[72..80].copy_from_slice(&1u64.to_ne_bytes());
        let parsed = parse_record(&single(), kind::SAMPLE, 2, &rec).unwrap();
        let PerfRecord::Sample(s) = parsed else { panic!("not a sample: {parsed:?}") };
        assert!(s.abi32);
        assert_eq!(*s.regs, [0x7ff0, 0x7fe0, 0x401000]);
    }

    #[rustfmt::skip]
    #[test]
    fn kernel_and_user_parts_of_a_callchain_are_split() {
        let mut body = u64s(&[10 | (11 << 32)]);  // pid, tid
        body.extend(u64s(&[123_456]));            // time
        body.extend(u32s(&[1, 0]));               // cpu, reserved
        body.extend(u64s(&[1_000_000]));          // period
        body.extend(u64s(&[6]));                  // callchain nr
        body.extend(u64s(&[-128i64 as u64]));     // PERF_CONTEXT_KERNEL marker
        body.extend(u64s(&[0xffff_ffff_8100_0010, 0xffff_ffff_8100_0200])); // kernel ip, return
        body.extend(u64s(&[-512i64 as u64]));     // PERF_CONTEXT_USER marker
        body.extend(u64s(&[0x401000, 0x401100])); // user ip, return address
        body.extend(u64s(&[0]));                  // regs abi: none (kernel thread)
        body.extend(u64s(&[0]));                  // stack size 0
        let rec = [header(kind::SAMPLE, 1, body.len()), body].concat();
        let PerfRecord::Sample(s) = parse_record(&single(), kind::SAMPLE, 1, &rec).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(s.kernel_callchain, [0xffff_ffff_8100_0010, 0xffff_ffff_8100_0200]);
        assert_eq!(s.callchain, [0x401000, 0x401100]);
        assert!(s.regs.is_empty());
    }

    /// The fuzz target's checks hold on what the kernel writes: samples
    /// compacted, whole or cut short, still parse the same.
    #[test]
    fn fuzz_entry_accepts_kernel_records() {
        let mut data = LAYOUT.sample_type.to_le_bytes().to_vec();
        data.push(LAYOUT.user_regs as u8);
        for _ in 0..3 {
            data.extend(sample_record());
        }
        for len in 0..=data.len() {
            fuzz_records(&data[..len]);
        }
    }

    /// More registers than a sample keeps: none are kept (they could not
    /// convert), and what follows them still parses.
    #[rustfmt::skip]
    #[test]
    fn too_many_registers_are_skipped_whole() {
        let layout = Layout { user_regs: MAX_USER_REGS + 1, ..LAYOUT };
        let mut body = u64s(&[10 | (11 << 32)]);  // pid, tid
        body.extend(u64s(&[123_456]));            // time
        body.extend(u32s(&[1, 0]));               // cpu, reserved
        body.extend(u64s(&[1_000_000]));          // period
        body.extend(u64s(&[2, -512i64 as u64, 0x401000])); // callchain
        body.extend(u64s(&[2]));                  // regs abi: 64-bit
        body.extend(u64s(&[7; MAX_USER_REGS + 1]));
        body.extend(u64s(&[8]));                  // stack size
        body.extend([5u8; 8]);                    // stack data
        body.extend(u64s(&[8]));                  // dyn_size
        let rec = [header(kind::SAMPLE, 2, body.len()), body].concat();
        let layouts = Layouts::single(Role::Cpu, layout);
        let PerfRecord::Sample(s) = parse_record(&layouts, kind::SAMPLE, 2, &rec).unwrap() else {
            panic!("not a sample")
        };
        assert!(s.regs.is_empty());
        assert_eq!(s.callchain, [0x401000]);
        assert_eq!(s.stack, &[5u8; 8]);
        // A sample with as many as are kept keeps them all.
        let layout = Layout { user_regs: MAX_USER_REGS, ..LAYOUT };
        let mut body = u64s(&[10 | (11 << 32), 123_456, 1, 1_000_000, 0, 2]);
        body.extend((1..=MAX_USER_REGS as u64).flat_map(|r| r.to_ne_bytes()));
        body.extend(u64s(&[0]));                  // stack size 0
        let rec = [header(kind::SAMPLE, 2, body.len()), body].concat();
        let layouts = Layouts::single(Role::Cpu, layout);
        let PerfRecord::Sample(s) = parse_record(&layouts, kind::SAMPLE, 2, &rec).unwrap() else {
            panic!("not a sample")
        };
        assert_eq!(*s.regs, (1..=MAX_USER_REGS as u64).collect::<Vec<_>>()[..]);
    }

    #[rustfmt::skip]
    #[test]
    fn sample_without_registers_or_stack() {
        let mut body = Vec::new();
        body.extend(u32s(&[1, 2]));             // pid, tid
        body.extend(u64s(&[9]));                // time
        body.extend(u32s(&[0, 0]));             // cpu, reserved
        body.extend(u64s(&[1]));                // period
        body.extend(u64s(&[0]));                // callchain nr
        body.extend(u64s(&[0]));                // regs abi: none
        body.extend(u64s(&[0]));                // stack size 0: no data, no dyn_size
        let mut rec = header(kind::SAMPLE, 0, body.len());
        rec.extend(&body);
        let PerfRecord::Sample(s) = parse_record(&single(), kind::SAMPLE, 0, &rec).unwrap() else {
            panic!()
        };
        assert!(s.regs.is_empty() && s.stack.is_empty() && s.callchain.is_empty());
    }

    #[test]
    fn truncated_sample_is_an_error() {
        let body = u32s(&[10, 11]);
        let mut rec = header(kind::SAMPLE, 0, body.len());
        rec.extend(&body);
        assert!(parse_record(&single(), kind::SAMPLE, 0, &rec).is_err());
    }

    #[test]
    fn huge_callchain_count_is_an_error() {
        let mut body = u32s(&[1, 2]);
        body.extend(u64s(&[9, 0, 1, u64::MAX]));
        let mut rec = header(kind::SAMPLE, 0, body.len());
        rec.extend(&body);
        assert!(parse_record(&single(), kind::SAMPLE, 0, &rec).is_err());
    }

    #[rustfmt::skip]
    #[test]
    fn parses_mmap2_with_build_id() {
        let mut body = Vec::new();
        body.extend(u32s(&[10, 10]));                 // pid, tid
        body.extend(u64s(&[0x7f00_0000_0000, 0x2000, 0x1000])); // addr, len, pgoff
        body.extend([3u8, 0, 0, 0]);                  // build_id_size 3, reserved
        body.extend([0xab, 0xcd, 0xef]);              // build id
        body.extend([0u8; 17]);                       // rest of the 20-byte id
        body.extend(u32s(&[5, 2]));                   // prot (READ|EXEC), flags
        body.extend(b"/lib/libx.so\0\0\0\0");         // filename, NUL-padded to 8
        body.extend(trailer());
        let mut rec = header(kind::MMAP2, MISC_MMAP_BUILD_ID, body.len());
        rec.extend(&body);
        let PerfRecord::Mmap2(m) = parse_record(&single(), kind::MMAP2, MISC_MMAP_BUILD_ID, &rec).unwrap() else {
            panic!()
        };
        assert_eq!((m.addr, m.len, m.pgoff, m.prot), (0x7f00_0000_0000, 0x2000, 0x1000, 5));
        assert_eq!(m.build_id, Some(&[0xab, 0xcd, 0xef][..]));
        assert_eq!(m.filename, "/lib/libx.so");
        assert_eq!(m.id.time, Some(5000));
    }

    #[rustfmt::skip]
    #[test]
    fn parses_mmap2_without_build_id() {
        let mut body = Vec::new();
        body.extend(u32s(&[10, 10]));                 // pid, tid
        body.extend(u64s(&[0x1000, 0x1000, 0]));      // addr, len, pgoff
        body.extend(u32s(&[8, 1]));                   // maj, min
        body.extend(u64s(&[42, 0]));                  // ino, ino_generation
        body.extend(u32s(&[4, 2]));                   // prot (EXEC), flags
        body.extend(b"[vdso]\0\0");                   // filename
        body.extend(trailer());
        let mut rec = header(kind::MMAP2, 0, body.len());
        rec.extend(&body);
        let PerfRecord::Mmap2(m) = parse_record(&single(), kind::MMAP2, 0, &rec).unwrap() else {
            panic!()
        };
        assert_eq!(m.build_id, None);
        assert_eq!(m.filename, "[vdso]");
    }

    #[rustfmt::skip]
    #[test]
    fn parses_comm_exec_fork_exit_lost() {
        let mut body = u32s(&[10, 12]);               // pid, tid
        body.extend(b"worker\0\0");                   // comm, NUL-padded
        body.extend(trailer());
        let mut rec = header(kind::COMM, MISC_COMM_EXEC, body.len());
        rec.extend(&body);
        assert_eq!(
            parse_record(&single(), kind::COMM, MISC_COMM_EXEC, &rec).unwrap(),
            PerfRecord::Comm { pid: 10, tid: 12, name: "worker".into(), exec: true, id: SampleId {
                pid: Some(10), tid: Some(11), time: Some(5000), cpu: Some(1) } }
        );

        let mut body = u32s(&[20, 10, 21, 11]);       // pid, ppid, tid, ptid
        body.extend(u64s(&[777]));                    // time
        body.extend(trailer());
        let mut rec = header(kind::FORK, 0, body.len());
        rec.extend(&body);
        assert_eq!(
            parse_record(&single(), kind::FORK, 0, &rec).unwrap(),
            PerfRecord::Fork { pid: 20, ppid: 10, tid: 21, ptid: 11, time: 777 }
        );
        let mut rec = header(kind::EXIT, 0, body.len());
        rec.extend(&body);
        assert_eq!(
            parse_record(&single(), kind::EXIT, 0, &rec).unwrap(),
            PerfRecord::Exit { pid: 20, tid: 21, time: 777 }
        );

        let mut body = u64s(&[99, 5]);                // id, lost
        body.extend(trailer());
        let mut rec = header(kind::LOST, 0, body.len());
        rec.extend(&body);
        let PerfRecord::Lost { lost, id } = parse_record(&single(), kind::LOST, 0, &rec).unwrap() else {
            panic!()
        };
        assert_eq!((lost, id.time), (5, Some(5000)));
    }

    /// A syscall entry of the [`multi`] layouts (event 2): write(3, 0x1000, 5)
    /// with a 16-byte stack copy, 8 bytes live.
    #[rustfmt::skip]
    pub(crate) fn syscall_enter_record() -> Vec<u8> {
        let mut body = Vec::new();
        body.extend(u64s(&[2]));                // identifier: event 2
        body.extend(u32s(&[10, 11]));           // pid, tid
        body.extend(u64s(&[7000]));             // time
        body.extend(u32s(&[1, 0]));             // cpu, reserved
        body.extend(u64s(&[1, 0x401000]));      // callchain: nr 1, ip
        body.extend(u32s(&[68]));               // raw size: 64 bytes + 4 padding
        body.extend([0u8; 8]);                  // common fields
        body.extend(u64s(&[1]));                // id: write
        body.extend(u64s(&[3, 0x1000, 5, 0, 0, 0])); // args
        body.extend([0u8; 4]);                  // padding
        body.extend(u64s(&[2, 0x7ff0, 0x7fe0, 0x401000])); // regs abi, bp sp ip
        body.extend(u64s(&[16]));               // stack size
        body.extend([7u8; 16]);                 // stack data
        body.extend(u64s(&[8]));                // dyn_size
        let mut rec = header(kind::SAMPLE, 0, body.len());
        rec.extend(&body);
        rec
    }

    #[test]
    fn samples_are_parsed_by_their_event() {
        let rec = syscall_enter_record();
        let PerfRecord::Sample(s) = parse_record(&multi(), kind::SAMPLE, 0, &rec).unwrap() else {
            panic!()
        };
        assert_eq!(
            (s.role, s.pid, s.tid, s.time, s.cpu),
            (Role::SyscallEnter, 10, 11, 7000, Some(1))
        );
        assert_eq!(s.raw.len(), 68);
        assert_eq!(&s.raw[8..16], &1u64.to_ne_bytes());
        assert_eq!((s.regs.len(), s.stack.len()), (3, 8));
        // Compaction drops the dead half of the stack and keeps the rest.
        let mut out = Vec::new();
        super::super::ring::compact_samples(&multi(), &rec, &mut out, usize::MAX);
        assert_eq!(out.len(), rec.len() - 8);
        assert_eq!(
            parse_record(&multi(), kind::SAMPLE, 0, &out),
            parse_record(&multi(), kind::SAMPLE, 0, &rec)
        );
        // An event this recording did not open is an error, not a guess.
        let mut unknown = rec.clone();
        unknown[8..16].copy_from_slice(&9u64.to_ne_bytes());
        assert!(parse_record(&multi(), kind::SAMPLE, 0, &unknown).is_err());
    }

    #[rustfmt::skip]
    #[test]
    fn parses_switch_records() {
        let mut body = u32s(&[10, 11]);             // sample_id: pid, tid
        body.extend(u64s(&[9000]));                 // time
        body.extend(u32s(&[1, 0]));                 // cpu, reserved
        body.extend(u64s(&[4]));                    // identifier
        let misc = MISC_SWITCH_OUT | MISC_SWITCH_OUT_PREEMPT;
        let mut rec = header(kind::SWITCH, misc, body.len());
        rec.extend(&body);
        let PerfRecord::Switch { out, preempted, id } = parse_record(&multi(), kind::SWITCH, misc, &rec).unwrap() else {
            panic!()
        };
        assert!(out && preempted);
        assert_eq!((id.pid, id.tid, id.time), (Some(10), Some(11), Some(9000)));
        let PerfRecord::Switch { out, .. } = parse_record(&multi(), kind::SWITCH, 0, &rec).unwrap() else {
            panic!()
        };
        assert!(!out, "a switch-in");
    }

    #[test]
    fn splits_a_buffer_and_stops_at_garbage() {
        let mut buf = header(kind::THROTTLE, 0, 8);
        buf.extend(u64s(&[1]));
        buf.extend(header(99, 0, 0));
        buf.extend([0u8; 8]); // a header claiming size 0
        let kinds: Vec<u32> = split_records(&buf).map(|(k, _, _)| k).collect();
        assert_eq!(kinds, [kind::THROTTLE, 99]);
    }
}
