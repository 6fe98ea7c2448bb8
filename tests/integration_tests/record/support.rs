//! Helpers of the recorder tests: running `lrnprof-rec`, reading its
//! traces back with `TraceReader`, and the checks most tests make of them.

use lrnprof_format::{ImageMapRecord, Pid, Record, Sample, Summary, Target, TraceReader};
use lrnprof_tests::{build_c, lrnprof_rec, lrnprof_rec_command, wait_until};
use object::{Object, ObjectSegment, ObjectSymbol};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Flags that make unwinding depend on DWARF CFI.
pub(super) const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer", "-pthread"];

/// Build the `rec_threads` fixture (named worker threads, exit status 7)
/// into `dir` with [`NO_FP`].
pub(super) fn build_threads(dir: &Path) -> PathBuf {
    build_c(&["rec_threads.c"], NO_FP, dir, "rec_threads")
}

/// Run `lrnprof-rec args` to completion, stdin closed.
pub(super) fn rec(args: &[&OsStr]) -> Output {
    lrnprof_rec_command()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-rec")
}

/// `lrnprof-rec --out OUT`, for tests that spawn it themselves.
pub(super) fn rec_command(out: &Path) -> Command {
    let mut command = lrnprof_rec_command();
    command.arg("--out").arg(out);
    command
}

pub(super) fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Record `program args` by launching it.
pub(super) fn launch(out: &Path, extra: &[&str], program: &Path, args: &[&str]) -> Output {
    let mut a: Vec<&OsStr> = vec![os("--out"), out.as_os_str()];
    a.extend(extra.iter().map(|s| os(s)));
    a.push(os("--"));
    a.push(program.as_os_str());
    a.extend(args.iter().map(|s| os(s)));
    rec(&a)
}

/// The recorder exited with `code` (the launched command's status, passed
/// on); its stderr is shown if not.
pub(super) fn assert_exit_code(result: &Output, code: i32) {
    assert_eq!(
        result.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// The recorder succeeded; its stderr is shown if not.
pub(super) fn assert_success(result: &Output) {
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Every record of a trace, which must decode without errors.
pub(super) fn load(path: &Path) -> (TraceReader<Vec<u8>>, Vec<Record>) {
    let reader = TraceReader::open(path).expect("opening the trace");
    let records = reader
        .records()
        .collect::<Result<Vec<_>, _>>()
        .expect("decoding every block");
    (reader, records)
}

/// [`load`] a trace that must be [complete](assert_complete).
pub(super) fn load_complete(path: &Path) -> (TraceReader<Vec<u8>>, Vec<Record>) {
    let (reader, records) = load(path);
    assert_complete(&reader, &records);
    (reader, records)
}

pub(super) fn samples(records: &[Record]) -> Vec<&Sample> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s) => Some(s),
            _ => None,
        })
        .collect()
}

pub(super) fn images(records: &[Record]) -> Vec<&ImageMapRecord> {
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
pub(super) fn assert_complete(reader: &TraceReader<Vec<u8>>, records: &[Record]) {
    assert!(reader.report().finished, "{:?}", reader.report());
    let s = summary(records);
    assert_eq!(s.samples, samples(records).len() as u64);
    assert_eq!(s.images, images(records).len() as u64);
    assert_eq!(s.lost, 0, "samples were lost at 1 kHz");
    assert!(!records.iter().any(|r| matches!(r, Record::Lost(_))));
}

/// Records are in time order (records without a time excepted).
pub(super) fn assert_time_ordered(records: &[Record]) {
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
pub(super) fn assert_samples_plausible(records: &[Record]) {
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
pub(super) fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.build_id()
        .unwrap()
        .expect("fixture has a build id")
        .to_vec()
}

/// AVMA range of `symbol` of `exe` in process `pid`, from the trace's
/// mapping of `exe` (bias from the segment containing the symbol).
pub(super) fn symbol_avma(
    records: &[Record],
    pid: Pid,
    exe: &Path,
    symbol: &str,
) -> std::ops::Range<u64> {
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
pub(super) fn stack_holds_address_in(s: &Sample, range: &std::ops::Range<u64>) -> bool {
    s.stack
        .bytes
        .chunks_exact(8)
        .any(|w| range.contains(&u64::from_le_bytes(w.try_into().unwrap())))
}

/// The launched command's pid, or the first attached one.
pub(super) fn root_pid(reader: &TraceReader<Vec<u8>>) -> Pid {
    match &reader.header().target {
        Target::Launch { pid, .. } => *pid,
        Target::Attach { pids } => pids[0],
        Target::System => panic!("the recorder tests record one process tree"),
    }
}

pub(super) fn thread_names(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Thread(t) => t.name.clone(),
            _ => None,
        })
        .collect()
}

/// The blobs of image `id` as (section name, svma, data, compressed).
pub(super) fn section_blobs(records: &[Record], id: &[u8]) -> Vec<(String, u64, Vec<u8>, bool)> {
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

/// Wait until the trace being written at `path` holds a whole block with
/// at least one sample (the recorder flushes a block at least once a
/// second while sampling).
pub(super) fn wait_for_a_readable_sample(path: &Path) {
    wait_until("a whole block with a sample in the trace", || {
        TraceReader::open(path).is_ok_and(|r| {
            r.records()
                .flatten()
                .any(|r| matches!(r, Record::Sample(_)))
        })
    });
}

/// Whether a child process of `parent` runs the program named `comm`
/// (so it has called `execve`).
pub(super) fn has_child_running(parent: u32, comm: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        // /proc/PID/stat: "PID (COMM) STATE PPID ..."; COMM may hold spaces.
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
        else {
            return false;
        };
        let ppid = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
        name == comm && ppid == Some(parent)
    })
}

/// Whether process `pid` has `file` open.
pub(super) fn holds_open(pid: u32, file: &Path) -> bool {
    let Ok(file) = file.canonicalize() else {
        return false;
    };
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == file))
    })
}

/// `kernel.perf_event_paranoid`, 2 (the default) when unreadable.
pub(super) fn perf_event_paranoid() -> i64 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2)
}

/// Runs `rec` (see [`recorder_for_nobody`]) as the user `nobody` with
/// `args` after `--out OUT`, and checks that it is refused as a startup
/// error is: exit code 2, one line on stderr, no file left. Returns that
/// line.
pub(super) fn refused_for_nobody(rec: &Path, out: &Path, args: &[&str]) -> String {
    let result = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(rec)
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert_eq!(result.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    assert!(!out.exists(), "{args:?} left a trace");
    stderr
}

/// A copy of `lrnprof-rec` in `dir` that the user `nobody` can run, for
/// tests of what an unprivileged user is told (`dir` is opened to all).
pub(super) fn recorder_for_nobody(dir: &Path) -> PathBuf {
    let copy = dir.join("lrnprof-rec");
    std::fs::copy(lrnprof_rec(), &copy).unwrap();
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("a+rwx")
        .arg(dir)
        .status();
    copy
}
