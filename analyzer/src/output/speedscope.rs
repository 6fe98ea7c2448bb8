//! speedscope's file format
//! (<https://www.speedscope.app/file-format-schema.json>): one `sampled`
//! profile per thread, samples in time order (runs of identical
//! consecutive stacks merged into one weighted sample), stacks root-first,
//! weights in the shown value's unit (nanoseconds of CPU time by default;
//! bytes, or plain counts for cycles and other counts). Frames are
//! functions.

use super::ProfileWriter;
use crate::profile::Profile;
use serde::Serialize;
use std::io::{self, Write};

/// Writes speedscope JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpeedscopeWriter;

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: &'a str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<Frame<'a>>,
}

#[derive(Serialize)]
struct Frame<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    ty: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<u32>>,
    weights: Vec<u64>,
}

/// Function ids of a stack, root first, inline levels expanded.
fn frame_ids(profile: &Profile, stack: u32) -> Vec<u32> {
    let stack = &profile.stacks[stack as usize];
    let mut out = Vec::new();
    for &loc in stack.locations.iter().rev() {
        for l in profile.locations[loc as usize].lines.iter().rev() {
            out.push(l.function);
        }
    }
    out
}

impl ProfileWriter for SpeedscopeWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let frames = profile
            .functions
            .iter()
            .map(|f| Frame {
                name: &f.name,
                file: f.file.as_deref(),
                line: f.first_line,
            })
            .collect();
        let start = profile.header.start_time.0;
        let value = profile.shown_value();
        let index = value.and_then(|v| profile.value_index(v));
        let unit = match value.map(|v| v.unit()) {
            Some("nanoseconds") => "nanoseconds",
            Some("bytes") => "bytes",
            _ => "none",
        };
        let mut profiles = Vec::new();
        for (i, thread) in profile.threads.iter().enumerate() {
            let mut samples = Vec::new();
            let mut weights = Vec::new();
            let mut first = None;
            match profile.sequences.get(i).filter(|s| !s.is_empty()) {
                Some(seq) => {
                    for e in seq {
                        first.get_or_insert(e.time.0);
                        samples.push(frame_ids(profile, e.stack));
                        weights.push(e.weight);
                    }
                }
                // Without sequences: one sample per unique stack.
                None => {
                    for (id, s) in profile.stacks.iter().enumerate() {
                        let weight = index.map_or(0, |x| s.values[x]);
                        if s.thread as usize == i && weight > 0 {
                            samples.push(frame_ids(profile, id as u32));
                            weights.push(weight);
                        }
                    }
                }
            }
            if samples.is_empty() {
                continue;
            }
            // Only time places samples on the recording's timeline.
            let start_value = match unit {
                "nanoseconds" => first.map_or(0, |t| t.saturating_sub(start)),
                _ => 0,
            };
            profiles.push(SampledProfile {
                ty: "sampled",
                name: thread.label(),
                unit,
                start_value,
                end_value: weights
                    .iter()
                    .fold(start_value, |a, &w| a.saturating_add(w)),
                samples,
                weights,
            });
        }
        let file = File {
            schema: "https://www.speedscope.app/file-format-schema.json",
            shared: Shared { frames },
            profiles,
            name: &profile.trace_name,
            active_profile_index: 0,
            exporter: format!("lrnprof-analyze {}", env!("CARGO_PKG_VERSION")),
        };
        serde_json::to_writer(&mut *out, &file)?;
        out.write_all(b"\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing::{check_expected, profile};

    #[test]
    fn expected_output() {
        let mut out = Vec::new();
        SpeedscopeWriter.write(&profile(), &mut out).unwrap();
        check_expected("small.speedscope.json", &out);
    }
}
