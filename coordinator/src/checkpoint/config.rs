//! Configuration of one job's coordinator core: the replicated [`CheckpointConfig`] (Flink's
//! defaults, validated there, including the retention on termination) plus what only the
//! coordinator needs (resolved storage root, memory bounds, the random seed).

use std::path::PathBuf;

use cairn_protocol::config::ExternalizedRetention;
use cairn_raft::model::{CheckpointConfig, JobId, JobStatus};

use super::error::Error;
use super::stats::DEFAULT_HISTORY_SIZE;

/// How many recently finished checkpoint ids are remembered to tell late messages apart from
/// unknown ones (Flink's `NUM_GHOST_CHECKPOINT_IDS`).
pub const DEFAULT_RECENT_IDS: usize = 16;

/// Whether a job that ended in `status` loses its retained checkpoints under `retention` (the
/// job's `externalized_retention`, Flink's retention policies). Non-terminal states never do;
/// savepoints are never discarded by the coordinator.
pub fn discards_on(retention: ExternalizedRetention, status: &JobStatus) -> bool {
    match status {
        JobStatus::Finished | JobStatus::Canceled => !retention.keeps_on_cancellation(),
        JobStatus::Failed { .. } => !retention.keeps_on_failure(),
        JobStatus::Created | JobStatus::Running | JobStatus::Restarting => false,
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
    fn retention_follows_flinks_policies_with_cairns_default() {
        use ExternalizedRetention::*;
        let failed = JobStatus::Failed { reason: "x".into() };
        let p = NoExternalized;
        assert!(
            discards_on(p, &JobStatus::Finished)
                && discards_on(p, &JobStatus::Canceled)
                && discards_on(p, &failed)
        );
        let p = DeleteOnCancellation;
        assert!(discards_on(p, &JobStatus::Canceled) && !discards_on(p, &failed));
        let p = RetainOnCancellation;
        assert!(
            !discards_on(p, &JobStatus::Canceled)
                && !discards_on(p, &failed)
                && !discards_on(p, &JobStatus::Finished)
        );
        assert!(!discards_on(NoExternalized, &JobStatus::Running));
        assert!(!discards_on(NoExternalized, &JobStatus::Restarting));
        assert_eq!(
            ExternalizedRetention::default(),
            DeleteOnCancellation,
            "a failed job keeps its checkpoints"
        );
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
