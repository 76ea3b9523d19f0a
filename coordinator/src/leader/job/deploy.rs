//! (Re)deploying a job: preparation, leasing a worker, sending the deployment, restarts and
//! job status changes.

use super::*;

impl JobDriver {
    pub(super) fn begin_prepare(&mut self) {
        self.phase = Phase::Preparing;
        self.generation += 1;
        let generation = self.generation;
        let ctx = self.ctx.clone();
        let job = self.job.clone();
        self.spawn_internal(async move {
            let result = prepare(ctx, job).await;
            Internal::Prepared { generation, result: Box::new(result) }
        });
    }

    pub(super) fn request_worker(&mut self) {
        let Some(p) = &self.prepared else { return };
        let slots = p.tasks.len() as u32;
        let generation = self.generation;
        let term = self.term.clone();
        let job = self.job.clone();
        self.spawn_internal(async move {
            Internal::Leased { generation, lease: term.acquire_worker(job, slots).await }
        });
    }

    pub(super) fn on_prepared(&mut self, result: Result<Prepared, String>) {
        match result {
            Ok(p) => {
                tracing::info!(job = %self.job, attempt = p.attempt, restore = ?p.restore.as_ref().map(|r| r.checkpoint_id), "deployment prepared");
                self.tasks = p.tasks.clone();
                self.max_allocated = self.max_allocated.max(p.record.next_checkpoint_id.saturating_sub(1));
                self.prepared = Some(p);
                self.phase = Phase::WaitingForWorker;
                self.request_worker();
            }
            Err(e) => {
                // Never fall back to an older checkpoint: report loudly and retry.
                tracing::error!(job = %self.job, error = %e, "cannot prepare the job's deployment; retrying");
                self.phase = Phase::Restarting;
                self.restart_at =
                    Some(Instant::now() + self.options.workers.restart_delay.max(Duration::from_secs(1)));
            }
        }
    }

    pub(super) fn on_leased(&mut self, lease: Option<WorkerLease>) {
        let Some(lease) = lease else {
            if let Some(p) = &self.prepared {
                tracing::info!(job = %self.job, slots = p.tasks.len(), "waiting for a worker with enough free slots");
            }
            return;
        };
        let Some(p) = self.prepared.take() else { return };
        let deployment = Deployment {
            job_id: self.job.to_string(),
            attempt: p.attempt,
            graph: p.record.spec.graph.clone(),
            storage_root: self.storage_root(&p.record),
            restore: p.restore.clone(),
            incremental: self.options.incremental,
        };
        let json = match serde_json::to_vec(&deployment) {
            Ok(j) => j,
            Err(e) => return self.fail_job(CheckpointFailureReason::JobFailure, e.to_string()),
        };
        if lease.outbox.try_send(self.term.leader_message(leader_message::Body::DeployJson(json))).is_err() {
            tracing::warn!(job = %self.job, worker = %lease.worker_id, "cannot reach the worker; trying again");
            self.release_worker();
            self.restart("deployment could not be sent".into());
            return;
        }
        let task_set = match self.tasks.task_set(p.attempt) {
            Ok(t) => t,
            Err(e) => return self.fail_job(CheckpointFailureReason::JobFailure, e),
        };
        match &mut self.core {
            Some(_) => self.feed(Event::TasksRedeployed { tasks: task_set }),
            None => {
                let recovered =
                    Recovered::from_job(&p.record, &p.retained_metadata, recorded_stats(&p.record));
                match CheckpointCoordinatorCore::new(self.core_config(&p.record), task_set, recovered) {
                    Ok(core) => self.core = Some(core),
                    Err(e) => return self.fail_job(CheckpointFailureReason::JobFailure, e.to_string()),
                }
            }
        }
        if let Some((id, external_path)) = p.restored.clone() {
            self.feed(Event::Restored { checkpoint_id: id, external_path });
        }
        tracing::info!(job = %self.job, attempt = p.attempt, worker = %lease.worker_id, "job deployed");
        self.deployed =
            Some(Deployed { attempt: p.attempt, lease, running: BTreeSet::new(), finished: BTreeSet::new() });
        self.phase = Phase::Deploying;
    }

    pub(super) fn storage_root(&self, record: &cairn_raft::model::JobRecord) -> PathBuf {
        record
            .spec
            .checkpoint
            .storage_dir
            .as_ref()
            .map(PathBuf::from)
            .unwrap_or_else(|| self.options.checkpoint_dir.clone())
    }

    pub(super) fn core_config(&self, record: &cairn_raft::model::JobRecord) -> CoreConfig {
        let mut c = CoreConfig::new(
            self.job.clone(),
            record.spec.checkpoint.clone(),
            self.options.checkpoint_dir.clone(),
        );
        c.seed = wall_ms() ^ self.term.term;
        c
    }

    pub(super) fn release_worker(&mut self) {
        let term = self.term.clone();
        let job = self.job.clone();
        self.io.spawn(async move { term.release_worker(job).await });
    }

    /// A task or its worker failed: stop checkpointing, cancel what runs, and redeploy from the
    /// latest completed checkpoint after the restart delay.
    pub(super) fn restart(&mut self, why: String) {
        if matches!(
            self.phase,
            Phase::Finished | Phase::Failed | Phase::Canceled | Phase::Suspended | Phase::Restarting
        ) {
            return;
        }
        tracing::warn!(job = %self.job, reason = %why, "restarting the job from its latest checkpoint");
        self.restarts += 1;
        if self.core.is_some() {
            self.feed(Event::StopScheduler);
        }
        if let Some(d) = self.deployed.take() {
            self.command(&d.lease, d.attempt, Vec::new(), ToTask::Cancel);
            self.release_worker();
        }
        self.prepared = None;
        self.phase = Phase::Restarting;
        self.generation += 1;
        self.restart_at = Some(Instant::now() + self.options.workers.restart_delay);
        self.set_status(JobStatus::Restarting);
    }

    pub(super) fn set_status(&mut self, status: JobStatus) {
        let ctx = self.ctx.clone();
        let job = self.job.clone();
        let current = self.ctx.reader.job(&self.job).map(|r| r.status);
        if current.as_ref() == Some(&status) {
            return;
        }
        self.spawn_internal(async move {
            let r = propose(&ctx, Command::SetJobStatus { job, status: status.clone() }).await;
            Internal::StatusCommitted { status, result: r.map(|_| ()).map_err(|e| e.to_string()) }
        });
    }

    pub(super) fn fail_job(&mut self, reason: CheckpointFailureReason, message: String) {
        tracing::error!(job = %self.job, reason = reason.description(), message = %message, "failing the job");
        if let Some(d) = self.deployed.take() {
            self.command(&d.lease, d.attempt, Vec::new(), ToTask::Cancel);
            self.release_worker();
        }
        self.phase = Phase::Failed;
        self.set_status(JobStatus::Failed { reason: format!("{}: {message}", reason.description()) });
    }
}
