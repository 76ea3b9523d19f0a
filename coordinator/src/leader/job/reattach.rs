//! Re-attaching tasks after a leader change: a job whose tasks of the latest attempt all come
//! back (running, finishing after their end of data, or finished while the worker still holds
//! the job) continues without a restart; otherwise it restarts from its latest checkpoint.

use super::*;

impl JobDriver {
    pub(super) fn on_attached(&mut self, lease: WorkerLease, attached: Vec<AttachedTask>) {
        let latest_attempt = self.ctx.reader.job(&self.job).map(|r| r.attempts).unwrap_or(0);
        match self.phase {
            Phase::AwaitReattach => {
                for t in &attached {
                    match self.tasks.index_of(&t.vertex, t.subtask) {
                        Some(i) => {
                            self.reattached.insert(i, (t.attempt as u32, t.status.clone(), lease.clone()));
                        }
                        None => {
                            tracing::warn!(job = %self.job, vertex = %t.vertex, subtask = t.subtask, "re-attached task is not in the job graph")
                        }
                    }
                }
                // Every task back, from whichever workers run them (a job may span several).
                let complete = self.reattached.len() == self.tasks.len()
                    && self.reattached.values().all(|(a, status, _)| {
                        *a == latest_attempt
                            && matches!(status.as_str(), "running" | "finishing" | "finished")
                    });
                if complete {
                    self.resume_without_restart(latest_attempt);
                }
            }
            _ => {
                // The worker reconnected: keep our deployment if these are its tasks; cancel
                // tasks of any other attempt.
                let mut stale = BTreeSet::new();
                let mut new_stream = false;
                for t in &attached {
                    match &mut self.deployed {
                        Some(d) if d.attempt == t.attempt as u32 && d.runs_on(&lease.worker_id) => {
                            let old = d.leases.insert(lease.worker_id.clone(), lease.clone());
                            new_stream |= old.is_some_and(|o| !o.outbox.same_channel(&lease.outbox));
                        }
                        _ => {
                            stale.insert(t.attempt as u32);
                        }
                    }
                }
                // Triggers sent on the worker's previous stream may have gone down with it
                // without the send failing (the stream broke after taking them): a pending
                // checkpoint would then wait out its whole timeout. Abort the pending ones and
                // trigger afresh on the new stream.
                if new_stream
                    && self.phase == Phase::Running
                    && self.core.as_ref().is_some_and(|c| !c.pending_ids().is_empty())
                {
                    tracing::info!(job = %self.job, worker = %lease.worker_id,
                        "worker attached on a new stream: aborting pending checkpoints whose triggers the old one may have lost");
                    self.feed(Event::StopScheduler);
                    self.feed(Event::StartScheduler);
                }
                for attempt in stale {
                    tracing::info!(job = %self.job, attempt, worker = %lease.worker_id, "cancelling tasks of a superseded attempt");
                    self.command(&lease, attempt, Vec::new(), ToTask::Cancel);
                }
                // The worker runs none of our deployment: it was lost with the stream it was
                // sent on (or the worker restarted without its tasks). Waiting would wait forever.
                let lost = self.deployed.as_ref().is_some_and(|d| {
                    d.runs_on(&lease.worker_id) && !attached.iter().any(|t| t.attempt as u32 == d.attempt)
                });
                if lost {
                    self.restart(format!(
                        "worker {} attached again without the job's tasks: the deployment or its tasks were lost",
                        lease.worker_id
                    ));
                }
            }
        }
    }

    /// Every task of the latest attempt re-attached to this leader: continue without restarting.
    pub(super) fn resume_without_restart(&mut self, attempt: u32) {
        let Some(record) = self.ctx.reader.job(&self.job) else { return };
        let task_set = match self.tasks.task_set(attempt) {
            Ok(t) => t,
            Err(e) => return self.fail_job(CheckpointFailureReason::JobFailure, e),
        };
        let metadata = read_retained(&record);
        let recovered = Recovered::from_job(&record, &metadata, recorded_stats(&record));
        let config = self.core_config(&record);
        match CheckpointCoordinatorCore::new(config, task_set, recovered) {
            Ok(core) => self.core = Some(core),
            Err(e) => return self.fail_job(CheckpointFailureReason::JobFailure, e.to_string()),
        }
        let placement: Vec<String> = self.reattached.values().map(|(_, _, l)| l.worker_id.clone()).collect();
        let leases: BTreeMap<String, WorkerLease> =
            self.reattached.values().map(|(_, _, l)| (l.worker_id.clone(), l.clone())).collect();
        let deployed = Deployed {
            attempt,
            leases,
            placement,
            running: BTreeSet::new(),
            finished: BTreeSet::new(),
            loads: BTreeMap::new(),
        };
        self.runtime_leases(&deployed);
        tracing::info!(job = %self.job, attempt, workers = %deployed.workers(), term = self.term.term,
            "all tasks re-attached: continuing without restart");
        let (aborted, notified) = notifications_after_reattach(&record);
        for id in aborted {
            self.command_deployed(
                &deployed,
                Vec::new(),
                ToTask::NotifyCheckpointAborted { checkpoint_id: id },
            );
        }
        if let Some(latest) = notified {
            self.command_deployed(
                &deployed,
                Vec::new(),
                ToTask::NotifyCheckpointComplete { checkpoint_id: latest },
            );
        }
        let all: BTreeSet<usize> = (0..self.tasks.len()).collect();
        let finished: BTreeSet<usize> = self
            .reattached
            .iter()
            .filter(|(_, (_, status, _))| status == "finished")
            .map(|(i, _)| *i)
            .collect();
        for i in &finished {
            let attempt = core_attempt(attempt, *i);
            self.feed(Event::TaskStatusChanged { attempt, status: TaskStatus::Finished });
        }
        self.deployed = Some(Deployed { running: all, finished, ..deployed });
        self.reattached.clear();
        self.phase = Phase::Running;
        self.feed(Event::ResumeScheduler);
    }

