//! Per-subtask figures of a worker, labelled `job_id`, `vertex`, `subtask`.
//!
//! The worker registers one [`TaskMetrics`] and hands it to its job host (through
//! [`crate::runtime::RuntimeOptions::metrics`]); each deployed task gets a [`TaskSeries`] and
//! records into it where it builds its [`TaskCheckpointMetrics`]: when it acknowledges a
//! checkpoint and when it declines one. A task attempt's series outlive it only while another
//! attempt of the same subtask runs here (see [`SeriesOwners`]); when the last one ends, the
//! series are removed.
//!
//! Where the subtask's running time went (busy, idle, back-pressured: [`TaskTimes`]) is not
//! pushed by the task but read from its counters when `/metrics` is scraped, so that a wait
//! still in progress shows. These are counters of seconds: their per-second rate is Flink's
//! `busyTimeMsPerSecond`, `idleTimeMsPerSecond` and `backPressuredTimeMsPerSecond` divided by
//! 1000.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cairn_protocol::checkpoint::TaskCheckpointMetrics;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use cairn_process::metrics::{SeriesOwners, ms_to_seconds};

use crate::metrics::{TaskCounters, TaskTimes};

/// Labels of one subtask.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TaskLabels {
    pub job_id: String,
    pub vertex: String,
    pub subtask: u32,
}

type Seconds = Family<TaskLabels, Gauge<f64, AtomicU64>>;
type Figure = Family<TaskLabels, Gauge>;
type Count = Family<TaskLabels, Counter>;
type Times = Family<TaskLabels, RunningTime, fn() -> RunningTime>;

/// Which part of a task's running time a [`RunningTime`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimePart {
    Busy,
    Idle,
    BackPressured,
}

impl TimePart {
    fn of(self, times: &TaskTimes) -> Duration {
        match self {
            TimePart::Busy => times.busy,
            TimePart::Idle => times.idle,
            TimePart::BackPressured => times.back_pressured,
        }
    }
}

/// A counter of the seconds one part of a subtask's running time took, read from the counters
/// of its task attempts when scraped. An attempt that ends leaves its final figure behind, so
/// the count continues across attempts (as the checkpoint counts do); it never goes back.
/// Clones share the count.
#[derive(Debug, Clone)]
pub struct RunningTime {
    part: TimePart,
    sources: Arc<Mutex<TimeSources>>,
}

#[derive(Debug, Default)]
struct TimeSources {
    /// The counters of the attempts that record into this series.
    attempts: Vec<Arc<TaskCounters>>,
    /// What attempts that ended took.
    ended: Duration,
    /// The highest figure reported so far.
    reported: Duration,
}

impl RunningTime {
    fn new(part: TimePart) -> Self {
        Self { part, sources: Arc::default() }
    }

    fn busy() -> Self {
        Self::new(TimePart::Busy)
    }

    fn idle() -> Self {
        Self::new(TimePart::Idle)
    }

