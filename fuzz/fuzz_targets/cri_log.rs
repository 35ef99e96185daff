//! The CRI log reader: a log file a container could have written into (left by a crash) is
//! reopened and repaired as the pump does after a restart, then read back record by record
//! as `ctr logs` and the termination-message tail do (`parse_record`).
#![no_main]

use ironlet_runtime::local::logs::{parse_record, reopen_log_for_fuzzing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("0.log");
    std::fs::write(&path, data).expect("write log");
    let _ = reopen_log_for_fuzzing(&path);
    let after = std::fs::read(&path).expect("read log");
    assert!(after.len() <= data.len(), "repair grew the log file");
    assert_eq!(after[..], data[..after.len()], "repair changed kept bytes");
    for line in String::from_utf8_lossy(&after).lines() {
        let _ = parse_record(line);
    }
});
