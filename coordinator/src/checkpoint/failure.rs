//! Why a checkpoint failed, and which failures count towards failing the job.
//!
//! [`CheckpointFailureReason`] mirrors Flink's reasons (plus one that only a Raft-backed
//! coordinator needs: [`CheckpointFailureReason::CommitOutcomeUnknown`]). [`FailureManager`]
//! owns the count of consecutive counted failures and decides when the job must fail; it is the
//! only place that knows which reasons count.

use std::collections::BTreeSet;
use std::fmt;

use cairn_raft::model::CheckpointKind;
use serde::{Deserialize, Serialize};

/// Why a checkpoint (or a trigger request) did not complete. Names follow Flink's
/// `CheckpointFailureReason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointFailureReason {
    // Pre-flight: the trigger was refused before any task heard of a checkpoint.
    PeriodicSchedulerShutdown,
    /// A non-forced request arrived while another one was already queued.
    AlreadyQueued,
    TooManyConcurrentCheckpoints,
    TooManyCheckpointRequests,
    MinimumTimeBetweenCheckpoints,
    NotAllRequiredTasksRunning,
    IoException,
    BlockingOutputExist,
    Exception,
    // Failures of a checkpoint that was triggered.
    CheckpointAsyncException,
    ChannelStateSharedStreamException,
    CheckpointExpired,
    CheckpointSubsumed,
    CheckpointDeclined,
    CheckpointDeclinedTaskNotReady,
    CheckpointDeclinedTaskClosing,
    CheckpointDeclinedTaskNotCheckpointing,
    CheckpointDeclinedSubsumed,
    CheckpointDeclinedOnCancellationBarrier,
    CheckpointDeclinedAlignmentLimitExceeded,
    CheckpointDeclinedInputEndOfStream,
    CheckpointCoordinatorShutdown,
    CheckpointCoordinatorSuspend,
    JobFailure,
    JobFailoverRegion,
    TaskFailure,
    TaskCheckpointFailure,
    UnknownTaskCheckpointNotificationFailure,
    FinalizeCheckpointFailure,
    TriggerCheckpointFailure,
    /// Cairn only: the Raft proposal of the completed checkpoint may or may not have been
    /// committed (leadership was lost while it was in flight). Nothing may be deleted.
    CommitOutcomeUnknown,
}

impl CheckpointFailureReason {
    /// Every reason, for exhaustive tests and documentation.
    pub const ALL: [Self; 31] = [
        Self::PeriodicSchedulerShutdown,
        Self::AlreadyQueued,
        Self::TooManyConcurrentCheckpoints,
        Self::TooManyCheckpointRequests,
        Self::MinimumTimeBetweenCheckpoints,
        Self::NotAllRequiredTasksRunning,
        Self::IoException,
        Self::BlockingOutputExist,
        Self::Exception,
        Self::CheckpointAsyncException,
        Self::ChannelStateSharedStreamException,
        Self::CheckpointExpired,
        Self::CheckpointSubsumed,
        Self::CheckpointDeclined,
        Self::CheckpointDeclinedTaskNotReady,
        Self::CheckpointDeclinedTaskClosing,
        Self::CheckpointDeclinedTaskNotCheckpointing,
        Self::CheckpointDeclinedSubsumed,
        Self::CheckpointDeclinedOnCancellationBarrier,
        Self::CheckpointDeclinedAlignmentLimitExceeded,
        Self::CheckpointDeclinedInputEndOfStream,
        Self::CheckpointCoordinatorShutdown,
        Self::CheckpointCoordinatorSuspend,
        Self::JobFailure,
        Self::JobFailoverRegion,
        Self::TaskFailure,
        Self::TaskCheckpointFailure,
        Self::UnknownTaskCheckpointNotificationFailure,
        Self::FinalizeCheckpointFailure,
        Self::TriggerCheckpointFailure,
        Self::CommitOutcomeUnknown,
    ];

