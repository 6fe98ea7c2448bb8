//! The comparison as markdown tables.

use crate::compare::{Analysis, Comparison, Profiler, RunFacts, Setup, TraceFacts, WorkloadResult};
use crate::measure::Measured;
use crate::stats::{median, paired, paired_overheads};
use std::fmt::Write as _;
use std::path::Path;

/// What the numbers were measured on: CPU, cores, memory, kernel, perf.
pub fn machine_description(perf: &Path) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0.0, |kib| kib as f64 / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let perf_version = std::process::Command::new(perf)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "perf not available".into());
    format!(
        "{cpu}, {cores} cores, {mem_gib:.0} GiB, Linux {}, {perf_version}",
        kernel.trim()
    )
}

fn runs(r: &WorkloadResult, setup: Setup) -> Vec<Option<RunFacts>> {
    r.runs.get(&setup).cloned().unwrap_or_default()
}

/// CPU seconds per round, `NaN` for failed rounds (so rounds stay paired).
fn cpu_per_round(r: &WorkloadResult, setup: Setup) -> Vec<f64> {
    runs(r, setup)
        .iter()
        .map(|x| x.map_or(f64::NAN, |f| f.measured.cpu_s()))
        .collect()
}

/// Median overhead of `setup` over the no-profiler baseline, in percent,
/// after taking `minus_s` CPU seconds off every profiled run.
fn overhead(r: &WorkloadResult, setup: Setup, minus_s: f64) -> Option<f64> {
    let base = cpu_per_round(
        r,
        Setup {
            profiler: Profiler::None,
            freq: 0,
        },
    );
    let prof: Vec<f64> = cpu_per_round(r, setup)
        .iter()
        .map(|c| c - minus_s)
        .collect();
    if base.is_empty() || prof.is_empty() {
        return None;
    }
    median(&paired_overheads(&base, &prof))
}

/// Per round, `a`'s overhead minus `b`'s, in points (rounds where either
/// failed left out).
fn round_differences(r: &WorkloadResult, a: Setup, b: Setup) -> Vec<f64> {
    let base = cpu_per_round(
        r,
        Setup {
            profiler: Profiler::None,
            freq: 0,
        },
    );
    let of = |setup| paired_overheads(&base, &cpu_per_round(r, setup));
    of(a)
        .iter()
        .zip(of(b))
        .map(|(a, b)| a - b)
        .filter(|d| d.is_finite())
        .collect()
}

/// Lrnprof's overhead against each other profiler's, paired by round: the
/// median difference in points, where it lies with 95 % confidence (from
/// 6 rounds on), and in how many rounds lrnprof cost less.
fn paired_table(out: &mut String, c: &Comparison) {
    let (lo, hi) = (c.options.freq, c.options.high_freq);
    let s = |profiler, freq| Setup { profiler, freq };
    let pairs = [
        (s(Profiler::Lrnprof, lo), s(Profiler::PerfFp, lo)),
        (s(Profiler::Lrnprof, hi), s(Profiler::PerfDwarf, hi)),
        (s(Profiler::Lrnprof, hi), s(Profiler::Samply, hi)),
        (s(Profiler::Lrnprof, hi), s(Profiler::LrnprofBaseline, hi)),
    ];
    let names: Vec<String> = pairs.iter().map(|(a, b)| format!("{a} − {b}")).collect();
    let mut cells = vec!["workload"];
    cells.extend(names.iter().map(String::as_str));
    header(out, &cells);
    for r in c.workloads.iter().filter(|r| r.workload.fixed_work) {
        let mut cells = vec![format!("`{}`", r.workload.name)];
        for (a, b) in pairs {
            cells.push(match paired(&round_differences(r, a, b), 0.0) {
                None => "-".into(),
                Some(p) => {
                    let (m, below, n) = (p.median, p.below, p.rounds);
                    match p.interval {
                        Some((lo, hi)) => {
                            format!("{m:+.1} ({lo:+.1} to {hi:+.1}; lower in {below} of {n})")
                        }
                        None => format!("{m:+.1} (lower in {below} of {n})"),
                    }
                }
            });
        }
        row(out, &cells);
    }
}

