//! Output writers, one file each, behind [`ProfileWriter`].

mod firefox;
mod folded;
mod gzip;
mod pprof;
mod proto;
mod script;
mod speedscope;
mod svg;

pub use firefox::FirefoxWriter;
pub use folded::FoldedWriter;
pub use pprof::PprofWriter;
pub use script::ScriptWriter;
pub use speedscope::SpeedscopeWriter;
pub use svg::SvgWriter;

pub(crate) use folded::folded_lines;
pub(crate) use svg::{thread_root, FlameGraph};

use crate::options::AnalyzeOptions;
use crate::profile::Profile;
use std::io::{self, Write};

/// Turns a [`Profile`] into one output format. Output must be
/// deterministic: the same profile gives the same bytes.
pub trait ProfileWriter {
    /// Write `profile` to `out`.
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()>;
}

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Gzipped pprof `profile.proto`.
    Pprof,
    /// Folded stacks (`root;...;leaf COUNT`), for flamegraph.pl and inferno.
    Folded,
    /// speedscope's JSON file format.
    Speedscope,
    /// An interactive flame graph, one self-contained SVG file.
    Svg,
    /// Firefox Profiler's processed profile JSON, with a timeline per thread.
    Firefox,
    /// Every sample as `perf script` prints it.
    Script,
}

impl OutputFormat {
    /// Every format, in the order `--format` lists them.
    pub const ALL: [OutputFormat; 6] = [
        OutputFormat::Pprof,
        OutputFormat::Folded,
        OutputFormat::Speedscope,
        OutputFormat::Svg,
        OutputFormat::Firefox,
        OutputFormat::Script,
    ];

    /// The usual file extension, appended to the trace path by default.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Pprof => "pb.gz",
            OutputFormat::Folded => "folded",
            OutputFormat::Speedscope => "speedscope.json",
            OutputFormat::Svg => "svg",
            OutputFormat::Firefox => "firefox.json",
            OutputFormat::Script => "script.txt",
        }
    }

    /// Ask `options` for what this format's writer reads besides stacks:
    /// samples in time order for speedscope, each sample at its time for
    /// the Firefox Profiler and `perf script` text.
    pub fn configure(self, options: &mut AnalyzeOptions) {
        let every = matches!(self, OutputFormat::Firefox | OutputFormat::Script);
        options.keep_sequences = every || self == OutputFormat::Speedscope;
        options.every_sample = every;
    }

    /// The writer for this format.
    pub fn writer(self) -> Box<dyn ProfileWriter> {
        match self {
            OutputFormat::Pprof => Box::new(PprofWriter),
            OutputFormat::Folded => Box::new(FoldedWriter),
            OutputFormat::Speedscope => Box::new(SpeedscopeWriter),
            OutputFormat::Svg => Box::new(SvgWriter),
            OutputFormat::Firefox => Box::new(FirefoxWriter),
            OutputFormat::Script => Box::new(ScriptWriter),
        }
    }
}

/// The uncompressed pprof protobuf of `profile`, for tests.
#[cfg(test)]
pub(crate) fn pprof_bytes(profile: &Profile) -> Vec<u8> {
    pprof::encode(profile)
}

#[cfg(test)]
pub(crate) mod testing {
    //! A small hand-made profile shared by the writers' tests, and the
    //! expected-file check (`LRNPROF_BLESS=1` rewrites the files).

    use crate::profile::*;
    use lrnprof_format::{Pid, Tid, Timestamp, TraceHeader};
    use std::path::PathBuf;

