//! Checkpoint calls: trigger (answered once the id is allocated), wait for an outcome, the
//! statistics overview and one checkpoint's details.

use std::time::Duration;

use cairn_proto::admin as pb;
use cairn_raft::model::request::Lookup;
use cairn_raft::model::{CheckpointKind, CommandError, JobId, JobRecord, Outcome};
use tokio::time::Instant;

use super::dedup::RequestKey;
use super::{AdminService, convert};
use crate::checkpoint::stats::CheckpointStatus;
use crate::checkpoint::{StatsSummary, TriggerKind};
use crate::error::NodeError;
use crate::leader::StartRefusal;
use crate::replica::linearizable;
use crate::services::leader_runtime;
use crate::services::store::parse_job_id;

/// How often a wait looks at the store and the leader's statistics again.
const POLL: Duration = Duration::from_millis(50);
/// Longest wait one call may ask for.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// The statistics summary the last leader recorded, if it decodes.
fn recorded(record: &JobRecord) -> Option<StatsSummary> {
    serde_json::from_value(record.stats.clone()?).ok()
}

fn not_allocated(job: &JobId, id: u64, next: u64) -> NodeError {
    NodeError::NotFound(format!("checkpoint {id} of job `{job}` was never allocated (next id is {next})"))
}

fn outcome(id: u64, status: &str, kind: Option<CheckpointKind>) -> pb::CheckpointOutcome {
    pb::CheckpointOutcome {
        checkpoint_id: id,
        status: status.to_owned(),
        kind: kind.map(convert::kind_name).unwrap_or_default().to_owned(),
        ..Default::default()
    }
}

impl AdminService {
    /// Starts a checkpoint or savepoint through the leader's driver and returns its id as soon as
    /// it is allocated. With a request id, the id is recorded through Raft before the answer, so
    /// a retry (here or on a later leader) gets the same id instead of a second snapshot.
    pub(super) async fn start_trigger(
        &self,
        job: &JobId,
        kind: TriggerKind,
        key: Option<&RequestKey>,
    ) -> Result<u64, NodeError> {
        let term = leader_runtime(&self.ctx, &self.leader).await?;
        let record = self.record(job)?;
        if let Some(k) = key {
            match record.requests.lookup(&k.id, k.fingerprint) {
                Lookup::Repeat(Outcome::CheckpointId { id }) => return Ok(*id),
                Lookup::Repeat(_) | Lookup::Conflict => {
                    return Err(NodeError::Command(CommandError::RequestIdReused {
                        job: job.clone(),
                        request_id: k.id.clone(),
                    }));
                }
                Lookup::New => {}
            }
        }
        if record.status.is_terminal() {
            return Err(NodeError::FailedPrecondition(format!(
                "job `{job}` is {}; it takes no more checkpoints",
                record.status
            )));
        }
        let started = term
            .trigger_started(job.clone(), kind, key.map(RequestKey::trigger_key))
            .await
            .map_err(|s| NodeError::Stopped(s.message().to_owned()))?;
        match started {
            Ok(id) => Ok(id),
            Err(StartRefusal::RequestIdReused) => Err(NodeError::Command(CommandError::RequestIdReused {
                job: job.clone(),
                request_id: key.map(|k| k.id.clone()).unwrap_or_default(),
            })),
            Err(StartRefusal::Refused(why)) => Err(NodeError::FailedPrecondition(why)),
        }
    }

