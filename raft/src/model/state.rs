//! Deterministic application of commands to the job registry.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_protocol::restart::RestartDecision;
use serde::{Deserialize, Serialize};

use super::request::Lookup;
use super::{
    CheckpointKind, Command, CommandError, CompletedCheckpoint, JobId, JobRecord, JobStatus, MAX_BATCH,
    MAX_ID_RESERVATION, Outcome, RequestEntry,
};

/// The whole replicated state: every job's record, by id.
///
/// Records are shared (`Arc`), so a copy of the whole state (a snapshot being built, a read of
/// every job) costs a reference count per job, not a deep clone; a change clones the one record
/// it changes while a copy still shares it ([`Arc::make_mut`]). Encoded as the plain records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateMachineData {
    pub jobs: BTreeMap<JobId, Arc<JobRecord>>,
}

impl StateMachineData {
    pub fn job(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id).map(|j| &**j)
    }

    /// Applies one command. On error nothing changes. Pure and deterministic: the result depends
    /// only on the current state and the command.
    pub fn apply(&mut self, cmd: &Command) -> Result<Outcome, CommandError> {
        match cmd {
            Command::Batch { commands } => return self.apply_batch(commands),
            Command::Deduplicated { request_id, fingerprint, command } => {
                return self.apply_deduplicated(request_id, *fingerprint, command);
            }
            Command::RecordRequest { job, request_id, fingerprint, outcome } => {
                let record = self
                    .jobs
                    .get_mut(job)
                    .map(Arc::make_mut)
                    .ok_or_else(|| CommandError::UnknownJob { job: job.clone() })?;
                return match record.requests.lookup(request_id, *fingerprint) {
                    Lookup::Repeat(first) => Ok(Outcome::Repeated { first: Box::new(first.clone()) }),
                    Lookup::Conflict => Err(CommandError::RequestIdReused {
                        job: job.clone(),
                        request_id: request_id.clone(),
                    }),
                    Lookup::New => {
                        record.requests.record(RequestEntry {
                            id: request_id.clone(),
                            fingerprint: *fingerprint,
                            outcome: outcome.clone(),
                        });
                        Ok(outcome.clone())
                    }
                };
            }
            _ => {}
        }
        if let Command::RegisterJob { job, name, spec } = cmd {
            if self.jobs.contains_key(job) {
                return Err(CommandError::JobExists { job: job.clone() });
            }
            spec.checkpoint.validate()?;
            let name = if name.is_empty() { job.to_string() } else { name.clone() };
            self.jobs.insert(job.clone(), Arc::new(JobRecord::new(job.clone(), name, spec.clone())));
            return Ok(Outcome::Done);
        }
        let Some(job_id) = cmd.job() else {
            return Err(CommandError::InvalidBatch { reason: "a batch inside a command".to_owned() });
        };
        let Some(job) = self.jobs.get_mut(job_id).map(Arc::make_mut) else {
            return Err(CommandError::UnknownJob { job: job_id.clone() });
        };
        if let Command::RemoveJob { .. } = cmd {
            if !job.status.is_terminal() {
                return Err(CommandError::JobNotTerminal {
                    job: job_id.clone(),
                    status: job.status.to_string(),
                });
            }
            let removed = self.jobs.remove(job_id);
            let (checkpoints, savepoints) =
                removed.map(Arc::unwrap_or_clone).map(|j| (j.completed, j.savepoints)).unwrap_or_default();
            return Ok(Outcome::JobRemoved { checkpoints, savepoints });
        }
        if let Command::ReleaseRetainedCheckpoint { checkpoint_id, .. } = cmd {
            if !job.status.is_terminal() {
                return Err(CommandError::JobNotTerminal {
                    job: job_id.clone(),
                    status: job.status.to_string(),
                });
            }
            let pos =
                job.completed.iter().position(|c| c.id == *checkpoint_id).ok_or_else(|| {
                    CommandError::UnknownCheckpoint { job: job_id.clone(), id: *checkpoint_id }
                })?;
            return Ok(Outcome::Subsumed { checkpoints: vec![job.completed.remove(pos)] });
        }
        if let Command::DiscardRetainedCheckpoints { .. } = cmd {
            if !job.status.is_terminal() {
                return Err(CommandError::JobNotTerminal {
                    job: job_id.clone(),
                    status: job.status.to_string(),
                });
            }
            return Ok(Outcome::Subsumed { checkpoints: std::mem::take(&mut job.completed) });
        }
        // Forgetting a savepoint is allowed after the job ended (e.g. after stop-with-savepoint).
        if job.status.is_terminal() && !matches!(cmd, Command::DisposeSavepoint { .. }) {
            return Err(CommandError::JobTerminal { job: job_id.clone(), status: job.status.to_string() });
        }
        apply_to_live_job(job, cmd)
    }
}

