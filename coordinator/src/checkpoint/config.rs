//! Configuration of one job's coordinator core: the replicated [`CheckpointConfig`] (Flink's
//! defaults, validated there) plus what only the coordinator needs (resolved storage root,
//! retention policy on termination, memory bounds, the random seed).

use std::path::PathBuf;

use cairn_raft::model::{CheckpointConfig, JobId, JobStatus};
use serde::{Deserialize, Serialize};

use super::error::Error;
use super::stats::DEFAULT_HISTORY_SIZE;

/// How many recently finished checkpoint ids are remembered to tell late messages apart from
/// unknown ones (Flink's `NUM_GHOST_CHECKPOINT_IDS`).
pub const DEFAULT_RECENT_IDS: usize = 16;

/// What happens to a job's completed checkpoints when the job reaches a terminal state
/// (Flink's `CheckpointRetentionPolicy`). Savepoints are never discarded by the coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetentionPolicy {
    /// Discard on finished, canceled and failed (Flink's default).
    #[default]
    NeverRetainAfterTermination,
    /// Keep when the job failed; discard when it finished or was canceled.
    RetainOnFailure,
    /// Keep whatever the terminal state (as Flink does for this policy, finished included).
    RetainOnCancellation,
}

impl RetentionPolicy {
    /// Whether a job that ended in `status` loses its checkpoints. Non-terminal states never do.
    pub fn discards_on(self, status: &JobStatus) -> bool {
        match status {
            JobStatus::Finished => self == Self::NeverRetainAfterTermination || self == Self::RetainOnFailure,
            JobStatus::Canceled => self == Self::NeverRetainAfterTermination || self == Self::RetainOnFailure,
            JobStatus::Failed { .. } => self == Self::NeverRetainAfterTermination,
            JobStatus::Created | JobStatus::Running | JobStatus::Restarting => false,
        }
    }
}

/// Everything one job's core is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreConfig {
    pub job: JobId,
    /// The job's replicated checkpoint configuration.
    pub checkpoint: CheckpointConfig,
    /// Checkpoint storage root: the job's `storage_dir`, or the replica's default.
    pub storage_root: PathBuf,
    pub retention: RetentionPolicy,
    /// Bound on remembered finished checkpoint ids.
    pub recent_ids: usize,
    /// Bound on the statistics history.
    pub stats_history: usize,
    /// Seed of the random initial trigger delay (tests pass a fixed one).
    pub seed: u64,
}

impl CoreConfig {
    /// A configuration with default bounds; `default_storage_root` applies when the job names
    /// no storage directory.
    pub fn new(job: JobId, checkpoint: CheckpointConfig, default_storage_root: impl Into<PathBuf>) -> Self {
        let storage_root =
            checkpoint.storage_dir.as_ref().map(PathBuf::from).unwrap_or_else(|| default_storage_root.into());
        Self {
            job,
            checkpoint,
            storage_root,
            retention: RetentionPolicy::default(),
            recent_ids: DEFAULT_RECENT_IDS,
            stats_history: DEFAULT_HISTORY_SIZE,
            seed: 0,
        }
    }

    pub fn validate(&self) -> Result<(), Error> {
        self.checkpoint.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_policy_follows_flink() {
        let failed = JobStatus::Failed { reason: "x".into() };
        let p = RetentionPolicy::NeverRetainAfterTermination;
        assert!(
            p.discards_on(&JobStatus::Finished)
                && p.discards_on(&JobStatus::Canceled)
                && p.discards_on(&failed)
        );
        let p = RetentionPolicy::RetainOnFailure;
        assert!(p.discards_on(&JobStatus::Canceled) && !p.discards_on(&failed));
        let p = RetentionPolicy::RetainOnCancellation;
        assert!(
            !p.discards_on(&JobStatus::Canceled)
                && !p.discards_on(&failed)
                && !p.discards_on(&JobStatus::Finished)
        );
        assert!(!RetentionPolicy::NeverRetainAfterTermination.discards_on(&JobStatus::Running));
    }

    #[test]
    fn job_storage_dir_overrides_the_default_root() {
        let job = JobId::new("j").unwrap();
        let c = CoreConfig::new(job.clone(), CheckpointConfig::default(), "/default");
        assert_eq!(c.storage_root, PathBuf::from("/default"));
        let cfg = CheckpointConfig { storage_dir: Some("/mine".into()), ..Default::default() };
        assert_eq!(CoreConfig::new(job, cfg, "/default").storage_root, PathBuf::from("/mine"));
    }
}
