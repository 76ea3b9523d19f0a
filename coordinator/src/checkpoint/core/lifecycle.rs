//! Task status changes, redeployment, stopping the scheduler, shutdown and suspension.
//!
//! - A task that fails fails the pending checkpoints it has not acknowledged; a task that stops
//!   running aborts them too (they can no longer complete). A task that finishes (after its
//!   final checkpoint) counts as having acknowledged them with empty state.
//! - Stopping the scheduler (the job is restarting) and redeploying abort every checkpoint that
//!   has not reached its commit; a commit in flight is left to Raft. The failure count stays.
//! - Shutdown fails every pending checkpoint with the shutdown reason; with a terminal job
//!   status, the job's checkpoints are discarded as the retention policy says.
//! - Suspension (leadership lost) aborts what is in memory and deletes nothing replicated: no
//!   completed checkpoint, no shared file, nothing whose commit may have happened.

use std::path::PathBuf;

use cairn_raft::model::JobStatus;

use super::completion::Discard;
use super::{CheckpointCoordinatorCore, Lifecycle};
use crate::checkpoint::actions::{Action, Now};
use crate::checkpoint::config::discards_on;
use crate::checkpoint::failure::CheckpointFailureReason;
use crate::checkpoint::pending::Stage;
use crate::checkpoint::tasks::{TaskAttemptId, TaskSet, TaskStatus};

impl CheckpointCoordinatorCore {
    pub(super) fn on_task_status(
        &mut self,
        now: Now,
        attempt: TaskAttemptId,
        status: TaskStatus,
        out: &mut Vec<Action>,
    ) {
        if !self.tasks.set_status(attempt, status) {
            tracing::debug!(job = %self.config.job, %attempt, ?status, "status of an attempt not in the task set");
            return;
        }
        let reason = match status {
            TaskStatus::Running => return,
            TaskStatus::Finished => return self.on_task_finished(now, attempt, out),
            TaskStatus::Failed => CheckpointFailureReason::TaskFailure,
            TaskStatus::NotRunning => CheckpointFailureReason::NotAllRequiredTasksRunning,
        };
        let task = self.tasks.get(attempt).map(|t| t.key()).unwrap_or_default();
        for id in self.pending_where(|p| p.stage == Stage::Acking && p.waits_for(attempt)) {
            let detail = format!("task {task} ({attempt}) is {status:?} and has not acknowledged");
            self.abort(now, id, reason, Some(detail), out);
        }
    }

    fn on_task_finished(&mut self, now: Now, attempt: TaskAttemptId, out: &mut Vec<Action>) {
        for id in self.pending_where(|p| p.stage == Stage::Acking && p.waits_for(attempt)) {
            let all_in = self.pending.get_mut(&id).and_then(|p| p.task_finished(attempt));
            if all_in == Some(true) {
                self.finalize(now, id, out);
            }
        }
    }

    pub(super) fn on_tasks_redeployed(&mut self, now: Now, tasks: TaskSet, out: &mut Vec<Action>) {
        for id in self.pending_where(|p| p.stage != Stage::Committing) {
            self.abort(now, id, CheckpointFailureReason::JobFailoverRegion, None, out);
        }
        self.tasks = tasks;
    }

    pub(super) fn stop_scheduler(&mut self, now: Now, out: &mut Vec<Action>) {
        self.paused_for_sync_savepoint = false;
        if let Some(queued) = self.scheduler.stop(out) {
            self.reject(now, queued, CheckpointFailureReason::CheckpointCoordinatorSuspend, out);
        }
        for id in self.pending_where(|p| p.stage != Stage::Committing) {
            self.abort(now, id, CheckpointFailureReason::CheckpointCoordinatorSuspend, None, out);
        }
        // The consecutive-failure count survives a restart: only a completed checkpoint (or
        // crossing the tolerance, which fails the job over) starts it again.
    }

    /// Refuses the queued request and the requests waiting for ids.
    fn drain_requests(&mut self, now: Now, reason: CheckpointFailureReason, out: &mut Vec<Action>) {
        if let Some(queued) = self.scheduler.stop(out) {
            self.reject(now, queued, reason, out);
        }
        for request in std::mem::take(&mut self.allocations).into_values() {
            self.reject(now, request, reason, out);
        }
    }

    pub(super) fn shutdown(&mut self, now: Now, job_status: JobStatus, out: &mut Vec<Action>) {
        self.lifecycle = Lifecycle::ShutDown;
        let reason = CheckpointFailureReason::CheckpointCoordinatorShutdown;
        self.drain_requests(now, reason, out);
        for p in std::mem::take(&mut self.pending).into_values() {
            if p.stage == Stage::Committing {
                self.outcome_unknown(
                    now,
                    p,
                    "the coordinator shut down while the commit was in flight".into(),
                    out,
                );
            } else {
                self.fail(now, p, reason, None, Discard::Full, out);
            }
        }
        self.hooks.close();
        if discards_on(self.config.checkpoint.externalized_retention, &job_status) {
            // The job is terminal in the replicated store, so no further completion can be
            // committed: every checkpoint it has, or may have, goes.
            let checkpoints = self.registry.registered_ids();
            let mut dirs: Vec<PathBuf> = checkpoints.iter().map(|id| self.layout.chk_dir(*id)).collect();
            dirs.push(self.layout.shared_dir());
            tracing::info!(job = %self.config.job, status = %job_status, ?checkpoints, "discarding the job's checkpoints");
            out.push(Action::DiscardJobCheckpoints { checkpoints, dirs });
        }
    }

    pub(super) fn suspend(&mut self, now: Now, out: &mut Vec<Action>) {
        self.lifecycle = Lifecycle::Suspended;
        let reason = CheckpointFailureReason::CheckpointCoordinatorSuspend;
        self.drain_requests(now, reason, out);
        for p in std::mem::take(&mut self.pending).into_values() {
            if p.stage == Stage::Committing {
                self.outcome_unknown(now, p, "leadership lost while the commit was in flight".into(), out);
            } else {
                // Never proposed, so never in the store: its own directory may go. Shared files
                // stay; the registry of a deposed leader is no authority on them.
                self.fail(now, p, reason, None, Discard::ExclusiveOnly, out);
            }
        }
        self.hooks.close();
    }
}
