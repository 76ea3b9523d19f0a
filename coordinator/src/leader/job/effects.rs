//! Feeding events to the coordinator core and carrying out its actions: Raft proposals, task
//! commands, timers, `_metadata` writes, deletions, and recording statistics.

use super::*;

impl JobDriver {
    /// Sends a command to the tasks of `attempt` on the leased worker; `false` when it could not
    /// be handed to the worker's stream (closed or full).
    pub(super) fn command(
        &self,
        lease: &WorkerLease,
        attempt: u32,
        tasks: Vec<(String, u32)>,
        body: ToTask,
    ) -> bool {
        let cmd = TaskCommand { job_id: self.job.to_string(), attempt, tasks, body };
        match serde_json::to_vec(&cmd) {
            Ok(json) => {
                let sent = lease
                    .outbox
                    .try_send(self.term.leader_message(leader_message::Body::CommandJson(json)))
                    .is_ok();
                if !sent {
                    tracing::warn!(job = %self.job, worker = %lease.worker_id, "worker outbox full or closed: command dropped");
                }
                sent
            }
            Err(e) => {
                tracing::error!(job = %self.job, error = %e, "cannot encode a task command");
                false
            }
        }
    }

    /// Sends `body` to the given core attempts (all of the current deployment); `false` when the
    /// message could not be handed to the worker's stream.
    pub(super) fn to_tasks(&self, attempts: &[TaskAttemptId], body: ToTask) -> bool {
        let Some(d) = &self.deployed else { return false };
        let mut addressed = Vec::new();
        for a in attempts {
            let (attempt, index) = split_attempt(*a);
            if attempt != d.attempt {
                continue;
            }
            if let Some(t) = self.tasks.get(index) {
                addressed.push((t.vertex.clone(), t.subtask));
            }
        }
        if addressed.is_empty() {
            return true;
        }
        if addressed.len() == self.tasks.len() {
            addressed.clear();
        }
        self.command_deployed(d, addressed, body)
    }

    /// Sends a command to tasks of the deployment `d` (all of them when `tasks` is empty), each
    /// part to the worker that runs it; `false` when a part could not be handed to its worker.
    pub(super) fn command_deployed(&self, d: &Deployed, tasks: Vec<(String, u32)>, body: ToTask) -> bool {
        if tasks.is_empty() {
            let mut sent = true;
            for lease in d.leases.values() {
                sent &= self.command(lease, d.attempt, Vec::new(), body.clone());
            }
            return sent;
        }
        if d.leases.len() == 1 {
            return d
                .leases
                .values()
                .all(|lease| self.command(lease, d.attempt, tasks.clone(), body.clone()));
        }
        let mut by_worker: BTreeMap<&str, Vec<(String, u32)>> = BTreeMap::new();
        for (vertex, subtask) in tasks {
            let worker = self.tasks.index_of(&vertex, subtask).and_then(|i| d.worker_of(i));
            if let Some(w) = worker {
                by_worker.entry(w).or_default().push((vertex, subtask));
            }
        }
        let mut sent = true;
        for (worker, part) in by_worker {
            if let Some(lease) = d.leases.get(worker) {
                sent &= self.command(lease, d.attempt, part, body.clone());
            }
        }
        sent
    }

    pub(super) fn feed(&mut self, event: Event) {
        let shutdown = matches!(event, Event::Shutdown { .. });
        let actions = self.feed_collect(event);
        self.execute_all(actions);
        if shutdown {
            self.remove_spares();
        }
        self.record_stats();
        self.publish_metrics();
    }

    /// The job ended: its spare checkpoint directories go (none is kept from now on).
    fn remove_spares(&mut self) {
        let Some(job_dir) = self.core.as_ref().map(|c| c.layout().job_dir().to_owned()) else { return };
        let spares = self.spares.clone();
        self.io.spawn(async move {
            let _ = tokio::task::spawn_blocking(move || spares.remove_all(&job_dir)).await;
        });
    }

