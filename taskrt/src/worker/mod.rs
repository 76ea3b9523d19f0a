//! The worker side of the task gateway: a process that runs jobs for whichever coordinator
//! replica leads.
//!
//! # Layout
//!
//! | module | owns |
//! | --- | --- |
//! | [`config`] | [`WorkerConfig`] (TOML, `CAIRN_WORKER_*`, flags), defaults and validation |
//! | [`endpoints`] | the known replicas, where to look next, the jittered backoff (pure) |
//! | [`connection`] | the leader-following loop: one task, owner of the term fence and the channels |
//! | [`session`] | one `Attach` stream: register, heartbeats, liveness, fencing, dispatch |
//! | [`host`] | the job host: one task, owner of the running jobs and of the report outbox |
//! | [`outbox`] | reports to the leader with bounded memory across disconnections (pure) |
//! | `times` | the running tasks' busy, idle and back-pressured time, sent every few seconds |
//! | [`deploy`] | a leader's `Deployment` → a runtime `JobDeployment` (restore metadata, task ids) |
//!
//! # Data flow
//!
//! ```text
//!            ┌───────────── connection loop (TermFence) ─────────────┐
//! replica ◀──┤ session: register → registered → heartbeats / liveness ├──▶ deploy / command
//!   ▲        └───────────────────────────────────────────────────────┘          │ (bounded)
//!   │ report_json (bounded outbound stream)                                      ▼
//!   └──────────────────── Outbox ◀── TaskMessage ◀── job host ── LocalJob(s) ◀──┘
//! ```
//!
//! [`Worker::start`] spawns the two owner tasks and returns a [`WorkerHandle`]: it observes the
//! worker ([`WorkerStatus`], [`JobsView`], both `watch`es) and stops it
//! ([`WorkerHandle::shutdown`]: cancel every task, wait a bounded time, detach).

pub mod config;
pub mod connection;
pub mod deploy;
pub mod host;
pub mod outbox;
pub mod session;
mod times;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

pub use config::{ConfigError, LogFormat, RunArgs, WorkerConfig};
pub use deploy::DeploymentError;
pub use session::SessionError;

use crate::checkpoint::pool::SnapshotPool;
use crate::exporter::TaskMetrics;
use crate::network::{ExchangeService, NetworkOptions};
use crate::registry::OperatorRegistry;
use crate::runtime::RuntimeOptions;
use cairn_protocol::messages::{TaskAttemptId, TaskStatus, TermFence};

/// The leader the worker is registered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The replica's address, as the worker reached it.
    pub addr: String,
    pub leader_id: u64,
    /// The term of its `registered`.
    pub term: u64,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
}

/// The worker's connection, as published by the connection loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStatus {
    /// `None` while looking for the leader.
    pub leader: Option<LeaderInfo>,
    /// Highest leader term seen (the fence).
    pub highest_term: u64,
    /// Registrations accepted by a leader since the worker started.
    pub registrations: u64,
    /// Replicas known (configured, plus leaders learned from hints).
    pub endpoints: Vec<String>,
    /// Why the last attempt or session failed.
    pub last_error: Option<String>,
}

/// One task attempt hosted here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskView {
    pub id: TaskAttemptId,
    /// Latest status the task reported.
    pub status: TaskStatus,
}

/// The jobs running here, as published by the job host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobsView {
    pub tasks: Vec<TaskView>,
    /// Deployments started since the worker started (a restart of a job counts again).
    pub deployments: u64,
    /// Configured slots.
    pub slots: u32,
}

impl JobsView {
    /// The hosted attempts of `job` (empty when it does not run here).
    pub fn job(&self, job: &str) -> Vec<&TaskView> {
        self.tasks.iter().filter(|t| t.id.task.job == job).collect()
    }

    /// Whether `job` runs here with every task in `status`.
    pub fn all_in(&self, job: &str, status: &TaskStatus) -> bool {
        let tasks = self.job(job);
        !tasks.is_empty() && tasks.iter().all(|t| t.status == *status)
    }
}

/// The status name the gateway carries (`running`, `restoring`, `finished`, ...).
pub fn status_name(status: &TaskStatus) -> &'static str {
    match status {
        TaskStatus::Created => "created",
        TaskStatus::Restoring => "restoring",
        TaskStatus::Running => "running",
        TaskStatus::Finishing => "finishing",
        TaskStatus::Finished => "finished",
        TaskStatus::Failed(_) => "failed",
        TaskStatus::Canceled => "canceled",
    }
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid worker configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot start the data exchange on {listen} (data_listen): {source}")]
    DataExchange { listen: String, source: crate::network::NetworkError },
}

/// Entry point.
pub struct Worker;

impl Worker {
    /// Starts a worker with the built-in operator kinds (the demo pipeline's). Must be called
    /// inside a tokio runtime.
    pub fn start(config: WorkerConfig) -> Result<WorkerHandle, WorkerError> {
        Self::start_with_registry(config, OperatorRegistry::with_builtins())
    }

    /// Starts a worker that can run the operator kinds of `registry`.
    pub fn start_with_registry(
        config: WorkerConfig,
        registry: OperatorRegistry,
    ) -> Result<WorkerHandle, WorkerError> {
        Self::start_instrumented(config, registry, None)
    }

