//! One `TaskGateway.Attach` stream, from the first message to its end.
//!
//! ```text
//! attach (register queued first) ─▶ wait for `registered` (bounded) ─▶ attach the job host
//!    ─▶ loop: leader message │ heartbeat tick │ liveness deadline │ shutdown
//! ```
//!
//! Every leader message passes the worker's [`TermFence`] first: a lower term than the highest
//! seen is logged and ignored, and a `registered` from a lower term means a stale leader, so the
//! stream is dropped. Any message, of any kind, proves the leader alive; none within the
//! heartbeat timeout ends the session. Deployments and commands go to the job host, which owns
//! the jobs: a session ending never touches them.

use std::time::Duration;

use cairn_proto::leader_hint::{LeaderHint, parse_not_leader};
use cairn_proto::v1::task_gateway_client::TaskGatewayClient;
use cairn_proto::v1::{
    AttachedTask, GatewayError, Heartbeat, LeaderMessage, RegisterWorker, Registered, WorkerMessage,
    leader_message, worker_message,
};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior, sleep_until};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use super::host::HostCommand;
use super::{JobsView, LeaderInfo, WorkerStatus};
use cairn_protocol::messages::{Deployment, TaskCommand, TermFence};

/// Capacity of the outbound (worker → leader) stream.
const OUTBOUND_CAPACITY: usize = 1024;
/// Heartbeat interval when the leader gives none.
const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on the wait for the leader to close the stream after the worker half-closed it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a session ended (or never started).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no answer to Attach within {0:?}")]
    AttachTimeout(Duration),
    #[error("not the leader (leader hint: id {:?}, address {:?})", .0.leader_id, .0.leader_addr)]
    NotLeader(LeaderHint),
    #[error("Attach refused: {0}")]
    Refused(tonic::Status),
    #[error("no `registered` within {0:?}")]
    RegisterTimeout(Duration),
    #[error("registered by a stale leader: term {term} is below the highest term seen, {highest}")]
    StaleLeader { term: u64, highest: u64 },
    #[error("the leader ended the stream")]
    StreamEnded,
    #[error("the stream broke: {0}")]
    StreamBroken(tonic::Status),
    #[error("no message from the leader within the heartbeat timeout ({0:?})")]
    HeartbeatTimeout(Duration),
    #[error("the job host stopped")]
    HostGone,
}

/// How a session went.
#[derive(Debug)]
pub struct SessionEnd {
    /// A leader accepted the registration.
    pub registered: bool,
    /// `Ok` when the worker is shutting down.
    pub result: Result<(), SessionError>,
}

/// What a session needs from the connection loop, borrowed for its duration.
pub(crate) struct Session<'a> {
    pub addr: &'a str,
    pub worker_id: &'a str,
    pub slots: u32,
    pub data_addr: &'a str,
    pub connect_timeout: Duration,
    pub register_timeout: Duration,
    /// The worker token for `Attach`, when the worker has one.
    pub auth: &'a cairn_client::BearerAuth,
    /// Term fencing for the whole worker process (owned by the connection loop).
    pub fence: &'a mut TermFence,
    pub host: &'a mpsc::Sender<HostCommand>,
    pub jobs: &'a watch::Receiver<JobsView>,
    pub status: &'a watch::Sender<WorkerStatus>,
    pub shutdown: &'a mut watch::Receiver<bool>,
}

/// The liveness settings a leader registered the worker with.
struct Liveness {
    interval: Duration,
    timeout: Duration,
}

