//! The task-level figures a worker exports on its `/metrics` endpoint (served with
//! `cairn_process::metrics`, like the replicas').
//!
//! | module | owns |
//! | --- | --- |
//! | [`task`] | [`TaskMetrics`]: per-subtask checkpoint figures, recorded by the tasks themselves, and busy, idle and back-pressured time, read from their counters |

pub mod task;

pub use task::{TaskMetrics, TaskSeries};
