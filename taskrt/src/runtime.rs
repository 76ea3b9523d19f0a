//! Deploying a job graph in-process: one tokio task per subtask, wired by bounded channels.
//!
//! [`LocalJob::deploy`] validates the graph against the registry's catalog, hands every subtask
//! exactly the restore it was assigned (the leader computes the [`StateAssignment`] once, with
//! `cairn_protocol::assign::assign_states`), creates one channel per connected (upstream,
//! downstream) subtask pair, builds every operator
//! chain, connects every task to a [`CoordinatorLink`], and spawns the tasks. The returned
//! [`LocalJob`] owns the join handles (nothing runs detached) and the coordinator's end of the
//! link; [`LocalJob::kill`] aborts everything abruptly, as a crashed worker would.
//!
//! A job that spans several workers is deployed on each of them with the same [`Placement`]
//! ([`LocalJob::deploy_placed`]): each worker runs only the subtasks placed on it, and the
//! channels between its subtasks and another worker's run over one [`crate::network`] link per
//! peer worker. Channel ids are (edge index, upstream subtask, downstream subtask), so both
//! ends derive the same ones from the graph.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use cairn_protocol::assign::StateAssignment;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::chain::{ChainMember, OperatorChain};
use crate::checkpoint::pool::SnapshotPool;
use crate::exchange::{EdgeOutput, InputGate, OutputGate, PriorityBarrier, StreamElement, priority_lane};
use crate::link::CoordinatorLink;
use crate::metrics::{TaskMonitor, task_observer};
use crate::network::{ChannelId, ExchangeKey, ExchangeService, NetworkError, PeerLink, PeerSpec};
use crate::operator::TaskInfo;
use crate::registry::OperatorRegistry;
use crate::state::keyed::KeyedStateBackend;
use crate::state::list::OperatorStateBackend;
use crate::state::storage::CheckpointStorage;
use crate::task::{TaskOutcome, TaskSetup, run_task};
use cairn_protocol::graph::{GraphError, JobGraph, Partitioning, is_valid_id};
use cairn_protocol::messages::{TaskAttemptId, TaskId};

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

/// What to run.
#[derive(Debug, Clone)]
pub struct JobDeployment {
    pub job_id: String,
    pub graph: JobGraph,
    /// Attempt number of every task of this deployment (bump it on each restart).
    pub attempt: u32,
    pub storage: CheckpointStorage,
    /// What each subtask restores (every subtask of the graph must be covered); `None` starts
    /// every subtask empty.
    pub restore: Option<StateAssignment>,
    pub options: RuntimeOptions,
}

/// Where the subtasks of a job run when it spans several workers. Every worker of the job gets
/// the same placement.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The worker running each subtask, by (vertex, subtask); every subtask must be placed.
    pub subtasks: BTreeMap<(String, u32), String>,
    /// The data exchange address of every worker named in `subtasks`.
    pub addresses: BTreeMap<String, SocketAddr>,
    /// The job attempt's exchange key (see [`crate::network::handshake`]).
    pub key: ExchangeKey,
}

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("the placement puts subtask {subtask} of vertex {vertex:?} on no worker")]
    Unplaced { vertex: String, subtask: u32 },
    #[error("the placement has no data exchange address for worker {0:?}")]
    NoAddress(String),
    #[error("data exchange: {0}")]
    Network(#[from] NetworkError),
    #[error("job id {0:?} is not a safe identifier")]
    InvalidJobId(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("operator {operator:?} cannot be created: {reason}")]
    Operator { operator: String, reason: String },
    #[error("the restore assignment has no entry for subtask {subtask} of vertex {vertex:?}")]
    MissingRestore { vertex: String, subtask: u32 },
    #[error(
        "the restore assignment gives subtask {subtask} of vertex {vertex:?} key groups {assigned:?}, but it owns {owned:?}"
    )]
    RestoreRangeMismatch {
        vertex: String,
        subtask: u32,
        assigned: cairn_protocol::checkpoint::KeyGroupRange,
        owned: cairn_protocol::checkpoint::KeyGroupRange,
    },
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
    /// Data links to the job's other workers; dropping them closes their channels.
    links: Vec<PeerLink>,
    /// Report forwarders of absorbed parts.
    forwarders: Vec<JoinHandle<()>>,
}

/// A consumer's end of one channel: its data and its priority lane.
type ChannelEnd = (mpsc::Receiver<StreamElement>, mpsc::Receiver<PriorityBarrier>);