    pub(super) fn give_up_reattach(&mut self) {
        tracing::info!(job = %self.job, attached = self.reattached.len(), tasks = self.tasks.len(),
            "not every task re-attached within the grace period: restarting from the latest checkpoint");
        let attached = std::mem::take(&mut self.reattached);
        let mut cancelled = BTreeSet::new();
        for (attempt, _, lease) in attached.into_values() {
            if cancelled.insert((attempt, lease.worker_id.clone())) {
                self.command(&lease, attempt, Vec::new(), ToTask::Cancel);
            }
        }
        self.phase = Phase::Restarting;
        self.restart_at = Some(Instant::now());
        self.restarts += 1;
    }

    /// Tells the runtime which workers' slots the re-attached deployment takes.
    pub(super) fn runtime_leases(&mut self, deployed: &Deployed) {
        let term = self.term.clone();
        let job = self.job.clone();
        let slots = deployed.slots(&self.tasks);
        self.io.spawn(async move { term.adopt_leases(job, slots).await });
    }
}

/// What tasks that re-attached to a new leader are told about the old leader's checkpoints:
/// the ids it allocated but never committed are aborted (they will never complete); the latest
/// committed snapshot, a checkpoint or a newer savepoint (a stop-with-savepoint whose tasks wait
/// for it), is notified complete again, since the old leader may have committed it without
/// telling anyone (notifications are idempotent). Nothing committed is ever aborted.
fn notifications_after_reattach(record: &cairn_raft::model::JobRecord) -> (Vec<u64>, Option<u64>) {
    let committed: BTreeSet<u64> = record
        .completed
        .iter()
        .map(|c| c.id)
        .chain(record.savepoints.iter().map(|s| s.checkpoint.id))
        .collect();
    let latest_checkpoint = record.latest_completed().map_or(0, |c| c.id);
    let last_allocated = record.next_checkpoint_id.saturating_sub(1);
    // Only the most recent ids can still be pending on a task (at most max_concurrent of them).
    let first_open = (latest_checkpoint + 1).max(last_allocated.saturating_sub(63));
    let aborted = (first_open..=last_allocated).filter(|id| !committed.contains(id)).collect();
    (aborted, record.restore_point().map(|c| c.id))
}

#[cfg(test)]
mod tests {
    use cairn_raft::model::{
        CheckpointKind, CompletedCheckpoint, JobId, JobRecord, JobSpec, SavepointRecord,
    };

    use super::notifications_after_reattach;

    fn snapshot(id: u64, kind: CheckpointKind) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id,
            kind,
            trigger_time_ms: 1,
            completion_time_ms: 2,
            metadata_path: format!("/x/{id}/_metadata"),
            metadata_size: 1,
            metadata_crc32: 1,
            state_size: 0,
        }
    }

    #[test]
    fn a_committed_stop_with_savepoint_is_notified_not_aborted() {
        let mut job = JobRecord::new(JobId::new("j").unwrap(), "j".into(), JobSpec::default());
        job.completed.push(snapshot(5, CheckpointKind::Checkpoint));
        job.savepoints.push(SavepointRecord {
            checkpoint: snapshot(7, CheckpointKind::SyncSavepoint),
            path: "/sp/savepoint-j-7-000000000001".into(),
        });
        job.next_checkpoint_id = 9;
        let (aborted, notified) = notifications_after_reattach(&job);
        assert_eq!(aborted, vec![6, 8], "uncommitted ids are aborted, the committed savepoint is not");
        assert_eq!(notified, Some(7), "the stop-with-savepoint completes");
    }

    #[test]
    fn without_snapshots_only_allocated_ids_are_aborted() {
        let mut job = JobRecord::new(JobId::new("j").unwrap(), "j".into(), JobSpec::default());
        job.next_checkpoint_id = 3;
        assert_eq!(notifications_after_reattach(&job), (vec![1, 2], None));
        job.completed.push(snapshot(2, CheckpointKind::Checkpoint));
        assert_eq!(notifications_after_reattach(&job), (vec![], Some(2)));
    }
}
