//! Building a [`Profile`] from unwound samples: streaming aggregation in
//! sample order, then, once each unique frame is symbolicated, functions,
//! locations, roots, totals and warnings.

use super::{
    hex, primary, Amounts, Function, ImageInfo, Location, LocationLine, ProcessInfo, Profile,
    SequenceEntry, Stack, Stats, ThreadProfile, ValueKind,
};
use crate::image::Source;
use crate::pipeline::{FrameKey, Prepared};
use crate::symbolicate::Resolved;
use lrnprof_format::TraceReader;
use std::collections::HashMap;

/// Outermost functions that mean a stack reached its thread's root.
const ROOT_FUNCTIONS: &[&str] = &[
    "_start",
    // The dynamic loader's entry code after `_start`, while it runs the
    // libraries' constructors (glibc).
    "_dl_start_user",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__GI___clone",
    "__GI___clone3",
    "thread_start",
    "_pthread_start",
    "pthread_start",
    "start",
];

/// One sample after unwinding, as the builder takes it.
pub(crate) struct UnwoundSample {
    /// Index into the timeline's threads.
    pub thread: u32,
    pub time: lrnprof_format::Timestamp,
    /// What the sample adds to each value.
    pub amounts: Amounts,
    /// Leaf first.
    pub frames: Vec<FrameKey>,
    /// Whether the unwinder stopped cleanly (at a zero return address).
    pub clean: bool,
    pub used_kernel_chain: bool,
    /// Whether the sample came unwound (a stripped trace).
    pub presymbolized: bool,
}

/// Builds a [`Profile`]: [`add`](Self::add) every sample in trace order,
/// symbolicate [`frames`](Self::frames), then [`finish`](Self::finish).
/// Ids are given in first-seen order, so the result does not depend on how
/// work was split between threads.
pub(crate) struct ProfileBuilder {
    frames: Vec<FrameKey>,
    frame_ids: HashMap<FrameKey, u32>,
    stacks: Vec<Stack>,
    stack_clean: Vec<u64>,
    stack_amounts: Vec<Amounts>,
    stack_ids: HashMap<(u32, Vec<u32>), u32>,
    sequences: Vec<Vec<SequenceEntry>>,
    /// The value sequences weigh; `None`: no sequences kept.
    sequence_value: Option<ValueKind>,
    /// Whether consecutive samples with the same stack share an entry.
    merge_runs: bool,
    thread_samples: Vec<u64>,
    thread_amounts: Vec<Amounts>,
    value_kinds: Vec<ValueKind>,
    selected: Option<ValueKind>,
    kernel_chain: u64,
    presymbolized: u64,
}

impl ProfileBuilder {
    /// For the timeline's `threads` and a profile of `value_kinds`, of
    /// which the user `selected` one; with `keep_sequences`, each thread's
    /// samples in time order too ([`Profile::sequences`]), one entry per
    /// run of samples with the same stack unless `every_sample`.
    pub fn new(
        threads: usize,
        keep_sequences: bool,
        every_sample: bool,
        value_kinds: Vec<ValueKind>,
        selected: Option<ValueKind>,
    ) -> ProfileBuilder {
        let sequence_value = if keep_sequences {
            selected.or_else(|| primary(&value_kinds))
        } else {
            None
        };
        ProfileBuilder {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: Vec::new(),
            stack_clean: Vec::new(),
            stack_amounts: Vec::new(),
            stack_ids: HashMap::new(),
            sequences: vec![Vec::new(); threads],
            sequence_value,
            merge_runs: !every_sample,
            thread_samples: vec![0; threads],
            thread_amounts: vec![Amounts::default(); threads],
            value_kinds,
            selected,
            kernel_chain: 0,
            presymbolized: 0,
        }
    }

