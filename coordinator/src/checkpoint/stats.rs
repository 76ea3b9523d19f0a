//! Checkpoint statistics: per checkpoint (trigger time, acknowledgements, per-subtask
//! durations, state size, end-to-end duration, status, failure reason) and per job (counts, the
//! latest completed / failed / restored, and a bounded history). Everything is serde so the
//! admin API can serve it as is.
//!
//! The counts survive a leader change through [`StatsSummary`]: the driver may persist the
//! summary, and a new leader seeds its tracker with [`CheckpointStatsTracker::restore`], using the
//! replicated `JobRecord::num_completed` as the floor for the completed count.

use std::collections::VecDeque;

use cairn_protocol::checkpoint::TaskCheckpointMetrics;
use cairn_raft::model::CheckpointKind;
use serde::{Deserialize, Serialize};

use super::failure::CheckpointFailureReason;

/// Where a checkpoint is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointStatus {
    InProgress,
    Completed,
    Failed,
}

/// What one subtask reported with its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskCheckpointStats {
    pub vertex: String,
    pub subtask: u32,
    pub ack_time_ms: u64,
    /// From the trigger to this subtask's acknowledgement.
    pub end_to_end_ms: u64,
    pub metrics: TaskCheckpointMetrics,
}

/// Why a checkpoint failed, for statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureInfo {
    pub reason: CheckpointFailureReason,
    pub detail: Option<String>,
}

/// Statistics of one checkpoint or savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointStats {
    pub id: u64,
    pub kind: CheckpointKind,
    pub status: CheckpointStatus,
    pub trigger_time_ms: u64,
    pub num_subtasks: u32,
    pub num_acknowledged: u32,
    pub latest_ack_time_ms: Option<u64>,
    /// Bytes of state referenced (sum over acknowledged subtasks).
    pub state_size: u64,
    /// Bytes written for this checkpoint (incremental: new files only).
    pub bytes_persisted: u64,
    /// Bytes of in-flight records persisted by unaligned checkpoints (Flink's persisted data;
    /// part of `bytes_persisted`).
    #[serde(default)]
    pub persisted_data: u64,
    /// From trigger to completion or failure.
    pub end_to_end_ms: Option<u64>,
    pub failure: Option<FailureInfo>,
    /// Checkpoint or savepoint directory, once completed.
    pub external_path: Option<String>,
    /// One entry per acknowledged subtask.
    pub subtasks: Vec<SubtaskCheckpointStats>,
}

impl CheckpointStats {
    /// A copy without the per-subtask entries (which are not copied at all: a job with a
    /// hundred subtasks would otherwise copy a hundred entries to drop them).
    pub fn without_subtasks(&self) -> Self {
        Self {
            id: self.id,
            kind: self.kind,
            status: self.status,
            trigger_time_ms: self.trigger_time_ms,
            num_subtasks: self.num_subtasks,
            num_acknowledged: self.num_acknowledged,
            latest_ack_time_ms: self.latest_ack_time_ms,
            state_size: self.state_size,
            bytes_persisted: self.bytes_persisted,
            persisted_data: self.persisted_data,
            end_to_end_ms: self.end_to_end_ms,
            failure: self.failure.clone(),
            external_path: self.external_path.clone(),
            subtasks: Vec::new(),
        }
    }
}

/// A restore that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredCheckpointStats {
    pub id: u64,
    pub restore_time_ms: u64,
    pub external_path: Option<String>,
}

/// Job-level counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCounts {
    pub triggered: u64,
    pub in_progress: u64,
    pub completed: u64,
    pub failed: u64,
    pub restored: u64,
}

/// The small part of the statistics worth persisting across leader changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSummary {
    pub counts: CheckpointCounts,
    /// Counted checkpoint failures since the last success (the failure manager's count), so a
    /// new leader continues it.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Latest entries without their per-subtask details.
    pub latest_completed: Option<CheckpointStats>,
    pub latest_savepoint: Option<CheckpointStats>,
    pub latest_failed: Option<CheckpointStats>,
    pub latest_restored: Option<RestoredCheckpointStats>,
}

/// Everything the admin API shows about a job's checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCheckpointStats {
    pub counts: CheckpointCounts,
    pub latest_completed: Option<CheckpointStats>,
    pub latest_savepoint: Option<CheckpointStats>,
    pub latest_failed: Option<CheckpointStats>,
    pub latest_restored: Option<RestoredCheckpointStats>,
    /// The most recent checkpoints, oldest first, at most the configured number.
    pub history: VecDeque<CheckpointStats>,
}

