//! The cheap handle through which the gateway, the services and the job drivers reach the
//! runtime of one leader term ([`TermHandle`]), and the commands it carries. The runtime
//! (`super::runtime`) owns the other end.
//!
//! Task reports do not pass through the runtime: the runtime publishes which driver runs each
//! job ([`Routes`], replaced whole when a driver starts or ends, which is rare), and a worker
//! stream's reader hands each report straight to the job's driver, as long as its session is
//! the worker's current one ([`Session`]: a flag the runtime clears when the session is
//! superseded or the worker is lost). One busy job then slows only the reports of workers
//! running it, never every worker's heartbeats and attaches.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_proto::v1::{AttachedTask, LeaderMessage, TaskTime, leader_message};
use cairn_protocol::messages::TaskMessage;
use cairn_raft::model::JobId;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use super::api::{JobSummary, JobView, StartedReply, TriggerKey, TriggerReply};
use crate::checkpoint::TriggerKind;

/// What a worker says about itself when it attaches.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    pub worker_id: String,
    pub slots: u32,
    pub tasks: Vec<AttachedTask>,
    pub highest_term_seen: u64,
    /// Where other workers reach its data exchange (`host:port`); empty if it announced none.
    pub data_addr: String,
    /// What the worker proved on attaching; its id stays bound to it while the session lives.
    pub identity: crate::auth::WorkerIdentity,
}

/// A worker's outbox, leased to a job for the life of a deployment.
#[derive(Debug, Clone)]
pub struct WorkerLease {
    pub worker_id: String,
    pub outbox: mpsc::Sender<LeaderMessage>,
}

/// One worker chosen for a deployment: its lease, its data exchange address, and the
/// slot-sharing groups (by index) it runs.
#[derive(Debug, Clone)]
pub struct WorkerGrant {
    pub lease: WorkerLease,
    pub data_addr: String,
    pub groups: Vec<usize>,
}

pub(crate) enum RuntimeCmd {
    Attach {
        info: WorkerInfo,
        outbox: mpsc::Sender<LeaderMessage>,
        reply: oneshot::Sender<Result<Session, Status>>,
    },
    Detach {
        worker_id: String,
        session: u64,
    },
    Heartbeat {
        worker_id: String,
        session: u64,
    },
    AcquireWorkers {
        job: JobId,
        /// Subtasks of each slot-sharing group.
        groups: Vec<u32>,
        strategy: cairn_raft::model::PlacementStrategy,
        reply: oneshot::Sender<Option<Vec<WorkerGrant>>>,
    },
    ReleaseWorker {
        job: JobId,
    },
    AdoptLeases {
        job: JobId,
        /// (worker, slots) for each worker the job's tasks re-attached from.
        workers: Vec<(String, u32)>,
    },
    Trigger {
        job: JobId,
        kind: TriggerKind,
        reply: oneshot::Sender<TriggerReply>,
    },
    Jobs {
        reply: oneshot::Sender<Vec<JobSummary>>,
    },
    Job {
        job: JobId,
        reply: oneshot::Sender<Option<JobView>>,
    },
    TriggerStarted {
        job: JobId,
        kind: TriggerKind,
        key: Option<TriggerKey>,
        started: oneshot::Sender<StartedReply>,
    },
    Cancel {
        job: JobId,
        reply: oneshot::Sender<()>,
    },
    ConfigChanged {
        job: JobId,
        subsumed: Vec<cairn_raft::model::CompletedCheckpoint>,
    },
    Workers {
        reply: oneshot::Sender<Vec<WorkerSlots>>,
    },
}

/// A worker the runtime knows (attached, or disconnected and awaited until its heartbeat
/// timeout), for status calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSlots {
    pub worker_id: String,
    pub slots: u32,
    pub used: u32,
    pub connected: bool,
    /// Jobs with tasks deployed on it, sorted.
    pub jobs: Vec<String>,
    pub identity: crate::auth::WorkerIdentity,
    /// Its data exchange address, as announced.
    pub data_addr: String,
}

/// What a worker stream hands straight to a job's driver.
pub(crate) enum ReportInput {
    /// Task reports about the job, in the order the worker sent them, with where their
    /// refusals go (precise ones, for the worker; none when every report was taken).
    Tasks { worker_id: String, msgs: Vec<TaskMessage>, reply: oneshot::Sender<Vec<Status>> },
    /// Cumulative time figures of the job's tasks on the worker, received at `at` (transient:
    /// no answer, dropped when the driver's queue is full).
    Times { worker_id: String, times: Vec<TaskTime>, at: tokio::time::Instant },
}

