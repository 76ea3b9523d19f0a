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
//!
//! | module | owns |
//! | --- | --- |
//! | this file | the driver's state, its loop, timers and inputs |
//! | `deploy` | preparation, worker leases, deployments, restarts, job status |
//! | `reattach` | tasks re-attaching after a leader change |
//! | `reports` | task reports and trigger requests |
//! | [`load`] | busy, idle and back-pressured time per second of each subtask (not replicated) |
//! | `effects` | feeding the core and carrying out its actions |
//! | `operator` | operator requests: triggers answered when started, cancel, configuration changes |
//! | `export` | publishing the job's checkpoint figures to the replica's metrics |
//! | `prepare` | reading the restore point and allocating an attempt |
//! | `spares` | discarded checkpoint directories kept and reused for new checkpoints |
//! | `claim` | taking over (and removing) the snapshot a `claim`-mode job restored from |
//! | [`tasks`] | the graph's subtasks and the attempt-id mapping |

mod claim;
mod deploy;
mod effects;
mod export;
mod ids;
pub mod load;
mod operator;
mod prepare;
mod reattach;
mod reports;
mod spares;
pub mod tasks;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_proto::v1::{AttachedTask, GatewayError, LeaderMessage, leader_message};
use cairn_protocol::checkpoint::CheckpointKind;
use cairn_protocol::messages::{
    CheckpointOptions as TaskCheckpointOptions, DeclineReason, Deployment, DeploymentPlacement,
    PlacedSubtask, TaskCommand, TaskMessage, TaskStatus as RtTaskStatus, ToTask,
};
use cairn_protocol::restart::RestartDecision;
use cairn_raft::model::{Command, CommandError, JobId, JobStatus, Outcome};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Status;

pub use self::prepare::{Prepared, graph_of, read_retained};
use self::prepare::{prepare, remove_paths};
use self::tasks::{GraphTasks, core_attempt, split_attempt};
use super::LeaderOptions;
pub use super::api::{JobSummary, JobView, StartRefusal, StartedReply, TaskView, TriggerKey, TriggerReply};
use super::handle::{ReportInput, TermHandle, WorkerGrant, WorkerLease};
use crate::checkpoint::{
    Action, CheckpointCoordinatorCore, CheckpointFailureReason, CheckpointOptions, CoreConfig, Event, Now,
    Recovered, RequestId, StrayAck, TaskAttemptId, TaskStatus, TimerToken, TriggerKind, TriggerSuccess,
};
use crate::error::NodeError;
use crate::replica::ReplicaContext;
use crate::replica::propose;

/// A keyed manual trigger in flight.
struct Keyed {
    fingerprint: u64,
    request: RequestId,
    /// Further callers with the same request id.
    waiters: Vec<oneshot::Sender<StartedReply>>,
}

pub(crate) enum JobInput {
    Attached {
        lease: WorkerLease,
        tasks: Vec<AttachedTask>,
    },
    WorkerLost {
        worker_id: String,
    },
    WorkersChanged,
    GraceEnded,
    Trigger {
        kind: TriggerKind,
        reply: oneshot::Sender<TriggerReply>,
    },
    /// A trigger answered as soon as its checkpoint id is allocated (and, with a key, recorded).
    TriggerStarted {
        kind: TriggerKind,
        key: Option<TriggerKey>,
        started: oneshot::Sender<StartedReply>,
    },
    /// The job's `canceled` status is committed: cancel its tasks and end the driver.
    Cancel {
        reply: oneshot::Sender<()>,
    },
    /// A new checkpoint configuration is committed: apply it now.
    ConfigChanged {
        subsumed: Vec<cairn_raft::model::CompletedCheckpoint>,
    },
    View {
        reply: oneshot::Sender<JobView>,
    },
    Summary {
        reply: oneshot::Sender<JobSummary>,
    },
    Stop,
    Internal(Internal),
}