    /// Writes the statistics summary through Raft when the counts changed, at most once per
    /// [`STATS_RECORD_INTERVAL`].
    pub(super) fn record_stats(&mut self) {
        let Some(core) = &self.core else { return };
        // Called after every event (every acknowledgement): compare before building anything.
        let key = core.stats_key();
        if self.recorded_counts == Some(key) {
            return;
        }
        if let Some(at) = self.recorded_at
            && at.elapsed() < STATS_RECORD_INTERVAL
        {
            // Throttled: write it when the interval is over, so the last change is not lost.
            self.stats_flush_at.get_or_insert(at + STATS_RECORD_INTERVAL);
            return;
        }
        let Ok(stats) = serde_json::to_value(core.stats_summary()) else { return };
        self.recorded_counts = Some(key);
        self.recorded_at = Some(Instant::now());
        let ctx = self.ctx.clone();
        let job = self.job.clone();
        self.io.spawn(async move {
            if let Err(e) = propose(&ctx, Command::RecordStats { job: job.clone(), stats }).await {
                tracing::debug!(job = %job, error = %e, "checkpoint statistics not recorded");
            }
        });
    }

    pub(super) fn feed_collect(&mut self, event: Event) -> Vec<Action> {
        match &mut self.core {
            Some(core) => core.handle(now(), event),
            None => Vec::new(),
        }
    }

    pub(super) fn execute_all(&mut self, actions: Vec<Action>) {
        for a in actions {
            self.execute(a);
        }
    }

    pub(super) fn on_internal(&mut self, internal: Internal) {
        if self.phase == Phase::Suspended {
            return;
        }
        match internal {
            Internal::Core(event) => {
                let mut claimed = false;
                if let Event::CheckpointIdAllocated { checkpoint_id, .. } = &event {
                    self.max_allocated = self.max_allocated.max(*checkpoint_id);
                }
                match &event {
                    // The core logs the completion itself (with its kind and size).
                    Event::CompletionCommitted { .. } => claimed = true,
                    Event::MetadataWriteFailed { checkpoint_id, error } => {
                        tracing::warn!(job = %self.job, checkpoint = checkpoint_id, error = %error, "cannot write _metadata")
                    }
                    Event::CompletionRejected { checkpoint_id, error } => {
                        tracing::warn!(job = %self.job, checkpoint = checkpoint_id, error = %error, "completion rejected")
                    }
                    Event::CompletionOutcomeUnknown { checkpoint_id, detail } => {
                        tracing::warn!(job = %self.job, checkpoint = checkpoint_id, detail = %detail, "completion outcome unknown")
                    }
                    Event::CheckpointIdAllocationFailed { error, .. } => {
                        tracing::warn!(job = %self.job, error = %error, "checkpoint id allocation failed")
                    }
                    _ => {}
                }
                self.feed(event);
                if claimed {
                    self.release_claimed_restore();
                }
            }
            Internal::Prepared { generation, result } => {
                if generation == self.generation && self.phase == Phase::Preparing {
                    self.on_prepared(*result);
                }
            }
            Internal::Leased { generation, grants } => {
                if generation == self.generation && self.phase == Phase::WaitingForWorker {
                    self.on_leased(grants);
                } else if grants.is_some() {
                    self.release_worker();
                }
            }
            Internal::Resync { checkpoint_id } => {
                if self.phase == Phase::Running
                    && self.core.as_ref().is_some_and(|c| c.pending_ids().contains(&checkpoint_id))
                {
                    tracing::info!(job = %self.job, checkpoint = checkpoint_id, "trigger undeliverable: aborting pending checkpoints");
                    self.feed(Event::StopScheduler);
                    self.feed(Event::StartScheduler);
                }
            }
            Internal::RequestRecorded { request_id, result } => self.request_recorded(&request_id, result),
            Internal::IdsReserved { generation, result } => self.on_ids_reserved(generation, result),
            Internal::FailureRecorded { generation, cause, result } => {
                if generation == self.generation && self.phase == Phase::Restarting {
                    self.on_failure_recorded(cause, result);
                }
            }
            Internal::StatusCommitted { status, result } => match result {
                Ok(()) => {
                    if status.is_terminal() {
                        self.feed(Event::Shutdown { job_status: status });
                    }
                }
                Err(e) => {
                    tracing::warn!(job = %self.job, status = %status, error = %e, "cannot record the job status")
                }
            },
        }
    }

