//! Preparing a (re)deployment: read the replicated job, choose and read the restore point,
//! assign its state to the graph's subtasks (the one assignment, sent to the worker as it is),
//! raise the checkpoint counter past it, and allocate a new attempt number through Raft. Runs off the driver's loop; the result comes back as an
//! event.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_protocol::assign::StateAssignment;
use cairn_protocol::checkpoint::layout::METADATA_FILE;
use cairn_protocol::checkpoint::{
    CheckpointMetadata, MetadataPointer, read_metadata, read_metadata_unverified,
};
use cairn_protocol::graph::JobGraph;
use cairn_protocol::operators::OperatorCatalog;
use cairn_raft::model::{Command, CommandError, JobId, JobRecord, Outcome};
use openraft::error::{CheckIsLeaderError, RaftError};

use super::tasks::GraphTasks;
use crate::checkpoint::{RestorePoint, choose_restore_point, counter_after_restore};
use crate::error::NodeError;
use crate::replica::ReplicaContext;
use crate::replica::propose;

/// Everything a deployment needs.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub record: std::sync::Arc<JobRecord>,
    pub graph: JobGraph,
    pub tasks: GraphTasks,
    pub attempt: u32,
    /// What every subtask restores, computed once here and sent in the deployment.
    pub restore: Option<StateAssignment>,
    /// `(checkpoint id, external path)` of the restore, for statistics.
    pub restored: Option<(u64, Option<String>)>,
    /// `_metadata` of the retained checkpoints that could be read (to rebuild the shared-state
    /// registry).
    pub retained_metadata: BTreeMap<u64, CheckpointMetadata>,
}

/// Parses and validates the job graph stored in the replicated spec.
pub fn graph_of(record: &JobRecord, catalog: &OperatorCatalog) -> Result<(JobGraph, GraphTasks), String> {
    let graph: JobGraph = serde_json::from_value(record.spec.graph.clone())
        .map_err(|e| format!("job `{}` has an unusable graph: {e}", record.id))?;
    let tasks = GraphTasks::new(&graph, catalog)?;
    Ok((graph, tasks))
}

/// Reads the `_metadata` of every retained checkpoint (unreadable ones are left out: the core then
/// protects all shared files while they are retained).
pub fn read_retained(record: &JobRecord) -> BTreeMap<u64, CheckpointMetadata> {
    let mut out = BTreeMap::new();
    for c in &record.completed {
        let ptr = MetadataPointer {
            path: PathBuf::from(&c.metadata_path),
            size: c.metadata_size,
            crc32: c.metadata_crc32,
        };
        match read_metadata(&ptr) {
            Ok(m) => {
                out.insert(c.id, m);
            }
            Err(e) => {
                tracing::warn!(job = %record.id, checkpoint = c.id, error = %e, "retained checkpoint metadata unreadable")
            }
        }
    }
    out
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| format!("blocking task failed: {e}"))
}

/// Longest pause between two leadership confirmations that found no quorum.
const READ_RETRY_MAX: Duration = Duration::from_secs(1);

/// Waits until the job's record can be read linearizably. A confirmation round that finds no
/// quorum in time (followers slow to answer under load, or one of them restarting) is asked
/// again, with a growing pause: that is no failure of the job, and counting it against the
/// restart strategy would fail healthy jobs of a busy cluster. Leadership lost is an error
/// (the runtime of this term stops its drivers anyway).
async fn read_barrier(ctx: &ReplicaContext, job: &JobId) -> Result<(), String> {
    let mut pause = Duration::from_millis(50);
    loop {
        match ctx.reads.wait().await {
            Ok(()) => return Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                tracing::info!(job = %job, error = %e, retry_in = ?pause, "leadership not confirmed for the job's read; asking again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(READ_RETRY_MAX);
            }
            Err(e) => return Err(format!("cannot read the job's record: {e}")),
        }
    }
}

