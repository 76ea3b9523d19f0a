//! Reports from tasks (acknowledgements, declines, status) and manual trigger requests, with
//! precise refusals for the worker.

use cairn_proto::v1::TaskTime;

use super::*;

impl JobDriver {
    pub(super) fn on_report(&mut self, worker_id: &str, msg: TaskMessage) -> Result<(), Status> {
        let task = msg.task().clone();
        let index = self.tasks.index_of(&task.task.vertex, task.task.subtask).ok_or_else(|| {
            Status::not_found(format!(
                "job `{}` has no task {}/{}",
                self.job, task.task.vertex, task.task.subtask
            ))
        })?;
        let attempt = core_attempt(task.attempt, index);
        let current =
            self.deployed.as_ref().filter(|d| d.worker_of(index) == Some(worker_id)).map(|d| d.attempt);
        // Only the worker a task is deployed on speaks for its checkpoints.
        if let Some(d) = &self.deployed
            && d.worker_of(index) != Some(worker_id)
            && matches!(msg, TaskMessage::Acknowledge { .. } | TaskMessage::Decline { .. })
        {
            return Err(Status::permission_denied(format!(
                "task {task} of job `{}` runs on worker `{}`, not on `{worker_id}`: it is not this worker's to report",
                self.job,
                d.worker_of(index).unwrap_or("-")
            )));
        }
        match msg {
            TaskMessage::Acknowledge { checkpoint_id, state, metrics, .. } => {
                if checkpoint_id == 0 || checkpoint_id > self.max_allocated {
                    return Err(Status::invalid_argument(format!(
                        "checkpoint {checkpoint_id} of job `{}` was never triggered (highest allocated id is {})",
                        self.job, self.max_allocated
                    )));
                }
                if !self.acked.insert((checkpoint_id, attempt)) {
                    return Err(Status::already_exists(format!(
                        "checkpoint {checkpoint_id} was already acknowledged by task {task}"
                    )));
                }
                // Forget acknowledgements of old checkpoints: the set is ordered by checkpoint
                // id, so only its front goes (a scan of the whole set per acknowledgement made
                // a job of a hundred tasks cost a third of the leader's CPU).
                let floor = self.max_allocated.saturating_sub(256);
                while self.acked.first().is_some_and(|(id, _)| *id < floor) {
                    self.acked.pop_first();
                }
                if self.core.is_none() {
                    return Err(Status::failed_precondition(format!(
                        "job `{}` is not running a deployment; the acknowledgement is ignored",
                        self.job
                    )));
                }
                let actions =
                    self.feed_collect(Event::TaskAcknowledged { attempt, checkpoint_id, state, metrics });
                let verdict = actions.iter().find_map(|a| match a {
                    Action::DiscardAckedState { checkpoint_id: c, attempt: a, cause, .. }
                        if *c == checkpoint_id && *a == attempt =>
                    {
                        Some(*cause)
                    }
                    _ => None,
                });
                self.execute_all(actions);
                match verdict {
                    None => Ok(()),
                    Some(StrayAck::UnknownAttempt) => Err(Status::failed_precondition(format!(
                        "task {task} is not a current attempt of job `{}`; its state was discarded",
                        self.job
                    ))),
                    Some(StrayAck::Late { .. }) => Err(Status::failed_precondition(format!(
                        "checkpoint {checkpoint_id} of job `{}` already finished; the late state was discarded",
                        self.job
                    ))),
                    Some(StrayAck::UnknownCheckpoint) => Err(Status::not_found(format!(
                        "checkpoint {checkpoint_id} of job `{}` is not pending; the state was discarded",
                        self.job
                    ))),
                }
            }
            TaskMessage::Decline { checkpoint_id, reason, .. } => {
                if self.core.is_none() {
                    return Ok(());
                }
                let (reason, detail) = decline_reason(&reason);
                self.feed(Event::TaskDeclined { attempt, checkpoint_id, reason, detail });
                Ok(())
            }
            TaskMessage::Status { status, .. } => {
                if current != Some(task.attempt) {
                    tracing::debug!(job = %self.job, task = %task, "status of a superseded attempt ignored");
                    return Ok(());
                }
                self.on_task_status(index, attempt, status);
                Ok(())
            }
        }
    }

