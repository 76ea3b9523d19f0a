//! The job graph: what a job runs and how its vertices are connected.
//!
//! This module owns the JSON shape of a job (the replicated job registry stores it as submitted)
//! and its validation, which both the coordinator (at submission) and the task runtime (at
//! deployment) run against the same [`OperatorCatalog`]. A [`JobGraph`] has vertices (a stable operator id, a name,
//! parallelism, max parallelism, the head operator's kind and config, optionally further operators
//! chained behind the head) and edges with a [`Partitioning`]. [`JobGraph::validate`] rejects
//! graphs the runtime cannot run, with one [`GraphError`] variant per reason.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::operators::OperatorCatalog;

/// Default number of key groups of a vertex when the graph does not say.
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// Upper bound on max parallelism (key groups are `u32`, but the key-group index of every
/// keyed-state handle must stay sane).
pub const MAX_MAX_PARALLELISM: u32 = 32_768;

fn default_max_parallelism() -> u32 {
    DEFAULT_MAX_PARALLELISM
}

/// An operator: its kind (described in the [`OperatorCatalog`]) and its kind-specific
/// configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorSpec {
    pub kind: String,
    #[serde(default)]
    pub config: serde_json::Value,
}

/// An operator chained behind a vertex's head operator (same task, called synchronously).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainedOperator {
    /// Stable operator id; state is matched by it on restore.
    pub id: String,
    #[serde(flatten)]
    pub operator: OperatorSpec,
}

/// One vertex of the job graph; it runs as `parallelism` subtasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vertex {
    /// Stable id of the vertex and of its head operator; state is matched by it on restore.
    pub id: String,
    pub name: String,
    pub parallelism: u32,
    /// Number of key groups; must not change across restores.
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: u32,
    pub operator: OperatorSpec,
    /// Operators after the head, in chain order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<ChainedOperator>,
}

impl Vertex {
    /// `(operator id, spec)` of every operator of the vertex, head first.
    pub fn operators(&self) -> impl Iterator<Item = (&str, &OperatorSpec)> {
        std::iter::once((self.id.as_str(), &self.operator))
            .chain(self.chain.iter().map(|c| (c.id.as_str(), &c.operator)))
    }
}

/// How records travel along an edge from upstream subtasks to downstream subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioning {
    /// Subtask `i` sends to subtask `i` (equal parallelism required).
    Forward,
    /// By key: key → key group → the downstream subtask owning that key group.
    Hash,
    /// Round-robin over all downstream subtasks.
    Rebalance,
    /// Every record to every downstream subtask.
    Broadcast,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub partitioning: Partitioning,
}

/// A job: vertices and the edges between them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobGraph {
    pub vertices: Vec<Vertex>,
    pub edges: Vec<Edge>,
}

/// Why a job graph was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("job graph cannot be decoded: {0}")]
    Decode(String),
    #[error("job graph has no vertices")]
    Empty,
    #[error("id {id:?} is used by more than one vertex or operator")]
    DuplicateId { id: String },
    #[error("id {id:?} is not a safe identifier (use 1-64 characters from [A-Za-z0-9_-])")]
    InvalidId { id: String },
    #[error("vertex {vertex:?} has parallelism 0")]
    ZeroParallelism { vertex: String },
    #[error(
        "vertex {vertex:?} has max parallelism {max_parallelism}; it must be in 1..={MAX_MAX_PARALLELISM}"
    )]
    InvalidMaxParallelism { vertex: String, max_parallelism: u32 },
    #[error("vertex {vertex:?} has parallelism {parallelism} above its max parallelism {max_parallelism}")]
    ParallelismAboveMax { vertex: String, parallelism: u32, max_parallelism: u32 },
    #[error("operator {operator:?} has unknown kind {kind:?}")]
    UnknownOperatorKind { operator: String, kind: String },
    #[error("operator {operator:?} of kind {kind:?} has an invalid config: {reason}")]
    InvalidOperatorConfig { operator: String, kind: String, reason: String },
    #[error("operator {operator:?} is a source and can only be the head of a vertex without inputs")]
    MisplacedSource { operator: String },
    #[error("vertex {vertex:?} has no inputs but its head operator is not a source")]
    MissingInput { vertex: String },
    #[error("edge {from:?} -> {to:?} refers to unknown vertex {missing:?}")]
    DanglingEdge { from: String, to: String, missing: String },
    #[error("edge {from:?} -> {to:?} appears more than once")]
    DuplicateEdge { from: String, to: String },
    #[error("forward edge {from:?} -> {to:?} connects parallelism {from_parallelism} to {to_parallelism}")]
    ForwardParallelismMismatch { from: String, to: String, from_parallelism: u32, to_parallelism: u32 },
    #[error("job graph has a cycle through vertex {vertex:?}")]
    Cycle { vertex: String },
}