    fn back_pressured() -> Self {
        Self::new(TimePart::BackPressured)
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, TimeSources> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn attach(&self, counters: &Arc<TaskCounters>) {
        self.sources().attempts.push(counters.clone());
    }

    fn detach(&self, counters: &Arc<TaskCounters>) {
        let mut sources = self.sources();
        if let Some(i) = sources.attempts.iter().position(|c| Arc::ptr_eq(c, counters)) {
            let attempt = sources.attempts.swap_remove(i);
            sources.ended = sources.ended.saturating_add(self.part.of(&attempt.times()));
        }
    }

    /// The count now.
    pub fn get(&self) -> Duration {
        let mut sources = self.sources();
        let total = sources
            .attempts
            .iter()
            .fold(sources.ended, |sum, c| sum.saturating_add(self.part.of(&c.times())))
            .max(sources.reported);
        sources.reported = total;
        total
    }
}

impl TypedMetric for RunningTime {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for RunningTime {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get().as_secs_f64(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The task-level metric families of one worker. Cheap to clone (the families are shared).
#[derive(Clone)]
pub struct TaskMetrics {
    alignment: Seconds,
    start_delay: Seconds,
    sync: Seconds,
    async_part: Seconds,
    persisted: Figure,
    state_size: Figure,
    checkpoint_id: Figure,
    acknowledged: Count,
    declined: Count,
    busy: Times,
    idle: Times,
    back_pressured: Times,
    owners: SeriesOwners<TaskLabels>,
}

impl std::fmt::Debug for TaskMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskMetrics").finish_non_exhaustive()
    }
}

/// Two handles are equal when they record into the same families.
impl PartialEq for TaskMetrics {
    fn eq(&self, other: &Self) -> bool {
        self.owners.ptr_eq(&other.owners)
    }
}

impl Eq for TaskMetrics {}

impl TaskMetrics {
    /// Registers the task-level families in `registry` (named `<prefix>_task_...`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            alignment: Seconds::default(),
            start_delay: Seconds::default(),
            sync: Seconds::default(),
            async_part: Seconds::default(),
            persisted: Figure::default(),
            state_size: Figure::default(),
            checkpoint_id: Figure::default(),
            acknowledged: Count::default(),
            declined: Count::default(),
            busy: Times::new_with_constructor(RunningTime::busy),
            idle: Times::new_with_constructor(RunningTime::idle),
            back_pressured: Times::new_with_constructor(RunningTime::back_pressured),
            owners: SeriesOwners::default(),
        };
        let r = registry.sub_registry_with_prefix("task");
        r.register(
            "last_checkpoint_alignment_seconds",
            "Barrier alignment time of the subtask's last acknowledged checkpoint",
            m.alignment.clone(),
        );
        r.register(
            "last_checkpoint_start_delay_seconds",
            "Time from the checkpoint's trigger to the subtask starting it, for its last acknowledged checkpoint",
            m.start_delay.clone(),
        );
        r.register(
            "last_checkpoint_sync_seconds",
            "Synchronous part (the pause of the task) of the subtask's last acknowledged checkpoint",
            m.sync.clone(),
        );
        r.register(
            "last_checkpoint_async_seconds",
            "Asynchronous part (writing state) of the subtask's last acknowledged checkpoint",
            m.async_part.clone(),
        );
        r.register(
            "last_checkpoint_persisted_bytes",
            "Bytes the subtask wrote for its last acknowledged checkpoint (new files only when incremental)",
            m.persisted.clone(),
        );
        r.register(
            "last_checkpoint_state_size_bytes",
            "Bytes of state the subtask's last acknowledged checkpoint references",
            m.state_size.clone(),
        );
        r.register(
            "last_checkpoint_id",
            "Id of the subtask's last acknowledged checkpoint",
            m.checkpoint_id.clone(),
        );
        r.register(
            "checkpoints_acknowledged",
            "Checkpoints the subtask acknowledged",
            m.acknowledged.clone(),
        );
        r.register("checkpoints_declined", "Checkpoints the subtask declined", m.declined.clone());
        r.register(
            "busy_seconds",
            "Running time of the subtask that was neither idle nor back-pressured (rate x 1000: Flink's busyTimeMsPerSecond)",
            m.busy.clone(),
        );
        r.register(
            "idle_seconds",
            "Running time the subtask waited for input with nothing to do (rate x 1000: Flink's idleTimeMsPerSecond)",
            m.idle.clone(),
        );
        r.register(
            "back_pressured_seconds",
            "Running time the subtask's output waited for room in a full downstream channel (rate x 1000: Flink's backPressuredTimeMsPerSecond)",
            m.back_pressured.clone(),
        );
        m
    }

