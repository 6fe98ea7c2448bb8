//! A [`SyscallReport`] as text (a table like `strace -c`, then call sites,
//! errors and slow calls) or CSV. JSON is its serde form.

use super::{CallSite, SyscallReport};
use std::fmt::Write as _;

impl CallSite {
    /// `function (file:line)`, as much of it as is known.
    pub fn label(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{} ({}:{l})", self.function, short_path(f)),
            (Some(f), None) => format!("{} ({})", self.function, short_path(f)),
            _ => self.function.clone(),
        }
    }
}

/// A source path without its directories (the full one is in JSON/CSV).
fn short_path(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Nanoseconds as microseconds with 2 decimals.
fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e3)
}

/// A duration for people: ns, us, ms or s.
fn human(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} us", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.3} s", ns as f64 / 1e9),
    }
}

const RULE: &str =
    "------ ----------- ---------- ---------- ---------- ---------- ----------------";

impl SyscallReport {
    /// The report as text.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{:>6} {:>11} {:>10} {:>10} {:>10} {:>10} syscall",
            "% time", "seconds", "usecs/call", "max usecs", "calls", "errors"
        );
        let _ = writeln!(o, "{RULE}");
        for s in &self.syscalls {
            let errors = if s.errors > 0 {
                s.errors.to_string()
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "{:>6.2} {:>11.6} {:>10} {:>10} {:>10} {:>10} {}",
                s.time_pct,
                s.total_ns as f64 / 1e9,
                us(s.avg_ns),
                us(s.max_ns),
                s.calls,
                errors,
                s.syscall
            );
        }
        let _ = writeln!(o, "{RULE}");
        let _ = writeln!(
            o,
            "{:>6.2} {:>11.6} {:>10} {:>10} {:>10} {:>10} total",
            if self.total_ns > 0 { 100.0 } else { 0.0 },
            self.total_ns as f64 / 1e9,
            "",
            "",
            self.calls,
            if self.errors > 0 {
                self.errors.to_string()
            } else {
                String::new()
            }
        );

        let failing: Vec<_> = self.syscalls.iter().filter(|s| s.errors > 0).collect();
        if !failing.is_empty() {
            let _ = writeln!(o, "\nerrors:");
            for s in failing {
                let errnos: Vec<String> =
                    s.errnos.iter().map(|(e, n)| format!("{e} {n}")).collect();
                let _ = writeln!(o, "  {:<20} {}", s.syscall, errnos.join(", "));
            }
        }

        let _ = writeln!(
            o,
            "\ncall sites (the first frame outside libc and the vDSO){}:",
            if self.stack_every > 1 {
                format!(
                    ", estimated from 1 call in {} per thread and syscall",
                    self.stack_every
                )
            } else {
                String::new()
            }
        );
        for s in &self.syscalls {
            let _ = writeln!(o, "  {}", s.syscall);
            for site in &s.call_sites {
                let _ = writeln!(
                    o,
                    "    {:>9} calls {:>7} errors {:>12} total {:>10} median  {}",
                    site.calls,
                    site.errors,
                    human(site.total_ns),
                    human(site.median_ns),
                    site.site.label()
                );
            }
        }

        let slow: Vec<_> = self
            .syscalls
            .iter()
            .flat_map(|s| s.slow_calls.iter().map(move |c| (s, c)))
            .collect();
        if !slow.is_empty() {
            let _ = writeln!(
                o,
                "\nunusually slow calls (far above their call site's median){}:",
                if self.stack_every > 1 {
                    ", among the recorded calls"
                } else {
                    ""
                }
            );
            for (s, c) in slow {
                let _ = writeln!(
                    o,
                    "  at {:>10.6} s  pid {} tid {}  {} took {} (median {})  {}",
                    c.time_s,
                    c.pid,
                    c.tid,
                    s.syscall,
                    human(c.duration_ns),
                    human(c.median_ns),
                    c.site.label()
                );
            }
        }
        o
    }

    /// One CSV row per syscall: `syscall,nr,calls,errors,unfinished,total_ns,
    /// avg_ns,max_ns,time_pct`.
    pub fn to_csv(&self) -> String {
        let mut o =
            String::from("syscall,nr,calls,errors,unfinished,total_ns,avg_ns,max_ns,time_pct\n");
        for s in &self.syscalls {
            let _ = writeln!(
                o,
                "{},{},{},{},{},{},{},{},{:.4}",
                csv_field(&s.syscall),
                s.nr,
                s.calls,
                s.errors,
                s.unfinished,
                s.total_ns,
                s.avg_ns,
                s.max_ns,
                s.time_pct
            );
        }
        o
    }

    /// One CSV row per syscall and call site: `syscall,nr,function,file,line,
    /// calls,errors,total_ns,median_ns,max_ns`.
    pub fn to_sites_csv(&self) -> String {
        let mut o =
            String::from("syscall,nr,function,file,line,calls,errors,total_ns,median_ns,max_ns\n");
        for s in &self.syscalls {
            for site in &s.call_sites {
                let _ = writeln!(
                    o,
                    "{},{},{},{},{},{},{},{},{},{}",
                    csv_field(&s.syscall),
                    s.nr,
                    csv_field(&site.site.function),
                    csv_field(site.site.file.as_deref().unwrap_or("")),
                    site.site.line.map(|l| l.to_string()).unwrap_or_default(),
                    site.calls,
                    site.errors,
                    site.total_ns,
                    site.median_ns,
                    site.max_ns
                );
            }
        }
        o
    }
}

