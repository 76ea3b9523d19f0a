//! One owner task per job on the leader: deploys the job, keeps it running, restarts it from
//! its latest checkpoint when a task or its worker is lost, and drives the checkpoint
//! coordinator core, carrying out its actions (Raft proposals, messages to tasks, timers,
//! `_metadata` writes, deletions).
//!
//! Phases: `AwaitReattach` (a new leader waits for the tasks deployed under an earlier leader to
//! re-attach; if all of the latest attempt come back, the job continues without a restart) →
//! `Preparing` (read the restore point, allocate an attempt) → `WaitingForWorker` → `Deploying`
//! (until every task reports running) → `Running`; a failure goes to `Restarting` and back to
//! `Preparing`; `Failed`/`Finished` are terminal for this driver; `Stop` suspends it (leadership
//! lost: tasks keep running for the next leader, nothing replicated is touched).
//!
//! Slow work (Raft proposals, file I/O, worker leasing) runs in tasks owned by the driver's
//! `JoinSet`; their results come back through the driver's own input channel as internal events,
//! so the driver's state has exactly one owner.

mod prepare;
pub mod tasks;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_proto::v1::{AttachedTask, GatewayError, LeaderMessage, leader_message};
use cairn_raft::model::{Command, JobId, JobStatus, Outcome};
use cairn_storage::checkpoint::write_metadata;
use cairn_taskrt::protocol::{
    CheckpointKind as TaskCheckpointKind, CheckpointOptions as TaskCheckpointOptions, DeclineReason,
    Deployment, TaskCommand, TaskMessage, TaskStatus as RtTaskStatus, ToTask,
};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Status;

pub use self::prepare::{Prepared, graph_of, read_retained};
use self::prepare::{prepare, remove_paths};
use self::tasks::{GraphTasks, core_attempt, split_attempt};
use super::LeaderOptions;
use super::runtime::{TermHandle, WorkerLease};
use crate::checkpoint::{
    Action, CheckpointCoordinatorCore, CheckpointFailureReason, CheckpointOptions, CoreConfig, Event, Now,
    Recovered, RequestId, StrayAck, TaskAttemptId, TaskStatus, TimerToken, TriggerKind, TriggerSuccess,
};
use crate::error::NodeError;
use crate::node::ReplicaContext;
use crate::services::propose;

/// Answer to a trigger request: where the snapshot went, or why it failed.
pub type TriggerReply = Result<TriggerSuccess, String>;

/// A job driver's state, for status calls.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub job: String,
    pub phase: String,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    pub pending_checkpoints: Vec<u64>,
    /// Restarts of the job's tasks driven by this leader term.
    pub restarts: u64,
}

pub(crate) enum JobInput {
    Attached { lease: WorkerLease, tasks: Vec<AttachedTask> },
    Report { worker_id: String, msg: Box<TaskMessage>, reply: oneshot::Sender<Result<(), Status>> },
    WorkerLost { worker_id: String },
    WorkersChanged,
    GraceEnded,
    Trigger { kind: TriggerKind, reply: oneshot::Sender<TriggerReply> },
    View { reply: oneshot::Sender<JobView> },
    Stop,
    Internal(Internal),
}

pub(crate) enum Internal {
    Core(Event),
    Prepared { generation: u64, result: Box<Result<Prepared, String>> },
    Leased { generation: u64, lease: Option<WorkerLease> },
    StatusCommitted { status: JobStatus, result: Result<(), String> },
}

/// Handle of a job driver.
#[derive(Clone)]
pub(crate) struct JobHandle {
    tx: mpsc::Sender<JobInput>,
}

impl JobHandle {
    pub(crate) async fn send(&self, input: JobInput) {
        let _ = self.tx.send(input).await;
    }

    pub(crate) fn send_now(&self, input: JobInput) {
        let _ = self.tx.try_send(input);
    }

    pub(crate) async fn view(&self) -> Option<JobView> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(JobInput::View { reply: tx }).await.ok()?;
        rx.await.ok()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitReattach,
    Preparing,
    WaitingForWorker,
    Deploying,
    Running,
    Restarting,
    Finished,
    Failed,
    Suspended,
}