    /// Count one sample (in trace order).
    pub fn add(&mut self, u: UnwoundSample) {
        let ids: Vec<u32> = u
            .frames
            .iter()
            .map(|f| {
                let next = self.frames.len() as u32;
                *self.frame_ids.entry(*f).or_insert_with(|| {
                    self.frames.push(*f);
                    next
                })
            })
            .collect();
        let next = self.stacks.len() as u32;
        let stacks = &mut self.stacks;
        let clean = &mut self.stack_clean;
        let stack_amounts = &mut self.stack_amounts;
        let id = *self
            .stack_ids
            .entry((u.thread, ids))
            .or_insert_with_key(|(thread, ids)| {
                stacks.push(Stack {
                    thread: *thread,
                    locations: ids.clone(),
                    samples: 0,
                    values: Vec::new(),
                    root_samples: 0,
                });
                clean.push(0);
                stack_amounts.push(Amounts::default());
                next
            });
        self.stacks[id as usize].samples += 1;
        self.stack_amounts[id as usize].add(&u.amounts);
        self.stack_clean[id as usize] += u64::from(u.clean);
        self.thread_samples[u.thread as usize] += 1;
        self.thread_amounts[u.thread as usize].add(&u.amounts);
        self.kernel_chain += u64::from(u.used_kernel_chain);
        self.presymbolized += u64::from(u.presymbolized);
        if let Some(kind) = self.sequence_value {
            let weight = u.amounts.get(kind);
            if weight == 0 {
                // Not an event of the value shown (or one worth nothing).
                return;
            }
            let seq = &mut self.sequences[u.thread as usize];
            match seq.last_mut() {
                Some(last) if last.stack == id && self.merge_runs => {
                    last.samples += 1;
                    last.weight = last.weight.saturating_add(weight);
                    last.last_time = u.time;
                }
                _ => seq.push(SequenceEntry {
                    stack: id,
                    time: u.time,
                    last_time: u.time,
                    samples: 1,
                    weight,
                }),
            }
        }
    }

    /// The unique frames so far, in first-seen order.
    pub fn frames(&self) -> &[FrameKey] {
        &self.frames
    }