/// Median CPU seconds of running an empty program under `profiler` at the
/// usual rate.
fn fixed_cost(c: &Comparison, profiler: Profiler) -> Option<f64> {
    let freq = if profiler == Profiler::None {
        0
    } else {
        c.options.freq
    };
    let v: Vec<f64> = c
        .fixed_cost
        .get(&Setup { profiler, freq })?
        .iter()
        .map(Measured::cpu_s)
        .collect();
    median(&v)
}

/// Overhead of `setup`, either as measured or net of the profiler's fixed
/// cost (start-up and shut-down, measured on an empty program).
fn overhead_of(c: &Comparison, r: &WorkloadResult, setup: Setup, net: bool) -> Option<f64> {
    let minus = if net {
        fixed_cost(c, setup.profiler)? - fixed_cost(c, Profiler::None).unwrap_or(0.0)
    } else {
        0.0
    };
    overhead(r, setup, minus)
}

/// One overhead table, gross or net of fixed costs.
fn overhead_table(out: &mut String, c: &Comparison, net: bool) {
    let (lo, hi) = (c.options.freq, c.options.high_freq);
    let s = |profiler, freq| Setup { profiler, freq };
    header(
        out,
        &[
            "workload",
            "no profiler",
            &format!("perf -g @ {lo}"),
            &format!("perf dwarf @ {lo}"),
            &format!("lrnprof @ {lo}"),
            "lrnprof − perf -g",
            &format!("lrnprof --embed none @ {lo}"),
            &format!("perf -g @ {hi}"),
            &format!("perf dwarf @ {hi}"),
            &format!("lrnprof @ {hi}"),
            &format!("lrnprof --embed none @ {hi}"),
            &format!("samply @ {lo}"),
            &format!("samply @ {hi}"),
            &format!("baseline lrnprof @ {lo}"),
            &format!("baseline lrnprof @ {hi}"),
        ],
    );
    for r in c.workloads.iter().filter(|r| r.workload.fixed_work) {
        let o = |p, f| overhead_of(c, r, s(p, f), net);
        let fp = o(Profiler::PerfFp, lo);
        let lr = o(Profiler::Lrnprof, lo);
        row(
            out,
            &[
                format!("`{}`", r.workload.name),
                cell(
                    measured_median(r, s(Profiler::None, 0), Measured::cpu_s),
                    |v| format!("{v:.2} s"),
                ),
                cell(fp, pct_signed),
                cell(o(Profiler::PerfDwarf, lo), pct_signed),
                cell(lr, pct_signed),
                cell(lr.zip(fp).map(|(a, b)| a - b), |v| format!("{v:+.1} pp")),
                cell(o(Profiler::LrnprofNoEmbed, lo), pct_signed),
                cell(o(Profiler::PerfFp, hi), pct_signed),
                cell(o(Profiler::PerfDwarf, hi), pct_signed),
                cell(o(Profiler::Lrnprof, hi), pct_signed),
                cell(o(Profiler::LrnprofNoEmbed, hi), pct_signed),
                cell(o(Profiler::Samply, lo), pct_signed),
                cell(o(Profiler::Samply, hi), pct_signed),
                cell(o(Profiler::LrnprofBaseline, lo), pct_signed),
                cell(o(Profiler::LrnprofBaseline, hi), pct_signed),
            ],
        );
    }
}

fn trace_median(
    r: &WorkloadResult,
    setup: Setup,
    f: impl Fn(&TraceFacts) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = runs(r, setup)
        .iter()
        .filter_map(|x| x.as_ref()?.trace.as_ref().and_then(&f))
        .collect();
    median(&v)
}

fn measured_median(r: &WorkloadResult, setup: Setup, f: impl Fn(&Measured) -> f64) -> Option<f64> {
    let v: Vec<f64> = runs(r, setup)
        .iter()
        .filter_map(|x| x.map(|x| f(&x.measured)))
        .collect();
    median(&v)
}

fn analysis_median(r: &WorkloadResult, a: Analysis, f: impl Fn(&Measured) -> f64) -> Option<f64> {
    let (_, m) = r.analysis.get(&a)?;
    median(&m.iter().map(f).collect::<Vec<_>>())
}

/// Samples analyzed per CPU-second.
fn analysis_rate(r: &WorkloadResult, a: Analysis) -> Option<f64> {
    let samples = r.analysis.get(&a)?.0 as f64;
    let cpu = analysis_median(r, a, Measured::cpu_s)?;
    (cpu > 0.0).then(|| samples / cpu)
}

