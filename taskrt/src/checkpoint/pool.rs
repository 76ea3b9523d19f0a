//! Asynchronous snapshot parts.
//!
//! A [`SnapshotPool`] bounds how many asynchronous parts write at once across all tasks that
//! share it (a semaphore; the writing itself runs on tokio's blocking threads). Each task owns
//! an [`InFlightSnapshots`]: the set of its running parts, whose results come back into the
//! task's own loop (so only the task sends acknowledgements), and a cancel flag per part. A
//! cancelled part stops between files and removes what it wrote; a part that finished but is no
//! longer wanted has its files removed by [`InFlightSnapshots::cancel_all`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::state::StateError;
use crate::state::snapshot::{OperatorPlan, SnapshotTarget, WrittenSnapshot, remove_files, write_plan};
use crate::state::storage::CheckpointStorage;

/// Limits concurrent asynchronous snapshot parts. Cheap to clone; share one per worker.
#[derive(Debug, Clone)]
pub struct SnapshotPool {
    permits: Arc<Semaphore>,
}

impl SnapshotPool {
    pub fn new(concurrency: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(concurrency.max(1))) }
    }
}

/// The result of one asynchronous part.
#[derive(Debug)]
pub struct AsyncOutcome {
    pub checkpoint_id: u64,
    pub result: Result<WrittenSnapshot, StateError>,
    /// Time spent writing (after a pool permit was obtained).
    pub duration: Duration,
}

/// The asynchronous parts of one task.
#[derive(Debug)]
pub struct InFlightSnapshots {
    pool: SnapshotPool,
    set: JoinSet<AsyncOutcome>,
    cancels: BTreeMap<u64, Arc<AtomicBool>>,
}

impl InFlightSnapshots {
    pub fn new(pool: SnapshotPool) -> Self {
        Self { pool, set: JoinSet::new(), cancels: BTreeMap::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Starts the asynchronous part of checkpoint `target.checkpoint_id`.
    pub fn spawn(&mut self, storage: CheckpointStorage, target: SnapshotTarget, plans: Vec<OperatorPlan>) {
        let checkpoint_id = target.checkpoint_id;
        let cancel = Arc::new(AtomicBool::new(false));
        self.cancels.insert(checkpoint_id, cancel.clone());
        let permits = self.pool.permits.clone();
        self.set.spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else {
                return AsyncOutcome {
                    checkpoint_id,
                    result: Err(StateError::Worker("snapshot pool is closed".into())),
                    duration: Duration::ZERO,
                };
            };
            let started = Instant::now();
            let result = tokio::task::spawn_blocking(move || write_plan(&storage, &target, plans, &cancel))
                .await
                .unwrap_or_else(|e| {
                    Err(StateError::Worker(format!("snapshot writer panicked or was aborted: {e}")))
                });
            AsyncOutcome { checkpoint_id, result, duration: started.elapsed() }
        });
    }

    /// The next finished part. Pends forever when none is running (use a select guard).
    pub async fn next(&mut self) -> AsyncOutcome {
        loop {
            match self.set.join_next().await {
                Some(Ok(outcome)) => {
                    self.cancels.remove(&outcome.checkpoint_id);
                    return outcome;
                }
                Some(Err(e)) => {
                    // Our futures do not panic (the writer runs in spawn_blocking and its panic
                    // is mapped above); an abort only happens when the set is dropped.
                    tracing::error!(error = %e, "asynchronous snapshot future ended abnormally");
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Asks the part of `checkpoint_id` to stop; its outcome will be `Cancelled` unless it was
    /// already done.
    pub fn cancel(&mut self, checkpoint_id: u64) {
        if let Some(flag) = self.cancels.get(&checkpoint_id) {
            flag.store(true, Ordering::Release);
        }
    }

    /// Cancels every part and waits for all of them; removes the files of parts that finished
    /// anyway (they will never be acknowledged).
    pub async fn cancel_all(&mut self) {
        for flag in self.cancels.values() {
            flag.store(true, Ordering::Release);
        }
        while let Some(joined) = self.set.join_next().await {
            match joined {
                Ok(AsyncOutcome { checkpoint_id, result: Ok(written), .. }) => {
                    tracing::debug!(
                        checkpoint_id,
                        files = written.written.len(),
                        "removing files of an unacknowledged snapshot"
                    );
                    remove_files(&written.written);
                }
                Ok(AsyncOutcome { checkpoint_id, result: Err(e), .. }) => {
                    tracing::debug!(checkpoint_id, error = %e, "asynchronous snapshot part ended at close");
                }
                Err(e) => tracing::error!(error = %e, "asynchronous snapshot future ended abnormally"),
            }
        }
        self.cancels.clear();
    }
}