    /// A human-readable sentence, for logs, statistics and error replies.
    pub fn description(self) -> &'static str {
        use CheckpointFailureReason::*;
        match self {
            PeriodicSchedulerShutdown => "Periodic checkpoint scheduler is shut down.",
            AlreadyQueued => "Another checkpoint request has already been queued.",
            TooManyConcurrentCheckpoints => "The maximum number of concurrent checkpoints is exceeded.",
            TooManyCheckpointRequests => "The maximum number of queued checkpoint requests exceeded.",
            MinimumTimeBetweenCheckpoints => {
                "The minimum time between checkpoints is still pending. Checkpoint will be triggered after the minimum time."
            }
            NotAllRequiredTasksRunning => "Not all required tasks are currently running.",
            IoException => {
                "An exception occurred while triggering or finalizing the checkpoint. IO-problem detected."
            }
            BlockingOutputExist => "Blocking output edge exists in running tasks.",
            Exception => "An exception occurred while triggering the checkpoint.",
            CheckpointAsyncException => "Asynchronous task checkpoint failed.",
            ChannelStateSharedStreamException => {
                "The checkpoint was aborted due to exception of other subtasks sharing the channel state file."
            }
            CheckpointExpired => "Checkpoint expired before completing.",
            CheckpointSubsumed => "Checkpoint has been subsumed.",
            CheckpointDeclined => "Checkpoint was declined.",
            CheckpointDeclinedTaskNotReady => "Checkpoint was declined (tasks not ready).",
            CheckpointDeclinedTaskClosing => "Checkpoint was declined (task is closing).",
            CheckpointDeclinedTaskNotCheckpointing => "Task does not support checkpointing.",
            CheckpointDeclinedSubsumed => {
                "Checkpoint was canceled because a barrier from newer checkpoint was received."
            }
            CheckpointDeclinedOnCancellationBarrier => "Task received cancellation from one of its inputs.",
            CheckpointDeclinedAlignmentLimitExceeded => {
                "The checkpoint alignment phase needed to buffer more than the configured maximum bytes."
            }
            CheckpointDeclinedInputEndOfStream => {
                "Checkpoint was declined because one input stream is finished."
            }
            CheckpointCoordinatorShutdown => "Checkpoint coordinator is shut down.",
            CheckpointCoordinatorSuspend => "Checkpoint coordinator is suspending.",
            JobFailure => "The job has failed.",
            JobFailoverRegion => "The job (or a failover region of it) is restarting.",
            TaskFailure => "Task has failed.",
            TaskCheckpointFailure => "Task local checkpoint failure.",
            UnknownTaskCheckpointNotificationFailure => "Unknown task for the checkpoint to notify.",
            FinalizeCheckpointFailure => "Failure to finalize checkpoint.",
            TriggerCheckpointFailure => "Trigger checkpoint failure.",
            CommitOutcomeUnknown => {
                "Leadership was lost while the completed checkpoint was being committed; it may or may not be in the store."
            }
        }
    }

    /// Whether the reason refuses a trigger before any checkpoint started (Flink's `preFlight`).
    pub fn is_pre_flight(self) -> bool {
        use CheckpointFailureReason::*;
        matches!(
            self,
            PeriodicSchedulerShutdown
                | AlreadyQueued
                | TooManyConcurrentCheckpoints
                | TooManyCheckpointRequests
                | MinimumTimeBetweenCheckpoints
                | NotAllRequiredTasksRunning
                | IoException
                | BlockingOutputExist
                | Exception
        )
    }

    /// Whether a failure for this reason counts towards the tolerable consecutive failures, as
    /// Flink's `CheckpointFailureManager` counts: declines, expiry, asynchronous failures and
    /// finalization / IO failures count; pre-flight refusals, subsumption, shutdown,
    /// suspension, failover and task failures do not (they say nothing about the health of
    /// checkpointing itself).
    pub fn counts_as_failure(self) -> bool {
        use CheckpointFailureReason::*;
        matches!(
            self,
            IoException
                | CheckpointAsyncException
                | CheckpointDeclined
                | CheckpointExpired
                | FinalizeCheckpointFailure
        )
    }
}

impl fmt::Display for CheckpointFailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// The decision to fail the job, with what tipped it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFailureDecision {
    pub reason: CheckpointFailureReason,
    pub message: String,
}

/// Counts consecutive counted checkpoint failures and fails the job over when they exceed the
/// configured tolerance. Success resets the count; restarts do not.
#[derive(Debug, Clone)]
pub struct FailureManager {
    /// Consecutive counted failures tolerated (`CheckpointConfig::tolerable_failures`).
    tolerable: u32,
    /// Counted failures since the last success.
    consecutive: u32,
    /// Checkpoint ids already counted since the last success, so that one checkpoint failing
    /// through two paths (e.g. declined by two tasks) counts once. Cleared on success.
    counted: BTreeSet<u64>,
    /// Highest checkpoint id that succeeded: failures of older checkpoints no longer matter.
    last_succeeded: Option<u64>,
}

impl FailureManager {
    pub fn new(tolerable: u32) -> Self {
        Self { tolerable, consecutive: 0, counted: BTreeSet::new(), last_succeeded: None }
    }

    /// Changes the tolerated count (a configuration update); the consecutive count stays.
    pub fn set_tolerable(&mut self, tolerable: u32) {
        self.tolerable = tolerable;
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }

    /// A manager continuing a count a previous leader recorded.
    pub fn restore(tolerable: u32, consecutive: u32) -> Self {
        Self { consecutive, ..Self::new(tolerable) }
    }

