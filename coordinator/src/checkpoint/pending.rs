//! A checkpoint in flight: from the trigger to the commit of its completion.
//!
//! [`PendingCheckpoint`] owns the acknowledgement bookkeeping (who must still ack, who did, the
//! states they sent), validates every acknowledged state handle before keeping it, and builds
//! the `_metadata` value once all acks are in. Its [`Stage`] says where it is in the completion
//! pipeline; which transitions are legal is decided by the core.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cairn_protocol::checkpoint::layout::is_safe_relative;
use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
use cairn_protocol::checkpoint::{CheckpointMetadata, StateFile, SubtaskState, VertexInfo};
use cairn_raft::model::{CheckpointKind, CompletedCheckpoint};
use tokio::time::Instant;

use super::actions::RequestId;
use super::tasks::{TaskAttemptId, TaskSet};

/// Who asked for a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Periodic,
    Manual(RequestId),
}

impl Origin {
    pub fn request(self) -> Option<RequestId> {
        match self {
            Self::Periodic => None,
            Self::Manual(r) => Some(r),
        }
    }
}

/// Where a pending checkpoint is in the completion pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for acknowledgements.
    Acking,
    /// All acks in; `_metadata` is being written.
    WritingMetadata,
    /// `_metadata` written; the completion is being committed through Raft. From here on the
    /// outcome is Raft's: a timeout cannot abort it and nothing may be deleted until it is known.
    Committing,
}

/// The result of one acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOutcome {
    /// Accepted; `all_acked` when it was the last one missing.
    Accepted { all_acked: bool },
    /// The attempt already acknowledged: ignored (its state is the one kept).
    Duplicate,
    /// The attempt is not one this checkpoint waits for.
    UnknownAttempt,
    /// The state handle is unusable (path escapes its directory, exclusive file outside the
    /// checkpoint's directory, bad offsets...): the checkpoint must fail.
    Invalid(String),
}

/// A snapshot in flight.
#[derive(Debug)]
pub struct PendingCheckpoint {
    pub id: u64,
    pub kind: CheckpointKind,
    pub origin: Origin,
    /// Directory the state handles' relative paths resolve against.
    pub base_dir: PathBuf,
    /// The snapshot's own directory (`chk-<id>` or the savepoint directory): deleted on failure.
    pub dir: PathBuf,
    pub trigger_time_ms: u64,
    /// When the checkpoint expires unless it has reached [`Stage::Committing`].
    pub deadline: Instant,
    pub stage: Stage,
    /// Whether the trigger went out to tasks (then they must hear of an abort).
    pub tasks_triggered: bool,
    /// Shape of the job when triggered, for `_metadata`.
    vertices: BTreeMap<String, VertexInfo>,
    /// Attempt → subtask key (`vertex/index`) of the subtasks yet to acknowledge.
    not_yet_acked: BTreeMap<TaskAttemptId, String>,
    /// Attempt → subtask key of those that did.
    acked: BTreeMap<TaskAttemptId, String>,
    /// Acknowledged state by subtask key.
    states: BTreeMap<String, SubtaskState>,
    /// Every relative path referenced by an accepted ack: protects them from stray discards.
    referenced: BTreeSet<String>,
    /// Master hook states taken at trigger time.
    pub master_states: BTreeMap<String, Vec<u8>>,
    /// Completion time stamped into `_metadata` when all acks were in.
    pub completion_time_ms: Option<u64>,
    /// The completed checkpoint record, once `_metadata` is written.
    pub completed: Option<CompletedCheckpoint>,
}

/// Fields a new pending checkpoint is created from.
#[derive(Debug)]
pub struct PendingInit {
    pub id: u64,
    pub kind: CheckpointKind,
    pub origin: Origin,
    pub base_dir: PathBuf,
    pub dir: PathBuf,
    pub trigger_time_ms: u64,
    pub deadline: Instant,
}

impl PendingCheckpoint {
    /// A checkpoint waiting for every task of `tasks` that has not finished; a finished task
    /// counts as acknowledged with empty state.
    pub fn new(init: PendingInit, tasks: &TaskSet) -> Self {
        let mut pending = Self {
            id: init.id,
            kind: init.kind,
            origin: init.origin,
            base_dir: init.base_dir,
            dir: init.dir,
            trigger_time_ms: init.trigger_time_ms,
            deadline: init.deadline,
            stage: Stage::Acking,
            tasks_triggered: false,
            vertices: tasks.vertices(),
            not_yet_acked: tasks.iter().map(|(t, _)| (t.attempt, t.key())).collect(),
            acked: BTreeMap::new(),
            states: BTreeMap::new(),
            referenced: BTreeSet::new(),
            master_states: BTreeMap::new(),
            completion_time_ms: None,
            completed: None,
        };
        for attempt in tasks.finished_attempts() {
            pending.task_finished(attempt);
        }
        pending
    }

    /// A task this checkpoint waits for finished without acknowledging it: it finished after
    /// a final checkpoint, so it takes no part in this one and its state here is empty.
    /// Returns whether every task is now in (`None` if the checkpoint did not wait for it).
    pub fn task_finished(&mut self, attempt: TaskAttemptId) -> Option<bool> {
        let key = self.not_yet_acked.remove(&attempt)?;
        self.states.insert(key.clone(), SubtaskState::default());
        self.acked.insert(attempt, key);
        Some(self.not_yet_acked.is_empty())
    }

