//! A scripted worker: speaks the task gateway protocol directly, so tests can send exactly the
//! messages they want (including bad ones) and observe exactly what the leader sends.

use std::time::Duration;

use cairn_proto::leader_hint::parse_not_leader;
use cairn_proto::v1::task_gateway_client::TaskGatewayClient;
use cairn_proto::v1::{
    AttachedTask, GatewayError, Heartbeat, LeaderMessage, RegisterWorker, WorkerMessage, leader_message,
    worker_message,
};
use cairn_protocol::messages::{Deployment, TaskAttemptId, TaskCommand, TaskId, TaskMessage, TaskStatus};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// One attached gateway stream.
pub struct ScriptedWorker {
    pub worker_id: String,
    /// Term of the leader this stream is attached to.
    pub term: u64,
    /// Address of that leader.
    pub leader_addr: String,
    /// How often the leader wants a heartbeat (from its `registered`).
    pub heartbeat_interval: Duration,
    /// Whether the leader takes several reports per message (from its `registered`).
    pub report_batches: bool,
    tx: mpsc::Sender<WorkerMessage>,
    rx: Streaming<LeaderMessage>,
}

/// What the leader sent, decoded.
#[derive(Debug)]
pub enum FromLeader {
    Deploy(Box<Deployment>),
    Command(TaskCommand),
    Error(GatewayError),
    Heartbeat,
    Registered,
    /// Numbered reports up to this one were handled.
    Confirmed(u64),
}

impl ScriptedWorker {
    /// Attaches to whichever of `addrs` leads (following not-leader hints), registering with
    /// `tasks` as running task attempts.
    pub async fn attach(
        addrs: &[String],
        token: &str,
        worker_id: &str,
        slots: u32,
        tasks: Vec<AttachedTask>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut i = 0usize;
        let mut target = addrs.first().cloned().ok_or_else(|| anyhow::anyhow!("no addresses"))?;
        loop {
            match Self::try_attach(&target, token, worker_id, slots, tasks.clone()).await {
                Ok(w) => return Ok(w),
                Err(status) => {
                    if tokio::time::Instant::now() >= deadline {
                        anyhow::bail!("could not attach within {timeout:?}: {status}");
                    }
                    target = match parse_not_leader(&status).and_then(|h| h.leader_addr) {
                        Some(a) if a != target => a,
                        _ => {
                            i += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            addrs[i % addrs.len()].clone()
                        }
                    };
                }
            }
        }
    }

    async fn try_attach(
        addr: &str,
        token: &str,
        worker_id: &str,
        slots: u32,
        tasks: Vec<AttachedTask>,
    ) -> Result<Self, tonic::Status> {
        let mut client = TaskGatewayClient::connect(format!("http://{addr}"))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        let (tx, rx) = mpsc::channel(64);
        let register = RegisterWorker {
            worker_id: worker_id.to_owned(),
            slots,
            tasks,
            highest_term_seen: 0,
            data_addr: String::new(),
        };
        tx.send(WorkerMessage { body: Some(worker_message::Body::Register(register)) })
            .await
            .map_err(|_| tonic::Status::internal("channel closed"))?;
        let mut rx = client.attach(bearer(ReceiverStream::new(rx), token)).await?.into_inner();
        let first = rx.message().await?.ok_or_else(|| tonic::Status::unavailable("stream ended"))?;
        match first.body {
            Some(leader_message::Body::Registered(r)) => Ok(Self {
                worker_id: worker_id.to_owned(),
                term: first.term,
                leader_addr: addr.to_owned(),
                heartbeat_interval: Duration::from_millis(r.heartbeat_interval_ms.max(1)),
                report_batches: r.report_batches,
                tx,
                rx,
            }),
            other => Err(tonic::Status::internal(format!("expected registered, got {other:?}"))),
        }
    }

    /// The stream's two halves, for a caller that runs its own loop over them.
    pub fn into_parts(self) -> (mpsc::Sender<WorkerMessage>, Streaming<LeaderMessage>) {
        (self.tx, self.rx)
    }

    pub async fn send(&self, body: worker_message::Body) -> anyhow::Result<()> {
        self.tx.send(WorkerMessage { body: Some(body) }).await.map_err(|_| anyhow::anyhow!("stream closed"))
    }

    pub async fn report(&self, msg: &TaskMessage) -> anyhow::Result<()> {
        self.send(worker_message::Body::ReportJson(serde_json::to_vec(msg)?)).await
    }

    pub async fn heartbeat(&self) -> anyhow::Result<()> {
        self.send(worker_message::Body::Heartbeat(Heartbeat { sequence: 1 })).await
    }

