//! Helpers shared by the end-to-end tests: building the fixture programs
//! with `cc` and `rustc`, finding the built `lrnprof-rec` / `lrnprof-analyze`, scratch
//! directories, checking whether `perf_event_open` may be used here, and
//! what a test does when it cannot make its check: fail under `CI=true`,
//! skip (saying why) elsewhere.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// `tests/fixtures/NAME`.
pub fn fixture_source(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures").join(name)
}

/// A fresh, empty scratch directory for one test (named after it and this
/// test process, so parallel tests and runs do not collide). The first
/// one of a process removes those of test processes that have exited
/// (see [`remove_stale_scratch_dirs`]).
pub fn scratch_dir(test: &str) -> PathBuf {
    static STALE: std::sync::Once = std::sync::Once::new();
    STALE.call_once(remove_stale_scratch_dirs);
    let dir = std::env::temp_dir().join(format!("lrnprof-test-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

/// Remove the scratch directories of test processes that are no longer
/// running (Linux only: elsewhere there is no `/proc` to tell). Tests that
/// do not remove theirs, and each process's frame cache (about 10 MB with
/// libc's DWARF), would otherwise fill the temp directory run after run;
/// a failed test's directory stays until the next run starts.
fn remove_stale_scratch_dirs() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("lrnprof-test-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Remove a [`scratch_dir`] at the end of a test that passed (one that
/// fails leaves its directory behind to look at, until the next run).
pub fn remove_scratch_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// How long [`wait_until`] waits at most: far longer than any condition
/// takes on a loaded machine. Only a bound for failing, never a wait that
/// makes a test pass.
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Poll `condition` until it holds. Panics, saying that `what` never
/// happened, after [`WAIT_LIMIT`] (the test failed then; it never passes
/// on time alone).
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_LIMIT;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{what}: not after {WAIT_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether this process runs as root (`id -u` says 0).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Whether `program --help` can be run here (the program is installed).
pub fn has_program(program: &str) -> bool {
    Command::new(program).arg("--help").output().is_ok()
}

/// Compile C `sources` (file names in `tests/fixtures/`) with `cc` and
/// `flags` into `dir/output`; panics with cc's message if it fails.
pub fn build_c(sources: &[&str], flags: &[&str], dir: &Path, output: &str) -> PathBuf {
    let out = dir.join(output);
    let result = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(flags)
        .arg("-I")
        .arg(workspace_root().join("tests/fixtures"))
        .arg("-o")
        .arg(&out)
        .args(sources.iter().map(|s| fixture_source(s)))
        .output()
        .expect("running cc (install gcc or set CC)");
    assert!(
        result.status.success(),
        "cc {sources:?} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// Build the `tests/fixtures/go_spin` Go program into `dir/name` with
/// `flags`, for `goarch` (`GOARCH`) if given, with a private build cache
/// and offline (it uses the standard library only); panics with Go's
/// message if it fails.
pub fn build_go_spin(dir: &Path, name: &str, flags: &[&str], goarch: Option<&str>) -> PathBuf {
    let exe = dir.join(name);
    let mut go = Command::new("go");
    if let Some(arch) = goarch {
        go.env("GOARCH", arch);
    }
    let out = go
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(".")
        .current_dir(workspace_root().join("tests/fixtures/go_spin"))
        .env("HOME", dir)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("running go build");
    assert!(
        out.status.success(),
        "go build of tests/fixtures/go_spin failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Compile the Rust program `source` (a file name in `tests/fixtures/`)
/// with `rustc` (`$RUSTC` if set) and `flags` into `dir/output`; panics
/// with rustc's message if it fails.
pub fn build_rust(source: &str, flags: &[&str], dir: &Path, output: &str) -> PathBuf {
    let out = dir.join(output);
    let result = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(fixture_source(source))
        .output()
        .expect("running rustc (install Rust with rustup or set RUSTC)");
    assert!(
        result.status.success(),
        "rustc {source} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// Build a binary of this workspace with cargo (once per test process, so
/// it is never stale) and return its path next to this test binary.
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(bin) {
        return p.clone();
    }
    // This test binary is <target>/<profile>/deps/integration_tests-HASH.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary inside <target>/<profile>/deps");
    let target_dir = profile_dir.parent().expect("a target directory");
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(workspace_root());
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("running cargo build");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    let path = profile_dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} was not built", path.display());
    built.insert(bin.to_string(), path.clone());
    path
}

/// The `lrnprof-rec` binary.
pub fn lrnprof_rec() -> PathBuf {
    workspace_binary("lrnprof-recorder", "lrnprof-rec")
}

/// A command that runs [`lrnprof_rec`] with its frame cache
/// (`LRNPROF_CACHE_DIR`) in a directory of this test process, empty when
/// the process started: tests neither see what other runs kept nor fill
/// the user's cache, and still record as users do, with a cache.
pub fn lrnprof_rec_command() -> Command {
    static CACHE: OnceLock<PathBuf> = OnceLock::new();
    let dir = CACHE.get_or_init(|| scratch_dir("frame-cache"));
    let mut command = Command::new(lrnprof_rec());
    command.env("LRNPROF_CACHE_DIR", dir);
    command
}

/// The `lrnprof-analyze` binary.
pub fn lrnprof_analyze() -> PathBuf {
    workspace_binary("lrnprof-analyzer", "lrnprof-analyze")
}

/// `None` if this machine lets us sample our own processes with
/// `perf_event_open` (Linux only); otherwise why not, for a skip message.
/// Decided once, by recording `true` with `lrnprof-rec`.
pub fn perf_unavailable() -> Option<String> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| {
            if !cfg!(target_os = "linux") {
                return Some("perf_event_open exists only on Linux".into());
            }
            probe_recording("perf-probe", &[], &["not permitted", "not supported"])
        })
        .clone()
}

/// `None` if this machine lets us trace our own processes' system calls
/// and context switches (tracefs mounted, tracepoints and kernel-side
/// events permitted); otherwise why not, for a skip message. Decided once,
/// by recording `true` with `lrnprof-rec --syscalls --off-cpu`.
pub fn tracing_unavailable() -> Option<String> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| {
            perf_unavailable().or_else(|| {
                probe_recording(
                    "tracing-probe",
                    &["--syscalls", "--off-cpu"],
                    &["not permitted", "cannot trace system calls"],
                )
            })
        })
        .clone()
}

/// Record `true` with `lrnprof-rec ARGS`: `None` if that works, else the
/// recorder's error when it contains one of `refusals` (a reason to skip);
/// any other failure panics.
fn probe_recording(name: &str, args: &[&str], refusals: &[&str]) -> Option<String> {
    let dir = scratch_dir(name);
    let out = lrnprof_rec_command()
        .arg("--out")
        .arg(dir.join("probe.lpt"))
        .args(args)
        .args(["--", "true"])
        .output()
        .expect("running lrnprof-rec");
    remove_scratch_dir(&dir);
    if out.status.success() {
        return None;
    }
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if refusals.iter().any(|r| stderr.contains(r)) {
        Some(stderr.trim().to_string())
    } else {
        panic!("lrnprof-rec {args:?} failed for another reason than permissions: {stderr}")
    }
}

/// Whether the tests run under CI: `CI=true` (or `CI=1`), as CI services
/// set it. There a test that cannot make its check fails (see
/// [`cannot_check`]).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// For a test that cannot make its check on this machine (a missing tool or
/// permission), saying `why`: under [`in_ci`] it panics, so the test fails
/// with the reason; elsewhere it prints the reason and returns, and the
/// caller skips its check. Use it through [`skip!`] or [`require_perf!`].
pub fn cannot_check(why: &str) {
    if in_ci() {
        panic!("CI is set, and this test cannot make its check here: {why}");
    }
    eprintln!("skipping: {why} (under CI=true this test fails instead)");
}

/// End the calling test without its check, saying why (a `format!`
/// message): it fails under `CI=true` and is skipped elsewhere
/// ([`cannot_check`]).
#[macro_export]
macro_rules! skip {
    ($($why:tt)+) => {{
        $crate::cannot_check(&format!($($why)+));
        return;
    }};
}

/// [`skip!`] the calling test when syscall tracing and off-CPU recording
/// are not permitted or not available here (see [`tracing_unavailable`]).
#[macro_export]
macro_rules! require_tracing {
    () => {
        if let Some(why) = $crate::tracing_unavailable() {
            $crate::skip!("syscall tracing is not usable here: {why}");
        }
    };
}

/// [`skip!`] the calling test when `perf_event_open` is not permitted or
/// not available here.
#[macro_export]
macro_rules! require_perf {
    () => {
        if let Some(why) = $crate::perf_unavailable() {
            $crate::skip!("perf_event_open is not usable here: {why}");
        }
    };
}
