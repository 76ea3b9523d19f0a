//! Per-job checkpoint figures under Flink's metric names (`cairn_job_<flinkName>{job_id=...}`),
//! in Flink's units: durations in milliseconds, sizes in bytes, timestamps in milliseconds
//! since the epoch, and `-1` where Flink reports "none yet".
//!
//! The leader's job driver owns its job's [`JobSeries`]: it publishes the core's statistics
//! after every event it feeds the core, and dropping the driver (job finished, failed or
//! removed; leadership lost) removes the series. Counts survive a leader change because the
//! new leader's driver seeds them from the replicated statistics summary, as the core does.

use cairn_process::metrics::SeriesOwners;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::checkpoint::stats::JobCheckpointStats;

/// Labels of one job.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct JobLabels {
    pub job_id: String,
}

type PerJob = Family<JobLabels, Gauge>;

/// The Flink metrics exported per job, in registration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Figure {
    Completed,
    Failed,
    InProgress,
    Total,
    LastDuration,
    LastSize,
    LastFullSize,
    LastRestoreTimestamp,
    LastCompletedId,
    NumRestarts,
}

impl Figure {
    const ALL: [Figure; 10] = [
        Figure::Completed,
        Figure::Failed,
        Figure::InProgress,
        Figure::Total,
        Figure::LastDuration,
        Figure::LastSize,
        Figure::LastFullSize,
        Figure::LastRestoreTimestamp,
        Figure::LastCompletedId,
        Figure::NumRestarts,
    ];

    fn name(self) -> &'static str {
        match self {
            Figure::Completed => "numberOfCompletedCheckpoints",
            Figure::Failed => "numberOfFailedCheckpoints",
            Figure::InProgress => "numberOfInProgressCheckpoints",
            Figure::Total => "totalNumberOfCheckpoints",
            Figure::LastDuration => "lastCheckpointDuration",
            Figure::LastSize => "lastCheckpointSize",
            Figure::LastFullSize => "lastCheckpointFullSize",
            Figure::LastRestoreTimestamp => "lastCheckpointRestoreTimestamp",
            Figure::LastCompletedId => "lastCompletedCheckpointId",
            Figure::NumRestarts => "numRestarts",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Figure::Completed => "Completed checkpoints of the job (savepoints included)",
            Figure::Failed => "Failed checkpoints of the job",
            Figure::InProgress => "Checkpoints of the job in progress",
            Figure::Total => "Checkpoints of the job triggered (in progress, completed and failed)",
            Figure::LastDuration => "Trigger to completion of the last completed checkpoint, ms (-1: none)",
            Figure::LastSize => {
                "Bytes written for the last completed checkpoint (new files only when incremental; -1: none)"
            }
            Figure::LastFullSize => "Full state size of the last completed checkpoint, bytes (-1: none)",
            Figure::LastRestoreTimestamp => {
                "When the job last restored from a checkpoint, ms since epoch (-1: never)"
            }
            Figure::LastCompletedId => "Id of the last completed checkpoint (-1: none)",
            Figure::NumRestarts => {
                "Deployments of the job after its first (replicated attempt counter - 1): restarts after failures or lost tasks"
            }
        }
    }
}

/// One family per [`Figure`], in [`Figure::ALL`] order.
#[derive(Clone)]
pub(crate) struct JobFamilies(Vec<PerJob>);

impl JobFamilies {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("job");
        let families = Figure::ALL
            .iter()
            .map(|f| {
                let family = PerJob::default();
                r.register(f.name(), f.help(), family.clone());
                family
            })
            .collect();
        Self(families)
    }
}

/// The series of one job, written by its driver.
pub struct JobSeries {
    labels: JobLabels,
    gauges: Vec<Gauge>,
    families: JobFamilies,
    owners: SeriesOwners<JobLabels>,
}

