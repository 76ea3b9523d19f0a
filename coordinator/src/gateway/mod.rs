//! The task gateway service: one bidirectional stream per worker, served by the leader.
//!
//! Every `Attach` must authenticate ([`WorkerAuth`]: a worker token, or a client certificate
//! naming the worker) before anything else, also on a replica that does not lead, and is refused
//! at once from a source whose attempts failed too often lately ([`limit`]); the worker id it
//! registers must be one its identity may use, and while a session for that id lives, another
//! session must prove the same identity. A refused attach changes nothing.
//!
//! A replica that does not lead refuses `Attach` with the not-leader status and the leader hint;
//! one that knows of no leader yet (an election, or its own runtime starting) first waits,
//! bounded, for the outcome ([`settle`]). On the leader, the first message must be a valid
//! `register`; then heartbeats and task reports flow in, and leader messages (all stamped with
//! the term) flow out through a bounded outbox. A report that cannot be decoded or is refused is
//! answered with an `error` message on the stream, which stays open; the refusal changes nothing.
//! When the term's runtime stops, the stream ends with the not-leader status naming the new
//! leader once it is known (bounded by the same wait), so the worker goes straight there.

use std::pin::Pin;
use std::time::Duration;

use cairn_proto::leader_hint::{LeaderHint, not_leader_status};
use cairn_proto::v1::task_gateway_server::{TaskGateway, TaskGatewayServer};
use cairn_proto::v1::{
    LeaderMessage, RegisterWorker, Registered, WorkerMessage, leader_message, worker_message,
};
use cairn_raft::model::JobId;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{WorkerAuth, WorkerIdentity};
use crate::leader::{LeaderHandle, TermHandle, WorkerInfo};
use crate::replica::ReplicaContext;

pub mod limit;
mod reader;
mod settle;

use limit::AttachLimiter;
use settle::Settled;

/// Largest message a worker may send (acknowledgements carry state handles).
pub const MAX_WORKER_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Capacity of a worker's outbox.
const OUTBOX: usize = 4096;
/// How long a new stream may take to register.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct GatewayService {
    ctx: ReplicaContext,
    leader: LeaderHandle,
    auth: WorkerAuth,
    limiter: std::sync::Arc<AttachLimiter>,
}

impl GatewayService {
    pub fn new(ctx: ReplicaContext, leader: LeaderHandle, auth: WorkerAuth) -> Self {
        Self { ctx, leader, auth, limiter: std::sync::Arc::new(AttachLimiter::default()) }
    }

    pub fn into_server(self) -> TaskGatewayServer<Self> {
        TaskGatewayServer::new(self)
            .max_decoding_message_size(MAX_WORKER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_WORKER_MESSAGE_BYTES)
    }

    fn not_leader(&self) -> Status {
        let m = self.ctx.metrics();
        let leader_id =
            m.current_leader.filter(|l| *l != self.ctx.id || m.state != openraft::ServerState::Leader);
        let leader_addr =
            leader_id.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
        not_leader_status("Attach", &LeaderHint { leader_id, leader_addr })
    }

    /// This replica's runtime for the current term; while an election or the runtime's start is
    /// under way, waits (bounded) for the outcome, so the refusal can name the leader.
    async fn leading(&self) -> Result<TermHandle, Status> {
        match settle::settle(&self.ctx, &self.leader).await {
            Settled::Here(term) => Ok(term),
            Settled::Elsewhere | Settled::Unknown => Err(self.not_leader()),
        }
    }

    /// How a stream ends once its outbox closed: cleanly while this replica leads (the session
    /// was superseded or the worker went), otherwise with the not-leader status, naming the new
    /// leader once one is known.
    async fn stream_end(&self) -> Option<Status> {
        match settle::settle(&self.ctx, &self.leader).await {
            Settled::Here(_) => None,
            Settled::Elsewhere | Settled::Unknown => Some(self.not_leader()),
        }
    }
}

