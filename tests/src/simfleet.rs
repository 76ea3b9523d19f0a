//! Simulated workers: real task gateway streams and protocol, but tasks that do no work. A
//! deployment's tasks report `running` at once; a checkpoint trigger is acknowledged at once by
//! every task of the job (as if the barrier had crossed the whole job) with empty state. So
//! thousands of tasks fit one machine, and what is measured is the coordinator: the scale
//! benchmark (`cairn-bench-scale`) runs its jobs on a [`Fleet`].
//!
//! Each worker is one task that owns its jobs; it follows the leader across failovers
//! (re-registering the tasks it runs, so the new leader re-attaches them without a restart) and
//! records what it sees per job in the fleet's [`Observed`] table: deployments, and for every
//! completed checkpoint the time from the trigger reaching the worker to the completion
//! notice reaching it.
//!
//! Like a real worker, a simulated one sends the reports one leader message produced as one
//! numbered batch when the leader takes batches (a trigger's acknowledgements of all the job's
//! tasks on the worker go out together).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cairn_proto::v1::{
    AttachedTask, Heartbeat, LeaderMessage, Report, ReportBatch, WorkerMessage, leader_message,
    worker_message,
};
use cairn_protocol::checkpoint::{SubtaskState, TaskCheckpointMetrics};
use cairn_protocol::messages::{Deployment, TaskAttemptId, TaskCommand, TaskMessage, TaskStatus, ToTask};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Streaming;

use crate::scripted::{ScriptedWorker, attempt_id, subtasks};

/// How long a worker tries to attach before it gives up on a round and starts over.
const ATTACH_ROUND: Duration = Duration::from_secs(30);
/// Triggers remembered per job (for the end-to-end figure of their completion).
const TRIGGERS_KEPT: usize = 64;
/// Most reports per batch, as a real worker sends them.
const BATCH_REPORTS: usize = 256;

/// One completed checkpoint, as a worker saw it.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub checkpoint_id: u64,
    /// When the completion notice arrived.
    pub at: Instant,
    /// From the trigger reaching the worker to the completion notice reaching it.
    pub end_to_end: Duration,
}

/// What the fleet saw of one job.
#[derive(Debug, Clone, Default)]
pub struct JobObservations {
    /// Deployments received (1 for a job that never restarted).
    pub deployments: u32,
    /// Attempt of the latest deployment.
    pub attempt: u32,
    /// Triggers received.
    pub triggers: u64,
    pub completions: Vec<Completion>,
    pub aborted: u64,
}

/// What the fleet saw, per job; shared between the workers and the reader.
#[derive(Debug, Clone, Default)]
pub struct Observed(Arc<Mutex<BTreeMap<String, JobObservations>>>);

impl Observed {
    /// The table; held only for reading or a short update, never across an await.
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, JobObservations>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, job: &str, f: impl FnOnce(&mut JobObservations)) {
        f(self.lock().entry(job.to_owned()).or_default());
    }
}

/// A fleet of simulated workers attached to one cluster.
pub struct Fleet {
    pub observed: Observed,
    stop: watch::Sender<bool>,
    workers: JoinSet<()>,
}

/// Where and how the fleet attaches.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The replicas' gateway addresses.
    pub addrs: Vec<String>,
    /// The worker token.
    pub token: String,
    pub workers: usize,
    /// Slots of each worker.
    pub slots: u32,
}

impl Fleet {
    /// Starts the workers (`sim-1`, `sim-2`, ...); each attaches on its own.
    pub fn start(config: FleetConfig) -> Self {
        let observed = Observed::default();
        let (stop, stopped) = watch::channel(false);
        let mut workers = JoinSet::new();
        for n in 1..=config.workers {
            let worker = SimWorker {
                id: format!("sim-{n}"),
                config: config.clone(),
                observed: observed.clone(),
                jobs: BTreeMap::new(),
                next_seq: 0,
                stop: stopped.clone(),
            };
            workers.spawn(worker.run());
        }
        Self { observed, stop, workers }
    }

    /// Stops every worker (their streams close; the leader sees them detach).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while self.workers.join_next().await.is_some() {}
    }
}

