//! Acknowledgements, the completion pipeline (all acks → `_metadata` → Raft commit → notify →
//! retention) and the one failure path every aborted checkpoint goes through.
//!
//! Deletion rules, in one place:
//! - a failed checkpoint loses its own directory and those of its shared files that no
//!   registered (retained or possibly retained) checkpoint and no other in-flight checkpoint
//!   references;
//! - a subsumed checkpoint loses its directory and the shared files the registry releases
//!   (minus those an in-flight checkpoint references);
//! - a stray acknowledgement loses only files it can own (its checkpoint's directory or
//!   `shared/`) that nothing registered or in flight references;
//! - when a commit outcome is unknown nothing is deleted, and the checkpoint is registered as
//!   possibly retained so later discards keep its files too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cairn_protocol::checkpoint::layout::{METADATA_FILE, is_safe_relative};
use cairn_protocol::checkpoint::{MetadataPointer, SubtaskState, TaskCheckpointMetrics};
use cairn_raft::model::{
    CheckpointKind, Command, CommandError, CompletedCheckpoint, Outcome, SavepointRecord,
};

use super::recent::Finished;
use super::{CheckpointCoordinatorCore, Lifecycle};
use crate::checkpoint::actions::{Action, DiscardCause, FinishedOutcome, Now, StrayAck, TriggerSuccess};
use crate::checkpoint::error::TriggerError;
use crate::checkpoint::failure::CheckpointFailureReason;
use crate::checkpoint::pending::{AckOutcome, Origin, PendingCheckpoint, Stage};
use crate::checkpoint::tasks::TaskAttemptId;

/// How much of a failed checkpoint's state may be deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Discard {
    /// Nothing (e.g. the outcome of its commit is unknown).
    Nothing,
    /// Its own directory only: used when leadership is lost and the registry may be stale.
    ExclusiveOnly,
    /// Its directory and its unreferenced shared files.
    Full,
}

impl CheckpointCoordinatorCore {
    pub(super) fn on_ack(
        &mut self,
        now: Now,
        attempt: TaskAttemptId,
        id: u64,
        state: SubtaskState,
        metrics: TaskCheckpointMetrics,
        out: &mut Vec<Action>,
    ) {
        let Some(p) = self.pending.get_mut(&id) else {
            let cause = self.stray_cause(id);
            self.discard_stray_ack(id, attempt, &state, cause, out);
            return;
        };
        if p.is_acknowledged_by(attempt) {
            tracing::debug!(job = %self.config.job, id, %attempt, "duplicate acknowledgement ignored");
            return;
        }
        if p.stage != Stage::Acking || !p.waits_for(attempt) {
            self.discard_stray_ack(id, attempt, &state, StrayAck::UnknownAttempt, out);
            return;
        }
        match p.acknowledge(attempt, state) {
            AckOutcome::Accepted { all_acked } => {
                if let Some(task) = self.tasks.get(attempt) {
                    self.stats.report_ack(id, &task.vertex, task.subtask, now.wall_ms, metrics);
                }
                if all_acked {
                    self.finalize(now, id, out);
                }
            }
            // Checked above; kept for completeness.
            AckOutcome::Duplicate | AckOutcome::UnknownAttempt => {}
            AckOutcome::Invalid(why) => {
                let detail = format!("invalid state from {attempt}: {why}");
                self.abort(now, id, CheckpointFailureReason::CheckpointDeclined, Some(detail), out);
            }
        }
    }

    pub(super) fn on_decline(
        &mut self,
        now: Now,
        attempt: TaskAttemptId,
        id: u64,
        reason: CheckpointFailureReason,
        detail: Option<String>,
        out: &mut Vec<Action>,
    ) {
        let Some(p) = self.pending.get(&id) else {
            match self.recent.get(id) {
                Some(_) => {
                    tracing::debug!(job = %self.config.job, id, %attempt, "late decline of a finished checkpoint")
                }
                None => {
                    tracing::debug!(job = %self.config.job, id, %attempt, "decline of an unknown checkpoint")
                }
            }
            return;
        };
        if !p.waits_for(attempt) && !p.is_acknowledged_by(attempt) {
            tracing::debug!(job = %self.config.job, id, %attempt, "decline from an attempt the checkpoint does not wait for");
            return;
        }
        if p.stage != Stage::Acking {
            return;
        }
        tracing::info!(job = %self.config.job, id, %attempt, %reason, "checkpoint declined");
        self.abort(now, id, reason, detail, out);
    }

