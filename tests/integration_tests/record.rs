//! End-to-end tests of `lrnprof-rec` on Linux: build the C fixtures in
//! `tests/fixtures/rec_*.c`, record them by launching and by attaching,
//! and check the traces with `TraceReader`. Tests that need
//! `perf_event_open` skip with a message when it is not permitted.

use lrnprof_format::{
    ImageKind, ImageMapRecord, Pid, ProcessEvent, Record, Sample, Summary, Target, ThreadEvent,
    TraceReader,
};
use lrnprof_tests::{build_c, lrnprof_rec, require_perf, scratch_dir};
use object::{Object, ObjectSegment, ObjectSymbol};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Flags that make unwinding depend on DWARF CFI.
const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-pthread"];

fn rec(args: &[&OsStr]) -> Output {
    Command::new(lrnprof_rec())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-rec")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Record `program args` by launching it; asserts the recorder ran.
fn launch(out: &Path, extra: &[&str], program: &Path, args: &[&str]) -> Output {
    let mut a: Vec<&OsStr> = vec![os("--out"), out.as_os_str()];
    a.extend(extra.iter().map(|s| os(s)));
    a.push(os("--"));
    a.push(program.as_os_str());
    a.extend(args.iter().map(|s| os(s)));
    rec(&a)
}

/// Every record of a trace, which must decode without errors.
fn load(path: &Path) -> (TraceReader<Vec<u8>>, Vec<Record>) {
    let reader = TraceReader::open(path).expect("opening the trace");
    let records = reader
        .records()
        .collect::<Result<Vec<_>, _>>()
        .expect("decoding every block");
    (reader, records)
}

fn samples(records: &[Record]) -> Vec<&Sample> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s),
            _ => None,
        })
        .collect()
}

fn images(records: &[Record]) -> Vec<&ImageMapRecord> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::ImageMap(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn summary(records: &[Record]) -> &Summary {
    records
        .iter()
        .find_map(|r| match r {
            Record::Summary(s) => Some(s),
            _ => None,
        })
        .expect("a Summary record")
}

/// The trace was finished cleanly, lost nothing, and its summary matches
/// its records.
fn assert_complete(reader: &TraceReader<Vec<u8>>, records: &[Record]) {
    assert!(reader.report().finished, "{:?}", reader.report());
    let s = summary(records);
    assert_eq!(s.samples, samples(records).len() as u64);
    assert_eq!(s.images, images(records).len() as u64);
    assert_eq!(s.lost, 0, "samples were lost at 1 kHz");
    assert!(!records.iter().any(|r| matches!(r, Record::Lost(_))));
}

/// Records are in time order (records without a time excepted).
fn assert_time_ordered(records: &[Record]) {
    let times: Vec<u64> = records
        .iter()
        .filter_map(|r| r.time())
        .map(|t| t.0)
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "records out of time order"
    );
}

/// Every sample's instruction pointer lies in an executable image of its
/// process mapped no later than the sample, its stack copy starts at its
/// stack pointer, and almost all copies have bytes.
fn assert_samples_plausible(records: &[Record]) {
    let maps = images(records);
    for s in samples(records) {
        assert!(
            maps.iter().any(|m| m.pid == s.pid
                && m.executable
                && m.time <= s.time
                && (m.start..m.end).contains(&s.regs.ip())),
            "sample ip {:#x} of pid {} is in no image",
            s.regs.ip(),
            s.pid.0
        );
        assert_eq!(s.stack.start, s.regs.sp());
        assert!(s.stack.bytes.len() <= 65528);
        assert!(s.weight > 0);
    }
    // The kernel copies stacks in interrupt context and cannot fault pages
    // in: a sample on a stack page not yet touched (a new thread) has no
    // bytes. That must stay rare.
    let all = samples(records);
    let empty = all.iter().filter(|s| s.stack.bytes.is_empty()).count();
    assert!(
        empty * 20 <= all.len(),
        "{empty} of {} stack copies empty",
        all.len()
    );
}

/// The GNU build id of an ELF file.
fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.build_id()
        .unwrap()
        .expect("fixture has a build id")
        .to_vec()
}

