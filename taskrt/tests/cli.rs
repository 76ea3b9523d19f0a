//! The `cairn-worker` binary: `verify` verdicts and exit codes; `run`'s flags, its refusal of an
//! unusable configuration, and its clean stop on SIGTERM.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
fn run_help_documents_the_flags() {
    let out = worker().args(["run", "--help"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--coordinators",
        "--worker-id",
        "--slots",
        "--reconnect-backoff-min",
        "--reconnect-backoff-max",
        "--connect-timeout",
        "--register-timeout",
        "--cancel-timeout",
        "--snapshot-concurrency",
        "--log",
        "--log-format",
        "--print-config",
        "CAIRN_WORKER_COORDINATORS",
    ] {
        assert!(help.contains(flag), "`run --help` does not mention {flag}:\n{help}");
    }

    let out = worker()
        .args(["run", "--coordinators", "a:1,b:2", "--slots", "3", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let config = String::from_utf8_lossy(&out.stdout);
    assert!(config.contains(r#"coordinators = ["#) && config.contains(r#""b:2""#), "{config}");
    assert!(config.contains("slots = 3") && config.contains(r#"reconnect_backoff_max = "2s""#), "{config}");
}

#[test]
fn run_without_coordinators_names_the_missing_key() {
    let out = worker().arg("run").env_remove("CAIRN_WORKER_COORDINATORS").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("`coordinators` is required"), "{out:?}");
}

#[test]
fn run_keeps_looking_for_a_leader_and_stops_cleanly_on_sigterm() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut child = worker()
        .args(["run", "--coordinators", &dead, "--worker-id", "cli-test", "--log", "info"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_line = |seen: &mut Vec<String>, needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !seen.iter().any(|l| l.contains(needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => seen.push(line),
                Err(_) => panic!("no log line with {needle:?}; got: {seen:#?}"),
            }
        }
    };
    wait_line(&mut seen, "worker started");
    // It retries the dead replica without giving up.
    wait_line(&mut seen, "cannot attach; trying the next replica");

    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the worker did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    reader.join().unwrap();
    seen.extend(rx.try_iter());
    assert!(seen.iter().any(|l| l.contains("shutting down") && l.contains("SIGTERM")), "{seen:#?}");
}