    pub(super) async fn trigger_checkpoint(
        &self,
        req: pb::TriggerCheckpointRequest,
    ) -> Result<pb::TriggerCheckpointReply, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        let key = RequestKey::parse(&req.request_id, "TriggerCheckpoint", &[job.as_str().as_bytes()])?;
        let id = self.start_trigger(&job, TriggerKind::Checkpoint, key.as_ref()).await?;
        Ok(pb::TriggerCheckpointReply { checkpoint_id: id })
    }

    /// Where checkpoint `id` of `job` stands now, from the store and the leader's statistics.
    pub(super) async fn checkpoint_outcome(
        &self,
        job: &JobId,
        id: u64,
    ) -> Result<pb::CheckpointOutcome, NodeError> {
        let record = self.record(job)?;
        if id == 0 || id >= record.next_checkpoint_id {
            return Err(not_allocated(job, id, record.next_checkpoint_id));
        }
        if let Some(c) = record.completed.iter().find(|c| c.id == id) {
            let mut o = outcome(id, "completed", Some(c.kind));
            o.location = std::path::Path::new(&c.metadata_path)
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            return Ok(o);
        }
        if let Some(s) = record.savepoints.iter().find(|s| s.checkpoint.id == id) {
            let mut o = outcome(id, "completed", Some(s.checkpoint.kind));
            o.location = s.path.clone();
            return Ok(o);
        }
        let view = self.live_view(job).await;
        let live = view
            .as_ref()
            .and_then(|v| v.stats.as_ref())
            .and_then(|s| s.history.iter().find(|c| c.id == id).cloned());
        let summary = recorded(&record);
        let from_summary = summary.as_ref().and_then(|s| {
            [&s.latest_failed, &s.latest_completed, &s.latest_savepoint]
                .into_iter()
                .flatten()
                .find(|c| c.id == id)
                .cloned()
        });
        if let Some(s) = live.or(from_summary) {
            let mut o = outcome(id, convert::status_name(s.status), Some(s.kind));
            match s.status {
                CheckpointStatus::Completed => o.location = s.external_path.unwrap_or_default(),
                CheckpointStatus::Failed => {
                    if let Some(f) = s.failure {
                        o.failure_reason = format!("{:?}", f.reason);
                        o.failure_detail = f.detail.unwrap_or_else(|| f.reason.description().to_owned());
                    }
                }
                CheckpointStatus::InProgress => {}
            }
            return Ok(o);
        }
        if view.is_some_and(|v| v.summary.pending_checkpoints.contains(&id)) {
            return Ok(outcome(id, "in_progress", None));
        }
        Ok(outcome(id, "unknown", None))
    }

    /// Polls the outcome until it is final or `timeout` elapsed (then `in_progress`).
    pub(super) async fn wait_outcome(
        &self,
        job: &JobId,
        id: u64,
        timeout: Duration,
    ) -> Result<pb::CheckpointOutcome, NodeError> {
        let deadline = Instant::now() + timeout.min(MAX_WAIT);
        leader_runtime(&self.ctx, &self.leader).await?;
        loop {
            let o = self.checkpoint_outcome(job, id).await?;
            if o.status != "in_progress" || Instant::now() >= deadline {
                return Ok(o);
            }
            if self.leader.current().is_none() {
                return Err(NodeError::NotLeader(cairn_proto::leader_hint::LeaderHint {
                    leader_id: None,
                    leader_addr: None,
                }));
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    pub(super) async fn wait_checkpoint(
        &self,
        req: pb::WaitCheckpointRequest,
    ) -> Result<pb::CheckpointOutcome, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        let timeout =
            if req.timeout_ms == 0 { Duration::from_secs(60) } else { Duration::from_millis(req.timeout_ms) };
        self.wait_outcome(&job, req.checkpoint_id, timeout).await
    }

    pub(super) async fn list_checkpoints(
        &self,
        req: pb::JobRequest,
    ) -> Result<pb::CheckpointOverview, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        let view = self.live_view(&job).await;
        let summary = recorded(&record);
        Ok(convert::overview(&record, view.as_ref().and_then(|v| v.stats.as_ref()), summary.as_ref()))
    }

    pub(super) async fn describe_checkpoint(
        &self,
        req: pb::DescribeCheckpointRequest,
    ) -> Result<pb::CheckpointDetails, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        let id = req.checkpoint_id;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        let stored = record
            .completed
            .iter()
            .chain(record.savepoints.iter().map(|s| &s.checkpoint))
            .find(|c| c.id == id)
            .cloned();
        let view = self.live_view(&job).await;
        let live = view
            .as_ref()
            .and_then(|v| v.stats.as_ref())
            .and_then(|s| s.history.iter().find(|c| c.id == id).cloned());
        let summary = match (&live, &stored) {
            (Some(s), _) => convert::checkpoint_summary(s),
            (None, Some(c)) => pb::CheckpointSummary {
                id,
                kind: convert::kind_name(c.kind).to_owned(),
                status: "completed".to_owned(),
                trigger_time_ms: c.trigger_time_ms,
                state_size: c.state_size,
                duration_ms: c.completion_time_ms.saturating_sub(c.trigger_time_ms),
                external_path: std::path::Path::new(&c.metadata_path)
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                ..Default::default()
            },
            (None, None) if id == 0 || id >= record.next_checkpoint_id => {
                return Err(not_allocated(&job, id, record.next_checkpoint_id));
            }
            (None, None) => {
                return Err(NodeError::NotFound(format!(
                    "checkpoint {id} of job `{job}` is neither retained nor in the leader's recent history"
                )));
            }
        };
        let subtasks = live
            .map(|s| {
                s.subtasks
                    .iter()
                    .map(|t| pb::SubtaskFigures {
                        vertex: t.vertex.clone(),
                        subtask: t.subtask,
                        ack_time_ms: t.ack_time_ms,
                        end_to_end_ms: t.end_to_end_ms,
                        sync_duration_ms: t.metrics.sync_ms,
                        async_duration_ms: t.metrics.async_ms,
                        alignment_duration_ms: t.metrics.alignment_ms,
                        start_delay_ms: t.metrics.start_delay_ms,
                        state_size: t.metrics.state_size,
                        bytes_persisted: t.metrics.bytes_persisted,
                        persisted_data: t.metrics.channel_state_bytes,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(pb::CheckpointDetails {
            summary: Some(summary),
            subtasks,
            metadata_path: stored.as_ref().map(|c| c.metadata_path.clone()).unwrap_or_default(),
            retained: stored.is_some(),
        })
    }
}