impl StateMachineData {
    /// Applies each command of a batch in order, as if each were its own log entry.
    fn apply_batch(&mut self, commands: &[Command]) -> Result<Outcome, CommandError> {
        if commands.is_empty() || commands.len() > MAX_BATCH {
            return Err(CommandError::InvalidBatch {
                reason: format!("{} commands; a batch holds 1 to {MAX_BATCH}", commands.len()),
            });
        }
        if commands.iter().any(|c| matches!(c, Command::Batch { .. })) {
            return Err(CommandError::InvalidBatch { reason: "a batch inside a batch".to_owned() });
        }
        Ok(Outcome::Batch { results: commands.iter().map(|c| self.apply(c)).collect() })
    }

    /// Applies `command` once per request id: a repeat returns the first outcome, a conflicting
    /// repeat is refused, a rejected command is not remembered (a retry is validated again).
    fn apply_deduplicated(
        &mut self,
        request_id: &str,
        fingerprint: u64,
        command: &Command,
    ) -> Result<Outcome, CommandError> {
        let Some(job) = command.job() else {
            return Err(CommandError::InvalidBatch { reason: "a batch cannot be deduplicated".to_owned() });
        };
        if let Some(record) = self.jobs.get(job) {
            match record.requests.lookup(request_id, fingerprint) {
                Lookup::Repeat(first) => return Ok(Outcome::Repeated { first: Box::new(first.clone()) }),
                Lookup::Conflict => {
                    return Err(CommandError::RequestIdReused {
                        job: job.clone(),
                        request_id: request_id.to_owned(),
                    });
                }
                Lookup::New => {}
            }
        }
        let outcome = self.apply(command)?;
        if let Some(record) = self.jobs.get_mut(job).map(Arc::make_mut) {
            record.requests.record(RequestEntry {
                id: request_id.to_owned(),
                fingerprint,
                outcome: outcome.clone(),
            });
        }
        Ok(outcome)
    }
}

/// Commands on a job that exists and is not terminal.
fn apply_to_live_job(job: &mut JobRecord, cmd: &Command) -> Result<Outcome, CommandError> {
    match cmd {
        Command::RegisterJob { .. }
        | Command::RemoveJob { .. }
        | Command::DiscardRetainedCheckpoints { .. }
        | Command::ReleaseRetainedCheckpoint { .. }
        | Command::Deduplicated { .. }
        | Command::RecordRequest { .. }
        | Command::Batch { .. } => {
            unreachable!("handled by StateMachineData::apply")
        }
        Command::UpdateJobConfig { checkpoint, .. } => {
            checkpoint.validate()?;
            job.spec.checkpoint = checkpoint.clone();
            Ok(Outcome::Subsumed { checkpoints: apply_retention(job) })
        }
        Command::SetJobStatus { status, .. } => {
            check_transition(job, status)?;
            job.status = status.clone();
            Ok(Outcome::Done)
        }
        Command::AllocateCheckpointId { .. } => {
            let id = job.next_checkpoint_id;
            job.next_checkpoint_id =
                id.checked_add(1).ok_or_else(|| CommandError::CounterExhausted { job: job.id.clone() })?;
            Ok(Outcome::CheckpointId { id })
        }
        Command::ReserveCheckpointIds { count, .. } => {
            if *count == 0 || *count > MAX_ID_RESERVATION {
                return Err(CommandError::InvalidReservation {
                    job: job.id.clone(),
                    count: *count,
                    max: MAX_ID_RESERVATION,
                });
            }
            let first = job.next_checkpoint_id;
            // `u64::MAX` itself is never handed out (the counter must stay above every id).
            let left = u64::MAX - first;
            if left == 0 {
                return Err(CommandError::CounterExhausted { job: job.id.clone() });
            }
            let count = (*count).min(u32::try_from(left).unwrap_or(u32::MAX));
            job.next_checkpoint_id = first + u64::from(count);
            Ok(Outcome::CheckpointIds { first, count })
        }
        Command::AdvanceCheckpointCounter { next, .. } => {
            if *next < job.next_checkpoint_id {
                return Err(CommandError::CounterRegression {
                    job: job.id.clone(),
                    current: job.next_checkpoint_id,
                    requested: *next,
                });
            }
            job.next_checkpoint_id = *next;
            Ok(Outcome::CounterAdvanced { next: *next })
        }
        Command::AddCompletedCheckpoint { checkpoint, .. } => {
            check_checkpoint(job, checkpoint)?;
            if job.completed.iter().any(|c| c.id == checkpoint.id) {
                return Err(CommandError::DuplicateCheckpoint { job: job.id.clone(), id: checkpoint.id });
            }
            if let Some(latest) = job.latest_completed()
                && checkpoint.id < latest.id
            {
                return Err(CommandError::OutOfOrder {
                    job: job.id.clone(),
                    id: checkpoint.id,
                    latest: latest.id,
                });
            }
            job.completed.push(checkpoint.clone());
            // Saturating: the count comes from a row or a snapshot, not only from this log.
            job.num_completed = job.num_completed.saturating_add(1);
            // The job made durable progress: its next failure is a new incident.
            job.restart.on_checkpoint_completed();
            Ok(Outcome::Subsumed { checkpoints: apply_retention(job) })
        }
        Command::RegisterSavepoint { savepoint, .. } => {
            let cp = &savepoint.checkpoint;
            check_checkpoint(job, cp)?;
            if cp.kind == CheckpointKind::Checkpoint {
                return Err(invalid(
                    job,
                    cp.id,
                    "kind",
                    "a savepoint must be of kind savepoint or sync_savepoint",
                ));
            }
            if savepoint.path.trim().is_empty() {
                return Err(invalid(job, cp.id, "path", "must not be empty"));
            }
            if job.savepoints.iter().any(|s| s.checkpoint.id == cp.id) {
                return Err(CommandError::DuplicateSavepoint { job: job.id.clone(), id: cp.id });
            }
            job.savepoints.push(savepoint.clone());
            job.savepoints.sort_by_key(|s| s.checkpoint.id);
            Ok(Outcome::Done)
        }
        Command::RecordStats { stats, .. } => {
            if !stats.is_object() {
                return Err(CommandError::InvalidStats {
                    job: job.id.clone(),
                    reason: "must be a JSON object".into(),
                });
            }
            job.stats = Some(stats.clone());
            Ok(Outcome::Done)
        }
        Command::RecordFailure { at_ms, cause, strategy, jitter_permille, .. } => {
            strategy.validate()?;
            let jitter = f64::from((*jitter_permille).clamp(-1000, 1000)) / 1000.0;
            let decision = strategy.on_failure(&mut job.restart, *at_ms, jitter, cause);
            job.status = match &decision {
                RestartDecision::Restart { .. } => JobStatus::Restarting,
                RestartDecision::GiveUp { reason } => JobStatus::Failed { reason: reason.clone() },
            };
            Ok(Outcome::RestartDecided { decision })
        }
        Command::BeginAttempt { .. } => {
            job.attempts = job
                .attempts
                .checked_add(1)
                .ok_or_else(|| CommandError::AttemptsExhausted { job: job.id.clone() })?;
            Ok(Outcome::Attempt { attempt: job.attempts })
        }
        Command::DisposeSavepoint { checkpoint_id, .. } => {
            let pos =
                job.savepoints.iter().position(|s| s.checkpoint.id == *checkpoint_id).ok_or_else(|| {
                    CommandError::UnknownSavepoint { job: job.id.clone(), id: *checkpoint_id }
                })?;
            Ok(Outcome::SavepointDisposed { savepoint: job.savepoints.remove(pos) })
        }
    }
}

