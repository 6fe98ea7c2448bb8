//! The views people look at: the flame graph SVG drawn by headless
//! Chromium, the Firefox Profiler file against the structure its format
//! documents, `top` and `diff` on recordings of `an_diff.c` (four equal
//! functions, one of them doubled on request), and `--open` where no
//! browser can be opened.

use super::*;
use serde_json::Value;

/// Record `an_diff` for `ms`, with `heavy` (a..d) doing twice the work.
fn record_an_diff(dir: &Path, name: &str, ms: &str, heavy: Option<&str>) -> PathBuf {
    let exe = dir.join("an_diff");
    if !exe.exists() {
        build_c(&["an_diff.c"], NO_FP, dir, "an_diff");
    }
    let mut args = vec![ms];
    args.extend(heavy);
    // an_diff runs for MS of CPU time: 4 kHz gives 4 samples per ms of it,
    // enough that shares are within a point of the work's.
    record(dir, name, &["-F", "4000"], &exe, &args)
}

/// The function names of the first table row of `top` or `diff` output
/// (the last column; the first line is the title, the second the header).
fn first_function(table: &str) -> String {
    let row = table
        .lines()
        .nth(2)
        .unwrap_or_else(|| panic!("no rows:\n{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    cells
        .iter()
        .find(|c| c.chars().next().is_some_and(char::is_alphabetic))
        .unwrap_or_else(|| panic!("no function in {row:?}"))
        .to_string()
}

/// A PNG screenshot of `page` by headless Chromium, `width`x`height`.
fn screenshot(page: &Path, png: &Path, dir: &Path, width: u32, height: u32) {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.join("chromium").display()
        ))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .output()
        .expect("running chromium");
    assert!(
        png.exists(),
        "chromium took no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pixels of an RGB(A) PNG that differ from its top-left one, and the
/// number of distinct colors.
fn ink(png: &Path) -> (usize, usize) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a sane PNG size")];
    let info = reader.next_frame(&mut buf).expect("PNG pixels");
    let channels = info.color_type.samples();
    assert!(
        channels >= 3,
        "not an RGB screenshot: {:?}",
        info.color_type
    );
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| &p[..3])
        .collect();
    let background = pixels[0];
    let differing = pixels.iter().filter(|p| **p != background).count();
    let colors: std::collections::HashSet<&[u8]> = pixels.iter().copied().collect();
    (differing, colors.len())
}

#[test]
fn flame_graph_svg_renders_in_chromium() {
    require_perf!();
    if Command::new("chromium").arg("--version").output().is_err() {
        skip!("chromium is not installed (Debian: chromium)");
    }
    let dir = scratch_dir("an-svg");
    let trace = record_an_diff(&dir, "fg", "600", None);
    let t = trace.to_str().unwrap();
    ok(&[t, "--format", "svg"]);
    let svg = dir.join("fg.lpt.svg");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.contains("<svg"), "{text}");
    for name in ["work_a", "work_b", "work_c", "work_d", "main", "an_diff"] {
        assert!(
            text.contains(&format!(">{name}<")) || text.contains(&format!("<title>{name} (")),
            "{name} is not in the flame graph"
        );
    }
    // Search and zoom come with inferno's script.
    assert!(text.contains("function search(") && text.contains("function zoom("));
    // `flamegraph` is another name for the format.
    let aliased = dir.join("fg-alias.svg");
    ok(&[t, "--format", "flamegraph", "-o", aliased.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&aliased).unwrap(), text);

    let png = dir.join("fg.png");
    screenshot(&svg, &png, &dir, 1200, 400);
    let (differing, colors) = ink(&png);
    assert!(
        differing > 1200 * 400 / 20 && colors > 20,
        "the screenshot looks blank: {differing} pixels differ from the background, {colors} colors"
    );
    // The check can fail: an empty page is blank.
    let empty = dir.join("empty.svg");
    std::fs::write(
        &empty,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>"#,
    )
    .unwrap();
    let blank = dir.join("empty.png");
    screenshot(&empty, &blank, &dir, 1200, 400);
    assert_eq!(ink(&blank).0, 0);

    // Byte-identical in another process (inferno hashes names for colors).
    ok(&[
        t,
        "--format",
        "svg",
        "-o",
        dir.join("again.svg").to_str().unwrap(),
    ]);
    assert!(std::fs::read(dir.join("again.svg")).unwrap() == text.as_bytes());
    remove_scratch_dir(&dir);
}