    /// Takes a worker's time figures for tasks of the current attempt it runs; anything else
    /// (a task the job does not have, one deployed elsewhere, figures that make no sense next
    /// to the previous ones) is ignored with a warning. Figures of another attempt are a
    /// normal race around a restart and only logged at debug.
    pub(super) fn on_times(&mut self, worker_id: &str, times: &[TaskTime], at: Instant) {
        for t in times {
            let Some(index) = self.tasks.index_of(&t.vertex, t.subtask) else {
                tracing::warn!(job = %self.job, worker = worker_id, vertex = %t.vertex.chars().take(128).collect::<String>(),
                    subtask = t.subtask, "time figures for a task the job does not have; ignored");
                continue;
            };
            let Some(d) = self.deployed.as_mut() else {
                tracing::debug!(job = %self.job, worker = worker_id, "time figures while no attempt is deployed; ignored");
                return;
            };
            if d.worker_of(index) != Some(worker_id) {
                tracing::warn!(job = %self.job, worker = worker_id, vertex = %t.vertex, subtask = t.subtask,
                    deployed_on = d.worker_of(index).unwrap_or("-"),
                    "time figures for a task not deployed on this worker; ignored");
                continue;
            }
            if t.attempt != u64::from(d.attempt) {
                tracing::debug!(job = %self.job, worker = worker_id, vertex = %t.vertex, subtask = t.subtask,
                    attempt = t.attempt, current = d.attempt, "time figures of another attempt; ignored");
                continue;
            }
            let sample = load::Times {
                busy_ms: t.busy_ms,
                idle_ms: t.idle_ms,
                back_pressured_ms: t.back_pressured_ms,
            };
            if let Err(e) = d.loads.entry(index).or_default().push(at, sample) {
                tracing::warn!(job = %self.job, worker = worker_id, vertex = %t.vertex, subtask = t.subtask,
                    error = %e, "time figures make no sense; ignored");
            }
        }
    }

    pub(super) fn on_task_status(&mut self, index: usize, attempt: TaskAttemptId, status: RtTaskStatus) {
        let core_status = match &status {
            // A finishing task waits for its final checkpoint: it takes part in checkpoints.
            RtTaskStatus::Running | RtTaskStatus::Finishing => TaskStatus::Running,
            RtTaskStatus::Finished => TaskStatus::Finished,
            RtTaskStatus::Failed(_) | RtTaskStatus::Canceled => TaskStatus::Failed,
            RtTaskStatus::Created | RtTaskStatus::Restoring => TaskStatus::NotRunning,
        };
        if self.core.is_some() {
            self.feed(Event::TaskStatusChanged { attempt, status: core_status });
        }
        match status {
            RtTaskStatus::Running => {
                let all_running = match &mut self.deployed {
                    Some(d) => {
                        d.running.insert(index);
                        d.running.len() == self.tasks.len()
                    }
                    None => false,
                };
                if all_running && self.phase == Phase::Deploying {
                    tracing::info!(job = %self.job, "all tasks running: checkpointing starts");
                    self.phase = Phase::Running;
                    self.set_status(JobStatus::Running);
                    self.feed(Event::StartScheduler);
                }
            }
            RtTaskStatus::Finished => {
                let all_finished = match &mut self.deployed {
                    Some(d) => {
                        d.finished.insert(index);
                        d.finished.len() == self.tasks.len()
                    }
                    None => false,
                };
                if all_finished {
                    tracing::info!(job = %self.job, "all tasks finished: the job is finished");
                    self.deployed = None;
                    self.release_worker();
                    self.phase = Phase::Finished;
                    self.set_status(JobStatus::Finished);
                }
            }
            RtTaskStatus::Failed(cause) => self.restart(format!("task {index} failed: {cause}")),
            RtTaskStatus::Canceled => self.restart(format!("task {index} was canceled")),
            _ => {}
        }
    }

    pub(super) fn on_trigger(&mut self, kind: TriggerKind, reply: oneshot::Sender<TriggerReply>) {
        if self.phase != Phase::Running || self.core.is_none() {
            let _ = reply.send(Err(format!("job `{}` is not running (it is {:?})", self.job, self.phase)));
            return;
        }
        let request = RequestId(self.next_request);
        self.next_request += 1;
        self.requests.insert(request, reply);
        self.feed(Event::TriggerRequested { request, kind });
    }
}