    /// The series of one subtask; they exist until the last [`TaskSeries`] of it is dropped.
    pub fn task(&self, job_id: &str, vertex: &str, subtask: u32) -> TaskSeries {
        let labels = TaskLabels { job_id: job_id.to_owned(), vertex: vertex.to_owned(), subtask };
        self.owners.acquire(&labels, || TaskSeries {
            alignment: self.alignment.get_or_create_owned(&labels),
            start_delay: self.start_delay.get_or_create_owned(&labels),
            sync: self.sync.get_or_create_owned(&labels),
            async_part: self.async_part.get_or_create_owned(&labels),
            persisted: self.persisted.get_or_create_owned(&labels),
            state_size: self.state_size.get_or_create_owned(&labels),
            checkpoint_id: self.checkpoint_id.get_or_create_owned(&labels),
            acknowledged: self.acknowledged.get_or_create_owned(&labels),
            declined: self.declined.get_or_create_owned(&labels),
            busy: self.busy.get_or_create_owned(&labels),
            idle: self.idle.get_or_create_owned(&labels),
            back_pressured: self.back_pressured.get_or_create_owned(&labels),
            observed: None,
            labels: labels.clone(),
            families: self.clone(),
        })
    }

    fn remove(&self, labels: &TaskLabels) {
        self.alignment.remove(labels);
        self.start_delay.remove(labels);
        self.sync.remove(labels);
        self.async_part.remove(labels);
        self.persisted.remove(labels);
        self.state_size.remove(labels);
        self.checkpoint_id.remove(labels);
        self.acknowledged.remove(labels);
        self.declined.remove(labels);
        self.busy.remove(labels);
        self.idle.remove(labels);
        self.back_pressured.remove(labels);
    }
}

/// Where one task records its checkpoint figures (plain atomics: no lock on the task's path),
/// and through which its running time is read.
pub struct TaskSeries {
    labels: TaskLabels,
    alignment: Gauge<f64, AtomicU64>,
    start_delay: Gauge<f64, AtomicU64>,
    sync: Gauge<f64, AtomicU64>,
    async_part: Gauge<f64, AtomicU64>,
    persisted: Gauge,
    state_size: Gauge,
    checkpoint_id: Gauge,
    acknowledged: Counter,
    declined: Counter,
    busy: RunningTime,
    idle: RunningTime,
    back_pressured: RunningTime,
    /// The counters whose running time these series show.
    observed: Option<Arc<TaskCounters>>,
    families: TaskMetrics,
}

impl std::fmt::Debug for TaskSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSeries").field("labels", &self.labels).finish_non_exhaustive()
    }
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl TaskSeries {
    /// The task acknowledged `checkpoint_id` with these figures.
    pub fn acknowledged(&self, checkpoint_id: u64, m: &TaskCheckpointMetrics) {
        self.alignment.set(ms_to_seconds(m.alignment_ms));
        self.start_delay.set(ms_to_seconds(m.start_delay_ms));
        self.sync.set(ms_to_seconds(m.sync_ms));
        self.async_part.set(ms_to_seconds(m.async_ms));
        self.persisted.set(gauge_value(m.bytes_persisted));
        self.state_size.set(gauge_value(m.state_size));
        self.checkpoint_id.set(gauge_value(checkpoint_id));
        self.acknowledged.inc();
    }

    /// The task declined a checkpoint.
    pub fn declined(&self) {
        self.declined.inc();
    }

    /// Shows the running time (busy, idle, back-pressured) of the task that owns `counters`.
    pub fn observe(&mut self, counters: &Arc<TaskCounters>) {
        self.unobserve();
        for time in [&self.busy, &self.idle, &self.back_pressured] {
            time.attach(counters);
        }
        self.observed = Some(counters.clone());
    }

    /// The observed task's figures stay in the counts as they are now.
    fn unobserve(&mut self) {
        if let Some(counters) = self.observed.take() {
            for time in [&self.busy, &self.idle, &self.back_pressured] {
                time.detach(&counters);
            }
        }
    }
}

