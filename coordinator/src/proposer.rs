//! Group commit of proposals: concurrent commands share one Raft entry.
//!
//! openraft 0.9 appends, and flushes, each client write on its own before it takes the next, so
//! N concurrent proposals cost N sequential fsyncs on the leader (and N on each follower). The
//! [`Proposer`] is the one task that submits this replica's commands: it takes everything queued
//! since its last submission (up to [`MAX_BATCH`]) and proposes it as one
//! [`Command::Batch`], so they share one append, one flush and one replication round; a lone
//! command is proposed as itself. Submissions reach openraft in queue order (a caller's
//! commands are never reordered); at most [`IN_FLIGHT`] are outstanding, so the next batch
//! fills while earlier ones replicate. Each caller gets its own command's outcome,
//! or the error of the submission it was part of.
//!
//! [`Proposer::hold`] stops submissions while a leadership transfer runs: the leader's log must
//! stop growing for its successor to catch up and win the election.

use std::sync::Arc;

use cairn_raft::model::{Command, MAX_BATCH, Outcome};
use cairn_raft::types::{LogId, Raft};
use openraft::error::RaftError;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::NodeError;

/// Commands waiting to be proposed; callers wait for room beyond this.
const QUEUE: usize = 4096;
/// Submissions outstanding at once. Two, so the next batch fills while one replicates: every
/// submission is its own Raft entry, and entries cost more than the commands in them (64
/// clients allocating ids on 3 replicas: 8,174/s with 2, about the same with 1, 6,592/s with 4,
/// 3,889/s with 16).
pub const IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<Result<(Outcome, LogId), NodeError>>;

struct Pending {
    command: Command,
    reply: Reply,
}

/// Handle of the replica's proposer task. Cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
    /// One permit per submission in flight; [`Proposer::hold`] takes them all.
    slots: Arc<Semaphore>,
}

/// While alive, the proposer submits nothing (commands queue); see [`Proposer::hold`].
pub struct Hold {
    _slots: tokio::sync::OwnedSemaphorePermit,
}

impl Proposer {
    /// Starts the proposer task for `raft`; it ends when every handle is dropped.
    pub fn start(raft: Raft) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        tokio::spawn(run(raft, rx, slots.clone()));
        Self { queue, slots }
    }

    /// Waits until every submission in flight was answered, then keeps new ones from reaching
    /// Raft until the returned [`Hold`] is dropped: the leader's log stops growing (apart from
    /// what openraft itself appends). Queued commands are submitted after the hold, to whoever
    /// leads then (a replica that lost leadership answers them with a hint to the leader).
    pub async fn hold(&self) -> Result<Hold, NodeError> {
        let permits = u32::try_from(IN_FLIGHT).unwrap_or(u32::MAX);
        let slots = self
            .slots
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| NodeError::Stopped("the proposer has stopped".to_owned()))?;
        Ok(Hold { _slots: slots })
    }

    /// Proposes `command` and waits until it is applied: its outcome and the log id of the
    /// entry that carried it.
    pub async fn propose(&self, command: Command) -> Result<(Outcome, LogId), NodeError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { command, reply })
            .await
            .map_err(|_| NodeError::Stopped("the proposer has stopped".to_owned()))?;
        answer.await.map_err(|_| NodeError::Stopped("the proposer has stopped".to_owned()))?
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>, slots: Arc<Semaphore>) {
    let mut batch = Vec::new();
    loop {
        // Wait for work before taking a slot, so an idle loop never keeps a hold waiting.
        if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        // Whatever queued while every slot was taken joins this submission.
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        // Taken, not replaced by a preallocated buffer: most submissions hold a few commands.
        let pending = std::mem::take(&mut batch);
        let count = pending.len();
        let (mut commands, replies): (Vec<Command>, Vec<Reply>) =
            pending.into_iter().map(|p| (p.command, p.reply)).unzip();
        let command = match commands.pop() {
            Some(one) if commands.is_empty() => one,
            Some(last) => {
                commands.push(last);
                tracing::trace!(commands = count, "proposing a batch");
                Command::Batch { commands }
            }
            None => continue,
        };
        // Handed to openraft here, in queue order; only the wait for the outcome runs apart.
        match raft.client_write_ff(command).await {
            Ok(outcome) => {
                tokio::spawn(async move {
                    let result = match outcome.await {
                        Ok(Ok(resp)) => {
                            resp.data.0.map(|outcome| (outcome, resp.log_id)).map_err(NodeError::from)
                        }
                        Ok(Err(e)) => Err(NodeError::from(RaftError::APIError(e))),
                        Err(_) => Err(NodeError::Stopped("raft dropped the proposal".to_owned())),
                    };
                    answer(replies, result);
                    drop(slot);
                });
            }
            Err(fatal) => answer(replies, Err(NodeError::Stopped(fatal.to_string()))),
        }
    }
}

/// Sends each caller its outcome: the one outcome of a lone command, or its share of a batch's.
fn answer(mut replies: Vec<Reply>, result: Result<(Outcome, LogId), NodeError>) {
    let count = replies.len();
    if count == 1 {
        if let Some(reply) = replies.pop() {
            let _ = reply.send(result);
        }
        return;
    }
    match result {
        Ok((Outcome::Batch { results }, log_id)) if results.len() == count => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result.map(|outcome| (outcome, log_id)).map_err(NodeError::from));
            }
        }
        Ok((other, _)) => {
            let error = format!("a batch of {count} commands was answered with {other:?}");
            tracing::error!(%error, "unexpected batch outcome");
            for reply in replies {
                let _ = reply.send(Err(NodeError::Internal(error.clone())));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