/// The report queue of every job driver this term runs, as the runtime last published it.
pub(crate) type Routes = Arc<HashMap<JobId, mpsc::Sender<ReportInput>>>;

/// One attached stream of a worker: its number, and whether it is still the worker's current
/// session on this term (the runtime clears the flag when another session replaces it or the
/// worker is lost; the stream's reports are refused from then on).
#[derive(Debug, Clone)]
pub struct Session {
    pub id: u64,
    live: Arc<AtomicBool>,
}

impl Session {
    pub(crate) fn new(id: u64) -> Self {
        Self { id, live: Arc::new(AtomicBool::new(true)) }
    }

    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn end(&self) {
        self.live.store(false, Ordering::Release);
    }
}

/// Cheap handle on the runtime of one term.
#[derive(Clone)]
pub struct TermHandle {
    pub term: u64,
    pub leader_id: u64,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    /// When this runtime started: after the election that made this replica leader (its vote
    /// became committed no later than this).
    pub since: tokio::time::Instant,
    tx: mpsc::Sender<RuntimeCmd>,
    routes: watch::Receiver<Routes>,
}

impl TermHandle {
    pub(crate) fn new(
        term: u64,
        leader_id: u64,
        heartbeat_interval: Duration,
        heartbeat_timeout: Duration,
        tx: mpsc::Sender<RuntimeCmd>,
        routes: watch::Receiver<Routes>,
    ) -> Self {
        let since = tokio::time::Instant::now();
        Self { term, leader_id, heartbeat_interval, heartbeat_timeout, since, tx, routes }
    }
}

fn gone() -> Status {
    Status::unavailable(
        "the leader's coordinator runtime stopped (leadership lost); reconnect to the new leader",
    )
}