struct Wiring {
    outputs: BTreeMap<(String, u32), Vec<EdgeOutput>>,
    inputs: BTreeMap<(String, u32), Vec<ChannelEnd>>,
    /// Channels to and from other workers, by peer worker.
    remote: BTreeMap<String, RemoteChannels>,
}

#[derive(Default)]
struct RemoteChannels {
    outbound: Vec<(ChannelId, mpsc::Receiver<StreamElement>)>,
    inbound: Vec<(ChannelId, mpsc::Sender<StreamElement>)>,
    outbound_priority: Vec<(ChannelId, mpsc::Receiver<PriorityBarrier>)>,
    inbound_priority: Vec<(ChannelId, mpsc::Sender<PriorityBarrier>)>,
}

/// Which worker runs a subtask: `None` for this one.
type Locate<'a> = dyn Fn(&str, u32) -> Result<Option<&'a str>, DeployError> + 'a;

fn wire(graph: &JobGraph, capacity: usize, locate: &Locate<'_>) -> Result<Wiring, DeployError> {
    let mut w = Wiring { outputs: BTreeMap::new(), inputs: BTreeMap::new(), remote: BTreeMap::new() };
    for (index, edge) in graph.edges.iter().enumerate() {
        let (Some(from), Some(to)) = (graph.vertex(&edge.from), graph.vertex(&edge.to)) else { continue };
        for a in 0..from.parallelism {
            let producer = locate(&from.id, a)?;
            let targets: Vec<u32> = match edge.partitioning {
                Partitioning::Forward => vec![a],
                _ => (0..to.parallelism).collect(),
            };
            let mut senders = Vec::with_capacity(targets.len());
            let mut lanes = Vec::with_capacity(targets.len());
            for b in targets {
                let consumer = locate(&to.id, b)?;
                let id = ChannelId { edge: index as u32, from: a, to: b };
                let (tx, rx) = mpsc::channel(capacity.max(1));
                let (ptx, prx) = priority_lane();
                match (producer, consumer) {
                    (None, None) => {
                        senders.push(tx);
                        lanes.push(Some(ptx));
                        w.inputs.entry((to.id.clone(), b)).or_default().push((rx, prx));
                    }
                    (None, Some(peer)) => {
                        senders.push(tx);
                        lanes.push(Some(ptx));
                        let remote = w.remote.entry(peer.to_owned()).or_default();
                        remote.outbound.push((id, rx));
                        remote.outbound_priority.push((id, prx));
                    }
                    (Some(peer), None) => {
                        w.inputs.entry((to.id.clone(), b)).or_default().push((rx, prx));
                        let remote = w.remote.entry(peer.to_owned()).or_default();
                        remote.inbound.push((id, tx));
                        remote.inbound_priority.push((id, ptx));
                    }
                    (Some(_), Some(_)) => {}
                }
            }
            if producer.is_none() {
                w.outputs.entry((from.id.clone(), a)).or_default().push(
                    EdgeOutput::new(
                        to.id.clone(),
                        edge.partitioning,
                        to.max_parallelism,
                        senders,
                        a as usize,
                    )
                    .with_priority(lanes),
                );
            }
        }
    }
    Ok(w)
}

fn input_gate(ends: Vec<ChannelEnd>) -> InputGate {
    let (data, lanes): (Vec<_>, Vec<_>) = ends.into_iter().map(|(d, p)| (d, Some(p))).unzip();
    InputGate::new(data).with_priority(lanes)
}

impl LocalJob {
    /// Validates and starts a job. Must be called inside a tokio runtime.
    pub fn deploy(
        d: JobDeployment,
        registry: &OperatorRegistry,
        pool: SnapshotPool,
    ) -> Result<Self, DeployError> {
        Self::start(d, registry, pool, None)
    }

    /// Starts the subtasks `placement` puts on `exchange`'s worker, and the links to the other
    /// workers of the job. Must be called inside a tokio runtime.
    pub fn deploy_placed(
        d: JobDeployment,
        registry: &OperatorRegistry,
        pool: SnapshotPool,
        placement: &Placement,
        exchange: &ExchangeService,
    ) -> Result<Self, DeployError> {
        Self::start(d, registry, pool, Some((placement, exchange)))
    }