pub(crate) enum Internal {
    Core(Event),
    Prepared {
        generation: u64,
        result: Box<Result<Prepared, String>>,
    },
    Leased {
        generation: u64,
        grants: Option<Vec<WorkerGrant>>,
    },
    StatusCommitted {
        status: JobStatus,
        result: Result<(), String>,
    },
    /// A trigger could not reach the worker: abort what is pending and re-arm the timer.
    Resync {
        checkpoint_id: u64,
    },
    /// The checkpoint id of a keyed trigger was recorded through Raft (or not).
    RequestRecorded {
        request_id: String,
        result: StartedReply,
    },
    /// A range of checkpoint ids was reserved through Raft (or not).
    IdsReserved {
        generation: u64,
        result: Result<(u64, u32), String>,
    },
    /// A failure went through the restart strategy (`RecordFailure` committed, or not).
    FailureRecorded {
        generation: u64,
        cause: String,
        result: Result<Outcome, NodeError>,
    },
}

/// Handle of a job driver.
#[derive(Clone)]
pub(crate) struct JobHandle {
    tx: mpsc::Sender<JobInput>,
    /// The driver's report queue, which the stream readers reach through the runtime's routes.
    pub(crate) reports: mpsc::Sender<ReportInput>,
}

impl JobHandle {
    pub(crate) async fn send(&self, input: JobInput) {
        let _ = self.tx.send(input).await;
    }

    pub(crate) fn send_now(&self, input: JobInput) {
        let _ = self.tx.try_send(input);
    }

    pub(crate) async fn view(&self) -> Option<JobView> {
        self.ask(|reply| JobInput::View { reply }).await
    }

    pub(crate) async fn summary(&self) -> Option<JobSummary> {
        self.ask(|reply| JobInput::Summary { reply }).await
    }

    /// Sends the input `make` builds around a reply channel and waits for the answer; `None`
    /// when the driver has ended.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> JobInput) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.ok()?;
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
    /// Canceled by an operator (the status is committed first); the driver ends.
    Canceled,
    Suspended,
}

struct Deployed {
    attempt: u32,
    /// The deployment's workers, by id.
    leases: BTreeMap<String, WorkerLease>,
    /// The worker of each task, by task index.
    placement: Vec<String>,
    /// Indices of the tasks that reported running.
    running: BTreeSet<usize>,
    finished: BTreeSet<usize>,
    /// Recent time figures of each task (by index) from its worker: they go with the attempt.
    loads: BTreeMap<usize, load::LoadWindow>,
}

impl Deployed {
    fn worker_of(&self, index: usize) -> Option<&str> {
        self.placement.get(index).map(String::as_str)
    }

    fn runs_on(&self, worker_id: &str) -> bool {
        self.leases.contains_key(worker_id)
    }

    /// The workers' ids, comma-separated.
    fn workers(&self) -> String {
        self.leases.keys().cloned().collect::<Vec<_>>().join(",")
    }

