//! Observable figures of a running task, for tests, benchmarks and the worker's `/metrics`.
//!
//! The task is the only writer. Counters are atomics (cheap on the record path); the lifecycle
//! state and the last acknowledged checkpoint are published through `watch` channels so readers
//! can await changes instead of polling with sleeps.
//!
//! # Where a task's time goes
//!
//! As in Flink, the time a task has been running (from `running` until it ends) splits into
//! three parts ([`TaskTimes`]):
//!
//! - **back-pressured**: its output waited for room in a full downstream channel
//!   (`backPressuredTimeMsPerSecond`);
//! - **idle**: it waited for input (or for its source's next poll) with nothing to do
//!   (`idleTimeMsPerSecond`);
//! - **busy**: the rest, `running − idle − back-pressured` (`busyTimeMsPerSecond`).
//!
//! The clock is read only when a wait starts and ends, never per record: a send into a channel
//! with room, or an input element that is already there, costs no clock read. A wait in
//! progress counts up to the moment the figures are read, so a task that has been blocked for
//! a minute shows a minute of back-pressure while it is still blocked.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cairn_protocol::checkpoint::TaskCheckpointMetrics;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::exporter::TaskSeries;
use crate::lifecycle::TaskState;

/// Monotonic counters of one task.
#[derive(Debug)]
pub struct TaskCounters {
    pub records_in: AtomicU64,
    pub records_out: AtomicU64,
    pub checkpoints_acknowledged: AtomicU64,
    pub checkpoints_declined: AtomicU64,
    /// Sum of the synchronous-part pauses, in microseconds.
    pub sync_pause_micros: AtomicU64,
    /// Sum of bytes written by asynchronous parts.
    pub bytes_persisted: AtomicU64,
    /// Time the output waited for room in a full downstream channel (read with
    /// [`TaskCounters::times`]).
    pub(crate) back_pressured_micros: WaitMicros,
    /// Time the task waited for input with nothing to do (read with [`TaskCounters::times`]).
    pub(crate) idle_micros: WaitMicros,
    /// When the task started running, in microseconds on `clock` ([`NOT_YET`] before).
    running_from: AtomicU64,
    /// When it stopped running (ended or was dropped), likewise.
    running_until: AtomicU64,
    /// Origin of the task's clock. Tokio's clock, so that tests with paused time control it.
    clock: Instant,
}

/// Where a task's running time went: `busy + idle + back_pressured` is the time since it
/// started running (until it ended). See the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskTimes {
    pub busy: Duration,
    pub idle: Duration,
    pub back_pressured: Duration,
}

/// Marks a time that has not come yet (the task's start or end).
const NOT_YET: u64 = u64::MAX;
/// Set while a wait is in progress (see [`WaitMicros`]).
const WAITING: u64 = 1 << 63;

/// Time spent in one kind of wait, in microseconds on the task's clock, readable while a wait is
/// in progress.
///
/// One atomic holds either the total of the finished waits (top bit clear) or, during a wait,
/// the top bit and the instant the current wait would have started had there been no earlier
/// ones (its start minus the earlier total), so that the total at `now` is `now` minus that.
/// A reader thus gets a consistent figure from a single load, and only the start and the end
/// of a wait write it. The task is the only writer.
#[derive(Debug, Default)]
pub(crate) struct WaitMicros(AtomicU64);

impl WaitMicros {
    fn load(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// The total of a loaded value at `now`.
    fn total(raw: u64, now: u64) -> u64 {
        if raw & WAITING == 0 { raw } else { now.saturating_sub(raw & !WAITING) }
    }

    /// Starts a wait at `now`; `false` when one is already in progress (it goes on counting).
    fn begin(&self, now: u64) -> bool {
        let raw = self.load();
        if raw & WAITING != 0 {
            return false;
        }
        self.0.store(WAITING | now.saturating_sub(raw), Ordering::Relaxed);
        true
    }

    /// Ends the wait in progress, if any, at `now`.
    fn end(&self, now: u64) {
        let raw = self.load();
        if raw & WAITING != 0 {
            self.0.store(Self::total(raw, now), Ordering::Relaxed);
        }
    }
}

/// What a task waits for, when it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Room in a full downstream channel.
    BackPressured,
    /// Input, or its source's next poll.
    Idle,
}