impl Drop for TaskSeries {
    fn drop(&mut self) {
        self.unobserve();
        self.families.owners.release(&self.labels, || self.families.remove(&self.labels));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_process::metrics::{new_registry, render};

    fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
        let prefix = format!("{name}{{{labels}}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
    }

    #[test]
    fn acknowledgements_and_declines_render_per_subtask() {
        let mut registry = new_registry();
        let metrics = TaskMetrics::register(&mut registry);
        let a = metrics.task("demo", "counter", 1);
        let b = metrics.task("demo", "source", 0);
        a.acknowledged(
            7,
            &TaskCheckpointMetrics {
                start_delay_ms: 4,
                alignment_ms: 1500,
                sync_ms: 2,
                async_ms: 250,
                bytes_persisted: 1024,
                state_size: 4096,
                channel_state_bytes: 0,
            },
        );
        b.declined();
        let text = render(&registry).unwrap();
        let l = r#"job_id="demo",vertex="counter",subtask="1""#;
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_alignment_seconds", l), Some(1.5), "{text}");
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_start_delay_seconds", l), Some(0.004));
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_sync_seconds", l), Some(0.002));
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_async_seconds", l), Some(0.25));
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_persisted_bytes", l), Some(1024.0));
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_state_size_bytes", l), Some(4096.0));
        assert_eq!(sample(&text, "cairn_task_last_checkpoint_id", l), Some(7.0));
        assert_eq!(sample(&text, "cairn_task_checkpoints_acknowledged_total", l), Some(1.0));
        assert_eq!(sample(&text, "cairn_task_checkpoints_declined_total", l), Some(0.0));
        let s = r#"job_id="demo",vertex="source",subtask="0""#;
        assert_eq!(sample(&text, "cairn_task_checkpoints_declined_total", s), Some(1.0));
        assert!(text.contains("# TYPE cairn_task_checkpoints_acknowledged_total counter"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn running_time_renders_as_counters_that_continue_across_attempts() {
        let mut registry = new_registry();
        let metrics = TaskMetrics::register(&mut registry);
        let s = r#"job_id="demo",vertex="source",subtask="0""#;
        let old_counters = Arc::new(TaskCounters::default());
        let mut old = metrics.task("demo", "source", 0);
        old.observe(&old_counters);
        old_counters.start_running();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let text = render(&registry).unwrap();
        for (name, value) in [
            ("cairn_task_busy_seconds_total", 1.5),
            ("cairn_task_idle_seconds_total", 0.0),
            ("cairn_task_back_pressured_seconds_total", 0.0),
        ] {
            assert_eq!(sample(&text, name, s), Some(value), "{name}\n{text}");
            assert!(text.contains(&format!("# TYPE {name} counter")), "{text}");
        }

        // The old attempt ends; the new one's time adds to its.
        old_counters.stop_running();
        let new_counters = Arc::new(TaskCounters::default());
        let mut new = metrics.task("demo", "source", 0);
        new.observe(&new_counters);
        drop(old);
        new_counters.start_running();
        tokio::time::advance(Duration::from_millis(250)).await;
        let text = render(&registry).unwrap();
        assert_eq!(sample(&text, "cairn_task_busy_seconds_total", s), Some(1.75), "{text}");
        drop(new);
        let text = render(&registry).unwrap();
        assert!(!text.contains("job_id=\"demo\""), "series left after the last attempt:\n{text}");
    }

    #[test]
    fn series_stay_while_any_attempt_runs_and_go_with_the_last() {
        let mut registry = new_registry();
        let metrics = TaskMetrics::register(&mut registry);
        let old = metrics.task("demo", "source", 0);
        old.declined();
        // A restarted attempt starts before the old one is gone: the counts continue.
        let new = metrics.task("demo", "source", 0);
        drop(old);
        new.declined();
        let text = render(&registry).unwrap();
        let s = r#"job_id="demo",vertex="source",subtask="0""#;
        assert_eq!(sample(&text, "cairn_task_checkpoints_declined_total", s), Some(2.0), "{text}");
        drop(new);
        let text = render(&registry).unwrap();
        assert!(!text.contains("job_id=\"demo\""), "series left after the last attempt:\n{text}");
    }
}