    /// Starts a worker whose tasks record their checkpoint figures into `metrics` (the families
    /// the process serves on `/metrics`), when given.
    pub fn start_instrumented(
        config: WorkerConfig,
        registry: OperatorRegistry,
        metrics: Option<TaskMetrics>,
    ) -> Result<WorkerHandle, WorkerError> {
        config.validate()?;
        let tls = config.client_tls()?;
        let token = config.resolve_token()?;
        let auth = cairn_client::BearerAuth::new(token.as_ref().map(|t| t.expose()))
            .map_err(|e| ConfigError::Token(e.to_string()))?;
        let worker_id = config.effective_worker_id();
        let exchange = Arc::new(Self::exchange(&config, &worker_id)?);
        let bound = exchange.local_addr();
        let data_addr = config.data_advertise_addr(bound.port())?.unwrap_or_else(|| bound.to_string());
        let (host_tx, host_rx) = mpsc::channel(host::COMMAND_CAPACITY);
        let (jobs_tx, jobs_rx) = watch::channel(JobsView { slots: config.slots, ..JobsView::default() });
        let (status_tx, status_rx) = watch::channel(WorkerStatus::default());
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let host = host::JobHost::new(
            host::HostSettings {
                slots: config.slots,
                exchange,
                cancel_timeout: config.cancel_timeout,
                runtime: RuntimeOptions { metrics, ..RuntimeOptions::default() },
            },
            Arc::new(registry),
            SnapshotPool::new(config.snapshot_concurrency),
            host_rx,
            jobs_tx,
        );
        let connector = connection::Connector {
            worker_id: worker_id.clone(),
            slots: config.slots,
            data_addr: data_addr.clone(),
            connect_timeout: config.connect_timeout,
            register_timeout: config.register_timeout,
            endpoints: cairn_client::follow::Endpoints::new(config.endpoints()),
            backoff: cairn_client::follow::Backoff::new(
                config.reconnect_backoff_min,
                config.reconnect_backoff_max,
            ),
            channels: HashMap::new(),
            tls,
            auth,
            fence: TermFence::default(),
            host: host_tx.clone(),
            jobs: jobs_rx.clone(),
            status: status_tx,
            shutdown: shutdown_rx,
        };
        let mut tasks = JoinSet::new();
        let span = tracing::info_span!("worker", worker_id = %worker_id);
        tasks.spawn(tracing::Instrument::instrument(host.run(), span.clone()));
        tasks.spawn(tracing::Instrument::instrument(connector.run(), span));
        tracing::info!(worker_id = %worker_id, slots = config.slots, data_addr = %data_addr, coordinators = ?config.endpoints(), "worker started");
        Ok(WorkerHandle {
            worker_id,
            status: status_rx,
            jobs: jobs_rx,
            host: host_tx,
            shutdown: shutdown_tx,
            shutdown_bound: config.cancel_timeout + Duration::from_secs(5),
            tasks,
        })
    }
}

impl Worker {
    fn exchange(config: &WorkerConfig, worker_id: &str) -> Result<ExchangeService, WorkerError> {
        let listen = config.data_listen_addr()?;
        ExchangeService::bind_now(listen, worker_id, NetworkOptions::default())
            .map_err(|e| WorkerError::DataExchange { listen: config.data_listen.clone(), source: e })
    }
}

/// Observes and stops a running worker. Dropping it aborts the worker (and its tasks) abruptly;
/// [`WorkerHandle::shutdown`] stops it cleanly.
pub struct WorkerHandle {
    worker_id: String,
    status: watch::Receiver<WorkerStatus>,
    jobs: watch::Receiver<JobsView>,
    host: mpsc::Sender<host::HostCommand>,
    shutdown: watch::Sender<bool>,
    /// Bound on each step of a clean shutdown.
    shutdown_bound: Duration,
    /// The job host and the connection loop.
    tasks: JoinSet<()>,
}

impl WorkerHandle {
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The connection: leader, term, registrations.
    pub fn status(&self) -> watch::Receiver<WorkerStatus> {
        self.status.clone()
    }

    /// The hosted task attempts and their statuses.
    pub fn jobs(&self) -> watch::Receiver<JobsView> {
        self.jobs.clone()
    }

    /// Completes when the worker stopped on its own (which it does only if one of its tasks
    /// ended unexpectedly); the caller should then shut it down.
    pub async fn stopped(&mut self) {
        match self.tasks.join_next().await {
            Some(Err(e)) => tracing::error!(error = %e, "a worker task failed"),
            Some(Ok(())) => tracing::error!("a worker task stopped"),
            None => {}
        }
    }

    /// Cancels every task, waits (bounded by the cancel timeout) for them to end and for their
    /// final statuses to leave, then detaches from the leader and stops.
    pub async fn shutdown(mut self) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.host.send(host::HostCommand::Shutdown { done: done_tx }).await.is_ok()
            && tokio::time::timeout(self.shutdown_bound, done_rx).await.is_err()
        {
            tracing::warn!("the job host did not stop in time");
        }
        let _ = self.shutdown.send(true);
        let joined = tokio::time::timeout(self.shutdown_bound, async {
            while let Some(r) = self.tasks.join_next().await {
                if let Err(e) = r {
                    tracing::error!(error = %e, "a worker task failed");
                }
            }
        })
        .await;
        if joined.is_err() {
            tracing::warn!("the worker did not stop in time; aborting");
            self.tasks.abort_all();
        }
        tracing::info!(worker_id = %self.worker_id, "worker stopped");
    }
}
