//! Property: for random graphs, snapshots, parallelism changes and renames, every piece of state
//! lands exactly where the rules say (each key group and round-robin element on exactly one
//! subtask of its operator's new vertex, each union element on every one of them), or the
//! restore is refused naming the operator whose state cannot land.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::checkpoint::{KeyGroupSegment, OperatorListState, SubtaskState, VertexInfo};
use crate::graph::{ChainedOperator, OperatorSpec};

use super::*;

/// A small deterministic generator, so one `u64` seed describes a whole case.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn spec() -> OperatorSpec {
    OperatorSpec { kind: "k".into(), config: serde_json::Value::Null }
}

fn random_graph(g: &mut Gen) -> JobGraph {
    let vertices = (0..1 + g.below(3))
        .map(|i| {
            let max = 1 + g.below(16) as u32;
            let id = format!("v{i}");
            Vertex {
                id: id.clone(),
                name: id.clone(),
                parallelism: 1 + g.below(u64::from(max)) as u32,
                max_parallelism: max,
                operator: spec(),
                chain: (0..g.below(3))
                    .map(|j| ChainedOperator { id: format!("{id}-op{j}"), operator: spec() })
                    .collect(),
            }
        })
        .collect();
    JobGraph { vertices, edges: vec![] }
}

/// A snapshot of `graph`: per subtask and operator some keyed groups of its range, some
/// round-robin and union list elements.
fn random_snapshot(g: &mut Gen, graph: &JobGraph) -> CheckpointMetadata {
    let mut subtasks = BTreeMap::new();
    let mut vertices = BTreeMap::new();
    for v in &graph.vertices {
        vertices.insert(
            v.id.clone(),
            VertexInfo { parallelism: v.parallelism, max_parallelism: v.max_parallelism },
        );
        for i in 0..v.parallelism {
            let range = KeyGroupRange::for_subtask(v.max_parallelism, v.parallelism, i).unwrap();
            let mut st = SubtaskState::default();
            for (op, _) in v.operators() {
                let mut s = OperatorSubtaskState::default();
                // One file per subtask and operator, 4 bytes per key group written.
                let path = format!("chk-1/{op}-{i}.state");
                for kg in range.start..=range.end {
                    if g.chance(60) {
                        let offset = s.keyed.segment_bytes();
                        let segment = KeyGroupSegment { file: path.clone(), offset, length: 4, crc32: kg };
                        s.keyed.key_groups.insert(kg, segment);
                    }
                }
                if !s.keyed.key_groups.is_empty() {
                    s.keyed.files.push(StateFile { path, size: s.keyed.segment_bytes(), crc32: i });
                }
                for (name, mode) in [("rr", OperatorStateMode::RoundRobin), ("all", OperatorStateMode::Union)]
                {
                    if g.chance(50) {
                        let n = g.below(4);
                        let offsets: Vec<u64> = (0..n).map(|k| k * 3).collect();
                        let file =
                            StateFile { path: format!("chk-1/{op}-{i}-{name}"), size: n * 3, crc32: 0 };
                        s.list_states.push(OperatorListState { name: name.into(), mode, file, offsets });
                    }
                }
                if !s.is_empty() {
                    st.operators.insert(op.to_owned(), s);
                }
            }
            subtasks.insert(CheckpointMetadata::subtask_key(&v.id, i), st);
        }
    }
    CheckpointMetadata {
        version: 1,
        job: "j".into(),
        checkpoint_id: 7,
        kind: "checkpoint".into(),
        trigger_time_ms: 0,
        completion_time_ms: 0,
        vertices,
        subtasks,
        master_states: BTreeMap::new(),
    }
}

/// The next version of a job: parallelism changes, the odd max-parallelism change, renamed
/// vertices and operators, dropped chained operators.
fn evolve(g: &mut Gen, old: &JobGraph) -> JobGraph {
    let mut new = old.clone();
    for v in &mut new.vertices {
        if g.chance(10) {
            v.max_parallelism = 1 + g.below(16) as u32;
        }
        v.parallelism = 1 + g.below(u64::from(v.max_parallelism)) as u32;
        if g.chance(15) {
            v.id = format!("{}-renamed", v.id);
            v.name = v.id.clone();
        }
        for c in &mut v.chain {
            if g.chance(15) {
                c.id = format!("{}-renamed", c.id);
            }
        }
        if g.chance(10) {
            v.chain.pop();
        }
    }
    new
}

/// Where the state of one old operator is: keyed groups, round-robin and union elements.
#[derive(Default)]
struct OldState {
    keyed: BTreeMap<u32, KeyGroupSegment>,
    rr: Vec<(String, u64)>,
    union: Vec<(String, u64)>,
    /// List states registered (an empty one is state too: it must map somewhere).
    lists: usize,
    max_parallelism: u32,
}

