//! Restoring keyed counts with a changed parallelism (2 → 3, then 3 → 1) gives the same counts.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use cairn_protocol::checkpoint::CheckpointMetadata;
use cairn_taskrt::checkpoint::pool::SnapshotPool;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::lifecycle::TaskState;
use cairn_taskrt::registry::OperatorRegistry;
use cairn_taskrt::runtime::{JobDeployment, LocalJob, RuntimeOptions};
use cairn_taskrt::state::storage::CheckpointStorage;
use cairn_taskrt::testkit::ScriptedCoordinator;
use common::*;

const KEYS: u64 = 40;
const PER_KEY: u64 = 25;

fn demo(output: &std::path::Path, p: u32) -> DemoJob {
    DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(PER_KEY),
            rate_per_sec: None,
            batch: 64,
            idle_after_limit: false,
        },
        output_dir: output.to_string_lossy().into_owned(),
        source_parallelism: p,
        parallelism: p,
        max_parallelism: 128,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_with_changed_parallelism_keeps_keyed_counts() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out");
    let storage = CheckpointStorage::new(dir.path().join("cp"), "rescale");
    let base = storage.job_dir().to_owned();

    let mut counts_per_run: Vec<BTreeMap<u64, u64>> = Vec::new();
    let mut coordinator: Option<ScriptedCoordinator> = None;
    // Each run restores from the checkpoint the previous run's tasks finished on.
    let mut final_of_run: Option<CheckpointMetadata> = None;
    for (attempt, p) in [2u32, 3, 1].into_iter().enumerate() {
        let job_shape = demo(&output, p);
        let c = coordinator
            .get_or_insert_with(|| ScriptedCoordinator::new("rescale", storage.clone(), &job_shape.graph()));
        c.set_graph(&job_shape.graph());
        let restore = final_of_run.as_ref().map(|m| c.assign(m, &job_shape.graph())).transpose().unwrap();
        let restored_id = restore.as_ref().map(|r| r.checkpoint_id);
        let mut job = LocalJob::deploy(
            JobDeployment {
                job_id: "rescale".into(),
                graph: job_shape.graph(),
                attempt: attempt as u32,
                storage: storage.clone(),
                restore,
                options: RuntimeOptions::default(),
            },
            &OperatorRegistry::with_builtins(),
            SnapshotPool::new(2),
        )
        .unwrap();
        // The bounded job runs to its end: every task finishes after the final checkpoint, which
        // holds the counts of every record. (Waiting instead for one checkpoint listing every
        // source offset at its end raced: a source subtask that finished after an earlier
        // checkpoint is recorded with empty state in later ones, its keys being done. For the same
        // reason the final checkpoint is not always the latest: one triggered while the tasks
        // were finishing can complete after it.)
        let from = c.events.len();
        let monitors: Vec<_> = job.tasks().iter().map(|t| t.monitor.clone()).collect();
        c.drive_until(&mut job, Duration::from_secs(30), |_| {
            monitors.iter().all(|m| m.current_state() == TaskState::Finished)
        })
        .await
        .unwrap();
        let meta = c.final_checkpoint(from).unwrap().expect("a checkpoint of this deployment completed");
        assert!(Some(meta.checkpoint_id) > restored_id, "ids keep increasing");
        assert_eq!(meta.vertices["count"].parallelism, p);
        counts_per_run.push(keyed_counts(&meta, &base, "count", "count"));
        final_of_run = Some(meta);
        job.kill();
    }
    let expected: BTreeMap<u64, u64> = (0..KEYS).map(|k| (k, PER_KEY)).collect();
    for (i, counts) in counts_per_run.iter().enumerate() {
        assert_eq!(counts, &expected, "run {i}");
    }
}
