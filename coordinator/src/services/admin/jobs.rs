//! Job calls: submit (validated like `cairn.v1.Store/RegisterJob`), list, describe with the
//! leader's live view, cancel, and checkpoint configuration changes applied at once.

use std::sync::Arc;

use cairn_proto::admin as pb;
use cairn_protocol::job::{PlacementStrategy, RestoreMode};
use cairn_raft::model::{
    CheckpointConfig, Command, CommandError, JobId, JobRecord, JobSpec, JobStatus, Outcome,
};

use super::dedup::{RequestKey, first, wrap};
use super::{AdminService, convert};
use crate::error::NodeError;
use crate::leader::JobView;
use crate::replica::{linearizable, propose};
use crate::services::store::{MAX_NAME_LEN, MAX_SPEC_BYTES, check_spec, parse_job_id};

/// The live job (not terminal) whose retained checkpoints include the directory `dir`, if any:
/// a `claim` restore would take files that job still needs.
fn claimed_from_live_job(jobs: &[Arc<JobRecord>], dir: &str) -> Option<JobId> {
    let dir = std::path::Path::new(dir);
    jobs.iter().filter(|j| !j.status.is_terminal()).find_map(|j| {
        j.completed
            .iter()
            .any(|c| std::path::Path::new(&c.metadata_path).parent() == Some(dir))
            .then(|| j.id.clone())
    })
}

fn parse_checkpoint(raw: &str) -> Result<CheckpointConfig, NodeError> {
    if raw.trim().is_empty() {
        return Ok(CheckpointConfig::default());
    }
    serde_json::from_str(raw).map_err(|e| NodeError::InvalidArgument(format!("checkpoint_json: {e}")))
}

/// Applies the fields of `patch` (a JSON object) to `current`.
fn patch_checkpoint(current: &CheckpointConfig, patch: &str) -> Result<CheckpointConfig, NodeError> {
    let patch: serde_json::Map<String, serde_json::Value> = serde_json::from_str(patch).map_err(|e| {
        NodeError::InvalidArgument(format!("checkpoint_json must be a JSON object of fields to change: {e}"))
    })?;
    if patch.is_empty() {
        return Err(NodeError::InvalidArgument(
            "checkpoint_json names no field to change, e.g. {\"interval\": \"5s\"}".into(),
        ));
    }
    let mut merged = serde_json::to_value(current).map_err(|e| NodeError::Internal(e.to_string()))?;
    if let Some(obj) = merged.as_object_mut() {
        obj.extend(patch);
    }
    let config: CheckpointConfig = serde_json::from_value(merged)
        .map_err(|e| NodeError::InvalidArgument(format!("checkpoint_json: {e}")))?;
    config.validate().map_err(|e| NodeError::InvalidArgument(format!("checkpoint_json: {e}")))?;
    Ok(config)
}

impl AdminService {
    /// The record of `job`, read from the applied state (call after a linearizable read).
    pub(super) fn record(&self, job: &JobId) -> Result<Arc<JobRecord>, NodeError> {
        self.ctx
            .reader
            .job(job)
            .ok_or_else(|| NodeError::Command(CommandError::UnknownJob { job: job.clone() }))
    }

    /// The leader's live view of `job`, if this replica's runtime drives it.
    pub(super) async fn live_view(&self, job: &JobId) -> Option<JobView> {
        let term = self.leader.current()?;
        term.job(job.clone()).await.ok()?
    }