/// AVMA range of `symbol` of `exe` in process `pid`, from the trace's
/// mapping of `exe` (bias from the segment containing the symbol).
fn symbol_avma(records: &[Record], pid: Pid, exe: &Path, symbol: &str) -> std::ops::Range<u64> {
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(symbol))
        .unwrap_or_else(|| panic!("{symbol} not in {}", exe.display()));
    let seg = file
        .segments()
        .find(|s| (s.address()..s.address() + s.size()).contains(&sym.address()))
        .expect("a segment holding the symbol");
    let (seg_offset, _) = seg.file_range();
    let map = images(records)
        .into_iter()
        .find(|m| {
            m.pid == pid
                && Path::new(&m.path) == exe
                && (m.file_offset..m.file_offset + (m.end - m.start)).contains(&seg_offset)
        })
        .expect("the executable's text mapping");
    let bias = (map.start - map.file_offset).wrapping_sub(seg.address() - seg_offset);
    let start = sym.address().wrapping_add(bias);
    start..start + sym.size().max(1)
}

/// Whether a stack copy holds a word pointing into `range` (e.g. a return
/// address into main).
fn stack_holds_address_in(s: &Sample, range: &std::ops::Range<u64>) -> bool {
    s.stack
        .bytes
        .chunks_exact(8)
        .any(|w| range.contains(&u64::from_le_bytes(w.try_into().unwrap())))
}

fn root_pid(reader: &TraceReader<Vec<u8>>) -> Pid {
    match &reader.header().target {
        Target::Launch { pid, .. } => *pid,
        Target::Attach { pids } => pids[0],
    }
}

fn thread_names(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Thread(t) => t.name.clone(),
            _ => None,
        })
        .collect()
}