/// One deployed job attempt on a worker.
struct SimJob {
    attempt: u32,
    tasks: Vec<TaskAttemptId>,
    /// Trigger arrival times by checkpoint id (the newest [`TRIGGERS_KEPT`]).
    triggers: HashMap<u64, Instant>,
}

struct SimWorker {
    id: String,
    config: FleetConfig,
    observed: Observed,
    jobs: BTreeMap<String, SimJob>,
    /// Number of the last report sent in a batch (for the life of the worker).
    next_seq: u64,
    stop: watch::Receiver<bool>,
}

/// Why a session ended.
enum End {
    Stopped,
    /// The stream broke or went quiet: find the leader again.
    Lost,
}

impl SimWorker {
    async fn run(mut self) {
        loop {
            if *self.stop.borrow() {
                return;
            }
            let attached = self.attached_tasks();
            let attach = ScriptedWorker::attach(
                &self.config.addrs,
                &self.config.token,
                &self.id,
                self.config.slots,
                attached,
                ATTACH_ROUND,
            );
            let worker = tokio::select! {
                _ = self.stop.changed() => return,
                w = attach => w,
            };
            let worker = match worker {
                Ok(w) => w,
                Err(error) => {
                    tracing::warn!(worker = %self.id, %error, "cannot attach; trying again");
                    continue;
                }
            };
            let interval = worker.heartbeat_interval;
            let batches = worker.report_batches;
            let (tx, rx) = worker.into_parts();
            match self.serve(tx, rx, interval, batches).await {
                End::Stopped => return,
                End::Lost => tracing::info!(worker = %self.id, "lost the leader; attaching again"),
            }
        }
    }

    fn attached_tasks(&self) -> Vec<AttachedTask> {
        self.jobs
            .iter()
            .flat_map(|(job, j)| {
                j.tasks.iter().map(move |t| AttachedTask {
                    job_id: job.clone(),
                    vertex: t.task.vertex.clone(),
                    subtask: t.task.subtask,
                    attempt: u64::from(j.attempt),
                    status: "running".into(),
                })
            })
            .collect()
    }

    async fn serve(
        &mut self,
        tx: mpsc::Sender<WorkerMessage>,
        mut rx: Streaming<LeaderMessage>,
        interval: Duration,
        batches: bool,
    ) -> End {
        let mut beat = tokio::time::interval(interval);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let quiet_limit = interval * 5;
        let mut last_heard = Instant::now();
        let mut sequence = 0u64;
        loop {
            tokio::select! {
                _ = self.stop.changed() => return End::Stopped,
                _ = beat.tick() => {
                    sequence += 1;
                    let hb = WorkerMessage { body: Some(worker_message::Body::Heartbeat(Heartbeat { sequence })) };
                    if tx.send(hb).await.is_err() {
                        return End::Lost;
                    }
                }
                _ = tokio::time::sleep_until(last_heard + quiet_limit) => return End::Lost,
                msg = rx.message() => {
                    last_heard = Instant::now();
                    let body = match msg {
                        Ok(Some(LeaderMessage { body: Some(body), .. })) => body,
                        Ok(Some(_)) => continue,
                        Ok(None) | Err(_) => return End::Lost,
                    };
                    let reports = self.on_message(body);
                    for body in self.encode(reports, batches) {
                        if tx.send(WorkerMessage { body: Some(body) }).await.is_err() {
                            return End::Lost;
                        }
                    }
                }
            }
        }
    }

    /// The stream messages carrying `reports`: one numbered batch if the leader takes batches
    /// (as a real worker's outbox sends them), else one unnumbered message per report.
    fn encode(&mut self, reports: Vec<TaskMessage>, batches: bool) -> Vec<worker_message::Body> {
        let mut encoded = Vec::with_capacity(reports.len());
        for report in &reports {
            match serde_json::to_vec(report) {
                Ok(json) => encoded.push(json),
                Err(error) => tracing::error!(worker = %self.id, %error, "cannot encode a report"),
            }
        }
        if !batches {
            return encoded.into_iter().map(worker_message::Body::ReportJson).collect();
        }
        let mut bodies = Vec::new();
        let mut rest = encoded.into_iter().peekable();
        while rest.peek().is_some() {
            let reports = rest
                .by_ref()
                .take(BATCH_REPORTS)
                .map(|json| {
                    self.next_seq += 1;
                    Report { seq: self.next_seq, json }
                })
                .collect();
            bodies.push(worker_message::Body::Reports(ReportBatch { reports }));
        }
        bodies
    }