    /// Slots taken on each worker: one per slot-sharing group it runs.
    fn slots(&self, tasks: &GraphTasks) -> Vec<(String, u32)> {
        let mut groups: BTreeMap<&str, std::collections::BTreeSet<usize>> = BTreeMap::new();
        for (index, w) in self.placement.iter().enumerate() {
            groups.entry(w).or_default().insert(tasks.group_of(index).unwrap_or(index));
        }
        groups.into_iter().map(|(w, g)| (w.to_owned(), g.len() as u32)).collect()
    }
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
    /// Workers' reports, straight from their streams.
    reports: mpsc::Receiver<ReportInput>,
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
    /// A failure whose recording through Raft failed, and when to try again.
    failure_retry: Option<(Instant, String)>,
    /// When the statistics summary, changed but not yet recorded (throttled), is written.
    stats_flush_at: Option<Instant>,
    /// This term already took over the snapshot a `claim`-mode restore came from.
    claim_released: bool,
    /// Ignores results of superseded preparations.
    generation: u64,
    /// Checkpoint ids reserved through Raft, handed out without a round trip.
    ids: ids::IdReservation,
    requests: BTreeMap<RequestId, oneshot::Sender<TriggerReply>>,
    /// Callers waiting only for the checkpoint id of their request.
    started: BTreeMap<RequestId, oneshot::Sender<StartedReply>>,
    /// Keyed triggers in flight, by request id, until their checkpoint id is recorded.
    keyed: BTreeMap<String, Keyed>,
    next_request: u64,
    /// Highest checkpoint id allocated for this job (acks above it are refused).
    max_allocated: u64,
    /// (checkpoint, attempt) acknowledged recently: tells duplicates apart.
    acked: BTreeSet<(u64, TaskAttemptId)>,
    restarts: u64,
    /// Counts (and consecutive failures) last recorded through Raft, and when (statistics
    /// survive a leader change).
    recorded_counts: Option<(crate::checkpoint::stats::CheckpointCounts, u32)>,
    recorded_at: Option<Instant>,
    io: JoinSet<()>,
    /// Discarded checkpoint directories kept for reuse (see `spares`).
    spares: Arc<spares::Spares>,
    /// The job's series on `/metrics`; dropping the driver removes them.
    series: crate::metrics::JobSeries,
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
/// Reports queued for a driver; a stream reader waits for room beyond this (only the workers
/// running this job wait).
const REPORT_QUEUE: usize = 1024;

impl JobDriver {
    pub(crate) fn new(
        ctx: ReplicaContext,
        options: Arc<LeaderOptions>,
        term: TermHandle,
        job: JobId,
        reattach: bool,
    ) -> (Self, JobHandle) {
        let (tx, rx) = mpsc::channel(1024);
        let (reports_tx, reports) = mpsc::channel(REPORT_QUEUE);
        let series = ctx.telemetry.job(&job.to_string());
        let driver = Self {
            ctx,
            options,
            term,
            job,
            rx,
            reports,
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
            failure_retry: None,
            stats_flush_at: None,
            claim_released: false,
            generation: 0,
            ids: ids::IdReservation::default(),
            requests: BTreeMap::new(),
            started: BTreeMap::new(),
            keyed: BTreeMap::new(),
            next_request: 1,
            max_allocated: 0,
            acked: BTreeSet::new(),
            restarts: 0,
            recorded_counts: None,
            recorded_at: None,
            io: JoinSet::new(),
            spares: Arc::default(),
            series,
        };
        (driver, JobHandle { tx, reports: reports_tx })
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
                // After the inputs: a worker's `Attached` (queued before its stream reads a
                // report) is handled before the reports that follow it.
                Some(input) = self.reports.recv() => match input {
                    ReportInput::Tasks { worker_id, msgs, reply } => {
                        let refusals = msgs.into_iter().filter_map(|m| self.on_report(&worker_id, m).err()).collect();
                        let _ = reply.send(refusals);
                    }
                    ReportInput::Times { worker_id, times, at } => self.on_times(&worker_id, &times, at),
                },
                Some(_) = self.io.join_next(), if !self.io.is_empty() => {}
                _ = sleep_until(deadline) => self.on_deadline(),
            }
            if matches!(self.phase, Phase::Finished | Phase::Failed | Phase::Canceled)
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
        self.seed_metrics(&record);
        match graph_of(&record, &cairn_protocol::operators::OperatorCatalog::builtin()) {
            Ok((_, tasks)) => self.tasks = tasks,
            Err(e) => {
                self.fail_job(CheckpointFailureReason::JobFailure, e);
                return;
            }
        }
        // Only a running job has tasks to re-attach; one that never ran, or was restarting
        // under the previous leader, is (re)deployed: at once, or when the backoff its restart
        // strategy granted (replicated with the job) is over.
        if self.phase == Phase::AwaitReattach && (record.attempts == 0 || record.status != JobStatus::Running)
        {
            self.phase = Phase::Preparing;
        }
        if self.phase == Phase::Preparing
            && record.status == JobStatus::Restarting
            && let Some(at_ms) = record.restart.next_restart_ms
            && at_ms > wall_ms()
        {
            let wait = Duration::from_millis(at_ms - wall_ms());
            tracing::info!(job = %self.job, wait = ?wait, "continuing the restart backoff of the previous leader");
            self.phase = Phase::Restarting;
            self.restart_at = Some(Instant::now() + wait);
            return;
        }
        if self.phase == Phase::Preparing {
            self.begin_prepare();
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        [
            self.trigger_timer.map(|(at, _)| at),
            self.timeouts.values().min().copied(),
            self.restart_at,
            self.failure_retry.as_ref().map(|(at, _)| *at),
            self.stats_flush_at,
        ]
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
        if self.failure_retry.as_ref().is_some_and(|(at, _)| *at <= t)
            && let Some((_, cause)) = self.failure_retry.take()
        {
            self.record_failure(cause);
        }
        if self.stats_flush_at.is_some_and(|at| at <= t) {
            self.stats_flush_at = None;
            self.record_stats();
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
            JobInput::WorkerLost { worker_id } => {
                if self.deployed.as_ref().is_some_and(|d| d.runs_on(&worker_id)) {
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
            JobInput::TriggerStarted { kind, key, started } => self.on_trigger_started(kind, key, started),
            JobInput::Cancel { reply } => {
                self.cancel();
                let _ = reply.send(());
            }
            JobInput::ConfigChanged { subsumed } => self.config_changed(&subsumed),
            JobInput::View { reply } => {
                let _ = reply.send(self.view());
            }
            JobInput::Summary { reply } => {
                let _ = reply.send(self.summary());
            }
            JobInput::Internal(i) => self.on_internal(i),
        }
    }

    fn summary(&self) -> JobSummary {
        JobSummary {
            job: self.job.to_string(),
            phase: format!("{:?}", self.phase).to_lowercase(),
            attempt: self.deployed.as_ref().map(|d| d.attempt),
            worker: self.deployed.as_ref().map(|d| d.workers()),
            pending_checkpoints: self.core.as_ref().map(|c| c.pending_ids()).unwrap_or_default(),
            restarts: self.restarts,
        }
    }

    /// The summary, the tasks and a copy of the checkpoint statistics (their whole history:
    /// asked for one job at a time).
    fn view(&self) -> JobView {
        JobView {
            summary: self.summary(),
            tasks: self.task_views(),
            stats: self.core.as_ref().map(|c| c.stats().clone()),
            checkpoint: self.core.as_ref().map(|c| c.checkpoint_config().clone()),
        }
    }

    fn task_views(&self) -> Vec<TaskView> {
        let now = Instant::now();
        (0..self.tasks.len())
            .filter_map(|i| self.tasks.get(i).map(|t| (i, t)))
            .map(|(i, t)| {
                let (worker, status) = match &self.deployed {
                    Some(d) if d.finished.contains(&i) => (d.worker_of(i).map(str::to_owned), "finished"),
                    Some(d) if d.running.contains(&i) => (d.worker_of(i).map(str::to_owned), "running"),
                    Some(d) => (d.worker_of(i).map(str::to_owned), "deploying"),
                    None => (None, "not_deployed"),
                };
                TaskView {
                    vertex: t.vertex.clone(),
                    subtask: t.subtask,
                    parallelism: t.parallelism,
                    worker,
                    status,
                    load: self.deployed.as_ref().and_then(|d| d.loads.get(&i)).and_then(|w| w.load(now)),
                }
            })
            .collect()
    }

    /// Leadership lost (or the driver ends): drop in-memory pending checkpoints; tasks keep
    /// running for the next leader; nothing replicated is touched.
    fn suspend(&mut self) {
        if self.core.is_some() && !matches!(self.phase, Phase::Finished | Phase::Failed | Phase::Canceled) {
            self.feed(Event::LeadershipLost);
        }
        self.phase = Phase::Suspended;
        const LOST: &str =
            "leadership lost; the request's outcome is unknown: check the job on the new leader";
        for (_, reply) in std::mem::take(&mut self.requests) {
            let _ = reply.send(Err(LOST.into()));
        }
        for (_, started) in std::mem::take(&mut self.started) {
            let _ = started.send(Err(StartRefusal::Refused(LOST.into())));
        }
        for (_, keyed) in std::mem::take(&mut self.keyed) {
            for w in keyed.waiters {
                let _ = w.send(Err(StartRefusal::Refused(LOST.into())));
            }
        }
    }
}

/// The options a trigger carries to the tasks. Only periodic checkpoints may be unaligned:
/// savepoints stay aligned (they must be restorable into any graph, so they hold no in-flight
/// records).
fn task_options(o: &CheckpointOptions, unaligned_after_ms: Option<u64>) -> TaskCheckpointOptions {
    let checkpoint = o.kind == CheckpointKind::Checkpoint;
    let target_location = (!checkpoint).then(|| o.base_dir.clone());
    TaskCheckpointOptions {
        kind: o.kind,
        drain: o.drain,
        target_location,
        unaligned_after_ms: unaligned_after_ms.filter(|_| checkpoint),
    }
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
