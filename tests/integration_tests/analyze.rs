//! End-to-end tests of `lrnprof-analyze`: record the fixture programs
//! (`tests/fixtures/rec_*.c` from the recorder tests and `an_*.c`) with
//! `lrnprof-rec`, analyze them, and check the call trees, the share of
//! samples that unwound to the thread's root, determinism, and that the
//! outputs open in `go tool pprof` and in speedscope itself.
//!
//! "Reached the root" (as `info` counts it): the outermost frame is the
//! thread's entry (`_start`/`__libc_start_main` for the main thread,
//! `clone`/`clone3`/`start_thread` for the others), or the unwinder stopped
//! cleanly at a zero return address / frame pointer.

use lrnprof_format::{TraceReader, TraceWriter, WriterOptions};
use lrnprof_tests::{build_c, lrnprof_analyze, lrnprof_rec, require_perf, scratch_dir};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Flags that make unwinding depend on DWARF CFI.
const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-pthread"];

/// `--embed none` if this lrnprof-rec embeds image data by default.
fn embed_none() -> &'static [&'static str] {
    if recorder_embeds() {
        &["--embed", "none"]
    } else {
        &[]
    }
}

/// Whether lrnprof-rec has the `--embed` option.
fn recorder_embeds() -> bool {
    let help = Command::new(lrnprof_rec()).arg("--help").output().unwrap();
    String::from_utf8_lossy(&help.stdout).contains("--embed")
}