    pub(super) fn on_timeout(&mut self, now: Now, id: u64, out: &mut Vec<Action>) {
        let Some(p) = self.pending.get(&id) else { return };
        if now.instant < p.deadline || p.stage == Stage::Committing {
            // Early fire, or the commit is Raft's to decide: its outcome will arrive.
            return;
        }
        tracing::info!(job = %self.config.job, id, "checkpoint expired before completing");
        self.abort(now, id, CheckpointFailureReason::CheckpointExpired, None, out);
    }

    /// All acks are in: build `_metadata` and have it written.
    pub(super) fn finalize(&mut self, now: Now, id: u64, out: &mut Vec<Action>) {
        if self.pending.get(&id).is_some_and(|p| p.kind == CheckpointKind::Checkpoint)
            && self.latest_completed.is_some_and(|latest| latest >= id)
        {
            self.abort(now, id, CheckpointFailureReason::CheckpointSubsumed, None, out);
            return;
        }
        let job = self.config.job.as_str().to_owned();
        let Some(p) = self.pending.get_mut(&id) else { return };
        let metadata = p.build_metadata(&job, now.wall_ms);
        p.completion_time_ms = Some(metadata.completion_time_ms);
        p.stage = Stage::WritingMetadata;
        out.push(Action::WriteMetadata {
            checkpoint_id: id,
            path: p.dir.join(METADATA_FILE),
            metadata: Box::new(metadata),
        });
    }

    pub(super) fn on_metadata_written(
        &mut self,
        now: Now,
        id: u64,
        pointer: MetadataPointer,
        out: &mut Vec<Action>,
    ) {
        match self.pending.get(&id).map(|p| &p.stage) {
            Some(Stage::WritingMetadata) => {}
            Some(_) => return,
            None => {
                // The checkpoint failed while its metadata was being written: remove the file
                // the write may have left behind.
                if let Some(f) = self.recent.get(id)
                    && matches!(f.outcome, FinishedOutcome::Failed(_))
                {
                    out.push(Action::DiscardCheckpoint {
                        checkpoint_id: id,
                        cause: DiscardCause::LateMetadata,
                        dirs: vec![f.dir.clone()],
                        files: Vec::new(),
                    });
                }
                return;
            }
        }
        let job = self.config.job.clone();
        let Some(p) = self.pending.get_mut(&id) else { return };
        let expected = p.dir.join(METADATA_FILE);
        if pointer.path != expected {
            let detail =
                format!("metadata written to {} instead of {}", pointer.path.display(), expected.display());
            self.abort(now, id, CheckpointFailureReason::FinalizeCheckpointFailure, Some(detail), out);
            return;
        }
        let record = CompletedCheckpoint {
            id,
            kind: p.kind,
            trigger_time_ms: p.trigger_time_ms,
            completion_time_ms: p.completion_time_ms.unwrap_or(now.wall_ms).max(p.trigger_time_ms),
            metadata_path: pointer.path.to_string_lossy().into_owned(),
            metadata_size: pointer.size,
            metadata_crc32: pointer.crc32,
            state_size: p.state_size(),
        };
        let command = if p.kind == CheckpointKind::Checkpoint {
            Command::AddCompletedCheckpoint { job, checkpoint: record.clone() }
        } else {
            let path = p.dir.to_string_lossy().into_owned();
            Command::RegisterSavepoint {
                job,
                savepoint: SavepointRecord { checkpoint: record.clone(), path },
            }
        };
        p.completed = Some(record);
        p.stage = Stage::Committing;
        out.push(Action::ProposeCompletion { checkpoint_id: id, command: Box::new(command) });
    }

