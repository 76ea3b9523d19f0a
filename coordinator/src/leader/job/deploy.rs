//! (Re)deploying a job: preparation, leasing a worker, sending the deployment, restarts through
//! the job's restart strategy, and job status changes.

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
        // Flink's slot sharing: a slot holds one slot-sharing group (one subtask of each vertex).
        let groups = vec![1; p.tasks.groups().len()];
        let strategy = p.record.spec.placement;
        let generation = self.generation;
        let term = self.term.clone();
        let job = self.job.clone();
        self.spawn_internal(async move {
            Internal::Leased { generation, grants: term.acquire_workers(job, groups, strategy).await }
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
                // Never fall back to an older checkpoint: a failure like any other, so the
                // restart strategy paces the retries and gives up when it says so.
                tracing::error!(job = %self.job, error = %e, "cannot prepare the job's deployment");
                self.restart(format!("cannot prepare the deployment: {e}"));
            }
        }
    }

    pub(super) fn on_leased(&mut self, grants: Option<Vec<WorkerGrant>>) {
        let Some(grants) = grants.filter(|g| !g.is_empty()) else {
            if let Some(p) = &self.prepared {
                tracing::info!(job = %self.job, slots = p.tasks.groups().len(), "waiting for workers with enough free slots");
            }
            return;
        };
        let Some(p) = self.prepared.take() else { return };
        // The worker of each task, from the worker of its slot-sharing group.
        let mut group_worker: BTreeMap<usize, &str> = BTreeMap::new();
        for g in &grants {
            for i in &g.groups {
                group_worker.insert(*i, g.lease.worker_id.as_str());
            }
        }
        let mut placement = Vec::with_capacity(p.tasks.len());
        for i in 0..p.tasks.len() {
            match p.tasks.group_of(i).and_then(|g| group_worker.get(&g)) {
                Some(w) => placement.push((*w).to_owned()),
                None => {
                    self.release_worker();
                    return self.fail_job(
                        CheckpointFailureReason::JobFailure,
                        format!("the placement left task {i} without a worker"),
                    );
                }
            }
        }
        let spread = (grants.len() > 1).then(|| DeploymentPlacement {
            subtasks: (0..p.tasks.len())
                .filter_map(|i| p.tasks.get(i).map(|t| (i, t)))
                .map(|(i, t)| PlacedSubtask {
                    vertex: t.vertex.clone(),
                    subtask: t.subtask,
                    worker: placement[i].clone(),
                })
                .collect(),
            addresses: grants.iter().map(|g| (g.lease.worker_id.clone(), g.data_addr.clone())).collect(),
            // 32 random bytes as 64 hex digits, the format of every generated secret.
            exchange_key: cairn_proto::auth::Secret::generate().expose().to_owned(),
        });
        let deployment = Deployment {
            job_id: self.job.to_string(),
            attempt: p.attempt,
            graph: p.record.spec.graph.clone(),
            storage_root: self.storage_root(&p.record),
            restore: p.restore.clone(),
            incremental: self.options.incremental,
            placement: spread,
        };
        let json = match serde_json::to_vec(&deployment) {
            Ok(j) => j,
            Err(e) => return self.fail_job(CheckpointFailureReason::JobFailure, e.to_string()),
        };
        let deployed = Deployed {
            attempt: p.attempt,
            leases: grants.into_iter().map(|g| (g.lease.worker_id.clone(), g.lease)).collect(),
            placement,
            running: BTreeSet::new(),
            finished: BTreeSet::new(),
            loads: BTreeMap::new(),
        };
        let unreachable = deployed
            .leases
            .values()
            .find(|lease| {
                let message = self.term.leader_message(leader_message::Body::DeployJson(json.clone()));
                lease.outbox.try_send(message).is_err()
            })
            .map(|lease| lease.worker_id.clone());
        if let Some(worker) = unreachable {
            tracing::warn!(job = %self.job, worker = %worker, "cannot reach the worker; trying again");
            // Cancels what reached the other workers and releases every lease.
            self.deployed = Some(deployed);
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
        tracing::info!(job = %self.job, attempt = p.attempt, workers = %deployed.workers(), "job deployed");
        self.deployed = Some(deployed);
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

    /// The job failed (a task, its worker, its preparation, or checkpointing past its
    /// tolerance): stop checkpointing, cancel what runs, and let the restart strategy decide
    /// when it is redeployed from its latest completed checkpoint, or whether it fails for good.
    pub(super) fn restart(&mut self, why: String) {
        if matches!(
            self.phase,
            Phase::Finished | Phase::Failed | Phase::Canceled | Phase::Suspended | Phase::Restarting
        ) {
            return;
        }
        tracing::warn!(job = %self.job, reason = %why, "the job failed; its restart strategy decides what follows");
        self.restarts += 1;
        if self.core.is_some() {
            self.feed(Event::StopScheduler);
        }
        if let Some(d) = self.deployed.take() {
            self.command_deployed(&d, Vec::new(), ToTask::Cancel);
            self.release_worker();
        }
        self.prepared = None;
        self.phase = Phase::Restarting;
        self.generation += 1;
        self.restart_at = None;
        self.record_failure(why);
    }

    /// Puts a failure through the restart strategy, in the replicated state (so a new leader
    /// continues the same backoff); the decision comes back as [`Internal::FailureRecorded`].
    pub(super) fn record_failure(&mut self, cause: String) {
        let Some(record) = self.ctx.reader.job(&self.job) else { return };
        let command = Command::RecordFailure {
            job: self.job.clone(),
            at_ms: wall_ms(),
            cause: cause.clone(),
            strategy: record.spec.effective_restart_strategy(self.ctx.default_restart_strategy.as_deref()),
            jitter_permille: rand::Rng::gen_range(&mut rand::thread_rng(), -1000..=1000),
        };
        let (ctx, generation) = (self.ctx.clone(), self.generation);
        self.spawn_internal(async move {
            let result = propose(&ctx, command).await.map(|(outcome, _)| outcome);
            Internal::FailureRecorded { generation, cause, result }
        });
    }

    pub(super) fn on_failure_recorded(&mut self, cause: String, result: Result<Outcome, NodeError>) {
        match result {
            Ok(Outcome::RestartDecided { decision: RestartDecision::Restart { at_ms, delay_ms } }) => {
                tracing::info!(job = %self.job, delay_ms, cause = %cause, "restart granted by the restart strategy");
                let wait = Duration::from_millis(at_ms.saturating_sub(wall_ms()));
                self.restart_at = Some(Instant::now() + wait);
            }
            Ok(Outcome::RestartDecided { decision: RestartDecision::GiveUp { reason } }) => {
                tracing::error!(job = %self.job, reason = %reason, "the restart strategy gave up: the job failed");
                self.phase = Phase::Failed;
                // The status is committed with the decision; apply the retention policy.
                self.feed(Event::Shutdown { job_status: JobStatus::Failed { reason } });
            }
            Err(NodeError::Command(CommandError::JobTerminal { status, .. })) => {
                tracing::info!(job = %self.job, status = %status, "the job ended meanwhile; no restart");
            }
            other => {
                tracing::warn!(job = %self.job, result = ?other, "cannot record the failure; trying again");
                self.failure_retry = Some((Instant::now() + Duration::from_secs(1), cause));
            }
        }
    }

    pub(super) fn set_status(&mut self, status: JobStatus) {
        let ctx = self.ctx.clone();
        let job = self.job.clone();
        let current = self.ctx.reader.job(&self.job).map(|r| r.status.clone());
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
            self.command_deployed(&d, Vec::new(), ToTask::Cancel);
            self.release_worker();
        }
        self.phase = Phase::Failed;
        self.set_status(JobStatus::Failed { reason: format!("{}: {message}", reason.description()) });
    }
}
