//! pprof: gzipped `profile.proto`, as `go tool pprof`, Pyroscope and
//! friends read it. One sample type per value the trace recorded
//! (`samples/count` and `cpu/nanoseconds` or `cycles/count` for CPU
//! samples, `alloc_objects/count`, `alloc_space/bytes`,
//! `inuse_objects/count`, `inuse_space/bytes` for allocations,
//! `syscalls/count`, `syscall_time/nanoseconds`, `off_cpu/nanoseconds`),
//! so `-sample_index=NAME` picks one; the default sample type is the
//! selected value (or the primary one). The thread name, tid and pid are
//! sample labels. Addresses are SVMAs of their image (one mapping per
//! image), or AVMAs outside images.

use super::gzip::write_gzip;
use super::proto::Message;
use super::ProfileWriter;
use crate::profile::{Profile, ValueKind};
use flate2::Compression;
use rustc_hash::FxHashMap;
use std::io::{self, Write};

/// Writes gzipped pprof protobuf.
#[derive(Debug, Clone, Copy, Default)]
pub struct PprofWriter;

/// The string table, interned in insertion order ("" first).
struct Strings {
    table: Vec<String>,
    ids: FxHashMap<String, u64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings {
            table: Vec::new(),
            ids: FxHashMap::default(),
        };
        s.id("");
        s
    }
    fn id(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.table.len() as u64;
        self.table.push(s.to_string());
        self.ids.insert(s.to_string(), i);
        i
    }
}

fn value_type(strings: &mut Strings, ty: &str, unit: &str) -> Message {
    let mut m = Message::default();
    m.int(1, strings.id(ty) as i64)
        .int(2, strings.id(unit) as i64);
    m
}

/// The process `pid` of `profile` (processes are sorted by pid).
fn process_of(profile: &Profile, pid: u32) -> Option<&crate::profile::ProcessInfo> {
    let i = profile
        .processes
        .binary_search_by_key(&pid, |p| p.pid)
        .ok()?;
    profile.processes.get(i)
}

/// The labels (field 3 of a `Sample`) of the stacks of `profile`'s thread
/// number `t`: thread, tid, pid, and its process's name and cgroup.
fn thread_labels(profile: &Profile, t: usize, strings: &mut Strings) -> Message {
    let thread = &profile.threads[t];
    let mut s = Message::default();
    let mut label = Message::default();
    label.int(1, strings.id("thread") as i64);
    label.int(2, strings.id(&thread.label()) as i64);
    s.message(3, &label);
    for (key, num) in [("tid", thread.tid.0), ("pid", thread.pid.0)] {
        let mut label = Message::default();
        label.int(1, strings.id(key) as i64).int(3, i64::from(num));
        s.message(3, &label);
    }
    if let Some(p) = process_of(profile, thread.pid.0) {
        for (key, text) in [("process", &p.name), ("cgroup", &p.cgroup)] {
            if let Some(text) = text {
                let mut label = Message::default();
                label.int(1, strings.id(key) as i64);
                label.int(2, strings.id(text) as i64);
                s.message(3, &label);
            }
        }
    }
    s
}