    pub(super) fn on_metadata_write_failed(
        &mut self,
        now: Now,
        id: u64,
        error: String,
        out: &mut Vec<Action>,
    ) {
        if self.pending.get(&id).is_some_and(|p| p.stage == Stage::WritingMetadata) {
            let detail = format!("writing _metadata failed: {error}");
            self.abort(now, id, CheckpointFailureReason::IoException, Some(detail), out);
        }
    }

    /// Removes the checkpoint if its completion is being committed.
    fn take_committing(&mut self, id: u64) -> Option<PendingCheckpoint> {
        if self.pending.get(&id).is_some_and(|p| p.stage == Stage::Committing) {
            self.pending.remove(&id)
        } else {
            tracing::warn!(job = %self.config.job, id, "commit result for a checkpoint that is not committing");
            None
        }
    }

    /// The completion is durable: only now do tasks hear of it; then retention.
    pub(super) fn on_committed(&mut self, now: Now, id: u64, outcome: Outcome, out: &mut Vec<Action>) {
        let Some(p) = self.take_committing(id) else { return };
        let subsumed = match (p.kind, outcome) {
            (CheckpointKind::Checkpoint, Outcome::Subsumed { checkpoints }) => checkpoints,
            (CheckpointKind::Checkpoint, other) => {
                tracing::warn!(job = %self.config.job, id, ?other, "unexpected outcome of AddCompletedCheckpoint");
                Vec::new()
            }
            _ => Vec::new(),
        };
        if p.kind == CheckpointKind::Checkpoint {
            self.registry.register(id, p.files());
            self.latest_completed = Some(self.latest_completed.map_or(id, |l| l.max(id)));
        }
        self.scheduler.completed(now.instant);
        self.failures.on_success(id);
        let location = p.dir.clone();
        self.stats.report_completed(id, now.wall_ms, location.to_string_lossy().into_owned());
        tracing::info!(job = %self.config.job, id, kind = ?p.kind, size = p.state_size(), "checkpoint completed");
        out.push(Action::NotifyComplete {
            checkpoint_id: id,
            timestamp_ms: p.trigger_time_ms,
            tasks: self.tasks.running_attempts(),
        });
        if let Origin::Manual(request) = p.origin {
            let success = TriggerSuccess { checkpoint_id: id, kind: p.kind, location };
            out.push(Action::AnswerTrigger { request, result: Ok(success) });
        }
        self.recent.remember(Finished {
            id,
            kind: p.kind,
            outcome: FinishedOutcome::Completed,
            base_dir: p.base_dir.clone(),
            dir: p.dir.clone(),
        });
        for s in subsumed.iter().filter(|s| s.id != id) {
            self.discard_subsumed(s, out);
        }
        if p.kind == CheckpointKind::Checkpoint {
            let older = self.pending_where(|q| {
                q.kind == CheckpointKind::Checkpoint && q.id < id && q.stage != Stage::Committing
            });
            for older in older {
                self.abort(now, older, CheckpointFailureReason::CheckpointSubsumed, None, out);
            }
        }
        self.push_stats(out);
        self.slot_freed(now, out);
    }

    pub(super) fn on_commit_rejected(
        &mut self,
        now: Now,
        id: u64,
        error: CommandError,
        out: &mut Vec<Action>,
    ) {
        let Some(p) = self.take_committing(id) else { return };
        let detail = Some(error.to_string());
        match error {
            // Already in the store (an earlier proposal of it was committed): keep everything.
            CommandError::DuplicateCheckpoint { .. } | CommandError::DuplicateSavepoint { .. } => {
                self.outcome_unknown(now, p, error.to_string(), out)
            }
            // A newer checkpoint was committed first: this one is subsumed. The rejection
            // changed nothing, so its state can go.
            CommandError::OutOfOrder { .. } => {
                self.fail(now, p, CheckpointFailureReason::CheckpointSubsumed, detail, Discard::Full, out)
            }
            _ => self.fail(
                now,
                p,
                CheckpointFailureReason::FinalizeCheckpointFailure,
                detail,
                Discard::Full,
                out,
            ),
        }
    }

    pub(super) fn on_commit_outcome_unknown(
        &mut self,
        now: Now,
        id: u64,
        detail: String,
        out: &mut Vec<Action>,
    ) {
        if let Some(p) = self.take_committing(id) {
            self.outcome_unknown(now, p, detail, out);
        }
    }

