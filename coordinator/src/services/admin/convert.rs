//! Conversions between the replicated model, the leader's live view and the admin messages.

use std::time::Duration;

use cairn_proto::admin as pb;
use cairn_protocol::job::RestoreMode;
use cairn_protocol::restart::RestartStrategy;
use cairn_raft::model::{CheckpointConfig, CheckpointKind, JobRecord, JobStatus};

use crate::checkpoint::stats::{CheckpointStats, CheckpointStatus};
use crate::checkpoint::{JobCheckpointStats, StatsSummary};

pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub fn kind_name(kind: CheckpointKind) -> &'static str {
    match kind {
        CheckpointKind::Checkpoint => "checkpoint",
        CheckpointKind::Savepoint => "savepoint",
        CheckpointKind::SyncSavepoint => "sync_savepoint",
    }
}

pub fn status_name(status: CheckpointStatus) -> &'static str {
    match status {
        CheckpointStatus::InProgress => "in_progress",
        CheckpointStatus::Completed => "completed",
        CheckpointStatus::Failed => "failed",
    }
}

pub fn checkpoint_config(c: &CheckpointConfig) -> pb::CheckpointConfig {
    pb::CheckpointConfig {
        interval_ms: c.interval.map_or(0, millis),
        timeout_ms: millis(c.timeout),
        min_pause_ms: millis(c.min_pause),
        max_concurrent: c.max_concurrent,
        tolerable_failures: c.tolerable_failures,
        retained: c.retained,
        savepoint_dir: c.savepoint_dir.clone().unwrap_or_default(),
        checkpoint_dir: c.storage_dir.clone().unwrap_or_default(),
        externalized_retention: enum_name(&c.externalized_retention),
        unaligned: c.unaligned,
        aligned_checkpoint_timeout_ms: millis(c.aligned_checkpoint_timeout),
    }
}

/// The serde (snake_case) name of a unit enum value, as the JSON configuration writes it.
fn enum_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

pub fn restore_mode_name(mode: RestoreMode) -> &'static str {
    match mode {
        RestoreMode::NoClaim => "no_claim",
        RestoreMode::Claim => "claim",
    }
}

/// The restart strategy in effect and what it remembers of the job's failures.
pub fn restart_status(job: &JobRecord, strategy: &RestartStrategy) -> pb::RestartStatus {
    let r = &job.restart;
    pb::RestartStatus {
        strategy_json: serde_json::to_string(strategy).unwrap_or_default(),
        failures: r.failures,
        restarts: r.restarts,
        last_failure_time_ms: r.last_failure.as_ref().map_or(0, |f| f.at_ms),
        last_failure_cause: r.last_failure.as_ref().map(|f| f.cause.clone()).unwrap_or_default(),
        next_restart_time_ms: r.next_restart_ms.filter(|_| job.status == JobStatus::Restarting),
    }
}

pub fn worker_status(w: crate::leader::WorkerSlots) -> pb::WorkerStatus {
    use crate::auth::WorkerIdentity;
    pb::WorkerStatus {
        worker_id: w.worker_id,
        slots: w.slots,
        slots_used: w.used,
        state: if w.connected { "attached" } else { "disconnected" }.to_owned(),
        jobs: w.jobs,
        authenticated_by: match w.identity {
            WorkerIdentity::SharedToken => "shared token",
            WorkerIdentity::Token(_) => "worker token",
            WorkerIdentity::Certificate(_) => "certificate",
        }
        .to_owned(),
        data_addr: w.data_addr,
    }
}

pub fn job_summary(job: &JobRecord) -> pb::JobSummary {
    let latest = job.latest_completed();
    pb::JobSummary {
        job_id: job.id.to_string(),
        name: job.name.clone(),
        status: job.status.name().to_owned(),
        status_reason: match &job.status {
            JobStatus::Failed { reason } => reason.clone(),
            JobStatus::Restarting => {
                job.restart.last_failure.as_ref().map(|f| f.cause.clone()).unwrap_or_default()
            }
            _ => String::new(),
        },
        completed_checkpoints: job.num_completed,
        latest_checkpoint_id: latest.map_or(0, |c| c.id),
        latest_checkpoint_time_ms: latest.map_or(0, |c| c.completion_time_ms),
        attempts: job.attempts,
        restarts: job.restart.restarts,
    }
}

