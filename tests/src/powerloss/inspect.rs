//! Looking at what survived: a replica's Raft store opened offline (from a copy of its
//! machine's disk, so that nothing the inspection writes reaches the trial), and the files of
//! every checkpoint and savepoint the store lists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cairn_protocol::checkpoint::layout::is_safe_relative;
use cairn_protocol::checkpoint::{MetadataPointer, read_metadata};
use cairn_raft::model::{CompletedCheckpoint, JobRecord, StateMachineData};
use cairn_taskrt::state::storage::read_verified;
use openraft::EntryPayload;

use super::machines::Machine;

/// What one replica's store holds, as read at open.
#[derive(Debug, Clone)]
pub struct StoreView {
    pub node: u64,
    /// Index of the last log entry (the purge point when the log is empty).
    pub last_log_index: Option<u64>,
    /// Term of the last log entry: with `last_log_index`, how up to date the log is in an
    /// election (the most advanced log is the one a new leader would have).
    pub last_log_term: Option<u64>,
    /// Term of the saved vote.
    pub vote_term: Option<u64>,
    /// The applied id the store opened with (`apply` does not flush, so it may lag the log).
    pub last_applied: Option<u64>,
    /// The jobs once the log after `last_applied` is applied, as the replica does when it runs
    /// again (a replica whose log wins an election commits all of it).
    pub jobs: BTreeMap<String, JobRecord>,
}

/// Opens replica `node`'s store from a copy of `machine` made under `scratch`. `Err` carries
/// why it cannot be opened (a missing data directory, or the store's own error, in full).
pub fn open_store(
    node: u64,
    machine: &Machine,
    data_dir: &Path,
    scratch: &Path,
) -> anyhow::Result<StoreView> {
    let copy = scratch.join(&machine.name);
    machine.copy_to(&copy)?;
    let result = open_copy(node, machine, data_dir, &copy);
    if let Err(error) = std::fs::remove_dir_all(&copy) {
        tracing::warn!(%error, copy = %copy.display(), "cannot remove the inspection copy");
    }
    result.map_err(|reason| anyhow::anyhow!(reason))
}

fn open_copy(node: u64, machine: &Machine, data_dir: &Path, copy: &Path) -> Result<StoreView, String> {
    let relative = data_dir
        .strip_prefix(machine.fs.mountpoint())
        .map_err(|_| format!("{} is not on machine {}", data_dir.display(), machine.name))?;
    let dir = copy.join(relative);
    if !dir.is_dir() {
        let mut shown = dir.clone();
        while !shown.exists() && shown.pop() {}
        let survivor = shown.strip_prefix(copy).unwrap_or(&shown).display().to_string();
        return Err(format!(
            "replica {node}: its data directory {} is gone (the deepest surviving ancestor is {})",
            data_dir.display(),
            if survivor.is_empty() { "the machine's root".to_owned() } else { survivor }
        ));
    }
    let (log, sm) = cairn_storage::open(&dir).map_err(|e| format!("replica {node}: {}", chain(&e)))?;
    let state = log.log_state().map_err(|e| format!("replica {node}: log state: {e}"))?;
    let vote = log.vote().map_err(|e| format!("replica {node}: vote: {e}"))?;
    let reader = sm.reader();
    let last_applied = reader.last_applied().map(|id| id.index);
    let mut data =
        StateMachineData { jobs: reader.jobs().into_iter().map(|job| (job.id.clone(), job)).collect() };
    let tail = log
        .entries(last_applied.map_or(0, |i| i + 1)..)
        .map_err(|e| format!("replica {node}: reading the log after the applied entry: {e}"))?;
    for entry in &tail {
        if let EntryPayload::Normal(command) = &entry.payload {
            // Rejections are committed outcomes too; they change nothing.
            let _ = data.apply(command);
        }
    }
    Ok(StoreView {
        node,
        last_log_index: state.last_log_id.map(|id| id.index),
        last_log_term: state.last_log_id.map(|id| id.leader_id.term),
        vote_term: vote.map(|v| v.leader_id().term),
        last_applied,
        jobs: data
            .jobs
            .into_iter()
            .map(|(id, job)| (id.as_str().to_owned(), std::sync::Arc::unwrap_or_clone(job)))
            .collect(),
    })
}

/// An error and its sources, on one line.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// Problems with the files of every checkpoint and savepoint `job` lists: each `_metadata` must
/// be there with the size and CRC the store recorded, name the same checkpoint, and every state
/// file it references must be there with the size and CRC it records.
pub fn check_checkpoint_files(job: &JobRecord) -> Vec<String> {
    let mut problems = Vec::new();
    for checkpoint in &job.completed {
        problems.extend(check_one(job, checkpoint, None));
    }
    for savepoint in &job.savepoints {
        problems.extend(check_one(job, &savepoint.checkpoint, Some(Path::new(&savepoint.path))));
    }
    problems
}

fn check_one(job: &JobRecord, checkpoint: &CompletedCheckpoint, savepoint: Option<&Path>) -> Vec<String> {
    let what = format!(
        "job {}: {} {}",
        job.id.as_str(),
        if savepoint.is_some() { "savepoint" } else { "completed checkpoint" },
        checkpoint.id
    );
    let pointer = MetadataPointer {
        path: PathBuf::from(&checkpoint.metadata_path),
        size: checkpoint.metadata_size,
        crc32: checkpoint.metadata_crc32,
    };
    let metadata = match read_metadata(&pointer) {
        Ok(metadata) => metadata,
        Err(error) => return vec![format!("{what}: {error}")],
    };
    let mut problems = Vec::new();
    if metadata.checkpoint_id != checkpoint.id {
        problems.push(format!("{what}: its _metadata is that of checkpoint {}", metadata.checkpoint_id));
    }
    // State files are relative to the savepoint's directory, or to the job's checkpoint
    // directory (the parent of `chk-<id>/`).
    let base = match savepoint {
        Some(dir) => Some(dir.to_owned()),
        None if checkpoint.kind.is_savepoint() => pointer.path.parent().map(Path::to_owned),
        None => pointer.path.parent().and_then(Path::parent).map(Path::to_owned),
    };
    let Some(base) = base else {
        return vec![format!("{what}: metadata path {} has no parent", pointer.path.display())];
    };
    for (subtask, state) in &metadata.subtasks {
        for file in state.files() {
            if !is_safe_relative(&file.path) {
                problems.push(format!("{what}: subtask {subtask} references unsafe path {:?}", file.path));
                continue;
            }
            if let Err(error) = read_verified(&base, file) {
                problems.push(format!("{what}: subtask {subtask}: {error}"));
            }
        }
    }
    problems
}