/// Record `program args` into `dir/name.lpt`.
fn record(dir: &Path, name: &str, extra: &[&str], program: &Path, args: &[&str]) -> PathBuf {
    let trace = dir.join(format!("{name}.lpt"));
    let out = Command::new(lrnprof_rec())
        .arg("--out")
        .arg(&trace)
        .args(extra)
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-rec");
    assert!(
        trace.exists(),
        "lrnprof-rec wrote no trace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}

fn analyze(args: &[&str]) -> Output {
    Command::new(lrnprof_analyze())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-analyze")
}

fn ok(args: &[&str]) -> Output {
    let out = analyze(args);
    assert!(
        out.status.success(),
        "lrnprof-analyze {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Folded output of `trace` with `extra` flags: stack (thread first) -> count.
fn folded(trace: &Path, extra: &[&str]) -> BTreeMap<Vec<String>, u64> {
    let mut args = vec![trace.to_str().unwrap(), "--format", "folded", "-o", "-"];
    args.extend(extra);
    let out = ok(&args);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (stack, count) = l.rsplit_once(' ').expect("`stack count` lines");
            (
                stack.split(';').map(str::to_string).collect(),
                count.parse().expect("a count"),
            )
        })
        .collect()
}

/// `info --json` of `trace`, as text.
fn info(trace: &Path, extra: &[&str]) -> String {
    let mut args = vec!["info", trace.to_str().unwrap(), "--json"];
    args.extend(extra);
    String::from_utf8(ok(&args).stdout).expect("info prints UTF-8")
}

/// The number after the first `"key":` in a JSON text (the tests package
/// has no JSON parser; the keys used here are unique in `info --json`).
fn json_number(json: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let at = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + pat.len();
    let rest = json[at..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

/// Samples whose stack contains `a` immediately followed by `b`.
fn calls(f: &BTreeMap<Vec<String>, u64>, thread_prefix: &str, a: &str, b: &str) -> u64 {
    f.iter()
        .filter(|(s, _)| s[0].starts_with(thread_prefix))
        .filter(|(s, _)| s.windows(2).any(|w| w[0] == a && w[1] == b))
        .map(|(_, c)| c)
        .sum()
}

fn total(f: &BTreeMap<Vec<String>, u64>) -> u64 {
    f.values().sum()
}

fn root_pct(info: &str) -> f64 {
    json_number(info, "unwound_to_root_pct")
}

#[test]
fn threads_call_tree_ratio_and_roots() {
    require_perf!();
    let dir = scratch_dir("an-threads");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "t", &[], &exe, &["1500"]);
    let f = folded(&trace, &[]);
    for worker in ["worker-a-", "worker-b-"] {
        let one = calls(&f, worker, "parent_one", "leaf_work");
        let two = calls(&f, worker, "parent_two", "leaf_work");
        assert!(one >= 20, "{worker}: too few samples in parent_one: {f:?}");
        // 1:2 work ratio; allow 1.4..3.0 for sampling noise.
        let ratio = two as f64 / one as f64;
        assert!(
            (1.4..=3.0).contains(&ratio),
            "{worker}: ratio {ratio} ({one}:{two})"
        );
        for (stack, _) in f.iter().filter(|(s, _)| s[0].starts_with(worker)) {
            assert!(
                ["clone3", "clone", "start_thread"].contains(&stack[1].as_str()),
                "worker stack does not start at the thread entry: {stack:?}"
            );
        }
    }
    let i = info(&trace, &[]);
    assert!(root_pct(&i) >= 99.0, "{i}");
}

#[test]
fn deep_recursion_and_big_frame_reach_the_root() {
    require_perf!();
    let dir = scratch_dir("an-deep");
    let deep = build_c(&["rec_deep.c"], NO_FP, &dir, "rec_deep");
    let big = build_c(&["rec_bigframe.c"], NO_FP, &dir, "rec_bigframe");
    let deep_trace = record(&dir, "deep", &[], &deep, &["1000", "300"]);
    let big_trace = record(&dir, "big", &[], &big, &["1000"]);

    let f = folded(&deep_trace, &[]);
    let full: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start" && s.iter().filter(|n| *n == "descend").count() >= 300)
        .map(|(_, c)| c)
        .sum();
    assert!(
        full as f64 >= 0.99 * total(&f) as f64,
        "only {full} of {} samples unwound through 300 descend frames to _start",
        total(&f)
    );
    assert!(root_pct(&info(&deep_trace, &[])) >= 99.0);

    let f = folded(&big_trace, &[]);
    let through = calls(&f, "", "main", "big_frame") + calls(&f, "", "big_frame", "frame_leaf");
    assert!(calls(&f, "", "big_frame", "frame_leaf") > 0, "{f:?}");
    assert!(through > 0);
    let rooted: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start")
        .map(|(_, c)| c)
        .sum();
    assert!(rooted as f64 >= 0.99 * total(&f) as f64, "{f:?}");
}

#[test]
fn dlopened_library_resolves() {
    require_perf!();
    let dir = scratch_dir("an-dlopen");
    let exe = build_c(
        &["rec_dlopen.c"],
        &["-O2", "-g", "-fomit-frame-pointer", "-ldl"],
        &dir,
        "rec_dlopen",
    );
    let plugin = build_c(
        &["rec_plugin.c"],
        &["-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC"],
        &dir,
        "librec_plugin.so",
    );
    let trace = record(&dir, "dl", &[], &exe, &["1000", plugin.to_str().unwrap()]);
    let f = folded(&trace, &[]);
    assert!(calls(&f, "", "main", "before_load") > 20, "{f:?}");
    assert!(calls(&f, "", "main", "plugin_work") > 20, "{f:?}");
    assert!(calls(&f, "", "plugin_work", "plugin_leaf") > 20, "{f:?}");
    assert!(root_pct(&info(&trace, &[])) >= 99.0);
}

/// Build an_inline and its library libanlib.so into `dir`.
fn build_inline_fixture(dir: &Path, flags: &[&str]) -> PathBuf {
    let mut lib_flags = flags.to_vec();
    lib_flags.extend(["-shared", "-fPIC"]);
    let lib = build_c(&["an_lib.c"], &lib_flags, dir, "libanlib.so");
    // The library goes after the source (linkers using --as-needed care),
    // which build_c cannot express: call cc directly.
    let exe = dir.join("an_inline");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(flags)
        .arg("-I")
        .arg(lrnprof_tests::workspace_root().join("tests/fixtures"))
        .arg("-o")
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source("an_inline.c"))
        .arg(&lib)
        .arg("-Wl,-rpath,$ORIGIN")
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn inline_frames_and_shared_library() {
    require_perf!();
    let dir = scratch_dir("an-inline");
    let exe = build_inline_fixture(&dir, NO_FP);
    let trace = record(&dir, "inl", &[], &exe, &["1000"]);
    let f = folded(&trace, &[]);
    assert!(calls(&f, "", "hot_outer", "mix_step") > 20, "{f:?}");
    assert!(calls(&f, "", "main", "lib_entry") > 20, "{f:?}");
    assert!(calls(&f, "", "lib_entry", "lib_leaf") > 20, "{f:?}");
    let no_inline = folded(&trace, &["--no-inline"]);
    assert_eq!(calls(&no_inline, "", "hot_outer", "mix_step"), 0);
    assert!(calls(&no_inline, "", "main", "hot_outer") > 20);
    assert_eq!(total(&f), total(&no_inline));
    assert!(root_pct(&info(&trace, &[])) >= 99.0);
}

#[test]
fn kernel_callchain_continues_a_short_stack_copy() {
    require_perf!();
    let dir = scratch_dir("an-callchain");
    // Frame pointers kept, so the kernel's callchain is whole (the kernel
    // caps it at perf_event_max_stack, 127 by default: stay below); a 1 KiB
    // stack copy cannot hold 80 frames of ~128 bytes.
    let exe = build_c(
        &["rec_deep.c"],
        &["-O2", "-g", "-fno-omit-frame-pointer"],
        &dir,
        "rec_deep_fp",
    );
    let trace = record(&dir, "cc", &["--stack-size", "1024"], &exe, &["800", "80"]);
    let i = info(&trace, &[]);
    assert!(
        json_number(&i, "kernel_callchain_samples") > 0.0,
        "no sample used the kernel callchain: {i}"
    );
    assert!(root_pct(&i) >= 99.0, "{i}");
    let f = folded(&trace, &[]);
    // glibc has no frame pointers: the kernel's walk ends in
    // __libc_start_call_main, which counts as the main thread's root.
    let roots = ["_start", "__libc_start_main", "__libc_start_call_main"];
    let whole: u64 = f
        .iter()
        .filter(|(s, _)| roots.contains(&s[1].as_str()) && s.contains(&"main".to_string()))
        .filter(|(s, _)| s.iter().filter(|n| *n == "descend").count() >= 80)
        .map(|(_, c)| c)
        .sum();
    assert!(whole as f64 >= 0.99 * total(&f) as f64, "{f:?}");
}

#[test]
fn output_is_identical_at_any_job_count() {
    require_perf!();
    let dir = scratch_dir("an-determinism");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "d", &[], &exe, &["600"]);
    let t = trace.to_str().unwrap();
    for format in ["pprof", "folded", "speedscope"] {
        let a = dir.join(format!("a.{format}"));
        let b = dir.join(format!("b.{format}"));
        ok(&[
            t,
            "--format",
            format,
            "--jobs",
            "1",
            "-o",
            a.to_str().unwrap(),
        ]);
        ok(&[
            t,
            "--format",
            format,
            "--jobs",
            "2",
            "-o",
            b.to_str().unwrap(),
        ]);
        let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert!(!a.is_empty());
        assert!(
            a == b,
            "{format} output differs between --jobs 1 and --jobs 2"
        );
    }
}

#[test]
fn default_output_path_and_filters() {
    require_perf!();
    let dir = scratch_dir("an-filters");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "f", &[], &exe, &["500"]);
    let t = trace.to_str().unwrap();
    ok(&[t, "--format", "folded"]);
    assert!(dir.join("f.lpt.folded").exists());
    let only_a = folded(&trace, &["--thread-name", "worker-a"]);
    assert!(!only_a.is_empty());
    assert!(only_a.keys().all(|s| s[0].starts_with("worker-a-")));
    let early = folded(&trace, &["--to", "0.2"]);
    let all = folded(&trace, &[]);
    assert!(total(&early) < total(&all));
    let none = analyze(&[
        t,
        "--format",
        "folded",
        "--thread-name",
        "no-such-thread",
        "-o",
        "-",
    ]);
    assert!(!none.status.success());
    let msg = String::from_utf8_lossy(&none.stderr);
    assert!(msg.contains("no samples left after filtering"), "{msg}");
    assert_eq!(msg.trim().lines().count(), 1, "{msg}");
}

#[test]
fn bad_and_truncated_traces() {
    require_perf!();
    let dir = scratch_dir("an-corrupt");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "c", &[], &exe, &["600"]);

    // Not a trace at all: one clear line, no output file.
    let junk = dir.join("junk.lpt");
    std::fs::write(&junk, b"this is not a trace").unwrap();
    let out = analyze(&[junk.to_str().unwrap(), "--format", "folded"]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("cannot read trace") && msg.trim().lines().count() == 1,
        "{msg}"
    );
    assert!(!dir.join("junk.lpt.folded").exists());

    let missing = analyze(&[dir.join("nope.lpt").to_str().unwrap()]);
    assert!(!missing.status.success());

    // Cut in the middle: the readable part is analyzed, with a warning.
    // Rewrite the trace with small blocks first, so that a cut leaves
    // whole blocks behind.
    let reader = TraceReader::open(&trace).unwrap();
    let mut small = Vec::new();
    let options = WriterOptions {
        block_size: 4096,
        ..Default::default()
    };
    let mut w = TraceWriter::new(&mut small, reader.header(), options).unwrap();
    for r in reader.records() {
        // Without embedded blobs (which come last), so that the cut
        // falls among samples.
        match r.unwrap() {
            lrnprof_format::Record::Blob(_) => {}
            r => w.write(&r).unwrap(),
        }
    }
    w.finish().unwrap();
    let small_trace = dir.join("small.lpt");
    std::fs::write(&small_trace, &small).unwrap();
    let whole = total(&folded(&small_trace, &[]));
    assert_eq!(whole, total(&folded(&trace, &[])));
    let cut = dir.join("cut.lpt");
    std::fs::write(&cut, &small[..small.len() * 2 / 3]).unwrap();
    let out = ok(&[cut.to_str().unwrap(), "--format", "folded", "-o", "-"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not finished cleanly"), "{stderr}");
    let cut_total: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert!(cut_total > 0 && cut_total < whole, "{cut_total} of {whole}");
}

#[test]
fn pprof_opens_in_go_tool_pprof() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        eprintln!("skipping: `go` is not installed (Debian: golang-go)");
        return;
    }
    let dir = scratch_dir("an-pprof");
    let exe = build_inline_fixture(&dir, NO_FP);
    let trace = record(&dir, "p", &[], &exe, &["600"]);
    ok(&[trace.to_str().unwrap(), "--format", "pprof"]);
    let pb = dir.join("p.lpt.pb.gz");
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-symbolize=none"])
        .arg(&pb)
        .env("HOME", &dir)
        .env("PPROF_TMPDIR", &dir)
        .output()
        .expect("running go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("lib_leaf") && text.contains("mix_step (inline)"),
        "{text}"
    );
    let traces = Command::new("go")
        .args(["tool", "pprof", "-traces", "-symbolize=none"])
        .arg(&pb)
        .env("HOME", &dir)
        .output()
        .unwrap();
    let traces = String::from_utf8_lossy(&traces.stdout);
    assert!(
        traces.contains("thread:") && traces.contains("tid:"),
        "{traces}"
    );
}

