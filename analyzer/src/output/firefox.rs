//! Firefox Profiler's processed profile format (what samply writes, open
//! it on profiler.firefox.com), built with fxprof-processed-profile: one
//! process per pid, one track per thread with every sample at its time
//! (a timeline as well as the call tree), frames named after functions
//! (inline levels included) in a category per image.
//!
//! The crate takes integer weights and has no source positions, so two
//! columns are written here after it serialized: each sample's weight as
//! the shown value (`--value`) in the profiler's units (milliseconds for
//! time, bytes, counts), and each function's source file and line. Only
//! CPU time fills the CPU-usage column of the activity graph; for other
//! values the graph counts samples.

use super::ProfileWriter;
use crate::profile::{Profile, SequenceEntry, ValueKind};
use crate::units::count_name;
use fxprof_processed_profile::{
    CategoryColor, CategoryHandle, CategoryPairHandle, CpuDelta, Frame, FrameFlags, FrameInfo,
    Profile as FxProfile, ReferenceTimestamp, SamplingInterval, StackHandle, ThreadHandle,
    Timestamp, WeightType,
};
use serde_json::value::{to_raw_value, RawValue};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

/// Writes Firefox Profiler JSON. Needs each sample in
/// [`Profile::sequences`] (`keep_sequences` and `every_sample`) for exact
/// times; with runs it places each run at its first sample, without
/// sequences every stack at the start.
#[derive(Debug, Clone, Copy, Default)]
pub struct FirefoxWriter;

/// A JSON object whose members stay as written, but for those replaced.
type RawObject = BTreeMap<String, Box<RawValue>>;

/// What is written into a thread's JSON after the crate serialized it.
struct ThreadPatch {
    /// Each sample's weight, in time order.
    weights: Vec<serde_json::Number>,
    /// Whether the thread keeps its CPU-usage column.
    cpu_deltas: bool,
}

impl ProfileWriter for FirefoxWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let kind = profile.shown_value();
        let index = kind.and_then(|k| profile.value_index(k));
        let weight_type = match kind.map(count_name) {
            Some("ns") => WeightType::TracingMs,
            Some("bytes") => WeightType::Bytes,
            _ => WeightType::Samples,
        };
        let cpu = kind == Some(ValueKind::Cpu);
        let header = &profile.header;
        let interval = match header.sampling.frequency_hz {
            0 => SamplingInterval::from_millis(1),
            hz => SamplingInterval::from_nanos(1_000_000_000 / u64::from(hz)),
        };
        let mut fx = FxProfile::new(
            &profile.trace_name,
            ReferenceTimestamp::from_duration_since_unix_epoch(Duration::from_nanos(
                header.start_wall_ns,
            )),
            interval,
        );
        fx.set_os_name(&format!("{:?} {:?}", header.os, header.arch));
        fx.set_symbolicated(true);
        let start = header.start_time.0;
        let at = |t: lrnprof_format::Timestamp| {
            Timestamp::from_nanos_since_reference(t.0.saturating_sub(start))
        };

        let labels = labels(profile);
        let mut frames = FrameMaker::new(&mut fx, profile);
        let mut processes = HashMap::new();
        let mut tid_uses: HashMap<u32, u32> = HashMap::new();
        let mut patches: HashMap<String, ThreadPatch> = HashMap::new();
        for (i, thread) in profile.threads.iter().enumerate() {
            // A thread the filters left out; one never sampled keeps its
            // (empty) track: every recorded thread is there.
            if thread.samples == 0 && thread.trace_samples > 0 {
                continue;
            }
            let samples = thread_samples(profile, i, index);
            let first = samples
                .first()
                .map_or(Timestamp::from_nanos_since_reference(0), |e| at(e.time));
            let pid = thread.pid.0;
            let process = *processes
                .entry(pid)
                .or_insert_with(|| fx.add_process(&process_name(profile, pid), pid, first));
            let handle = fx.add_thread(process, thread.tid.0, first, thread.tid.0 == pid);
            fx.set_thread_name(
                handle,
                thread
                    .name
                    .as_deref()
                    .unwrap_or(&format!("tid-{}", thread.tid.0)),
            );
            fx.set_thread_samples_weight_type(handle, weight_type.clone());
            let mut stacks: HashMap<u32, Option<StackHandle>> = HashMap::new();
            let mut weights = Vec::with_capacity(samples.len());
            for e in &samples {
                let stack = *stacks
                    .entry(e.stack)
                    .or_insert_with(|| frames.stack(&mut fx, handle, e.stack, &labels));
                let delta = if cpu {
                    CpuDelta::from_nanos(e.weight)
                } else {
                    CpuDelta::ZERO
                };
                let weight = i32::try_from(e.weight).unwrap_or(i32::MAX);
                fx.add_sample(handle, at(e.time), stack, delta, weight);
                weights.push(match weight_type {
                    WeightType::TracingMs => serde_json::Number::from_f64(e.weight as f64 / 1e6)
                        .unwrap_or_else(|| 0.into()),
                    _ => e.weight.into(),
                });
            }
            // The crate writes tids as strings, a repeated one with a suffix.
            let uses = tid_uses.entry(thread.tid.0).or_insert(0);
            let tid = match *uses {
                0 => thread.tid.0.to_string(),
                n => format!("{}.{n}", thread.tid.0),
            };
            *uses += 1;
            patches.insert(
                tid,
                ThreadPatch {
                    weights,
                    cpu_deltas: cpu,
                },
            );
        }
        let json = serde_json::to_vec(&fx)?;
        let positions = positions(profile, &labels);
        let patched = patch(&json, &mut patches, &positions)?;
        serde_json::to_writer(&mut *out, &patched)?;
        out.write_all(b"\n")
    }
}