    pub(super) async fn submit_job(
        &self,
        req: pb::SubmitJobRequest,
    ) -> Result<pb::SubmitJobReply, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        if req.name.len() > MAX_NAME_LEN {
            return Err(NodeError::InvalidArgument(format!("name: at most {MAX_NAME_LEN} bytes")));
        }
        if req.graph_json.len() + req.checkpoint_json.len() > MAX_SPEC_BYTES {
            return Err(NodeError::InvalidArgument(format!(
                "graph_json and checkpoint_json together are {} bytes; at most {MAX_SPEC_BYTES} are accepted",
                req.graph_json.len() + req.checkpoint_json.len()
            )));
        }
        let graph = if req.graph_json.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&req.graph_json)
                .map_err(|e| NodeError::InvalidArgument(format!("graph_json: {e}")))?
        };
        let restore_from = (!req.restore_from.trim().is_empty()).then(|| req.restore_from.clone());
        if let Some(from) = &restore_from {
            // Absolute (every replica and worker resolves it) and without `..`.
            cairn_protocol::operators::check_absolute_path(from)
                .map_err(|why| NodeError::InvalidArgument(format!("restore_from {why}")))?;
        }
        let restore_mode = match req.restore_mode.trim() {
            "" | "no_claim" => RestoreMode::NoClaim,
            "claim" => RestoreMode::Claim,
            other => {
                return Err(NodeError::InvalidArgument(format!(
                    "restore_mode {other:?} is not a restore mode; use no_claim (the default) or claim"
                )));
            }
        };
        let restart_strategy = if req.restart_strategy_json.trim().is_empty() {
            None
        } else {
            Some(serde_json::from_str(&req.restart_strategy_json).map_err(|e| {
                NodeError::InvalidArgument(format!(
                    "restart_strategy_json: {e} (e.g. {{\"type\": \"fixed-delay\", \"attempts\": 3, \"delay\": \"10s\"}})"
                ))
            })?)
        };
        let placement = match req.placement.trim() {
            "" | "pack" => PlacementStrategy::Pack,
            "spread" => PlacementStrategy::Spread,
            other => {
                return Err(NodeError::InvalidArgument(format!(
                    "placement {other:?} is not a placement; use pack (the default) or spread"
                )));
            }
        };
        let spec = JobSpec {
            graph,
            checkpoint: parse_checkpoint(&req.checkpoint_json)?,
            restore_from,
            allow_non_restored_state: req.allow_non_restored_state,
            restore_mode,
            restart_strategy,
            placement,
        };
        check_spec(&spec, "")?;
        if spec.restore_mode == RestoreMode::Claim
            && let Some(from) = &spec.restore_from
        {
            linearizable(&self.ctx).await?;
            if let Some(owner) = claimed_from_live_job(&self.ctx.reader.jobs(), from) {
                return Err(NodeError::FailedPrecondition(format!(
                    "restore_mode claim: {from} is a retained checkpoint of job `{owner}`, which is still live; \
                     use no_claim, or stop or cancel `{owner}` first"
                )));
            }
        }
        let canonical = serde_json::to_vec(&spec).map_err(|e| NodeError::Internal(e.to_string()))?;
        let key = RequestKey::parse(
            &req.request_id,
            "SubmitJob",
            &[job.as_str().as_bytes(), req.name.as_bytes(), &canonical],
        )?;
        let cmd = wrap(key.as_ref(), Command::RegisterJob { job: job.clone(), name: req.name, spec });
        let (_, log_id) = propose(&self.ctx, cmd).await?;
        Ok(pb::SubmitJobReply { job_id: job.to_string(), log_index: log_id.index })
    }

    pub(super) async fn list_jobs(&self) -> Result<pb::ListJobsReply, NodeError> {
        linearizable(&self.ctx).await?;
        Ok(pb::ListJobsReply {
            jobs: self.ctx.reader.jobs().iter().map(|j| convert::job_summary(j)).collect(),
        })
    }

    pub(super) async fn describe_job(&self, req: pb::JobRequest) -> Result<pb::JobDetails, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        let view = self.live_view(&job).await;
        let workers = match self.leader.current() {
            Some(term) => term.workers().await.unwrap_or_default(),
            None => Vec::new(),
        };
        let used: std::collections::BTreeSet<&str> =
            view.iter().flat_map(|v| v.tasks.iter().filter_map(|t| t.worker.as_deref())).collect();
        let config = view
            .as_ref()
            .and_then(|v| v.checkpoint.clone())
            .unwrap_or_else(|| record.spec.checkpoint.clone());
        Ok(pb::JobDetails {
            summary: Some(convert::job_summary(&record)),
            checkpoint_config: Some(convert::checkpoint_config(&config)),
            graph_json: if record.spec.graph.is_null() {
                String::new()
            } else {
                record.spec.graph.to_string()
            },
            restore_from: record.spec.restore_from.clone().unwrap_or_default(),
            phase: view.as_ref().map(|v| v.summary.phase.clone()).unwrap_or_default(),
            attempt: view.as_ref().and_then(|v| v.summary.attempt).unwrap_or(record.attempts),
            tasks: view
                .as_ref()
                .map(|v| {
                    v.tasks
                        .iter()
                        .map(|t| pb::TaskInfo {
                            vertex: t.vertex.clone(),
                            subtask: t.subtask,
                            parallelism: t.parallelism,
                            worker: t.worker.clone().unwrap_or_default(),
                            status: t.status.to_owned(),
                            load: t.load.map(|l| pb::TaskLoad {
                                back_pressured_ms_per_second: l.back_pressured_ms_per_second,
                                busy_ms_per_second: l.busy_ms_per_second,
                                idle_ms_per_second: l.idle_ms_per_second,
                                backpressure: l.backpressure.name().to_owned(),
                            }),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            workers: workers
                .into_iter()
                .filter(|w| used.contains(w.worker_id.as_str()))
                .map(|w| pb::WorkerInfo { worker_id: w.worker_id, slots: w.slots, slots_used: w.used })
                .collect(),
            pending_checkpoints: view.map(|v| v.summary.pending_checkpoints).unwrap_or_default(),
            next_checkpoint_id: record.next_checkpoint_id,
            restore_mode: convert::restore_mode_name(record.spec.restore_mode).to_owned(),
            restart: Some(convert::restart_status(
                &record,
                &record.spec.effective_restart_strategy(self.ctx.default_restart_strategy.as_deref()),
            )),
        })
    }

    /// Commits `canceled`, then has the job's driver cancel the tasks. A job already in a
    /// terminal state keeps it (the reply says which).
    pub(super) async fn cancel_job(
        &self,
        req: pb::CancelJobRequest,
    ) -> Result<pb::CancelJobReply, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        let key = RequestKey::parse(&req.request_id, "CancelJob", &[job.as_str().as_bytes()])?;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        if record.status.is_terminal() {
            return Ok(pb::CancelJobReply { status: record.status.name().to_owned() });
        }
        let cmd = wrap(key.as_ref(), Command::SetJobStatus { job: job.clone(), status: JobStatus::Canceled });
        match propose(&self.ctx, cmd).await {
            Ok(_) => {}
            // Ended on its own meanwhile: report how.
            Err(NodeError::Command(CommandError::JobTerminal { status, .. })) => {
                let status = self.record(&job).map(|r| r.status.name().to_owned()).unwrap_or(status);
                return Ok(pb::CancelJobReply { status });
            }
            Err(e) => return Err(e),
        }
        tracing::info!(job = %job, "job canceled by an operator");
        if let Some(term) = self.leader.current() {
            term.cancel(job).await.map_err(|s| NodeError::Stopped(s.message().to_owned()))?;
        }
        Ok(pb::CancelJobReply { status: JobStatus::Canceled.name().to_owned() })
    }

    pub(super) async fn update_checkpoint_config(
        &self,
        req: pb::UpdateCheckpointConfigRequest,
    ) -> Result<pb::UpdateCheckpointConfigReply, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        let key = RequestKey::parse(
            &req.request_id,
            "UpdateCheckpointConfig",
            &[job.as_str().as_bytes(), req.checkpoint_json.as_bytes()],
        )?;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        let config = patch_checkpoint(&record.spec.checkpoint, &req.checkpoint_json)?;
        let cmd = wrap(key.as_ref(), Command::UpdateJobConfig { job: job.clone(), checkpoint: config });
        let (outcome, _) = propose(&self.ctx, cmd).await?;
        let (outcome, repeated) = first(outcome);
        if !repeated {
            let subsumed = match outcome {
                Outcome::Subsumed { checkpoints } => checkpoints,
                _ => Vec::new(),
            };
            if let Some(term) = self.leader.current() {
                term.config_changed(job.clone(), subsumed)
                    .await
                    .map_err(|s| NodeError::Stopped(s.message().to_owned()))?;
            }
        }
        let applied = self.record(&job)?;
        Ok(pb::UpdateCheckpointConfigReply {
            checkpoint_config: Some(convert::checkpoint_config(&applied.spec.checkpoint)),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_patch_changes_only_the_fields_it_names() {
        let current = CheckpointConfig { retained: 3, ..Default::default() };
        let c = patch_checkpoint(&current, r#"{"interval": "5s"}"#).unwrap();
        assert_eq!((c.interval, c.retained), (Some(Duration::from_secs(5)), 3));
        let err = patch_checkpoint(&current, r#"{"intervall": "5s"}"#).unwrap_err().to_string();
        assert!(err.contains("unknown field"), "{err}");
        let err = patch_checkpoint(&current, r#"{"retained": 0}"#).unwrap_err().to_string();
        assert!(err.contains("retained"), "{err}");
        assert!(patch_checkpoint(&current, "{}").is_err());
        assert!(patch_checkpoint(&current, "[1]").is_err());
    }
}