impl Session<'_> {
    /// Runs one session on `channel`.
    pub(crate) async fn run(mut self, channel: Channel) -> SessionEnd {
        let (out, out_rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let register = self.register_message();
        let tasks = register.tasks.len();
        // A fresh channel with room: this cannot fail. The leader reads it first, whatever it
        // does before answering the call.
        let _ = out.try_send(WorkerMessage { body: Some(worker_message::Body::Register(register)) });
        let mut inbound = match self.attach(channel, out_rx).await {
            Ok(s) => s,
            Err(e) => return SessionEnd { registered: false, result: Err(e) },
        };
        let (term, registered) = match self.await_registered(&mut inbound).await {
            Ok(r) => r,
            Err(e) => return SessionEnd { registered: false, result: Err(e) },
        };
        let liveness = self.on_registered(term, &registered, tasks);
        if self
            .host
            .send(HostCommand::Attach { outbox: out.clone(), batches: registered.report_batches })
            .await
            .is_err()
        {
            return SessionEnd { registered: true, result: Err(SessionError::HostGone) };
        }
        let result = self.serve(&mut inbound, out, liveness).await;
        SessionEnd { registered: true, result }
    }

    fn register_message(&self) -> RegisterWorker {
        let tasks = self
            .jobs
            .borrow()
            .tasks
            .iter()
            .map(|t| AttachedTask {
                job_id: t.id.task.job.clone(),
                vertex: t.id.task.vertex.clone(),
                subtask: t.id.task.subtask,
                attempt: u64::from(t.id.attempt),
                status: super::status_name(&t.status).to_owned(),
            })
            .collect();
        RegisterWorker {
            worker_id: self.worker_id.to_owned(),
            slots: self.slots,
            tasks,
            highest_term_seen: self.fence.highest(),
            data_addr: self.data_addr.to_owned(),
        }
    }

    async fn attach(
        &mut self,
        channel: Channel,
        out_rx: mpsc::Receiver<WorkerMessage>,
    ) -> Result<Streaming<LeaderMessage>, SessionError> {
        let mut client = TaskGatewayClient::with_interceptor(channel, self.auth.clone());
        let call = client.attach(ReceiverStream::new(out_rx));
        match tokio::time::timeout(self.connect_timeout, call).await {
            Err(_) => Err(SessionError::AttachTimeout(self.connect_timeout)),
            Ok(Err(status)) => Err(refusal(status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// Waits for `registered`, fencing and logging whatever comes before it.
    async fn await_registered(
        &mut self,
        inbound: &mut Streaming<LeaderMessage>,
    ) -> Result<(u64, Registered), SessionError> {
        let deadline = Instant::now() + self.register_timeout;
        loop {
            let msg = tokio::select! {
                msg = inbound.message() => msg,
                _ = sleep_until(deadline) => return Err(SessionError::RegisterTimeout(self.register_timeout)),
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => return Err(SessionError::StreamEnded),
                Err(status) => return Err(refusal(status)),
            };
            match msg.body {
                Some(leader_message::Body::Registered(r)) => {
                    if !self.fence.admit(msg.term) {
                        return Err(SessionError::StaleLeader {
                            term: msg.term,
                            highest: self.fence.highest(),
                        });
                    }
                    return Ok((msg.term, r));
                }
                Some(leader_message::Body::Error(e)) => self.on_error(msg.term, &e),
                Some(leader_message::Body::Confirmed(c)) => {
                    let cmd = HostCommand::Confirmed { up_to: c.up_to };
                    self.host.send(cmd).await.map_err(|_| SessionError::HostGone)?;
                }
                other => tracing::warn!(
                    addr = self.addr,
                    term = msg.term,
                    kind = body_kind(other.as_ref()),
                    "leader message before `registered`; ignored"
                ),
            }
        }
    }

    fn on_registered(&mut self, term: u64, r: &Registered, tasks: usize) -> Liveness {
        let interval = match r.heartbeat_interval_ms {
            0 => DEFAULT_HEARTBEAT_INTERVAL,
            ms => Duration::from_millis(ms).max(Duration::from_millis(1)),
        };
        let timeout = match r.heartbeat_timeout_ms {
            0 => interval * 3,
            ms => Duration::from_millis(ms),
        };
        tracing::info!(
            addr = self.addr, leader_id = r.leader_id, term, tasks,
            heartbeat_interval = ?interval, heartbeat_timeout = ?timeout,
            "registered with the leader"
        );
        let highest = self.fence.highest();
        self.status.send_modify(|s| {
            s.leader = Some(LeaderInfo {
                addr: self.addr.to_owned(),
                leader_id: r.leader_id,
                term,
                heartbeat_interval: interval,
                heartbeat_timeout: timeout,
            });
            s.highest_term = highest;
            s.registrations += 1;
            s.last_error = None;
        });
        Liveness { interval, timeout }
    }

    /// The registered session's loop.
    async fn serve(
        &mut self,
        inbound: &mut Streaming<LeaderMessage>,
        out: mpsc::Sender<WorkerMessage>,
        liveness: Liveness,
    ) -> Result<(), SessionError> {
        let mut ticker = tokio::time::interval_at(Instant::now() + liveness.interval, liveness.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut sequence = 0u64;
        let mut last_heard = Instant::now();
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.changed() => {
                    close(inbound, out).await;
                    return Ok(());
                }
                msg = inbound.message() => {
                    last_heard = Instant::now();
                    match msg {
                        Ok(Some(msg)) => self.on_message(msg).await?,
                        Ok(None) => return Err(SessionError::StreamEnded),
                        // A leader that stepped down ends the stream naming its successor.
                        Err(status) => return Err(match parse_not_leader(&status) {
                            Some(hint) => SessionError::NotLeader(hint),
                            None => SessionError::StreamBroken(status),
                        }),
                    }
                }
                _ = sleep_until(last_heard + liveness.timeout) => {
                    return Err(SessionError::HeartbeatTimeout(liveness.timeout));
                }
                _ = ticker.tick() => {
                    sequence += 1;
                    let hb = WorkerMessage { body: Some(worker_message::Body::Heartbeat(Heartbeat { sequence })) };
                    // A full outbound queue means the stream is busy anyway: skip this beat.
                    if let Err(mpsc::error::TrySendError::Closed(_)) = out.try_send(hb) {
                        return Err(SessionError::StreamEnded);
                    }
                }
            }
        }
    }

    async fn on_message(&mut self, msg: LeaderMessage) -> Result<(), SessionError> {
        let highest = self.fence.highest();
        if !self.fence.admit(msg.term) {
            tracing::warn!(
                addr = self.addr,
                term = msg.term,
                highest,
                kind = body_kind(msg.body.as_ref()),
                "message from a lower term than the highest seen; ignored"
            );
            return Ok(());
        }
        if msg.term > highest {
            let term = msg.term;
            self.status.send_modify(|s| s.highest_term = term);
        }
        match msg.body {
            None => tracing::warn!(addr = self.addr, term = msg.term, "empty leader message; ignored"),
            Some(leader_message::Body::Heartbeat(_)) => {}
            Some(leader_message::Body::Registered(r)) => {
                tracing::info!(
                    addr = self.addr,
                    term = msg.term,
                    leader_id = r.leader_id,
                    "registered again"
                );
            }
            Some(leader_message::Body::Error(e)) => self.on_error(msg.term, &e),
            Some(leader_message::Body::Confirmed(c)) => {
                let cmd = HostCommand::Confirmed { up_to: c.up_to };
                self.host.send(cmd).await.map_err(|_| SessionError::HostGone)?;
            }
            Some(leader_message::Body::DeployJson(json)) => match serde_json::from_slice::<Deployment>(&json)
            {
                Ok(d) => {
                    tracing::info!(job = %d.job_id, attempt = d.attempt, term = msg.term, "deployment received");
                    let cmd = HostCommand::Deploy { deployment: Box::new(d), term: msg.term };
                    self.host.send(cmd).await.map_err(|_| SessionError::HostGone)?;
                }
                Err(e) => tracing::error!(
                    addr = self.addr, term = msg.term, error = %e, bytes = json.len(),
                    "deployment cannot be decoded; ignored"
                ),
            },
            Some(leader_message::Body::CommandJson(json)) => {
                match serde_json::from_slice::<TaskCommand>(&json) {
                    Ok(c) => {
                        tracing::debug!(job = %c.job_id, attempt = c.attempt, term = msg.term, body = ?c.body, "command received");
                        let cmd = HostCommand::Command { command: c, term: msg.term };
                        self.host.send(cmd).await.map_err(|_| SessionError::HostGone)?;
                    }
                    Err(e) => tracing::error!(
                        addr = self.addr, term = msg.term, error = %e, bytes = json.len(),
                        "command cannot be decoded; ignored"
                    ),
                }
            }
        }
        Ok(())
    }

    fn on_error(&self, term: u64, e: &GatewayError) {
        tracing::warn!(
            addr = self.addr, term, code = e.code, code_name = ?tonic::Code::from_i32(e.code),
            message = %e.message, "the leader refused a message"
        );
    }
}

/// Half-closes the stream and waits (bounded) for the leader to end it, so that what was queued
/// gets out.
async fn close(inbound: &mut Streaming<LeaderMessage>, out: mpsc::Sender<WorkerMessage>) {
    drop(out);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async { while let Ok(Some(_)) = inbound.message().await {} })
        .await;
}

/// A refused call or a stream that ended in an error status: not-leader or something else.
fn refusal(status: tonic::Status) -> SessionError {
    match parse_not_leader(&status) {
        Some(hint) => SessionError::NotLeader(hint),
        None => SessionError::Refused(status),
    }
}

fn body_kind(body: Option<&leader_message::Body>) -> &'static str {
    match body {
        None => "empty",
        Some(leader_message::Body::Registered(_)) => "registered",
        Some(leader_message::Body::Heartbeat(_)) => "heartbeat",
        Some(leader_message::Body::DeployJson(_)) => "deploy",
        Some(leader_message::Body::CommandJson(_)) => "command",
        Some(leader_message::Body::Error(_)) => "error",
        Some(leader_message::Body::Confirmed(_)) => "confirmed",
    }
}