    pub(super) fn execute(&mut self, action: Action) {
        match action {
            Action::AllocateCheckpointId { token } => self.allocate_id(token),
            Action::TriggerTasks { checkpoint_id, timestamp_ms, options, tasks } => {
                let unaligned_after_ms =
                    self.core.as_ref().and_then(|c| c.checkpoint_config().unaligned_after_ms());
                let body = ToTask::TriggerCheckpoint {
                    checkpoint_id,
                    timestamp_ms,
                    options: task_options(&options, unaligned_after_ms),
                };
                if !self.to_tasks(&tasks, body) {
                    // The worker's stream broke (it is reconnecting, or lost): this checkpoint
                    // cannot complete. Abort it now rather than let it expire and count as a
                    // failure; the periodic trigger continues once the worker is back.
                    let _ = self.self_tx.try_send(JobInput::Internal(Internal::Resync { checkpoint_id }));
                }
            }
            Action::ScheduleTrigger { at, token } => self.trigger_timer = Some((at, token)),
            Action::CancelTrigger => self.trigger_timer = None,
            Action::ScheduleTimeout { checkpoint_id, at } => {
                self.timeouts.insert(checkpoint_id, at);
            }
            Action::WriteMetadata { checkpoint_id, path, metadata } => {
                let spares = self.spares.clone();
                self.spawn_internal(async move {
                    let r =
                        tokio::task::spawn_blocking(move || spares.write_metadata(&path, &metadata)).await;
                    Internal::Core(match r {
                        Ok(Ok(pointer)) => Event::MetadataWritten { checkpoint_id, pointer },
                        Ok(Err(e)) => Event::MetadataWriteFailed { checkpoint_id, error: e.to_string() },
                        Err(e) => Event::MetadataWriteFailed { checkpoint_id, error: e.to_string() },
                    })
                });
            }
            Action::ProposeCompletion { checkpoint_id, command } => {
                self.timeouts.remove(&checkpoint_id);
                let ctx = self.ctx.clone();
                self.spawn_internal(async move {
                    Internal::Core(match propose(&ctx, *command).await {
                        Ok((outcome, _)) => Event::CompletionCommitted { checkpoint_id, outcome },
                        Err(NodeError::Command(error)) => Event::CompletionRejected { checkpoint_id, error },
                        // Leadership lost mid-proposal: the entry may or may not commit.
                        Err(e) => Event::CompletionOutcomeUnknown { checkpoint_id, detail: e.to_string() },
                    })
                });
            }
            Action::NotifyComplete { checkpoint_id, tasks, .. } => {
                self.timeouts.remove(&checkpoint_id);
                self.to_tasks(&tasks, ToTask::NotifyCheckpointComplete { checkpoint_id });
            }
            Action::NotifyAborted { checkpoint_id, reason, tasks } => {
                self.timeouts.remove(&checkpoint_id);
                tracing::info!(job = %self.job, checkpoint = checkpoint_id, reason = reason.description(), "checkpoint aborted");
                self.to_tasks(&tasks, ToTask::NotifyCheckpointAborted { checkpoint_id });
            }
            Action::DiscardCheckpoint { dirs, files, checkpoint_id, .. } => {
                self.timeouts.remove(&checkpoint_id);
                let spares = self.spares.clone();
                self.io.spawn(async move {
                    let _ = tokio::task::spawn_blocking(move || {
                        remove_paths(&[], &files);
                        spares.discard(&dirs);
                    })
                    .await;
                });
            }
            Action::DiscardJobCheckpoints { dirs, .. } => {
                let (ctx, job) = (self.ctx.clone(), self.job.clone());
                self.io.spawn(async move {
                    // The store forgets the checkpoints first, so it never lists one whose files
                    // are gone; if that commit fails, the files stay (a leak, never a dangling
                    // reference).
                    match propose(&ctx, Command::DiscardRetainedCheckpoints { job: job.clone() }).await {
                        Ok(_) => {
                            let _ = tokio::task::spawn_blocking(move || remove_paths(&dirs, &[])).await;
                        }
                        Err(e) => tracing::warn!(job = %job, error = %e,
                            "the store still lists the terminated job's checkpoints; their files are kept"),
                    }
                });
            }
            Action::DiscardAckedState { files, .. } => {
                self.io.spawn(async move {
                    let _ = tokio::task::spawn_blocking(move || remove_paths(&[], &files)).await;
                });
            }
            Action::FailOver { reason, message } => {
                self.restart(format!("{}: {message}", reason.description()))
            }
            Action::TriggerAccepted { request, checkpoint_id } => {
                tracing::info!(job = %self.job, request = request.0, checkpoint = checkpoint_id, "trigger accepted");
                self.trigger_accepted(request, checkpoint_id);
            }
            Action::AnswerTrigger { request, result } => {
                let result = result.map_err(|e| e.to_string());
                self.trigger_answered(request, &result);
                if let Some(reply) = self.requests.remove(&request) {
                    let _ = reply.send(result);
                }
            }
            Action::StatsChanged { .. } => {}
        }
    }
}