struct Deployed {
    attempt: u32,
    lease: WorkerLease,
    /// Indices of the tasks that reported running.
    running: BTreeSet<usize>,
    finished: BTreeSet<usize>,
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn now() -> Now {
    Now::new(Instant::now(), wall_ms())
}

/// Sends `Cancel` to every task of `attempt` of `job` on the leased worker.
pub(crate) async fn send_cancel(term: &TermHandle, lease: &WorkerLease, job: &str, attempt: u32) {
    let cmd = TaskCommand { job_id: job.to_owned(), attempt, tasks: Vec::new(), body: ToTask::Cancel };
    if let Ok(json) = serde_json::to_vec(&cmd) {
        let _ = lease.outbox.try_send(term.leader_message(leader_message::Body::CommandJson(json)));
    }
}

pub(crate) struct JobDriver {
    ctx: ReplicaContext,
    options: Arc<LeaderOptions>,
    term: TermHandle,
    job: JobId,
    rx: mpsc::Receiver<JobInput>,
    self_tx: mpsc::Sender<JobInput>,
    phase: Phase,
    tasks: GraphTasks,
    core: Option<CheckpointCoordinatorCore>,
    deployed: Option<Deployed>,
    /// Prepared deployment waiting for a worker.
    prepared: Option<Prepared>,
    /// Tasks re-attached after a leader change, by subtask index: (attempt, status, worker).
    reattached: BTreeMap<usize, (u32, String, WorkerLease)>,
    trigger_timer: Option<(Instant, TimerToken)>,
    timeouts: BTreeMap<u64, Instant>,
    restart_at: Option<Instant>,
    /// Ignores results of superseded preparations.
    generation: u64,
    requests: BTreeMap<RequestId, oneshot::Sender<TriggerReply>>,
    next_request: u64,
    /// Highest checkpoint id allocated for this job (acks above it are refused).
    max_allocated: u64,
    /// (checkpoint, attempt) acknowledged recently: tells duplicates apart.
    acked: BTreeSet<(u64, TaskAttemptId)>,
    restarts: u64,
    /// Counts last recorded through Raft, and when (statistics survive a leader change).
    recorded_counts: Option<crate::checkpoint::stats::CheckpointCounts>,
    recorded_at: Option<Instant>,
    io: JoinSet<()>,
}

/// The statistics summary a previous leader recorded, if it decodes.
fn recorded_stats(record: &cairn_raft::model::JobRecord) -> Option<crate::checkpoint::StatsSummary> {
    let value = record.stats.clone()?;
    match serde_json::from_value(value) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(job = %record.id, error = %e, "recorded checkpoint statistics do not decode; starting from the replicated counts");
            None
        }
    }
}

/// How often, at most, the statistics summary is written through Raft.
const STATS_RECORD_INTERVAL: Duration = Duration::from_secs(1);

impl JobDriver {
    pub(crate) fn new(
        ctx: ReplicaContext,
        options: Arc<LeaderOptions>,
        term: TermHandle,
        job: JobId,
        reattach: bool,
    ) -> (Self, JobHandle) {
        let (tx, rx) = mpsc::channel(1024);
        let driver = Self {
            ctx,
            options,
            term,
            job,
            rx,
            self_tx: tx.clone(),
            phase: if reattach { Phase::AwaitReattach } else { Phase::Preparing },
            tasks: GraphTasks::default(),
            core: None,
            deployed: None,
            prepared: None,
            reattached: BTreeMap::new(),
            trigger_timer: None,
            timeouts: BTreeMap::new(),
            restart_at: None,
            generation: 0,
            requests: BTreeMap::new(),
            next_request: 1,
            max_allocated: 0,
            acked: BTreeSet::new(),
            restarts: 0,
            recorded_counts: None,
            recorded_at: None,
            io: JoinSet::new(),
        };
        (driver, JobHandle { tx })
    }

