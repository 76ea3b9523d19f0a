//! Turning a leader's [`Deployment`] into a [`JobDeployment`] the runtime can start: decode the
//! graph, take each subtask's restore as the leader assigned it, and name the task attempts a
//! deployment covers (also when it cannot be decoded, so that a failure can be reported for each
//! of them).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use cairn_protocol::graph::{GraphError, JobGraph, MAX_MAX_PARALLELISM};
use cairn_protocol::messages::{Deployment, DeploymentPlacement, TaskAttemptId, TaskId};

use crate::network::ExchangeKey;
use crate::runtime::{DeployError, JobDeployment, Placement, RuntimeOptions};
use crate::state::storage::CheckpointStorage;

/// Why a deployment could not be started; reported to the leader as each task's failure cause.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("the deployment needs {needed} slots but only {free} of this worker's {slots} are free")]
    NoSlots { needed: usize, free: usize, slots: u32 },
    #[error("cannot start the job: {0}")]
    Deploy(#[from] DeployError),
    #[error("invalid placement: {0}")]
    Placement(String),
}

impl DeploymentError {
    /// The message with its whole source chain, as a task failure cause.
    pub fn cause(&self) -> String {
        let mut cause = self.to_string();
        let mut src = std::error::Error::source(self);
        while let Some(s) = src {
            let text = s.to_string();
            if !cause.contains(&text) {
                cause.push_str(": ");
                cause.push_str(&text);
            }
            src = s.source();
        }
        cause
    }
}

/// Decodes the deployment's graph.
pub fn decode_graph(d: &Deployment) -> Result<JobGraph, GraphError> {
    serde_json::from_value(d.graph.clone()).map_err(|e| GraphError::Decode(e.to_string()))
}

/// Every task attempt of the deployment: from the decoded graph, or, when the graph does not
/// decode, from whatever `vertices[].id` / `vertices[].parallelism` the JSON holds.
pub fn task_attempts(d: &Deployment, graph: Option<&JobGraph>) -> Vec<TaskAttemptId> {
    let vertices: Vec<(String, u32)> = match graph {
        Some(g) => {
            g.vertices.iter().map(|v| (v.id.clone(), v.parallelism.min(MAX_MAX_PARALLELISM))).collect()
        }
        None => d
            .graph
            .get("vertices")
            .and_then(|v| v.as_array())
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| {
                        let id = v.get("id")?.as_str()?.to_owned();
                        let p = u32::try_from(v.get("parallelism")?.as_u64()?).ok()?;
                        Some((id, p.min(MAX_REPORTED_PARALLELISM)))
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    vertices
        .into_iter()
        .flat_map(|(vertex, p)| {
            (0..p).map(move |subtask| TaskAttemptId {
                task: TaskId { job: d.job_id.clone(), vertex: vertex.clone(), subtask },
                attempt: d.attempt,
            })
        })
        .take(MAX_REPORTED_TASKS)
        .collect()
}

/// The task attempts of `d` that run on worker `me`: all of them without a placement.
pub fn local_attempts(d: &Deployment, graph: Option<&JobGraph>, me: &str) -> Vec<TaskAttemptId> {
    let all = task_attempts(d, graph);
    let Some(p) = &d.placement else { return all };
    let here: std::collections::BTreeSet<(&str, u32)> =
        p.subtasks.iter().filter(|s| s.worker == me).map(|s| (s.vertex.as_str(), s.subtask)).collect();
    all.into_iter().filter(|t| here.contains(&(t.task.vertex.as_str(), t.task.subtask))).collect()
}

/// Bound on resolving one peer's data exchange address.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime placement of a deployment's: every subtask of `graph` placed once, on a worker
/// with an address (resolved here), and the exchange key decoded.
pub async fn placement(p: &DeploymentPlacement, graph: &JobGraph) -> Result<Placement, DeploymentError> {
    let bad = |m: String| DeploymentError::Placement(m);
    let key =
        decode_key(&p.exchange_key).ok_or_else(|| bad("the exchange key must be 64 hex digits".into()))?;
    let mut subtasks = BTreeMap::new();
    for s in &p.subtasks {
        let known = graph.vertex(&s.vertex).is_some_and(|v| s.subtask < v.parallelism);
        if !known {
            return Err(bad(format!(
                "subtask {} of vertex {:?} is not in the job graph",
                s.subtask, s.vertex
            )));
        }
        if subtasks.insert((s.vertex.clone(), s.subtask), s.worker.clone()).is_some() {
            return Err(bad(format!("subtask {} of vertex {:?} is placed twice", s.subtask, s.vertex)));
        }
    }
    for v in &graph.vertices {
        if let Some(subtask) = (0..v.parallelism).find(|i| !subtasks.contains_key(&(v.id.clone(), *i))) {
            return Err(bad(format!("subtask {subtask} of vertex {:?} is placed on no worker", v.id)));
        }
    }
    let mut addresses = BTreeMap::new();
    for worker in subtasks.values() {
        if addresses.contains_key(worker) {
            continue;
        }
        let text = p
            .addresses
            .get(worker)
            .ok_or_else(|| bad(format!("no data exchange address for worker {worker:?}")))?;
        addresses.insert(worker.clone(), resolve(text).await.map_err(bad)?);
    }
    Ok(Placement { subtasks, addresses, key })
}

async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = addr.parse() {
        return Ok(a);
    }
    match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(addr)).await {
        Ok(Ok(mut found)) => found.next().ok_or_else(|| format!("{addr:?} resolves to no address")),
        Ok(Err(e)) => Err(format!("cannot resolve {addr:?}: {e}")),
        Err(_) => Err(format!("resolving {addr:?} took longer than {RESOLVE_TIMEOUT:?}")),
    }
}

