//! The demo job end to end with a scripted coordinator: abrupt kills, restores (also with a
//! changed parallelism), and the exactly-once verifier.

mod common;

use std::path::Path;
use std::time::Duration;

use cairn_protocol::messages::TaskStatus;
use cairn_taskrt::checkpoint::pool::SnapshotPool;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source_offsets;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_taskrt::registry::OperatorRegistry;
use cairn_taskrt::runtime::{JobDeployment, LocalJob, RuntimeOptions};
use cairn_taskrt::state::storage::CheckpointStorage;
use cairn_taskrt::task::TaskOutcome;
use cairn_taskrt::testkit::{Event, ScriptedCoordinator};
use common::*;

fn deploy(
    job: &DemoJob,
    storage: &CheckpointStorage,
    coordinator: &ScriptedCoordinator,
    attempt: u32,
    incremental: bool,
) -> LocalJob {
    let graph = job.graph();
    let restore = coordinator.restore(&graph).transpose().expect("the latest checkpoint maps onto the graph");
    LocalJob::deploy(
        JobDeployment {
            job_id: "demo".into(),
            graph,
            attempt,
            storage: storage.clone(),
            restore,
            options: RuntimeOptions { incremental, ..RuntimeOptions::default() },
        },
        &OperatorRegistry::with_builtins(),
        SnapshotPool::new(4),
    )
    .expect("deploys")
}

/// Lists the sink's files with their first and last lines, for failure messages.
fn describe_output(output: &Path) -> String {
    let mut out = String::new();
    for d in ["pending", "committed"] {
        let mut files: Vec<_> = std::fs::read_dir(output.join(d))
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "{} lines={} first={:?} last={:?}\n",
                f.display(),
                lines.len(),
                lines.first(),
                lines.last()
            ));
        }
    }
    out
}

fn assert_partial_output_is_exactly_once(output: &Path, coordinator: &ScriptedCoordinator) {
    let verdict =
        verify_output(output, &Expectation { keys: None, records_per_key: None, counts: None }).unwrap();
    let events: Vec<String> = coordinator
        .events
        .iter()
        .filter(|e| !matches!(e, cairn_taskrt::testkit::Event::Acknowledged { .. }))
        .map(|e| format!("{e:?}"))
        .collect();
    assert!(verdict.is_exactly_once(), "{verdict}\n{}\n{}", describe_output(output), events.join("\n"));
}

async fn run_with_kills(incremental: bool) {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out");
    let storage = CheckpointStorage::new(dir.path().join("checkpoints"), "demo");
    let first = bounded_demo(&output, 2, 2);
    let mut coordinator = ScriptedCoordinator::new("demo", storage.clone(), &first.graph());
    coordinator.interval = Duration::from_millis(100);

    // Run 1: parallelism 2, killed abruptly after some checkpoints.
    let mut job = deploy(&first, &storage, &coordinator, 0, incremental);
    coordinator.drive_completions(&mut job, 3, WAIT).await.unwrap();
    job.kill();
    assert_partial_output_is_exactly_once(&output, &coordinator);

    // Run 2: restored, rescaled to 3, killed again.
    let second = bounded_demo(&output, 2, 3);
    coordinator.set_graph(&second.graph());
    let restored_from = coordinator.latest_completed().map(|m| m.checkpoint_id);
    let mut job = deploy(&second, &storage, &coordinator, 1, incremental);
    coordinator.drive_completions(&mut job, 3, WAIT).await.unwrap();
    assert!(coordinator.latest_completed().map(|m| m.checkpoint_id) > restored_from, "ids keep increasing");
    job.kill();
    assert_partial_output_is_exactly_once(&output, &coordinator);

    // Run 3: restored, rescaled to 1 (and the source to 1); the bounded source runs out, every
    // task waits for a checkpoint taken after its end of data, and finishes once it completed:
    // by then the sink committed everything. The coordinator triggers back to back, so a
    // checkpoint is in flight while the tasks finish (as a leader's timer can be), and a
    // checkpoint can complete after the final one.
    let third = bounded_demo(&output, 1, 1);
    coordinator.set_graph(&third.graph());
    coordinator.interval = Duration::from_millis(1);
    let mut job = deploy(&third, &storage, &coordinator, 2, incremental);
    let base = storage.job_dir().to_owned();
    let tasks = job.tasks().len();
    let from = coordinator.events.len();
    // Until the coordinator has every task's finished status (a task's own state turns
    // finished a moment before its report arrives).
    coordinator
        .drive_until(&mut job, Duration::from_secs(60), |c| {
            let finished = c.events[from..]
                .iter()
                .filter(|e| matches!(e, Event::Status { status: TaskStatus::Finished, .. }))
                .count();
            finished == tasks
        })
        .await
        .unwrap();
    let outcomes = job.join().await;
    assert!(outcomes.iter().all(|(_, o)| *o == TaskOutcome::Finished), "{outcomes:?}");
    // Every task finished after the completion of a checkpoint they all took part in: the final
    // one. (One triggered while they were finishing completes later, with their state empty.)
    let meta = &coordinator.final_checkpoint(from).unwrap().expect("a checkpoint of the last run completed");
    let events = &coordinator.events[from..];
    let completed_at = events.iter().position(|e| *e == Event::Completed(meta.checkpoint_id)).unwrap();
    let first_finished = events
        .iter()
        .position(|e| matches!(e, Event::Status { status: TaskStatus::Finished, .. }))
        .expect("finished statuses");
    assert!(completed_at < first_finished, "no task finished before the final checkpoint completed");
    // Committed when the tasks finished, with no wait: the final checkpoint's notification
    // committed it.
    let offsets = source_offsets(meta, &base, "source").unwrap();
    assert_eq!(offsets.len() as u64, DEMO_KEYS);
    assert!(offsets.values().all(|n| *n == DEMO_PER_KEY), "the final checkpoint holds the end: {offsets:?}");
    let verdict = verify_output(
        &output,
        &Expectation { keys: Some(DEMO_KEYS), records_per_key: Some(DEMO_PER_KEY), counts: Some(offsets) },
    )
    .unwrap();
    assert!(verdict.is_exactly_once(), "{verdict}\n{}", describe_output(&output));
    assert_eq!(verdict.records, DEMO_KEYS * DEMO_PER_KEY);
    // The keyed counts in the checkpoint agree with the source.
    let counts = keyed_counts(meta, &base, "count", "count");
    assert_eq!(counts.len() as u64, DEMO_KEYS);
    assert!(counts.values().all(|c| *c == DEMO_PER_KEY), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_job_survives_two_abrupt_kills_with_rescaling_exactly_once() {
    run_with_kills(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_job_survives_two_abrupt_kills_exactly_once_with_incremental_checkpoints() {
    run_with_kills(true).await;
}