    fn start(
        d: JobDeployment,
        registry: &OperatorRegistry,
        pool: SnapshotPool,
        placed: Option<(&Placement, &ExchangeService)>,
    ) -> Result<Self, DeployError> {
        if !is_valid_id(&d.job_id) {
            return Err(DeployError::InvalidJobId(d.job_id));
        }
        d.graph.validate(registry.catalog())?;
        let here = placed.map(|(_, x)| x.worker_id().to_owned());
        let locate = |vertex: &str, subtask: u32| -> Result<Option<&str>, DeployError> {
            let Some((placement, _)) = placed else { return Ok(None) };
            match placement.subtasks.get(&(vertex.to_owned(), subtask)) {
                None => Err(DeployError::Unplaced { vertex: vertex.to_owned(), subtask }),
                Some(w) if Some(w) == here.as_ref() => Ok(None),
                Some(w) => Ok(Some(w.as_str())),
            }
        };
        let mut wiring = wire(&d.graph, d.options.channel_capacity, &locate)?;
        let mut links = Vec::with_capacity(wiring.remote.len());
        if let Some((placement, exchange)) = placed {
            for (peer, channels) in std::mem::take(&mut wiring.remote) {
                let addr =
                    *placement.addresses.get(&peer).ok_or_else(|| DeployError::NoAddress(peer.clone()))?;
                links.push(exchange.open(PeerSpec {
                    job: d.job_id.clone(),
                    attempt: u64::from(d.attempt),
                    key: placement.key.clone(),
                    peer_worker: peer,
                    peer_addr: addr,
                    outbound: channels.outbound,
                    inbound: channels.inbound,
                    outbound_priority: channels.outbound_priority,
                    inbound_priority: channels.inbound_priority,
                })?);
            }
        }
        let mut link = CoordinatorLink::new(d.options.report_capacity, d.options.control_capacity);
        let mut tasks = Vec::new();
        for v in &d.graph.vertices {
            for i in 0..v.parallelism {
                if locate(&v.id, i)?.is_some() {
                    continue;
                }
                let info = TaskInfo {
                    job: d.job_id.clone(),
                    vertex: v.id.clone(),
                    subtask: i,
                    parallelism: v.parallelism,
                    max_parallelism: v.max_parallelism,
                    attempt: d.attempt,
                };
                let range = cairn_protocol::keygroups::range_of(v.max_parallelism, v.parallelism, i)
                    .ok_or_else(|| {
                        DeployError::Graph(GraphError::ParallelismAboveMax {
                            vertex: v.id.clone(),
                            parallelism: v.parallelism,
                            max_parallelism: v.max_parallelism,
                        })
                    })?;
                let restore = match &d.restore {
                    None => None,
                    Some(a) => {
                        let r = a.task(&v.id, i).cloned().ok_or_else(|| DeployError::MissingRestore {
                            vertex: v.id.clone(),
                            subtask: i,
                        })?;
                        if r.key_groups != range {
                            return Err(DeployError::RestoreRangeMismatch {
                                vertex: v.id.clone(),
                                subtask: i,
                                assigned: r.key_groups,
                                owned: range,
                            });
                        }
                        Some(r)
                    }
                };
                let is_source = registry.catalog().is_source_kind(&v.operator.kind).unwrap_or(false);
                let mut members = Vec::new();
                for (op_id, spec) in v.operators() {
                    let err = |reason: String| DeployError::Operator { operator: op_id.to_owned(), reason };
                    let factory = registry
                        .get(&spec.kind)
                        .ok_or_else(|| err(format!("unknown kind {:?}", spec.kind)))?;
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
                    inputs: input_gate(wiring.inputs.remove(&key).unwrap_or_default()),
                    outputs: OutputGate::new(wiring.outputs.remove(&key).unwrap_or_default()),
                    control: task_link.control,
                    reports: task_link.reports,
                    restore,
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
        Ok(Self { link, tasks, links, forwarders: Vec::new() })
    }

    /// Takes over `other` (another part of the same job, e.g. deployed on another worker in the
    /// same process): its tasks, links, and reports, which arrive on this job's link from now on.
    pub fn absorb(&mut self, mut other: LocalJob) {
        self.tasks.append(&mut other.tasks);
        self.links.append(&mut other.links);
        self.forwarders.append(&mut other.forwarders);
        let link = std::mem::replace(&mut other.link, CoordinatorLink::new(1, 1));
        if let Some(forwarder) = self.link.absorb(link) {
            self.forwarders.push(forwarder);
        }
    }

    /// The links of this part of the job to other workers.
    pub fn peer_links(&self) -> &[PeerLink] {
        &self.links
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
        for f in &self.forwarders {
            f.abort();
        }
    }
}