impl std::fmt::Debug for JobSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSeries").field("job_id", &self.labels.job_id).finish_non_exhaustive()
    }
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl JobSeries {
    pub(crate) fn acquire(families: JobFamilies, owners: SeriesOwners<JobLabels>, job_id: &str) -> Self {
        let labels = JobLabels { job_id: job_id.to_owned() };
        let gauges = owners.acquire(&labels, || {
            let gauges: Vec<Gauge> = families.0.iter().map(|f| f.get_or_create_owned(&labels)).collect();
            // "None yet" until the first statistics are published.
            for f in [
                Figure::LastDuration,
                Figure::LastSize,
                Figure::LastFullSize,
                Figure::LastRestoreTimestamp,
                Figure::LastCompletedId,
            ] {
                gauges[f as usize].set(-1);
            }
            gauges
        });
        Self { labels, gauges, families, owners }
    }

    fn set(&self, figure: Figure, value: i64) {
        self.gauges[figure as usize].set(value);
    }

    /// Publishes the job's statistics, and its current deployment attempt when known.
    pub fn publish(&self, stats: &JobCheckpointStats, attempt: Option<u32>) {
        let c = stats.counts;
        self.set(Figure::Completed, gauge_value(c.completed));
        self.set(Figure::Failed, gauge_value(c.failed));
        self.set(Figure::InProgress, gauge_value(c.in_progress));
        self.set(Figure::Total, gauge_value(c.triggered));
        // Flink's "last checkpoint" is the last completed one, savepoints included.
        let last =
            [&stats.latest_completed, &stats.latest_savepoint].into_iter().flatten().max_by_key(|c| c.id);
        if let Some(last) = last {
            self.set(Figure::LastDuration, last.end_to_end_ms.map_or(-1, gauge_value));
            self.set(Figure::LastSize, gauge_value(last.bytes_persisted));
            self.set(Figure::LastFullSize, gauge_value(last.state_size));
            self.set(Figure::LastCompletedId, gauge_value(last.id));
        }
        if let Some(r) = &stats.latest_restored {
            self.set(Figure::LastRestoreTimestamp, gauge_value(r.restore_time_ms));
        }
        if let Some(attempt) = attempt {
            self.set(Figure::NumRestarts, i64::from(attempt.saturating_sub(1)));
        }
    }
}

impl Drop for JobSeries {
    fn drop(&mut self) {
        let families = &self.families;
        let labels = &self.labels;
        self.owners.release(labels, || {
            for f in &families.0 {
                f.remove(labels);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use cairn_process::metrics::render;
    use cairn_raft::model::CheckpointKind;

    use crate::checkpoint::stats::CheckpointStatsTracker;
    use crate::metrics::ReplicaMetrics;

    fn value(text: &str, name: &str, job: &str) -> Option<i64> {
        let prefix = format!("cairn_job_{name}{{job_id=\"{job}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
    }

    #[test]
    fn job_statistics_render_under_flink_names() {
        let m = ReplicaMetrics::new();
        let series = m.job("demo");
        let text = render(&m.registry()).unwrap();
        assert_eq!(value(&text, "numberOfCompletedCheckpoints", "demo"), Some(0), "{text}");
        assert_eq!(value(&text, "lastCompletedCheckpointId", "demo"), Some(-1));
        assert_eq!(value(&text, "lastCheckpointRestoreTimestamp", "demo"), Some(-1));

        let mut t = CheckpointStatsTracker::new(10);
        t.report_restored(3, 1_700_000_000_000, Some("/cp/demo/chk-3".into()));
        t.report_pending(4, CheckpointKind::Checkpoint, 1000, 2);
        t.report_ack(
            4,
            "src",
            0,
            1010,
            cairn_protocol::checkpoint::TaskCheckpointMetrics {
                bytes_persisted: 100,
                state_size: 400,
                ..Default::default()
            },
        );
        t.report_completed(4, 1042, "/cp/demo/chk-4".into());
        t.report_pending(5, CheckpointKind::Checkpoint, 2000, 2);
        t.report_failed(5, 2500, crate::checkpoint::CheckpointFailureReason::CheckpointExpired, None);
        t.report_pending(6, CheckpointKind::Checkpoint, 3000, 2);
        series.publish(t.stats(), Some(3));

        let text = render(&m.registry()).unwrap();
        let v = |name| value(&text, name, "demo");
        assert_eq!(v("numberOfCompletedCheckpoints"), Some(1), "{text}");
        assert_eq!(v("numberOfFailedCheckpoints"), Some(1));
        assert_eq!(v("numberOfInProgressCheckpoints"), Some(1));
        assert_eq!(v("totalNumberOfCheckpoints"), Some(3));
        assert_eq!(v("lastCheckpointDuration"), Some(42));
        assert_eq!(v("lastCheckpointSize"), Some(100));
        assert_eq!(v("lastCheckpointFullSize"), Some(400));
        assert_eq!(v("lastCompletedCheckpointId"), Some(4));
        assert_eq!(v("lastCheckpointRestoreTimestamp"), Some(1_700_000_000_000));
        assert_eq!(v("numRestarts"), Some(2));
        assert!(text.contains("# TYPE cairn_job_numberOfCompletedCheckpoints gauge"), "{text}");
    }

    #[test]
    fn a_jobs_series_go_with_its_last_driver() {
        let m = ReplicaMetrics::new();
        let old_term = m.job("demo");
        let other = m.job("other");
        // The next term's driver starts before the old one is dropped.
        let new_term = m.job("demo");
        drop(old_term);
        let text = render(&m.registry()).unwrap();
        assert_eq!(value(&text, "numberOfCompletedCheckpoints", "demo"), Some(0), "{text}");
        drop(new_term);
        let text = render(&m.registry()).unwrap();
        assert!(!text.contains("job_id=\"demo\""), "{text}");
        assert!(text.contains("job_id=\"other\""), "{text}");
        drop(other);
    }
}