impl TermHandle {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> RuntimeCmd) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    /// Registers a worker's stream; returns its session.
    pub async fn attach(
        &self,
        info: WorkerInfo,
        outbox: mpsc::Sender<LeaderMessage>,
    ) -> Result<Session, Status> {
        self.ask(|reply| RuntimeCmd::Attach { info, outbox, reply }).await?
    }

    pub async fn detach(&self, worker_id: String, session: u64) {
        let _ = self.tx.send(RuntimeCmd::Detach { worker_id, session }).await;
    }

    pub async fn heartbeat(&self, worker_id: String, session: u64) {
        let _ = self.tx.send(RuntimeCmd::Heartbeat { worker_id, session }).await;
    }

    /// Hands task reports of `session` about one job straight to the job's driver (waiting
    /// only for room in the driver's queue) and returns where their refusals will arrive
    /// (precise ones, for the worker): a stream's reports submitted in order are handled in
    /// order. `job` is the job every report names.
    pub async fn submit_reports(
        &self,
        worker_id: String,
        session: &Session,
        job: &str,
        msgs: Vec<TaskMessage>,
    ) -> Result<oneshot::Receiver<Vec<Status>>, Status> {
        if !session.is_live() {
            return Err(Status::failed_precondition(format!(
                "worker {worker_id:?} session {} is not attached to this leader; register again",
                session.id
            )));
        }
        let job =
            JobId::new(job.to_owned()).map_err(|e| Status::invalid_argument(format!("task.job: {e}")))?;
        let unknown = || Status::not_found(format!("unknown job `{job}` (or not running)"));
        // Cloned out of the published table: no borrow is held across the send.
        let driver = self.routes.borrow().get(&job).cloned().ok_or_else(unknown)?;
        let (reply, refusals) = oneshot::channel();
        let input = ReportInput::Tasks { worker_id, msgs, reply };
        // A driver that ended: its job stopped, or this whole term is stopping.
        let ended = || if self.tx.is_closed() { gone() } else { unknown() };
        driver.send(input).await.map_err(|_| ended())?;
        Ok(refusals)
    }

    /// Hands the time figures of `session` to the drivers of their jobs, without waiting: they
    /// are transient, and a driver with a full queue does without them. Figures of jobs this
    /// term does not run are ignored with a warning.
    pub(crate) fn submit_times(&self, worker_id: &str, session: &Session, times: Vec<TaskTime>) {
        if !session.is_live() {
            tracing::debug!(
                worker = worker_id,
                session = session.id,
                "time figures of a superseded session ignored"
            );
            return;
        }
        let at = tokio::time::Instant::now();
        let mut by_job: HashMap<String, Vec<TaskTime>> = HashMap::new();
        for t in times {
            by_job.entry(t.job_id.clone()).or_default().push(t);
        }
        let routes = self.routes.borrow().clone();
        for (job, times) in by_job {
            let Some(driver) = JobId::new(job.clone()).ok().and_then(|j| routes.get(&j).cloned()) else {
                tracing::warn!(worker = worker_id, job = %job.chars().take(128).collect::<String>(), tasks = times.len(),
                    "time figures for a job this leader does not run; ignored");
                continue;
            };
            let input = ReportInput::Times { worker_id: worker_id.to_owned(), times, at };
            if driver.try_send(input).is_err() {
                tracing::debug!(worker = worker_id, job = %job, "job driver busy: time figures dropped");
            }
        }
    }

    /// Workers for a deployment of `groups` (subtasks per slot-sharing group); `None` while the
    /// free slots cannot hold them (the job is told when workers change).
    pub(crate) async fn acquire_workers(
        &self,
        job: JobId,
        groups: Vec<u32>,
        strategy: cairn_raft::model::PlacementStrategy,
    ) -> Option<Vec<WorkerGrant>> {
        self.ask(|reply| RuntimeCmd::AcquireWorkers { job, groups, strategy, reply }).await.ok().flatten()
    }

    /// Records that `job` runs on these workers (tasks that re-attached after a leader change).
    pub(crate) async fn adopt_leases(&self, job: JobId, workers: Vec<(String, u32)>) {
        let _ = self.tx.send(RuntimeCmd::AdoptLeases { job, workers }).await;
    }

    pub(crate) async fn release_worker(&self, job: JobId) {
        let _ = self.tx.send(RuntimeCmd::ReleaseWorker { job }).await;
    }

    /// Triggers a checkpoint or savepoint of a job; answers when it completed or failed.
    pub async fn trigger(&self, job: JobId, kind: TriggerKind) -> Result<TriggerReply, Status> {
        self.ask(|reply| RuntimeCmd::Trigger { job, kind, reply }).await
    }

    /// Triggers a checkpoint or savepoint of a job; answers as soon as its checkpoint id is
    /// allocated (with a key: and recorded through Raft under the request id).
    pub async fn trigger_started(
        &self,
        job: JobId,
        kind: TriggerKind,
        key: Option<TriggerKey>,
    ) -> Result<StartedReply, Status> {
        self.ask(|started| RuntimeCmd::TriggerStarted { job, kind, key, started }).await
    }

    /// Tells the job's driver that its `canceled` status is committed; answers once its tasks
    /// were told to cancel (at once when no driver runs the job).
    pub async fn cancel(&self, job: JobId) -> Result<(), Status> {
        self.ask(|reply| RuntimeCmd::Cancel { job, reply }).await
    }

    /// Tells the job's driver that a new checkpoint configuration is committed.
    pub async fn config_changed(
        &self,
        job: JobId,
        subsumed: Vec<cairn_raft::model::CompletedCheckpoint>,
    ) -> Result<(), Status> {
        self.tx.send(RuntimeCmd::ConfigChanged { job, subsumed }).await.map_err(|_| gone())
    }

    /// The workers this term knows, their slots and the jobs on them, by id.
    pub async fn workers(&self) -> Result<Vec<WorkerSlots>, Status> {
        self.ask(|reply| RuntimeCmd::Workers { reply }).await
    }

    /// What every job driver of this term is doing, in brief.
    pub async fn jobs(&self) -> Result<Vec<JobSummary>, Status> {
        self.ask(|reply| RuntimeCmd::Jobs { reply }).await
    }

    /// What `job`'s driver is doing, with its tasks and statistics; `None` when this term does
    /// not drive it. Asks that driver alone: a status call about one job costs the same with a
    /// thousand jobs as with one.
    pub async fn job(&self, job: JobId) -> Result<Option<JobView>, Status> {
        self.ask(|reply| RuntimeCmd::Job { job, reply }).await
    }

    /// Resolves when this term's runtime has stopped.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Whether the runtime of this term has stopped.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    pub fn leader_message(&self, body: leader_message::Body) -> LeaderMessage {
        LeaderMessage { term: self.term, body: Some(body) }
    }
}
