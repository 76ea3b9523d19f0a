//! The time figures the worker sends its leader every [`TIMES_INTERVAL`] while attached: for
//! every running task, its cumulative busy, idle and back-pressured time (see
//! [`crate::metrics::TaskTimes`]). The leader takes rates from two samples (Flink's
//! `backPressuredTimeMsPerSecond` and friends) for `cairnctl job describe`. They are transient:
//! not kept in the outbox, never resent; a sample that finds the stream full is skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use cairn_proto::v1::worker_message::Body;
use cairn_proto::v1::{TaskTime, TaskTimes, WorkerMessage};
use cairn_protocol::messages::{TaskAttemptId, TaskStatus};

use crate::runtime::LocalJob;

/// How often the figures go out.
pub(crate) const TIMES_INTERVAL: Duration = Duration::from_secs(2);

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The figures of the tasks of `local` whose latest status is running or finishing.
pub(crate) fn task_times(local: &LocalJob, statuses: &BTreeMap<TaskAttemptId, TaskStatus>) -> Vec<TaskTime> {
    local
        .tasks()
        .iter()
        .filter(|t| matches!(statuses.get(&t.id), Some(TaskStatus::Running | TaskStatus::Finishing)))
        .map(|t| {
            let times = t.monitor.counters.times();
            TaskTime {
                job_id: t.id.task.job.clone(),
                vertex: t.id.task.vertex.clone(),
                subtask: t.id.task.subtask,
                attempt: u64::from(t.id.attempt),
                busy_ms: ms(times.busy),
                idle_ms: ms(times.idle),
                back_pressured_ms: ms(times.back_pressured),
            }
        })
        .collect()
}

/// One message for every task in `tasks`; `None` when there is none.
pub(crate) fn message(tasks: Vec<TaskTime>) -> Option<WorkerMessage> {
    if tasks.is_empty() {
        return None;
    }
    Some(WorkerMessage { body: Some(Body::TaskTimes(TaskTimes { tasks })) })
}