    /// The profile, given what symbolication found for each of
    /// [`frames`](Self::frames) (in the same order).
    pub fn finish<D: AsRef<[u8]>>(
        self,
        reader: &TraceReader<D>,
        trace_name: &str,
        prepared: Prepared,
        lines: Vec<Resolved>,
    ) -> Profile {
        let Prepared {
            timeline,
            images,
            mut warnings,
            ..
        } = prepared;
        // Functions and locations in first-seen frame order.
        let mut functions: Vec<Function> = Vec::new();
        let mut function_ids: HashMap<(String, Option<String>), u32> = HashMap::new();
        let mut image_frames = vec![0u64; images.len()];
        let mut locations = Vec::with_capacity(self.frames.len());
        for (key, (frame_lines, known)) in self.frames.iter().zip(lines) {
            let lines = frame_lines
                .into_iter()
                .map(|l| {
                    let k = (l.function, l.file);
                    let next = functions.len() as u32;
                    let id = *function_ids.entry(k.clone()).or_insert_with(|| {
                        functions.push(Function {
                            name: k.0,
                            file: k.1,
                            first_line: None,
                        });
                        next
                    });
                    let f = &mut functions[id as usize];
                    if let Some(line) = l.line {
                        f.first_line = Some(f.first_line.map_or(line, |x| x.min(line)));
                    }
                    LocationLine {
                        function: id,
                        line: l.line,
                    }
                })
                .collect();
            locations.push(Location {
                image: key.image(),
                address: key.address(),
                lines,
                unknown: !known,
            });
        }

        let mut stats = Stats {
            trace_samples: timeline.samples,
            presymbolized_samples: self.presymbolized,
            kernel_callchain_samples: self.kernel_chain,
            lost_samples: timeline.lost,
            trace_bytes: reader.len(),
            finished: reader.report().finished,
            ..Default::default()
        };
        if let (Some(a), Some(b)) = (timeline.first_time, timeline.last_time) {
            stats.duration_ns = b.0 - a.0;
        }
        let mut threads: Vec<ThreadProfile> = timeline
            .threads
            .iter()
            .enumerate()
            .map(|(i, ((pid, tid), t))| ThreadProfile {
                pid: *pid,
                tid: *tid,
                name: t.name.clone(),
                trace_samples: t.samples,
                samples: self.thread_samples[i],
                values: self.thread_amounts[i].project(&self.value_kinds),
                root_samples: 0,
                idle_ticks: t.idle_ticks,
            })
            .collect();
        stats.stack_bytes = timeline.threads.values().map(|t| t.stack_bytes).sum();
        let mut stacks = self.stacks;
        for (s, amounts) in stacks.iter_mut().zip(&self.stack_amounts) {
            s.values = amounts.project(&self.value_kinds);
        }
        for (s, clean) in stacks.iter_mut().zip(self.stack_clean) {
            let outer_is_root = s.locations.last().is_some_and(|&l| {
                locations[l as usize].lines.last().is_some_and(|ll| {
                    ROOT_FUNCTIONS.contains(&functions[ll.function as usize].name.as_str())
                })
            });
            s.root_samples = if outer_is_root { s.samples } else { clean };
            stats.samples += s.samples;
            stats.root_samples += s.root_samples;
            threads[s.thread as usize].root_samples += s.root_samples;
            stats.frames += s.samples * s.locations.len() as u64;
            for &l in &s.locations {
                let loc = &locations[l as usize];
                if loc.unknown {
                    stats.unknown_frames += s.samples;
                }
                if let Some(img) = loc.image {
                    image_frames[img as usize] += s.samples;
                }
            }
        }

        let mut missing = Vec::new();
        let image_infos: Vec<ImageInfo> = images
            .iter()
            .zip(&image_frames)
            .map(|(img, &frames)| {
                let has_debug_info = img.data.as_ref().is_some_and(|d| d.has_dwarf());
                if frames > 0
                    && img.key.kind != lrnprof_format::ImageKind::Anonymous
                    && (img.unwind_source == Source::Missing
                        || img.symbol_source == Source::Missing)
                {
                    missing.push(format!(
                        "{} ({})",
                        img.key.path,
                        hex(&img.key.build_id).unwrap_or_else(|| "no build id".into())
                    ));
                }
                ImageInfo {
                    path: img.key.path.clone(),
                    build_id: hex(&img.key.build_id),
                    unwind_data: source_text(&img.unwind_source),
                    symbol_data: source_text(&img.symbol_source),
                    has_debug_info,
                    notes: img.notes.clone(),
                    frames,
                }
            })
            .collect();
        if !missing.is_empty() {
            warnings.push(format!(
                "unwind or symbol data missing for {}: give their files with --symbols DIR or record with embedded data",
                missing.join(", ")
            ));
        }
        for img in &images {
            for n in &img.notes {
                if n.starts_with("not using") {
                    warnings.push(n.clone());
                }
            }
        }
        let processes = timeline
            .processes
            .iter()
            .map(|(pid, p)| ProcessInfo {
                pid: pid.0,
                command: p.command.clone(),
                executable: p.executable.clone(),
                name: timeline
                    .threads
                    .get(&(*pid, lrnprof_format::Tid(pid.0)))
                    .and_then(|t| t.name.clone())
                    .or_else(|| {
                        let exe = p
                            .executable
                            .as_deref()
                            .or(p.command.first().map(|c| c.as_str()))?;
                        Some(exe.rsplit('/').next().unwrap_or(exe).to_string())
                    }),
                cgroup: p.cgroup.clone(),
                samples: threads
                    .iter()
                    .filter(|t| t.pid == *pid)
                    .map(|t| t.samples)
                    .sum(),
            })
            .collect();
        Profile {
            header: timeline.header,
            trace_name: trace_name.to_string(),
            threads,
            processes,
            images: image_infos,
            functions,
            locations,
            stacks,
            value_kinds: self.value_kinds,
            selected: self.selected,
            sequences: self.sequences,
            stats,
            warnings,
        }
    }
}

fn source_text(s: &Source) -> String {
    s.to_string()
}
