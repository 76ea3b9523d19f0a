//! Prometheus metrics of a replica, served on `/metrics` by [`cairn_process::metrics::serve`]
//! when `metrics_listen` is set.
//!
//! | module | owns |
//! | --- | --- |
//! | this file | [`ReplicaMetrics`]: the registry and every family, handed out as cheap handles |
//! | [`raft`] | Raft health, updated by one task that follows openraft's metrics channel |
//! | [`jobs`] | per-job checkpoint figures (Flink's names), one [`JobSeries`] per job driver |
//!
//! One owner per figure: Raft gauges are written only by the Raft follower task, a job's
//! series only by its job driver (which removes them when it ends: job finished or removed,
//! or leadership lost), the registered-worker gauge only by the leader's term runtime, the
//! proposal histogram by whoever proposes (an atomic observation). A follower therefore exports
//! Raft metrics and no job series.

pub mod jobs;
pub mod raft;

use std::sync::Arc;
use std::time::Duration;

use cairn_process::metrics::{Registry, SeriesOwners, new_registry};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

pub use jobs::JobSeries;
use jobs::{JobFamilies, JobLabels};
use raft::RaftGauges;

/// Every metric of one replica. Cheap to clone; each replica (also in tests that run several in
/// one process) has its own.
#[derive(Clone)]
pub struct ReplicaMetrics {
    registry: Arc<Registry>,
    pub(crate) raft: RaftGauges,
    jobs: JobFamilies,
    job_owners: SeriesOwners<JobLabels>,
    workers: Gauge,
    proposals: Histogram,
}

impl std::fmt::Debug for ReplicaMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaMetrics").finish_non_exhaustive()
    }
}

impl Default for ReplicaMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplicaMetrics {
    pub fn new() -> Self {
        let mut registry = new_registry();
        let raft = RaftGauges::register(&mut registry);
        let jobs = JobFamilies::register(&mut registry);
        let workers = Gauge::default();
        registry.register(
            "workers_registered",
            "Workers registered with this replica's leader runtime (0 on a follower)",
            workers.clone(),
        );
        // 0.5 ms .. ~4 s: loopback commits take about a millisecond, an fsync-bound disk tens.
        let proposals = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "raft_proposal_duration_seconds",
            "Time from proposing a command to Raft to its commit and apply on this replica",
            proposals.clone(),
        );
        Self {
            registry: Arc::new(registry),
            raft,
            jobs,
            job_owners: SeriesOwners::default(),
            workers,
            proposals,
        }
    }

    /// The registry to serve.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The series of one job; they exist until the last [`JobSeries`] of the job is dropped.
    pub fn job(&self, job_id: &str) -> JobSeries {
        JobSeries::acquire(self.jobs.clone(), self.job_owners.clone(), job_id)
    }

    /// A proposal committed (and applied here) after `elapsed`.
    pub fn observe_proposal(&self, elapsed: Duration) {
        self.proposals.observe(elapsed.as_secs_f64());
    }

    /// The leader runtime's worker registry changed size (0 when the runtime stops).
    pub fn set_registered_workers(&self, n: usize) {
        self.workers.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_process::metrics::render;

    #[test]
    fn proposals_and_workers_render() {
        let m = ReplicaMetrics::new();
        m.observe_proposal(Duration::from_millis(3));
        m.observe_proposal(Duration::from_millis(30));
        m.set_registered_workers(2);
        let text = render(&m.registry()).unwrap();
        assert!(text.contains("# TYPE cairn_raft_proposal_duration_seconds histogram"), "{text}");
        assert!(text.contains("\ncairn_raft_proposal_duration_seconds_count 2\n"), "{text}");
        assert!(text.contains("cairn_raft_proposal_duration_seconds_bucket{le=\"0.004\"} 1\n"), "{text}");
        assert!(text.contains("\ncairn_workers_registered 2\n"), "{text}");
    }
}