    /// Thread "main" (tid 10): main->work->leaf x3 (leaf inlined into
    /// work), main->other x1; thread 11 unnamed: 0x1234 (unknown) x1.
    pub fn profile() -> Profile {
        let f = |name: &str, file: Option<&str>, first_line| Function {
            name: name.into(),
            file: file.map(Into::into),
            first_line,
        };
        let ll = |function, line| LocationLine { function, line };
        Profile {
            header: TraceHeader::example(),
            trace_name: "t.lpt".into(),
            threads: vec![
                ThreadProfile {
                    pid: Pid(1),
                    tid: Tid(10),
                    name: Some("main".into()),
                    names: Vec::new(),
                    trace_samples: 4,
                    samples: 4,
                    values: vec![4, 4_000_000],
                    root_samples: 4,
                    idle_ticks: 0,
                },
                ThreadProfile {
                    pid: Pid(1),
                    tid: Tid(11),
                    name: None,
                    names: Vec::new(),
                    trace_samples: 1,
                    samples: 1,
                    values: vec![1, 1_000_000],
                    root_samples: 0,
                    idle_ticks: 0,
                },
            ],
            processes: vec![],
            images: vec![ImageInfo {
                path: "/bin/prog".into(),
                build_id: Some("abcd".into()),
                unwind_data: "/bin/prog".into(),
                symbol_data: "/bin/prog".into(),
                has_debug_info: true,
                notes: vec![],
                frames: 9,
                jit: false,
                content_id: false,
            }],
            functions: vec![
                f("leaf", Some("a.c"), Some(3)),
                f("work", Some("a.c"), Some(10)),
                f("main", Some("a.c"), Some(20)),
                f("other", None, None),
                f("0x1234", None, None),
            ],
            locations: vec![
                Location {
                    image: Some(0),
                    address: 0x1100,
                    lines: vec![ll(0, Some(3)), ll(1, Some(12))],
                    unknown: false,
                },
                Location {
                    image: Some(0),
                    address: 0x1200,
                    lines: vec![ll(2, Some(21))],
                    unknown: false,
                },
                Location {
                    image: Some(0),
                    address: 0x1300,
                    lines: vec![ll(3, None)],
                    unknown: false,
                },
                Location {
                    image: None,
                    address: 0x1234,
                    lines: vec![ll(4, None)],
                    unknown: true,
                },
            ],
            stacks: vec![
                Stack {
                    thread: 0,
                    locations: vec![0, 1],
                    samples: 3,
                    values: vec![3, 3_000_000],
                    root_samples: 3,
                    kind_samples: [3, 0, 0, 0],
                },
                Stack {
                    thread: 0,
                    locations: vec![2, 1],
                    samples: 1,
                    values: vec![1, 1_000_000],
                    root_samples: 1,
                    kind_samples: [1, 0, 0, 0],
                },
                Stack {
                    thread: 1,
                    locations: vec![3],
                    samples: 1,
                    values: vec![1, 1_000_000],
                    root_samples: 0,
                    kind_samples: [1, 0, 0, 0],
                },
            ],
            sequences: vec![
                vec![
                    SequenceEntry {
                        stack: 0,
                        time: Timestamp(1_000_000),
                        last_time: Timestamp(2_000_000),
                        samples: 2,
                        weight: 2_000_000,
                    },
                    SequenceEntry {
                        stack: 1,
                        time: Timestamp(3_000_000),
                        last_time: Timestamp(3_000_000),
                        samples: 1,
                        weight: 1_000_000,
                    },
                    SequenceEntry {
                        stack: 0,
                        time: Timestamp(4_000_000),
                        last_time: Timestamp(4_000_000),
                        samples: 1,
                        weight: 1_000_000,
                    },
                ],
                vec![SequenceEntry {
                    stack: 2,
                    time: Timestamp(1_500_000),
                    last_time: Timestamp(1_500_000),
                    samples: 1,
                    weight: 1_000_000,
                }],
            ],
            value_kinds: vec![ValueKind::Samples, ValueKind::Cpu],
            selected: None,
            stats: Stats::default(),
            warnings: vec![],
        }
    }

    /// Compare `actual` with `analyzer/testdata/NAME`, or rewrite it when
    /// `LRNPROF_BLESS=1`.
    pub fn check_expected(name: &str, actual: &[u8]) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name);
        if std::env::var_os("LRNPROF_BLESS").is_some_and(|v| v == "1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, actual).unwrap();
            return;
        }
        let expected = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with LRNPROF_BLESS=1 to create it",
                path.display()
            )
        });
        assert!(
            expected == actual,
            "{} differs from the output; review and run with LRNPROF_BLESS=1 to update.\nactual:\n{}",
            path.display(),
            String::from_utf8_lossy(actual)
        );
    }
}