impl Default for TaskCounters {
    fn default() -> Self {
        Self {
            records_in: AtomicU64::default(),
            records_out: AtomicU64::default(),
            checkpoints_acknowledged: AtomicU64::default(),
            checkpoints_declined: AtomicU64::default(),
            sync_pause_micros: AtomicU64::default(),
            bytes_persisted: AtomicU64::default(),
            back_pressured_micros: WaitMicros::default(),
            idle_micros: WaitMicros::default(),
            running_from: AtomicU64::new(NOT_YET),
            running_until: AtomicU64::new(NOT_YET),
            clock: Instant::now(),
        }
    }
}

impl TaskCounters {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Where the task's running time went, as of now.
    pub fn times(&self) -> TaskTimes {
        let from = self.running_from.load(Ordering::Relaxed);
        if from == NOT_YET {
            return TaskTimes::default();
        }
        // The waits first, the clock after: a wait in progress is then never counted from
        // before its start.
        let idle = self.idle_micros.load();
        let back_pressured = self.back_pressured_micros.load();
        let now = self.now();
        let idle = WaitMicros::total(idle, now);
        let back_pressured = WaitMicros::total(back_pressured, now);
        let running = now.saturating_sub(from);
        TaskTimes {
            busy: Duration::from_micros(running.saturating_sub(idle.saturating_add(back_pressured))),
            idle: Duration::from_micros(idle),
            back_pressured: Duration::from_micros(back_pressured),
        }
    }

