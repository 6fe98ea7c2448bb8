//! Every sample as `perf script` prints it, for the tools that read that
//! text (inferno's `collapse-perf`, the importers of speedscope and the
//! Firefox Profiler, FlameScope, scripts): in time order, one block per
//! sample, a line with the thread, time, weight and value, then its frames
//! leaf first (a tab, the address, the function, the image), each inline
//! level on its own line, and a blank line:
//!
//! ```text
//! worker 4121/4124 0.123456: 1000000 cpu:
//!             1139 compute (/usr/bin/app)
//!             11c4 main (/usr/bin/app)
//!
//! ```
//!
//! Times are seconds since the recording started; weights are amounts of
//! the value views show (nanoseconds on CPU by default). Addresses are
//! those of [`Location::address`](crate::profile::Location): in an image,
//! its address as the file states it, for return addresses one byte back.
//! Kernel frames are in `[kernel.kallsyms]`, as perf names the kernel.

use super::ProfileWriter;
use crate::profile::Profile;
use std::fmt::Write as _;
use std::io::{self, Write};

/// Writes `perf script` text.
pub struct ScriptWriter;

impl ProfileWriter for ScriptWriter {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let value = profile.shown_value().map_or("samples", |v| v.name());
        let start = profile.header.start_time.0;
        // Every thread's samples, merged in time order (a thread's first on
        // equal times).
        let mut samples: Vec<(u64, usize, &crate::profile::SequenceEntry)> = profile
            .sequences
            .iter()
            .enumerate()
            .flat_map(|(thread, seq)| seq.iter().map(move |e| (e.time.0, thread, e)))
            .collect();
        samples.sort_by_key(|&(time, thread, _)| (time, thread));
        let mut line = String::new();
        for (time, thread, e) in samples {
            let t = &profile.threads[thread];
            let since = time.saturating_sub(start);
            // The name it had then, as perf prints it.
            let comm = t
                .name_at(lrnprof_format::Timestamp(time))
                .map_or("?", |n| n.as_str());
            line.clear();
            let _ = writeln!(
                line,
                "{comm} {}/{} {}.{:06}: {} {value}:",
                t.pid.0,
                t.tid.0,
                since / 1_000_000_000,
                since % 1_000_000_000 / 1000,
                e.weight
            );
            let stack = &profile.stacks[e.stack as usize];
            for &l in &stack.locations {
                let loc = &profile.locations[l as usize];
                let image = match loc.image.and_then(|i| profile.images.get(i as usize)) {
                    Some(i) => i.path.as_str(),
                    // Kernel frames (`--kernel`), named as perf names
                    // them: tools mark such frames by it.
                    None if loc.address >> 63 == 1 => "[kernel.kallsyms]",
                    None => "[unknown]",
                };
                for level in &loc.lines {
                    let function = &profile.functions[level.function as usize].name;
                    let _ = writeln!(line, "\t{:>16x} {function} ({image})", loc.address);
                }
            }
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testing;

    #[test]
    fn samples_in_time_order_with_their_frames() {
        let profile = testing::profile();
        let mut out = Vec::new();
        ScriptWriter.write(&profile, &mut out).unwrap();
        testing::check_expected("script.txt", &out);
    }

    #[test]
    fn kernel_frames_are_in_the_kernel_image() {
        let mut profile = testing::profile();
        let unknown = profile
            .locations
            .iter_mut()
            .find(|l| l.image.is_none())
            .unwrap();
        unknown.address = 0xffff_ffff_8100_1234;
        let mut out = Vec::new();
        ScriptWriter.write(&profile, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("\tffffffff81001234 0x1234 ([kernel.kallsyms])\n"),
            "{text}"
        );
    }

    /// inferno's reader of `perf script` text (`collapse-perf`) finds the
    /// profile's stacks, each weighted by its samples' weights (it counts
    /// perf's periods): nanoseconds on CPU here.
    #[test]
    fn inferno_collapses_it_into_the_profile_stacks() {
        use inferno::collapse::perf::{Folder, Options};
        use inferno::collapse::Collapse;
        let profile = testing::profile();
        let mut text = Vec::new();
        ScriptWriter.write(&profile, &mut text).unwrap();
        let mut options = Options::default();
        options.include_tid = true;
        options.nthreads = 1;
        let mut folded = Vec::new();
        Folder::from(options)
            .collapse(&text[..], &mut folded)
            .unwrap();
        let folded = String::from_utf8(folded).unwrap();
        assert_eq!(
            folded,
            "?-1/11;0x1234 1000000\n\
             main-1/10;main;other 1000000\n\
             main-1/10;main;work;leaf 3000000\n"
        );
    }
}