/// A thread's samples of the shown value in time order (the crate keeps
/// weights in the order it was given only when times never go back).
fn thread_samples(profile: &Profile, thread: usize, index: Option<usize>) -> Vec<SequenceEntry> {
    let mut samples: Vec<SequenceEntry> = match profile.sequences.get(thread) {
        Some(seq) if !seq.is_empty() => seq.clone(),
        // Without sequences: each stack once, at the start.
        _ => profile
            .stacks
            .iter()
            .enumerate()
            .filter(|(_, s)| s.thread as usize == thread)
            .filter_map(|(id, s)| {
                let weight = index.map_or(0, |x| s.values[x]);
                (weight > 0).then_some(SequenceEntry {
                    stack: id as u32,
                    time: profile.header.start_time,
                    last_time: profile.header.start_time,
                    samples: s.samples,
                    weight,
                })
            })
            .collect(),
    };
    samples.sort_by_key(|e| e.time);
    samples
}

/// The name of process `pid`: its executable's file name, else its
/// command's, else `pid PID`.
fn process_name(profile: &Profile, pid: u32) -> String {
    let p = profile.processes.iter().find(|p| p.pid == pid);
    p.and_then(|p| {
        p.executable
            .as_deref()
            .or(p.command.first().map(String::as_str))
    })
    .and_then(|path| Path::new(path).file_name())
    .map(|n| n.to_string_lossy().into_owned())
    .unwrap_or_else(|| format!("pid {pid}"))
}

/// A frame label per function: its name, with its file when another
/// function has the same name (the profiler merges functions by label).
fn labels(profile: &Profile) -> Vec<String> {
    let mut uses: HashMap<&str, u32> = HashMap::new();
    for f in &profile.functions {
        *uses.entry(&f.name).or_default() += 1;
    }
    profile
        .functions
        .iter()
        .map(|f| match (&f.file, uses[f.name.as_str()]) {
            (Some(file), n) if n > 1 => format!("{} ({file})", f.name),
            _ => f.name.clone(),
        })
        .collect()
}