fn invalid(job: &JobRecord, id: u64, field: &str, reason: &str) -> CommandError {
    CommandError::InvalidCheckpoint {
        job: job.id.clone(),
        id,
        field: field.to_owned(),
        reason: reason.to_owned(),
    }
}

/// A completed checkpoint must carry an ID this job allocated and a usable metadata pointer.
fn check_checkpoint(job: &JobRecord, cp: &CompletedCheckpoint) -> Result<(), CommandError> {
    if cp.id == 0 || cp.id >= job.next_checkpoint_id {
        return Err(CommandError::NotAllocated {
            job: job.id.clone(),
            id: cp.id,
            next: job.next_checkpoint_id,
        });
    }
    if cp.metadata_path.trim().is_empty() {
        return Err(invalid(job, cp.id, "metadata_path", "must not be empty"));
    }
    if cp.completion_time_ms < cp.trigger_time_ms {
        return Err(invalid(job, cp.id, "completion_time_ms", "is before the trigger time"));
    }
    Ok(())
}

/// Keeps the newest `retained` checkpoints and returns the subsumed ones, oldest first.
/// `retained` is validated to be at least 1, so the newest checkpoint is never dropped.
fn apply_retention(job: &mut JobRecord) -> Vec<CompletedCheckpoint> {
    let keep = (job.spec.checkpoint.retained.max(1)) as usize;
    let excess = job.completed.len().saturating_sub(keep);
    job.completed.drain(..excess).collect()
}

fn check_transition(job: &JobRecord, to: &JobStatus) -> Result<(), CommandError> {
    use JobStatus::*;
    let ok = matches!(
        (&job.status, to),
        (Created, Running | Restarting)
            | (Running | Restarting, Running | Restarting)
            | (_, Finished | Canceled | Failed { .. })
    );
    if ok {
        Ok(())
    } else {
        Err(CommandError::IllegalTransition {
            job: job.id.clone(),
            from: job.status.to_string(),
            to: to.to_string(),
        })
    }
}

#[cfg(test)]
mod tests;
