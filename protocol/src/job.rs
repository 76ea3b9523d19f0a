//! What a user submits: the job's identity and its spec (graph, checkpoint configuration,
//! restore source). The replicated registry stores these as they are; both planes and the CLI
//! validate them with the code here.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::CheckpointConfig;
use crate::restart::RestartStrategy;

/// A job identifier: 1 to 64 characters of `[A-Za-z0-9_.-]`, not starting with `.` (it names
/// a directory in checkpoint storage, so it must be a safe path component).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

/// Why a string is not a valid [`JobId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobIdError {
    #[error("job id is empty")]
    Empty,
    #[error("job id is {0} characters long; at most 64 are allowed")]
    TooLong(usize),
    #[error("job id {0:?} may only contain letters, digits, '_', '-' and '.', and may not start with '.'")]
    BadChar(String),
}

impl JobId {
    pub const MAX_LEN: usize = 64;

    pub fn new(s: impl Into<String>) -> Result<Self, JobIdError> {
        let s = s.into();
        if s.is_empty() {
            return Err(JobIdError::Empty);
        }
        if s.len() > Self::MAX_LEN {
            return Err(JobIdError::TooLong(s.len()));
        }
        let ok = s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok || s.starts_with('.') {
            return Err(JobIdError::BadChar(s));
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JobId {
    type Error = JobIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<JobId> for String {
    fn from(j: JobId) -> String {
        j.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a job runs and how it is checkpointed, as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobSpec {
    /// The job graph, validated against the operator catalog at submission; stored as submitted.
    pub graph: serde_json::Value,
    pub checkpoint: CheckpointConfig,
    /// Savepoint (or retained checkpoint) path to restore from on first start.
    pub restore_from: Option<String>,
    /// Whether state in `restore_from` that maps to no operator may be skipped.
    pub allow_non_restored_state: bool,
    /// Who owns the files of `restore_from` (Flink 2's restore modes).
    #[serde(skip_serializing_if = "RestoreMode::is_default")]
    pub restore_mode: RestoreMode,
    /// How the job is restarted after failures; absent: the cluster's default (see
    /// [`RestartStrategy::default_for`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_strategy: Option<RestartStrategy>,
    /// How the leader places the job's subtasks on workers.
    #[serde(skip_serializing_if = "PlacementStrategy::is_default")]
    pub placement: PlacementStrategy,
}

/// How the leader places a job's subtasks on workers. Either way subtask `i` of every vertex
/// stays together on one worker (a slot-sharing group, as in Flink), so forward edges never
/// cross workers; every subtask still takes one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementStrategy {
    /// The whole job on the worker with the most free slots when one has room for it (its
    /// channels stay in-process); otherwise its groups fill the workers with the most free slots
    /// first.
    #[default]
    Pack,
    /// The groups spread over every worker with free slots, one at a time to the worker with the
    /// most free slots left (Flink's `cluster.evenly-spread-out-slots`).
    Spread,
}

impl PlacementStrategy {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl JobSpec {
    /// The restart strategy in effect: the job's own, else `cluster_default`, else Flink's rule
    /// (exponential delay when the job checkpoints periodically, none otherwise).
    pub fn effective_restart_strategy(&self, cluster_default: Option<&RestartStrategy>) -> RestartStrategy {
        self.restart_strategy
            .clone()
            .or_else(|| cluster_default.cloned())
            .unwrap_or_else(|| RestartStrategy::default_for(self.checkpoint.interval.is_some()))
    }
}

/// Who owns the snapshot a job restores from (`restore_from`), as Flink 2 defines it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestoreMode {
    /// The job never deletes the snapshot's files, and its first checkpoint is full (it shares
    /// no file with the snapshot), so the snapshot can be deleted, or used again, at any time
    /// after that checkpoint.
    #[default]
    NoClaim,
    /// The job owns the snapshot: once its own first checkpoint completed, the snapshot's
    /// directory is deleted (and a store entry for it forgotten). Only for a snapshot no running
    /// job still retains.
    Claim,
}

impl RestoreMode {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_safe_path_components() {
        assert!(JobId::new("wordcount-1.v2").is_ok());
        assert_eq!(JobId::new(""), Err(JobIdError::Empty));
        assert!(matches!(JobId::new("../etc"), Err(JobIdError::BadChar(_))));
        assert!(matches!(JobId::new(".hidden"), Err(JobIdError::BadChar(_))));
        assert!(matches!(JobId::new("a/b"), Err(JobIdError::BadChar(_))));
        assert_eq!(JobId::new("x".repeat(65)), Err(JobIdError::TooLong(65)));
    }

    #[test]
    fn job_id_deserialization_validates() {
        assert!(serde_json::from_str::<JobId>("\"a/b\"").is_err());
        assert_eq!(serde_json::from_str::<JobId>("\"ok\"").unwrap().as_str(), "ok");
    }
}
