//! The programs the comparison profiles.

use crate::error::BenchError;
use crate::synthetic::Rng;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One program to profile, with its arguments.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Short name for tables.
    pub name: String,
    /// What it is and why it is here, one line.
    pub what: String,
    /// Program and arguments.
    pub argv: Vec<OsString>,
    /// Whether the program does a fixed amount of work (so a profiler's cost
    /// shows as extra CPU time). Fixed-time programs burn CPU until a clock
    /// runs out: their CPU time hides whatever the profiler costs inside the
    /// target, so no overhead is reported for them.
    pub fixed_work: bool,
    /// Exit codes that mean success (`rec_threads` exits with 7 on purpose).
    pub ok_exit_codes: Vec<i32>,
}

impl Workload {
    /// A command running the workload.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]);
        c
    }
}

/// A C workload built from source.
struct CProgram {
    name: &'static str,
    source: PathBuf,
    flags: &'static [&'static str],
    args: Vec<String>,
    fixed_work: bool,
    what: &'static str,
}

/// Build or generate every workload that this machine can run into `dir`.
/// `scale` multiplies the amount of work (1.0 takes about 1.5 CPU-seconds
/// each). Workloads that cannot be prepared are left out with a note.
pub fn prepare(
    repo: &Path,
    dir: &Path,
    scale: f64,
) -> Result<(Vec<Workload>, Vec<String>), BenchError> {
    let mut workloads = Vec::new();
    let mut notes = Vec::new();
    let fixtures = repo.join("tests/fixtures");
    let ms = format!("{:.0}", 1500.0 * scale);
    let c_programs = [
        CProgram {
            name: "rec_deep",
            source: fixtures.join("rec_deep.c"),
            flags: &[],
            args: vec![ms.clone()],
            fixed_work: false,
            what: "tests/fixtures/rec_deep.c: 300 frames, ~40 KiB of stack under the leaf; runs for a fixed time",
        },
        CProgram {
            name: "rec_threads",
            source: fixtures.join("rec_threads.c"),
            flags: &["-pthread"],
            args: vec![ms],
            fixed_work: false,
            what: "tests/fixtures/rec_threads.c: two named busy threads on the 2 cores; runs for a fixed time",
        },
        CProgram {
            name: "deep_work",
            source: repo.join("benches/workloads/deep_work.c"),
            flags: &[],
            args: vec![format!("{:.0}", 50_000.0 * scale)],
            fixed_work: true,
            what: "benches/workloads/deep_work.c: rec_deep's call tree with a fixed amount of work",
        },
    ];
    for CProgram {
        name,
        source,
        flags: extra,
        args,
        fixed_work,
        what,
    } in c_programs
    {
        if !source.exists() {
            notes.push(format!(
                "{name} left out: {} does not exist",
                source.display()
            ));
            continue;
        }
        let exe = dir.join(name);
        let out = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
            .args(["-O2", "-fomit-frame-pointer", "-g", "-I"])
            .arg(&fixtures)
            .arg("-o")
            .arg(&exe)
            .arg(&source)
            .args(extra)
            .output();
        match out {
            Ok(o) if o.status.success() => workloads.push(Workload {
                name: name.into(),
                what: what.into(),
                argv: std::iter::once(exe.into_os_string())
                    .chain(args.into_iter().map(OsString::from))
                    .collect(),
                fixed_work,
                ok_exit_codes: if name == "rec_threads" {
                    vec![7]
                } else {
                    vec![0]
                },
            }),
            Ok(o) => notes.push(format!(
                "{name} left out: cc failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            )),
            Err(e) => notes.push(format!("{name} left out: cannot run cc ({e}); install gcc")),
        }
    }

    let python = Path::new("/usr/bin/python3");
    if python.exists() {
        workloads.push(Workload {
            name: "python3".into(),
            what:
                "the system's /usr/bin/python3 running benches/workloads/cpu_heavy.py (fixed work)"
                    .into(),
            argv: vec![
                python.into(),
                repo.join("benches/workloads/cpu_heavy.py").into(),
                format!("{:.0}", 500.0 * scale).into(),
            ],
            fixed_work: true,
            ok_exit_codes: vec![0],
        });
    } else {
        notes.push("python3 left out: /usr/bin/python3 is not installed".into());
    }

    let xz = Path::new("/usr/bin/xz");
    if xz.exists() {
        let data = dir.join("text.txt");
        let len = (2.0 * 1024.0 * 1024.0 * scale) as usize;
        std::fs::write(&data, pseudo_text(len, 1))
            .map_err(|e| BenchError::io(format!("write {}", data.display()), e))?;
        workloads.push(Workload {
            name: "xz".into(),
            what: format!(
                "the system's xz -T1 -6 compressing {:.1} MiB of generated text (fixed work)",
                len as f64 / (1024.0 * 1024.0)
            ),
            argv: vec![
                xz.into(),
                "-T1".into(),
                "-6".into(),
                "-c".into(),
                data.into(),
            ],
            fixed_work: true,
            ok_exit_codes: vec![0],
        });
    } else {
        notes.push("xz left out: /usr/bin/xz is not installed (apt-get install xz-utils)".into());
    }
    Ok((workloads, notes))
}

/// `len` bytes of space-separated words drawn from a fixed vocabulary: text
/// that compresses like prose, the same on every run.
pub fn pseudo_text(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    const LETTERS: &[u8] = b"etaoinshrdlucmfwypvbgk";
    let vocabulary: Vec<Vec<u8>> = (0..3000)
        .map(|_| {
            let n = 2 + rng.below(8) as usize;
            (0..n)
                .map(|_| LETTERS[rng.below(LETTERS.len() as u64) as usize])
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(&vocabulary[rng.below(vocabulary.len() as u64) as usize]);
        out.push(if rng.below(12) == 0 { b'\n' } else { b' ' });
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_text_is_deterministic_words() {
        let a = pseudo_text(10_000, 1);
        assert_eq!(a.len(), 10_000);
        assert_eq!(a, pseudo_text(10_000, 1));
        assert_ne!(a, pseudo_text(10_000, 2));
        let words = a
            .split(|b| *b == b' ' || *b == b'\n')
            .filter(|w| !w.is_empty())
            .count();
        assert!(words > 1000, "{words} words");
        assert!(a
            .iter()
            .all(|b| b.is_ascii_lowercase() || *b == b' ' || *b == b'\n'));
    }
}
