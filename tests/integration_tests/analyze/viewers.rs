//! The outputs open in the real tools: `go tool pprof` and speedscope
//! (the npm package's built app) in headless Chromium.

use super::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

#[test]
fn pprof_opens_in_go_tool_pprof() {
    require_perf!();
    if Command::new("go").arg("version").output().is_err() {
        skip!("`go` is not installed (Debian: golang-go)");
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
            // speedscope draws with WebGL: without a GPU, Chromium 137 and
            // later offer it only through SwiftShader when asked to.
            "--use-angle=swiftshader",
            "--enable-unsafe-swiftshader",
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
        skip!("chromium is not installed (Debian: chromium)");
    }
    let app = match speedscope_app() {
        Ok(app) => app,
        Err(why) => skip!("the speedscope app is not available: {why}"),
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
