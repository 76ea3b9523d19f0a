//! Deleting purged log entries off openraft's core.
//!
//! openraft's core awaits `purge` before it sends the next heartbeat. Deleting the few thousand
//! entries behind a snapshot used to be a few thousand sled removals, 160–430 ms of a busy
//! replica's CPU; it is now a few segment trees dropped (see [`crate::segments`]), a few
//! milliseconds each, but a drop still frees every page of its tree and a flush may free blob
//! files. openraft does not need the entries gone when `purge` returns, only the purge point
//! recorded (its storage contract says so), so [`LogStore::purge`](crate::log_store::LogStore)
//! records the purge point and hands the deletion to the [`Purger`], which runs it on a
//! blocking thread, one deletion at a time.
//!
//! Nothing depends on the deletion having happened: openraft never reads at or below the purge
//! point, a truncation only removes entries above it, and a store opened after a crash deletes
//! whatever a deletion left behind (the purge point is on disk before the deletion starts).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use cairn_raft::types::StorageError;

/// Runs the deletions of one log tree; cheap to clone.
#[derive(Clone)]
pub(crate) struct Purger {
    inner: Arc<Inner>,
}

struct Inner {
    /// Held by the running deletion: at most one runs at a time.
    running: Mutex<()>,
    /// Every entry at or below this index has been deleted (`None`: no deletion yet).
    deleted_through: watch::Sender<Option<u64>>,
}

impl Default for Purger {
    fn default() -> Self {
        Self { inner: Arc::new(Inner { running: Mutex::new(()), deleted_through: watch::channel(None).0 }) }
    }
}

impl Purger {
    /// Runs `delete` (which deletes the log behind `upto` and returns how many segment trees it
    /// dropped) on a blocking thread, unless a deletion already went that far. Must be called
    /// within a tokio runtime. A failure is logged; the entries then stay until the next purge
    /// or the next open deletes them.
    pub(crate) fn delete_through<F>(&self, upto: u64, delete: F)
    where
        F: FnOnce() -> Result<u64, StorageError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let _running = inner.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if inner.deleted_through.borrow().is_some_and(|through| through >= upto) {
                return;
            }
            let started = Instant::now();
            match delete() {
                Ok(segments) => {
                    let ms = started.elapsed().as_millis() as u64;
                    tracing::info!(upto, segments, ms, "deleted purged raft log entries");
                    inner
                        .deleted_through
                        .send_modify(|through| *through = Some(through.map_or(upto, |t| t.max(upto))));
                }
                Err(error) => {
                    tracing::warn!(upto, %error, "cannot delete purged raft log entries; the next purge or open retries")
                }
            }
        });
    }

    /// Waits until every entry at or below `upto` has been deleted.
    pub(crate) async fn deleted(&self, upto: u64) {
        let mut through = self.inner.deleted_through.subscribe();
        // The sender lives as long as `self`: this cannot fail while it is borrowed.
        let _ = through.wait_for(|through| through.is_some_and(|through| through >= upto)).await;
    }

    /// Blocks deletions while the guard lives (tests: show that `purge` does not wait for one).
    #[cfg(test)]
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
