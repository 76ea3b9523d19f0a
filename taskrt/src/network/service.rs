//! A worker's data exchange listener, and the links of its job attempts.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::handshake::{self, ExchangeKey, Hello, RefuseReason};
use super::link::{self, LinkPlan};
use super::{ChannelId, NetworkError, NetworkOptions, plan_digest};
use crate::exchange::{PriorityBarrier, StreamElement};

/// The channels one job attempt has between this worker and one peer worker.
#[derive(Debug)]
pub struct PeerSpec {
    pub job: String,
    pub attempt: u64,
    pub key: ExchangeKey,
    pub peer_worker: String,
    /// The peer's data exchange address (used when this worker dials).
    pub peer_addr: SocketAddr,
    /// Channels produced here: the receivers of the producers' bounded channels.
    pub outbound: Vec<(ChannelId, mpsc::Receiver<StreamElement>)>,
    /// Channels consumed here: the senders into the consumers' bounded channels.
    pub inbound: Vec<(ChannelId, mpsc::Sender<StreamElement>)>,
    /// Priority lanes of outbound channels (those that have one).
    pub outbound_priority: Vec<(ChannelId, mpsc::Receiver<PriorityBarrier>)>,
    /// Priority lanes of inbound channels (those that have one).
    pub inbound_priority: Vec<(ChannelId, mpsc::Sender<PriorityBarrier>)>,
}

/// A running link of one job attempt with one peer. Dropping it tears the link down, closing
/// its channels.
#[derive(Debug)]
pub struct PeerLink {
    peer: String,
    task: JoinHandle<Result<(), NetworkError>>,
}

impl PeerLink {
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Waits until the link ends: `Ok` once every channel closed in both directions.
    pub async fn finished(mut self) -> Result<(), NetworkError> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(NetworkError::Protocol(format!("link task: {e}"))),
        }
    }
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type RegistrationKey = (String, u64, String);

/// What the acceptor of a link waits with until its dialer proves itself.
struct Registration {
    key: ExchangeKey,
    digest: [u8; 8],
    ready: oneshot::Sender<(TcpStream, u32)>,
}

struct Shared {
    worker_id: String,
    options: NetworkOptions,
    /// Links this worker accepts, by (job, attempt, dialing worker). Locked only briefly, never
    /// across an await.
    waiting: Mutex<HashMap<RegistrationKey, Registration>>,
}

