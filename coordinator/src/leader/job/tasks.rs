//! The job's subtasks as the driver sees them, and the mapping between the task runtime's
//! attempt ids (`job/vertex#subtask@attempt`) and the core's opaque [`TaskAttemptId`].
//!
//! The core id packs the deployment attempt (replicated, unique across leaders) in the high 32
//! bits and the subtask's index in the graph (sorted by vertex id, then subtask) in the low 32.

use cairn_protocol::graph::JobGraph;
use cairn_protocol::operators::OperatorCatalog;

use crate::checkpoint::{TaskAttemptId, TaskDescriptor, TaskSet};

/// One subtask of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphTask {
    pub vertex: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub max_parallelism: u32,
    pub is_source: bool,
    /// Vertices with an edge into this one.
    pub inputs: Vec<String>,
}

/// The subtasks of a validated graph, in a stable order.
#[derive(Debug, Clone, Default)]
pub struct GraphTasks {
    tasks: Vec<GraphTask>,
}

impl GraphTasks {
    pub fn new(graph: &JobGraph, catalog: &OperatorCatalog) -> Result<Self, String> {
        graph.validate(catalog).map_err(|e| e.to_string())?;
        let mut vertices: Vec<_> = graph.vertices.iter().collect();
        vertices.sort_by(|a, b| a.id.cmp(&b.id));
        let mut tasks = Vec::new();
        for v in vertices {
            let is_source = catalog
                .is_source_kind(&v.operator.kind)
                .ok_or_else(|| format!("vertex {}: unknown operator kind {:?}", v.id, v.operator.kind))?;
            let mut inputs: Vec<String> =
                graph.edges.iter().filter(|e| e.to == v.id).map(|e| e.from.clone()).collect();
            inputs.sort();
            inputs.dedup();
            for i in 0..v.parallelism {
                tasks.push(GraphTask {
                    vertex: v.id.clone(),
                    subtask: i,
                    parallelism: v.parallelism,
                    max_parallelism: v.max_parallelism,
                    is_source,
                    inputs: inputs.clone(),
                });
            }
        }
        Ok(Self { tasks })
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn index_of(&self, vertex: &str, subtask: u32) -> Option<usize> {
        self.tasks.iter().position(|t| t.vertex == vertex && t.subtask == subtask)
    }

    pub fn get(&self, index: usize) -> Option<&GraphTask> {
        self.tasks.get(index)
    }

    /// Subtasks per slot-sharing group: group `i` holds subtask `i` of every vertex with more
    /// than `i` subtasks (it runs on one worker).
    pub fn groups(&self) -> Vec<u32> {
        let mut groups = Vec::new();
        for t in &self.tasks {
            let g = t.subtask as usize;
            if groups.len() <= g {
                groups.resize(g + 1, 0);
            }
            groups[g] += 1;
        }
        groups
    }

    /// The slot-sharing group of the task at `index`.
    pub fn group_of(&self, index: usize) -> Option<usize> {
        self.tasks.get(index).map(|t| t.subtask as usize)
    }

    /// The core's task set for deployment `attempt`.
    pub fn task_set(&self, attempt: u32) -> Result<TaskSet, String> {
        let descriptors = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| TaskDescriptor {
                vertex: t.vertex.clone(),
                subtask: t.subtask,
                parallelism: t.parallelism,
                max_parallelism: t.max_parallelism,
                is_source: t.is_source,
                inputs: t.inputs.clone(),
                attempt: core_attempt(attempt, i),
            })
            .collect();
        TaskSet::new(descriptors).map_err(|e| e.to_string())
    }
}

pub fn core_attempt(attempt: u32, index: usize) -> TaskAttemptId {
    TaskAttemptId(((attempt as u64) << 32) | (index as u64 & 0xffff_ffff))
}

/// `(deployment attempt, subtask index)` of a core attempt id.
pub fn split_attempt(id: TaskAttemptId) -> (u32, usize) {
    ((id.0 >> 32) as u32, (id.0 & 0xffff_ffff) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_ids_round_trip() {
        let id = core_attempt(7, 12);
        assert_eq!(split_attempt(id), (7, 12));
        assert_ne!(core_attempt(7, 12), core_attempt(8, 12));
    }
}