fn decode_key(hex: &str) -> Option<ExchangeKey> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        key[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(ExchangeKey::from_bytes(key))
}

/// Bound on the subtasks a deployment may name (a graph this large is refused anyway; the bound
/// keeps a hostile one from exhausting memory while the refusal is reported).
pub const MAX_REPORTED_TASKS: usize = 65_536;

/// Bound on the subtasks named for an undecodable graph (it may say anything).
const MAX_REPORTED_PARALLELISM: u32 = 4096;

/// The runtime's deployment of `d`, with the restore the leader assigned.
pub fn job_deployment(d: &Deployment, graph: JobGraph, template: &RuntimeOptions) -> JobDeployment {
    JobDeployment {
        job_id: d.job_id.clone(),
        graph,
        attempt: d.attempt,
        storage: CheckpointStorage::new(&d.storage_root, &d.job_id),
        restore: d.restore.clone(),
        options: RuntimeOptions { incremental: d.incremental, ..template.clone() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::DemoJob;

    fn deployment(graph: serde_json::Value) -> Deployment {
        Deployment {
            job_id: "j".into(),
            attempt: 3,
            graph,
            storage_root: "/tmp/x".into(),
            restore: None,
            incremental: true,
            placement: None,
        }
    }

    #[test]
    fn task_attempts_come_from_the_graph() {
        let g = DemoJob {
            source: Default::default(),
            output_dir: "/tmp/o".into(),
            source_parallelism: 1,
            parallelism: 2,
            max_parallelism: 8,
        }
        .graph();
        let d = deployment(serde_json::to_value(&g).unwrap());
        let graph = decode_graph(&d).unwrap();
        let ids = task_attempts(&d, Some(&graph));
        assert_eq!(ids.len(), 5);
        assert!(ids.iter().all(|t| t.attempt == 3 && t.task.job == "j"));
        let jd = job_deployment(&d, graph, &RuntimeOptions::default());
        assert!(jd.options.incremental);
    }

    #[test]
    fn an_undecodable_graph_still_names_its_tasks() {
        let d = deployment(serde_json::json!({
            "vertices": [{ "id": "a", "parallelism": 2, "surprise": true }, { "id": "b" }]
        }));
        assert!(decode_graph(&d).is_err());
        let ids = task_attempts(&d, None);
        assert_eq!(ids.len(), 2);
        assert_eq!(ids[1].task.vertex, "a");
        assert!(task_attempts(&deployment(serde_json::json!(7)), None).is_empty());
    }
}