/// A safe identifier: usable as a path component and in file names.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl JobGraph {
    /// Decodes a graph from JSON (unknown fields are rejected). Call [`JobGraph::validate`] next.
    pub fn from_json(json: &str) -> Result<Self, GraphError> {
        serde_json::from_str(json).map_err(|e| GraphError::Decode(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        // A JobGraph holds only strings, numbers and JSON values: encoding cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub fn vertex(&self, id: &str) -> Option<&Vertex> {
        self.vertices.iter().find(|v| v.id == id)
    }

    /// Edges into `vertex`, in graph order.
    pub fn inputs_of<'a>(&'a self, vertex: &'a str) -> impl Iterator<Item = &'a Edge> + 'a {
        self.edges.iter().filter(move |e| e.to == vertex)
    }

    /// Edges out of `vertex`, in graph order.
    pub fn outputs_of<'a>(&'a self, vertex: &'a str) -> impl Iterator<Item = &'a Edge> + 'a {
        self.edges.iter().filter(move |e| e.from == vertex)
    }

    /// Checks everything the runtime relies on. The first problem found is returned.
    pub fn validate(&self, kinds: &OperatorCatalog) -> Result<(), GraphError> {
        if self.vertices.is_empty() {
            return Err(GraphError::Empty);
        }
        let mut ids = BTreeSet::new();
        for v in &self.vertices {
            for (id, _) in v.operators() {
                if !is_valid_id(id) {
                    return Err(GraphError::InvalidId { id: id.to_owned() });
                }
                if !ids.insert(id) {
                    return Err(GraphError::DuplicateId { id: id.to_owned() });
                }
            }
            if v.parallelism == 0 {
                return Err(GraphError::ZeroParallelism { vertex: v.id.clone() });
            }
            if v.max_parallelism == 0 || v.max_parallelism > MAX_MAX_PARALLELISM {
                return Err(GraphError::InvalidMaxParallelism {
                    vertex: v.id.clone(),
                    max_parallelism: v.max_parallelism,
                });
            }
            if v.parallelism > v.max_parallelism {
                return Err(GraphError::ParallelismAboveMax {
                    vertex: v.id.clone(),
                    parallelism: v.parallelism,
                    max_parallelism: v.max_parallelism,
                });
            }
        }
        let by_id: BTreeMap<&str, &Vertex> = self.vertices.iter().map(|v| (v.id.as_str(), v)).collect();
        let mut seen_edges = BTreeSet::new();
        for e in &self.edges {
            for end in [&e.from, &e.to] {
                if !by_id.contains_key(end.as_str()) {
                    return Err(GraphError::DanglingEdge {
                        from: e.from.clone(),
                        to: e.to.clone(),
                        missing: end.clone(),
                    });
                }
            }
            if !seen_edges.insert((e.from.as_str(), e.to.as_str())) {
                return Err(GraphError::DuplicateEdge { from: e.from.clone(), to: e.to.clone() });
            }
            let (from, to) = (by_id[e.from.as_str()], by_id[e.to.as_str()]);
            if e.partitioning == Partitioning::Forward && from.parallelism != to.parallelism {
                return Err(GraphError::ForwardParallelismMismatch {
                    from: e.from.clone(),
                    to: e.to.clone(),
                    from_parallelism: from.parallelism,
                    to_parallelism: to.parallelism,
                });
            }
        }
        self.topological_order()?;
        for v in &self.vertices {
            let has_inputs = self.inputs_of(&v.id).next().is_some();
            for (position, (id, spec)) in v.operators().enumerate() {
                let is_source = kinds.is_source_kind(&spec.kind).ok_or_else(|| {
                    GraphError::UnknownOperatorKind { operator: id.to_owned(), kind: spec.kind.clone() }
                })?;
                kinds.check_config(&spec.kind, &spec.config).map_err(|reason| {
                    GraphError::InvalidOperatorConfig {
                        operator: id.to_owned(),
                        kind: spec.kind.clone(),
                        reason,
                    }
                })?;
                if is_source && (position > 0 || has_inputs) {
                    return Err(GraphError::MisplacedSource { operator: id.to_owned() });
                }
                if !is_source && position == 0 && !has_inputs {
                    return Err(GraphError::MissingInput { vertex: v.id.clone() });
                }
            }
        }
        Ok(())
    }

    /// Vertex ids in an order where every edge goes forward (Kahn's algorithm), or the cycle
    /// error naming a vertex on a cycle.
    pub fn topological_order(&self) -> Result<Vec<String>, GraphError> {
        let mut indegree: BTreeMap<&str, usize> = self.vertices.iter().map(|v| (v.id.as_str(), 0)).collect();
        for e in &self.edges {
            if let Some(d) = indegree.get_mut(e.to.as_str()) {
                *d += 1;
            }
        }
        let mut ready: VecDeque<&str> =
            self.vertices.iter().map(|v| v.id.as_str()).filter(|id| indegree[id] == 0).collect();
        let mut order = Vec::with_capacity(self.vertices.len());
        while let Some(id) = ready.pop_front() {
            order.push(id.to_owned());
            for e in self.outputs_of(id) {
                if let Some(d) = indegree.get_mut(e.to.as_str()) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push_back(e.to.as_str());
                    }
                }
            }
        }
        if order.len() < self.vertices.len() {
            let on_cycle = indegree.iter().find(|(_, d)| **d > 0).map(|(id, _)| (*id).to_owned());
            return Err(GraphError::Cycle { vertex: on_cycle.unwrap_or_default() });
        }
        Ok(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::operators::{KindRole, OperatorKind};

    fn kinds() -> OperatorCatalog {
        let mut c = OperatorCatalog::empty();
        c.add(OperatorKind { name: "src", role: KindRole::Source, doc: "", fields: vec![] });
        c.add(OperatorKind { name: "map", role: KindRole::Transform, doc: "", fields: vec![] });
        c
    }

    fn vertex(id: &str, kind: &str, p: u32) -> Vertex {
        Vertex {
            id: id.into(),
            name: id.into(),
            parallelism: p,
            max_parallelism: DEFAULT_MAX_PARALLELISM,
            operator: OperatorSpec { kind: kind.into(), config: serde_json::Value::Null },
            chain: vec![],
        }
    }

    fn edge(from: &str, to: &str, partitioning: Partitioning) -> Edge {
        Edge { from: from.into(), to: to.into(), partitioning }
    }

    fn graph() -> JobGraph {
        JobGraph {
            vertices: vec![vertex("a", "src", 2), vertex("b", "map", 2), vertex("c", "map", 3)],
            edges: vec![edge("a", "b", Partitioning::Forward), edge("b", "c", Partitioning::Hash)],
        }
    }

    #[test]
    fn valid_graph_passes_and_round_trips_through_json() {
        let g = graph();
        g.validate(&kinds()).unwrap();
        let back = JobGraph::from_json(&g.to_json()).unwrap();
        assert_eq!(back, g);
        assert_eq!(back.topological_order().unwrap(), vec!["a", "b", "c"]);
    }

    #[test]
    fn max_parallelism_defaults_to_128() {
        let g = JobGraph::from_json(
            r#"{"vertices":[{"id":"a","name":"A","parallelism":1,"operator":{"kind":"src"}}],"edges":[]}"#,
        )
        .unwrap();
        assert_eq!(g.vertices[0].max_parallelism, 128);
    }

    #[test]
    fn each_defect_has_its_own_error() {
        let mut g = graph();
        g.edges.push(edge("c", "b", Partitioning::Rebalance));
        assert!(matches!(g.validate(&kinds()), Err(GraphError::Cycle { .. })));

        let mut g = graph();
        g.vertices[1].parallelism = 200;
        g.vertices[0].parallelism = 200;
        assert!(matches!(g.validate(&kinds()), Err(GraphError::ParallelismAboveMax { .. })));

        let mut g = graph();
        g.vertices[2].parallelism = 0;
        assert!(matches!(g.validate(&kinds()), Err(GraphError::ZeroParallelism { .. })));

        let mut g = graph();
        g.vertices[2].operator.kind = "nope".into();
        assert!(matches!(g.validate(&kinds()), Err(GraphError::UnknownOperatorKind { .. })));

        let mut g = graph();
        g.vertices[1].parallelism = 1;
        assert!(matches!(g.validate(&kinds()), Err(GraphError::ForwardParallelismMismatch { .. })));

        let mut g = graph();
        g.edges.push(edge("b", "zz", Partitioning::Hash));
        assert!(matches!(g.validate(&kinds()), Err(GraphError::DanglingEdge { .. })));

        let mut g = graph();
        g.vertices[2].id = "a".into();
        assert!(matches!(g.validate(&kinds()), Err(GraphError::DuplicateId { .. })));

        let mut g = graph();
        g.vertices[2].operator.config = serde_json::json!({"bad": 1});
        assert!(matches!(g.validate(&kinds()), Err(GraphError::InvalidOperatorConfig { .. })));

        let mut g = graph();
        g.vertices[1].operator.kind = "src".into();
        assert!(matches!(g.validate(&kinds()), Err(GraphError::MisplacedSource { .. })));

        let mut g = graph();
        g.vertices[0].operator.kind = "map".into();
        assert!(matches!(g.validate(&kinds()), Err(GraphError::MissingInput { .. })));

        let mut g = graph();
        g.vertices[0].id = "../x".into();
        assert!(matches!(g.validate(&kinds()), Err(GraphError::InvalidId { .. })));

        assert!(matches!(
            JobGraph::from_json("{\"vertices\":[],\"edges\":[],\"x\":1}"),
            Err(GraphError::Decode(_))
        ));
    }
}
