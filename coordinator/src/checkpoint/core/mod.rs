//! [`CheckpointCoordinatorCore`]: one job's checkpoint coordinator as a pure state machine.
//!
//! [`CheckpointCoordinatorCore::handle`] takes an [`Event`] and the current time and returns the
//! [`Action`]s the driver must carry out, in order. Nothing in here does I/O, reads a clock or
//! draws unseeded randomness, so every rule is tested by asserting on actions.
//!
//! Data flow of one checkpoint:
//! trigger (timer or request) → pre-checks ([`trigger`](super::trigger)) →
//! `AllocateCheckpointId` (one Raft commit) → pending checkpoint, master hooks snapshotted,
//! timeout armed, trigger sent to the sources → acks ([`pending`](super::pending)) → all in:
//! `WriteMetadata` → written: `ProposeCompletion` → committed: `NotifyComplete` to every task,
//! retention applied to the [`registry`](super::registry), subsumed state discarded.
//! Every failure on the way ends in one place ([`completion`]) that notifies, discards what is
//! safe to discard, counts the failure and answers the request.
//!
//! The code is split by concern: this file holds the state, the constructor, the dispatch and
//! the trigger path; [`completion`] the acknowledgement and completion pipeline and the failure
//! path; [`lifecycle`] task status, stop, shutdown and suspension.

mod completion;
mod lifecycle;
mod recent;

use std::collections::{BTreeMap, BTreeSet};

use cairn_protocol::checkpoint::{CheckpointLayout, CheckpointMetadata};
use cairn_raft::model::{CheckpointKind, JobRecord};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::actions::{Action, AllocationToken, CheckpointOptions, Event, Now, TriggerKind};
use super::config::CoreConfig;
use super::error::{Error, TriggerError};
use super::failure::{CheckpointFailureReason, FailureManager};
use super::hooks::{MasterHook, MasterHooks};
use super::pending::{Origin, PendingCheckpoint, PendingInit};
use super::registry::SharedStateRegistry;
use super::stats::{CheckpointCounts, CheckpointStatsTracker, JobCheckpointStats, StatsSummary};
use super::tasks::TaskSet;
use super::trigger::{Request, Scheduler, SnapshotProps};
use recent::RecentCheckpoints;

/// Whether the core still works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifecycle {
    Running,
    /// Leadership lost: everything in memory was aborted; the instance is done.
    Suspended,
    /// Shut down for good.
    ShutDown,
}

/// What a new leader knows about a job when it builds its core.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// Rebuilt from the retained checkpoints' `_metadata` ([`SharedStateRegistry::rebuild`]).
    pub registry: SharedStateRegistry,
    /// The job's replicated `next_checkpoint_id`: allocated ids must not be below it.
    pub next_checkpoint_id: u64,
    /// Persisted statistics summary, if the driver kept one.
    pub stats: Option<StatsSummary>,
    /// The replicated `JobRecord::num_completed`.
    pub num_completed: u64,
}

impl Recovered {
    /// Everything from the replicated job record, plus the `_metadata` of its retained
    /// checkpoints that could be read (the others are registered opaque: nothing shared is
    /// deleted while they are retained).
    pub fn from_job(
        job: &JobRecord,
        metadata: &BTreeMap<u64, CheckpointMetadata>,
        stats: Option<StatsSummary>,
    ) -> Self {
        Self {
            registry: SharedStateRegistry::rebuild(job.completed.iter().map(|c| (c.id, metadata.get(&c.id)))),
            next_checkpoint_id: job.next_checkpoint_id,
            stats,
            num_completed: job.num_completed,
        }
    }
}

/// One job's checkpoint coordinator core. See the module docs.
#[derive(Debug)]
pub struct CheckpointCoordinatorCore {
    /// The job's configuration (validated in [`Self::new`]).
    config: CoreConfig,
    /// Paths of the job's checkpoint storage.
    layout: CheckpointLayout,
    /// The subtasks and their attempts: whom to trigger, wait for and notify.
    tasks: TaskSet,
    lifecycle: Lifecycle,
    /// Trigger timer, queued request and min-pause clock.
    scheduler: Scheduler,
    /// Requests waiting for their checkpoint id from Raft. They count as in flight.
    allocations: BTreeMap<AllocationToken, Request>,
    /// Source of allocation tokens.
    next_allocation: u64,
    /// Checkpoints in flight by id, from trigger to the commit outcome.
    pending: BTreeMap<u64, PendingCheckpoint>,
    /// Recently finished ids, to tell late messages from unknown ones.
    recent: RecentCheckpoints,
    /// Files referenced by retained (and possibly retained) checkpoints.
    registry: SharedStateRegistry,
    /// Consecutive failure count and the decision to fail the job.
    failures: FailureManager,
    stats: CheckpointStatsTracker,
    hooks: MasterHooks,
    /// Highest checkpoint id seen; a newly allocated id must exceed it (ids never repeat).
    highest_id: u64,
    /// Highest committed checkpoint (not savepoint) id; older pending checkpoints are subsumed.
    latest_completed: Option<u64>,
    /// Periodic scheduling was paused for a stop-with-savepoint; resumed if it fails.
    paused_for_sync_savepoint: bool,
    /// Random suffixes of savepoint directories (seeded from the configuration: tests are
    /// deterministic, leaders of different terms differ).
    names: StdRng,
}