/// Prepares the next deployment of `job`.
pub async fn prepare(ctx: ReplicaContext, job: JobId) -> Result<Prepared, String> {
    read_barrier(&ctx, &job).await?;
    let record = ctx.reader.job(&job).ok_or_else(|| format!("job `{job}` is no longer registered"))?;
    let (graph, tasks) = graph_of(&record, &OperatorCatalog::builtin())?;

    // The latest completed checkpoint (or a newer savepoint); else the savepoint the job was
    // submitted with. An unreadable latest checkpoint is an error to retry, never a fallback.
    let point: Option<RestorePoint> = match choose_restore_point(&record) {
        Some(candidate) => {
            let ptr = candidate.pointer.clone();
            let read = blocking(move || read_metadata(&ptr)).await?;
            Some(candidate.load(read).map_err(|e| format!("cannot restore job `{job}`: {e}"))?)
        }
        None => match &record.spec.restore_from {
            Some(dir) => {
                let dir = PathBuf::from(dir);
                let path = dir.join(METADATA_FILE);
                let read = blocking(move || read_metadata_unverified(&path)).await?;
                Some(
                    RestorePoint::from_path(&dir, read)
                        .map_err(|e| format!("cannot restore job `{job}`: {e}"))?,
                )
            }
            None => None,
        },
    };
    let mut restore = None;
    let mut restored = None;
    if let Some(point) = &point {
        // Fails with a precise error when state cannot be mapped (changed max parallelism, state of
        // an operator the graph no longer has, unless allowed).
        let assignment = point.assign(&graph, record.spec.allow_non_restored_state).map_err(|e| {
            format!("cannot restore job `{job}` from checkpoint {}: {e}", point.checkpoint_id)
        })?;
        if let Some(next) = counter_after_restore(record.next_checkpoint_id, point.checkpoint_id) {
            match propose(&ctx, Command::AdvanceCheckpointCounter { job: job.clone(), next }).await {
                // A reservation of an earlier attempt committed meanwhile and moved the counter
                // past `next` already: what the restore needs holds.
                Ok(_) | Err(NodeError::Command(CommandError::CounterRegression { .. })) => {}
                Err(e) => return Err(format!("cannot advance the checkpoint counter: {e}")),
            }
        }
        let from_latest = choose_restore_point(&record).is_some();
        restore = Some(assignment);
        let external = if from_latest { None } else { record.spec.restore_from.clone() };
        restored = Some((point.checkpoint_id, external));
    }
    let attempt = match propose(&ctx, Command::BeginAttempt { job: job.clone() }).await {
        Ok((Outcome::Attempt { attempt }, _)) => attempt,
        Ok((other, _)) => return Err(format!("unexpected outcome of begin_attempt: {other:?}")),
        Err(e) => return Err(format!("cannot start a new attempt: {e}")),
    };
    let record = ctx.reader.job(&job).ok_or_else(|| format!("job `{job}` is no longer registered"))?;
    let rec2 = record.clone();
    let retained_metadata = blocking(move || read_retained(&rec2)).await?;
    Ok(Prepared { record, graph, tasks, attempt, restore, restored, retained_metadata })
}

/// Best-effort removal of files and directories of discarded checkpoints (idempotent).
pub fn remove_paths(dirs: &[PathBuf], files: &[PathBuf]) {
    for f in files {
        if let Err(e) = std::fs::remove_file(f)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %f.display(), error = %e, "cannot delete a discarded state file");
        }
    }
    for d in dirs {
        remove_dir(d);
    }
}

fn remove_dir(d: &Path) {
    // A task whose asynchronous part is still writing into the directory of a checkpoint that
    // was just aborted may add files while it is being removed: try again shortly (the task
    // declines once it finds the directory gone, and removes what it wrote).
    const ATTEMPTS: u32 = 5;
    for attempt in 1..=ATTEMPTS {
        match std::fs::remove_dir_all(d) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempt < ATTEMPTS => {
                std::thread::sleep(std::time::Duration::from_millis(100 * u64::from(attempt)));
            }
            Err(e) => {
                tracing::warn!(path = %d.display(), error = %e, "cannot delete a discarded checkpoint directory");
                return;
            }
        }
    }
}