/// A CSV field, quoted when it holds a comma, quote or line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SiteStats, SlowCall, SyscallStats};
    use super::*;
    use std::collections::BTreeMap;

    fn report() -> SyscallReport {
        let site = CallSite {
            function: "load<int, char>".into(),
            file: Some("/src/app/load.c".into()),
            line: Some(42),
        };
        SyscallReport {
            syscalls: vec![SyscallStats {
                syscall: "openat".into(),
                nr: 257,
                abi: "x86_64",
                calls: 4,
                errors: 3,
                errnos: BTreeMap::from([("ENOENT".to_string(), 3)]),
                unfinished: 0,
                total_ns: 40_000_000,
                avg_ns: 10_000_000,
                max_ns: 37_000_000,
                time_pct: 100.0,
                stack_every: 1,
                call_sites: vec![SiteStats {
                    site: site.clone(),
                    calls: 4,
                    errors: 3,
                    total_ns: 40_000_000,
                    median_ns: 1_000_000,
                    max_ns: 37_000_000,
                }],
                slow_calls: vec![SlowCall {
                    time_s: 1.5,
                    pid: 7,
                    tid: 8,
                    duration_ns: 37_000_000,
                    median_ns: 1_000_000,
                    site,
                }],
            }],
            calls: 4,
            errors: 3,
            total_ns: 40_000_000,
            lost: 0,
            stack_every: 1,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn text_has_the_table_sites_errors_and_slow_calls() {
        let t = report().to_text();
        assert!(
            t.contains("100.00    0.040000   10000.00   37000.00          4          3 openat"),
            "{t}"
        );
        assert!(t.contains("openat               ENOENT 3"), "{t}");
        assert!(t.contains("load<int, char> (load.c:42)"), "{t}");
        assert!(t.contains("took 37.0 ms (median 1.0 ms)"), "{t}");
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let r = report();
        assert_eq!(
            r.to_csv().lines().nth(1),
            Some("openat,257,4,3,0,40000000,10000000,37000000,100.0000")
        );
        assert_eq!(
            r.to_sites_csv().lines().nth(1),
            Some("openat,257,\"load<int, char>\",/src/app/load.c,42,4,3,40000000,1000000,37000000")
        );
    }

    #[test]
    fn json_is_an_array_of_syscalls_with_the_documented_fields() {
        let json = serde_json::to_value(&report().syscalls).unwrap();
        let first = &json[0];
        for key in [
            "syscall",
            "calls",
            "errors",
            "total_ns",
            "errnos",
            "call_sites",
        ] {
            assert!(first.get(key).is_some(), "{key}");
        }
        assert_eq!(first["call_sites"][0]["function"], "load<int, char>");
        assert_eq!(first["slow_calls"][0]["line"], 42);
    }
}
