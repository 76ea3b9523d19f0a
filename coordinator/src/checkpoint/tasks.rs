//! The job's task set as the coordinator core sees it: one entry per subtask, with the
//! identity of its current execution attempt and whether it is running.
//!
//! The scheduler (or the task gateway) builds a [`TaskSet`] when it deploys the job and reports
//! status changes as events; the core uses it to decide whom to trigger (the running sources,
//! or once every source finished, the running tasks whose inputs all finished), whose
//! acknowledgements to wait for (every subtask that has not finished), and whom to notify.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use cairn_protocol::checkpoint::VertexInfo;
use cairn_protocol::graph::MAX_MAX_PARALLELISM;
use serde::{Deserialize, Serialize};

use super::error::Error;

/// Identity of one execution attempt of one subtask. A restarted subtask gets a new attempt id,
/// so messages from a previous attempt can be told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskAttemptId(pub u64);

impl fmt::Display for TaskAttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt-{}", self.0)
    }
}

/// One subtask of the job graph and its current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDescriptor {
    pub vertex: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub max_parallelism: u32,
    /// Sources receive the trigger; every other task learns of a checkpoint from barriers.
    pub is_source: bool,
    /// Vertices with an edge into this one (empty for a source).
    #[serde(default)]
    pub inputs: Vec<String>,
    pub attempt: TaskAttemptId,
}

impl TaskDescriptor {
    /// `"<vertex>/<index>"`, the key of this subtask's state in `_metadata`.
    pub fn key(&self) -> String {
        cairn_protocol::checkpoint::CheckpointMetadata::subtask_key(&self.vertex, self.subtask)
    }
}

/// What the scheduler reports about a task attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Running, or finishing (its input ended; it takes part in checkpoints until one taken
    /// after its end of data completed).
    Running,
    /// Deploying, canceling, canceled or otherwise not able to take part in a checkpoint.
    NotRunning,
    /// Done after its final checkpoint: it takes no part in later checkpoints, which record
    /// its state as empty (Flink's finished-task state: its final state is in the checkpoint
    /// that let it finish, and the output it made is committed).
    Finished,
    Failed,
}

/// The job's subtasks, validated: every vertex has one consistent parallelism and max
/// parallelism, every subtask index in `0..parallelism` exactly once, attempt ids are unique,
/// and at least one vertex is a source.
#[derive(Debug, Clone)]
pub struct TaskSet {
    /// Subtasks in a stable order (vertex id, then subtask index).
    tasks: Vec<(TaskDescriptor, TaskStatus)>,
    /// Position of each attempt in `tasks`, to answer per-message lookups in O(1).
    by_attempt: HashMap<TaskAttemptId, usize>,
}

impl TaskSet {
    /// Validates the descriptors; every task starts out running (the set describes a deployed
    /// job; status changes arrive as events).
    pub fn new(mut tasks: Vec<TaskDescriptor>) -> Result<Self, Error> {
        let bad = |msg: String| Err(Error::InvalidTaskSet(msg));
        if tasks.is_empty() {
            return bad("the job has no tasks".into());
        }
        tasks.sort_by(|a, b| (&a.vertex, a.subtask).cmp(&(&b.vertex, b.subtask)));
        let mut by_attempt = HashMap::with_capacity(tasks.len());
        let mut shapes: BTreeMap<&str, (u32, u32, bool, Vec<bool>)> = BTreeMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if t.vertex.is_empty() || t.vertex.contains('/') {
                return bad(format!("vertex id {:?} must be non-empty and contain no '/'", t.vertex));
            }
            if t.parallelism == 0
                || t.parallelism > t.max_parallelism
                || t.max_parallelism > MAX_MAX_PARALLELISM
            {
                return bad(format!(
                    "vertex {} has parallelism {} and max parallelism {}; need 1 <= parallelism <= max <= {MAX_MAX_PARALLELISM}",
                    t.vertex, t.parallelism, t.max_parallelism
                ));
            }
            if t.subtask >= t.parallelism {
                return bad(format!("subtask {} of vertex {} is out of range", t.subtask, t.vertex));
            }
            if by_attempt.insert(t.attempt, i).is_some() {
                return bad(format!("attempt {} appears twice", t.attempt));
            }
            let entry = shapes.entry(&t.vertex).or_insert_with(|| {
                (t.parallelism, t.max_parallelism, t.is_source, vec![false; t.parallelism as usize])
            });
            if (entry.0, entry.1, entry.2) != (t.parallelism, t.max_parallelism, t.is_source) {
                return bad(format!(
                    "subtasks of vertex {} disagree on parallelism or source flag",
                    t.vertex
                ));
            }
            let slot = &mut entry.3[t.subtask as usize];
            if *slot {
                return bad(format!("subtask {} of vertex {} appears twice", t.subtask, t.vertex));
            }
            *slot = true;
        }
        for (vertex, (_, _, _, seen)) in &shapes {
            if let Some(missing) = seen.iter().position(|s| !s) {
                return bad(format!("subtask {missing} of vertex {vertex} is missing"));
            }
        }
        if !shapes.values().any(|s| s.2) {
            return bad("no vertex is a source".into());
        }
        let tasks = tasks.into_iter().map(|t| (t, TaskStatus::Running)).collect();
        Ok(Self { tasks, by_attempt })
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn get(&self, attempt: TaskAttemptId) -> Option<&TaskDescriptor> {
        self.by_attempt.get(&attempt).and_then(|&i| self.tasks.get(i)).map(|(t, _)| t)
    }

