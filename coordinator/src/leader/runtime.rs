//! The coordinator runtime of one leader term: the worker registry, slot leasing, liveness,
//! and one job driver per live job.
//!
//! One owner task ([`run`]) holds all of it; the gateway and the job drivers talk to it through
//! a bounded command channel ([`TermHandle`]). Every message to a worker is stamped with this
//! term, the fencing token workers check.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::v1::{AttachedTask, Heartbeat, LeaderMessage, leader_message};
use cairn_raft::model::JobId;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tonic::Status;

use super::LeaderOptions;
use super::api::StartRefusal;
use super::handle::{
    Routes, RuntimeCmd, Session, TermHandle, WorkerGrant, WorkerInfo, WorkerLease, WorkerSlots,
};
use super::job::{JobDriver, JobHandle, JobInput};
use super::leases::Leases;
use super::liveness::Liveness;
use super::placement::{self, Candidate};
use crate::replica::ReplicaContext;

pub(crate) struct TermRuntime {
    handle: TermHandle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TermRuntime {
    pub(crate) fn start(ctx: ReplicaContext, options: Arc<LeaderOptions>, term: u64) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let (routes, routes_rx) = watch::channel(Routes::default());
        let handle = TermHandle::new(
            term,
            ctx.id,
            options.workers.heartbeat_interval,
            options.workers.heartbeat_timeout,
            tx,
            routes_rx,
        );
        let (stop_tx, stop_rx) = oneshot::channel();
        let tick_every = options.workers.heartbeat_interval.min(Duration::from_millis(200));
        let liveness = Liveness::new(options.workers.heartbeat_timeout, tick_every, Instant::now());
        let rt = Runtime {
            grace_until: Instant::now() + options.workers.reattach_grace,
            grace_over: false,
            ctx,
            options,
            handle: handle.clone(),
            workers: BTreeMap::new(),
            leases: Leases::default(),
            waiting: BTreeSet::new(),
            jobs: BTreeMap::new(),
            routes,
            drivers: JoinSet::new(),
            next_session: 1,
            last_heartbeat_sent: Instant::now(),
            liveness,
        };
        let task = tokio::spawn(rt.run(rx, stop_rx));
        Self { handle, stop: Some(stop_tx), task }
    }

    pub(crate) fn handle(&self) -> TermHandle {
        self.handle.clone()
    }

    pub(crate) async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if tokio::time::timeout(Duration::from_secs(10), &mut self.task).await.is_err() {
            tracing::warn!(term = self.handle.term, "runtime did not stop in time; aborting it");
            self.task.abort();
        }
    }
}

struct Worker {
    session: Session,
    slots: u32,
    outbox: mpsc::Sender<LeaderMessage>,
    connected: bool,
    /// What the worker proved when this session attached.
    identity: crate::auth::WorkerIdentity,
    /// Its data exchange address, as announced.
    data_addr: String,
}

struct Runtime {
    ctx: ReplicaContext,
    options: Arc<LeaderOptions>,
    handle: TermHandle,
    workers: BTreeMap<String, Worker>,
    /// Which worker each deployed job runs on, and how many slots it takes.
    leases: Leases,
    /// Jobs told that no worker had room for them; they ask again when workers change.
    waiting: BTreeSet<JobId>,
    jobs: BTreeMap<JobId, JobHandle>,
    /// `jobs` as published to the stream readers, which route reports by it.
    routes: watch::Sender<Routes>,
    /// Every job driver task; nothing runs detached.
    drivers: JoinSet<JobId>,
    grace_until: Instant,
    grace_over: bool,
    next_session: u64,
    last_heartbeat_sent: Instant,
    liveness: Liveness,
}

