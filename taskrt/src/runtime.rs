//! Deploying a job graph in-process: one tokio task per subtask, wired by bounded channels.
//!
//! [`LocalJob::deploy`] validates the graph against the registry, computes each subtask's
//! restore descriptor (key-group range and handles, via [`crate::state::assign`]) when restoring,
//! creates one channel per connected (upstream, downstream) subtask pair, builds every operator
//! chain, connects every task to a [`CoordinatorLink`], and spawns the tasks. The returned
//! [`LocalJob`] owns the join handles (nothing runs detached) and the coordinator's end of the
//! link; [`LocalJob::kill`] aborts everything abruptly, as a crashed worker would.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cairn_storage::checkpoint::CheckpointMetadata;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::chain::{ChainMember, OperatorChain};
use crate::checkpoint::pool::SnapshotPool;
use crate::exchange::{EdgeOutput, InputGate, OutputGate, StreamElement};
use crate::graph::{GraphError, JobGraph, Partitioning, is_valid_id};
use crate::link::CoordinatorLink;
use crate::metrics::{TaskMonitor, task_observer};
use crate::operator::TaskInfo;
use crate::protocol::{TaskAttemptId, TaskId, TaskRestore};
use crate::registry::OperatorRegistry;
use crate::state::StateError;
use crate::state::assign::assign_vertex;
use crate::state::keyed::KeyedStateBackend;
use crate::state::list::OperatorStateBackend;
use crate::state::storage::CheckpointStorage;
use crate::task::{TaskOutcome, TaskSetup, run_task};

/// Sizes and modes of an in-process deployment. Defaults are defined here only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Capacity of each data channel, in stream elements.
    pub channel_capacity: usize,
    /// Capacity of each task's control channel.
    pub control_capacity: usize,
    /// Capacity of the shared report channel.
    pub report_capacity: usize,
    /// Incremental checkpoints (changed key groups only, in `shared/`).
    pub incremental: bool,
    /// Where tasks record their checkpoint figures for the worker's `/metrics` (none: not
    /// exported).
    pub metrics: Option<crate::exporter::TaskMetrics>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            channel_capacity: 1024,
            control_capacity: 64,
            report_capacity: 1024,
            incremental: false,
            metrics: None,
        }
    }
}