/// Median over rounds of the recorder's own CPU per sample, in µs.
fn recorder_us_per_sample(r: &WorkloadResult, setup: Setup) -> Option<f64> {
    let v: Vec<f64> = runs(r, setup)
        .iter()
        .filter_map(|x| {
            let x = x.as_ref()?;
            let samples = x.trace.as_ref()?.samples;
            let cpu = x.recorder_cpu_s?;
            (samples > 0).then(|| cpu * 1e6 / samples as f64)
        })
        .collect();
    median(&v)
}

fn us(v: f64) -> String {
    format!("{v:.1} µs")
}

fn cell(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "—".to_string(), f)
}

fn pct_signed(v: f64) -> String {
    format!("{v:+.1} %")
}

fn row(out: &mut String, cells: &[String]) {
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

fn header(out: &mut String, cells: &[&str]) {
    row(
        out,
        &cells.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
    );
    row(
        out,
        &cells.iter().map(|_| "---".to_string()).collect::<Vec<_>>(),
    );
}

/// Render the comparison as markdown: one table per question, then how the
/// results stand against the targets, then what went wrong.
pub fn markdown(c: &Comparison) -> String {
    let o = &c.options;
    let (lo, hi) = (o.freq, o.high_freq);
    let s = |profiler, freq| Setup { profiler, freq };
    let mut out = String::new();
    let _ = writeln!(out, "Machine: {}.", machine_description(&o.perf));
    let _ = writeln!(
        out,
        "Every figure is the median of {} rounds; overheads pair each profiled run with the baseline run of the same round.\n",
        o.runs
    );

    let _ = writeln!(out, "Workloads:\n");
    for r in &c.workloads {
        let _ = writeln!(out, "- `{}`: {}", r.workload.name, r.workload.what);
    }

    let _ = writeln!(
        out,
        "\n### CPU overhead (target + profiler CPU time over the target alone)\n"
    );
    overhead_table(&mut out, c, false);
    let _ = writeln!(
        out,
        "\nPaired by round: lrnprof's overhead minus the other's in the same round, in points \
         (median; where it lies with 95 % confidence, from 6 rounds on; rounds where lrnprof \
         cost less):\n"
    );
    paired_table(&mut out, c);
    let _ = writeln!(
        out,
        "\nFixed cost of each profiler (CPU s to run `true`, an empty program, under it; included in the overheads above):\n"
    );
    header(
        &mut out,
        &[
            "no profiler",
            &format!("perf -g @ {lo}"),
            &format!("perf dwarf @ {lo}"),
            &format!("lrnprof @ {lo}"),
            &format!("lrnprof --embed none @ {lo}"),
        ],
    );
    let fixed = |setup| {
        let v: Vec<f64> = c
            .fixed_cost
            .get(&setup)
            .map(|m| m.iter().map(Measured::cpu_s).collect())
            .unwrap_or_default();
        cell(median(&v), |x| format!("{x:.3} s"))
    };
    row(
        &mut out,
        &[
            fixed(s(Profiler::None, 0)),
            fixed(s(Profiler::PerfFp, lo)),
            fixed(s(Profiler::PerfDwarf, lo)),
            fixed(s(Profiler::Lrnprof, lo)),
            fixed(s(Profiler::LrnprofNoEmbed, lo)),
        ],
    );

    let _ = writeln!(
        out,
        "\n### CPU overhead net of fixed costs (each profiled run minus its profiler's fixed cost above)\n"
    );
    overhead_table(&mut out, c, true);

    let _ = writeln!(
        out,
        "\n### The recorder's own CPU per sample (lrnprof-rec's process alone, start and embedding included, over the samples in its trace)\n"
    );
    header(
        &mut out,
        &[
            "workload",
            &format!("lrnprof @ {lo}"),
            &format!("lrnprof --embed none @ {lo}"),
            &format!("lrnprof @ {hi}"),
            &format!("lrnprof --embed none @ {hi}"),
            &format!("baseline lrnprof @ {lo}"),
            &format!("baseline lrnprof @ {hi}"),
        ],
    );
    for r in &c.workloads {
        let per_sample = |p, f| recorder_us_per_sample(r, s(p, f));
        row(
            &mut out,
            &[
                format!("`{}`", r.workload.name),
                cell(per_sample(Profiler::Lrnprof, lo), us),
                cell(per_sample(Profiler::LrnprofNoEmbed, lo), us),
                cell(per_sample(Profiler::Lrnprof, hi), us),
                cell(per_sample(Profiler::LrnprofNoEmbed, hi), us),
                cell(per_sample(Profiler::LrnprofBaseline, lo), us),
                cell(per_sample(Profiler::LrnprofBaseline, hi), us),
            ],
        );
    }

    let _ = writeln!(out, "\n### Trace size (bytes per sample, at {lo} Hz)\n");
    header(
        &mut out,
        &[
            "workload",
            "samples (lrnprof)",
            "perf -g",
            "perf dwarf",
            "lrnprof, whole trace",
            "lrnprof, without embedded images",
            "lrnprof (without) / perf dwarf",
        ],
    );
    for r in &c.workloads {
        let bps = |p| trace_median(r, s(p, lo), TraceFacts::bytes_per_sample);
        let dw = bps(Profiler::PerfDwarf);
        let lr = trace_median(
            r,
            s(Profiler::Lrnprof, lo),
            TraceFacts::sample_bytes_per_sample,
        );
        row(
            &mut out,
            &[
                format!("`{}`", r.workload.name),
                cell(
                    trace_median(r, s(Profiler::Lrnprof, lo), |t| Some(t.samples as f64)),
                    |v| format!("{v:.0}"),
                ),
                cell(bps(Profiler::PerfFp), |v| format!("{v:.0}")),
                cell(dw, |v| format!("{v:.0}")),
                cell(bps(Profiler::Lrnprof), |v| format!("{v:.0}")),
                cell(lr, |v| format!("{v:.0}")),
                cell(lr.zip(dw).map(|(a, b)| a / b), |v| {
                    format!("1/{:.1}", 1.0 / v)
                }),
            ],
        );
    }
    let _ = writeln!(
        out,
        "\nA whole lrnprof trace also carries, once per image, the symbol and unwind tables it needs to be analyzed elsewhere (`lrnprof-rec --embed symbols`, the default); a perf.data file carries none (that takes `perf archive`). The embedded part is counted from blocks holding only embedded data."
    );

    let _ = writeln!(out, "\n### Lost samples (% of samples taken)\n");
    header(
        &mut out,
        &[
            "workload",
            &format!("perf dwarf @ {lo}"),
            &format!("lrnprof @ {lo}"),
            &format!("perf dwarf @ {hi}"),
            &format!("lrnprof @ {hi}"),
        ],
    );
    for r in &c.workloads {
        let lost = |p, f| {
            cell(trace_median(r, s(p, f), TraceFacts::lost_pct), |v| {
                format!("{v:.2} %")
            })
        };
        row(
            &mut out,
            &[
                format!("`{}`", r.workload.name),
                lost(Profiler::PerfDwarf, lo),
                lost(Profiler::Lrnprof, lo),
                lost(Profiler::PerfDwarf, hi),
                lost(Profiler::Lrnprof, hi),
            ],
        );
    }

    let _ = writeln!(out, "\n### Unwind completeness (% of samples whose stack reaches the thread's root, at {lo} Hz)\n");
    header(
        &mut out,
        &[
            "workload",
            "perf -g",
            "perf dwarf",
            "lrnprof",
            "lrnprof (its own count)",
        ],
    );
    for r in &c.workloads {
        let pct = |p| cell(r.root_pct.get(&s(p, lo)).copied(), |v| format!("{v:.1} %"));
        row(
            &mut out,
            &[
                format!("`{}`", r.workload.name),
                pct(Profiler::PerfFp),
                pct(Profiler::PerfDwarf),
                pct(Profiler::Lrnprof),
                cell(r.lrnprof_claimed_root_pct, |v| format!("{v:.1} %")),
            ],
        );
    }
    let _ = writeln!(
        out,
        "\nA stack reaches the root when one of its frames is {}; perf's stacks are read from `perf script`, lrnprof's from `lrnprof-analyze --format folded`. The last column is `unwound_to_root_pct` of `lrnprof-analyze info --json`.",
        crate::perf_text::ROOT_FUNCTIONS
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let _ = writeln!(
        out,
        "\n### Analysis cost of the {hi} Hz traces (CPU s / wall s; samples per CPU-second)\n"
    );
    header(
        &mut out,
        &[
            "workload",
            "samples perf / lrnprof",
            "perf report --stdio",
            "lrnprof-analyze --jobs 1",
            "lrnprof-analyze all cores",
            "samples/CPU-s perf",
            "samples/CPU-s lrnprof",
            "lrnprof speedup per CPU-s",
            "wall speedup (all cores)",
        ],
    );
    for r in &c.workloads {
        let cost = |a| match (
            analysis_median(r, a, Measured::cpu_s),
            analysis_median(r, a, |m| m.wall_s),
        ) {
            (Some(cpu), Some(wall)) => format!("{cpu:.2} / {wall:.2}"),
            _ => "—".to_string(),
        };
        let samples = |a| {
            r.analysis
                .get(&a)
                .map(|x| x.0.to_string())
                .unwrap_or_else(|| "—".into())
        };
        let perf_rate = analysis_rate(r, Analysis::PerfReport);
        let lr_rate = analysis_rate(r, Analysis::LrnprofOneJob);
        let perf_wall = analysis_median(r, Analysis::PerfReport, |m| m.wall_s);
        let lr_wall = analysis_median(r, Analysis::LrnprofAllJobs, |m| m.wall_s);
        row(
            &mut out,
            &[
                format!("`{}`", r.workload.name),
                format!(
                    "{} / {}",
                    samples(Analysis::PerfReport),
                    samples(Analysis::LrnprofOneJob)
                ),
                cost(Analysis::PerfReport),
                cost(Analysis::LrnprofOneJob),
                cost(Analysis::LrnprofAllJobs),
                cell(perf_rate, |v| format!("{v:.0}")),
                cell(lr_rate, |v| format!("{v:.0}")),
                cell(lr_rate.zip(perf_rate).map(|(a, b)| a / b), |v| {
                    format!("{v:.1}×")
                }),
                cell(perf_wall.zip(lr_wall).map(|(p, l)| p / l), |v| {
                    format!("{v:.1}×")
                }),
            ],
        );
    }

    let _ = writeln!(out, "\n### Peak memory (max RSS, MiB)\n");
    header(
        &mut out,
        &[
            "workload",
            &format!("perf record dwarf @ {lo}"),
            &format!("lrnprof-rec @ {lo}"),
            &format!("lrnprof-rec @ {hi}"),
            "perf report",
            "lrnprof-analyze --jobs 1",
            "lrnprof-analyze all cores",
        ],
    );
    for r in &c.workloads {
        let mib = |v: Option<f64>| cell(v, |k| format!("{:.1}", k / 1024.0));
        let rec = |p, f| mib(measured_median(r, s(p, f), |m| m.peak_rss_kib as f64));
        let ana = |a| mib(analysis_median(r, a, |m| m.peak_rss_kib as f64));
        row(
            &mut out,
            &[
                format!("`{}`", r.workload.name),
                rec(Profiler::PerfDwarf, lo),
                rec(Profiler::Lrnprof, lo),
                rec(Profiler::Lrnprof, hi),
                ana(Analysis::PerfReport),
                ana(Analysis::LrnprofOneJob),
                ana(Analysis::LrnprofAllJobs),
            ],
        );
    }

    let _ = writeln!(out, "\n### Against the targets\n");
    for line in targets(c) {
        let _ = writeln!(out, "- {line}");
    }

    let problems: Vec<String> = c
        .notes
        .iter()
        .cloned()
        .chain(c.workloads.iter().flat_map(|r| {
            r.errors
                .iter()
                .map(move |e| format!("`{}`: {e}", r.workload.name))
        }))
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(out, "\n### Left out or failed\n");
        for p in problems {
            let _ = writeln!(out, "- {p}");
        }
    }
    out
}

fn worst(
    values: impl Iterator<Item = (String, f64)>,
    higher_is_worse: bool,
) -> Option<(String, f64)> {
    values.fold(None, |acc: Option<(String, f64)>, (n, v)| match acc {
        Some((_, a)) if (higher_is_worse && a >= v) || (!higher_is_worse && a <= v) => acc,
        _ => Some((n, v)),
    })
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// One line per target: the worst workload's figure and whether it is met.
fn targets(c: &Comparison) -> Vec<String> {
    let lo = c.options.freq;
    let s = |profiler| Setup { profiler, freq: lo };
    let mut lines = Vec::new();
    let over = worst(
        c.workloads.iter().filter_map(|r| {
            let d = overhead_of(c, r, s(Profiler::Lrnprof), true)?
                - overhead_of(c, r, s(Profiler::PerfFp), true)?;
            Some((r.workload.name.clone(), d))
        }),
        true,
    );
    lines.push(match over {
        Some((n, d)) => format!(
            "Overhead (net of fixed costs) within 1 percentage point of the `perf -g` floor: {} (worst: `{n}`, {d:+.1} pp)",
            verdict(d <= 1.0)
        ),
        None => "Overhead within 1 percentage point of the `perf -g` floor: not measured".into(),
    });
    let size = worst(
        c.workloads.iter().filter_map(|r| {
            let perf = trace_median(r, s(Profiler::PerfDwarf), TraceFacts::bytes_per_sample)?;
            let ours = trace_median(r, s(Profiler::Lrnprof), TraceFacts::sample_bytes_per_sample)?;
            Some((r.workload.name.clone(), ours / perf))
        }),
        true,
    );
    lines.push(match size {
        Some((n, v)) => format!(
            "At most 1/20 of perf dwarf's bytes per sample (without embedded images): {} (worst: `{n}`, 1/{:.1})",
            verdict(v <= 0.05),
            1.0 / v
        ),
        None => "At most 1/20 of perf dwarf's bytes per sample: not measured".into(),
    });
    let root = worst(
        c.workloads.iter().filter_map(|r| {
            Some((
                r.workload.name.clone(),
                *r.root_pct.get(&s(Profiler::Lrnprof))?,
            ))
        }),
        false,
    );
    lines.push(match root {
        Some((n, v)) => format!(
            "≥ 99 % of samples unwound to the root: {} (worst: `{n}`, {v:.1} %)",
            verdict(v >= 99.0)
        ),
        None => "≥ 99 % of samples unwound to the root: not measured".into(),
    });
    let speed = worst(
        c.workloads.iter().filter_map(|r| {
            let v = analysis_rate(r, Analysis::LrnprofOneJob)?
                / analysis_rate(r, Analysis::PerfReport)?;
            Some((r.workload.name.clone(), v))
        }),
        false,
    );
    lines.push(match speed {
        Some((n, v)) => format!(
            "Analysis ≥ 20× faster than `perf report` per CPU-second (one job): {} (worst: `{n}`, {v:.1}×)",
            verdict(v >= 20.0)
        ),
        None => "Analysis ≥ 20× faster than `perf report` per CPU-second: not measured".into(),
    });
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::CompareOptions;
    use crate::workloads::Workload;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn m(cpu: f64) -> Measured {
        Measured {
            user_s: cpu,
            sys_s: 0.0,
            wall_s: cpu,
            peak_rss_kib: 2048,
        }
    }

    fn run(cpu: f64, trace: Option<TraceFacts>) -> Option<RunFacts> {
        Some(RunFacts {
            measured: m(cpu),
            trace,
            recorder_cpu_s: None,
        })
    }

    /// One fixed-work workload, two rounds: baseline 2 s; perf -g 2.2 s
    /// (fixed cost 0.1 s); lrnprof 2.04 s (fixed cost 0.02 s).
    fn comparison() -> Comparison {
        let s = |profiler, freq| Setup { profiler, freq };
        let facts = |bytes, samples, lost| TraceFacts {
            bytes,
            samples,
            lost,
            embedded_bytes: 0,
        };
        let mut runs = BTreeMap::new();
        runs.insert(s(Profiler::None, 0), vec![run(2.0, None), run(4.0, None)]);
        runs.insert(
            s(Profiler::PerfFp, 1000),
            vec![
                run(2.2, Some(facts(100_000, 1000, 0))),
                run(4.4, Some(facts(100_000, 1000, 0))),
            ],
        );
        runs.insert(
            s(Profiler::PerfDwarf, 1000),
            vec![
                run(2.4, Some(facts(8_000_000, 1000, 0))),
                run(4.8, Some(facts(8_000_000, 1000, 10))),
            ],
        );
        let with_recorder_cpu = |r: Option<RunFacts>, cpu| {
            r.map(|r| RunFacts {
                recorder_cpu_s: Some(cpu),
                ..r
            })
        };
        runs.insert(
            s(Profiler::Lrnprof, 1000),
            vec![
                with_recorder_cpu(run(2.04, Some(facts(100_000, 1000, 0))), 0.02),
                with_recorder_cpu(run(4.08, Some(facts(100_000, 1000, 0))), 0.04),
            ],
        );
        let mut fixed_cost = BTreeMap::new();
        fixed_cost.insert(s(Profiler::None, 0), vec![m(0.0)]);
        fixed_cost.insert(s(Profiler::PerfFp, 1000), vec![m(0.1)]);
        fixed_cost.insert(s(Profiler::Lrnprof, 1000), vec![m(0.02)]);
        let mut root_pct = BTreeMap::new();
        root_pct.insert(s(Profiler::PerfDwarf, 1000), 30.0);
        root_pct.insert(s(Profiler::Lrnprof, 1000), 99.5);
        Comparison {
            options: CompareOptions {
                repo: "/nonexistent".into(),
                work_dir: "/nonexistent".into(),
                runs: 2,
                scale: 1.0,
                perf: "/nonexistent/perf".into(),
                rec: "/nonexistent/rec".into(),
                analyze: "/nonexistent/analyze".into(),
                samply: None,
                baseline: None,
                freq: 1000,
                high_freq: 10000,
                only: Vec::new(),
                timeout: Duration::from_secs(1),
            },
            workloads: vec![WorkloadResult {
                workload: Workload {
                    name: "busy".into(),
                    what: "a test".into(),
                    argv: vec!["busy".into()],
                    fixed_work: true,
                    ok_exit_codes: vec![0],
                },
                runs,
                root_pct,
                lrnprof_claimed_root_pct: Some(99.5),
                analysis: BTreeMap::new(),
                errors: vec!["perf dwarf @ 10000 Hz: it broke".into()],
            }],
            fixed_cost,
            notes: Vec::new(),
            have_perf: true,
            have_lrnprof: true,
        }
    }

    #[test]
    fn lrnprof_is_paired_with_each_profiler_by_round() {
        let c = comparison();
        let mut out = String::new();
        paired_table(&mut out, &c);
        let busy = out.lines().find(|l| l.starts_with("| `busy`")).unwrap();
        // Rounds: lrnprof +2 % and +2 %, perf -g +10 % and +10 %: -8
        // points in both; two rounds give no 95 % interval. Nothing at
        // the high rate.
        assert_eq!(
            busy, "| `busy` | -8.0 (lower in 2 of 2) | - | - | - |",
            "{out}"
        );
        let one_round_failed = |mut c: Comparison| {
            let runs = &mut c.workloads[0].runs;
            runs.get_mut(&Setup {
                profiler: Profiler::PerfFp,
                freq: 1000,
            })
            .unwrap()[1] = None;
            c
        };
        let c = one_round_failed(c);
        let mut out = String::new();
        paired_table(&mut out, &c);
        assert!(out.contains("| -8.0 (lower in 1 of 1) |"), "{out}");
    }

    #[test]
    fn overheads_gross_and_net_of_fixed_cost() {
        let c = comparison();
        let r = &c.workloads[0];
        let fp = Setup {
            profiler: Profiler::PerfFp,
            freq: 1000,
        };
        let gross = overhead_of(&c, r, fp, false).unwrap();
        let net = overhead_of(&c, r, fp, true).unwrap();
        // Rounds: 2.2/2.0 and 4.4/4.0 -> +10 %; net: 2.1/2.0 and 4.3/4.0 -> +5 % and +7.5 %.
        assert!((gross - 10.0).abs() < 1e-9, "{gross}");
        assert!((net - 6.25).abs() < 1e-9, "{net}");
    }

    #[test]
    fn markdown_has_the_figures_and_the_verdicts() {
        let text = markdown(&comparison());
        for needle in [
            "| `busy` | 3.00 s | +10.0 % | +20.0 % | +2.0 % | -8.0 pp | — | — | — | — | — |",
            // The recorder's CPU per sample: 20 and 40 µs, median 30.
            "| `busy` | 30.0 µs | — | — | — |",
            "| 8000 | 100 | 100 | 1/80.0 |",
            "| `busy` | — | 30.0 % | 99.5 % | 99.5 % |",
            "0.50 %",
            "At most 1/20 of perf dwarf's bytes per sample (without embedded images): met",
            "≥ 99 % of samples unwound to the root: met",
            "Analysis ≥ 20× faster than `perf report` per CPU-second: not measured",
            "- `busy`: perf dwarf @ 10000 Hz: it broke",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }
}