impl Runtime {
    async fn run(mut self, mut rx: mpsc::Receiver<RuntimeCmd>, mut stop: oneshot::Receiver<()>) {
        let term = self.handle.term;
        self.discover_jobs(true);
        let mut tick = tokio::time::interval(self.liveness.tick_every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                Some(done) = self.drivers.join_next() => self.on_driver_exit(done),
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd).await,
                    None => break,
                },
                _ = tick.tick() => self.on_tick().await,
            }
        }
        tracing::info!(term, "stopping the coordinator runtime");
        self.ctx.telemetry.set_registered_workers(0);
        for w in self.workers.values() {
            w.session.end();
        }
        for job in self.jobs.values() {
            job.send_now(JobInput::Stop);
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        while !self.drivers.is_empty() {
            match tokio::time::timeout_at(deadline, self.drivers.join_next()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(term, "job drivers did not stop in time; aborting them");
                    self.drivers.abort_all();
                    break;
                }
            }
        }
    }

    fn on_driver_exit(&mut self, done: Result<JobId, tokio::task::JoinError>) {
        match done {
            Ok(job) => {
                tracing::info!(job = %job, "job driver finished");
                self.jobs.remove(&job);
                self.leases.remove(&job);
                self.waiting.remove(&job);
                self.publish_routes();
            }
            Err(e) => tracing::error!(error = %e, "a job driver panicked or was aborted"),
        }
    }

    /// Replaces the routing table the stream readers use (drivers start and end rarely).
    fn publish_routes(&self) {
        let routes: HashMap<JobId, _> =
            self.jobs.iter().map(|(j, h)| (j.clone(), h.reports.clone())).collect();
        self.routes.send_replace(Arc::new(routes));
    }

    /// Starts a driver for every live job without one.
    fn discover_jobs(&mut self, at_term_start: bool) {
        let mut started = false;
        // A job without a graph is a registry entry only (its counter and checkpoint store are
        // used through the Store API by an external runtime): there is nothing to deploy.
        for job in self.ctx.reader.drivable_jobs() {
            if self.jobs.contains_key(&job) {
                continue;
            }
            let reattach = at_term_start && !self.grace_over;
            let (driver, handle) = JobDriver::new(
                self.ctx.clone(),
                self.options.clone(),
                self.handle.clone(),
                job.clone(),
                reattach,
            );
            tracing::info!(job = %job, term = self.handle.term, reattach, "starting job driver");
            self.jobs.insert(job, handle);
            self.drivers.spawn(driver.run());
            started = true;
        }
        if started {
            self.publish_routes();
        }
    }

    async fn on_tick(&mut self) {
        let now = Instant::now();
        self.discover_jobs(false);
        if !self.grace_over && now >= self.grace_until {
            self.grace_over = true;
            for job in self.jobs.values() {
                job.send(JobInput::GraceEnded).await;
            }
        }
        let verdict = self.liveness.tick(now);
        if let Some(stalled) = verdict.stalled {
            tracing::warn!(stalled = ?stalled, workers = self.workers.len(),
                "the coordinator runtime did not run for a while; not counting that time against workers");
        }
        let timeout = self.liveness.timeout();
        for id in verdict.lost {
            if let Some(w) = self.workers.remove(&id) {
                w.session.end();
            }
            self.ctx.telemetry.set_registered_workers(self.workers.len());
            tracing::warn!(worker = %id, timeout = ?timeout, "worker lost: no heartbeat");
            self.worker_lost(&id).await;
        }
        if now.duration_since(self.last_heartbeat_sent) >= self.options.workers.heartbeat_interval {
            self.last_heartbeat_sent = now;
            let msg = self.handle.leader_message(leader_message::Body::Heartbeat(Heartbeat { sequence: 0 }));
            for w in self.workers.values().filter(|w| w.connected) {
                // A full outbox means a slow worker; its liveness is judged by its own heartbeats.
                let _ = w.outbox.try_send(msg.clone());
            }
        }
    }

    async fn worker_lost(&mut self, worker_id: &str) {
        let jobs: Vec<JobId> = self.leases.jobs_on(worker_id).cloned().collect();
        for job in jobs {
            self.leases.remove(&job);
            if let Some(h) = self.jobs.get(&job) {
                h.send(JobInput::WorkerLost { worker_id: worker_id.to_owned() }).await;
            }
        }
        self.workers_changed().await;
    }

    /// Tells the jobs waiting for a worker to ask again (the others have theirs).
    async fn workers_changed(&mut self) {
        for job in std::mem::take(&mut self.waiting) {
            if let Some(h) = self.jobs.get(&job) {
                h.send(JobInput::WorkersChanged).await;
            }
        }
    }

    /// Chooses workers for a deployment and leases their slots to `job`.
    fn acquire(
        &mut self,
        job: &JobId,
        groups: &[u32],
        strategy: cairn_raft::model::PlacementStrategy,
    ) -> Option<Vec<WorkerGrant>> {
        let candidates: Vec<Candidate> = self
            .workers
            .iter()
            .filter(|(_, w)| w.connected)
            .map(|(id, w)| Candidate {
                worker_id: id.clone(),
                free: self.free_slots(id),
                exchange: !w.data_addr.is_empty(),
            })
            .collect();
        let placed = placement::place(groups, &candidates, strategy)?;
        let mut grants = Vec::with_capacity(placed.len());
        let mut leased = Vec::with_capacity(placed.len());
        for (worker_id, gs) in placed {
            let w = self.workers.get(&worker_id)?;
            leased.push((worker_id.clone(), gs.iter().map(|g| groups[*g]).sum()));
            grants.push(WorkerGrant {
                lease: WorkerLease { worker_id, outbox: w.outbox.clone() },
                data_addr: w.data_addr.clone(),
                groups: gs,
            });
        }
        self.leases.set(job.clone(), leased);
        Some(grants)
    }

    fn free_slots(&self, worker_id: &str) -> u32 {
        self.workers.get(worker_id).map_or(0, |w| w.slots.saturating_sub(self.leases.used(worker_id)))
    }

    async fn on_command(&mut self, cmd: RuntimeCmd) {
        match cmd {
            RuntimeCmd::Attach { info, outbox, reply } => {
                let r = self.attach(info, outbox).await;
                let _ = reply.send(r);
            }
            RuntimeCmd::Detach { worker_id, session } => {
                if let Some(w) = self.workers.get_mut(&worker_id)
                    && w.session.id == session
                {
                    // Kept until its heartbeat timeout: it may reconnect.
                    w.connected = false;
                    tracing::info!(worker = %worker_id, session, "worker stream closed");
                }
            }
            RuntimeCmd::Heartbeat { worker_id, session } => {
                if self.workers.get(&worker_id).is_some_and(|w| w.session.id == session) {
                    self.liveness.seen(&worker_id, Instant::now());
                }
            }
            RuntimeCmd::AcquireWorkers { job, groups, strategy, reply } => {
                let grants = self.acquire(&job, &groups, strategy);
                if grants.is_none() {
                    self.waiting.insert(job);
                }
                let _ = reply.send(grants);
            }
            RuntimeCmd::AdoptLeases { job, workers } => {
                self.leases.set(job, workers);
            }
            RuntimeCmd::ReleaseWorker { job } => {
                if self.leases.remove(&job).is_some() {
                    self.workers_changed().await;
                }
            }
            RuntimeCmd::Trigger { job, kind, reply } => match self.jobs.get(&job) {
                Some(h) => h.send(JobInput::Trigger { kind, reply }).await,
                None => {
                    let _ = reply.send(Err(format!("unknown job `{job}` (or not running)")));
                }
            },
            RuntimeCmd::TriggerStarted { job, kind, key, started } => match self.jobs.get(&job) {
                Some(h) => h.send(JobInput::TriggerStarted { kind, key, started }).await,
                None => {
                    let why = format!("job `{job}` is not running on this leader");
                    let _ = started.send(Err(StartRefusal::Refused(why)));
                }
            },
            RuntimeCmd::Cancel { job, reply } => match self.jobs.get(&job) {
                Some(h) => h.send(JobInput::Cancel { reply }).await,
                None => {
                    let _ = reply.send(());
                }
            },
            RuntimeCmd::ConfigChanged { job, subsumed } => {
                if let Some(h) = self.jobs.get(&job) {
                    h.send(JobInput::ConfigChanged { subsumed }).await;
                }
            }
            RuntimeCmd::Workers { reply } => {
                let workers = self
                    .workers
                    .iter()
                    .map(|(id, w)| WorkerSlots {
                        worker_id: id.clone(),
                        slots: w.slots,
                        used: w.slots.saturating_sub(self.free_slots(id)),
                        connected: w.connected,
                        jobs: self.leases.jobs_on(id).map(|j| j.to_string()).collect(),
                        identity: w.identity.clone(),
                        data_addr: w.data_addr.clone(),
                    })
                    .collect();
                let _ = reply.send(workers);
            }
            RuntimeCmd::Jobs { reply } => {
                // Asked of every driver at once, and awaited apart from this loop: with a
                // thousand busy drivers, awaiting each in turn here kept the runtime from
                // placing jobs for as long as an operator (or the console) kept asking.
                let handles: Vec<JobHandle> = self.jobs.values().cloned().collect();
                tokio::spawn(async move {
                    let views = futures::future::join_all(handles.iter().map(JobHandle::summary)).await;
                    let _ = reply.send(views.into_iter().flatten().collect());
                });
            }
            RuntimeCmd::Job { job, reply } => {
                let handle = self.jobs.get(&job).cloned();
                tokio::spawn(async move {
                    let view = match handle {
                        Some(h) => h.view().await,
                        None => None,
                    };
                    let _ = reply.send(view);
                });
            }
        }
    }

    async fn attach(
        &mut self,
        info: WorkerInfo,
        outbox: mpsc::Sender<LeaderMessage>,
    ) -> Result<Session, Status> {
        if info.highest_term_seen > self.handle.term {
            return Err(Status::failed_precondition(format!(
                "this leader's term {} is older than term {} the worker has seen; find the current leader",
                self.handle.term, info.highest_term_seen
            )));
        }
        if let Some(live) = self.workers.get(&info.worker_id).filter(|w| w.connected)
            && live.identity != info.identity
        {
            return Err(Status::permission_denied(format!(
                "worker `{}` is attached with {}; another session for it must prove the same identity, not {}",
                info.worker_id, live.identity, info.identity
            )));
        }
        let session = Session::new(self.next_session);
        self.next_session += 1;
        let leased = self.leases.used(&info.worker_id);
        if info.slots < leased {
            tracing::warn!(worker = %info.worker_id, slots = info.slots, leased, "worker re-attached with fewer slots than leased");
        }
        let replaced = self.workers.insert(
            info.worker_id.clone(),
            Worker {
                session: session.clone(),
                slots: info.slots,
                outbox: outbox.clone(),
                connected: true,
                identity: info.identity.clone(),
                data_addr: info.data_addr.clone(),
            },
        );
        if let Some(old) = replaced {
            // The superseded stream's reports are refused from now on.
            old.session.end();
        }
        self.liveness.seen(&info.worker_id, Instant::now());
        self.ctx.telemetry.set_registered_workers(self.workers.len());
        tracing::info!(worker = %info.worker_id, session = session.id, slots = info.slots, tasks = info.tasks.len(), term = self.handle.term, "worker attached");
        // Hand each job the tasks of it that the worker runs; tell the worker to cancel tasks of
        // jobs this leader does not run.
        let mut by_job: BTreeMap<String, Vec<AttachedTask>> = BTreeMap::new();
        for t in info.tasks {
            by_job.entry(t.job_id.clone()).or_default().push(t);
        }
        // Jobs this term deployed on the worker whose tasks it does not list: their deployment
        // (or the tasks) went with the old stream. Each learns it from an empty list.
        for job in self.leases.jobs_on(&info.worker_id) {
            by_job.entry(job.to_string()).or_default();
        }
        let lease = WorkerLease { worker_id: info.worker_id.clone(), outbox };
        let mut orphans = BTreeSet::new();
        for (job, tasks) in by_job {
            match JobId::new(job.clone()).ok().and_then(|j| self.jobs.get(&j).map(|h| (j, h))) {
                Some((_, h)) => h.send(JobInput::Attached { lease: lease.clone(), tasks }).await,
                None => {
                    for t in tasks {
                        orphans.insert((job.clone(), t.attempt));
                    }
                }
            }
        }
        for (job, attempt) in orphans {
            tracing::info!(job = %job, attempt, worker = %info.worker_id, "cancelling tasks of a job this leader does not run");
            super::job::send_cancel(&self.handle, &lease, &job, attempt as u32).await;
        }
        self.workers_changed().await;
        Ok(session)
    }
}
