//! Prometheus metrics of Cairn's processes: the `/metrics` HTTP endpoint that both `cairn` and
//! `cairn-worker` serve, and the task-level checkpoint figures of a worker.
//!
//! | module | owns |
//! | --- | --- |
//! | [`http`] | [`serve`]: a small HTTP/1.1 server answering `GET /metrics` from a [`Registry`] |
//! | [`owners`] | [`SeriesOwners`]: series shared by several owners, removed when the last one goes |
//! | [`task`] | [`TaskMetrics`]: per-subtask checkpoint figures, recorded by the tasks themselves |
//!
//! Nothing here is global: a process builds one [`Registry`] ([`new_registry`]), registers its
//! metric families into it, hands the families (cheap handles over atomics) to whoever owns the
//! figures, and serves the registry. Tests in one process therefore stay independent.

pub mod http;
pub mod owners;
pub mod task;

pub use http::{CONTENT_TYPE, render, serve};
pub use owners::SeriesOwners;
pub use prometheus_client::registry::Registry;
pub use task::{TaskMetrics, TaskSeries};

/// Prefix of every metric Cairn exports (`cairn_...`).
pub const PREFIX: &str = "cairn";

/// An empty registry whose metrics are all named `cairn_<name>`.
pub fn new_registry() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// Milliseconds as the seconds Prometheus expects.
pub(crate) fn ms_to_seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}