impl CheckpointCoordinatorCore {
    /// A core for a job whose tasks are `tasks`, with what a (new) leader recovered.
    pub fn new(config: CoreConfig, tasks: TaskSet, recovered: Recovered) -> Result<Self, Error> {
        config.validate()?;
        let cp = &config.checkpoint;
        let scheduler = Scheduler::new(cp.effective_interval(), cp.min_pause, config.seed);
        let latest_completed = recovered.registry.registered_ids().last().copied();
        Ok(Self {
            layout: CheckpointLayout::new(&config.storage_root, config.job.as_str()),
            tasks,
            lifecycle: Lifecycle::Running,
            scheduler,
            allocations: BTreeMap::new(),
            next_allocation: 0,
            pending: BTreeMap::new(),
            recent: RecentCheckpoints::new(config.recent_ids),
            failures: FailureManager::restore(
                cp.tolerable_failures,
                recovered.stats.as_ref().map_or(0, |s| s.consecutive_failures),
            ),
            stats: CheckpointStatsTracker::restore(
                config.stats_history,
                recovered.stats,
                recovered.num_completed,
            ),
            hooks: MasterHooks::new(),
            highest_id: recovered.next_checkpoint_id.saturating_sub(1).max(latest_completed.unwrap_or(0)),
            latest_completed,
            registry: recovered.registry,
            paused_for_sync_savepoint: false,
            names: StdRng::seed_from_u64(config.seed ^ 0x5a5e_d1e5_5a5e_d1e5),
            config,
        })
    }

    /// Registers a master hook (before the first trigger).
    pub fn add_master_hook(&mut self, hook: Box<dyn MasterHook>) -> Result<(), Error> {
        self.hooks.add(hook)
    }

    /// The hooks, e.g. to restore them ([`MasterHooks::restore`]).
    pub fn hooks_mut(&mut self) -> &mut MasterHooks {
        &mut self.hooks
    }

    pub fn stats(&self) -> &JobCheckpointStats {
        self.stats.stats()
    }

    /// What decides whether the persisted summary is out of date: the counts and the
    /// consecutive failures (cheap: nothing is copied).
    pub fn stats_key(&self) -> (CheckpointCounts, u32) {
        (self.stats.stats().counts, self.failures.consecutive_failures())
    }

    pub fn stats_summary(&self) -> StatsSummary {
        StatsSummary { consecutive_failures: self.failures.consecutive_failures(), ..self.stats.summary() }
    }

    pub fn registry(&self) -> &SharedStateRegistry {
        &self.registry
    }

    pub fn tasks(&self) -> &TaskSet {
        &self.tasks
    }

    pub fn layout(&self) -> &CheckpointLayout {
        &self.layout
    }

    /// The job's checkpoint configuration in use.
    pub fn checkpoint_config(&self) -> &cairn_raft::model::CheckpointConfig {
        &self.config.checkpoint
    }

    /// Applies a changed checkpoint configuration (committed through Raft) at once: a new
    /// interval or min pause re-arms the trigger timer one new interval from `now`; the timeout
    /// applies to checkpoints triggered from now on; tolerable failures and the savepoint
    /// directory apply at once. The storage directory applies from the next deployment (the
    /// running tasks write where they were deployed to). `subsumed` are the checkpoints the
    /// commit dropped from the store (a lower `retained`); their state is discarded as after a
    /// completion. An invalid configuration, or a core that stopped, changes nothing.
    pub fn update_config(
        &mut self,
        now: Now,
        checkpoint: cairn_raft::model::CheckpointConfig,
        subsumed: &[cairn_raft::model::CompletedCheckpoint],
    ) -> Vec<Action> {
        let mut out = Vec::new();
        if self.lifecycle != Lifecycle::Running || checkpoint.validate().is_err() {
            return out;
        }
        for s in subsumed {
            self.discard_subsumed(s, &mut out);
        }
        self.failures.set_tolerable(checkpoint.tolerable_failures);
        self.scheduler.reconfigure(
            checkpoint.effective_interval(),
            checkpoint.min_pause,
            now.instant,
            &mut out,
        );
        let storage_dir = self.config.checkpoint.storage_dir.clone();
        self.config.checkpoint = cairn_raft::model::CheckpointConfig { storage_dir, ..checkpoint };
        out
    }

