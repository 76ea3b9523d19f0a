//! Group commit: appends that arrive while a flush is running share the next one.
//!
//! `LogStore::append` writes its entries into sled (readable at once) and hands openraft's
//! completion callback to the committer instead of flushing inline. One committer task per
//! store takes every callback queued so far, makes the database durable once
//! ([`Trees::flush_durably`]) and only then completes those callbacks, in order. So openraft
//! keeps appending (and replicating) while a flush is in progress, and N concurrent proposals
//! cost one fsync instead of N; no entry is reported persisted before an fsync that covers it.
//!
//! The committer task holds no handle to the database between batches (each request carries
//! one), so dropping the last store closes the database as before; the task ends when its
//! queue closes.

use std::io;
use std::sync::{Arc, OnceLock};

use cairn_raft::TypeConfig;
use openraft::storage::LogFlushed;
use tokio::sync::{mpsc, oneshot};

use crate::layout::Trees;

/// Requests waiting for the committer; appends beyond this wait for room (backpressure).
const QUEUE: usize = 1024;

/// What the committer is asked to do once the next flush is durable.
enum Request {
    /// Complete an append's callback.
    Append { trees: Trees, callback: LogFlushed<TypeConfig> },
    /// Answer once every earlier request is complete (a truncation must not overtake the
    /// completion of entries appended before it).
    Barrier { done: oneshot::Sender<()> },
}

/// The queue of one store's committer, started on first use (it needs a runtime, which the
/// store may not have when it is opened).
#[derive(Clone, Default)]
pub(crate) struct GroupCommit {
    queue: Arc<OnceLock<mpsc::Sender<Request>>>,
}

/// The committer stopped: the runtime is shutting down.
#[derive(Debug, thiserror::Error)]
#[error("the log committer has stopped")]
pub(crate) struct CommitterStopped;

impl GroupCommit {
    fn sender(&self) -> &mpsc::Sender<Request> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(run(rx));
            tx
        })
    }

    /// Completes `callback` once everything written to `trees` so far is durable. On failure
    /// the callback is completed with the error here.
    pub(crate) async fn submit(&self, trees: Trees, callback: LogFlushed<TypeConfig>) {
        if let Err(mpsc::error::SendError(request)) =
            self.sender().send(Request::Append { trees, callback }).await
            && let Request::Append { callback, .. } = request
        {
            callback.log_io_completed(Err(io::Error::other(CommitterStopped)));
        }
    }

    /// Waits until every append submitted before has been completed.
    pub(crate) async fn barrier(&self) -> Result<(), CommitterStopped> {
        if self.queue.get().is_none() {
            // Nothing was ever submitted.
            return Ok(());
        }
        let (done, wait) = oneshot::channel();
        self.sender().send(Request::Barrier { done }).await.map_err(|_| CommitterStopped)?;
        wait.await.map_err(|_| CommitterStopped)
    }
}

/// What to complete once a flush is over, in queue order.
enum Completion {
    Append(LogFlushed<TypeConfig>),
    Barrier(oneshot::Sender<()>),
}

async fn run(mut queue: mpsc::Receiver<Request>) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, QUEUE).await > 0 {
        let trees = batch.iter().find_map(|r| match r {
            Request::Append { trees, .. } => Some(trees.clone()),
            Request::Barrier { .. } => None,
        });
        // Every database handle is dropped before anyone hears back: a caller that drops its
        // store once its append completed must be able to open the database again at once.
        let completions: Vec<Completion> = batch
            .drain(..)
            .map(|r| match r {
                Request::Append { callback, .. } => Completion::Append(callback),
                Request::Barrier { done } => Completion::Barrier(done),
            })
            .collect();
        let result = match trees {
            Some(trees) => trees.flush_durably().await.map_err(|e| e.to_string()),
            None => Ok(()),
        };
        let appends = completions.iter().filter(|c| matches!(c, Completion::Append(_))).count();
        match &result {
            Ok(()) => tracing::trace!(appends, "group commit flushed"),
            Err(error) => tracing::error!(appends, %error, "group commit flush failed"),
        }
        for completion in completions {
            match completion {
                Completion::Append(callback) => {
                    callback.log_io_completed(result.clone().map_err(io::Error::other))
                }
                Completion::Barrier(done) => {
                    let _ = done.send(());
                }
            }
        }
    }
}