    /// The checkpoint may be in the store: delete nothing, tell no task it completed or was
    /// aborted (a sink must not roll back what may be committed), and protect its files.
    pub(super) fn outcome_unknown(
        &mut self,
        now: Now,
        p: PendingCheckpoint,
        detail: String,
        out: &mut Vec<Action>,
    ) {
        tracing::warn!(job = %self.config.job, id = p.id, %detail, "commit outcome unknown; deleting nothing");
        if p.kind == CheckpointKind::Checkpoint {
            self.registry.register(p.id, p.files());
        }
        self.recent.remember(Finished {
            id: p.id,
            kind: p.kind,
            outcome: FinishedOutcome::Unknown,
            base_dir: p.base_dir.clone(),
            dir: p.dir.clone(),
        });
        self.stats.report_failed(
            p.id,
            now.wall_ms,
            CheckpointFailureReason::CommitOutcomeUnknown,
            Some(detail),
        );
        if let Origin::Manual(request) = p.origin {
            out.push(Action::AnswerTrigger {
                request,
                result: Err(TriggerError::OutcomeUnknown { checkpoint_id: p.id }),
            });
        }
        self.push_stats(out);
        self.slot_freed(now, out);
    }

    /// Removes pending checkpoint `id` and fails it; a checkpoint whose commit is in flight
    /// keeps its state (its outcome is Raft's).
    pub(super) fn abort(
        &mut self,
        now: Now,
        id: u64,
        reason: CheckpointFailureReason,
        detail: Option<String>,
        out: &mut Vec<Action>,
    ) {
        if let Some(p) = self.pending.remove(&id) {
            let discard = if p.stage == Stage::Committing { Discard::Nothing } else { Discard::Full };
            self.fail(now, p, reason, detail, discard, out);
        }
    }

    /// The one failure path: notify tasks, discard what is safe, remember the id, record
    /// statistics, count the failure, answer the request, let the queued request go.
    pub(super) fn fail(
        &mut self,
        now: Now,
        p: PendingCheckpoint,
        reason: CheckpointFailureReason,
        detail: Option<String>,
        discard: Discard,
        out: &mut Vec<Action>,
    ) {
        let id = p.id;
        tracing::info!(job = %self.config.job, id, %reason, detail = detail.as_deref().unwrap_or(""), "checkpoint failed");
        if p.tasks_triggered {
            out.push(Action::NotifyAborted {
                checkpoint_id: id,
                reason,
                tasks: self.tasks.running_attempts(),
            });
        }
        let cause = DiscardCause::Aborted(reason);
        match discard {
            Discard::Nothing => {}
            Discard::ExclusiveOnly => out.push(Action::DiscardCheckpoint {
                checkpoint_id: id,
                cause,
                dirs: vec![p.dir.clone()],
                files: Vec::new(),
            }),
            Discard::Full => {
                let files = self.unreferenced(&p.base_dir, p.shared_files());
                out.push(Action::DiscardCheckpoint {
                    checkpoint_id: id,
                    cause,
                    dirs: vec![p.dir.clone()],
                    files,
                });
            }
        }
        self.recent.remember(Finished {
            id,
            kind: p.kind,
            outcome: FinishedOutcome::Failed(reason),
            base_dir: p.base_dir.clone(),
            dir: p.dir.clone(),
        });
        self.stats.report_failed(id, now.wall_ms, reason, detail.clone());
        if self.lifecycle == Lifecycle::Running
            && let Some(decision) = self.failures.on_failure(Some(id), p.kind, reason)
        {
            tracing::warn!(job = %self.config.job, message = %decision.message, "failing the job over");
            out.push(Action::FailOver { reason: decision.reason, message: decision.message });
        }
        if let Origin::Manual(request) = p.origin {
            out.push(Action::AnswerTrigger {
                request,
                result: Err(TriggerError::Failed { checkpoint_id: id, reason, detail }),
            });
        }
        self.push_stats(out);
        if p.kind == CheckpointKind::SyncSavepoint {
            self.resume_after_sync_savepoint(now, out);
        }
        self.slot_freed(now, out);
    }

