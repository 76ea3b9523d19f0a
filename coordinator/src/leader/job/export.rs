//! Publishing the job's checkpoint figures to the replica's metrics (`cairn_job_*`).

use super::*;
use crate::checkpoint::stats::{CheckpointStatsTracker, DEFAULT_HISTORY_SIZE};

impl JobDriver {
    /// Before this leader has a core for the job: the counts the previous leader recorded
    /// (raised to the replicated completed count), as the core itself will start from.
    pub(super) fn seed_metrics(&self, record: &cairn_raft::model::JobRecord) {
        let seeded = CheckpointStatsTracker::restore(
            DEFAULT_HISTORY_SIZE,
            recorded_stats(record),
            record.num_completed,
        );
        self.series.publish(seeded.stats(), Some(record.attempts).filter(|a| *a > 0));
    }

    /// The core's current statistics and the deployed attempt.
    pub(super) fn publish_metrics(&self) {
        let Some(core) = &self.core else { return };
        self.series.publish(core.stats(), self.deployed.as_ref().map(|d| d.attempt));
    }
}
