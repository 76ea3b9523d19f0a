//! The job host: the one task that owns the jobs running on this worker.
//!
//! It starts deployments, routes commands to the tasks of a job's current attempt, forwards
//! every task report to the leader (through an [`Outbox`], so memory stays bounded while no
//! leader is attached), forgets jobs whose tasks all ended, and publishes what runs as a
//! [`JobsView`]; while attached, it sends the running tasks' time figures every few seconds
//! (`times`). Sessions reach it through a bounded channel of [`HostCommand`]s; it never
//! waits on a session (reports go out through a reserved permit in its select loop), so a
//! stalled stream cannot stall the tasks.
//!
//! A leader change does not touch the jobs: they keep running, the next session re-registers
//! them, and the new leader decides whether to keep them.

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use cairn_proto::v1::worker_message::Body;
use cairn_proto::v1::{Report, ReportBatch, WorkerMessage};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::deploy::{self, DeploymentError};
use super::outbox::{Outbox, Pushed};
use super::times;
use super::{JobsView, TaskView};
use crate::checkpoint::pool::SnapshotPool;
use crate::registry::OperatorRegistry;
use crate::runtime::{LocalJob, RuntimeOptions};
use cairn_protocol::messages::{
    CoordinatorMessage, Deployment, TaskAttemptId, TaskCommand, TaskMessage, TaskStatus, ToTask,
};

/// Capacity of the host's command channel.
pub(crate) const COMMAND_CAPACITY: usize = 256;
/// Bound on reports waiting for the leader (see [`Outbox`]).
const OUTBOX_CAPACITY: usize = 8192;
/// Bound on handing one message to one task's (bounded) control channel. A task that does not
/// take a message for this long is stuck; the message is dropped (a trigger then times out on
/// the leader, a cancel is enforced by the cancel timeout).
const CONTROL_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on the wait for the tasks of an ended job to return, after their final reports.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Most reports sent in one stream message (to a leader that takes batches).
const MAX_BATCH_REPORTS: usize = 256;
/// A batch stops growing once its reports' JSON reaches this size (the leader takes messages
/// of up to 16 MiB; a single larger report still goes alone).
const BATCH_BYTES: usize = 1024 * 1024;

/// What sessions (and the handle) ask of the host.
#[derive(Debug)]
pub(crate) enum HostCommand {
    Deploy {
        deployment: Box<Deployment>,
        term: u64,
    },
    Command {
        command: TaskCommand,
        term: u64,
    },
    /// A leader registered the worker: reports go to `outbox` from now on, several per
    /// message if it takes `batches`.
    Attach {
        outbox: mpsc::Sender<WorkerMessage>,
        batches: bool,
    },
    /// The session ended.
    Detach,
    /// The leader handled every report up to `up_to` sent on the current stream.
    Confirmed {
        up_to: u64,
    },
    /// Cancel every task, wait (bounded) for them to end and their reports to leave, then stop.
    Shutdown {
        done: oneshot::Sender<()>,
    },
}

/// Fixed settings of the host.
#[derive(Debug, Clone)]
pub(crate) struct HostSettings {
    pub slots: u32,
    /// The worker's data exchange, for deployments placed over several workers.
    pub exchange: Arc<crate::network::ExchangeService>,
    pub cancel_timeout: Duration,
    pub runtime: RuntimeOptions,
}

/// One job attempt running here.
#[derive(Debug)]
struct HostedJob {
    attempt: u32,
    local: LocalJob,
    /// Latest reported status of each task of the attempt.
    statuses: BTreeMap<TaskAttemptId, TaskStatus>,
    /// Set by a cancel: past it, the tasks still running are aborted.
    cancel_deadline: Option<Instant>,
}

impl HostedJob {
    fn all_ended(&self) -> bool {
        self.statuses.values().all(TaskStatus::is_terminal)
    }
}

