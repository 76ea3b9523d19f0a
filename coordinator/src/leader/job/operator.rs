//! Operator requests on a running job: triggers answered as soon as their checkpoint id is
//! known (with the id recorded through Raft under the caller's request id), cancellation, and
//! configuration changes applied at once.

use cairn_raft::model::CompletedCheckpoint;

use super::*;

impl JobDriver {
    /// Starts a manual trigger and answers `started` with its checkpoint id once allocated (and,
    /// with a key, recorded); the completion is observed through the store and statistics.
    pub(super) fn on_trigger_started(
        &mut self,
        kind: TriggerKind,
        key: Option<TriggerKey>,
        started: oneshot::Sender<StartedReply>,
    ) {
        if let Some(k) = &key
            && let Some(inflight) = self.keyed.get_mut(&k.request_id)
        {
            if inflight.fingerprint == k.fingerprint {
                inflight.waiters.push(started);
            } else {
                let _ = started.send(Err(StartRefusal::RequestIdReused));
            }
            return;
        }
        if self.phase != Phase::Running || self.core.is_none() {
            let why = format!("job `{}` is not running (it is {:?})", self.job, self.phase);
            let _ = started.send(Err(StartRefusal::Refused(why.to_lowercase())));
            return;
        }
        let request = RequestId(self.next_request);
        self.next_request += 1;
        // The final answer goes nowhere: the caller follows the outcome through the store.
        let (done, _) = oneshot::channel();
        self.requests.insert(request, done);
        self.started.insert(request, started);
        if let Some(k) = key {
            self.keyed
                .insert(k.request_id, Keyed { fingerprint: k.fingerprint, request, waiters: Vec::new() });
        }
        self.feed(Event::TriggerRequested { request, kind });
    }

    /// The core accepted a manual request with this checkpoint id.
    pub(super) fn trigger_accepted(&mut self, request: RequestId, checkpoint_id: u64) {
        let keyed =
            self.keyed.iter().find(|(_, k)| k.request == request).map(|(id, k)| (id.clone(), k.fingerprint));
        let Some((request_id, fingerprint)) = keyed else {
            if let Some(started) = self.started.remove(&request) {
                let _ = started.send(Ok(checkpoint_id));
            }
            return;
        };
        let ctx = self.ctx.clone();
        let job = self.job.clone();
        self.spawn_internal(async move {
            let cmd = Command::RecordRequest {
                job,
                request_id: request_id.clone(),
                fingerprint,
                outcome: Outcome::CheckpointId { id: checkpoint_id },
            };
            let result = match propose(&ctx, cmd).await {
                Ok((Outcome::CheckpointId { id }, _)) => Ok(id),
                Ok((Outcome::Repeated { first }, _)) => match *first {
                    Outcome::CheckpointId { id } => Ok(id),
                    other => Err(StartRefusal::Refused(format!("unexpected recorded outcome {other:?}"))),
                },
                Ok((other, _)) => Err(StartRefusal::Refused(format!("unexpected outcome {other:?}"))),
                Err(NodeError::Command(cairn_raft::model::CommandError::RequestIdReused { .. })) => {
                    Err(StartRefusal::RequestIdReused)
                }
                Err(e) => Err(StartRefusal::Refused(format!("cannot record the request id: {e}"))),
            };
            Internal::RequestRecorded { request_id, result }
        });
    }

    /// The checkpoint id of a keyed request is recorded: answer everyone waiting for it.
    pub(super) fn request_recorded(&mut self, request_id: &str, result: StartedReply) {
        let Some(keyed) = self.keyed.remove(request_id) else { return };
        let first = self.started.remove(&keyed.request);
        for w in first.into_iter().chain(keyed.waiters) {
            let _ = w.send(result.clone());
        }
    }

    /// A manual request got its final answer: a caller still waiting for the id learns why it
    /// never got one.
    pub(super) fn trigger_answered(&mut self, request: RequestId, result: &Result<TriggerSuccess, String>) {
        let Some(started) = self.started.remove(&request) else { return };
        let reply = match result {
            Ok(s) => Ok(s.checkpoint_id),
            Err(e) => Err(StartRefusal::Refused(e.clone())),
        };
        let keyed = self.keyed.iter().find(|(_, k)| k.request == request).map(|(id, _)| id.clone());
        let waiters = keyed.and_then(|id| self.keyed.remove(&id)).map(|k| k.waiters).unwrap_or_default();
        for w in std::iter::once(started).chain(waiters) {
            let _ = w.send(reply.clone());
        }
    }

    /// The job's `canceled` status is committed: cancel the tasks, stop checkpointing (the core
    /// discards checkpoints as its retention policy says) and end the driver.
    pub(super) fn cancel(&mut self) {
        if matches!(self.phase, Phase::Finished | Phase::Failed | Phase::Canceled) {
            return;
        }
        tracing::info!(job = %self.job, "job canceled: cancelling its tasks");
        if let Some(d) = self.deployed.take() {
            self.command_deployed(&d, Vec::new(), ToTask::Cancel);
            self.release_worker();
        }
        // Tasks that re-attached but were never adopted into a deployment.
        let mut sent = BTreeSet::new();
        for (attempt, _, lease) in std::mem::take(&mut self.reattached).into_values() {
            if sent.insert((lease.worker_id.clone(), attempt)) {
                self.command(&lease, attempt, Vec::new(), ToTask::Cancel);
            }
        }
        self.prepared = None;
        self.restart_at = None;
        self.trigger_timer = None;
        self.phase = Phase::Canceled;
        if self.core.is_some() {
            self.feed(Event::Shutdown { job_status: JobStatus::Canceled });
        }
    }

    /// A new checkpoint configuration is committed: the core applies it now.
    pub(super) fn config_changed(&mut self, subsumed: &[CompletedCheckpoint]) {
        let Some(record) = self.ctx.reader.job(&self.job) else { return };
        let Some(core) = &mut self.core else { return };
        let actions = core.update_config(now(), record.spec.checkpoint.clone(), subsumed);
        tracing::info!(job = %self.job, interval = ?record.spec.checkpoint.interval, "checkpoint configuration applied");
        self.execute_all(actions);
    }
}