    /// Ids of the checkpoints in flight, ascending.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }

    /// Whether a completion proposal awaits its outcome. A restart must wait for it before
    /// choosing its restore point, or it could restore from an older checkpoint than the one
    /// about to be committed.
    pub fn has_commit_in_flight(&self) -> bool {
        self.pending.values().any(|p| p.stage == super::pending::Stage::Committing)
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.failures.consecutive_failures()
    }

    pub fn is_running(&self) -> bool {
        self.lifecycle == Lifecycle::Running
    }

    /// Handles one event at time `now`; returns the actions to carry out, in order.
    pub fn handle(&mut self, now: Now, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        if self.lifecycle != Lifecycle::Running {
            self.handle_stopped(event, &mut out);
            return out;
        }
        match event {
            Event::StartScheduler => self.scheduler.start(now.instant, &mut out),
            Event::ResumeScheduler => self.scheduler.resume(now.instant, &mut out),
            Event::StopScheduler => self.stop_scheduler(now, &mut out),
            Event::TriggerTimerFired { token } => {
                if self.scheduler.fired(token) {
                    let request = self
                        .scheduler
                        .take_queued()
                        .or_else(|| self.scheduler.is_periodic().then(Request::periodic));
                    if let Some(request) = request {
                        self.submit(now, request, &mut out);
                    }
                }
            }
            Event::TriggerRequested { request, kind } => {
                self.on_trigger_request(now, request, kind, &mut out)
            }
            Event::CheckpointIdAllocated { token, checkpoint_id } => {
                self.on_id_allocated(now, token, checkpoint_id, &mut out)
            }
            Event::CheckpointIdAllocationFailed { token, error } => {
                if let Some(request) = self.allocations.remove(&token) {
                    tracing::warn!(job = %self.config.job, %error, "checkpoint id allocation failed");
                    self.reject(now, request, CheckpointFailureReason::TriggerCheckpointFailure, &mut out);
                    self.slot_freed(now, &mut out);
                }
            }
            Event::TaskAcknowledged { attempt, checkpoint_id, state, metrics } => {
                self.on_ack(now, attempt, checkpoint_id, state, metrics, &mut out)
            }
            Event::TaskDeclined { attempt, checkpoint_id, reason, detail } => {
                self.on_decline(now, attempt, checkpoint_id, reason, detail, &mut out)
            }
            Event::TaskStatusChanged { attempt, status } => {
                self.on_task_status(now, attempt, status, &mut out)
            }
            Event::TasksRedeployed { tasks } => self.on_tasks_redeployed(now, tasks, &mut out),
            Event::CheckpointTimeout { checkpoint_id } => self.on_timeout(now, checkpoint_id, &mut out),
            Event::MetadataWritten { checkpoint_id, pointer } => {
                self.on_metadata_written(now, checkpoint_id, pointer, &mut out)
            }
            Event::MetadataWriteFailed { checkpoint_id, error } => {
                self.on_metadata_write_failed(now, checkpoint_id, error, &mut out)
            }
            Event::CompletionCommitted { checkpoint_id, outcome } => {
                self.on_committed(now, checkpoint_id, outcome, &mut out)
            }
            Event::CompletionRejected { checkpoint_id, error } => {
                self.on_commit_rejected(now, checkpoint_id, error, &mut out)
            }
            Event::CompletionOutcomeUnknown { checkpoint_id, detail } => {
                self.on_commit_outcome_unknown(now, checkpoint_id, detail, &mut out)
            }
            Event::Restored { checkpoint_id, external_path } => {
                self.highest_id = self.highest_id.max(checkpoint_id);
                self.stats.report_restored(checkpoint_id, now.wall_ms, external_path);
                self.push_stats(&mut out);
            }
            Event::Shutdown { job_status } => self.shutdown(now, job_status, &mut out),
            Event::LeadershipLost => self.suspend(now, &mut out),
        }
        if self.lifecycle == Lifecycle::Running {
            self.scheduler.ensure_armed(now.instant, &mut out);
        }
        out
    }