/// A completed checkpoint (or savepoint) to restore from.
#[derive(Debug, Clone)]
pub struct JobRestore {
    pub metadata: CheckpointMetadata,
    /// What the metadata's relative paths resolve against.
    pub base_dir: PathBuf,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct JobDeployment {
    pub job_id: String,
    pub graph: JobGraph,
    /// Attempt number of every task of this deployment (bump it on each restart).
    pub attempt: u32,
    pub storage: CheckpointStorage,
    pub restore: Option<JobRestore>,
    pub options: RuntimeOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("job id {0:?} is not a safe identifier")]
    InvalidJobId(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("operator {operator:?} cannot be created: {reason}")]
    Operator { operator: String, reason: String },
    #[error("cannot assign restored state: {0}")]
    Restore(#[from] StateError),
}

/// One spawned task.
#[derive(Debug)]
pub struct RunningTask {
    pub id: TaskAttemptId,
    pub monitor: TaskMonitor,
    handle: JoinHandle<TaskOutcome>,
}

/// A deployed job.
#[derive(Debug)]
pub struct LocalJob {
    pub link: CoordinatorLink,
    tasks: Vec<RunningTask>,
}

struct Wiring {
    outputs: BTreeMap<(String, u32), Vec<EdgeOutput>>,
    inputs: BTreeMap<(String, u32), Vec<mpsc::Receiver<StreamElement>>>,
}

fn wire(graph: &JobGraph, capacity: usize) -> Wiring {
    let mut w = Wiring { outputs: BTreeMap::new(), inputs: BTreeMap::new() };
    for edge in &graph.edges {
        let (Some(from), Some(to)) = (graph.vertex(&edge.from), graph.vertex(&edge.to)) else { continue };
        for a in 0..from.parallelism {
            let targets: Vec<u32> = match edge.partitioning {
                Partitioning::Forward => vec![a],
                _ => (0..to.parallelism).collect(),
            };
            let mut senders = Vec::with_capacity(targets.len());
            for b in targets {
                let (tx, rx) = mpsc::channel(capacity.max(1));
                senders.push(tx);
                w.inputs.entry((to.id.clone(), b)).or_default().push(rx);
            }
            w.outputs.entry((from.id.clone(), a)).or_default().push(EdgeOutput::new(
                to.id.clone(),
                edge.partitioning,
                to.max_parallelism,
                senders,
                a as usize,
            ));
        }
    }
    w
}

impl LocalJob {
    /// Validates and starts a job. Must be called inside a tokio runtime.
    pub fn deploy(
        d: JobDeployment,
        registry: &OperatorRegistry,
        pool: SnapshotPool,
    ) -> Result<Self, DeployError> {
        if !is_valid_id(&d.job_id) {
            return Err(DeployError::InvalidJobId(d.job_id));
        }
        d.graph.validate(registry)?;
        let mut restores: BTreeMap<String, Vec<Option<TaskRestore>>> = BTreeMap::new();
        if let Some(r) = &d.restore {
            for v in &d.graph.vertices {
                restores.insert(
                    v.id.clone(),
                    assign_vertex(&r.metadata, &r.base_dir, v)?.into_iter().map(Some).collect(),
                );
            }
        }
        let mut wiring = wire(&d.graph, d.options.channel_capacity);
        let mut link = CoordinatorLink::new(d.options.report_capacity, d.options.control_capacity);
        let mut tasks = Vec::new();
        for v in &d.graph.vertices {
            for i in 0..v.parallelism {
                let info = TaskInfo {
                    job: d.job_id.clone(),
                    vertex: v.id.clone(),
                    subtask: i,
                    parallelism: v.parallelism,
                    max_parallelism: v.max_parallelism,
                    attempt: d.attempt,
                };
                let range =
                    crate::keygroups::range_of(v.max_parallelism, v.parallelism, i).ok_or_else(|| {
                        DeployError::Graph(GraphError::ParallelismAboveMax {
                            vertex: v.id.clone(),
                            parallelism: v.parallelism,
                            max_parallelism: v.max_parallelism,
                        })
                    })?;
                let mut members = Vec::new();
                let mut is_source = false;
                for (pos, (op_id, spec)) in v.operators().enumerate() {
                    let err = |reason: String| DeployError::Operator { operator: op_id.to_owned(), reason };
                    let factory = registry
                        .get(&spec.kind)
                        .ok_or_else(|| err(format!("unknown kind {:?}", spec.kind)))?;
                    if pos == 0 {
                        is_source = factory.is_source();
                    }
                    members.push(ChainMember {
                        id: op_id.to_owned(),
                        operator: factory.create(&spec.config, &info).map_err(err)?,
                        keyed: KeyedStateBackend::new(v.max_parallelism, range),
                        lists: OperatorStateBackend::default(),
                    });
                }
                let id = TaskAttemptId {
                    task: TaskId { job: d.job_id.clone(), vertex: v.id.clone(), subtask: i },
                    attempt: d.attempt,
                };
                let task_link = link.connect(id.clone(), is_source);
                let (observer, monitor) = task_observer();
                let observer =
                    observer.exporting(d.options.metrics.as_ref().map(|m| m.task(&d.job_id, &v.id, i)));
                let key = (v.id.clone(), i);
                let setup = TaskSetup {
                    id: id.clone(),
                    chain: OperatorChain::new(info, members, is_source),
                    inputs: InputGate::new(wiring.inputs.remove(&key).unwrap_or_default()),
                    outputs: OutputGate::new(wiring.outputs.remove(&key).unwrap_or_default()),
                    control: task_link.control,
                    reports: task_link.reports,
                    restore: restores
                        .get_mut(&v.id)
                        .and_then(|r| r.get_mut(i as usize))
                        .and_then(Option::take),
                    storage: d.storage.clone(),
                    pool: pool.clone(),
                    incremental: d.options.incremental,
                    observer,
                };
                let span = tracing::info_span!("task", job = %d.job_id, vertex = %v.id, subtask = i, attempt = d.attempt);
                let handle = tokio::spawn(run_task(setup).instrument(span));
                tasks.push(RunningTask { id, monitor, handle });
            }
        }
        Ok(Self { link, tasks })
    }

    pub fn tasks(&self) -> &[RunningTask] {
        &self.tasks
    }

    pub fn monitor(&self, vertex: &str, subtask: u32) -> Option<&TaskMonitor> {
        self.tasks
            .iter()
            .find(|t| t.id.task.vertex == vertex && t.id.task.subtask == subtask)
            .map(|t| &t.monitor)
    }

    /// Aborts every task at its next await point: no close, no dispose, no cleanup, files left
    /// as they are. This is what a crash looks like to the rest of the system. (Dropping a
    /// `LocalJob` does the same: no task outlives its job handle.)
    pub fn kill(self) {
        drop(self);
    }

    /// Waits for every task to end.
    pub async fn join(mut self) -> Vec<(TaskAttemptId, TaskOutcome)> {
        let tasks = std::mem::take(&mut self.tasks);
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            let outcome = match t.handle.await {
                Ok(o) => o,
                Err(e) if e.is_cancelled() => TaskOutcome::Canceled,
                Err(e) => TaskOutcome::Failed(format!("task panicked: {e}")),
            };
            out.push((t.id, outcome));
        }
        out
    }
}

impl Drop for LocalJob {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.handle.abort();
        }
    }
}