pub(crate) struct JobHost {
    settings: HostSettings,
    registry: Arc<OperatorRegistry>,
    pool: SnapshotPool,
    commands: mpsc::Receiver<HostCommand>,
    jobs: BTreeMap<String, HostedJob>,
    outbox: Outbox,
    /// The attached session's outbound stream, while one is attached.
    link: Option<mpsc::Sender<WorkerMessage>>,
    /// Whether the attached leader takes several reports per message.
    batches: bool,
    /// Highest term of any message delivered to a task: a cancel on shutdown carries it.
    highest_term: u64,
    deployments: u64,
    view: watch::Sender<JobsView>,
    /// Ended jobs whose task handles are being joined.
    reaping: JoinSet<()>,
    /// Set while shutting down: who to tell, and the bound on the whole shutdown.
    shutdown: Option<(oneshot::Sender<()>, Instant)>,
    /// When the tasks' time figures go to the leader (see `times`).
    times_tick: tokio::time::Interval,
}

impl JobHost {
    pub(crate) fn new(
        settings: HostSettings,
        registry: Arc<OperatorRegistry>,
        pool: SnapshotPool,
        commands: mpsc::Receiver<HostCommand>,
        view: watch::Sender<JobsView>,
    ) -> Self {
        Self {
            settings,
            registry,
            pool,
            commands,
            jobs: BTreeMap::new(),
            outbox: Outbox::new(OUTBOX_CAPACITY),
            link: None,
            batches: false,
            highest_term: 0,
            deployments: 0,
            view,
            reaping: JoinSet::new(),
            shutdown: None,
            times_tick: {
                let mut tick = tokio::time::interval(times::TIMES_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick
            },
        }
    }

    /// Runs until shut down (or until every sender of commands is gone).
    pub(crate) async fn run(mut self) {
        loop {
            if self.shutdown_complete() {
                break;
            }
            let deadline = self.next_deadline();
            let link = if self.outbox.has_pending() { self.link.clone() } else { None };
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd).await,
                    None => break,
                },
                permit = async { match link { Some(tx) => tx.reserve_owned().await, None => std::future::pending().await } } => {
                    match permit {
                        Ok(permit) => {
                            if let Some(m) = self.next_reports() {
                                permit.send(m);
                            }
                        }
                        Err(_) => self.on_detach("outbound stream closed"),
                    }
                }
                (job, msg) = next_report(&mut self.jobs) => self.on_report(&job, msg),
                _ = self.times_tick.tick(), if self.link.is_some() => self.send_times(),
                _ = sleep_until(deadline.unwrap_or_else(far_future)), if deadline.is_some() => self.on_deadline(),
                Some(joined) = self.reaping.join_next(), if !self.reaping.is_empty() => {
                    if let Err(e) = joined {
                        tracing::warn!(error = %e, "joining an ended job failed");
                    }
                }
            }
        }
        let remaining: Vec<String> = self.jobs.keys().cloned().collect();
        for job in remaining {
            self.kill_job(&job, "the worker is shutting down");
        }
        self.publish();
        if let Some((done, _)) = self.shutdown.take() {
            let _ = done.send(());
        }
        tracing::info!("job host stopped");
    }

    fn shutdown_complete(&self) -> bool {
        match &self.shutdown {
            None => false,
            Some((_, deadline)) => {
                let drained = self.jobs.is_empty() && (self.link.is_none() || !self.outbox.has_pending());
                drained || Instant::now() >= *deadline
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let cancel = self.jobs.values().filter_map(|j| j.cancel_deadline).min();
        let shutdown = self.shutdown.as_ref().map(|(_, d)| *d);
        match (cancel, shutdown) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    async fn on_command(&mut self, cmd: HostCommand) {
        match cmd {
            HostCommand::Deploy { deployment, term } => self.on_deploy(*deployment, term).await,
            HostCommand::Command { command, term } => self.on_task_command(command, term).await,
            HostCommand::Attach { outbox, batches } => {
                self.link = Some(outbox);
                self.batches = batches;
                self.outbox.attach();
                tracing::debug!(pending = self.outbox.len(), "reports go to the leader");
            }
            HostCommand::Detach => self.on_detach("session ended"),
            HostCommand::Confirmed { up_to } => self.outbox.confirm(up_to),
            HostCommand::Shutdown { done } => self.on_shutdown(done).await,
        }
    }

    /// The next message of reports for the leader: the oldest unsent report, with those after
    /// it (up to [`MAX_BATCH_REPORTS`] and [`BATCH_BYTES`]) if the leader takes batches. A report
    /// that cannot be encoded is dropped (and logged).
    fn next_reports(&mut self) -> Option<WorkerMessage> {
        let limit = if self.batches { MAX_BATCH_REPORTS } else { 1 };
        let mut batch: Vec<Report> = Vec::new();
        let mut bytes = 0;
        while batch.len() < limit {
            let Some(msg) = self.outbox.peek() else { break };
            let json = match serde_json::to_vec(msg) {
                Ok(json) => json,
                Err(error) => {
                    tracing::error!(task = %msg.task(), %error, "report cannot be encoded; dropped");
                    self.outbox.pop();
                    continue;
                }
            };
            if !batch.is_empty() && bytes + json.len() > BATCH_BYTES {
                break;
            }
            let Some((seq, _)) = self.outbox.pop() else { break };
            bytes += json.len();
            batch.push(Report { seq, json });
        }
        let body = match batch.len() {
            0 => return None,
            1 => Body::Report(batch.remove(0)),
            _ => Body::Reports(ReportBatch { reports: batch }),
        };
        Some(WorkerMessage { body: Some(body) })
    }

    fn on_detach(&mut self, why: &str) {
        if self.link.take().is_some() {
            let resend = self.outbox.detach();
            tracing::debug!(why, resend, held = self.outbox.len(), "reports held until a leader attaches");
        }
    }

    async fn on_deploy(&mut self, d: Deployment, term: u64) {
        self.highest_term = self.highest_term.max(term);
        if let Some(running) = self.jobs.get(&d.job_id) {
            if running.attempt == d.attempt {
                tracing::info!(job = %d.job_id, attempt = d.attempt, "attempt already running; deployment ignored");
                return;
            }
            tracing::warn!(
                job = %d.job_id, running = running.attempt, deployed = d.attempt,
                "another attempt of the job is running; killing it first"
            );
            self.kill_job(&d.job_id, &format!("superseded by attempt {}", d.attempt));
        }
        let graph = deploy::decode_graph(&d);
        let tasks = deploy::local_attempts(&d, graph.as_ref().ok(), self.settings.exchange.worker_id());
        let started = match graph {
            Err(e) => Err(DeploymentError::from(e)),
            Ok(graph) => self.start(&d, graph, slot_groups(tasks.iter())).await,
        };
        match started {
            Ok(local) => {
                self.deployments += 1;
                let statuses = local.tasks().iter().map(|t| (t.id.clone(), TaskStatus::Created)).collect();
                tracing::info!(job = %d.job_id, attempt = d.attempt, tasks = tasks.len(), term, "job deployed");
                self.jobs.insert(
                    d.job_id.clone(),
                    HostedJob { attempt: d.attempt, local, statuses, cancel_deadline: None },
                );
            }
            Err(e) => {
                let cause = e.cause();
                tracing::error!(job = %d.job_id, attempt = d.attempt, cause = %cause, "deployment failed");
                if tasks.is_empty() {
                    tracing::error!(job = %d.job_id, "the failed deployment names no tasks to report it for");
                }
                for task in tasks {
                    self.push_report(TaskMessage::Status { task, status: TaskStatus::Failed(cause.clone()) });
                }
            }
        }
        self.publish();
    }

    async fn start(
        &mut self,
        d: &Deployment,
        graph: cairn_protocol::graph::JobGraph,
        needed: usize,
    ) -> Result<LocalJob, DeploymentError> {
        let used: usize = self.jobs.values().map(|j| slot_groups(j.statuses.keys())).sum();
        let free = (self.settings.slots as usize).saturating_sub(used);
        if needed > free {
            return Err(DeploymentError::NoSlots { needed, free, slots: self.settings.slots });
        }
        let placement = match &d.placement {
            Some(p) => Some(deploy::placement(p, &graph).await?),
            None => None,
        };
        let jd = deploy::job_deployment(d, graph, &self.settings.runtime);
        Ok(match placement {
            Some(p) => {
                LocalJob::deploy_placed(jd, &self.registry, self.pool.clone(), &p, &self.settings.exchange)?
            }
            None => LocalJob::deploy(jd, &self.registry, self.pool.clone())?,
        })
    }

    async fn on_task_command(&mut self, cmd: TaskCommand, term: u64) {
        self.highest_term = self.highest_term.max(term);
        let Some(job) = self.jobs.get_mut(&cmd.job_id) else {
            tracing::warn!(job = %cmd.job_id, attempt = cmd.attempt, "command for a job not running here; ignored");
            return;
        };
        if job.attempt != cmd.attempt {
            tracing::warn!(
                job = %cmd.job_id, attempt = cmd.attempt, running = job.attempt,
                "command for another attempt of the job; ignored"
            );
            return;
        }
        let targets: Vec<TaskAttemptId> = if cmd.tasks.is_empty() {
            job.statuses.keys().cloned().collect()
        } else {
            cmd.tasks
                .iter()
                .filter_map(|(vertex, subtask)| {
                    let found = job
                        .statuses
                        .keys()
                        .find(|t| t.task.vertex == *vertex && t.task.subtask == *subtask)
                        .cloned();
                    if found.is_none() {
                        tracing::warn!(job = %cmd.job_id, vertex = %vertex, subtask, "command for an unknown task; skipped");
                    }
                    found
                })
                .collect()
        };
        let is_cancel = matches!(cmd.body, ToTask::Cancel);
        let msg = CoordinatorMessage { term, body: cmd.body };
        for task in &targets {
            if job.statuses.get(task).is_some_and(TaskStatus::is_terminal) {
                continue;
            }
            match tokio::time::timeout(CONTROL_SEND_TIMEOUT, job.local.link.send(task, msg.clone())).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(task = %task, error = %e, "task gone; message not delivered"),
                Err(_) => {
                    tracing::warn!(task = %task, "task does not take control messages; message dropped")
                }
            }
        }
        if is_cancel && job.cancel_deadline.is_none() {
            tracing::info!(job = %cmd.job_id, attempt = cmd.attempt, tasks = targets.len(), "cancel delivered");
            job.cancel_deadline = Some(Instant::now() + self.settings.cancel_timeout);
        }
    }

    async fn on_shutdown(&mut self, done: oneshot::Sender<()>) {
        tracing::info!(jobs = self.jobs.len(), "canceling every task");
        let deadline = Instant::now() + self.settings.cancel_timeout + Duration::from_secs(1);
        self.shutdown = Some((done, deadline));
        let running: Vec<(String, u32)> = self.jobs.iter().map(|(id, j)| (id.clone(), j.attempt)).collect();
        for (job_id, attempt) in running {
            let cancel = TaskCommand { job_id, attempt, tasks: Vec::new(), body: ToTask::Cancel };
            self.on_task_command(cancel, self.highest_term).await;
        }
    }

    fn on_report(&mut self, job_id: &str, msg: TaskMessage) {
        if let TaskMessage::Status { task, status } = &msg
            && let Some(job) = self.jobs.get_mut(job_id)
            && let Some(slot) = job.statuses.get_mut(task)
        {
            *slot = status.clone();
            self.push_report(msg);
            self.publish();
            if self.jobs.get(job_id).is_some_and(HostedJob::all_ended) {
                self.forget_job(job_id);
            }
            return;
        }
        self.push_report(msg);
    }

    /// Sends the running tasks' time figures to the leader, unless the stream is full (the next
    /// sample covers this one: the figures are cumulative).
    fn send_times(&mut self) {
        let Some(link) = &self.link else { return };
        let tasks = self.jobs.values().flat_map(|j| times::task_times(&j.local, &j.statuses)).collect();
        if let Some(msg) = times::message(tasks)
            && let Err(mpsc::error::TrySendError::Full(_)) = link.try_send(msg)
        {
            tracing::debug!("outbound stream full: time figures skipped");
        }
    }

    fn push_report(&mut self, msg: TaskMessage) {
        if let Pushed::HeldDropping(dropped) = self.outbox.push(msg) {
            match *dropped {
                TaskMessage::Status { task, status } => {
                    tracing::debug!(task = %task, ?status, "superseded status not sent (report buffer full)")
                }
                other => {
                    tracing::warn!(task = %other.task(), "report buffer full: an older report was dropped")
                }
            }
        }
    }

    /// Every task of the job ended and reported it: stop hosting the job.
    fn forget_job(&mut self, job_id: &str) {
        let Some(mut job) = self.jobs.remove(job_id) else { return };
        while let Some(msg) = job.local.link.try_recv() {
            self.push_report(msg);
        }
        tracing::info!(job = job_id, attempt = job.attempt, "every task of the job ended; job removed");
        let local = job.local;
        self.reaping.spawn(async move {
            if tokio::time::timeout(REAP_TIMEOUT, local.join()).await.is_err() {
                tracing::warn!("tasks of an ended job did not return in time; aborted");
            }
        });
        self.publish();
    }

    /// Aborts the job's tasks; the ones that had not ended are reported canceled.
    fn kill_job(&mut self, job_id: &str, why: &str) {
        let Some(mut job) = self.jobs.remove(job_id) else { return };
        while let Some(msg) = job.local.link.try_recv() {
            if let TaskMessage::Status { task, status } = &msg
                && let Some(slot) = job.statuses.get_mut(task)
            {
                *slot = status.clone();
            }
            self.push_report(msg);
        }
        job.local.kill();
        for (task, status) in job.statuses {
            if !status.is_terminal() {
                tracing::warn!(task = %task, why, "task aborted");
                self.push_report(TaskMessage::Status { task, status: TaskStatus::Canceled });
            }
        }
        self.publish();
    }

    fn on_deadline(&mut self) {
        let now = Instant::now();
        let overdue: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.cancel_deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for job in overdue {
            tracing::warn!(job = %job, timeout = ?self.settings.cancel_timeout, "canceled tasks did not stop in time");
            self.kill_job(&job, "did not stop within the cancel timeout");
        }
    }

    fn publish(&self) {
        let tasks = self
            .jobs
            .values()
            .flat_map(|j| {
                j.statuses.iter().map(|(id, status)| TaskView { id: id.clone(), status: status.clone() })
            })
            .collect();
        let view = JobsView { tasks, deployments: self.deployments, slots: self.settings.slots };
        self.view.send_if_modified(|v| {
            if *v == view {
                false
            } else {
                *v = view;
                true
            }
        });
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// The next report of any hosted job. Polls each job's report channel once per wake-up (a
/// fresh `recv` future registers the waker; dropping it is cancel-safe).
async fn next_report(jobs: &mut BTreeMap<String, HostedJob>) -> (String, TaskMessage) {
    poll_fn(|cx| {
        for (id, job) in jobs.iter_mut() {
            let mut recv = pin!(job.local.link.recv());
            if let Poll::Ready(Some(msg)) = recv.as_mut().poll(cx) {
                return Poll::Ready((id.clone(), msg));
            }
        }
        Poll::Pending
    })
    .await
}

/// Slots the tasks take: Flink's slot sharing puts one subtask of each vertex in a slot, so a
/// job's tasks take one slot per distinct subtask index (slot-sharing group) they include.
fn slot_groups<'a>(tasks: impl Iterator<Item = &'a TaskAttemptId>) -> usize {
    tasks.map(|t| t.task.subtask).collect::<std::collections::BTreeSet<_>>().len()
}