pub fn checkpoint_summary(s: &CheckpointStats) -> pb::CheckpointSummary {
    pb::CheckpointSummary {
        id: s.id,
        kind: kind_name(s.kind).to_owned(),
        status: status_name(s.status).to_owned(),
        trigger_time_ms: s.trigger_time_ms,
        latest_ack_time_ms: s.latest_ack_time_ms.unwrap_or(0),
        num_subtasks: s.num_subtasks,
        num_acknowledged: s.num_acknowledged,
        state_size: s.state_size,
        bytes_persisted: s.bytes_persisted,
        persisted_data: s.persisted_data,
        duration_ms: s.end_to_end_ms.unwrap_or(0),
        external_path: s.external_path.clone().unwrap_or_default(),
        failure_reason: s.failure.as_ref().map(|f| format!("{:?}", f.reason)).unwrap_or_default(),
        failure_detail: s.failure.as_ref().and_then(|f| f.detail.clone()).unwrap_or_default(),
    }
}

/// Count, min, max and mean of `values` (all zero when empty).
pub fn summarize(values: impl IntoIterator<Item = u64>) -> pb::DurationSizeSummary {
    let mut s = pb::DurationSizeSummary { count: 0, min: u64::MAX, max: 0, avg: 0 };
    let mut sum: u128 = 0;
    for v in values {
        s.count += 1;
        s.min = s.min.min(v);
        s.max = s.max.max(v);
        sum += u128::from(v);
    }
    if s.count == 0 {
        s.min = 0;
    } else {
        s.avg = u64::try_from(sum / u128::from(s.count)).unwrap_or(u64::MAX);
    }
    s
}

/// The overview from the live statistics (with history) or, when no coordinator runs the job on
/// this leader, from the summary the last one recorded through Raft.
pub fn overview(
    job: &JobRecord,
    live: Option<&JobCheckpointStats>,
    recorded: Option<&StatsSummary>,
) -> pb::CheckpointOverview {
    let (counts, completed, savepoint, failed, restored, history) = match (live, recorded) {
        (Some(l), _) => (
            l.counts,
            l.latest_completed.as_ref(),
            l.latest_savepoint.as_ref(),
            l.latest_failed.as_ref(),
            l.latest_restored.as_ref(),
            l.history.iter().rev().collect::<Vec<_>>(),
        ),
        (None, Some(r)) => (
            r.counts,
            r.latest_completed.as_ref(),
            r.latest_savepoint.as_ref(),
            r.latest_failed.as_ref(),
            r.latest_restored.as_ref(),
            Vec::new(),
        ),
        (None, None) => Default::default(),
    };
    let done: Vec<&&CheckpointStats> =
        history.iter().filter(|s| s.status == CheckpointStatus::Completed).collect();
    pb::CheckpointOverview {
        job_id: job.id.to_string(),
        counts: Some(pb::CheckpointCounts {
            triggered: counts.triggered,
            in_progress: counts.in_progress,
            completed: counts.completed,
            failed: counts.failed,
            restored: counts.restored,
        }),
        latest_completed: completed.map(checkpoint_summary),
        latest_savepoint: savepoint.map(checkpoint_summary),
        latest_failed: failed.map(checkpoint_summary),
        latest_restored: restored.map(|r| pb::RestoredCheckpoint {
            id: r.id,
            restore_time_ms: r.restore_time_ms,
            external_path: r.external_path.clone().unwrap_or_default(),
        }),
        end_to_end_duration_ms: Some(summarize(done.iter().map(|s| s.end_to_end_ms.unwrap_or(0)))),
        state_size: Some(summarize(done.iter().map(|s| s.state_size))),
        history: history.into_iter().map(checkpoint_summary).collect(),
        retained_checkpoint_ids: job.completed.iter().map(|c| c.id).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_compute_min_avg_max() {
        let s = summarize([10, 30, 20]);
        assert_eq!((s.count, s.min, s.max, s.avg), (3, 10, 30, 20));
        let empty = summarize([]);
        assert_eq!((empty.count, empty.min, empty.max, empty.avg), (0, 0, 0, 0));
        let big = summarize([u64::MAX, u64::MAX]);
        assert_eq!(big.avg, u64::MAX);
    }
}