impl Shared {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<RegistrationKey, Registration>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A worker's data exchange: one TCP listener for the links other workers dial, and the links it
/// dials itself. Dropping it stops the listener (running links keep going until dropped).
pub struct ExchangeService {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    listener: JoinHandle<()>,
}

impl std::fmt::Debug for ExchangeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeService")
            .field("worker_id", &self.shared.worker_id)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Drop for ExchangeService {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl ExchangeService {
    /// Binds the listener (port 0 picks a free port).
    pub async fn bind(
        listen: SocketAddr,
        worker_id: &str,
        options: NetworkOptions,
    ) -> Result<Self, NetworkError> {
        Self::check(worker_id, &options)?;
        Self::serve(TcpListener::bind(listen).await?, worker_id, options)
    }

    /// Binds the listener without awaiting (for callers that are not async). Must be called
    /// inside a tokio runtime.
    pub fn bind_now(
        listen: SocketAddr,
        worker_id: &str,
        options: NetworkOptions,
    ) -> Result<Self, NetworkError> {
        Self::check(worker_id, &options)?;
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        Self::serve(TcpListener::from_std(listener)?, worker_id, options)
    }

    fn check(worker_id: &str, options: &NetworkOptions) -> Result<(), NetworkError> {
        options.validate()?;
        if worker_id.is_empty() || worker_id.len() > handshake::MAX_ID {
            return Err(NetworkError::Config(format!(
                "the worker id must be 1..={} bytes long",
                handshake::MAX_ID
            )));
        }
        Ok(())
    }

    fn serve(listener: TcpListener, worker_id: &str, options: NetworkOptions) -> Result<Self, NetworkError> {
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            worker_id: worker_id.to_owned(),
            options,
            waiting: Mutex::new(HashMap::new()),
        });
        let listener = tokio::spawn(accept_loop(listener, shared.clone()));
        tracing::info!(worker = %worker_id, addr = %local_addr, "data exchange listening");
        Ok(Self { shared, local_addr, listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    /// Starts the link of a job attempt with one peer: dials it when this worker's id is the
    /// smaller, otherwise waits for its dial. Returns at once; the link runs in the background.
    pub fn open(&self, spec: PeerSpec) -> Result<PeerLink, NetworkError> {
        let me = &self.shared.worker_id;
        if spec.peer_worker == *me {
            return Err(NetworkError::InvalidLink(format!("worker {me} cannot link to itself")));
        }
        if spec.peer_worker.is_empty() || spec.peer_worker.len() > handshake::MAX_ID {
            return Err(NetworkError::InvalidLink(format!(
                "the peer worker id must be 1..={} bytes long",
                handshake::MAX_ID
            )));
        }
        let sends: BTreeSet<ChannelId> = spec.outbound.iter().map(|(c, _)| *c).collect();
        let receives: BTreeSet<ChannelId> = spec.inbound.iter().map(|(c, _)| *c).collect();
        if sends.len() != spec.outbound.len() || receives.len() != spec.inbound.len() {
            return Err(NetworkError::InvalidLink("a channel is listed twice".into()));
        }
        if let Some(ch) = sends.intersection(&receives).next() {
            return Err(NetworkError::InvalidLink(format!("{ch} is listed as both sent and received")));
        }
        let dials = *me < spec.peer_worker;
        let digest = if dials { plan_digest(&sends, &receives) } else { plan_digest(&receives, &sends) };
        let peer = spec.peer_worker.clone();
        let task = if dials {
            tokio::spawn(dial(self.shared.clone(), spec, digest))
        } else {
            let slot = (spec.job.clone(), spec.attempt, spec.peer_worker.clone());
            let (ready, arrived) = oneshot::channel();
            {
                let mut waiting = self.shared.waiting();
                if waiting.contains_key(&slot) {
                    return Err(NetworkError::InvalidLink(format!(
                        "job {} attempt {} already has a link with worker {}",
                        spec.job, spec.attempt, spec.peer_worker
                    )));
                }
                waiting.insert(slot.clone(), Registration { key: spec.key.clone(), digest, ready });
            }
            tokio::spawn(await_dial(self.shared.clone(), spec, slot, arrived))
        };
        Ok(PeerLink { peer, task })
    }
}

/// Removes a registration when the link that made it ends or is dropped.
struct Unregister {
    shared: Arc<Shared>,
    slot: RegistrationKey,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.shared.waiting().remove(&self.slot);
    }
}

fn plan(spec: PeerSpec, local_credit: u32, peer_credit: u32, options: &NetworkOptions) -> LinkPlan {
    LinkPlan {
        peer: spec.peer_worker,
        outbound: spec.outbound,
        inbound: spec.inbound,
        outbound_priority: spec.outbound_priority,
        inbound_priority: spec.inbound_priority,
        local_credit,
        peer_credit,
        write_queue: options.write_queue,
    }
}

async fn await_dial(
    shared: Arc<Shared>,
    spec: PeerSpec,
    slot: RegistrationKey,
    arrived: oneshot::Receiver<(TcpStream, u32)>,
) -> Result<(), NetworkError> {
    let guard = Unregister { shared: shared.clone(), slot };
    let timeout = shared.options.connect_timeout;
    let (stream, peer_credit) = match tokio::time::timeout(timeout, arrived).await {
        Ok(Ok(accepted)) => accepted,
        _ => {
            return Err(NetworkError::ConnectTimeout {
                peer: spec.peer_worker,
                timeout,
                last: "the peer did not dial".into(),
            });
        }
    };
    drop(guard);
    tracing::debug!(job = %spec.job, attempt = spec.attempt, peer = %spec.peer_worker, "data link accepted");
    link::run(stream, plan(spec, shared.options.credit, peer_credit, &shared.options)).await
}

async fn dial(shared: Arc<Shared>, spec: PeerSpec, digest: [u8; 8]) -> Result<(), NetworkError> {
    let options = &shared.options;
    let deadline = Instant::now() + options.connect_timeout;
    let mut backoff = Duration::from_millis(10);
    loop {
        let hello = Hello {
            job: spec.job.clone(),
            attempt: spec.attempt,
            from_worker: shared.worker_id.clone(),
            to_worker: spec.peer_worker.clone(),
            plan_digest: digest,
            credit: options.credit,
            nonce: rand::random(),
        };
        let attempt = async {
            let mut stream = TcpStream::connect(spec.peer_addr).await?;
            stream.set_nodelay(true)?;
            let credit = handshake::dial(&mut stream, &hello, &spec.key).await?;
            Ok::<_, NetworkError>((stream, credit))
        };
        let outcome =
            match tokio::time::timeout_at(deadline.min(Instant::now() + options.handshake_timeout), attempt)
                .await
            {
                Ok(outcome) => outcome,
                Err(_) => Err(NetworkError::Protocol("the handshake timed out".into())),
            };
        let last = match outcome {
            Ok((stream, peer_credit)) => {
                tracing::debug!(job = %spec.job, attempt = spec.attempt, peer = %spec.peer_worker, "data link dialed");
                return link::run(stream, plan(spec, options.credit, peer_credit, options)).await;
            }
            // Not retried: the peer holds another key, or disagrees about the channels.
            Err(
                e @ (NetworkError::PeerUnauthenticated
                | NetworkError::Refused {
                    reason:
                        Some(
                            RefuseReason::Unauthenticated
                            | RefuseReason::PlanMismatch
                            | RefuseReason::BadHello,
                        ),
                    ..
                }),
            ) => return Err(e),
            // The peer is not up or has not registered the attempt yet: retry.
            Err(e) => e.to_string(),
        };
        if Instant::now() + backoff >= deadline {
            return Err(NetworkError::ConnectTimeout {
                peer: spec.peer_worker,
                timeout: options.connect_timeout,
                last,
            });
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let handshakes = Arc::new(Semaphore::new(shared.options.max_handshakes));
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "data exchange accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            tracing::warn!(%from, "too many data connection handshakes in progress; closing");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let timeout = shared.options.handshake_timeout;
            match tokio::time::timeout(timeout, admit(stream, &shared)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(%from, error = %e, "data connection refused"),
                Err(_) => tracing::warn!(%from, ?timeout, "data connection handshake timed out"),
            }
            drop(permit);
        });
    }
}

/// Authenticates a dialer and hands its connection to the link waiting for it.
async fn admit(mut stream: TcpStream, shared: &Shared) -> Result<(), NetworkError> {
    stream.set_nodelay(true)?;
    let (hello, hello_bytes) = handshake::read_hello(&mut stream).await?;
    let slot = (hello.job.clone(), hello.attempt, hello.from_worker.clone());
    let found = if hello.to_worker == shared.worker_id {
        shared.waiting().get(&slot).map(|r| (r.key.clone(), r.digest))
    } else {
        None
    };
    let Some((key, digest)) = found else {
        let message = format!(
            "worker {} has no link of job {} attempt {} with worker {} (not deployed here yet, or already linked)",
            shared.worker_id, hello.job, hello.attempt, hello.from_worker
        );
        handshake::refuse(&mut stream, RefuseReason::Unknown, &message).await?;
        return Err(NetworkError::Refused { reason: Some(RefuseReason::Unknown), message });
    };
    handshake::challenge(&mut stream, &hello_bytes, &key, shared.options.credit).await?;
    if hello.plan_digest != digest {
        let message = format!(
            "job {} attempt {}: the workers disagree about the channels between them (different job graphs?)",
            hello.job, hello.attempt
        );
        handshake::refuse(&mut stream, RefuseReason::PlanMismatch, &message).await?;
        return Err(NetworkError::Refused { reason: Some(RefuseReason::PlanMismatch), message });
    }
    // Authenticated: only now does the connection take the registration.
    let Some(registration) = shared.waiting().remove(&slot) else {
        let message = "the link was taken or dropped meanwhile".to_owned();
        handshake::refuse(&mut stream, RefuseReason::Unknown, &message).await?;
        return Err(NetworkError::Refused { reason: Some(RefuseReason::Unknown), message });
    };
    handshake::accept(&mut stream).await?;
    // The waiting link may have timed out this instant; then the connection just closes.
    let _ = registration.ready.send((stream, hello.credit));
    Ok(())
}