    /// After shutdown or suspension, requests are refused and everything else is ignored.
    fn handle_stopped(&mut self, event: Event, out: &mut Vec<Action>) {
        let reason = match self.lifecycle {
            Lifecycle::Suspended => CheckpointFailureReason::CheckpointCoordinatorSuspend,
            _ => CheckpointFailureReason::CheckpointCoordinatorShutdown,
        };
        if let Event::TriggerRequested { request, .. } = event {
            out.push(Action::AnswerTrigger { request, result: Err(TriggerError::Rejected { reason }) });
        }
    }

    fn on_trigger_request(
        &mut self,
        now: Now,
        request: super::actions::RequestId,
        kind: TriggerKind,
        out: &mut Vec<Action>,
    ) {
        match SnapshotProps::resolve(kind, self.config.checkpoint.savepoint_dir.as_deref()) {
            Ok(props) => self.submit(now, Request { origin: Origin::Manual(request), props }, out),
            Err(e) => out.push(Action::AnswerTrigger { request, result: Err(e) }),
        }
    }

    /// Checkpoints in flight: waiting for an id, or pending (any stage).
    fn in_flight(&self) -> usize {
        self.allocations.len() + self.pending.len()
    }

    /// Runs the pre-checks of a request and, if it may go ahead, asks for a checkpoint id.
    fn submit(&mut self, now: Now, request: Request, out: &mut Vec<Action>) {
        if !request.props.is_forced() {
            if self.scheduler.has_queued() {
                self.reject(now, request, CheckpointFailureReason::AlreadyQueued, out);
                return;
            }
            if self.in_flight() >= self.config.checkpoint.max_concurrent as usize {
                // Waits for a slot; the timer is not needed until then.
                self.scheduler.queue(request);
                self.scheduler.disarm(out);
                return;
            }
            if let Some(at) = self.scheduler.min_pause_until(now.instant) {
                self.scheduler.queue(request);
                self.scheduler.arm(at, out);
                return;
            }
        }
        if let Some(why) = self.tasks.why_not_triggerable() {
            tracing::info!(job = %self.config.job, %why, "not triggering");
            self.reject(now, request, CheckpointFailureReason::NotAllRequiredTasksRunning, out);
            return;
        }
        if request.props.kind == CheckpointKind::SyncSavepoint {
            self.pause_for_sync_savepoint(now, out);
        }
        self.next_allocation += 1;
        let token = AllocationToken(self.next_allocation);
        self.allocations.insert(token, request);
        out.push(Action::AllocateCheckpointId { token });
    }

    /// Refuses a request that started nothing.
    fn reject(&mut self, now: Now, request: Request, reason: CheckpointFailureReason, out: &mut Vec<Action>) {
        match request.origin {
            Origin::Manual(request) => {
                out.push(Action::AnswerTrigger { request, result: Err(TriggerError::Rejected { reason }) })
            }
            Origin::Periodic => tracing::debug!(job = %self.config.job, %reason, "periodic trigger skipped"),
        }
        if request.props.kind == CheckpointKind::SyncSavepoint {
            self.resume_after_sync_savepoint(now, out);
        }
    }

    /// The id came back from Raft: create the pending checkpoint and trigger the sources.
    fn on_id_allocated(&mut self, now: Now, token: AllocationToken, id: u64, out: &mut Vec<Action>) {
        let Some(request) = self.allocations.remove(&token) else {
            tracing::debug!(job = %self.config.job, id, "id allocated for a request no longer waiting");
            return;
        };
        if id <= self.highest_id {
            tracing::error!(job = %self.config.job, id, highest = self.highest_id, "allocated checkpoint id does not increase");
            self.reject(now, request, CheckpointFailureReason::TriggerCheckpointFailure, out);
            self.slot_freed(now, out);
            return;
        }
        self.highest_id = id;
        if !request.props.is_forced()
            && let Some(at) = self.scheduler.min_pause_until(now.instant)
        {
            // A checkpoint completed while the id was allocated; the id is simply not used.
            if self.scheduler.has_queued() {
                self.reject(now, request, CheckpointFailureReason::MinimumTimeBetweenCheckpoints, out);
            } else {
                self.scheduler.queue(request);
                self.scheduler.arm(at, out);
            }
            return;
        }
        if self.tasks.why_not_triggerable().is_some() {
            self.reject(now, request, CheckpointFailureReason::NotAllRequiredTasksRunning, out);
            self.slot_freed(now, out);
            return;
        }
        self.start_pending(now, id, request, out);
    }

