//! Helpers shared by the integration tests: log ids, entries and commands, appending through
//! openraft's blocking helper, measuring a directory, and reopening a database sled just released.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cairn_raft::model::{Command, JobId, JobSpec};
use cairn_raft::types::{Entry, LogId};
use cairn_storage::LogStore;
use openraft::storage::RaftLogStorageExt;
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, Membership};

pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

pub fn job_id(s: &str) -> JobId {
    JobId::new(s).unwrap_or_else(|e| panic!("bad job id {s:?}: {e}"))
}

pub fn blank(term: u64, index: u64) -> Entry {
    Entry { log_id: log_id(term, index), payload: EntryPayload::Blank }
}

pub fn membership(term: u64, index: u64, voters: &[u64]) -> Entry {
    let nodes: BTreeMap<u64, BasicNode> =
        voters.iter().map(|n| (*n, BasicNode::new(format!("127.0.0.1:{}", 7000 + n)))).collect();
    let config: BTreeSet<u64> = voters.iter().copied().collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![config], nodes)),
    }
}

pub fn normal(term: u64, index: u64, cmd: Command) -> Entry {
    Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(cmd) }
}

pub fn register(job: &str) -> Command {
    Command::RegisterJob { job: job_id(job), name: String::new(), spec: JobSpec::default() }
}

pub fn allocate(job: &str) -> Command {
    Command::AllocateCheckpointId { job: job_id(job) }
}

pub async fn append(store: &mut LogStore, entries: Vec<Entry>) {
    store.blocking_append(entries).await.unwrap_or_else(|e| panic!("append: {e}"));
}

/// Sum of the sizes of all files under `dir`, recursively.
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("dir entry: {e}"));
        let meta = entry.metadata().unwrap_or_else(|e| panic!("metadata: {e}"));
        if meta.is_dir() {
            total += dir_size(&entry.path());
        } else {
            total += meta.len();
        }
    }
    total
}

/// Lists the files under `dir` with their sizes, for diagnostics.
pub fn dir_listing(dir: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.metadata() {
                Ok(m) if m.is_dir() => out.extend(dir_listing(&path)),
                Ok(m) => out.push((path.display().to_string(), m.len())),
                Err(_) => {}
            }
        }
    }
    out
}

/// Whether opening failed only because sled still holds the database's file lock: sled releases
/// it a moment after the last handle is dropped, once its background threads have ended, which
/// on a loaded machine can take seconds.
pub fn lock_still_held(error: &dyn std::fmt::Display) -> bool {
    error.to_string().contains("could not acquire lock")
}

/// Retries `open` while a previous handle's lock is being released (bounded: 10 s, polled every
/// 10 ms), and returns the first other outcome.
pub fn when_released<T, E: std::fmt::Display>(mut open: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match open() {
            Err(e) if lock_still_held(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Opens the database in `dir` with sled directly, once the stores released it, and lets `f`
/// change it: damage, or what a crash that kept only some of the latest writes leaves behind.
pub fn tamper(dir: &Path, f: impl FnOnce(&sled::Db)) {
    let db = when_released(|| sled::open(dir)).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()));
    f(&db);
    db.flush().unwrap_or_else(|e| panic!("flush {}: {e}", dir.display()));
}
