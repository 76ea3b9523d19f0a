//! Observable figures of a running task, for tests, benchmarks and (later) the worker's status.
//!
//! The task is the only writer. Counters are atomics (cheap on the record path); the lifecycle
//! state and the last acknowledged checkpoint are published through `watch` channels so readers
//! can await changes instead of polling with sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_protocol::checkpoint::TaskCheckpointMetrics;
use tokio::sync::watch;

use crate::exporter::TaskSeries;
use crate::lifecycle::TaskState;

/// Monotonic counters of one task.
#[derive(Debug, Default)]
pub struct TaskCounters {
    pub records_in: AtomicU64,
    pub records_out: AtomicU64,
    pub checkpoints_acknowledged: AtomicU64,
    pub checkpoints_declined: AtomicU64,
    /// Sum of the synchronous-part pauses, in microseconds.
    pub sync_pause_micros: AtomicU64,
    /// Sum of bytes written by asynchronous parts.
    pub bytes_persisted: AtomicU64,
}

impl TaskCounters {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The last checkpoint a task acknowledged, with its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckedCheckpoint {
    pub checkpoint_id: u64,
    pub metrics: TaskCheckpointMetrics,
}

/// Writer side, owned by the task.
#[derive(Debug)]
pub struct TaskObserver {
    pub(crate) counters: Arc<TaskCounters>,
    pub(crate) state: watch::Sender<TaskState>,
    pub(crate) last_ack: watch::Sender<Option<AckedCheckpoint>>,
    /// Where the worker's `/metrics` reads this task's checkpoint figures, when it exports them.
    pub(crate) export: Option<TaskSeries>,
}

impl TaskObserver {
    /// Also records acknowledged and declined checkpoints into `series`.
    pub fn exporting(mut self, series: Option<TaskSeries>) -> Self {
        self.export = series;
        self
    }
}

/// Reader side: cheap to clone.
#[derive(Debug, Clone)]
pub struct TaskMonitor {
    pub counters: Arc<TaskCounters>,
    pub state: watch::Receiver<TaskState>,
    pub last_ack: watch::Receiver<Option<AckedCheckpoint>>,
}

/// A connected observer/monitor pair.
pub fn task_observer() -> (TaskObserver, TaskMonitor) {
    let counters = Arc::new(TaskCounters::default());
    let (state_tx, state_rx) = watch::channel(TaskState::Created);
    let (ack_tx, ack_rx) = watch::channel(None);
    (
        TaskObserver { counters: counters.clone(), state: state_tx, last_ack: ack_tx, export: None },
        TaskMonitor { counters, state: state_rx, last_ack: ack_rx },
    )
}

impl TaskMonitor {
    pub fn current_state(&self) -> TaskState {
        self.state.borrow().clone()
    }
}