fn old_state(meta: &CheckpointMetadata) -> BTreeMap<String, OldState> {
    let mut out: BTreeMap<String, OldState> = BTreeMap::new();
    for (key, st) in &meta.subtasks {
        let vertex = key.rsplit_once('/').map(|(v, _)| v).unwrap_or_default();
        for (op, s) in &st.operators {
            let e = out.entry(op.clone()).or_default();
            e.max_parallelism = meta.vertices[vertex].max_parallelism;
            e.keyed.extend(s.keyed.key_groups.iter().map(|(kg, seg)| (*kg, seg.clone())));
            e.lists += s.list_states.len();
            for l in &s.list_states {
                let elements = l.offsets.iter().map(|o| (l.file.path.clone(), *o));
                match l.mode {
                    OperatorStateMode::RoundRobin => e.rr.extend(elements),
                    OperatorStateMode::Union => e.union.extend(elements),
                }
            }
        }
    }
    out.retain(|_, s| !s.keyed.is_empty() || s.lists > 0);
    out
}

fn check(seed: u64, allow: bool) -> Result<(), TestCaseError> {
    let mut g = Gen(seed | 1);
    let old_graph = random_graph(&mut g);
    let meta = random_snapshot(&mut g, &old_graph);
    let new_graph = evolve(&mut g, &old_graph);
    let old = old_state(&meta);
    let vertex_of: BTreeMap<&str, &Vertex> =
        new_graph.vertices.iter().flat_map(|v| v.operators().map(move |(op, _)| (op, v))).collect();
    let unmapped: Vec<&String> = old.keys().filter(|op| !vertex_of.contains_key(op.as_str())).collect();
    let max_changed: Vec<&String> = old
        .iter()
        .filter(|(op, s)| {
            !s.keyed.is_empty()
                && vertex_of.get(op.as_str()).is_some_and(|v| v.max_parallelism != s.max_parallelism)
        })
        .map(|(op, _)| op)
        .collect();

    match assign_states(&meta, Path::new("/cp/j"), &new_graph, allow) {
        Err(AssignError::UnmappedState { operator, .. }) => {
            prop_assert!(!allow, "unmapped state refused although allowed: {operator}");
            prop_assert!(unmapped.contains(&&operator), "refused {operator}, which is mapped");
        }
        Err(AssignError::MaxParallelismChanged { vertex, .. }) => {
            prop_assert!(
                max_changed.iter().any(|op| vertex_of[op.as_str()].id == vertex),
                "max parallelism of {vertex} did not change for keyed state"
            );
        }
        Err(other) => prop_assert!(false, "unexpected refusal: {other}"),
        Ok(a) => {
            prop_assert!(allow || unmapped.is_empty(), "state of {unmapped:?} was silently dropped");
            prop_assert!(
                max_changed.is_empty(),
                "keyed state of {max_changed:?} crossed a max parallelism change"
            );
            // Every subtask of the new graph has exactly one entry.
            let expected: usize = new_graph.vertices.iter().map(|v| v.parallelism as usize).sum();
            prop_assert_eq!(a.subtasks.len(), expected);
            for (op, s) in &old {
                let Some(v) = vertex_of.get(op.as_str()) else {
                    // Skipped (allowed): it must land nowhere.
                    prop_assert!(a.subtasks.values().all(|t| !t.operators.contains_key(op)));
                    continue;
                };
                let mut keyed: BTreeMap<u32, usize> = BTreeMap::new();
                let mut rr: BTreeMap<(String, u64), usize> = BTreeMap::new();
                let mut union: BTreeMap<(String, u64), usize> = BTreeMap::new();
                for (key, t) in &a.subtasks {
                    let Some(r) = t.operators.get(op) else { continue };
                    prop_assert!(key.starts_with(&format!("{}/", v.id)), "{op} state landed on {key}");
                    prop_assert_eq!(r.keyed.validate(), Ok(()));
                    for (kg, segment) in &r.keyed.key_groups {
                        prop_assert!(t.key_groups.contains(*kg), "kg {kg} outside {key}'s range");
                        prop_assert_eq!(Some(segment), s.keyed.get(kg), "kg {} of {} moved bytes", kg, op);
                        *keyed.entry(*kg).or_default() += 1;
                    }
                    for l in &r.list_states {
                        let into = match l.mode {
                            OperatorStateMode::RoundRobin => &mut rr,
                            OperatorStateMode::Union => &mut union,
                        };
                        for p in &l.parts {
                            for e in &p.elements {
                                *into.entry((p.file.path.clone(), e.start)).or_default() += 1;
                            }
                        }
                    }
                }
                for kg in s.keyed.keys() {
                    prop_assert_eq!(keyed.get(kg).copied(), Some(1), "kg {} of {}", kg, op);
                }
                prop_assert_eq!(keyed.len(), s.keyed.len());
                for e in &s.rr {
                    prop_assert_eq!(rr.get(e).copied(), Some(1), "rr element {:?} of {}", e, op);
                }
                prop_assert_eq!(rr.len(), s.rr.len());
                for e in &s.union {
                    prop_assert_eq!(
                        union.get(e).copied(),
                        Some(v.parallelism as usize),
                        "union {:?} of {}",
                        e,
                        op
                    );
                }
                prop_assert_eq!(union.len(), s.union.len());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_state_lands_exactly_once_or_the_restore_is_refused(seed in any::<u64>(), allow in any::<bool>()) {
        check(seed, allow)?;
    }
}
