//! Debug files from elsewhere: a trace recorded where the image had no
//! DWARF (a stripped binary, no debug package) is named with the debug file
//! the analyzing machine has (`--symbols`), or fetches by build id from
//! debuginfod servers (`--debuginfod`, through elfutils'
//! `debuginfod-find`).

use super::*;
use lrnprof_tests::{has_program, is_root};
use object::Object;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A debuginfod server for this test on a port of its own: `GET PATH`
/// gets the file `files` gives for `PATH` (`/buildid/ID/debuginfo`,
/// `/buildid/ID/executable`), anything else 404. Returns its URL and how
/// many requests it answered.
fn serve(files: Vec<(String, PathBuf)>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Ok(read) = stream.try_clone() else {
                continue;
            };
            let mut reader = BufReader::new(read);
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // The headers, up to the blank line.
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(n) if n > 0 && line != "\r\n" => {}
                    _ => break,
                }
            }
            let file = files
                .iter()
                .find(|(path, _)| request.starts_with(&format!("GET {path} ")));
            let response = if let Some((_, file)) = file {
                let body = std::fs::read(file).unwrap();
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend(body);
                r
            } else {
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            };
            let _ = stream.write_all(&response);
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (url, answered)
}

/// The build id of the image `exe`, in hex.
fn build_id_hex(exe: &Path) -> String {
    let bytes = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    lrnprof_format::BuildId(file.build_id().unwrap().expect("a build id").to_vec()).to_hex()
}