    /// Microseconds on the task's clock, never past the end of its running time.
    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.clock.elapsed().as_micros()).unwrap_or(u64::MAX);
        elapsed.min(WAITING - 1).min(self.running_until.load(Ordering::Relaxed))
    }

    /// The task started running: its busy, idle and back-pressured time count from now.
    pub(crate) fn start_running(&self) {
        let _ = self.running_from.compare_exchange(NOT_YET, self.now(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The task stopped running: its figures stay as they are from now on (a wait in progress
    /// ends here).
    pub(crate) fn stop_running(&self) {
        if self.running_from.load(Ordering::Relaxed) == NOT_YET {
            return;
        }
        let now = self.now();
        if self.running_until.compare_exchange(NOT_YET, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.idle_micros.end(now);
            self.back_pressured_micros.end(now);
        }
    }

    fn wait_time(&self, kind: Wait) -> &WaitMicros {
        match kind {
            Wait::BackPressured => &self.back_pressured_micros,
            Wait::Idle => &self.idle_micros,
        }
    }

    /// Counts the time from now until the returned guard drops as a wait of `kind`. Outside
    /// the running time, and inside another wait of the same kind, it counts nothing.
    pub(crate) fn wait(&self, kind: Wait) -> WaitGuard<'_> {
        let running = self.running_from.load(Ordering::Relaxed) != NOT_YET
            && self.running_until.load(Ordering::Relaxed) == NOT_YET;
        let timed = running && self.wait_time(kind).begin(self.now());
        WaitGuard { counters: self, kind, timed }
    }

    /// Awaits `fut`. If it is not ready when first polled, the time until it is counts as a wait
    /// of `kind`; if it is, the clock is not read.
    pub(crate) async fn time_if_pending<F: Future>(&self, kind: Wait, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        let mut waiting = None;
        let out = poll_fn(|cx| {
            let poll = fut.as_mut().poll(cx);
            if poll.is_pending() && waiting.is_none() {
                waiting = Some(self.wait(kind));
            }
            poll
        })
        .await;
        drop(waiting);
        out
    }
}

/// One wait in progress; it ends when this drops (also when the waiting future is dropped).
#[derive(Debug)]
pub(crate) struct WaitGuard<'a> {
    counters: &'a TaskCounters,
    kind: Wait,
    timed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.timed {
            self.counters.wait_time(self.kind).end(self.counters.now());
        }
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
    /// Where the worker's `/metrics` reads this task's figures, when it exports them.
    pub(crate) export: Option<TaskSeries>,
}

impl TaskObserver {
    /// Also records acknowledged and declined checkpoints into `series`, and exports the task's
    /// busy, idle and back-pressured time through it.
    pub fn exporting(mut self, mut series: Option<TaskSeries>) -> Self {
        if let Some(series) = &mut series {
            series.observe(&self.counters);
        }
        self.export = series;
        self
    }
}

/// A task that is dropped without ending (aborted) stops running too, so its figures stop
/// growing.
impl Drop for TaskObserver {
    fn drop(&mut self) {
        self.counters.stop_running();
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn running() -> TaskCounters {
        let c = TaskCounters::default();
        c.start_running();
        c
    }

    #[tokio::test(start_paused = true)]
    async fn running_time_splits_into_busy_idle_and_back_pressured() {
        let c = running();
        tokio::time::advance(100 * MS).await;
        assert_eq!(c.times(), TaskTimes { busy: 100 * MS, ..Default::default() });
        {
            let _idle = c.wait(Wait::Idle);
            tokio::time::advance(300 * MS).await;
            // A wait in progress counts up to now.
            assert_eq!(c.times(), TaskTimes { busy: 100 * MS, idle: 300 * MS, ..Default::default() });
            tokio::time::advance(200 * MS).await;
        }
        {
            let _blocked = c.wait(Wait::BackPressured);
            tokio::time::advance(50 * MS).await;
        }
        tokio::time::advance(10 * MS).await;
        let t = c.times();
        assert_eq!(t, TaskTimes { busy: 110 * MS, idle: 500 * MS, back_pressured: 50 * MS });
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_counts_outside_the_running_time() {
        let c = TaskCounters::default();
        {
            let _blocked = c.wait(Wait::BackPressured);
            tokio::time::advance(100 * MS).await;
        }
        assert_eq!(c.times(), TaskTimes::default(), "not running yet");
        c.start_running();
        let idle = c.wait(Wait::Idle);
        tokio::time::advance(40 * MS).await;
        c.stop_running();
        tokio::time::advance(500 * MS).await;
        drop(idle);
        assert_eq!(c.times(), TaskTimes { idle: 40 * MS, ..Default::default() }, "a wait ends with the task");
        let _late = c.wait(Wait::BackPressured);
        tokio::time::advance(500 * MS).await;
        assert_eq!(c.times(), TaskTimes { idle: 40 * MS, ..Default::default() }, "figures stay once ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_nested_wait_of_the_same_kind_is_counted_once() {
        let c = running();
        let outer = c.wait(Wait::Idle);
        tokio::time::advance(10 * MS).await;
        drop(c.wait(Wait::Idle));
        tokio::time::advance(10 * MS).await;
        assert_eq!(c.times().idle, 20 * MS, "the inner guard did not end the outer wait");
        drop(outer);
        assert_eq!(c.times(), TaskTimes { idle: 20 * MS, ..Default::default() });
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_future_that_pends_is_timed() {
        let c = running();
        assert_eq!(c.time_if_pending(Wait::Idle, async { 7 }).await, 7);
        assert_eq!(c.times(), TaskTimes::default());
        c.time_if_pending(Wait::Idle, tokio::time::sleep(250 * MS)).await;
        assert_eq!(c.times(), TaskTimes { idle: 250 * MS, ..Default::default() });
    }

    #[test]
    fn a_wait_total_is_one_load() {
        let w = WaitMicros::default();
        assert!(w.begin(1_000));
        assert_eq!(WaitMicros::total(w.load(), 1_500), 500);
        assert!(!w.begin(1_200), "already waiting");
        w.end(2_000);
        assert_eq!(WaitMicros::total(w.load(), 9_999), 1_000);
        assert!(w.begin(5_000));
        assert_eq!(WaitMicros::total(w.load(), 5_250), 1_250);
        w.end(6_000);
        assert_eq!(w.load(), 2_000);
    }
}
