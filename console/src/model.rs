//! What each view shows, built from the admin API's messages. The HTML pages and the JSON
//! endpoints (`/api/...`) render the same structures, so both say the same thing.

use cairn_proto::admin as pb;
use serde::Serialize;

/// One term that had a leader: from the replicated leader history, with when this console
/// first saw it (if it was running then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderChange {
    pub term: u64,
    pub leader_id: u64,
    /// Index of the leader's first entry; `None` for a term only this console observed (the
    /// replica it read has not applied that entry yet).
    pub first_log_index: Option<u64>,
    pub observed_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub id: u64,
    pub addr: String,
    pub role: String,
    pub is_leader: bool,
    pub matched_index: Option<u64>,
    pub lag: Option<u64>,
    pub health: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterView {
    /// When the figures were read (ms since the epoch); `None` before the first answer.
    pub observed_at_ms: Option<u64>,
    /// Why the latest read failed, when it did.
    pub error: Option<String>,
    pub leader_id: u64,
    pub leader_addr: String,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub millis_since_quorum_ack: Option<u64>,
    pub nodes: Vec<Node>,
    /// Newest first.
    pub leader_history: Vec<LeaderChange>,
}

impl ClusterView {
    pub fn from_status(s: &pb::ClusterStatusReply) -> Self {
        Self {
            observed_at_ms: None,
            error: None,
            leader_id: s.leader_id,
            leader_addr: s.leader_addr.clone(),
            term: s.term,
            last_log_index: s.last_log_index,
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            snapshot_index: s.snapshot_index,
            millis_since_quorum_ack: s.millis_since_quorum_ack,
            nodes: s
                .nodes
                .iter()
                .map(|n| Node {
                    id: n.id,
                    addr: n.addr.clone(),
                    role: n.role.clone(),
                    is_leader: n.is_leader,
                    matched_index: n.matched_index,
                    lag: n.lag,
                    health: n.health.clone(),
                })
                .collect(),
            leader_history: s
                .leader_history
                .iter()
                .map(|t| LeaderChange {
                    term: t.term,
                    leader_id: t.leader_id,
                    first_log_index: Some(t.first_log_index),
                    observed_at_ms: None,
                })
                .collect(),
        }
    }