/// The encoded (not yet gzipped) profile.
pub(crate) fn encode(profile: &Profile) -> Vec<u8> {
    let mut strings = Strings::new();
    let mut p = Message::default();
    for kind in &profile.value_kinds {
        let t = value_type(&mut strings, kind.name(), kind.unit());
        p.message(1, &t);
    }

    // A thread's labels are the same on each of its stacks: encoded once,
    // at its first stack, so string ids still follow first use.
    let mut labels: Vec<Option<Vec<u8>>> = vec![None; profile.threads.len()];
    let mut s = Message::default();
    let mut scratch = Vec::new();
    for stack in &profile.stacks {
        let t = stack.thread as usize;
        s.buf.clear();
        s.packed_with(
            1,
            stack.locations.iter().map(|&l| u64::from(l) + 1),
            &mut scratch,
        );
        s.packed_with(2, stack.values.iter().copied(), &mut scratch);
        let encoded = labels[t].get_or_insert_with(|| thread_labels(profile, t, &mut strings).buf);
        s.buf.extend_from_slice(encoded);
        p.message(2, &s);
    }

    // One mapping per image that holds frames, ids in image order.
    let mut limits = vec![0u64; profile.images.len()];
    let mut has_lines = vec![false; profile.images.len()];
    let mut has_inline = vec![false; profile.images.len()];
    let mut all_known = vec![true; profile.images.len()];
    for loc in &profile.locations {
        if let Some(i) = loc.image {
            let i = i as usize;
            limits[i] = limits[i].max(loc.address.saturating_add(1));
            has_lines[i] |= loc.lines.iter().any(|l| l.line.is_some());
            has_inline[i] |= loc.lines.len() > 1;
            all_known[i] &= !loc.unknown;
        }
    }
    let mut mapping_ids = vec![0u64; profile.images.len()];
    let mut next = 1;
    for (i, image) in profile.images.iter().enumerate() {
        if limits[i] == 0 {
            continue;
        }
        mapping_ids[i] = next;
        let mut m = Message::default();
        m.uint(1, next)
            .uint(2, 0)
            .uint(3, limits[i])
            .uint(4, 0)
            .int(5, strings.id(&image.path) as i64)
            // A content id is lrnprof's: pprof would take it for a build id
            // that a local binary must have.
            .int(
                6,
                strings.id(image
                    .build_id
                    .as_deref()
                    .filter(|_| !image.content_id)
                    .unwrap_or("")) as i64,
            )
            .uint(7, u64::from(all_known[i]))
            .uint(8, u64::from(has_lines[i]))
            .uint(9, u64::from(has_lines[i]))
            .uint(10, u64::from(has_inline[i]));
        p.message(3, &m);
        next += 1;
    }

    for (id, loc) in profile.locations.iter().enumerate() {
        let mut m = Message::default();
        m.uint(1, id as u64 + 1);
        if let Some(i) = loc.image {
            m.uint(2, mapping_ids[i as usize]);
        }
        m.uint(3, loc.address);
        for l in &loc.lines {
            let mut line = Message::default();
            line.uint(1, u64::from(l.function) + 1)
                .int(2, l.line.map_or(0, i64::from));
            m.message(4, &line);
        }
        p.message(4, &m);
    }

    for (id, f) in profile.functions.iter().enumerate() {
        let mut m = Message::default();
        let name = strings.id(&f.name) as i64;
        m.uint(1, id as u64 + 1)
            .int(2, name)
            .int(3, name)
            .int(4, strings.id(f.file.as_deref().unwrap_or("")) as i64)
            .int(5, f.first_line.map_or(0, i64::from));
        p.message(5, &m);
    }

    let (period_type, period) = period(profile, &mut strings);
    let comment = strings.id(&format!("recorded by {}", profile.header.recorder));
    // A plain CPU profile leaves the default to pprof (its last sample
    // type, the CPU time); anything else names it.
    let classic = profile.value_kinds == [ValueKind::Samples, ValueKind::Cpu];
    let default_type = match profile.shown_value() {
        Some(v) if !classic || profile.selected.is_some() => Some(strings.id(v.name())),
        _ => None,
    };
    let strings_table = std::mem::take(&mut strings.table);
    for s in &strings_table {
        p.bytes(6, s.as_bytes());
    }
    p.int(9, profile.header.start_wall_ns as i64)
        .int(10, profile.stats.duration_ns as i64)
        .message(11, &period_type)
        .int(12, period)
        .packed(13, [comment]);
    if let Some(id) = default_type {
        p.int(14, id as i64);
    }
    p.buf
}

