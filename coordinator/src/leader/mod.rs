//! The leader's side of Cairn: everything that runs only on the replica that leads.
//!
//! [`LeaderSupervisor`] watches Raft. When this replica becomes leader of term `T` (and has
//! applied everything committed before, via a linearizable read), it starts a [`runtime`] for
//! `T`: the worker registry, the scheduler and one [`job`] driver per job. When leadership is
//! lost or the term changes, that runtime is stopped (its job drivers suspend: in-memory pending
//! checkpoints are dropped, nothing replicated is touched) and, if this replica leads again, a
//! fresh one starts from the replicated state.
//!
//! The task gateway reaches the current runtime through [`LeaderHandle::current`].

mod api;
mod handle;
pub mod job;
mod leases;
mod liveness;
mod placement;
pub mod runtime;

use std::path::PathBuf;
use std::sync::Arc;

use cairn_raft::types::Raft;
use openraft::ServerState;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use api::{JobSummary, JobView, StartRefusal, StartedReply, TaskView, TriggerKey, TriggerReply};
pub use handle::{Session, TermHandle, WorkerGrant, WorkerInfo, WorkerLease, WorkerSlots};

use crate::config::WorkerTiming;
use crate::replica::ReplicaContext;

/// Leader-side settings, from the replica configuration.
#[derive(Debug, Clone)]
pub struct LeaderOptions {
    /// Default checkpoint storage root.
    pub checkpoint_dir: PathBuf,
    pub workers: WorkerTiming,
    /// Incremental keyed-state checkpoints for deployed jobs.
    pub incremental: bool,
}

/// Where the gateway finds the runtime of the current term.
#[derive(Clone)]
pub struct LeaderHandle {
    current: watch::Receiver<Option<TermHandle>>,
}

impl LeaderHandle {
    /// The runtime of the term this replica leads, if it leads and the runtime is up.
    pub fn current(&self) -> Option<TermHandle> {
        self.current.borrow().clone()
    }

    /// Waits until a runtime is up (tests, tools).
    pub fn subscribe(&self) -> watch::Receiver<Option<TermHandle>> {
        self.current.clone()
    }
}

/// Starts and stops per-term runtimes as leadership comes and goes.
pub struct LeaderSupervisor {
    task: JoinHandle<()>,
}

impl LeaderSupervisor {
    pub fn spawn(ctx: ReplicaContext, options: LeaderOptions) -> (Self, LeaderHandle) {
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(supervise(ctx, Arc::new(options), tx));
        (Self { task }, LeaderHandle { current: rx })
    }

    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The term this replica leads, according to its metrics.
fn leading_term(raft: &Raft, id: u64) -> Option<u64> {
    let m = raft.metrics().borrow().clone();
    (m.state == ServerState::Leader && m.current_leader == Some(id)).then_some(m.current_term)
}

async fn supervise(
    ctx: ReplicaContext,
    options: Arc<LeaderOptions>,
    current: watch::Sender<Option<TermHandle>>,
) {
    let mut metrics = ctx.raft.metrics();
    let mut running: Option<(u64, runtime::TermRuntime)> = None;
    loop {
        let leading = leading_term(&ctx.raft, ctx.id);
        let keep = matches!((&running, leading), (Some((t, _)), Some(l)) if *t == l);
        if !keep {
            if let Some((term, rt)) = running.take() {
                let _ = current.send(None);
                tracing::info!(node_id = ctx.id, term, "leadership lost or term changed: suspending jobs");
                rt.stop().await;
            }
            if let Some(term) = leading {
                // Apply everything committed by earlier leaders before acting on the state.
                match ctx.reads.wait().await {
                    Ok(_) if leading_term(&ctx.raft, ctx.id) == Some(term) => {
                        tracing::info!(node_id = ctx.id, term, "leading: starting the coordinator runtime");
                        let rt = runtime::TermRuntime::start(ctx.clone(), options.clone(), term);
                        let _ = current.send(Some(rt.handle()));
                        running = Some((term, rt));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::info!(node_id = ctx.id, term, error = %e, "leadership not confirmed yet")
                    }
                }
            }
        }
        if running.is_some() || leading.is_none() {
            if metrics.changed().await.is_err() {
                break;
            }
        } else {
            // Leader but not confirmed yet: poll again shortly.
            tokio::select! {
                r = metrics.changed() => if r.is_err() { break },
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            }
        }
    }
    if let Some((_, rt)) = running.take() {
        let _ = current.send(None);
        rt.stop().await;
    }
}