    /// Shared files (relative to `base`) that nothing registered or in flight references.
    fn unreferenced(&self, base: &Path, shared: BTreeSet<String>) -> Vec<PathBuf> {
        shared
            .into_iter()
            .filter(|path| !self.registry.is_referenced(path) && !self.in_flight_references(path))
            .map(|path| base.join(path))
            .collect()
    }

    fn in_flight_references(&self, path: &str) -> bool {
        self.pending.values().any(|p| !p.is_savepoint() && p.references(path))
    }

    /// Retention removed `s` from the store: delete its directory and released shared files.
    pub(super) fn discard_subsumed(&mut self, s: &CompletedCheckpoint, out: &mut Vec<Action>) {
        let released = self.registry.release(s.id);
        // The checkpoint's directory is where its metadata is, if that is a `chk-<id>`
        // directory as it must be; otherwise the layout's idea of it.
        let from_record = Path::new(&s.metadata_path)
            .parent()
            .filter(|d| d.file_name().is_some_and(|n| n.to_string_lossy() == format!("chk-{}", s.id)));
        let dir = from_record.map(Path::to_path_buf).unwrap_or_else(|| self.layout.chk_dir(s.id));
        let base = dir.parent().map(Path::to_path_buf).unwrap_or_else(|| self.layout.job_dir().to_owned());
        let files = released
            .into_iter()
            .filter(|path| !self.in_flight_references(path))
            .map(|path| base.join(path))
            .collect();
        out.push(Action::DiscardCheckpoint {
            checkpoint_id: s.id,
            cause: DiscardCause::Subsumed,
            dirs: vec![dir],
            files,
        });
    }

    fn stray_cause(&self, id: u64) -> StrayAck {
        if self.pending.contains_key(&id) {
            StrayAck::UnknownAttempt
        } else if let Some(f) = self.recent.get(id) {
            StrayAck::Late { outcome: f.outcome }
        } else {
            StrayAck::UnknownCheckpoint
        }
    }

    /// Discards what an acknowledgement that is not kept may own.
    fn discard_stray_ack(
        &self,
        id: u64,
        attempt: TaskAttemptId,
        state: &SubtaskState,
        cause: StrayAck,
        out: &mut Vec<Action>,
    ) {
        tracing::warn!(job = %self.config.job, id, %attempt, ?cause, "discarding the state of an acknowledgement that is not kept");
        let files = self.stray_files(id, state);
        out.push(Action::DiscardAckedState { checkpoint_id: id, attempt, cause, files });
    }

    fn stray_files(&self, id: u64, state: &SubtaskState) -> Vec<PathBuf> {
        let (base, savepoint) = if let Some(p) = self.pending.get(&id) {
            (p.base_dir.clone(), p.is_savepoint())
        } else if let Some(f) = self.recent.get(id) {
            let completed_savepoint =
                f.kind != CheckpointKind::Checkpoint && f.outcome == FinishedOutcome::Completed;
            if completed_savepoint || f.outcome == FinishedOutcome::Unknown {
                // A savepoint's files are not in the registry; a possibly committed checkpoint's
                // are, but nothing about it may be deleted on a guess.
                return Vec::new();
            }
            (f.base_dir.clone(), f.kind != CheckpointKind::Checkpoint)
        } else {
            // Unknown id: assume a checkpoint, and touch only files such a checkpoint owns.
            (self.layout.job_dir().to_owned(), false)
        };
        let own_dir = format!("chk-{id}/");
        let mut files = BTreeSet::new();
        for f in state.files() {
            let path = f.path.as_str();
            if !is_safe_relative(path) {
                continue;
            }
            let protected = if savepoint {
                f.is_shared() || self.pending.get(&id).is_some_and(|p| p.references(path))
            } else {
                !(f.is_shared() || path.starts_with(&own_dir))
                    || self.registry.is_referenced(path)
                    || self.in_flight_references(path)
            };
            if !protected {
                files.insert(base.join(path));
            }
        }
        files.into_iter().collect()
    }
}