/// pprof's period type and period: what one sample stands for.
fn period(profile: &Profile, strings: &mut Strings) -> (Message, i64) {
    match profile.primary_value() {
        Some(ValueKind::Cycles) => {
            // Sampled at a frequency: the period varies; give the mean.
            let (samples, cycles) = profile.stacks.iter().fold((0u64, 0u64), |(n, c), s| {
                (
                    n + profile.value(s, ValueKind::Samples),
                    c.saturating_add(profile.value(s, ValueKind::Cycles)),
                )
            });
            let mean = cycles.checked_div(samples).unwrap_or(0);
            (value_type(strings, "cycles", "count"), mean as i64)
        }
        Some(ValueKind::InuseSpace) => {
            let interval = profile
                .header
                .events
                .heap
                .as_ref()
                .map_or(0, |h| h.mean_interval);
            (value_type(strings, "space", "bytes"), interval as i64)
        }
        Some(ValueKind::SyscallTime) => (value_type(strings, "syscalls", "count"), 1),
        Some(ValueKind::OffCpu) => (value_type(strings, "off_cpu", "nanoseconds"), 0),
        _ => {
            let freq = u64::from(profile.header.sampling.frequency_hz.max(1));
            (
                value_type(strings, "cpu", "nanoseconds"),
                (1_000_000_000 / freq) as i64,
            )
        }
    }
}

impl ProfileWriter for PprofWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        // The gzip header has no file name and mtime 0: output is deterministic.
        // Level 2 (Go's runtime/pprof writes at its fastest level): on a
        // python profile of 358 KB, 79 KB instead of 71 KB at the default
        // level, the whole analysis 5 % faster (level 1, zlib-rs's quick
        // strategy, gave 97 KB). Compressed in pieces on the workers.
        write_gzip(&encode(profile), Compression::new(2), out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};

    /// Render an encoded profile as text, one field per line, nested
    /// messages indented, strings quoted: what a reviewer can diff.
    fn render(buf: &[u8], path: &str, depth: usize, out: &mut String) {
        // Which length-delimited fields are messages, strings or packed.
        let kind = |field: u64| -> &str {
            match (path, field) {
                ("profile", 1 | 11) => "ValueType",
                ("profile", 2) => "Sample",
                ("profile", 3) => "Mapping",
                ("profile", 4) => "Location",
                ("profile", 5) => "Function",
                ("profile", 6) => "string",
                ("Sample", 3) => "Label",
                ("Location", 4) => "Line",
                _ => "packed",
            }
        };
        let varint = |buf: &[u8], at: &mut usize| {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let b = buf[*at];
                *at += 1;
                v |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b < 0x80 {
                    return v;
                }
            }
        };
        let mut at = 0;
        while at < buf.len() {
            let key = varint(buf, &mut at);
            let (field, wire) = (key >> 3, key & 7);
            let pad = "  ".repeat(depth);
            if wire == 0 {
                let v = varint(buf, &mut at);
                out.push_str(&format!("{pad}{field}: {v}\n"));
                continue;
            }
            assert_eq!(wire, 2, "unexpected wire type");
            let len = varint(buf, &mut at) as usize;
            let body = &buf[at..at + len];
            at += len;
            match kind(field) {
                "string" => out.push_str(&format!(
                    "{pad}{field}: {:?}\n",
                    String::from_utf8_lossy(body)
                )),
                "packed" => {
                    let mut i = 0;
                    let mut vals = Vec::new();
                    while i < body.len() {
                        vals.push(varint(body, &mut i).to_string());
                    }
                    out.push_str(&format!("{pad}{field}: [{}]\n", vals.join(", ")));
                }
                message => {
                    out.push_str(&format!("{pad}{field} {message} {{\n"));
                    render(body, message, depth + 1, out);
                    out.push_str(&format!("{pad}}}\n"));
                }
            }
        }
    }

    #[test]
    fn expected_output() {
        // The uncompressed protobuf, rendered as text.
        let mut text = String::new();
        render(&encode(&profile()), "profile", 0, &mut text);
        check_expected("small.pprof.txt", text.as_bytes());
    }

    #[test]
    fn gzipped_and_deterministic() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        PprofWriter.write(&profile(), &mut a).unwrap();
        PprofWriter.write(&profile(), &mut b).unwrap();
        assert_eq!(&a[..2], &[0x1f, 0x8b]);
        assert_eq!(a, b);
    }
}