    pub fn status(&self, attempt: TaskAttemptId) -> Option<TaskStatus> {
        self.by_attempt.get(&attempt).and_then(|&i| self.tasks.get(i)).map(|(_, s)| *s)
    }

    /// Records a status; returns `false` for an attempt that is not part of the set.
    pub fn set_status(&mut self, attempt: TaskAttemptId, status: TaskStatus) -> bool {
        match self.by_attempt.get(&attempt).and_then(|&i| self.tasks.get_mut(i)) {
            Some((_, s)) => {
                *s = status;
                true
            }
            None => false,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&TaskDescriptor, TaskStatus)> {
        self.tasks.iter().map(|(t, s)| (t, *s))
    }

    /// The first task that is neither running nor finished, if any: a checkpoint cannot be
    /// triggered then.
    pub fn first_not_running(&self) -> Option<&TaskDescriptor> {
        self.tasks
            .iter()
            .find(|(_, s)| !matches!(s, TaskStatus::Running | TaskStatus::Finished))
            .map(|(t, _)| t)
    }

    /// Why no checkpoint can be triggered now, if so: a task is neither running nor finished,
    /// or no task is left to take the trigger (every task finished, or the last ones are
    /// finishing after their final checkpoint).
    pub fn why_not_triggerable(&self) -> Option<String> {
        if let Some(task) = self.first_not_running() {
            return Some(format!("task {} is not running", task.key()));
        }
        self.trigger_attempts().is_empty().then(|| "no task is left to trigger".to_owned())
    }

    /// The attempts that receive a trigger: the running sources; once every source finished,
    /// the running tasks whose input vertices all finished (they take the trigger as a source
    /// does, as Flink triggers the first unfinished tasks).
    pub fn trigger_attempts(&self) -> Vec<TaskAttemptId> {
        let sources: Vec<TaskAttemptId> = self
            .tasks
            .iter()
            .filter(|(t, s)| t.is_source && *s == TaskStatus::Running)
            .map(|(t, _)| t.attempt)
            .collect();
        if !sources.is_empty() {
            return sources;
        }
        let mut unfinished = BTreeSet::new();
        for (t, s) in &self.tasks {
            if *s != TaskStatus::Finished {
                unfinished.insert(t.vertex.as_str());
            }
        }
        self.tasks
            .iter()
            .filter(|(t, s)| {
                *s == TaskStatus::Running
                    && !t.inputs.is_empty()
                    && t.inputs.iter().all(|v| !unfinished.contains(v.as_str()))
            })
            .map(|(t, _)| t.attempt)
            .collect()
    }

    /// Attempts of the tasks that finished.
    pub fn finished_attempts(&self) -> Vec<TaskAttemptId> {
        self.tasks.iter().filter(|(_, s)| *s == TaskStatus::Finished).map(|(t, _)| t.attempt).collect()
    }

    /// Attempts currently running (the ones that can be notified).
    pub fn running_attempts(&self) -> Vec<TaskAttemptId> {
        self.tasks.iter().filter(|(_, s)| *s == TaskStatus::Running).map(|(t, _)| t.attempt).collect()
    }

    /// Shape of every vertex, as `_metadata` records it.
    pub fn vertices(&self) -> BTreeMap<String, VertexInfo> {
        self.tasks
            .iter()
            .map(|(t, _)| {
                (
                    t.vertex.clone(),
                    VertexInfo { parallelism: t.parallelism, max_parallelism: t.max_parallelism },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(vertex: &str, subtask: u32, parallelism: u32, attempt: u64) -> TaskDescriptor {
        TaskDescriptor {
            vertex: vertex.into(),
            subtask,
            parallelism,
            max_parallelism: 8,
            is_source: vertex == "src",
            inputs: if vertex == "src" { Vec::new() } else { vec!["src".into()] },
            attempt: TaskAttemptId(attempt),
        }
    }

    #[test]
    fn task_set_rejects_inconsistent_shapes() {
        assert!(TaskSet::new(vec![task("src", 0, 1, 1), task("map", 0, 2, 2), task("map", 1, 2, 3)]).is_ok());
        let missing = TaskSet::new(vec![task("src", 0, 1, 1), task("map", 0, 2, 2)]).unwrap_err();
        assert!(missing.to_string().contains("missing"), "{missing}");
        let dup_attempt = TaskSet::new(vec![task("src", 0, 2, 1), task("src", 1, 2, 1)]).unwrap_err();
        assert!(dup_attempt.to_string().contains("twice"), "{dup_attempt}");
        assert!(TaskSet::new(vec![task("map", 0, 1, 1)]).is_err(), "no source");
        assert!(TaskSet::new(vec![]).is_err());
        assert!(TaskSet::new(vec![task("src", 0, 9, 1)]).is_err(), "parallelism above max");
    }
}
