//! Shared fixtures: a single-task harness wired to channels the test holds, a recording
//! operator, bounded polling waits, and helpers to read state back from checkpoints.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_protocol::assign::TaskRestore;
use cairn_protocol::checkpoint::{CheckpointMetadata, KeyGroupRange};
use cairn_protocol::graph::Partitioning;
use cairn_protocol::messages::{CoordinatorMessage, TaskAttemptId, TaskId, TaskMessage, ToTask};
use cairn_taskrt::chain::{ChainMember, OperatorChain};
use cairn_taskrt::checkpoint::pool::SnapshotPool;
use cairn_taskrt::exchange::{
    EdgeOutput, InputGate, OutputGate, PriorityBarrier, Record, StreamElement, priority_lane,
};
use cairn_taskrt::exporter::TaskMetrics;
use cairn_taskrt::metrics::{TaskMonitor, task_observer};
use cairn_taskrt::operator::{Operator, OperatorContext, OperatorError, SourcePoll, TaskInfo};
use cairn_taskrt::state::codec;
use cairn_taskrt::state::keyed::KeyedStateBackend;
use cairn_taskrt::state::list::OperatorStateBackend;
use cairn_taskrt::state::storage::{CheckpointStorage, read_segments};
use cairn_taskrt::task::{TaskOutcome, TaskSetup, run_task};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub const WAIT: Duration = Duration::from_secs(20);

/// Keys and records per key of [`bounded_demo`]'s source.
pub const DEMO_KEYS: u64 = 16;
pub const DEMO_PER_KEY: u64 = 300;

