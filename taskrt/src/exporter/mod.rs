//! The task-level checkpoint figures a worker exports on its `/metrics` endpoint (served with
//! `cairn_process::metrics`, like the replicas').
//!
//! | module | owns |
//! | --- | --- |
//! | [`task`] | [`TaskMetrics`]: per-subtask checkpoint figures, recorded by the tasks themselves |

pub mod task;

pub use task::{TaskMetrics, TaskSeries};