    fn start_pending(&mut self, now: Now, id: u64, request: Request, out: &mut Vec<Action>) {
        let kind = request.props.kind;
        let (base_dir, dir, exclusive_dir) = match &request.props.savepoint_parent {
            Some(parent) if request.props.is_forced() => {
                let suffix = self.names.next_u64() & 0xffff_ffff_ffff;
                let dir = CheckpointLayout::savepoint_dir(parent, self.config.job.as_str(), id, suffix);
                (dir.clone(), dir, String::new())
            }
            _ => (self.layout.job_dir().to_owned(), self.layout.chk_dir(id), CheckpointLayout::chk_rel(id)),
        };
        let deadline = super::actions::instant_after(now.instant, self.config.checkpoint.timeout);
        let init = PendingInit {
            id,
            kind,
            origin: request.origin,
            base_dir: base_dir.clone(),
            dir,
            trigger_time_ms: now.wall_ms,
            deadline,
        };
        let mut pending = PendingCheckpoint::new(init, &self.tasks);
        self.stats.report_pending(id, kind, now.wall_ms, pending.num_tasks() as u32);
        let hook_result = self.hooks.snapshot(id, now.wall_ms);
        match hook_result {
            Ok(states) => pending.master_states = states,
            Err(e) => {
                self.fail(
                    now,
                    pending,
                    CheckpointFailureReason::TriggerCheckpointFailure,
                    Some(e.to_string()),
                    completion::Discard::Full,
                    out,
                );
                return;
            }
        }
        pending.tasks_triggered = true;
        self.pending.insert(id, pending);
        out.push(Action::ScheduleTimeout { checkpoint_id: id, at: deadline });
        out.push(Action::TriggerTasks {
            checkpoint_id: id,
            timestamp_ms: now.wall_ms,
            options: CheckpointOptions { kind, base_dir, exclusive_dir, drain: request.props.drain },
            tasks: self.tasks.trigger_attempts(),
        });
        if let Origin::Manual(request) = request.origin {
            out.push(Action::TriggerAccepted { request, checkpoint_id: id });
        }
        self.push_stats(out);
    }

    /// A checkpoint left the in-flight set: the queued request (if any) gets its turn.
    fn slot_freed(&mut self, now: Now, out: &mut Vec<Action>) {
        if self.lifecycle != Lifecycle::Running {
            return;
        }
        if let Some(request) = self.scheduler.take_queued() {
            self.submit(now, request, out);
        }
    }

    /// Stop-with-savepoint stops periodic checkpoints and aborts the checkpoints in flight (as
    /// Flink does); they resume if the savepoint fails.
    fn pause_for_sync_savepoint(&mut self, now: Now, out: &mut Vec<Action>) {
        if self.scheduler.is_periodic() {
            self.paused_for_sync_savepoint = true;
            if let Some(queued) = self.scheduler.stop(out) {
                self.reject(now, queued, CheckpointFailureReason::PeriodicSchedulerShutdown, out);
            }
        }
        let ids: Vec<u64> = self
            .pending
            .values()
            .filter(|p| p.kind == CheckpointKind::Checkpoint && p.stage != super::pending::Stage::Committing)
            .map(|p| p.id)
            .collect();
        for id in ids {
            self.abort(now, id, CheckpointFailureReason::CheckpointCoordinatorSuspend, None, out);
        }
    }

    fn resume_after_sync_savepoint(&mut self, now: Now, out: &mut Vec<Action>) {
        let sync_in_flight = self.allocations.values().any(|r| r.props.kind == CheckpointKind::SyncSavepoint)
            || self.pending.values().any(|p| p.kind == CheckpointKind::SyncSavepoint);
        if self.paused_for_sync_savepoint && !sync_in_flight && self.lifecycle == Lifecycle::Running {
            self.paused_for_sync_savepoint = false;
            self.scheduler.start(now.instant, out);
        }
    }

    fn push_stats(&self, out: &mut Vec<Action>) {
        out.push(Action::StatsChanged { counts: self.stats.stats().counts });
    }

    /// Checkpoint ids of every pending checkpoint matching `pred`.
    fn pending_where(&self, pred: impl Fn(&PendingCheckpoint) -> bool) -> BTreeSet<u64> {
        self.pending.values().filter(|p| pred(p)).map(|p| p.id).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests;