    pub fn num_tasks(&self) -> usize {
        self.not_yet_acked.len() + self.acked.len()
    }

    pub fn is_savepoint(&self) -> bool {
        self.kind != CheckpointKind::Checkpoint
    }

    pub fn is_acknowledged_by(&self, attempt: TaskAttemptId) -> bool {
        self.acked.contains_key(&attempt)
    }

    pub fn waits_for(&self, attempt: TaskAttemptId) -> bool {
        self.not_yet_acked.contains_key(&attempt)
    }

    /// Whether an accepted ack references this relative path.
    pub fn references(&self, rel: &str) -> bool {
        self.referenced.contains(rel)
    }

    /// Every file of the accepted acks.
    pub fn files(&self) -> impl Iterator<Item = &StateFile> {
        self.states.values().flat_map(|s| s.files())
    }

    /// Takes one acknowledgement (only meaningful in [`Stage::Acking`]).
    pub fn acknowledge(&mut self, attempt: TaskAttemptId, state: SubtaskState) -> AckOutcome {
        if self.acked.contains_key(&attempt) {
            return AckOutcome::Duplicate;
        }
        let Some(key) = self.not_yet_acked.get(&attempt) else {
            return AckOutcome::UnknownAttempt;
        };
        if let Err(why) = self.validate(key, &state) {
            return AckOutcome::Invalid(why);
        }
        let Some(key) = self.not_yet_acked.remove(&attempt) else {
            return AckOutcome::UnknownAttempt;
        };
        self.referenced.extend(state.files().map(|f| f.path.clone()));
        self.states.insert(key.clone(), state);
        self.acked.insert(attempt, key);
        AckOutcome::Accepted { all_acked: self.not_yet_acked.is_empty() }
    }

    /// Checks that a subtask's state can be kept: a consistent handle (safe relative paths, each
    /// keyed-state file listed once, every key-group segment inside its file and not overlapping
    /// another, list-state offsets ascending and within their file), exclusive files inside this
    /// checkpoint's directory (so that deleting a checkpoint's directory never deletes another's
    /// files), no shared files in a self-contained savepoint, key groups within the vertex's max
    /// parallelism.
    fn validate(&self, key: &str, state: &SubtaskState) -> Result<(), String> {
        let vertex = key.rsplit_once('/').map(|(v, _)| v).unwrap_or(key);
        let max_parallelism = self.vertices.get(vertex).map(|v| v.max_parallelism).unwrap_or(0);
        let exclusive_prefix = format!("chk-{}/", self.id);
        for (op, op_state) in &state.operators {
            op_state.validate().map_err(|e| format!("operator {op}: {e}"))?;
            for f in op_state.files() {
                // Also checked by `validate`; kept here so that no path is ever kept unchecked.
                if !is_safe_relative(&f.path) {
                    return Err(format!("operator {op}: path {:?} is not a safe relative path", f.path));
                }
                match (self.is_savepoint(), f.is_shared()) {
                    (true, true) => {
                        return Err(format!(
                            "operator {op}: savepoint state {:?} must not be shared",
                            f.path
                        ));
                    }
                    (false, false) if !f.path.starts_with(&exclusive_prefix) => {
                        return Err(format!(
                            "operator {op}: exclusive file {:?} is outside {exclusive_prefix}",
                            f.path
                        ));
                    }
                    _ => {}
                }
            }
            if let Some(kg) = op_state.keyed.key_groups.keys().find(|kg| **kg >= max_parallelism) {
                return Err(format!(
                    "operator {op}: key group {kg} is not below max parallelism {max_parallelism}"
                ));
            }
        }
        Ok(())
    }

    /// The `_metadata` value of this checkpoint, once all acks are in.
    pub fn build_metadata(&self, job: &str, completion_time_ms: u64) -> CheckpointMetadata {
        CheckpointMetadata {
            version: METADATA_VERSION,
            job: job.to_owned(),
            checkpoint_id: self.id,
            kind: kind_name(self.kind).to_owned(),
            trigger_time_ms: self.trigger_time_ms,
            completion_time_ms: completion_time_ms.max(self.trigger_time_ms),
            vertices: self.vertices.clone(),
            subtasks: self.states.clone(),
            master_states: self.master_states.clone(),
        }
    }

    /// Bytes of state the accepted acks reference.
    pub fn state_size(&self) -> u64 {
        // Saturating: the sizes are what tasks reported.
        self.states.values().fold(0, |total, s| total.saturating_add(s.state_size()))
    }

    /// The shared files among the accepted acks.
    pub fn shared_files(&self) -> BTreeSet<String> {
        self.files().filter(|f| f.is_shared()).map(|f| f.path.clone()).collect()
    }
}

/// The `kind` string `_metadata` stores.
pub fn kind_name(kind: CheckpointKind) -> &'static str {
    match kind {
        CheckpointKind::Checkpoint => "checkpoint",
        CheckpointKind::Savepoint => "savepoint",
        CheckpointKind::SyncSavepoint => "sync_savepoint",
    }
}
