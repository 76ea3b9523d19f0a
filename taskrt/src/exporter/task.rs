//! Per-subtask checkpoint figures of a worker, labelled `job_id`, `vertex`, `subtask`.
//!
//! The worker registers one [`TaskMetrics`] and hands it to its job host (through
//! [`crate::runtime::RuntimeOptions::metrics`]); each deployed task gets a [`TaskSeries`] and
//! records into it where it builds its [`TaskCheckpointMetrics`]: when it acknowledges a
//! checkpoint and when it declines one. A task attempt's series outlive it only while another
//! attempt of the same subtask runs here (see [`SeriesOwners`]); when the last one ends, the
//! series are removed.

use std::sync::atomic::AtomicU64;

use cairn_protocol::checkpoint::TaskCheckpointMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use cairn_process::metrics::{SeriesOwners, ms_to_seconds};

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
    }
}

/// Where one task records its checkpoint figures (plain atomics: no lock on the task's path).
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
}

impl Drop for TaskSeries {
    fn drop(&mut self) {
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
