//! sled 0.34 on crashfs: a child process inserts keys and acknowledges them, it is killed
//! (SIGKILL) at an arbitrary point, the power is cut, and the database is reopened.
//!
//! The child is this test binary run again (`--exact <test>`) with `CRASHFS_SLED_CHILD_DIR`
//! set: the test function then plays the child and never returns.
//!
//! Two facts of sled 0.34 shape these tests:
//! - it never fsyncs a directory, so the names of its files (`db`, `conf`, `blobs`) are
//!   durable only if something else syncs the directories: the child does, once, after
//!   opening;
//! - `Db::flush` writes with `pwrite` and `sync_file_range(2)`, never `fsync` (only the
//!   background flusher, every `flush_every_ms`, calls `fsync`). `sync_file_range` makes
//!   nothing durable (POSIX-wise, and it never reaches a FUSE file system), so a key
//!   acknowledged by `flush()` alone can be lost: `sled_flush_alone_is_not_durable` shows it.
//!   With an `fsync` of the `db` file after `flush()` (any descriptor of the file will do),
//!   every acknowledged key survives: `sled_keys_acked_by_flush_and_fsync_survive_power_loss`.

#![cfg(feature = "mount-tests")]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cairn_crashfs::{MountOptions, TornWrites};
use common::{Mounted, fsync, mount, mount_with};
use nix::fcntl::{Flock, FlockArg};

const CHILD_DIR: &str = "CRASHFS_SLED_CHILD_DIR";
const CHILD_FSYNC: &str = "CRASHFS_SLED_CHILD_FSYNC";
const CHILD_FIRST_KEY: &str = "CRASHFS_SLED_CHILD_FIRST_KEY";
/// Keys inserted between two acknowledgements.
const BATCH: u64 = 25;
/// Acknowledgements to wait for before the kill.
const ACKS_BEFORE_KILL: usize = 10;

fn key(i: u64) -> String {
    format!("key-{i:010}")
}

fn value(i: u64) -> Vec<u8> {
    format!("value-{i}-").repeat(8).into_bytes()
}

/// Plays the child if this process is one.
fn child_if_asked() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let fsync_after_flush = std::env::var_os(CHILD_FSYNC).is_some();
    let first: u64 = std::env::var(CHILD_FIRST_KEY).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let flush_every = if fsync_after_flush { Some(500) } else { None };
    let db = sled::Config::new().path(&dir).flush_every_ms(flush_every).open().expect("child: open sled");
    // sled never syncs directories: make the names of its files durable.
    fsync(&dir);
    fsync(dir.parent().expect("sled dir has a parent"));
    let db_file = std::fs::File::open(dir.join("db")).expect("child: open sled's db file");
    let mut stdout = std::io::stdout().lock();
    for i in first.. {
        db.insert(key(i).as_bytes(), value(i)).expect("child: insert");
        if (i + 1 - first).is_multiple_of(BATCH) {
            db.flush().expect("child: flush");
            if fsync_after_flush {
                db_file.sync_all().expect("child: fsync db");
            }
            writeln!(stdout, "acked {i}").expect("child: stdout");
            stdout.flush().expect("child: stdout");
        }
    }
    unreachable!("the parent kills the child");
}

/// Runs a child on `dir` until it acknowledged a few batches, kills it, and returns the last
/// key it acknowledged (all acknowledgements are read, also those after the kill point).
fn run_child_and_kill(test: &str, dir: &Path, first_key: u64, fsync_after_flush: bool) -> u64 {
    let exe = std::env::current_exe().expect("test binary path");
    let mut command = Command::new(exe);
    command.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    command.env(CHILD_DIR, dir).env(CHILD_FIRST_KEY, first_key.to_string());
    if fsync_after_flush {
        command.env(CHILD_FSYNC, "1");
    }
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (lines_tx, lines_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print "test <name> ... " on the same line before the first one.
            let acked = line.rsplit_once("acked ").and_then(|(_, n)| n.trim().parse::<u64>().ok());
            if let Some(acked) = acked
                && lines_tx.send(acked).is_err()
            {
                break;
            }
        }
    });
    let mut last = None;
    for _ in 0..ACKS_BEFORE_KILL {
        match lines_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(acked) => last = Some(acked),
            Err(error) => {
                kill(&mut child);
                panic!("the sled child stopped acknowledging ({error}); see its stderr above");
            }
        }
    }
    // Let the child run on for a moment, so that it dies at an arbitrary point of its work.
    std::thread::sleep(Duration::from_millis(rand::random::<u64>() % 40));
    kill(&mut child);
    reader.join().expect("reader thread");
    let last = lines_rx.try_iter().fold(last, |last, acked| last.max(Some(acked)));
    last.expect("at least one acknowledgement")
}

fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
}

/// Keys of `ranges` that the reopened database lacks (or holds with a wrong value).
fn missing_keys(dir: &Path, ranges: &[RangeInclusive<u64>]) -> Vec<u64> {
    let db = sled::open(dir).expect("reopen sled after the power loss");
    let missing = ranges
        .iter()
        .flat_map(|range| range.clone())
        .filter(|i| db.get(key(*i)).expect("get").as_deref() != Some(&value(*i)[..]))
        .collect();
    drop(db);
    wait_until_closed(&dir.join("db"));
    missing
}

/// sled's background threads may hold its file (and its `flock`) a moment after the `Db` is
/// dropped; the next opener (a child, or a power loss) must not find it still open.
fn wait_until_closed(db_file: &Path) {
    for _ in 0..500 {
        let file = std::fs::File::open(db_file).expect("open sled's db file");
        if Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("sled still holds {} 5 s after the database was dropped", db_file.display());
}

fn sled_dir(fs: &Mounted) -> PathBuf {
    fs.path("node")
}

/// Three rounds of: a child writes on (from where the database is), is killed, the power is
/// cut; every key acknowledged in any round must be there after each power loss.
fn acked_keys_survive(test: &str, options: MountOptions) {
    let fs = mount_with(options);
    let dir = sled_dir(&fs);
    let mut acked_ranges = Vec::new();
    for round in 0..3u64 {
        let first = round * 1_000_000;
        let last = run_child_and_kill(test, &dir, first, true);
        acked_ranges.push(first..=last);
        let report = fs.power_loss().expect("power loss");
        eprintln!("round {round}: keys {first}..={last} acknowledged; power loss: {report}");
        let missing = missing_keys(&dir, &acked_ranges);
        assert!(missing.is_empty(), "round {round}: acknowledged keys lost: {missing:?} of {acked_ranges:?}");
    }
    eprintln!("{}", fs.stats());
}

#[test]
fn sled_keys_acked_by_flush_and_fsync_survive_power_loss() {
    child_if_asked();
    acked_keys_survive("sled_keys_acked_by_flush_and_fsync_survive_power_loss", MountOptions::default());
}

#[test]
fn sled_keys_acked_by_flush_and_fsync_survive_torn_writes() {
    child_if_asked();
    let torn_writes = Some(TornWrites { seed: rand::random(), keep_probability: 0.5 });
    eprintln!("torn writes: {torn_writes:?}");
    let options = MountOptions { torn_writes, ..MountOptions::default() };
    acked_keys_survive("sled_keys_acked_by_flush_and_fsync_survive_torn_writes", options);
}

#[test]
fn sled_flush_alone_is_not_durable() {
    child_if_asked();
    let test = "sled_flush_alone_is_not_durable";
    let fs = mount();
    let dir = sled_dir(&fs);
    let last = run_child_and_kill(test, &dir, 0, false);
    let report = fs.power_loss().expect("power loss");
    let missing = missing_keys(&dir, &[0..=last]);
    eprintln!("keys 0..={last} acknowledged by flush(); {} lost; power loss: {report}", missing.len());
    assert!(
        !missing.is_empty(),
        "sled's flush() made keys durable without fsync: the durability note in this file is out of date"
    );
    assert!(report.bytes_dropped > 0);
}