/// The demo job with a bounded source ([`DEMO_KEYS`] × [`DEMO_PER_KEY`] records at 1,500/s) at
/// the given source and counter/sink parallelism.
pub fn bounded_demo(output: &Path, source_p: u32, p: u32) -> cairn_taskrt::demo::DemoJob {
    cairn_taskrt::demo::DemoJob {
        source: cairn_taskrt::demo::source::SourceConfig {
            keys: DEMO_KEYS,
            records_per_key: Some(DEMO_PER_KEY),
            rate_per_sec: Some(1500),
            batch: 32,
            idle_after_limit: false,
        },
        output_dir: output.to_string_lossy().into_owned(),
        source_parallelism: source_p,
        parallelism: p,
        max_parallelism: 64,
    }
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Polls `cond` every few milliseconds until it holds; panics after `WAIT`.
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A log of lifecycle calls shared between operators and the test.
pub type CallLog = Arc<Mutex<Vec<String>>>;

pub fn log_entries(log: &CallLog) -> Vec<String> {
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Passes records through and records every lifecycle call as `"<name>:<call>"`.
pub struct Recorder {
    pub name: String,
    pub log: CallLog,
}

impl Recorder {
    fn note(&self, call: impl Into<String>) {
        if let Ok(mut l) = self.log.lock() {
            l.push(format!("{}:{}", self.name, call.into()));
        }
    }
}

impl Operator for Recorder {
    fn initialize_state(
        &mut self,
        _ctx: &mut OperatorContext<'_>,
        restored: Option<u64>,
    ) -> Result<(), OperatorError> {
        self.note(format!("initialize({restored:?})"));
        Ok(())
    }
    fn open(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        self.note("open");
        Ok(())
    }
    fn process_record(&mut self, record: Record, ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        ctx.emit(record);
        Ok(())
    }
    fn prepare_snapshot_pre_barrier(
        &mut self,
        id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        self.note(format!("prepare({id})"));
        Ok(())
    }
    fn snapshot_state(&mut self, id: u64, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        self.note(format!("snapshot({id})"));
        Ok(())
    }
    fn notify_checkpoint_complete(
        &mut self,
        id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        self.note(format!("complete({id})"));
        Ok(())
    }
    fn notify_checkpoint_aborted(
        &mut self,
        id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        self.note(format!("aborted({id})"));
        Ok(())
    }
    fn end_input(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        self.note("end_input");
        Ok(())
    }
    fn close(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        self.note("close");
        Ok(())
    }
    fn dispose(&mut self) {
        self.note("dispose");
    }
}

/// A source that emits `burst` records per poll, forever; with `pause`, it then asks not to be
/// polled again for that long.
pub struct Producer {
    pub next: u64,
    pub burst: u64,
    pub pause: Option<Duration>,
}

impl Operator for Producer {
    fn process_record(
        &mut self,
        _record: Record,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    fn poll_source(&mut self, ctx: &mut OperatorContext<'_>) -> Result<SourcePoll, OperatorError> {
        for _ in 0..self.burst {
            ctx.emit(rec(self.next % 16, self.next));
            self.next += 1;
        }
        Ok(self.pause.map_or(SourcePoll::Emitted, SourcePoll::Idle))
    }
}

/// A source task running a [`Producer`], its output channel holding `output_capacity`.
pub fn producer(
    storage: CheckpointStorage,
    burst: u64,
    pause: Option<Duration>,
    output_capacity: usize,
) -> HarnessOptions {
    let source = Producer { next: 0, burst, pause };
    let mut o = HarnessOptions::new(storage, vec![("producer".into(), Box::new(source))]);
    o.inputs = 0;
    o.is_source = true;
    o.output_capacity = output_capacity;
    o
}

/// A source that emits nothing but takes checkpoints, and finishes when stopped.
pub struct IdleSource {
    pub stopped: bool,
}

impl Operator for IdleSource {
    fn process_record(
        &mut self,
        _record: Record,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }
    fn poll_source(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<SourcePoll, OperatorError> {
        Ok(if self.stopped { SourcePoll::Finished } else { SourcePoll::Idle(Duration::from_millis(10)) })
    }
    fn stop_source(&mut self) {
        self.stopped = true;
    }
}

pub struct HarnessOptions {
    pub inputs: usize,
    pub operators: Vec<(String, Box<dyn Operator>)>,
    pub is_source: bool,
    pub storage: CheckpointStorage,
    pub restore: Option<TaskRestore>,
    pub incremental: bool,
    pub max_parallelism: u32,
    pub parallelism: u32,
    pub subtask: u32,
    /// Capacity of the output channel the test holds.
    pub output_capacity: usize,
    /// Where the task exports its figures (as job `job`, vertex `v`), if anywhere.
    pub metrics: Option<TaskMetrics>,
}

impl HarnessOptions {
    pub fn new(storage: CheckpointStorage, operators: Vec<(String, Box<dyn Operator>)>) -> Self {
        Self {
            inputs: 1,
            operators,
            is_source: false,
            storage,
            restore: None,
            incremental: false,
            max_parallelism: 128,
            parallelism: 1,
            subtask: 0,
            output_capacity: 1024,
            metrics: None,
        }
    }
}

/// One task whose channels the test holds.
pub struct Harness {
    pub inputs: Vec<mpsc::Sender<StreamElement>>,
    /// The priority lanes of the inputs.
    pub lanes: Vec<mpsc::Sender<PriorityBarrier>>,
    pub output: mpsc::Receiver<StreamElement>,
    /// The priority lane of the output.
    pub output_lane: mpsc::Receiver<PriorityBarrier>,
    pub control: mpsc::Sender<CoordinatorMessage>,
    pub reports: mpsc::Receiver<TaskMessage>,
    pub monitor: TaskMonitor,
    pub handle: JoinHandle<TaskOutcome>,
    pub id: TaskAttemptId,
}

pub fn spawn_task(o: HarnessOptions) -> Harness {
    let info = TaskInfo {
        job: "job".into(),
        vertex: "v".into(),
        subtask: o.subtask,
        parallelism: o.parallelism,
        max_parallelism: o.max_parallelism,
        attempt: 0,
    };
    let range = KeyGroupRange::for_subtask(o.max_parallelism, o.parallelism, o.subtask).expect("valid range");
    let members = o
        .operators
        .into_iter()
        .map(|(id, operator)| ChainMember {
            id,
            operator,
            keyed: KeyedStateBackend::new(o.max_parallelism, range),
            lists: OperatorStateBackend::default(),
        })
        .collect();
    let (in_txs, in_rxs): (Vec<_>, Vec<_>) = (0..o.inputs).map(|_| mpsc::channel(64)).unzip();
    let (lanes, lane_rxs): (Vec<_>, Vec<_>) = (0..o.inputs).map(|_| priority_lane()).unzip();
    let (out_tx, output) = mpsc::channel(o.output_capacity);
    let (out_lane, output_lane) = priority_lane();
    let (control, control_rx) = mpsc::channel(16);
    let (reports_tx, reports) = mpsc::channel(64);
    let (observer, monitor) = task_observer();
    let observer = observer.exporting(o.metrics.map(|m| m.task("job", "v", o.subtask)));
    let id = TaskAttemptId {
        task: TaskId { job: "job".into(), vertex: "v".into(), subtask: o.subtask },
        attempt: 0,
    };
    let setup = TaskSetup {
        id: id.clone(),
        chain: OperatorChain::new(info, members, o.is_source),
        inputs: InputGate::new(in_rxs).with_priority(lane_rxs.into_iter().map(Some).collect()),
        outputs: OutputGate::new(vec![
            EdgeOutput::new("down".into(), Partitioning::Forward, 128, vec![out_tx], 0)
                .with_priority(vec![Some(out_lane)]),
        ]),
        control: control_rx,
        reports: reports_tx,
        restore: o.restore,
        storage: o.storage,
        pool: SnapshotPool::new(2),
        incremental: o.incremental,
        observer,
    };
    Harness {
        inputs: in_txs,
        lanes,
        output,
        output_lane,
        control,
        reports,
        monitor,
        handle: tokio::spawn(run_task(setup)),
        id,
    }
}

impl Harness {
    pub async fn send(&self, input: usize, element: StreamElement) {
        self.inputs[input].send(element).await.expect("task input open");
    }

    pub async fn control(&self, term: u64, body: ToTask) {
        self.control.send(CoordinatorMessage { term, body }).await.expect("task control open");
    }

    /// Next report that is not a status report.
    pub async fn next_checkpoint_report(&mut self) -> TaskMessage {
        loop {
            let msg = tokio::time::timeout(WAIT, self.reports.recv())
                .await
                .expect("report in time")
                .expect("report");
            if !matches!(msg, TaskMessage::Status { .. }) {
                return msg;
            }
        }
    }

    pub async fn next_output(&mut self) -> StreamElement {
        tokio::time::timeout(WAIT, self.output.recv()).await.expect("output in time").expect("output")
    }

    pub async fn wait_running(&self) {
        let mut state = self.monitor.state.clone();
        tokio::time::timeout(WAIT, state.wait_for(|s| *s == cairn_taskrt::lifecycle::TaskState::Running))
            .await
            .expect("running in time")
            .expect("state watch");
    }
}

pub fn rec(key: u64, seq: u64) -> Record {
    Record { key, value: 1, seq }
}

/// Reads the `count` value state of `operator` from all subtasks of `vertex` in a checkpoint.
pub fn keyed_counts(
    meta: &CheckpointMetadata,
    base: &Path,
    vertex: &str,
    operator: &str,
) -> BTreeMap<u64, u64> {
    let mut counts = BTreeMap::new();
    for (key, st) in &meta.subtasks {
        if !key.starts_with(&format!("{vertex}/")) {
            continue;
        }
        let Some(op) = st.operators.get(operator) else { continue };
        op.keyed.validate().expect("keyed handle is consistent");
        for file in &op.keyed.files {
            let segments =
                op.keyed.key_groups.iter().filter(|(_, s)| s.file == file.path).map(|(kg, s)| (*kg, s));
            read_segments(base, file, segments, |kg, bytes| {
                let (declared, data) = codec::decode(bytes).expect("segment decodes");
                assert_eq!(declared, kg);
                for (k, v) in data.values.get("count").into_iter().flatten() {
                    let arr: [u8; 8] = v.as_slice().try_into().expect("u64 count");
                    assert!(counts.insert(*k, u64::from_le_bytes(arr)).is_none(), "key {k} in two segments");
                }
                Ok(())
            })
            .expect("segments readable and intact");
        }
    }
    counts
}