/// Updates [`JobCheckpointStats`] as checkpoints progress.
#[derive(Debug, Clone)]
pub struct CheckpointStatsTracker {
    /// Bound on `stats.history`, so memory does not grow with the job's age.
    history_size: usize,
    stats: JobCheckpointStats,
}

/// Flink's default `web.checkpoints.history`.
pub const DEFAULT_HISTORY_SIZE: usize = 10;

impl CheckpointStatsTracker {
    pub fn new(history_size: usize) -> Self {
        Self { history_size, stats: JobCheckpointStats::default() }
    }

    /// Seeds the tracker after a leader change from a persisted summary (if any) and the
    /// replicated count of completed checkpoints. Nothing is in progress on a new leader.
    pub fn restore(
        history_size: usize,
        summary: Option<StatsSummary>,
        replicated_num_completed: u64,
    ) -> Self {
        let summary = summary.unwrap_or_default();
        let mut counts = summary.counts;
        counts.in_progress = 0;
        counts.completed = counts.completed.max(replicated_num_completed);
        counts.triggered = counts.triggered.max(counts.completed + counts.failed);
        let stats = JobCheckpointStats {
            counts,
            latest_completed: summary.latest_completed,
            latest_savepoint: summary.latest_savepoint,
            latest_failed: summary.latest_failed,
            latest_restored: summary.latest_restored,
            history: VecDeque::new(),
        };
        Self { history_size, stats }
    }

    pub fn stats(&self) -> &JobCheckpointStats {
        &self.stats
    }

    /// The persistable summary (latest entries without per-subtask details).
    pub fn summary(&self) -> StatsSummary {
        let strip = |c: &Option<CheckpointStats>| c.as_ref().map(CheckpointStats::without_subtasks);
        StatsSummary {
            counts: self.stats.counts,
            latest_completed: strip(&self.stats.latest_completed),
            latest_savepoint: strip(&self.stats.latest_savepoint),
            latest_failed: strip(&self.stats.latest_failed),
            latest_restored: self.stats.latest_restored.clone(),
            consecutive_failures: 0,
        }
    }

    pub fn report_pending(&mut self, id: u64, kind: CheckpointKind, trigger_time_ms: u64, num_subtasks: u32) {
        self.stats.counts.triggered += 1;
        self.stats.counts.in_progress += 1;
        self.stats.history.push_back(CheckpointStats {
            id,
            kind,
            status: CheckpointStatus::InProgress,
            trigger_time_ms,
            num_subtasks,
            num_acknowledged: 0,
            latest_ack_time_ms: None,
            state_size: 0,
            bytes_persisted: 0,
            persisted_data: 0,
            end_to_end_ms: None,
            failure: None,
            external_path: None,
            subtasks: Vec::new(),
        });
        while self.stats.history.len() > self.history_size {
            self.stats.history.pop_front();
        }
    }

    pub fn report_ack(
        &mut self,
        id: u64,
        vertex: &str,
        subtask: u32,
        ack_time_ms: u64,
        metrics: TaskCheckpointMetrics,
    ) {
        if let Some(c) = self.entry(id) {
            c.num_acknowledged += 1;
            c.latest_ack_time_ms = Some(ack_time_ms);
            // Saturating: the figures are what tasks reported.
            c.state_size = c.state_size.saturating_add(metrics.state_size);
            c.bytes_persisted = c.bytes_persisted.saturating_add(metrics.bytes_persisted);
            c.persisted_data = c.persisted_data.saturating_add(metrics.channel_state_bytes);
            c.subtasks.push(SubtaskCheckpointStats {
                vertex: vertex.to_owned(),
                subtask,
                ack_time_ms,
                end_to_end_ms: ack_time_ms.saturating_sub(c.trigger_time_ms),
                metrics,
            });
        }
    }

    pub fn report_completed(&mut self, id: u64, completion_time_ms: u64, external_path: String) {
        self.stats.counts.in_progress = self.stats.counts.in_progress.saturating_sub(1);
        self.stats.counts.completed += 1;
        let Some(c) = self.entry(id) else { return };
        c.status = CheckpointStatus::Completed;
        c.end_to_end_ms = Some(completion_time_ms.saturating_sub(c.trigger_time_ms));
        c.external_path = Some(external_path);
        let c = c.clone();
        if c.kind == CheckpointKind::Checkpoint {
            self.stats.latest_completed = Some(c);
        } else {
            self.stats.latest_savepoint = Some(c);
        }
    }