    /// Handles one leader message; returns the reports to send.
    fn on_message(&mut self, body: leader_message::Body) -> Vec<TaskMessage> {
        match body {
            leader_message::Body::DeployJson(json) => match serde_json::from_slice::<Deployment>(&json) {
                Ok(d) => self.deploy(&d),
                Err(error) => {
                    tracing::error!(worker = %self.id, %error, "undecodable deployment");
                    Vec::new()
                }
            },
            leader_message::Body::CommandJson(json) => match serde_json::from_slice::<TaskCommand>(&json) {
                Ok(c) => self.command(c),
                Err(error) => {
                    tracing::error!(worker = %self.id, %error, "undecodable command");
                    Vec::new()
                }
            },
            leader_message::Body::Error(e) => {
                tracing::warn!(worker = %self.id, code = e.code, message = %e.message, "the leader refused a message");
                Vec::new()
            }
            leader_message::Body::Registered(_)
            | leader_message::Body::Heartbeat(_)
            | leader_message::Body::Confirmed(_) => Vec::new(),
        }
    }

    fn deploy(&mut self, d: &Deployment) -> Vec<TaskMessage> {
        let tasks: Vec<TaskAttemptId> = match subtasks(d) {
            Ok(s) => s.iter().map(|(v, i)| attempt_id(d, v, *i)).collect(),
            Err(error) => {
                tracing::error!(worker = %self.id, job = %d.job_id, %error, "deployment without a usable graph");
                return Vec::new();
            }
        };
        self.observed.update(&d.job_id, |o| {
            o.deployments += 1;
            o.attempt = d.attempt;
        });
        let reports = tasks
            .iter()
            .map(|t| TaskMessage::Status { task: t.clone(), status: TaskStatus::Running })
            .collect();
        self.jobs.insert(d.job_id.clone(), SimJob { attempt: d.attempt, tasks, triggers: HashMap::new() });
        reports
    }

    fn command(&mut self, c: TaskCommand) -> Vec<TaskMessage> {
        let Some(job) = self.jobs.get_mut(&c.job_id).filter(|j| j.attempt == c.attempt) else {
            return Vec::new();
        };
        let now = Instant::now();
        match c.body {
            ToTask::TriggerCheckpoint { checkpoint_id, .. } => {
                // One acknowledgement per task and checkpoint, however the trigger was split.
                if job.triggers.contains_key(&checkpoint_id) {
                    return Vec::new();
                }
                if job.triggers.len() >= TRIGGERS_KEPT
                    && let Some(oldest) = job.triggers.keys().min().copied()
                {
                    job.triggers.remove(&oldest);
                }
                job.triggers.insert(checkpoint_id, now);
                self.observed.update(&c.job_id, |o| o.triggers += 1);
                job.tasks
                    .iter()
                    .map(|t| TaskMessage::Acknowledge {
                        task: t.clone(),
                        checkpoint_id,
                        state: SubtaskState::default(),
                        metrics: TaskCheckpointMetrics::default(),
                    })
                    .collect()
            }
            ToTask::NotifyCheckpointComplete { checkpoint_id } => {
                if let Some(triggered) = job.triggers.remove(&checkpoint_id) {
                    let completion = Completion { checkpoint_id, at: now, end_to_end: now - triggered };
                    self.observed.update(&c.job_id, |o| o.completions.push(completion));
                }
                Vec::new()
            }
            ToTask::NotifyCheckpointAborted { checkpoint_id } => {
                job.triggers.remove(&checkpoint_id);
                self.observed.update(&c.job_id, |o| o.aborted += 1);
                Vec::new()
            }
            ToTask::Cancel => {
                let reports = job
                    .tasks
                    .iter()
                    .map(|t| TaskMessage::Status { task: t.clone(), status: TaskStatus::Canceled })
                    .collect();
                self.jobs.remove(&c.job_id);
                reports
            }
        }
    }
}