/// Label -> (source file, first line) of each function whose file is known.
fn positions<'a>(
    profile: &'a Profile,
    labels: &'a [String],
) -> HashMap<&'a str, (&'a str, Option<u32>)> {
    labels
        .iter()
        .zip(&profile.functions)
        .filter_map(|(l, f)| Some((l.as_str(), (f.file.as_deref()?, f.first_line))))
        .collect()
}

/// Interns frames and stacks with their categories: code in an image is
/// "Native" with the image's file name as subcategory, frames that could
/// not be named "Unknown", the rest "Other".
struct FrameMaker<'a> {
    profile: &'a Profile,
    native: CategoryHandle,
    unknown: CategoryHandle,
    images: HashMap<u32, CategoryPairHandle>,
}

impl<'a> FrameMaker<'a> {
    fn new(fx: &mut FxProfile, profile: &'a Profile) -> FrameMaker<'a> {
        FrameMaker {
            profile,
            native: fx.add_category("Native", CategoryColor::Blue),
            unknown: fx.add_category("Unknown", CategoryColor::Gray),
            images: HashMap::new(),
        }
    }

    fn category(&mut self, fx: &mut FxProfile, location: u32) -> CategoryPairHandle {
        let loc = &self.profile.locations[location as usize];
        match loc.image {
            _ if loc.unknown => self.unknown.into(),
            None => CategoryHandle::OTHER.into(),
            Some(image) => {
                let native = self.native;
                let path = &self.profile.images[image as usize].path;
                *self.images.entry(image).or_insert_with(|| {
                    let name = Path::new(path)
                        .file_name()
                        .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned());
                    fx.add_subcategory(native, &name)
                })
            }
        }
    }

    /// The handle of stack `stack` in `thread`, root first, inline levels
    /// expanded.
    fn stack(
        &mut self,
        fx: &mut FxProfile,
        thread: ThreadHandle,
        stack: u32,
        labels: &[String],
    ) -> Option<StackHandle> {
        let mut infos = Vec::new();
        for &loc in self.profile.stacks[stack as usize].locations.iter().rev() {
            let category_pair = self.category(fx, loc);
            for line in self.profile.locations[loc as usize].lines.iter().rev() {
                infos.push(FrameInfo {
                    frame: Frame::Label(fx.intern_string(&labels[line.function as usize])),
                    category_pair,
                    flags: FrameFlags::empty(),
                });
            }
        }
        fx.intern_stack_frames(thread, infos.into_iter())
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::other(format!(
        "unexpected Firefox profile layout from fxprof-processed-profile: {what}"
    ))
}

fn raw<T: serde::Serialize + ?Sized>(value: &T) -> io::Result<Box<RawValue>> {
    Ok(to_raw_value(value)?)
}

/// `json` (the crate's profile) with each thread's weights, CPU-usage
/// column and function positions replaced.
fn patch(
    json: &[u8],
    patches: &mut HashMap<String, ThreadPatch>,
    positions: &HashMap<&str, (&str, Option<u32>)>,
) -> io::Result<RawObject> {
    let mut top: RawObject = serde_json::from_slice(json)?;
    let threads = top.get("threads").ok_or_else(|| bad("no threads"))?;
    let mut threads: Vec<RawObject> = serde_json::from_str(threads.get())?;
    for thread in &mut threads {
        let tid: String =
            serde_json::from_str(thread.get("tid").ok_or_else(|| bad("no tid"))?.get())?;
        let p = patches.remove(&tid).ok_or_else(|| bad("an unknown tid"))?;
        let samples = thread.get("samples").ok_or_else(|| bad("no samples"))?;
        let mut samples: RawObject = serde_json::from_str(samples.get())?;
        samples.insert("weight".into(), raw(&p.weights)?);
        if !p.cpu_deltas {
            samples.remove("threadCPUDelta");
        }
        thread.insert("samples".into(), raw(&samples)?);

        let strings = thread
            .get("stringArray")
            .ok_or_else(|| bad("no stringArray"))?;
        let mut strings: Vec<String> = serde_json::from_str(strings.get())?;
        let funcs = thread.get("funcTable").ok_or_else(|| bad("no funcTable"))?;
        let mut funcs: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(funcs.get())?;
        let names: Vec<usize> =
            serde_json::from_value(funcs.get("name").cloned().unwrap_or_default())?;
        let mut file_names = Vec::with_capacity(names.len());
        let mut lines = Vec::with_capacity(names.len());
        let mut file_ids: HashMap<&str, usize> = HashMap::new();
        for name in names {
            let label = strings
                .get(name)
                .ok_or_else(|| bad("a name out of range"))?;
            match positions.get(label.as_str()) {
                Some(&(file, line)) => {
                    let next = strings.len() + file_ids.len();
                    file_names.push(Some(*file_ids.entry(file).or_insert(next)));
                    lines.push(line);
                }
                None => {
                    file_names.push(None);
                    lines.push(None);
                }
            }
        }
        let mut new_files: Vec<(&str, usize)> = file_ids.into_iter().collect();
        new_files.sort_by_key(|&(_, id)| id);
        strings.extend(new_files.into_iter().map(|(f, _)| f.to_string()));
        funcs.insert("fileName".into(), serde_json::to_value(file_names)?);
        funcs.insert("lineNumber".into(), serde_json::to_value(lines)?);
        thread.insert("funcTable".into(), raw(&funcs)?);
        thread.insert("stringArray".into(), raw(&strings)?);
    }
    if !patches.is_empty() {
        return Err(bad("a thread missing"));
    }
    top.insert("threads".into(), raw(&threads)?);
    Ok(top)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};
    use serde_json::Value;

