//! Lifecycle order of operator calls in deployed jobs, cancellation, and stop-with-savepoint.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cairn_protocol::checkpoint::CheckpointKind;
use cairn_protocol::graph::{ChainedOperator, Edge, JobGraph, OperatorSpec, Partitioning, Vertex};
use cairn_protocol::messages::{CheckpointOptions, CoordinatorMessage, ToTask};
use cairn_protocol::operators::{ConfigField, FieldType, KindRole, OperatorKind};
use cairn_taskrt::checkpoint::pool::SnapshotPool;
use cairn_taskrt::lifecycle::TaskState;
use cairn_taskrt::operator::FnFactory;
use cairn_taskrt::registry::OperatorRegistry;
use cairn_taskrt::runtime::{JobDeployment, LocalJob, RuntimeOptions};
use cairn_taskrt::state::storage::CheckpointStorage;
use cairn_taskrt::task::TaskOutcome;
use cairn_taskrt::testkit::ScriptedCoordinator;
use common::*;

fn registry(log: &CallLog) -> OperatorRegistry {
    let mut r = OperatorRegistry::with_builtins();
    r.register(
        OperatorKind { name: "idle_source", role: KindRole::Source, doc: "emits nothing", fields: vec![] },
        Arc::new(FnFactory::new(|_, _| Ok(Box::new(IdleSource { stopped: false }) as _))),
    );
    let log = log.clone();
    let name = ConfigField {
        name: "name",
        ty: FieldType::Text,
        required: true,
        default: None,
        doc: "what the recorder logs its calls as",
    };
    r.register(
        OperatorKind {
            name: "recorder",
            role: KindRole::Transform,
            doc: "logs lifecycle calls",
            fields: vec![name],
        },
        Arc::new(FnFactory::new(move |config, _| {
            let name = config.get("name").and_then(|n| n.as_str()).ok_or("recorder needs a name")?.to_owned();
            Ok(Box::new(Recorder { name, log: log.clone() }) as _)
        })),
    );
    r
}

fn graph() -> JobGraph {
    let spec = |kind: &str, config: serde_json::Value| OperatorSpec { kind: kind.into(), config };
    JobGraph {
        vertices: vec![
            Vertex {
                id: "src".into(),
                name: "source".into(),
                parallelism: 1,
                max_parallelism: 16,
                operator: spec("idle_source", serde_json::Value::Null),
                chain: vec![],
            },
            Vertex {
                id: "head".into(),
                name: "chain".into(),
                parallelism: 1,
                max_parallelism: 16,
                operator: spec("recorder", serde_json::json!({"name": "head"})),
                chain: vec![ChainedOperator {
                    id: "tail".into(),
                    operator: spec("recorder", serde_json::json!({"name": "tail"})),
                }],
            },
        ],
        edges: vec![Edge { from: "src".into(), to: "head".into(), partitioning: Partitioning::Forward }],
    }
}

fn deploy(dir: &std::path::Path, log: &CallLog) -> (LocalJob, CheckpointStorage) {
    let storage = CheckpointStorage::new(dir, "life");
    let job = LocalJob::deploy(
        JobDeployment {
            job_id: "life".into(),
            graph: graph(),
            attempt: 0,
            storage: storage.clone(),
            restore: None,
            options: RuntimeOptions::default(),
        },
        &registry(log),
        SnapshotPool::new(2),
    )
    .unwrap();
    (job, storage)
}

#[tokio::test]
async fn operator_calls_follow_the_reference_lifecycle_order() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let log = CallLog::default();
    let (mut job, storage) = deploy(dir.path(), &log);
    let mut coordinator = ScriptedCoordinator::new("life", storage, &graph());
    coordinator.drive_completions(&mut job, 1, WAIT).await.unwrap();

    // Stop with a synchronous savepoint: the job finishes after it completes.
    coordinator.periodic = false;
    let sp = coordinator
        .trigger(
            &job,
            CheckpointOptions {
                kind: CheckpointKind::SyncSavepoint,
                drain: true,
                target_location: None,
                unaligned_after_ms: None,
            },
        )
        .await;
    let monitors: Vec<_> = job.tasks().iter().map(|t| t.monitor.clone()).collect();
    coordinator
        .drive_until(&mut job, WAIT, |_| monitors.iter().all(|m| m.current_state() == TaskState::Finished))
        .await
        .unwrap();
    let outcomes = job.join().await;
    assert!(outcomes.iter().all(|(_, o)| *o == TaskOutcome::Finished), "{outcomes:?}");

    let calls = log_entries(&log);
    let pos =
        |c: &str| calls.iter().position(|x| x == c).unwrap_or_else(|| panic!("{c} missing from {calls:?}"));
    // create → initialize (head to tail) → open (tail to head).
    assert!(pos("head:initialize(None)") < pos("tail:initialize(None)"));
    assert!(pos("tail:initialize(None)") < pos("tail:open"));
    assert!(pos("tail:open") < pos("head:open"), "open goes tail to head: {calls:?}");
    // checkpoint: prepare before snapshot, completion after the snapshot, on every operator.
    assert!(pos("head:prepare(1)") < pos("head:snapshot(1)"));
    assert!(pos("tail:snapshot(1)") < pos("head:complete(1)"));
    assert!(pos("head:complete(1)") < pos("tail:complete(1)"));
    // savepoint complete → end of input → close head to tail → dispose tail to head.
    assert!(pos(&format!("tail:complete({sp})")) < pos("head:end_input"));
    assert!(pos("head:end_input") < pos("head:close"));
    assert!(pos("head:close") < pos("tail:close"), "close goes head to tail: {calls:?}");
    assert!(pos("tail:close") < pos("tail:dispose"));
    assert!(pos("tail:dispose") < pos("head:dispose"), "dispose goes tail to head: {calls:?}");
    assert_eq!(calls.iter().filter(|c| c.ends_with(":dispose")).count(), 2, "dispose exactly once each");
}

#[tokio::test]
async fn cancellation_disposes_opened_operators_without_closing_them() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let log = CallLog::default();
    let (job, _storage) = deploy(dir.path(), &log);
    let monitors: Vec<_> = job.tasks().iter().map(|t| t.monitor.clone()).collect();
    wait_for("all tasks running", || monitors.iter().all(|m| m.current_state() == TaskState::Running)).await;
    job.link.broadcast(&CoordinatorMessage { term: 1, body: ToTask::Cancel }).await;
    let outcomes = tokio::time::timeout(Duration::from_secs(20), job.join()).await.unwrap();
    let head = outcomes.iter().find(|(id, _)| id.task.vertex == "head").unwrap();
    assert_eq!(head.1, TaskOutcome::Canceled);
    let calls = log_entries(&log);
    assert!(!calls.iter().any(|c| c.ends_with(":close")), "canceled tasks do not close: {calls:?}");
    let disposes: Vec<_> = calls.iter().filter(|c| c.ends_with(":dispose")).cloned().collect();
    assert_eq!(disposes, vec!["tail:dispose", "head:dispose"]);
    for m in &monitors {
        assert!(m.current_state().is_terminal());
    }
}
