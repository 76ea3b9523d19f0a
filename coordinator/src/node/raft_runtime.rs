//! Raft's own tokio runtime.
//!
//! openraft's core, its replication streams, the log's group commit and the server side of Raft
//! calls run on a runtime of their own, with two worker threads, instead of sharing the replica's
//! runtime with the gateway, the job drivers and the services. On a leader coordinating a
//! thousand jobs the shared runtime's queue held thousands of ready tasks; a heartbeat waited
//! behind all of them for seconds, followers started elections, and the cluster changed leader
//! a dozen times in two minutes. With its own threads, Raft gets the operating system's share of
//! the CPU however much else is queued, so an overloaded leader slows checkpoints down instead
//! of losing its leadership.

use tokio::runtime::{Builder, Handle, Runtime};

/// Two threads: openraft's core (heartbeats, replication) runs beside its state machine task,
/// so applying a large batch of committed entries (tens of milliseconds on a loaded machine
/// coordinating a thousand jobs) or building a snapshot does not hold up a heartbeat.
const WORKER_THREADS: usize = 2;

pub struct RaftRuntime {
    runtime: Option<Runtime>,
}

impl RaftRuntime {
    pub fn start(node_id: u64) -> std::io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(WORKER_THREADS)
            .thread_name(format!("cairn-raft-{node_id}"))
            .enable_all()
            .build()?;
        Ok(Self { runtime: Some(runtime) })
    }

    pub fn handle(&self) -> Option<Handle> {
        self.runtime.as_ref().map(|r| r.handle().clone())
    }

    /// Stops the runtime and waits (at most `timeout`) until its tasks are gone, so what they
    /// held (the sled database) is released when this returns.
    pub async fn stop(mut self, timeout: std::time::Duration) {
        if let Some(runtime) = self.runtime.take() {
            let _ = tokio::task::spawn_blocking(move || runtime.shutdown_timeout(timeout)).await;
        }
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        // Dropped from async code (a replica shut down by a test or by the binary): do not
        // block this thread waiting for Raft's tasks; they are stopped already or end with it.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
