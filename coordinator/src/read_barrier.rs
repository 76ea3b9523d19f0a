//! Batched linearizable reads: concurrent readers share one leadership confirmation.
//!
//! A linearizable read on the leader costs a round of heartbeats to a quorum (openraft's
//! `ensure_linearizable`: the read index, then waiting for the state machine to apply it). A
//! thousand job drivers preparing their deployments at once asked for a thousand rounds; under
//! that load the rounds timed out and jobs failed before their first deployment.
//!
//! The [`ReadBarrier`] is the one task that asks: it takes every reader queued since its last
//! round and answers them all with the outcome of one new round. A reader is only ever answered
//! by a round that *started after it asked*, so the read index covers every write committed
//! before the reader's call, which is what makes the read linearizable (Raft's read-index
//! batching, as etcd does it). Readers that arrive while a round runs wait for the next one.

use cairn_raft::types::{Node, NodeId, Raft};
use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

/// The error of one leadership confirmation, shared by the readers it answers.
pub type ReadError = RaftError<NodeId, CheckIsLeaderError<NodeId, Node>>;

/// Readers waiting for the next round; callers wait for room beyond this.
const QUEUE: usize = 4096;

type Waiter = oneshot::Sender<Result<(), ReadError>>;

/// Handle of the replica's read barrier task. Cheap to clone.
#[derive(Clone)]
pub struct ReadBarrier {
    queue: mpsc::Sender<Waiter>,
}

impl ReadBarrier {
    /// Starts the barrier task for `raft`; it ends when every handle is dropped.
    pub fn start(raft: Raft) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(raft, rx));
        Self { queue }
    }

    /// Returns once this replica confirmed with a quorum that it leads and applied everything
    /// committed before the call: reads of the applied state after this are linearizable.
    pub async fn wait(&self) -> Result<(), ReadError> {
        let (tx, rx) = oneshot::channel();
        self.queue.send(tx).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

fn stopped() -> ReadError {
    RaftError::Fatal(openraft::error::Fatal::Stopped)
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Waiter>) {
    let mut round = Vec::new();
    while let Some(first) = rx.recv().await {
        round.push(first);
        while let Ok(more) = rx.try_recv() {
            round.push(more);
        }
        let outcome = raft.ensure_linearizable().await.map(|_| ());
        if round.len() > 1 {
            tracing::trace!(readers = round.len(), ok = outcome.is_ok(), "read barrier round");
        }
        for waiter in round.drain(..) {
            let _ = waiter.send(outcome.clone());
        }
    }
}