    pub fn report_failed(
        &mut self,
        id: u64,
        failure_time_ms: u64,
        reason: CheckpointFailureReason,
        detail: Option<String>,
    ) {
        self.stats.counts.in_progress = self.stats.counts.in_progress.saturating_sub(1);
        self.stats.counts.failed += 1;
        let Some(c) = self.entry(id) else { return };
        c.status = CheckpointStatus::Failed;
        c.end_to_end_ms = Some(failure_time_ms.saturating_sub(c.trigger_time_ms));
        c.failure = Some(FailureInfo { reason, detail });
        self.stats.latest_failed = Some(c.clone());
    }

    pub fn report_restored(&mut self, id: u64, restore_time_ms: u64, external_path: Option<String>) {
        self.stats.counts.restored += 1;
        self.stats.latest_restored = Some(RestoredCheckpointStats { id, restore_time_ms, external_path });
    }

    fn entry(&mut self, id: u64) -> Option<&mut CheckpointStats> {
        self.stats.history.iter_mut().rev().find(|c| c.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_history_is_bounded() {
        let mut t = CheckpointStatsTracker::new(3);
        for id in 1..=5 {
            t.report_pending(id, CheckpointKind::Checkpoint, id * 10, 2);
            t.report_completed(id, id * 10 + 5, format!("/cp/chk-{id}"));
        }
        let ids: Vec<u64> = t.stats().history.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![3, 4, 5]);
        assert_eq!(t.stats().counts.completed, 5);
        assert_eq!(t.stats().latest_completed.as_ref().map(|c| c.id), Some(5));
    }

    #[test]
    fn stats_counts_restore_from_summary() {
        let mut t = CheckpointStatsTracker::new(10);
        t.report_pending(1, CheckpointKind::Checkpoint, 0, 1);
        t.report_completed(1, 5, "/cp/chk-1".into());
        t.report_pending(2, CheckpointKind::Checkpoint, 10, 1);
        t.report_failed(2, 20, CheckpointFailureReason::CheckpointExpired, None);
        t.report_pending(3, CheckpointKind::Checkpoint, 30, 1);
        let json = serde_json::to_string(&t.summary()).unwrap();
        let summary: StatsSummary = serde_json::from_str(&json).unwrap();
        // The replicated store knows of one more completion than the summary (the old leader
        // died before persisting it).
        let r = CheckpointStatsTracker::restore(10, Some(summary), 2);
        let c = r.stats().counts;
        assert_eq!((c.triggered, c.in_progress, c.completed, c.failed), (3, 0, 2, 1));
        assert_eq!(r.stats().latest_failed.as_ref().map(|f| f.id), Some(2));
        let fresh = CheckpointStatsTracker::restore(10, None, 7);
        assert_eq!(fresh.stats().counts.completed, 7);
    }

    #[test]
    fn the_summary_holds_the_latest_entries_without_their_subtasks() {
        let mut t = CheckpointStatsTracker::new(10);
        t.report_pending(1, CheckpointKind::Checkpoint, 0, 2);
        for subtask in 0..2 {
            t.report_ack(1, "src", subtask, 4, TaskCheckpointMetrics::default());
        }
        t.report_completed(1, 5, "/cp/chk-1".into());
        let full = t.stats().latest_completed.clone().unwrap();
        assert_eq!(full.subtasks.len(), 2);
        let summary = t.summary();
        let latest = summary.latest_completed.unwrap();
        assert!(latest.subtasks.is_empty());
        assert_eq!(latest, CheckpointStats { subtasks: Vec::new(), ..full });
    }

    #[test]
    fn stats_serialize() {
        let mut t = CheckpointStatsTracker::new(10);
        t.report_pending(1, CheckpointKind::Savepoint, 0, 1);
        t.report_ack(
            1,
            "src",
            0,
            4,
            TaskCheckpointMetrics { sync_ms: 1, async_ms: 2, alignment_ms: 3, ..Default::default() },
        );
        t.report_restored(1, 9, Some("/sp".into()));
        let json = serde_json::to_value(t.stats()).unwrap();
        let back: JobCheckpointStats = serde_json::from_value(json).unwrap();
        assert_eq!(&back, t.stats());
        assert_eq!(back.history[0].subtasks[0].metrics.async_ms, 2);
    }
}