    pub(crate) async fn run(mut self) -> JobId {
        self.start();
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                biased;
                input = self.rx.recv() => match input {
                    Some(JobInput::Stop) | None => break,
                    Some(input) => self.on_input(input).await,
                },
                Some(_) = self.io.join_next(), if !self.io.is_empty() => {}
                _ = sleep_until(deadline) => self.on_deadline(),
            }
            if matches!(self.phase, Phase::Finished | Phase::Failed)
                && self.io.is_empty()
                && self.requests.is_empty()
            {
                break;
            }
        }
        self.suspend();
        // Let in-flight I/O (e.g. a commit) finish or fail on its own; it cannot touch this driver.
        self.io.detach_all();
        self.job
    }

    fn start(&mut self) {
        let Some(record) = self.ctx.reader.job(&self.job) else {
            self.phase = Phase::Failed;
            return;
        };
        self.max_allocated = record.next_checkpoint_id.saturating_sub(1);
        match graph_of(&record, &cairn_taskrt::registry::OperatorRegistry::with_builtins()) {
            Ok((_, tasks)) => self.tasks = tasks,
            Err(e) => {
                self.fail_job(CheckpointFailureReason::JobFailure, e);
                return;
            }
        }
        // Only a running job has tasks to re-attach; one that never ran, or was restarting
        // under the previous leader, is (re)deployed at once.
        if self.phase == Phase::AwaitReattach && (record.attempts == 0 || record.status != JobStatus::Running)
        {
            self.phase = Phase::Preparing;
        }
        if self.phase == Phase::Preparing {
            self.begin_prepare();
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        [self.trigger_timer.map(|(at, _)| at), self.timeouts.values().min().copied(), self.restart_at]
            .into_iter()
            .flatten()
            .min()
    }

    fn on_deadline(&mut self) {
        let t = Instant::now();
        if let Some((at, token)) = self.trigger_timer
            && at <= t
        {
            self.trigger_timer = None;
            self.feed(Event::TriggerTimerFired { token });
        }
        let expired: Vec<u64> = self.timeouts.iter().filter(|(_, at)| **at <= t).map(|(id, _)| *id).collect();
        for id in expired {
            self.timeouts.remove(&id);
            self.feed(Event::CheckpointTimeout { checkpoint_id: id });
        }
        if let Some(at) = self.restart_at
            && at <= t
        {
            self.restart_at = None;
            if self.core.as_ref().is_some_and(|c| c.has_commit_in_flight()) {
                // Choose the restore point only once the outcome of an in-flight commit is known.
                self.restart_at = Some(t + Duration::from_millis(50));
            } else if self.phase == Phase::Restarting {
                self.begin_prepare();
            }
        }
    }

    fn spawn_internal<F>(&mut self, fut: F)
    where
        F: std::future::Future<Output = Internal> + Send + 'static,
    {
        let tx = self.self_tx.clone();
        self.io.spawn(async move {
            let ev = fut.await;
            let _ = tx.send(JobInput::Internal(ev)).await;
        });
    }

    async fn on_input(&mut self, input: JobInput) {
        match input {
            JobInput::Stop => {}
            JobInput::Attached { lease, tasks } => self.on_attached(lease, tasks),
            JobInput::Report { worker_id, msg, reply } => {
                let r = self.on_report(&worker_id, *msg);
                let _ = reply.send(r);
            }
            JobInput::WorkerLost { worker_id } => {
                if self.deployed.as_ref().is_some_and(|d| d.lease.worker_id == worker_id) {
                    self.deployed = None;
                    self.restart(format!("worker {worker_id} was lost"));
                }
            }
            JobInput::WorkersChanged => {
                if self.phase == Phase::WaitingForWorker {
                    self.request_worker();
                }
            }
            JobInput::GraceEnded => {
                if self.phase == Phase::AwaitReattach {
                    self.give_up_reattach();
                }
            }
            JobInput::Trigger { kind, reply } => self.on_trigger(kind, reply),
            JobInput::View { reply } => {
                let _ = reply.send(self.view());
            }
            JobInput::Internal(i) => self.on_internal(i),
        }
    }

    fn view(&self) -> JobView {
        JobView {
            job: self.job.to_string(),
            phase: format!("{:?}", self.phase).to_lowercase(),
            attempt: self.deployed.as_ref().map(|d| d.attempt),
            worker: self.deployed.as_ref().map(|d| d.lease.worker_id.clone()),
            pending_checkpoints: self.core.as_ref().map(|c| c.pending_ids()).unwrap_or_default(),
            restarts: self.restarts,
        }
    }

    // ---- re-attach after a leader change -------------------------------------------------

    fn on_attached(&mut self, lease: WorkerLease, attached: Vec<AttachedTask>) {
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
                let complete = self.reattached.len() == self.tasks.len()
                    && self.reattached.values().all(|(a, status, l)| {
                        *a == latest_attempt && status == "running" && l.worker_id == lease.worker_id
                    });
                if complete {
                    self.resume_without_restart(latest_attempt, lease);
                }
            }
            _ => {
                // The worker reconnected: keep our deployment if these are its tasks; cancel
                // tasks of any other attempt.
                let mut stale = BTreeSet::new();
                for t in &attached {
                    match &mut self.deployed {
                        Some(d) if d.attempt == t.attempt as u32 && d.lease.worker_id == lease.worker_id => {
                            d.lease = lease.clone();
                        }
                        _ => {
                            stale.insert(t.attempt as u32);
                        }
                    }
                }
                for attempt in stale {
                    tracing::info!(job = %self.job, attempt, worker = %lease.worker_id, "cancelling tasks of a superseded attempt");
                    self.command(&lease, attempt, Vec::new(), ToTask::Cancel);
                }
            }
        }
    }

    /// Every task of the latest attempt re-attached to this leader: continue without restarting.
    fn resume_without_restart(&mut self, attempt: u32, lease: WorkerLease) {
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
        self.runtime_lease(&lease);
        tracing::info!(job = %self.job, attempt, worker = %lease.worker_id, term = self.term.term,
            "all tasks re-attached: continuing without restart");
        // Pending checkpoints of the old leader will never complete: abort them on the tasks. The
        // latest completed one may not have been notified: notify it again (idempotent).
        let latest = record.latest_completed().map(|c| c.id).unwrap_or(0);
        let first_open = latest + 1;
        let last_allocated = record.next_checkpoint_id.saturating_sub(1);
        for id in first_open.max(last_allocated.saturating_sub(63))..=last_allocated {
            self.command(&lease, attempt, Vec::new(), ToTask::NotifyCheckpointAborted { checkpoint_id: id });
        }
        if latest > 0 {
            self.command(
                &lease,
                attempt,
                Vec::new(),
                ToTask::NotifyCheckpointComplete { checkpoint_id: latest },
            );
        }
        let all: BTreeSet<usize> = (0..self.tasks.len()).collect();
        self.deployed = Some(Deployed { attempt, lease, running: all, finished: BTreeSet::new() });
        self.reattached.clear();
        self.phase = Phase::Running;
        self.feed(Event::StartScheduler);
    }

    fn give_up_reattach(&mut self) {
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

    fn runtime_lease(&mut self, lease: &WorkerLease) {
        let term = self.term.clone();
        let job = self.job.clone();
        let slots = self.tasks.len() as u32;
        let worker = lease.worker_id.clone();
        self.io.spawn(async move { term.adopt_lease(job, worker, slots).await });
    }

    // ---- deployment ------------------------------------------------------------------------

    fn begin_prepare(&mut self) {
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

    fn request_worker(&mut self) {
        let Some(p) = &self.prepared else { return };
        let slots = p.tasks.len() as u32;
        let generation = self.generation;
        let term = self.term.clone();
        let job = self.job.clone();
        self.spawn_internal(async move {
            Internal::Leased { generation, lease: term.acquire_worker(job, slots).await }
        });
    }

    fn on_prepared(&mut self, result: Result<Prepared, String>) {
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

    fn on_leased(&mut self, lease: Option<WorkerLease>) {
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

    fn storage_root(&self, record: &cairn_raft::model::JobRecord) -> PathBuf {
        record
            .spec
            .checkpoint
            .storage_dir
            .as_ref()
            .map(PathBuf::from)
            .unwrap_or_else(|| self.options.checkpoint_dir.clone())
    }

    fn core_config(&self, record: &cairn_raft::model::JobRecord) -> CoreConfig {
        let mut c = CoreConfig::new(
            self.job.clone(),
            record.spec.checkpoint.clone(),
            self.options.checkpoint_dir.clone(),
        );
        c.seed = wall_ms() ^ self.term.term;
        c
    }

    fn release_worker(&mut self) {
        let term = self.term.clone();
        let job = self.job.clone();
        self.io.spawn(async move { term.release_worker(job).await });
    }

    /// A task or its worker failed: stop checkpointing, cancel what runs, and redeploy from the
    /// latest completed checkpoint after the restart delay.
    fn restart(&mut self, why: String) {
        if matches!(self.phase, Phase::Finished | Phase::Failed | Phase::Suspended | Phase::Restarting) {
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

    fn set_status(&mut self, status: JobStatus) {
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

    fn fail_job(&mut self, reason: CheckpointFailureReason, message: String) {
        tracing::error!(job = %self.job, reason = reason.description(), message = %message, "failing the job");
        if let Some(d) = self.deployed.take() {
            self.command(&d.lease, d.attempt, Vec::new(), ToTask::Cancel);
            self.release_worker();
        }
        self.phase = Phase::Failed;
        self.set_status(JobStatus::Failed { reason: format!("{}: {message}", reason.description()) });
    }

    // ---- messages to tasks -----------------------------------------------------------------

    fn command(&self, lease: &WorkerLease, attempt: u32, tasks: Vec<(String, u32)>, body: ToTask) {
        let cmd = TaskCommand { job_id: self.job.to_string(), attempt, tasks, body };
        match serde_json::to_vec(&cmd) {
            Ok(json) => {
                if lease
                    .outbox
                    .try_send(self.term.leader_message(leader_message::Body::CommandJson(json)))
                    .is_err()
                {
                    tracing::warn!(job = %self.job, worker = %lease.worker_id, "worker outbox full or closed: command dropped");
                }
            }
            Err(e) => tracing::error!(job = %self.job, error = %e, "cannot encode a task command"),
        }
    }

    /// Sends `body` to the given core attempts (all of the current deployment).
    fn to_tasks(&self, attempts: &[TaskAttemptId], body: ToTask) {
        let Some(d) = &self.deployed else { return };
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
            return;
        }
        if addressed.len() == self.tasks.len() {
            addressed.clear();
        }
        self.command(&d.lease, d.attempt, addressed, body);
    }

    // ---- reports from tasks ----------------------------------------------------------------

    fn on_report(&mut self, worker_id: &str, msg: TaskMessage) -> Result<(), Status> {
        let task = msg.task().clone();
        let index = self.tasks.index_of(&task.task.vertex, task.task.subtask).ok_or_else(|| {
            Status::not_found(format!(
                "job `{}` has no task {}/{}",
                self.job, task.task.vertex, task.task.subtask
            ))
        })?;
        let attempt = core_attempt(task.attempt, index);
        let current = self.deployed.as_ref().filter(|d| d.lease.worker_id == worker_id).map(|d| d.attempt);
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
                let floor = self.max_allocated.saturating_sub(256);
                self.acked.retain(|(id, _)| *id >= floor);
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

    fn on_task_status(&mut self, index: usize, attempt: TaskAttemptId, status: RtTaskStatus) {
        let core_status = match &status {
            RtTaskStatus::Running => TaskStatus::Running,
            RtTaskStatus::Finished => TaskStatus::Finished,
            RtTaskStatus::Failed(_) | RtTaskStatus::Canceled => TaskStatus::Failed,
            RtTaskStatus::Created | RtTaskStatus::Restoring | RtTaskStatus::Finishing => {
                TaskStatus::NotRunning
            }
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

    // ---- manual triggers -------------------------------------------------------------------

    fn on_trigger(&mut self, kind: TriggerKind, reply: oneshot::Sender<TriggerReply>) {
        if self.phase != Phase::Running || self.core.is_none() {
            let _ = reply.send(Err(format!("job `{}` is not running (it is {:?})", self.job, self.phase)));
            return;
        }
        let request = RequestId(self.next_request);
        self.next_request += 1;
        self.requests.insert(request, reply);
        self.feed(Event::TriggerRequested { request, kind });
    }

    // ---- the core --------------------------------------------------------------------------

    fn feed(&mut self, event: Event) {
        let actions = self.feed_collect(event);
        self.execute_all(actions);
        self.record_stats();
    }

    /// Writes the statistics summary through Raft when the counts changed, at most once per
    /// [`STATS_RECORD_INTERVAL`].
    fn record_stats(&mut self) {
        let Some(core) = &self.core else { return };
        let summary = core.stats_summary();
        if self.recorded_counts == Some(summary.counts)
            || self.recorded_at.is_some_and(|t| t.elapsed() < STATS_RECORD_INTERVAL)
        {
            return;
        }
        let Ok(stats) = serde_json::to_value(&summary) else { return };
        self.recorded_counts = Some(summary.counts);
        self.recorded_at = Some(Instant::now());
        let ctx = self.ctx.clone();
        let job = self.job.clone();
        self.io.spawn(async move {
            if let Err(e) = propose(&ctx, Command::RecordStats { job: job.clone(), stats }).await {
                tracing::debug!(job = %job, error = %e, "checkpoint statistics not recorded");
            }
        });
    }

    fn feed_collect(&mut self, event: Event) -> Vec<Action> {
        match &mut self.core {
            Some(core) => core.handle(now(), event),
            None => Vec::new(),
        }
    }

    fn execute_all(&mut self, actions: Vec<Action>) {
        for a in actions {
            self.execute(a);
        }
    }

    fn on_internal(&mut self, internal: Internal) {
        if self.phase == Phase::Suspended {
            return;
        }
        match internal {
            Internal::Core(event) => {
                if let Event::CheckpointIdAllocated { checkpoint_id, .. } = &event {
                    self.max_allocated = self.max_allocated.max(*checkpoint_id);
                }
                match &event {
                    Event::CompletionCommitted { checkpoint_id, .. } => {
                        tracing::info!(job = %self.job, checkpoint = checkpoint_id, term = self.term.term, "checkpoint completed")
                    }
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
            }
            Internal::Prepared { generation, result } => {
                if generation == self.generation && self.phase == Phase::Preparing {
                    self.on_prepared(*result);
                }
            }
            Internal::Leased { generation, lease } => {
                if generation == self.generation && self.phase == Phase::WaitingForWorker {
                    self.on_leased(lease);
                } else if lease.is_some() {
                    self.release_worker();
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

    fn execute(&mut self, action: Action) {
        match action {
            Action::AllocateCheckpointId { token } => {
                let ctx = self.ctx.clone();
                let job = self.job.clone();
                self.spawn_internal(async move {
                    Internal::Core(match propose(&ctx, Command::AllocateCheckpointId { job }).await {
                        Ok((Outcome::CheckpointId { id }, _)) => {
                            Event::CheckpointIdAllocated { token, checkpoint_id: id }
                        }
                        Ok((other, _)) => Event::CheckpointIdAllocationFailed {
                            token,
                            error: format!("unexpected outcome {other:?}"),
                        },
                        Err(e) => Event::CheckpointIdAllocationFailed { token, error: e.to_string() },
                    })
                });
            }
            Action::TriggerTasks { checkpoint_id, timestamp_ms, options, tasks } => {
                self.to_tasks(
                    &tasks,
                    ToTask::TriggerCheckpoint {
                        checkpoint_id,
                        timestamp_ms,
                        options: task_options(&options),
                    },
                );
            }
            Action::ScheduleTrigger { at, token } => self.trigger_timer = Some((at, token)),
            Action::CancelTrigger => self.trigger_timer = None,
            Action::ScheduleTimeout { checkpoint_id, at } => {
                self.timeouts.insert(checkpoint_id, at);
            }
            Action::WriteMetadata { checkpoint_id, path, metadata } => {
                self.spawn_internal(async move {
                    let r = tokio::task::spawn_blocking(move || write_metadata(&path, &metadata)).await;
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
                self.io.spawn(async move {
                    let _ = tokio::task::spawn_blocking(move || remove_paths(&dirs, &files)).await;
                });
            }
            Action::DiscardJobCheckpoints { dirs, .. } => {
                self.io.spawn(async move {
                    let _ = tokio::task::spawn_blocking(move || remove_paths(&dirs, &[])).await;
                });
            }
            Action::DiscardAckedState { files, .. } => {
                self.io.spawn(async move {
                    let _ = tokio::task::spawn_blocking(move || remove_paths(&[], &files)).await;
                });
            }
            Action::FailJob { reason, message } => self.fail_job(reason, message),
            Action::TriggerAccepted { request, checkpoint_id } => {
                tracing::info!(job = %self.job, request = request.0, checkpoint = checkpoint_id, "trigger accepted");
            }
            Action::AnswerTrigger { request, result } => {
                if let Some(reply) = self.requests.remove(&request) {
                    let _ = reply.send(result.map_err(|e| e.to_string()));
                }
            }
            Action::StatsChanged { .. } => {}
        }
    }

    /// Leadership lost (or the driver ends): drop in-memory pending checkpoints; tasks keep
    /// running for the next leader; nothing replicated is touched.
    fn suspend(&mut self) {
        if self.core.is_some() && !matches!(self.phase, Phase::Finished | Phase::Failed) {
            self.feed(Event::LeadershipLost);
        }
        self.phase = Phase::Suspended;
        for (_, reply) in std::mem::take(&mut self.requests) {
            let _ = reply.send(Err(
                "leadership lost; the request's outcome is unknown: check the job on the new leader".into(),
            ));
        }
    }
}

fn task_options(o: &CheckpointOptions) -> TaskCheckpointOptions {
    use cairn_raft::model::CheckpointKind as K;
    let kind = match o.kind {
        K::Checkpoint => TaskCheckpointKind::Checkpoint,
        K::Savepoint => TaskCheckpointKind::Savepoint,
        K::SyncSavepoint => TaskCheckpointKind::SyncSavepoint,
    };
    let target_location = (kind != TaskCheckpointKind::Checkpoint).then(|| o.base_dir.clone());
    TaskCheckpointOptions { kind, drain: o.drain, target_location }
}

fn decline_reason(r: &DeclineReason) -> (CheckpointFailureReason, Option<String>) {
    use CheckpointFailureReason as R;
    match r {
        DeclineReason::TaskNotReady => (R::CheckpointDeclinedTaskNotReady, None),
        DeclineReason::NotASource => (R::CheckpointDeclined, Some(r.to_string())),
        DeclineReason::Subsumed { .. } => (R::CheckpointDeclinedSubsumed, Some(r.to_string())),
        DeclineReason::CanceledUpstream => (R::CheckpointDeclinedOnCancellationBarrier, None),
        DeclineReason::AbortedByCoordinator => (R::CheckpointDeclined, Some(r.to_string())),
        DeclineReason::SnapshotFailed(e) => (R::CheckpointAsyncException, Some(e.clone())),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A refusal of a worker message, sent back on its stream.
pub fn gateway_error(status: &Status) -> GatewayError {
    GatewayError { code: status.code() as i32, message: status.message().to_owned() }
}

/// A leader message carrying an error.
pub fn error_message(term: u64, status: &Status) -> LeaderMessage {
    LeaderMessage { term, body: Some(leader_message::Body::Error(gateway_error(status))) }
}