fn validate_register(r: RegisterWorker, identity: WorkerIdentity) -> Result<WorkerInfo, Status> {
    let bad = |m: String| Err(Status::invalid_argument(m));
    if r.worker_id.is_empty() || r.worker_id.len() > 128 {
        return bad(format!("register.worker_id must be 1 to 128 characters, got {}", r.worker_id.len()));
    }
    if r.worker_id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("register.worker_id must not contain whitespace or control characters".into());
    }
    identity.allows(&r.worker_id)?;
    if r.slots == 0 || r.slots > 4096 {
        return bad(format!("register.slots must be between 1 and 4096, got {}", r.slots));
    }
    if !r.data_addr.is_empty() && (r.data_addr.len() > 256 || !cairn_proto::addr::is_host_port(&r.data_addr))
    {
        return bad(format!(
            "register.data_addr must be a host:port address of at most 256 bytes, got {:?}",
            r.data_addr.chars().take(64).collect::<String>()
        ));
    }
    for t in &r.tasks {
        JobId::new(t.job_id.clone())
            .map_err(|e| Status::invalid_argument(format!("register.tasks.job_id: {e}")))?;
        if t.vertex.is_empty() || t.attempt > u32::MAX as u64 {
            return bad(format!("register.tasks: invalid task {}/{}@{}", t.vertex, t.subtask, t.attempt));
        }
    }
    Ok(WorkerInfo {
        worker_id: r.worker_id,
        slots: r.slots,
        tasks: r.tasks,
        highest_term_seen: r.highest_term_seen,
        data_addr: r.data_addr,
        identity,
    })
}

type LeaderStream = Pin<Box<dyn Stream<Item = Result<LeaderMessage, Status>> + Send>>;

#[tonic::async_trait]
impl TaskGateway for GatewayService {
    type AttachStream = LeaderStream;

    async fn attach(&self, req: Request<Streaming<WorkerMessage>>) -> Result<Response<LeaderStream>, Status> {
        let source = req.remote_addr().map(|a| a.ip());
        self.limiter.admit(source)?;
        let identity = self.auth.authenticate(&req).inspect_err(|_| self.limiter.charge(source))?;
        // Not leading is no failure of the caller's: it goes where the answer says.
        let term = self.leading().await?;
        let stream = self.open(term, identity, req.into_inner()).await;
        stream.map(Response::new).inspect_err(|_| self.limiter.charge(source))
    }
}

impl GatewayService {
    /// Reads and checks the `register`, attaches the worker to the term's runtime and builds the
    /// stream of leader messages.
    async fn open(
        &self,
        term: TermHandle,
        identity: WorkerIdentity,
        mut inbound: Streaming<WorkerMessage>,
    ) -> Result<LeaderStream, Status> {
        let first = match tokio::time::timeout(REGISTER_TIMEOUT, inbound.message()).await {
            Err(_) => {
                return Err(Status::deadline_exceeded(
                    "no register message within 10s of opening the stream",
                ));
            }
            Ok(Err(status)) => return Err(status),
            Ok(Ok(None)) => {
                return Err(Status::invalid_argument("the stream closed before a register message"));
            }
            Ok(Ok(Some(m))) => m,
        };
        let info = match first.body {
            Some(worker_message::Body::Register(r)) => validate_register(r, identity)?,
            _ => return Err(Status::invalid_argument("the first message on a stream must be `register`")),
        };
        let worker_id = info.worker_id.clone();
        let (tx, rx) = mpsc::channel(OUTBOX);
        // `registered` goes first: attaching hands the worker's outbox to the jobs it runs, and
        // their drivers may send it commands at once (a worker ignores what precedes
        // `registered`). A refused attach drops it unsent with the stream.
        let registered = Registered {
            leader_id: term.leader_id,
            heartbeat_interval_ms: term.heartbeat_interval.as_millis() as u64,
            heartbeat_timeout_ms: term.heartbeat_timeout.as_millis() as u64,
            report_batches: true,
        };
        let _ = tx.try_send(term.leader_message(leader_message::Body::Registered(registered)));
        let session = term.attach(info, tx.clone()).await?;
        // The reader keeps only a weak sender, so the stream ends once the runtime lets go.
        let weak = tx.downgrade();
        drop(tx);
        let gateway = self.clone();
        tokio::spawn(reader::read_worker(term, worker_id, session, inbound, weak));
        // The stream ends at the reader's close marker, even while leases still hold the outbox;
        // when the term ended, with the status that names the new leader.
        let end = futures::stream::once(async move { gateway.stream_end().await });
        let stream = ReceiverStream::new(rx)
            .take_while(|m| m.body.is_some())
            .map(Ok)
            .chain(end.filter_map(|status| status.map(Err)));
        Ok(Box::pin(stream))
    }
}