    /// A cluster view with nothing read yet.
    pub fn unknown(error: Option<String>) -> Self {
        Self {
            observed_at_ms: None,
            error,
            leader_id: 0,
            leader_addr: String::new(),
            term: 0,
            last_log_index: 0,
            commit_index: 0,
            applied_index: 0,
            snapshot_index: 0,
            millis_since_quorum_ack: None,
            nodes: Vec::new(),
            leader_history: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    pub job_id: String,
    pub name: String,
    pub status: String,
    pub status_reason: String,
    pub attempts: u32,
    pub restarts: u32,
    pub completed_checkpoints: u64,
    pub latest_checkpoint_id: Option<u64>,
    pub latest_checkpoint_time_ms: Option<u64>,
}

impl JobRow {
    pub fn from_summary(s: &pb::JobSummary) -> Self {
        Self {
            job_id: s.job_id.clone(),
            name: s.name.clone(),
            status: s.status.clone(),
            status_reason: s.status_reason.clone(),
            attempts: s.attempts,
            restarts: s.restarts,
            completed_checkpoints: s.completed_checkpoints,
            latest_checkpoint_id: (s.latest_checkpoint_id > 0).then_some(s.latest_checkpoint_id),
            latest_checkpoint_time_ms: (s.latest_checkpoint_time_ms > 0)
                .then_some(s.latest_checkpoint_time_ms),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct JobsView {
    pub jobs: Vec<JobRow>,
}

impl JobsView {
    pub fn from_reply(r: &pb::ListJobsReply) -> Self {
        let mut jobs: Vec<JobRow> = r.jobs.iter().map(JobRow::from_summary).collect();
        jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        Self { jobs }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Task {
    pub vertex: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub worker: String,
    pub status: String,
    /// Back-pressured, busy and idle ms per second recently, and the backpressure level;
    /// absent until the leader has figures.
    pub load: Option<TaskLoad>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskLoad {
    pub back_pressured_ms_per_second: u32,
    pub busy_ms_per_second: u32,
    pub idle_ms_per_second: u32,
    /// `ok`, `low` or `high`.
    pub backpressure: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Worker {
    pub worker_id: String,
    pub slots: u32,
    pub slots_used: u32,
    /// Jobs with tasks on this worker (the workers view only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSettings {
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub min_pause_ms: u64,
    pub max_concurrent: u32,
    pub tolerable_failures: u32,
    pub retained: u32,
    pub checkpoint_dir: String,
    pub savepoint_dir: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RestartInfo {
    pub strategy_json: String,
    pub failures: u64,
    pub restarts: u32,
    pub last_failure_time_ms: Option<u64>,
    pub last_failure_cause: String,
    pub next_restart_time_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub job: JobRow,
    pub phase: String,
    pub attempt: u32,
    pub restore_from: String,
    pub restore_mode: String,
    pub checkpoint_config: Option<CheckpointSettings>,
    pub restart: Option<RestartInfo>,
    pub tasks: Vec<Task>,
    pub workers: Vec<Worker>,
    pub pending_checkpoints: Vec<u64>,
    pub next_checkpoint_id: u64,
}

impl JobView {
    pub fn from_details(job_id: &str, d: &pb::JobDetails) -> Self {
        let job = d.summary.as_ref().map(JobRow::from_summary).unwrap_or_else(|| JobRow {
            job_id: job_id.to_owned(),
            name: String::new(),
            status: String::new(),
            status_reason: String::new(),
            attempts: 0,
            restarts: 0,
            completed_checkpoints: 0,
            latest_checkpoint_id: None,
            latest_checkpoint_time_ms: None,
        });
        let mut tasks: Vec<Task> = d
            .tasks
            .iter()
            .map(|t| Task {
                vertex: t.vertex.clone(),
                subtask: t.subtask,
                parallelism: t.parallelism,
                worker: t.worker.clone(),
                status: t.status.clone(),
                load: t.load.as_ref().map(|l| TaskLoad {
                    back_pressured_ms_per_second: l.back_pressured_ms_per_second,
                    busy_ms_per_second: l.busy_ms_per_second,
                    idle_ms_per_second: l.idle_ms_per_second,
                    backpressure: l.backpressure.clone(),
                }),
            })
            .collect();
        tasks.sort_by(|a, b| a.vertex.cmp(&b.vertex).then(a.subtask.cmp(&b.subtask)));
        Self {
            job,
            phase: d.phase.clone(),
            attempt: d.attempt,
            restore_from: d.restore_from.clone(),
            restore_mode: d.restore_mode.clone(),
            checkpoint_config: d.checkpoint_config.as_ref().map(|c| CheckpointSettings {
                interval_ms: c.interval_ms,
                timeout_ms: c.timeout_ms,
                min_pause_ms: c.min_pause_ms,
                max_concurrent: c.max_concurrent,
                tolerable_failures: c.tolerable_failures,
                retained: c.retained,
                checkpoint_dir: c.checkpoint_dir.clone(),
                savepoint_dir: c.savepoint_dir.clone(),
            }),
            restart: d.restart.as_ref().map(|r| RestartInfo {
                strategy_json: r.strategy_json.clone(),
                failures: r.failures,
                restarts: r.restarts,
                last_failure_time_ms: (r.last_failure_time_ms > 0).then_some(r.last_failure_time_ms),
                last_failure_cause: r.last_failure_cause.clone(),
                next_restart_time_ms: r.next_restart_time_ms,
            }),
            tasks,
            workers: d
                .workers
                .iter()
                .map(|w| Worker {
                    worker_id: w.worker_id.clone(),
                    slots: w.slots,
                    slots_used: w.slots_used,
                    jobs: Vec::new(),
                })
                .collect(),
            pending_checkpoints: d.pending_checkpoints.clone(),
            next_checkpoint_id: d.next_checkpoint_id,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Checkpoint {
    pub id: u64,
    pub kind: String,
    pub status: String,
    pub trigger_time_ms: u64,
    pub latest_ack_time_ms: u64,
    pub num_subtasks: u32,
    pub num_acknowledged: u32,
    pub state_size: u64,
    pub bytes_persisted: u64,
    pub duration_ms: u64,
    pub external_path: String,
    pub failure_reason: String,
    pub failure_detail: String,
}

impl Checkpoint {
    pub fn from_summary(c: &pb::CheckpointSummary) -> Self {
        Self {
            id: c.id,
            kind: c.kind.clone(),
            status: c.status.clone(),
            trigger_time_ms: c.trigger_time_ms,
            latest_ack_time_ms: c.latest_ack_time_ms,
            num_subtasks: c.num_subtasks,
            num_acknowledged: c.num_acknowledged,
            state_size: c.state_size,
            bytes_persisted: c.bytes_persisted,
            duration_ms: c.duration_ms,
            external_path: c.external_path.clone(),
            failure_reason: c.failure_reason.clone(),
            failure_detail: c.failure_detail.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    pub triggered: u64,
    pub in_progress: u64,
    pub completed: u64,
    pub failed: u64,
    pub restored: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MinMaxAvg {
    pub count: u64,
    pub min: u64,
    pub max: u64,
    pub avg: u64,
}

impl MinMaxAvg {
    fn from_pb(s: Option<&pb::DurationSizeSummary>) -> Self {
        s.map(|s| Self { count: s.count, min: s.min, max: s.max, avg: s.avg }).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub id: u64,
    pub restore_time_ms: u64,
    pub external_path: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Savepoint {
    pub checkpoint_id: u64,
    pub path: String,
    pub kind: String,
    pub trigger_time_ms: u64,
    pub completion_time_ms: u64,
    pub state_size: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointsView {
    pub job_id: String,
    pub counts: Counts,
    pub latest_completed: Option<Checkpoint>,
    pub latest_savepoint: Option<Checkpoint>,
    pub latest_failed: Option<Checkpoint>,
    pub latest_restored: Option<Restored>,
    pub end_to_end_duration_ms: MinMaxAvg,
    pub state_size: MinMaxAvg,
    /// Newest first.
    pub history: Vec<Checkpoint>,
    pub retained_checkpoint_ids: Vec<u64>,
    pub savepoints: Vec<Savepoint>,
}

impl CheckpointsView {
    pub fn from_replies(job_id: &str, o: &pb::CheckpointOverview, s: &pb::ListSavepointsReply) -> Self {
        let mut history: Vec<Checkpoint> = o.history.iter().map(Checkpoint::from_summary).collect();
        history.sort_by_key(|c| std::cmp::Reverse(c.id));
        let counts = o
            .counts
            .as_ref()
            .map(|c| Counts {
                triggered: c.triggered,
                in_progress: c.in_progress,
                completed: c.completed,
                failed: c.failed,
                restored: c.restored,
            })
            .unwrap_or_default();
        Self {
            job_id: job_id.to_owned(),
            counts,
            latest_completed: o.latest_completed.as_ref().map(Checkpoint::from_summary),
            latest_savepoint: o.latest_savepoint.as_ref().map(Checkpoint::from_summary),
            latest_failed: o.latest_failed.as_ref().map(Checkpoint::from_summary),
            latest_restored: o.latest_restored.as_ref().map(|r| Restored {
                id: r.id,
                restore_time_ms: r.restore_time_ms,
                external_path: r.external_path.clone(),
            }),
            end_to_end_duration_ms: MinMaxAvg::from_pb(o.end_to_end_duration_ms.as_ref()),
            state_size: MinMaxAvg::from_pb(o.state_size.as_ref()),
            history,
            retained_checkpoint_ids: o.retained_checkpoint_ids.clone(),
            savepoints: s
                .savepoints
                .iter()
                .map(|s| Savepoint {
                    checkpoint_id: s.checkpoint_id,
                    path: s.path.clone(),
                    kind: s.kind.clone(),
                    trigger_time_ms: s.trigger_time_ms,
                    completion_time_ms: s.completion_time_ms,
                    state_size: s.state_size,
                })
                .collect(),
        }
    }

    /// The failed checkpoints of the history, newest first.
    pub fn failed(&self) -> impl Iterator<Item = &Checkpoint> {
        self.history.iter().filter(|c| c.status == "failed")
    }

    /// Completed checkpoints oldest first: the points of the charts.
    pub fn completed_oldest_first(&self) -> Vec<&Checkpoint> {
        let mut v: Vec<&Checkpoint> = self.history.iter().filter(|c| c.status == "completed").collect();
        v.sort_by_key(|c| c.id);
        v
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Subtask {
    pub vertex: String,
    pub subtask: u32,
    pub ack_time_ms: u64,
    pub end_to_end_ms: u64,
    pub sync_duration_ms: u64,
    pub async_duration_ms: u64,
    pub alignment_duration_ms: u64,
    pub start_delay_ms: u64,
    pub state_size: u64,
    pub bytes_persisted: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointView {
    pub job_id: String,
    pub checkpoint: Checkpoint,
    pub metadata_path: String,
    pub retained: bool,
    /// Slowest (end to end) first.
    pub subtasks: Vec<Subtask>,
}

impl CheckpointView {
    pub fn from_details(job_id: &str, id: u64, d: &pb::CheckpointDetails) -> Self {
        let mut subtasks: Vec<Subtask> = d
            .subtasks
            .iter()
            .map(|s| Subtask {
                vertex: s.vertex.clone(),
                subtask: s.subtask,
                ack_time_ms: s.ack_time_ms,
                end_to_end_ms: s.end_to_end_ms,
                sync_duration_ms: s.sync_duration_ms,
                async_duration_ms: s.async_duration_ms,
                alignment_duration_ms: s.alignment_duration_ms,
                start_delay_ms: s.start_delay_ms,
                state_size: s.state_size,
                bytes_persisted: s.bytes_persisted,
            })
            .collect();
        subtasks.sort_by(|a, b| {
            b.end_to_end_ms
                .cmp(&a.end_to_end_ms)
                .then(a.vertex.cmp(&b.vertex))
                .then(a.subtask.cmp(&b.subtask))
        });
        let checkpoint = d.summary.as_ref().map(Checkpoint::from_summary).unwrap_or_else(|| Checkpoint {
            id,
            kind: String::new(),
            status: String::new(),
            trigger_time_ms: 0,
            latest_ack_time_ms: 0,
            num_subtasks: 0,
            num_acknowledged: 0,
            state_size: 0,
            bytes_persisted: 0,
            duration_ms: 0,
            external_path: String::new(),
            failure_reason: String::new(),
            failure_detail: String::new(),
        });
        Self {
            job_id: job_id.to_owned(),
            checkpoint,
            metadata_path: d.metadata_path.clone(),
            retained: d.retained,
            subtasks,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkersView {
    pub workers: Vec<WorkerRow>,
    pub total_slots: u64,
    pub used_slots: u64,
}

/// One worker of the workers view.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    #[serde(flatten)]
    pub worker: Worker,
    /// `attached`, or `disconnected` (awaited until its heartbeat timeout).
    pub state: String,
    pub authenticated_by: String,
    /// Where other workers reach its data exchange; empty if it announced none.
    pub data_addr: String,
}

impl WorkersView {
    /// The leader's workers, by id, with the jobs on each.
    pub fn from_reply(r: pb::ListWorkersReply) -> Self {
        let mut workers: Vec<WorkerRow> = r
            .workers
            .into_iter()
            .map(|w| WorkerRow {
                worker: Worker {
                    worker_id: w.worker_id,
                    slots: w.slots,
                    slots_used: w.slots_used,
                    jobs: w.jobs,
                },
                state: w.state,
                authenticated_by: w.authenticated_by,
                data_addr: w.data_addr,
            })
            .collect();
        workers.sort_by(|a, b| a.worker.worker_id.cmp(&b.worker.worker_id));
        let total_slots = workers.iter().map(|w| u64::from(w.worker.slots)).sum();
        let used_slots = workers.iter().map(|w| u64::from(w.worker.slots_used)).sum();
        Self { workers, total_slots, used_slots }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(id: u64, status: &str, duration: u64) -> pb::CheckpointSummary {
        pb::CheckpointSummary {
            id,
            status: status.into(),
            kind: "checkpoint".into(),
            duration_ms: duration,
            ..Default::default()
        }
    }

    #[test]
    fn history_is_newest_first_and_charts_oldest_first() {
        let o = pb::CheckpointOverview {
            history: vec![summary(1, "completed", 5), summary(3, "failed", 0), summary(2, "completed", 7)],
            ..Default::default()
        };
        let v = CheckpointsView::from_replies("j", &o, &pb::ListSavepointsReply::default());
        assert_eq!(v.history.iter().map(|c| c.id).collect::<Vec<_>>(), [3, 2, 1]);
        assert_eq!(v.completed_oldest_first().iter().map(|c| c.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(v.failed().map(|c| c.id).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn subtasks_are_slowest_first() {
        let sub = |vertex: &str, subtask, e2e| pb::SubtaskFigures {
            vertex: vertex.into(),
            subtask,
            end_to_end_ms: e2e,
            ..Default::default()
        };
        let d = pb::CheckpointDetails {
            subtasks: vec![sub("a", 0, 10), sub("b", 1, 30), sub("a", 1, 20)],
            ..Default::default()
        };
        let v = CheckpointView::from_details("j", 4, &d);
        assert_eq!(v.subtasks.iter().map(|s| s.end_to_end_ms).collect::<Vec<_>>(), [30, 20, 10]);
        assert_eq!(v.checkpoint.id, 4);
    }

    #[test]
    fn workers_are_sorted_with_slot_totals() {
        let w = |id: &str, slots, used, jobs: &[&str], state: &str| pb::WorkerStatus {
            worker_id: id.into(),
            slots,
            slots_used: used,
            state: state.into(),
            jobs: jobs.iter().map(|j| j.to_string()).collect(),
            authenticated_by: "worker token".into(),
            data_addr: String::new(),
        };
        let v = WorkersView::from_reply(pb::ListWorkersReply {
            workers: vec![w("w2", 4, 0, &[], "attached"), w("w1", 8, 3, &["a", "b"], "disconnected")],
        });
        assert_eq!(v.workers.iter().map(|r| r.worker.worker_id.as_str()).collect::<Vec<_>>(), ["w1", "w2"]);
        assert_eq!(v.workers[0].worker.jobs, ["a", "b"]);
        assert_eq!(v.workers[0].state, "disconnected");
        assert!(v.workers[1].worker.jobs.is_empty(), "an idle worker is listed too");
        assert_eq!((v.total_slots, v.used_slots), (12, 3));
    }
}
