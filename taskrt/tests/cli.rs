//! The `cairn-worker` binary: `verify` verdicts and exit codes; `run` is refused clearly.

use std::process::Command;

fn worker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cairn-worker"))
}

fn committed(dir: &std::path::Path, name: &str, body: &str) {
    std::fs::create_dir_all(dir.join("committed")).unwrap();
    std::fs::write(dir.join("committed").join(name), body).unwrap();
}

#[test]
fn verify_accepts_exactly_once_output_and_rejects_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    committed(dir.path(), "chk-1.csv", "0,1,1\n1,1,1\n0,2,2\n1,2,2\n");
    let ok = worker()
        .args(["verify", "--output"])
        .arg(dir.path())
        .args(["--keys", "2", "--records-per-key", "2"])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("EXACTLY ONCE"));

    committed(dir.path(), "chk-2.csv", "1,2,2\n");
    let dup = worker().args(["verify", "--output"]).arg(dir.path()).output().unwrap();
    assert_eq!(dup.status.code(), Some(1), "{dup:?}");
    assert!(String::from_utf8_lossy(&dup.stdout).contains("count 2 committed 2 times"));
}

#[test]
fn run_is_refused_with_a_clear_error() {
    let out = worker().args(["run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not available in this build"));
}