/// Serve `root` on 127.0.0.1 from a background thread; returns the port.
fn serve(root: PathBuf) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let path = path
                .split(['?', '#'])
                .next()
                .unwrap_or("/")
                .trim_start_matches('/');
            let file = root.join(if path.is_empty() { "index.html" } else { path });
            let ty = match file.extension().and_then(|e| e.to_str()) {
                Some("html") => "text/html",
                Some("js") => "application/javascript",
                Some("css") => "text/css",
                Some("json") => "application/json",
                Some("wasm") => "application/wasm",
                _ => "application/octet-stream",
            };
            let response = match std::fs::read(&file) {
                Ok(body) if !path.contains("..") => {
                    let mut r = format!("HTTP/1.1 200 OK\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
                    r.extend(body);
                    r
                }
                _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_vec(),
            };
            let _ = stream.write_all(&response);
        }
    });
    port
}

/// The speedscope app from npm, installed once into a cache directory.
fn speedscope_app() -> Result<PathBuf, String> {
    let cache = std::env::temp_dir().join("lrnprof-speedscope-npm");
    let release = cache.join("node_modules/speedscope/dist/release");
    if release.join("index.html").exists() {
        return Ok(release);
    }
    std::fs::create_dir_all(&cache).map_err(|e| e.to_string())?;
    let out = Command::new("npm")
        .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
        .arg(&cache)
        .arg("speedscope")
        .output()
        .map_err(|e| format!("npm not runnable ({e}); Debian: npm"))?;
    if !release.join("index.html").exists() {
        return Err(format!(
            "npm install speedscope failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(release)
}

/// Load `profile` in speedscope in headless Chromium; returns the DOM.
fn speedscope_dom(app: &Path, profile: &Path, dir: &Path) -> String {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    for entry in std::fs::read_dir(app).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), www.join(entry.file_name())).unwrap();
    }
    std::fs::copy(profile, www.join("profile.json")).unwrap();
    let port = serve(www);
    let url = format!(
        "http://127.0.0.1:{port}/index.html#profileURL=http%3A%2F%2F127.0.0.1%3A{port}%2Fprofile.json"
    );
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--virtual-time-budget=20000",
            "--dump-dom",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.join("chromium").display()
        ))
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("running chromium");
    let mut dom = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut dom)
        .unwrap();
    let _ = child.wait();
    dom
}