/// Indexes in column `key` of table `table` are below `bound`.
fn indexes_below(table: &Value, key: &str, bound: usize) {
    for v in table[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} column"))
    {
        if let Some(i) = v.as_u64() {
            assert!((i as usize) < bound, "{key} index {i} out of {bound}");
        }
    }
}

#[test]
fn firefox_profile_has_a_track_per_recorded_thread() {
    require_perf!();
    let dir = scratch_dir("an-firefox");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "ff", &[], &exe, &["500"]);
    let t = trace.to_str().unwrap();
    ok(&[t, "--format", "firefox"]);
    let profile: Value =
        serde_json::from_slice(&std::fs::read(dir.join("ff.lpt.firefox.json")).unwrap())
            .expect("the Firefox profile is JSON");
    let info: Value = serde_json::from_str(&info(&trace, &[])).unwrap();

    let meta = &profile["meta"];
    assert_eq!(meta["preprocessedProfileVersion"], 55);
    assert!(meta["interval"].as_f64().unwrap() > 0.0);
    assert!(
        meta["startTime"].as_f64().unwrap() > 1.0e12,
        "start time from the trace"
    );
    let threads = profile["threads"].as_array().unwrap();
    let recorded = info["threads"].as_array().unwrap();
    let mut tids: Vec<String> = threads
        .iter()
        .map(|t| t["tid"].as_str().unwrap().to_string())
        .collect();
    let mut expected: Vec<String> = recorded.iter().map(|t| t["tid"].to_string()).collect();
    tids.sort();
    expected.sort();
    assert_eq!(tids, expected, "one track per recorded thread");
    let names: Vec<&str> = threads
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"worker-a") && names.contains(&"worker-b"),
        "{names:?}"
    );

    let mut weight_ms = 0.0;
    for thread in threads {
        let strings = thread["stringArray"].as_array().unwrap().len();
        let funcs = thread["funcTable"]["length"].as_u64().unwrap() as usize;
        let frames = thread["frameTable"]["length"].as_u64().unwrap() as usize;
        let stacks = thread["stackTable"]["length"].as_u64().unwrap() as usize;
        let samples = &thread["samples"];
        let n = samples["length"].as_u64().unwrap() as usize;
        for (table, key, bound) in [
            (samples, "stack", stacks),
            (&thread["stackTable"], "frame", frames),
            (&thread["stackTable"], "prefix", stacks),
            (&thread["frameTable"], "func", funcs),
            (&thread["funcTable"], "name", strings),
            (&thread["funcTable"], "fileName", strings),
        ] {
            indexes_below(table, key, bound);
        }
        assert_eq!(samples["weightType"], "tracing-ms");
        for column in ["stack", "timeDeltas", "weight", "threadCPUDelta"] {
            assert_eq!(samples[column].as_array().unwrap().len(), n, "{column}");
        }
        // Sample times in order: a timeline.
        assert!(samples["timeDeltas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d.as_f64().unwrap() >= 0.0));
        weight_ms += samples["weight"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_f64().unwrap())
            .sum::<f64>();
        if thread["name"] == "worker-a" {
            assert!(n > 50, "worker-a has {n} samples");
            let funcs: Vec<&str> = thread["funcTable"]["name"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    thread["stringArray"][i.as_u64().unwrap() as usize]
                        .as_str()
                        .unwrap()
                })
                .collect();
            assert!(
                funcs.contains(&"leaf_work") && funcs.contains(&"parent_two"),
                "{funcs:?}"
            );
            let files: Vec<&str> = thread["funcTable"]["fileName"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| i.as_u64())
                .map(|i| thread["stringArray"][i as usize].as_str().unwrap())
                .collect();
            assert!(
                files.iter().any(|f| f.ends_with("rec_threads.c")),
                "{files:?}"
            );
        }
    }
    // The weights are the CPU time `info` counts, in ms.
    let cpu_ns = info["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cpu")
        .unwrap()["total"]
        .as_f64()
        .unwrap();
    assert!(
        (weight_ms - cpu_ns / 1e6).abs() < 1e-3 * weight_ms.max(1.0),
        "{weight_ms} ms vs {cpu_ns} ns"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn top_lists_the_hottest_function_first_also_when_stripped() {
    require_perf!();
    let dir = scratch_dir("an-top");
    let trace = record_an_diff(&dir, "top", "1500", Some("c"));
    let t = trace.to_str().unwrap();
    let table = String::from_utf8(ok(&["top", t]).stdout).unwrap();
    assert_eq!(first_function(&table), "work_c", "{table}");
    assert!(table.lines().nth(1).unwrap().contains("self%"), "{table}");

    let by_total = String::from_utf8(ok(&["top", t, "--by", "total", "-n", "3"]).stdout).unwrap();
    assert_eq!(by_total.lines().count(), 2 + 3, "{by_total}");
    assert!(
        by_total.lines().nth(2).unwrap().contains("100.0%"),
        "{by_total}"
    );

    let samples = String::from_utf8(ok(&["top", t, "--value", "samples"]).stdout).unwrap();
    assert!(
        samples.starts_with("top.lpt: CPU samples (samples)"),
        "{samples}"
    );
    assert_eq!(first_function(&samples), "work_c", "{samples}");

    let stripped = dir.join("stripped.lpt");
    ok(&["strip", t, "-o", stripped.to_str().unwrap()]);
    let table =
        String::from_utf8(ok(&["top", stripped.to_str().unwrap(), "--offline"]).stdout).unwrap();
    assert_eq!(first_function(&table), "work_c", "{table}");
    // The stripped copy says which samples reached the root, and counts
    // them as the original does.
    let roots = |trace: &str| {
        let info: serde_json::Value =
            serde_json::from_slice(&ok(&["info", trace, "--json", "--offline"]).stdout).unwrap();
        let stats = &info["stats"];
        (stats["root_samples"].clone(), stats["root_by_kind"].clone())
    };
    let original = roots(t);
    assert!(original.0.as_u64().unwrap() > 0, "{original:?}");
    assert_eq!(roots(stripped.to_str().unwrap()), original);
    // Said by the flag, not only by the outermost frame's name: nearly
    // every walk of this program ends cleanly at its thread's entry (one
    // in about 6,000 ended otherwise, at a frame named as an entry).
    let flagged = TraceReader::open(&stripped)
        .unwrap()
        .records()
        .filter(|r| match r {
            Ok(lrnprof_format::Record::Sample(s)) => {
                s.flags.contains(lrnprof_format::SampleFlags::REACHED_ROOT)
            }
            _ => false,
        })
        .count() as u64;
    let root = original.0.as_u64().unwrap();
    assert!(
        flagged <= root && flagged * 10 >= root * 9,
        "{flagged} samples flagged, {root} at the root"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn reports_to_a_full_or_closed_stdout() {
    require_perf!();
    let dir = scratch_dir("an-stdout");
    let trace = record_an_diff(&dir, "stdout", "300", None);
    let t = trace.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["top", t],
        &["info", t],
        &["info", t, "--json"],
        &["-f", "folded", "-o", "-", t],
    ];
    for args in commands {
        // A reader that stops reading (`| head`): a quiet success.
        let mut child = Command::new(lrnprof_analyze())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?} to a closed pipe: {stderr}");
        assert!(
            !stderr.contains("error") && !stderr.contains("panicked"),
            "{args:?} to a closed pipe: {stderr}"
        );
        // A full disk: one line of error, no panic.
        if cfg!(target_os = "linux") {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            let out = Command::new(lrnprof_analyze())
                .args(args)
                .stdin(Stdio::null())
                .stdout(full)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{args:?} to /dev/full: {stderr}"
            );
            let last = stderr.trim_end().lines().last().unwrap_or_default();
            assert!(
                last.starts_with("lrnprof-analyze: error: cannot write to standard output: "),
                "{args:?} to /dev/full: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        }
    }
    remove_scratch_dir(&dir);
}

/// `lrnprof-analyze ARGS` with the file `stdin` as standard input.
fn with_stdin(args: &[&str], stdin: &Path) -> Output {
    Command::new(lrnprof_analyze())
        .args(args)
        .stdin(std::fs::File::open(stdin).unwrap())
        .output()
        .unwrap()
}

#[test]
fn a_trace_from_standard_input() {
    require_perf!();
    let dir = scratch_dir("an-stdin");
    let trace = record_an_diff(&dir, "stdin", "300", None);
    let t = trace.to_str().unwrap();
    // `-` reads the trace from standard input.
    let folded = ok(&[t, "-f", "folded", "-o", "-"]).stdout;
    let piped = with_stdin(&["-", "-f", "folded", "-o", "-"], &trace);
    assert!(piped.status.success());
    assert_eq!(piped.stdout, folded);
    let top = with_stdin(&["top", "-"], &trace);
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(text.starts_with("stdin: CPU time"), "{text}");
    // No place next to it for the output: say so before reading it.
    let out = with_stdin(&["-"], &trace);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{msg}");
    assert!(
        msg.contains("the trace comes from standard input: say where the output goes with -o"),
        "{msg}"
    );
    // A trace reached through /proc or /dev (here a file as standard
    // input): no place next to it either, said before the analysis. Before,
    // /dev/stdin's output went into /dev, and this failed at the write.
    let out = with_stdin(&["/proc/self/fd/0", "-f", "folded"], &trace);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{msg}");
    assert!(
        msg.contains("the trace /proc/self/fd/0 has no directory to write the output next to")
            && msg.contains("-o FILE"),
        "{msg}"
    );
    // Nor has a pipe (/dev/stdin, a FIFO, a shell's <(...)).
    let mut child = Command::new(lrnprof_analyze())
        .args(["/proc/self/fd/0", "-f", "folded"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let bytes = std::fs::read(&trace).unwrap();
    let mut pipe = child.stdin.take().unwrap();
    // The analyzer may stop reading at any point: a broken pipe is fine.
    let writer = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut pipe, &bytes);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let msg = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{msg}");
    assert!(
        msg.contains("the trace /proc/self/fd/0 has no directory to write the output next to"),
        "{msg}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn perf_script_text_has_every_sample_with_its_stack() {
    require_perf!();
    let dir = scratch_dir("an-script");
    let trace = record_an_diff(&dir, "script", "300", None);
    let t = trace.to_str().unwrap();
    // The name chooses the format.
    let out = dir.join("samples.script.txt");
    ok(&[t, "--value", "samples", "-o", out.to_str().unwrap()]);
    let text = std::fs::read_to_string(&out).unwrap();
    // One block per sample, in time order, each the stack folded output
    // counts (folded: root first; the blocks: leaf first).
    let mut from_blocks: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    let mut last_time = 0.0;
    for block in text.split_terminator("\n\n") {
        let mut lines = block.lines();
        let head = lines.next().unwrap();
        // `COMM PID/TID SECS: WEIGHT VALUE:`
        let fields: Vec<&str> = head.split(' ').collect();
        assert_eq!((fields.len(), fields[4]), (5, "samples:"), "{head}");
        let (pid, tid) = fields[1].split_once('/').unwrap();
        let time: f64 = fields[2].trim_end_matches(':').parse().unwrap();
        assert!(time >= last_time, "{head}");
        last_time = time;
        let mut stack = vec![format!("{}-{tid}", fields[0])];
        assert!(pid.parse::<u32>().is_ok() && fields[3] == "1", "{head}");
        let frames: Vec<String> = lines
            .map(|l| {
                // `\tADDRESS FUNCTION (IMAGE)`
                let rest = l.trim_start().split_once(' ').unwrap().1;
                rest[..rest.rfind(" (").unwrap()].to_string()
            })
            .collect();
        stack.extend(frames.into_iter().rev());
        *from_blocks.entry(stack).or_default() += 1;
    }
    assert_eq!(from_blocks, folded(&trace, &[]));
    remove_scratch_dir(&dir);
}

#[test]
fn diff_names_the_function_whose_work_doubled() {
    require_perf!();
    let dir = scratch_dir("an-diff");
    let base = record_an_diff(&dir, "base", "1500", None);
    let new = record_an_diff(&dir, "new", "1500", Some("c"));
    let out = ok(&["diff", base.to_str().unwrap(), new.to_str().unwrap()]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert_eq!(first_function(&table), "work_c", "{table}");
    let row = table.lines().nth(2).unwrap();
    assert!(
        row.trim_start().starts_with('+'),
        "work_c did not get slower: {table}"
    );
    // The others lost share.
    for other in ["work_a", "work_b", "work_d"] {
        let line = table
            .lines()
            .find(|l| l.contains(other))
            .unwrap_or_else(|| panic!("{other} missing: {table}"));
        assert!(
            line.trim_start().starts_with('-'),
            "{other} did not lose share; traces {} and {} (kept until the next test run): \
             {table}",
            base.display(),
            new.display()
        );
    }
    let svg = std::fs::read_to_string(dir.join("new.lpt.diff.svg")).unwrap();
    assert!(
        svg.contains("work_c"),
        "work_c is not in the differential flame graph"
    );
    // inferno's differential tooltips carry a signed change.
    let grown = svg
        .split("<title>")
        .find(|t| t.starts_with("work_c ("))
        .expect("a work_c frame");
    assert!(grown.contains("; +"), "{grown}");

    // Reversed, work_c is the one that got faster.
    let back = ok(&[
        "diff",
        new.to_str().unwrap(),
        base.to_str().unwrap(),
        "-o",
        dir.join("back.svg").to_str().unwrap(),
    ]);
    let table = String::from_utf8(back.stdout).unwrap();
    assert_eq!(first_function(&table), "work_c", "{table}");
    assert!(
        table.lines().nth(2).unwrap().trim_start().starts_with('-'),
        "{table}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn open_without_a_browser_prints_the_path() {
    require_perf!();
    let dir = scratch_dir("an-open");
    let trace = record_an_diff(&dir, "o", "200", None);
    let t = trace.to_str().unwrap();
    let svg = dir.join("o.lpt.svg");
    let run = |path: &Path, display: Option<&str>| {
        let mut cmd = Command::new(lrnprof_analyze());
        cmd.args([t, "--format", "svg", "--open"])
            .env("PATH", path)
            .env_remove("DISPLAY")
            .env_remove("WAYLAND_DISPLAY")
            .stdin(Stdio::null());
        if let Some(d) = display {
            cmd.env("DISPLAY", d);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    };
    let empty = dir.join("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let said = run(&empty, Some(":0"));
    assert!(
        said.contains(&format!(
            "no xdg-open here: open {} in a browser",
            svg.display()
        )),
        "{said}"
    );
    let said = run(&empty, None);
    assert!(
        said.contains(&format!("no display: open {}", svg.display())),
        "{said}"
    );

    // An opener that is there is handed the flame graph.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let opened = dir.join("opened.txt");
    let opener = bin.join("xdg-open");
    std::fs::write(
        &opener,
        format!("#!/bin/sh\necho \"$1\" > {}\n", opened.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The opener uses only shell builtins: it needs no PATH of its own.
    let said = run(&bin, Some(":0"));
    assert!(
        said.contains("opening") && said.contains("with xdg-open"),
        "{said}"
    );
    lrnprof_tests::wait_until("the fake opener wrote its argument", || {
        std::fs::read_to_string(&opened).is_ok_and(|s| s.ends_with('\n'))
    });
    assert_eq!(
        std::fs::read_to_string(&opened).unwrap().trim(),
        svg.display().to_string()
    );
    remove_scratch_dir(&dir);
}
