//! The recorder library inside another program (`tests/library_user/`):
//! it records a child while the program's own SIGINT handler stays in
//! place, stops through the token, and prints nothing.

use super::support::{load, samples};
use lrnprof_format::{ProcessEvent, Record};
use lrnprof_tests::{remove_scratch_dir, require_perf, scratch_dir, workspace_binary};
use std::collections::HashMap;
use std::process::{Command, Stdio};

#[test]
fn a_program_keeps_its_own_sigint_handler_while_it_records() {
    require_perf!();
    let dir = scratch_dir("rec-as-library");
    let out = dir.join("t.lpt");
    let result = Command::new(workspace_binary("lrnprof-tests", "lrnprof-library-user"))
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("running lrnprof-library-user");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}\n{stdout}");
    // No status line, no warning, no summary: the library prints nothing.
    assert_eq!(stderr, "", "written to stderr");
    let facts: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let fact = |key: &str| {
        *facts
            .get(key)
            .unwrap_or_else(|| panic!("no {key}: {stdout}"))
    };
    assert_eq!(fact("handler_during_recording"), "yes", "{stdout}");
    assert_eq!(
        fact("sigterm_unchanged_during_recording"),
        "yes",
        "{stdout}"
    );
    assert_eq!(fact("handler_after_recording"), "yes", "{stdout}");
    assert_eq!(fact("sigterm_unchanged_after_recording"), "yes", "{stdout}");
    // One raised while recording, one after: both reached the handler.
    assert_eq!(fact("sigints_handled"), "2", "{stdout}");
    // The SIGINT did not stop the recording: samples kept coming.
    assert!(fact("samples_after_own_sigint").parse::<u64>().unwrap() > 0);
    // Stopped through the token, which killed the launched shell.
    assert_eq!(fact("stop_reason"), "Stopped", "{stdout}");
    assert_eq!(fact("target_exit"), "Some(Signal(9))", "{stdout}");

    let (reader, records) = load(&out);
    assert!(reader.report().finished, "{:?}", reader.report());
    assert_eq!(
        fact("samples").parse::<usize>().unwrap(),
        samples(&records).len()
    );
    assert!(records.iter().any(|r| matches!(r, Record::Process(p)
        if p.event == (ProcessEvent::Exit { code: Some(137) }))));
    remove_scratch_dir(&dir);
}