    fn written(p: &Profile) -> Value {
        let mut out = Vec::new();
        FirefoxWriter.write(p, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn expected_output() {
        let mut out = Vec::new();
        FirefoxWriter.write(&profile(), &mut out).unwrap();
        check_expected("small.firefox.json", &out);
    }

    #[test]
    fn threads_samples_times_weights_and_positions() {
        let v = written(&profile());
        let threads = v["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 2);
        let main = threads.iter().find(|t| t["name"] == "main").unwrap();
        assert_eq!(main["tid"], "10");
        assert_eq!(main["pid"], "1");
        let s = &main["samples"];
        assert_eq!(s["weightType"], "tracing-ms");
        // Three entries at 1, 3 and 4 ms (the first a run of two samples).
        assert_eq!(s["weight"], serde_json::json!([2.0, 1.0, 1.0]));
        assert_eq!(s["timeDeltas"], serde_json::json!([1.0, 2.0, 1.0]));
        assert_eq!(s["threadCPUDelta"].as_array().unwrap().len(), 3);
        // leaf is inlined into work: a stack main -> work -> leaf.
        let strings: Vec<&str> = main["stringArray"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let funcs = &main["funcTable"];
        let n = funcs["length"].as_u64().unwrap() as usize;
        let mut named = BTreeMap::new();
        for i in 0..n {
            let name = strings[funcs["name"][i].as_u64().unwrap() as usize];
            let file = funcs["fileName"][i].as_u64().map(|f| strings[f as usize]);
            named.insert(name, (file, funcs["lineNumber"][i].as_u64()));
        }
        assert_eq!(named["leaf"], (Some("a.c"), Some(3)));
        assert_eq!(named["main"], (Some("a.c"), Some(20)));
        assert_eq!(named["other"], (None, None));
        assert_eq!(v["meta"]["categories"][1]["name"], "Native");
    }

    #[test]
    fn counts_without_cpu_column() {
        let mut p = profile();
        p.selected = Some(ValueKind::Samples);
        p.sequences.clear();
        let v = written(&p);
        let s = &v["threads"][0]["samples"];
        assert_eq!(s["weightType"], "samples");
        assert!(s.get("threadCPUDelta").is_none());
        // Without sequences: one sample per stack, weights are counts.
        assert_eq!(s["weight"], serde_json::json!([3, 1]));
    }
}