#[test]
fn launch_records_named_threads_images_and_samples() {
    require_perf!();
    let dir = scratch_dir("rec-launch");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let out = dir.join("t.lpt");
    let result = launch(&out, &[], &exe, &["600"]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(
        result.status.code(),
        Some(7),
        "exit status passed on: {stderr}"
    );
    assert!(
        stderr.contains("samples") && stderr.contains("bytes/sample"),
        "{stderr}"
    );

    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    let pid = root_pid(&reader);
    let names = thread_names(&records);
    assert!(names.iter().any(|n| n == "worker-a"), "{names:?}");
    assert!(names.iter().any(|n| n == "worker-b"), "{names:?}");

    let maps = images(&records);
    let main_map = maps
        .iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("the fixture's image");
    assert_eq!(main_map.build_id.as_ref().unwrap().0, build_id(&exe));
    assert!(maps
        .iter()
        .any(|m| m.kind == ImageKind::Vdso && m.build_id.is_some()));
    assert!(maps
        .iter()
        .any(|m| m.path.contains("libc.so") && m.build_id.is_some()));

    let all = samples(&records);
    // CPU time only: a loaded machine gives the workers less of it.
    assert!(all.len() >= 10, "only {} samples", all.len());
    let worker_tids: Vec<u32> = all
        .iter()
        .map(|s| s.tid.0)
        .filter(|&t| t != pid.0)
        .collect();
    assert!(
        !worker_tids.is_empty(),
        "no samples from the worker threads"
    );
    // The leaf runs in the fixture's code, called from parent_one/parent_two.
    let leaf = symbol_avma(&records, pid, &exe, "leaf_work");
    assert!(all.iter().filter(|s| leaf.contains(&s.regs.ip())).count() * 2 > all.len());
    assert!(
        matches!(&reader.header().target, Target::Launch { command, .. } if command[1] == "600")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attach_by_pid_records_existing_threads_and_images() {
    require_perf!();
    let dir = scratch_dir("rec-attach");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let mut child = Command::new(&exe).arg("20000").spawn().unwrap();
    let pid = child.id();
    // Wait until both workers have named themselves.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                    .collect()
            })
            .unwrap_or_default();
        if names.iter().filter(|n| n.starts_with("worker-")).count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "fixture threads never got named");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = dir.join("t.lpt");
    let result = rec(&[
        os("--pid"),
        os(&pid.to_string()),
        os("--duration"),
        os("1"),
        os("--out"),
        out.as_os_str(),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    assert_eq!(
        reader.header().target,
        Target::Attach {
            pids: vec![Pid(pid)]
        }
    );
    let existing: Vec<String> = records
        .iter()
        .filter_map(|r| match r {
            Record::Thread(t) if t.event == ThreadEvent::Existing => t.name.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(existing.len(), 3, "{existing:?}");
    assert!(existing.contains(&"worker-a".to_string()), "{existing:?}");
    let start = reader.header().start_time;
    let exe_map = images(&records)
        .into_iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("the fixture's image from /proc/PID/maps");
    assert_eq!(exe_map.time, start);
    assert_eq!(exe_map.build_id.as_ref().unwrap().0, build_id(&exe));
    let n = samples(&records).len();
    // CPU time only: a loaded machine gives the workers less of it.
    assert!(n >= 10, "only {n} samples in 1 s of two busy threads");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dlopened_library_appears_mid_run() {
    require_perf!();
    let dir = scratch_dir("rec-dlopen");
    let plugin = build_c(
        &["rec_plugin.c"],
        &["-O2", "-g", "-shared", "-fPIC", "-Wl,--build-id"],
        &dir,
        "librec_plugin.so",
    );
    let exe = build_c(
        &["rec_dlopen.c"],
        &["-O2", "-g", "-ldl"],
        &dir,
        "rec_dlopen",
    );
    let out = dir.join("t.lpt");
    let result = launch(&out, &[], &exe, &["600", plugin.to_str().unwrap()]);
    assert_eq!(
        result.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    assert_samples_plausible(&records);
    let plugin_map = images(&records)
        .into_iter()
        .find(|m| Path::new(&m.path) == plugin && m.executable)
        .expect("the dlopened library");
    assert_eq!(plugin_map.build_id.as_ref().unwrap().0, build_id(&plugin));
    let first_sample = samples(&records)[0].time;
    assert!(plugin_map.time > first_sample, "mapped mid-run");
    let in_plugin = samples(&records)
        .iter()
        .filter(|s| (plugin_map.start..plugin_map.end).contains(&s.regs.ip()))
        .count();
    assert!(in_plugin > 0, "no sample inside the dlopened library");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The share of samples in `leaf` whose stack copy reaches back to a
/// return address into `main`.
fn share_reaching_main(out: &Path, exe: &Path, leaf: &str) -> f64 {
    let (reader, records) = load(out);
    assert_complete(&reader, &records);
    let pid = root_pid(&reader);
    let leaf = symbol_avma(&records, pid, exe, leaf);
    let main = symbol_avma(&records, pid, exe, "main");
    let in_leaf: Vec<&Sample> = samples(&records)
        .into_iter()
        .filter(|s| leaf.contains(&s.regs.ip()))
        .collect();
    assert!(
        in_leaf.len() >= 10,
        "only {} samples in the leaf",
        in_leaf.len()
    );
    let reaching = in_leaf
        .iter()
        .filter(|s| stack_holds_address_in(s, &main))
        .count();
    reaching as f64 / in_leaf.len() as f64
}

#[test]
fn deep_recursion_is_copied_back_to_main() {
    require_perf!();
    let dir = scratch_dir("rec-deep");
    let exe = build_c(&["rec_deep.c"], NO_FP, &dir, "rec_deep");
    let out = dir.join("default.lpt");
    assert!(launch(&out, &[], &exe, &["400", "300"]).status.success());
    let share = share_reaching_main(&out, &exe, "deep_leaf");
    assert!(share > 0.99, "only {share} of deep samples reach main");
    // perf's default 8 KiB copy could not.
    let out8 = dir.join("8k.lpt");
    assert!(
        launch(&out8, &["--stack-size", "8192"], &exe, &["300", "300"])
            .status
            .success()
    );
    assert_eq!(share_reaching_main(&out8, &exe, "deep_leaf"), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn large_stack_frame_is_copied_back_to_main() {
    require_perf!();
    let dir = scratch_dir("rec-bigframe");
    let exe = build_c(&["rec_bigframe.c"], NO_FP, &dir, "rec_bigframe");
    let out = dir.join("t.lpt");
    assert!(launch(&out, &[], &exe, &["400"]).status.success());
    let share = share_reaching_main(&out, &exe, "frame_leaf");
    assert!(share > 0.99, "only {share} of samples reach main");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thread_churn_fork_and_exec_leave_a_finished_trace() {
    require_perf!();
    let dir = scratch_dir("rec-churn");
    let churn = build_c(&["rec_churn.c"], NO_FP, &dir, "rec_churn");
    let threads = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let out = dir.join("t.lpt");
    let result = launch(
        &out,
        &[],
        &churn,
        &["1000", "exec", threads.to_str().unwrap(), "300"],
    );
    // The exec'd program's exit status is the command's.
    assert_eq!(
        result.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    assert_time_ordered(&records);
    assert_samples_plausible(&records);
    let pid = root_pid(&reader);

    let started = records
        .iter()
        .filter(|r| matches!(r, Record::Thread(t) if t.event == ThreadEvent::Start && t.pid == pid))
        .count();
    assert!(started >= 1000 + 2, "only {started} thread starts");
    let exited = records
        .iter()
        .filter(|r| matches!(r, Record::Thread(t) if t.event == ThreadEvent::Exit))
        .count();
    assert!(exited >= 1000, "only {exited} thread exits");

    let child = records
        .iter()
        .find_map(|r| match r {
            Record::Process(p) if p.event == ProcessEvent::Fork => Some(p.clone()),
            _ => None,
        })
        .expect("the forked child");
    assert_eq!(child.parent, Some(pid));
    assert!(
        samples(&records).iter().any(|s| s.pid == child.pid),
        "no samples from the forked child"
    );

    let exec_time = records
        .iter()
        .find_map(|r| match r {
            Record::Process(p)
                if p.event == ProcessEvent::Exec
                    && p.pid == pid
                    && p.time > reader.header().start_time
                    && p.executable.as_deref() == threads.to_str() =>
            {
                Some(p.time)
            }
            _ => None,
        })
        .expect("the exec of rec_threads");
    assert!(
        images(&records)
            .iter()
            .any(|m| m.pid == pid && Path::new(&m.path) == threads && m.time >= exec_time),
        "the exec'd program's image"
    );
    let exit = records
        .iter()
        .find_map(|r| match r {
            Record::Process(p) if p.pid == pid => match p.event {
                ProcessEvent::Exit { code } => Some(code),
                _ => None,
            },
            _ => None,
        })
        .expect("the command's exit");
    assert_eq!(exit, Some(7));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Wait until `path` is larger than `len` bytes.
fn wait_for_size(path: &Path, len: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while std::fs::metadata(path).map_or(0, |m| m.len()) <= len {
        assert!(Instant::now() < deadline, "{} never grew", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigkilled_recorder_leaves_a_readable_unfinished_trace() {
    require_perf!();
    let dir = scratch_dir("rec-sigkill");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let out = dir.join("t.lpt");
    let mut recorder = Command::new(lrnprof_rec())
        .arg("--out")
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg("30000")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The header is written at once; wait for the first whole block too.
    wait_for_size(&out, 2048, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1500));
    recorder.kill().unwrap();
    recorder.wait().unwrap();
    let (reader, records) = load(&out);
    // The fixture survives its recorder; stop it.
    let Target::Launch { pid, .. } = reader.header().target else {
        panic!("launched")
    };
    let _ = Command::new("kill").arg(pid.0.to_string()).status();
    assert!(
        !reader.report().finished,
        "a killed recorder wrote a footer"
    );
    assert!(!records.iter().any(|r| matches!(r, Record::Summary(_))));
    assert!(!samples(&records).is_empty(), "no whole block was readable");
    assert_samples_plausible(&records);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_reaches_the_launched_command() {
    require_perf!();
    let dir = scratch_dir("rec-sigterm");
    let out = dir.join("t.lpt");
    let recorder = Command::new(lrnprof_rec())
        .arg("--out")
        .arg(&out)
        .args(["--", "sleep", "30"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_size(&out, 0, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new("kill")
        .args(["-TERM", &recorder.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let result = recorder.wait_with_output().unwrap();
    // sleep died of SIGTERM: 128 + 15, like a shell reports it.
    assert_eq!(
        result.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    assert!(reader.report().finished);
    assert!(records.iter().any(|r| matches!(r, Record::Process(p)
        if p.event == (ProcessEvent::Exit { code: Some(143) }))));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run the recorder expecting failure: a one-line error mentioning
/// `expect`, a non-zero exit, and no trace file.
fn assert_fails_cleanly(args: &[&OsStr], out: &Path, expect: &str) {
    let result = rec(args);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success(), "succeeded: {stderr}");
    assert!(stderr.contains(expect), "expected {expect:?} in {stderr:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr:?}");
    assert!(!out.exists(), "a trace file was left behind");
}

#[test]
fn startup_errors_are_one_line_and_leave_no_file() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let dir = scratch_dir("rec-errors");
    let out = dir.join("t.lpt");
    let o = out.as_os_str();
    // Pids above pid_max (at most 2^22) never exist.
    assert_fails_cleanly(
        &[os("--pid"), os("99999999"), os("--out"), o],
        &out,
        "no process with pid 99999999",
    );
    assert_fails_cleanly(
        &[os("--out"), o, os("--"), os("lrnprof-no-such-command")],
        &out,
        "command not found: lrnprof-no-such-command",
    );
    let not_exec = dir.join("data.txt");
    std::fs::write(&not_exec, "not a program").unwrap();
    assert_fails_cleanly(
        &[os("--out"), o, os("--"), not_exec.as_os_str()],
        &out,
        "cannot execute",
    );
    let bad_out: PathBuf = dir.join("no-such-dir/t.lpt");
    assert_fails_cleanly(
        &[os("--out"), bad_out.as_os_str(), os("--"), os("true")],
        &bad_out,
        "cannot write trace file",
    );
    assert_fails_cleanly(&[os("--out"), o], &out, "give --pid PID or a command");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The blobs of image `id` as (section name, svma, data, compressed).
fn section_blobs(records: &[Record], id: &[u8]) -> Vec<(String, u64, Vec<u8>, bool)> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Blob(b) if b.build_id.0 == id => match &b.kind {
                lrnprof_format::BlobKind::Section { name, svma } => {
                    assert_eq!(b.offset, 0, "small sections are not split");
                    assert_eq!(b.total_len, b.data.len() as u64);
                    Some((name.clone(), *svma, b.data.clone(), b.compressed))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn embedding_carries_unwind_and_symbol_sections() {
    use object::ObjectSection;
    require_perf!();
    let dir = scratch_dir("rec-embed");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let id = build_id(&exe);
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();

    let out = dir.join("symbols.lpt");
    let result = launch(&out, &[], &exe, &["300"]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("embedded image data"), "{stderr}");
    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    let blobs = section_blobs(&records, &id);
    for name in [
        ".eh_frame",
        ".eh_frame_hdr",
        ".symtab",
        ".strtab",
        ".lrnprof.layout",
    ] {
        assert!(blobs.iter().any(|b| b.0 == name), "{name} not embedded");
    }
    for (name, svma, bytes, compressed) in &blobs {
        if let Some(section) = file.section_by_name(name) {
            assert_eq!(*svma, section.address(), "{name}");
            assert_eq!(&bytes[..], section.data().unwrap(), "{name}");
            assert!(!compressed);
        }
    }
    assert!(!blobs.iter().any(|b| b.0.starts_with(".debug_info")));
    // Each image once, however many processes and mappings it had.
    let eh_frames = blobs.iter().filter(|b| b.0 == ".eh_frame").count();
    assert_eq!(eh_frames, 1);

    let out = dir.join("debug.lpt");
    assert_eq!(
        launch(&out, &["--embed", "debug"], &exe, &["300"])
            .status
            .code(),
        Some(7)
    );
    let (_, records) = load(&out);
    let debug_info = section_blobs(&records, &id)
        .into_iter()
        .find(|b| b.0 == ".debug_info")
        .expect(".debug_info embedded at --embed debug");
    assert!(debug_info.3, "DWARF blobs are compressed");

    let out = dir.join("none.lpt");
    assert_eq!(
        launch(&out, &["--embed", "none"], &exe, &["300"])
            .status
            .code(),
        Some(7)
    );
    let (_, records) = load(&out);
    assert!(!records.iter().any(|r| matches!(r, Record::Blob(_))));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lrnprof-analyze --offline` (no local files) on `trace`: folded stacks.
fn analyze_offline(trace: &Path) -> String {
    let result = Command::new(lrnprof_tests::lrnprof_analyze())
        .arg(trace)
        .args(["--offline", "--format", "folded", "--output", "-"])
        .output()
        .expect("running lrnprof-analyze");
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    String::from_utf8(result.stdout).unwrap()
}

/// Samples per folded line containing `needle`.
fn folded_count(folded: &str, needle: &str) -> u64 {
    folded
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn embedded_trace_is_analyzed_without_the_binaries() {
    require_perf!();
    let dir = scratch_dir("rec-selfcontained");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let out = dir.join("t.lpt");
    assert_eq!(launch(&out, &[], &exe, &["1500"]).status.code(), Some(7));
    let bare = dir.join("bare.lpt");
    assert_eq!(
        launch(&bare, &["--embed", "none"], &exe, &["300"])
            .status
            .code(),
        Some(7)
    );
    // As on another machine: the fixture is gone.
    std::fs::remove_file(&exe).unwrap();
    let folded = analyze_offline(&out);
    let one = folded_count(&folded, "parent_one;leaf_work");
    let two = folded_count(&folded, "parent_two;leaf_work");
    assert!(one > 0 && two > 0, "{folded}");
    // leaf_work does twice the work under parent_two.
    let ratio = two as f64 / one as f64;
    assert!((1.2..3.5).contains(&ratio), "ratio {ratio}: {folded}");
    let bare = analyze_offline(&bare);
    assert!(
        !bare.contains("leaf_work"),
        "symbols without embedding: {bare}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_users_process_is_refused_with_advice() {
    // Needs root to run the recorder as an unprivileged user.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let has_runuser = Command::new("runuser").arg("--help").output().is_ok();
    if !cfg!(target_os = "linux") || !is_root || !has_runuser {
        eprintln!("skipping: needs root and runuser to act as the user nobody");
        return;
    }
    let dir = scratch_dir("rec-perm");
    let rec_copy = dir.join("lrnprof-rec");
    std::fs::copy(lrnprof_rec(), &rec_copy).unwrap();
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("a+rwx")
        .arg(&dir)
        .status();
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let out = dir.join("t.lpt");
    let result = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&rec_copy)
        .arg("--pid")
        .arg(victim.id().to_string())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let _ = victim.kill();
    let _ = victim.wait();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not permitted to record pid"), "{stderr}");
    assert!(stderr.contains("belongs to uid 0"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn many_busy_threads_lose_nothing_at_1khz() {
    require_perf!();
    // Without root the recorder cannot run above the target's priority,
    // and 48 busy threads on a small machine starve it.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !is_root {
        eprintln!("skipping: needs root (CAP_SYS_NICE) to favour the recorder's threads");
        return;
    }
    let dir = scratch_dir("rec-many");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let out = dir.join("t.lpt");
    let result = launch(&out, &["--embed", "none"], &exe, &["1000", "48"]);
    assert_eq!(
        result.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    // Includes: no Lost records and a summary saying 0 lost.
    assert_complete(&reader, &records);
    assert_samples_plausible(&records);
    let names = thread_names(&records);
    assert!(names.iter().any(|n| n == "worker-48"), "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn duration_stops_recording_and_leaves_the_command_running() {
    require_perf!();
    let dir = scratch_dir("rec-duration");
    let out = dir.join("t.lpt");
    let go = dir.join("go");
    let done = dir.join("done");
    // The command cannot finish before the test says so.
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; touch {}",
        go.display(),
        done.display()
    );
    // The command inherits the recorder's stdout and stderr, so wait for
    // the recorder's exit, not for its pipes to close.
    let log = dir.join("stderr.txt");
    let status = Command::new(lrnprof_rec())
        .arg("--out")
        .arg(&out)
        .args(["--duration", "0.5", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("duration reached"), "{stderr}");
    assert!(!done.exists(), "the command finished before it was told to");
    let (reader, records) = load(&out);
    assert!(reader.report().finished);
    // The launched shell did not exit (its `sleep` children do).
    let shell = root_pid(&reader);
    assert!(!records.iter().any(|r| matches!(r, Record::Process(p)
        if p.pid == shell && matches!(p.event, ProcessEvent::Exit { .. }))));
    // The command was not killed: told to, it finishes.
    std::fs::write(&go, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done.exists() {
        assert!(Instant::now() < deadline, "the command did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn frequency_above_the_kernel_maximum_is_clamped() {
    require_perf!();
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let dir = scratch_dir("rec-freq");
    let out = dir.join("t.lpt");
    let too_high = (max + 1).to_string();
    let result = rec(&[
        os("--out"),
        out.as_os_str(),
        os("--freq"),
        os(&too_high),
        os("--embed"),
        os("none"),
        os("--"),
        os("true"),
    ]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(stderr.contains("perf_event_max_sample_rate"), "{stderr}");
    let (reader, _) = load(&out);
    assert_eq!(reader.header().sampling.frequency_hz, max);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn jit_regions_and_perf_maps_are_recorded() {
    require_perf!();
    let dir = scratch_dir("rec-jit");
    let exe = build_c(&["rec_jit.c"], &["-O2", "-g"], &dir, "rec_jit");
    let out = dir.join("t.lpt");
    let result = launch(&out, &[], &exe, &["300"]);
    let (reader, records) = load(&out);
    let pid = root_pid(&reader);
    let map_file = PathBuf::from(format!("/tmp/perf-{}.map", pid.0));
    let map_text = std::fs::read_to_string(&map_file);
    let _ = std::fs::remove_file(&map_file);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert_complete(&reader, &records);
    let map_text = map_text.expect("the fixture wrote its perf map");
    let jit_start = u64::from_str_radix(map_text.split(' ').next().unwrap(), 16).unwrap();
    assert!(
        images(&records).iter().any(|m| m.pid == pid
            && m.kind == ImageKind::Anonymous
            && (m.start..m.end).contains(&jit_start)),
        "the anonymous executable region"
    );
    let embedded = records
        .iter()
        .find_map(|r| match r {
            Record::Blob(b) if b.kind == lrnprof_format::BlobKind::JitMap { pid } => {
                Some(b.data.clone())
            }
            _ => None,
        })
        .expect("the perf map embedded");
    assert_eq!(String::from_utf8(embedded).unwrap(), map_text);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn images_inside_a_changed_root_are_found_through_proc() {
    require_perf!();
    // A chroot stands in for a container: the program's path inside its
    // root (/fx) does not exist on the host.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let has_chroot = Command::new("chroot").arg("--help").output().is_ok();
    if !is_root || !has_chroot {
        eprintln!("skipping: needs root and chroot");
        return;
    }
    let dir = scratch_dir("rec-chroot");
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    // Static, so the root needs no libraries.
    let exe = build_c(
        &["rec_threads.c"],
        &["-O2", "-g", "-static", "-pthread"],
        &root,
        "fx",
    );
    let id = build_id(&exe);
    let out = dir.join("t.lpt");
    let result = rec(&[
        os("--out"),
        out.as_os_str(),
        os("--"),
        os("chroot"),
        root.as_os_str(),
        os("/fx"),
        os("300"),
    ]);
    assert_eq!(
        result.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    let fx = images(&records)
        .into_iter()
        .find(|m| m.path == "/fx")
        .expect("the program mapped at its path inside the root");
    assert_eq!(fx.build_id.as_ref().unwrap().0, id);
    assert!(
        section_blobs(&records, &id)
            .iter()
            .any(|b| b.0 == ".symtab"),
        "the program's symbols embedded from inside its root"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_deleted_while_recorded_is_still_embedded() {
    require_perf!();
    let dir = scratch_dir("rec-deleted");
    let exe = build_c(&["rec_threads.c"], NO_FP, &dir, "rec_threads");
    let id = build_id(&exe);
    let out = dir.join("t.lpt");
    let recorder = Command::new(lrnprof_rec())
        .arg("--out")
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg("1500")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(&exe).unwrap();
    let result = recorder.wait_with_output().unwrap();
    assert_eq!(
        result.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let (reader, records) = load(&out);
    assert_complete(&reader, &records);
    let blobs = section_blobs(&records, &id);
    assert!(blobs.iter().any(|b| b.0 == ".symtab"), "{blobs:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