    /// Records a failure. Returns a decision to fail the job over (the restart strategy then
    /// decides) when the count exceeds the tolerance; the count is then reset, as Flink's
    /// `CheckpointFailureManager` clears it, so the decision is made once per crossing.
    /// Savepoint failures never count (a failed savepoint is the user's request failing, not
    /// the job's fault tolerance).
    pub fn on_failure(
        &mut self,
        checkpoint_id: Option<u64>,
        kind: CheckpointKind,
        reason: CheckpointFailureReason,
    ) -> Option<JobFailureDecision> {
        if kind != CheckpointKind::Checkpoint || !reason.counts_as_failure() {
            return None;
        }
        if let Some(id) = checkpoint_id {
            if self.last_succeeded.is_some_and(|last| id < last) {
                return None;
            }
            if !self.counted.insert(id) {
                return None;
            }
        }
        self.consecutive += 1;
        if self.consecutive > self.tolerable {
            let message = format!(
                "exceeded checkpoint tolerable failure threshold ({} consecutive failures, {} tolerated); last: {}",
                self.consecutive,
                self.tolerable,
                reason.description()
            );
            self.reset();
            return Some(JobFailureDecision { reason, message });
        }
        None
    }

    /// Records a completed checkpoint or savepoint: the count starts over.
    pub fn on_success(&mut self, checkpoint_id: u64) {
        if self.last_succeeded.is_none_or(|last| checkpoint_id > last) {
            self.last_succeeded = Some(checkpoint_id);
            self.reset();
        }
    }

    /// Forgets the count.
    fn reset(&mut self) {
        self.consecutive = 0;
        self.counted.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CheckpointFailureReason as R;

    #[test]
    fn every_reason_has_a_description() {
        let mut seen = std::collections::HashSet::new();
        for r in R::ALL {
            assert!(!r.description().is_empty());
            assert!(seen.insert(r.description()), "duplicate description for {r:?}");
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<R>(&json).unwrap(), r);
        }
    }

    #[test]
    fn pre_flight_reasons_do_not_count() {
        for r in R::ALL.into_iter().filter(|r| r.is_pre_flight()) {
            assert!(!r.counts_as_failure() || r == R::IoException, "{r:?}");
        }
        for r in [
            R::TooManyConcurrentCheckpoints,
            R::MinimumTimeBetweenCheckpoints,
            R::NotAllRequiredTasksRunning,
            R::CheckpointCoordinatorShutdown,
            R::CheckpointCoordinatorSuspend,
            R::JobFailoverRegion,
            R::CheckpointSubsumed,
            R::TaskFailure,
            R::CommitOutcomeUnknown,
        ] {
            let mut fm = FailureManager::new(0);
            assert_eq!(fm.on_failure(Some(1), CheckpointKind::Checkpoint, r), None, "{r:?}");
        }
        for r in [
            R::CheckpointDeclined,
            R::CheckpointExpired,
            R::CheckpointAsyncException,
            R::FinalizeCheckpointFailure,
            R::IoException,
        ] {
            assert!(r.counts_as_failure(), "{r:?}");
        }
    }

    #[test]
    fn tolerable_failures_exceeded_fails_job() {
        let mut fm = FailureManager::new(2);
        assert!(fm.on_failure(Some(1), CheckpointKind::Checkpoint, R::CheckpointExpired).is_none());
        assert!(fm.on_failure(Some(2), CheckpointKind::Checkpoint, R::CheckpointDeclined).is_none());
        let d = fm.on_failure(Some(3), CheckpointKind::Checkpoint, R::CheckpointDeclined).unwrap();
        assert_eq!(d.reason, R::CheckpointDeclined);
        assert!(d.message.contains("tolerable"), "{}", d.message);
        assert_eq!(fm.consecutive_failures(), 0, "the decision resets the count");
    }

    #[test]
    fn success_resets_failure_count() {
        let mut fm = FailureManager::new(1);
        assert!(fm.on_failure(Some(1), CheckpointKind::Checkpoint, R::CheckpointExpired).is_none());
        fm.on_success(2);
        assert_eq!(fm.consecutive_failures(), 0);
        assert!(fm.on_failure(Some(3), CheckpointKind::Checkpoint, R::CheckpointExpired).is_none());
        assert!(fm.on_failure(Some(4), CheckpointKind::Checkpoint, R::CheckpointExpired).is_some());
    }

    #[test]
    fn one_checkpoint_counts_once_and_older_than_success_not_at_all() {
        let mut fm = FailureManager::new(1);
        fm.on_success(5);
        assert!(fm.on_failure(Some(4), CheckpointKind::Checkpoint, R::CheckpointExpired).is_none());
        assert_eq!(fm.consecutive_failures(), 0);
        assert!(fm.on_failure(Some(6), CheckpointKind::Checkpoint, R::CheckpointDeclined).is_none());
        assert!(fm.on_failure(Some(6), CheckpointKind::Checkpoint, R::CheckpointDeclined).is_none());
        assert_eq!(fm.consecutive_failures(), 1);
    }

    #[test]
    fn savepoint_failures_do_not_count() {
        let mut fm = FailureManager::new(0);
        for kind in [CheckpointKind::Savepoint, CheckpointKind::SyncSavepoint] {
            assert!(fm.on_failure(Some(1), kind, R::CheckpointExpired).is_none());
        }
        assert_eq!(fm.consecutive_failures(), 0);
    }
}