#[test]
fn speedscope_output_loads_in_speedscope() {
    require_perf!();
    if Command::new("chromium").arg("--version").output().is_err() {
        eprintln!("skipping: chromium is not installed (Debian: chromium)");
        return;
    }
    let app = match speedscope_app() {
        Ok(app) => app,
        Err(why) => {
            eprintln!("skipping: the speedscope app is not available: {why}");
            return;
        }
    };
    let dir = scratch_dir("an-speedscope");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let trace = record(&dir, "s", &[], &exe, &["500"]);
    ok(&[trace.to_str().unwrap(), "--format", "speedscope"]);
    let json = dir.join("s.lpt.speedscope.json");
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(text.starts_with(r#"{"$schema":"https://www.speedscope.app/file-format-schema.json""#));

    let dom = speedscope_dom(&app, &json, &dir);
    assert!(
        !dom.contains("Something went wrong"),
        "speedscope failed to import:\n{dom}"
    );
    assert!(
        dom.contains("s.lpt - speedscope"),
        "profile not loaded:\n{dom}"
    );
    assert!(
        dom.contains("Time Order") && dom.contains("worker-a-"),
        "no flame graph view:\n{dom}"
    );

    // The check can fail: a profile with a dangling frame index is refused.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[]},"profiles":[{"type":"sampled","name":"x","unit":"nanoseconds","startValue":0,"endValue":1,"samples":[[5]],"weights":[1]}]}"#).unwrap();
    let bad_dir = dir.join("bad");
    std::fs::create_dir_all(&bad_dir).unwrap();
    assert!(speedscope_dom(&app, &bad, &bad_dir).contains("Something went wrong"));
}

/// Folded output as text (`--format folded -o -`).
fn folded_text(trace: &Path, extra: &[&str]) -> String {
    let mut args = vec![trace.to_str().unwrap(), "--format", "folded", "-o", "-"];
    args.extend(extra);
    String::from_utf8(ok(&args).stdout).unwrap()
}

/// Record an_inline living with its library in `dir/app`, analyze it, pack
/// it (with and without DWARF) and delete `dir/app`. Returns (trace,
/// packed, packed with debug info, folded before, folded --no-inline
/// before).
fn packed_post_mortem(dir: &Path) -> (PathBuf, PathBuf, PathBuf, String, String) {
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = build_inline_fixture(&app, NO_FP);
    let trace = record(dir, "pm", embed_none(), &exe, &["800"]);
    let before = folded_text(&trace, &[]);
    let before_no_inline = folded_text(&trace, &["--no-inline"]);
    assert!(before.contains("hot_outer;mix_step") && before.contains("lib_entry;lib_leaf"));
    let packed = dir.join("packed.lpt");
    let packed_debug = dir.join("packed-debug.lpt");
    let t = trace.to_str().unwrap();
    ok(&["pack", t, "-o", packed.to_str().unwrap()]);
    ok(&["pack", t, "--debug", "-o", packed_debug.to_str().unwrap()]);
    std::fs::remove_dir_all(&app).unwrap();
    (trace, packed, packed_debug, before, before_no_inline)
}

#[test]
fn packed_trace_analyzes_after_the_binaries_are_gone() {
    require_perf!();
    let dir = scratch_dir("an-postmortem");
    let (trace, packed, packed_debug, before, before_no_inline) = packed_post_mortem(&dir);

    // Unpacked, the executable and its library are now unknown.
    let lost = folded_text(&trace, &["--no-inline"]);
    assert_ne!(lost, before_no_inline);
    assert!(
        lost.contains("an_inline+0x") || lost.contains("libanlib.so+0x"),
        "{lost}"
    );

    // Symbol tables and unwind sections: the same stacks (without inline
    // frames, which need DWARF).
    assert_eq!(folded_text(&packed, &["--no-inline"]), before_no_inline);
    // With DWARF embedded: inline frames too, and file:line in speedscope.
    assert_eq!(folded_text(&packed_debug, &[]), before);
    let p = packed_debug.to_str().unwrap();
    let json = String::from_utf8(ok(&[p, "--format", "speedscope", "-o", "-"]).stdout).unwrap();
    assert!(
        json.contains(r#""name":"mix_step","file":""#) && json.contains("an_inline.c"),
        "{json}"
    );
    let i = info(&packed_debug, &[]);
    assert!(i.contains("embedded in trace"), "{i}");
}

#[test]
fn recorder_embedded_debug_data_suffices() {
    require_perf!();
    if !recorder_embeds() {
        eprintln!("skipping: this lrnprof-rec has no --embed option");
        return;
    }
    let dir = scratch_dir("an-embed-debug");
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let exe = build_inline_fixture(&app, NO_FP);
    let trace = record(&dir, "ed", &["--embed", "debug"], &exe, &["800"]);
    let before = folded_text(&trace, &[]);
    assert!(before.contains("hot_outer;mix_step"), "{before}");
    std::fs::remove_dir_all(&app).unwrap();
    assert_eq!(folded_text(&trace, &[]), before);
    let p = trace.to_str().unwrap();
    let json = String::from_utf8(ok(&[p, "--format", "speedscope", "-o", "-"]).stdout).unwrap();
    assert!(json.contains("an_inline.c"), "no file names: {json}");
}

#[test]
fn offline_uses_only_embedded_data() {
    require_perf!();
    let dir = scratch_dir("an-offline");
    let (_, packed, packed_debug, before, _) = packed_post_mortem(&dir);
    // libc, ld.so and the vDSO are still here, but --offline must not read
    // them: everything comes from the trace, with the same result.
    assert_eq!(folded_text(&packed_debug, &["--offline"]), before);
    let i = info(&packed_debug, &["--offline"]);
    assert!(
        !i.contains("\"unwind_data\": \"/"),
        "a local file was used: {i}"
    );
    // Without DWARF in the trace, offline libc names come from its symbol
    // tables: still every frame known.
    let out = ok(&[
        packed.to_str().unwrap(),
        "--offline",
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("0.0% unknown frames"), "{stderr}");
}

#[test]
fn local_file_with_another_build_id_is_not_used() {
    require_perf!();
    let dir = scratch_dir("an-mismatch");
    let (_, _, packed_debug, before, _) = packed_post_mortem(&dir);
    // Same path, different program: another build id.
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    build_inline_fixture(&app, &["-O1", "-g"]);
    let out = ok(&[
        packed_debug.to_str().unwrap(),
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), before);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not using") && stderr.contains("differs from the recorded"),
        "{stderr}"
    );
    let i = info(&packed_debug, &[]);
    assert!(i.contains("differs from the recorded"), "{i}");
}

#[test]
fn stripped_trace_has_no_stack_bytes_and_the_same_stacks() {
    require_perf!();
    let dir = scratch_dir("an-strip");
    let (_, _, packed_debug, before, _) = packed_post_mortem(&dir);
    let stripped = dir.join("stripped.lpt");
    ok(&[
        "strip",
        packed_debug.to_str().unwrap(),
        "-o",
        stripped.to_str().unwrap(),
    ]);
    let reader = TraceReader::open(&stripped).unwrap();
    let mut samples = 0;
    for r in reader.records() {
        if let lrnprof_format::Record::Sample(s) = r.unwrap() {
            samples += 1;
            assert!(
                s.stack.bytes.is_empty(),
                "stack bytes left in a stripped sample"
            );
            assert!(s.kernel_callchain.is_empty());
            assert!(!s.frames.is_empty());
        }
    }
    assert!(samples > 0);
    assert_eq!(folded_text(&stripped, &["--offline"]), before);
}

#[test]
fn symbols_dir_with_build_id_layout_names_a_stripped_binary() {
    require_perf!();
    let dir = scratch_dir("an-symbols");
    let exe = build_inline_fixture(&dir, NO_FP);
    // Keep the DWARF in DIR/.build-id/xx/rest.debug, strip the binary.
    let syms = dir.join("syms");
    let debug = dir.join("an_inline.debug");
    let run = |args: &[&str]| {
        let out = Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect("running binutils");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    run(&[
        "objcopy",
        "--only-keep-debug",
        exe.to_str().unwrap(),
        debug.to_str().unwrap(),
    ]);
    run(&["strip", "--strip-debug", exe.to_str().unwrap()]);
    let notes = run(&["readelf", "-n", exe.to_str().unwrap()]);
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the fixture has a build id")
        .trim()
        .to_string();
    let sub = syms.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::rename(&debug, sub.join(format!("{}.debug", &id[2..]))).unwrap();

    let trace = record(&dir, "sy", embed_none(), &exe, &["600"]);
    let without = folded_text(&trace, &[]);
    assert!(!without.contains("mix_step"), "{without}");
    let with = folded_text(&trace, &["--symbols", syms.to_str().unwrap()]);
    assert!(with.contains("hot_outer;mix_step"), "{with}");
    let i = info(&trace, &["--symbols", syms.to_str().unwrap()]);
    assert!(i.contains(".build-id"), "{i}");
    // A symbols directory that does not exist is a clear error.
    let bad = analyze(&[
        trace.to_str().unwrap(),
        "--symbols",
        "/no/such/dir",
        "-o",
        "-",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("symbols directory"));
}

/// The `bl` in `caller`'s code that calls `callee`: the return address
/// (the instruction after it).
fn return_after_bl(text: &[u8], text_svma: u64, caller: (u64, u64), callee: u64) -> u64 {
    let (start, size) = caller;
    (start..start + size)
        .step_by(4)
        .find(|&pc| {
            let at = (pc - text_svma) as usize;
            let insn = u32::from_le_bytes(text[at..at + 4].try_into().unwrap());
            // BL: 100101 imm26, target = pc + sign_extend(imm26) * 4.
            insn & 0xfc00_0000 == 0x9400_0000 && {
                let imm = ((insn & 0x03ff_ffff) << 6) as i32 >> 6;
                pc.wrapping_add_signed(i64::from(imm) * 4) == callee
            }
        })
        .map(|pc| pc + 4)
        .unwrap_or_else(|| panic!("no bl to {callee:#x} in {caller:x?}"))
}

#[test]
fn aarch64_linux_trace_unwinds_through_elf_cfi_at_a_slid_address() {
    use lrnprof_format::*;
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
    let dir = scratch_dir("an-arm64");
    let exe = dir.join("an_arm64");
    let built = Command::new("clang")
        .args([
            "--target=aarch64-linux-gnu",
            "-O2",
            "-g",
            "-fno-omit-frame-pointer",
            "-ffreestanding",
            "-nostdlib",
            "-fPIE",
            "-fasynchronous-unwind-tables",
            "-fuse-ld=lld",
            "-Wl,-pie",
            "-Wl,-e,start",
            "-Wl,--build-id",
            "-Wl,--eh-frame-hdr",
            "-o",
        ])
        .arg(&exe)
        .arg(lrnprof_tests::fixture_source("an_arm64.c"))
        .output();
    match built {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!(
                "skipping: clang cannot build an aarch64 ELF here (Debian: clang lld): {other:?}"
            );
            return;
        }
    }
    let bytes = std::fs::read(&exe).unwrap();
    let obj = object::File::parse(&bytes[..]).unwrap();
    let sym = |name: &str| {
        let s = obj.symbols().find(|s| s.name() == Ok(name)).unwrap();
        (s.address(), s.size())
    };
    let (leaf, middle, outer, start) = (sym("leaf"), sym("middle"), sym("outer"), sym("start"));
    let text = obj.section_by_name(".text").unwrap();
    let (text_svma, text_bytes) = (text.address(), text.data().unwrap());
    let ret_middle = return_after_bl(text_bytes, text_svma, middle, leaf.0);
    let ret_outer = return_after_bl(text_bytes, text_svma, outer, middle.0);
    let ret_start = return_after_bl(text_bytes, text_svma, start, outer.0);

    // Loaded 0x7fa0_0000_0000 above its SVMAs, as a PIE would be.
    const SLIDE: u64 = 0x7fa0_0000_0000;
    let pid = Pid(77);
    let mut records = vec![Record::Thread(ThreadRecord {
        time: Timestamp(1),
        pid,
        tid: Tid(77),
        event: ThreadEvent::Existing,
        name: Some("arm".into()),
    })];
    let build_id = obj.build_id().unwrap().map(|b| BuildId(b.to_vec()));
    for seg in obj.segments() {
        let (offset, size) = seg.file_range();
        let exec = matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & 1 != 0);
        // What the kernel maps: whole pages.
        let page_start = seg.address() & !0xfff;
        let page_end = (seg.address() + size + 0xfff) & !0xfff;
        records.push(Record::ImageMap(ImageMapRecord {
            time: Timestamp(2),
            pid,
            start: SLIDE + page_start,
            end: SLIDE + page_end.max(page_start + 0x1000),
            file_offset: offset & !0xfff,
            path: exe.to_string_lossy().into_owned(),
            build_id: build_id.clone(),
            kind: ImageKind::File,
            executable: exec,
        }));
    }
    // leaf has no frame record: sp = middle's record, lr = into middle.
    // Records (fp, lr) at S (middle), S+16 (outer), S+48 (start, whose
    // frame is 32 bytes with the record at its top); start's record ends
    // the chain with zeros.
    const S: u64 = 0xffff_f000_0000;
    let words: [u64; 10] = [
        S + 16,            // S+0:  middle's saved fp = outer's record
        SLIDE + ret_outer, // S+8:  middle's saved lr
        S + 48,            // S+16: outer's saved fp = start's record
        SLIDE + ret_start, // S+24: outer's saved lr
        0,                 // S+32: start's locals
        0,                 // S+40
        0,                 // S+48: start's saved fp: end of chain
        0,                 // S+56: start's saved lr
        0,
        0,
    ];
    let stack: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    for i in 0..3 {
        records.push(Record::Sample(Sample {
            time: Timestamp(10 + i),
            pid,
            tid: Tid(77),
            cpu: None,
            kind: SampleKind::CpuTime,
            weight: 1_000_000,
            regs: Regs::Aarch64(RegsAarch64 {
                pc: SLIDE + leaf.0 + 12,
                sp: S,
                fp: S,
                lr: SLIDE + ret_middle,
            }),
            stack: StackSnapshot {
                start: S,
                bytes: stack.clone(),
            },
            kernel_callchain: Vec::new(),
            frames: Vec::new(),
        }));
    }
    let header = TraceHeader {
        arch: Arch::Aarch64,
        ..TraceHeader::example()
    };
    let trace = dir.join("arm.lpt");
    let mut out = Vec::new();
    let mut w = TraceWriter::new(&mut out, &header, WriterOptions::default()).unwrap();
    for r in &records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    std::fs::write(&trace, out).unwrap();

    assert_eq!(
        folded_text(&trace, &[]),
        "arm-77;start;outer;middle;leaf 3\n"
    );
    let i = info(&trace, &[]);
    assert!(root_pct(&i) >= 99.0, "{i}");
}

#[test]
fn jit_frames_are_named_from_the_perf_map() {
    require_perf!();
    if std::env::consts::ARCH != "x86_64" {
        eprintln!("skipping: the JIT fixture is x86_64 machine code");
        return;
    }
    let dir = scratch_dir("an-jit");
    let exe = build_c(&["an_jit.c"], NO_FP, &dir, "an_jit");
    let trace = record(&dir, "jit", &[], &exe, &["800"]);
    let pid = String::from_utf8(ok(&["info", trace.to_str().unwrap(), "--json"]).stdout).unwrap();
    let pid = json_number(&pid, "pid") as u32;
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let f = folded(&trace, &[]);
    let _ = std::fs::remove_file(&map);
    assert!(calls(&f, "", "call_jit", "jit_loop") > 20, "{f:?}");
    assert!(calls(&f, "", "main", "call_jit") > 20, "{f:?}");
    let rooted: u64 = f
        .iter()
        .filter(|(s, _)| s[1] == "_start")
        .map(|(_, c)| c)
        .sum();
    assert!(rooted as f64 >= 0.99 * total(&f) as f64, "{f:?}");
}
