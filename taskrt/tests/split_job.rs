//! The demo job spread over two workers' data exchanges (real loopback TCP between them): the
//! hash exchange and the barriers cross the network, checkpoints complete, a restore moves
//! subtasks to the other worker, and the output is exactly once.

mod common;

use std::collections::BTreeMap;

use cairn_taskrt::checkpoint::pool::SnapshotPool;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source_offsets;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_taskrt::lifecycle::TaskState;
use cairn_taskrt::network::{ExchangeKey, ExchangeService, NetworkOptions};
use cairn_taskrt::registry::OperatorRegistry;
use cairn_taskrt::runtime::{DeployError, JobDeployment, LocalJob, Placement, RuntimeOptions};
use cairn_taskrt::state::storage::CheckpointStorage;
use cairn_taskrt::task::TaskOutcome;
use cairn_taskrt::testkit::ScriptedCoordinator;
use common::*;

/// Subtask `i` of every vertex on worker `workers[(i + shift) % 2]` (one subtask of each vertex
/// per slot, as slot sharing places them).
fn placement(job: &DemoJob, workers: [&ExchangeService; 2], shift: u32) -> Placement {
    let mut subtasks = BTreeMap::new();
    for v in &job.graph().vertices {
        for i in 0..v.parallelism {
            subtasks.insert((v.id.clone(), i), workers[((i + shift) % 2) as usize].worker_id().to_owned());
        }
    }
    let addresses = workers.iter().map(|w| (w.worker_id().to_owned(), w.local_addr())).collect();
    Placement { subtasks, addresses, key: ExchangeKey::generate() }
}

fn deployment(
    job: &DemoJob,
    storage: &CheckpointStorage,
    coordinator: &ScriptedCoordinator,
    attempt: u32,
) -> JobDeployment {
    let graph = job.graph();
    let restore = coordinator.restore(&graph).transpose().expect("the latest checkpoint maps onto the graph");
    JobDeployment {
        job_id: "demo".into(),
        graph,
        attempt,
        storage: storage.clone(),
        restore,
        options: RuntimeOptions::default(),
    }
}

/// Deploys the job's part on each worker and merges them, so the scripted coordinator drives the
/// whole job; data between the parts still crosses the workers' link.
fn deploy_split(d: JobDeployment, placement: &Placement, workers: [&ExchangeService; 2]) -> LocalJob {
    let registry = OperatorRegistry::with_builtins();
    let mut job =
        LocalJob::deploy_placed(d.clone(), &registry, SnapshotPool::new(2), placement, workers[0]).unwrap();
    let other = LocalJob::deploy_placed(d, &registry, SnapshotPool::new(2), placement, workers[1]).unwrap();
    assert_eq!(job.peer_links().len(), 1, "one link per peer worker");
    job.absorb(other);
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_spread_over_two_workers_checkpoints_restores_and_finishes_exactly_once() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out");
    let storage = CheckpointStorage::new(dir.path().join("checkpoints"), "demo");
    let local = "127.0.0.1:0".parse().unwrap();
    let a = ExchangeService::bind(local, "worker-a", NetworkOptions::default()).await.unwrap();
    let b = ExchangeService::bind(local, "worker-b", NetworkOptions::default()).await.unwrap();
    let job_shape = bounded_demo(&output, 2, 3);
    let mut coordinator = ScriptedCoordinator::new("demo", storage.clone(), &job_shape.graph());
    coordinator.interval = std::time::Duration::from_millis(100);

    // Run 1: spread over both workers, killed abruptly after three checkpoints.
    let first = placement(&job_shape, [&a, &b], 0);
    let mut job = deploy_split(deployment(&job_shape, &storage, &coordinator, 0), &first, [&a, &b]);
    assert_eq!(job.tasks().len(), 8, "2 sources + 3 counters + 3 sinks over both parts");
    coordinator.drive_completions(&mut job, 3, WAIT).await.unwrap();
    job.kill();
    let partial =
        verify_output(&output, &Expectation { keys: None, records_per_key: None, counts: None }).unwrap();
    assert!(partial.is_exactly_once(), "{partial}");

    // Run 2: restored with every subtask on the other worker, runs until the bounded source ends
    // and the final checkpoint committed everything.
    let second = placement(&job_shape, [&a, &b], 1);
    let mut job = deploy_split(deployment(&job_shape, &storage, &coordinator, 1), &second, [&a, &b]);
    let from = coordinator.events.len();
    let monitors: Vec<_> = job.tasks().iter().map(|t| t.monitor.clone()).collect();
    coordinator
        .drive_until(&mut job, std::time::Duration::from_secs(60), |_| {
            monitors.iter().all(|m| m.current_state() == TaskState::Finished)
        })
        .await
        .unwrap();
    let outcomes = job.join().await;
    assert!(outcomes.iter().all(|(_, o)| *o == TaskOutcome::Finished), "{outcomes:?}");
    // The offsets the final checkpoint (the one the tasks finished on) lists are at their end. It
    // lists only the source subtasks still running when it was taken: one that finished after an
    // earlier checkpoint is recorded empty (its keys are done), so the output is checked against
    // every key instead.
    let meta = coordinator.final_checkpoint(from).unwrap().expect("a checkpoint of the second run completed");
    let offsets = source_offsets(&meta, storage.job_dir(), "source").unwrap();
    assert!(offsets.values().all(|n| *n == DEMO_PER_KEY), "the final checkpoint holds the end: {offsets:?}");
    let verdict = verify_output(
        &output,
        &Expectation { keys: Some(DEMO_KEYS), records_per_key: Some(DEMO_PER_KEY), counts: None },
    )
    .unwrap();
    assert!(verdict.is_exactly_once(), "{verdict}");
    assert_eq!(verdict.records, DEMO_KEYS * DEMO_PER_KEY);
}

#[tokio::test]
async fn a_placement_that_misses_a_subtask_or_an_address_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path().join("checkpoints"), "demo");
    let a = ExchangeService::bind("127.0.0.1:0".parse().unwrap(), "worker-a", NetworkOptions::default())
        .await
        .unwrap();
    let b = ExchangeService::bind("127.0.0.1:0".parse().unwrap(), "worker-b", NetworkOptions::default())
        .await
        .unwrap();
    let job_shape = bounded_demo(&dir.path().join("out"), 2, 3);
    let coordinator = ScriptedCoordinator::new("demo", storage.clone(), &job_shape.graph());
    let registry = OperatorRegistry::with_builtins();

    let mut missing = placement(&job_shape, [&a, &b], 0);
    missing.subtasks.remove(&("count".to_owned(), 2));
    let d = deployment(&job_shape, &storage, &coordinator, 0);
    let err = LocalJob::deploy_placed(d.clone(), &registry, SnapshotPool::new(1), &missing, &a).unwrap_err();
    assert!(matches!(&err, DeployError::Unplaced { vertex, subtask: 2 } if vertex == "count"), "{err}");

    let mut no_address = placement(&job_shape, [&a, &b], 0);
    no_address.addresses.remove("worker-b");
    let err = LocalJob::deploy_placed(d, &registry, SnapshotPool::new(1), &no_address, &a).unwrap_err();
    assert!(matches!(&err, DeployError::NoAddress(w) if w == "worker-b"), "{err}");
}