/// Move `exe`'s DWARF and symbols into the debug file `debug`, as
/// distributions' debug packages are made, and strip `exe`; its build id
/// in hex.
fn split_debug(exe: &Path, debug: &Path) -> String {
    run_tool(
        "objcopy",
        [
            "--only-keep-debug".as_ref(),
            exe.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run_tool("objcopy", ["--strip-all".as_ref(), exe.as_os_str()]);
    build_id_hex(exe)
}

/// Samples whose stack ends `main`, `dwz_outer`, `dwz_inner` (inlined).
fn named(f: &BTreeMap<Vec<String>, u64>) -> u64 {
    ending_with(f, &["main", "dwz_outer", "dwz_inner"])
}

/// Folded output of `trace` with `args` into `output` (`-`: stdout),
/// through `debuginfod` at `url` (none: `DEBUGINFOD_URLS` unset), its cache
/// under `dir`.
fn folded_with(dir: &Path, url: Option<&str>, trace: &Path, output: &str, args: &[&str]) -> Output {
    let mut command = Command::new(lrnprof_analyze());
    command
        .arg(trace)
        .args(["--format", "folded", "-o", output])
        .args(args)
        .env("DEBUGINFOD_CACHE_PATH", dir.join("debuginfod-cache"))
        .env_remove("DEBUGINFOD_URLS")
        .stdin(Stdio::null());
    if let Some(url) = url {
        command.env("DEBUGINFOD_URLS", url);
    }
    command.output().expect("running lrnprof-analyze")
}

fn parse_folded(out: &Output) -> BTreeMap<Vec<String>, u64> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (stack, count) = l.rsplit_once(' ')?;
            Some((
                stack.split(';').map(str::to_string).collect(),
                count.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn a_trace_recorded_without_debug_info_is_named_by_debug_files_found_later() {
    require_perf!();
    let dir = scratch_dir("an-debuginfod");
    let exe = build_c(&["an_dwz.c"], &["-O2", "-g"], &dir, "stripped");
    let syms = dir.join("syms");
    std::fs::create_dir_all(&syms).unwrap();
    let debug = syms.join("stripped.debug");
    let id = split_debug(&exe, &debug);
    let trace = record(&dir, "stripped", &[], &exe, &["400"]);
    // As recorded: no function of the program is named.
    let f = folded(&trace, &[]);
    assert_eq!(named(&f), 0, "{f:?}");
    assert!(f.values().sum::<u64>() >= 100, "{f:?}");
    // The debug file in a --symbols directory names them, inline frame
    // included, though the trace's frame table has every address.
    let f = folded(&trace, &["--symbols", syms.to_str().unwrap()]);
    assert!(named(&f) >= 100, "--symbols: {f:?}");

    let Some(_) = ["debuginfod-find"]
        .iter()
        .find(|t| Command::new(t).arg("--help").output().is_ok())
    else {
        skip!("debuginfod-find is not installed (Debian: apt-get install debuginfod)");
    };
    let (url, answered) = serve(vec![(format!("/buildid/{id}/debuginfo"), debug.clone())]);
    let f = parse_folded(&folded_with(
        &dir,
        Some(&url),
        &trace,
        "-",
        &["--debuginfod"],
    ));
    assert!(named(&f) >= 100, "--debuginfod: {f:?}");
    assert!(answered.load(Ordering::SeqCst) >= 1);
    // A server that has nothing: named as recorded, with the reason noted.
    let (empty, _) = serve(Vec::new());
    let out = Command::new(lrnprof_analyze())
        .args(["info", "--debuginfod"])
        .arg(&trace)
        .env("DEBUGINFOD_CACHE_PATH", dir.join("debuginfod-cache-2"))
        .env("DEBUGINFOD_URLS", &empty)
        .output()
        .expect("running lrnprof-analyze");
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(
        info.contains("not fetched from the debuginfod servers"),
        "{info}"
    );

    // Without servers to ask: a clear error and no output.
    let output = dir.join("none.folded");
    let out = folded_with(
        &dir,
        None,
        &trace,
        output.to_str().unwrap(),
        &["--debuginfod"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("DEBUGINFOD_URLS"),
        "{stderr}"
    );
    assert!(!output.exists());
    let out = folded_with(
        &dir,
        Some(&url),
        &trace,
        "-",
        &["--debuginfod", "--offline"],
    );
    assert!(!out.status.success());

    // A trace recorded with --embed none, analyzed where the program is
    // not: its unwind tables come from the servers too (the executable),
    // and its names from the debug file.
    let bare = record(&dir, "bare", &["--embed", "none"], &exe, &["400"]);
    let served = dir.join("served");
    std::fs::rename(&exe, &served).unwrap();
    let (url, _) = serve(vec![
        (format!("/buildid/{id}/executable"), served),
        (
            format!("/buildid/{id}/debuginfo"),
            dir.join("syms/stripped.debug"),
        ),
    ]);
    let f = parse_folded(&folded_with(
        &dir,
        Some(&url),
        &bare,
        "-",
        &["--debuginfod"],
    ));
    let rooted: u64 = f
        .iter()
        .filter(|(s, _)| s.get(1).is_some_and(|f| f == "_start"))
        .map(|(_, c)| c)
        .sum();
    assert!(
        named(&f) >= 100 && rooted as f64 >= 0.9 * total(&f) as f64,
        "--embed none, --debuginfod: {f:?}"
    );
    remove_scratch_dir(&dir);
}

#[test]
fn a_containers_own_debug_files_name_its_frames() {
    require_perf!();
    // A chroot stands in for a container: the debug file is in the
    // container's build-id tree, which the host's does not have.
    if !is_root() || !has_program("chroot") {
        skip!("needs root and chroot");
    }
    let dir = scratch_dir("an-container-debug");
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    // Static, so the root needs no libraries.
    let exe = build_c(&["an_dwz.c"], &["-O2", "-g", "-static"], &root, "prog");
    let id = build_id_hex(&exe);
    let tree = root.join("usr/lib/debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&tree).unwrap();
    split_debug(&exe, &tree.join(format!("{}.debug", &id[2..])));
    // Record `program` (a path in the root) run in the root.
    let record_in_root = |name: &str, program: &str| {
        let args = [root.to_str().unwrap(), program, "400"];
        record(&dir, name, &[], Path::new("chroot"), &args)
    };
    let trace = record_in_root("container", "/prog");
    let f = folded(&trace, &[]);
    assert!(named(&f) >= 100, "{f:?}");
    assert_eq!(folded(&trace, &["--offline"]), f);
    // Found by its .gnu_debuglink beside the program inside the root.
    // Another build (another build id) than the program above.
    let exe = build_c(
        &["an_dwz.c"],
        &["-O2", "-g", "-static", "-DVARIANT=2"],
        &root,
        "linked",
    );
    split_debug(&exe, &root.join("linked.debug"));
    let link = format!(
        "--add-gnu-debuglink={}",
        root.join("linked.debug").display()
    );
    run_tool("objcopy", [link.as_ref(), exe.as_os_str()]);
    let trace = record_in_root("linked", "/linked");
    let f = folded(&trace, &[]);
    assert!(named(&f) >= 100, "by .gnu_debuglink: {f:?}");
    remove_scratch_dir(&dir);
}