    /// The next leader message (heartbeats included), within `timeout`. A stream error is
    /// returned as `Err` with the status.
    pub async fn next(&mut self, timeout: Duration) -> anyhow::Result<FromLeader> {
        let msg = tokio::time::timeout(timeout, self.rx.message())
            .await
            .map_err(|_| anyhow::anyhow!("no leader message within {timeout:?}"))??
            .ok_or_else(|| anyhow::anyhow!("the leader ended the stream"))?;
        anyhow::ensure!(
            msg.term >= self.term,
            "leader message with an older term {} < {}",
            msg.term,
            self.term
        );
        Ok(match msg.body {
            Some(leader_message::Body::DeployJson(j)) => {
                FromLeader::Deploy(Box::new(serde_json::from_slice(&j)?))
            }
            Some(leader_message::Body::CommandJson(j)) => FromLeader::Command(serde_json::from_slice(&j)?),
            Some(leader_message::Body::Error(e)) => FromLeader::Error(e),
            Some(leader_message::Body::Heartbeat(_)) => FromLeader::Heartbeat,
            Some(leader_message::Body::Registered(_)) => FromLeader::Registered,
            Some(leader_message::Body::Confirmed(c)) => FromLeader::Confirmed(c.up_to),
            None => anyhow::bail!("empty leader message"),
        })
    }

    /// Skips heartbeats (answering them) until something else arrives.
    pub async fn next_non_heartbeat(&mut self, timeout: Duration) -> anyhow::Result<FromLeader> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await? {
                FromLeader::Heartbeat => self.heartbeat().await?,
                other => return Ok(other),
            }
        }
    }

    /// Waits for a gateway error (skipping heartbeats and commands).
    pub async fn expect_error(&mut self, timeout: Duration) -> anyhow::Result<GatewayError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let FromLeader::Error(e) = self.next_non_heartbeat(left).await? {
                return Ok(e);
            }
        }
    }

    /// Waits for a command matching `pred` (answering heartbeats, skipping other commands).
    pub async fn expect_command(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&TaskCommand) -> bool,
    ) -> anyhow::Result<TaskCommand> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_non_heartbeat(left).await? {
                FromLeader::Command(c) if pred(&c) => return Ok(c),
                FromLeader::Error(e) => anyhow::bail!("unexpected gateway error {}: {}", e.code, e.message),
                _ => {}
            }
        }
    }
}

/// The task attempt id of `(vertex, subtask)` of a deployment.
pub fn attempt_id(d: &Deployment, vertex: &str, subtask: u32) -> TaskAttemptId {
    TaskAttemptId {
        task: TaskId { job: d.job_id.clone(), vertex: vertex.to_owned(), subtask },
        attempt: d.attempt,
    }
}

/// Every `(vertex, subtask)` of a deployment's graph.
pub fn subtasks(d: &Deployment) -> anyhow::Result<Vec<(String, u32)>> {
    let graph: cairn_protocol::graph::JobGraph = serde_json::from_value(d.graph.clone())?;
    Ok(graph.vertices.iter().flat_map(|v| (0..v.parallelism).map(move |i| (v.id.clone(), i))).collect())
}

/// Reports every task of the deployment as running.
pub async fn report_all_running(w: &ScriptedWorker, d: &Deployment) -> anyhow::Result<()> {
    for (v, i) in subtasks(d)? {
        w.report(&TaskMessage::Status { task: attempt_id(d, &v, i), status: TaskStatus::Running }).await?;
    }
    Ok(())
}

/// Attached-task descriptors for re-registering a deployment's tasks.
pub fn attached(d: &Deployment) -> anyhow::Result<Vec<AttachedTask>> {
    Ok(subtasks(d)?
        .into_iter()
        .map(|(vertex, subtask)| AttachedTask {
            job_id: d.job_id.clone(),
            vertex,
            subtask,
            attempt: d.attempt as u64,
            status: "running".into(),
        })
        .collect())
}

/// A gRPC codec that sends and receives raw message bytes, to put garbage on the wire.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

/// Encoder/decoder halves of [`RawCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCoder;

impl tonic::codec::Encoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCoder;
    type Decoder = RawCoder;

    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }

    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

/// A request carrying `authorization: Bearer <token>`.
pub fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(v) = format!("Bearer {token}").parse() {
        req.metadata_mut().insert("authorization", v);
    }
    req
}

/// Opens `Attach` on `addr` and sends `frames` as raw (undecodable) message bytes; returns the
/// status the server answers with.
pub async fn attach_raw(addr: &str, token: &str, frames: Vec<Vec<u8>>) -> anyhow::Result<tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static("/cairn.v1.TaskGateway/Attach");
    let stream = tokio_stream::iter(frames);
    match grpc.streaming(bearer(stream, token), path, RawCodec).await {
        Err(status) => Ok(status),
        Ok(resp) => {
            let mut s = resp.into_inner();
            match s.message().await {
                Err(status) => Ok(status),
                Ok(m) => anyhow::bail!("garbage was accepted: {m:?}"),
            }
        }
    }
}
