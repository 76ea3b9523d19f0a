//! Savepoints through the Store API with a real (in-process) worker: a savepoint needs a
//! directory, a manual checkpoint completes, stop-with-savepoint finishes the job, and a new job
//! restored from that savepoint continues the counter above it and the output exactly once.

use std::time::Duration;

use cairn_proto::v1::{TriggerCheckpointRequest, TriggerKind};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_taskrt::worker::Worker;
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::{init_test_logging, wait};
use tonic::Code;

const T: Duration = Duration::from_secs(60);
const KEYS: u64 = 4;
const RECORDS_PER_KEY: u64 = 3000;

fn spec(output: &std::path::Path, restore_from: Option<&str>) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(RECORDS_PER_KEY),
            rate_per_sec: Some(1000),
            batch: 16,
            idle_after_limit: true,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    let mut spec = serde_json::json!({ "graph": graph, "checkpoint": { "interval": "200ms" } });
    if let Some(dir) = restore_from {
        spec["restore_from"] = serde_json::json!(dir);
    }
    spec.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_savepoint_then_restore_continues_exactly_once() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(T).await?;
    let worker = Worker::start(cluster.worker_config("w1"))?;
    let dir = tempfile::tempdir()?;
    let output = dir.path().join("out");
    let mut client = cluster.client()?;
    client.register_job("a", &spec(&output, None)).await?;
    wait::until("a completed checkpoint", T, || {
        let mut c = client.clone();
        async move { (c.get_job("a").await.ok()?.num_completed >= 1).then_some(()) }
    })
    .await?;

    // A savepoint with no directory, and none configured: a clear refusal.
    let req = |kind: TriggerKind, target_dir: &str| TriggerCheckpointRequest {
        job_id: "a".into(),
        kind: kind as i32,
        target_dir: target_dir.into(),
        drain: false,
    };
    let err = client.trigger_checkpoint(req(TriggerKind::Savepoint, "")).await.expect_err("no directory");
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("savepoint directory"), "{err}");
    let err =
        client.trigger_checkpoint(req(TriggerKind::Savepoint, "relative/dir")).await.expect_err("relative");
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");

    // A manual checkpoint completes and is in the store.
    let cp = client.trigger_checkpoint(req(TriggerKind::Checkpoint, "")).await?;
    assert_eq!(cp.kind, "checkpoint");
    assert!(client.get_job("a").await?.next_checkpoint_id > cp.checkpoint_id);

    // Stop with a savepoint: it completes, then the job finishes.
    let sp_root = dir.path().join("savepoints");
    let sp = client
        .trigger_checkpoint(req(TriggerKind::StopWithSavepoint, &sp_root.display().to_string()))
        .await?;
    assert_eq!(sp.kind, "sync_savepoint");
    assert!(std::path::Path::new(&sp.location).join("_metadata").exists(), "no _metadata in {}", sp.location);
    wait::until("job a to finish", T, || {
        let mut c = client.clone();
        async move { (c.get_job("a").await.ok()?.status == "finished").then_some(()) }
    })
    .await?;
    let a = client.get_job("a").await?;
    assert!(a.savepoint_ids.contains(&sp.checkpoint_id));
    // A finished job keeps no checkpoints (Flink's default retention): the store forgets them
    // first, then their files go; the savepoint stays.
    wait::until("job a's retained checkpoints to be discarded", T, || {
        let mut c = client.clone();
        async move { c.get_job("a").await.ok()?.completed_checkpoint_ids.is_empty().then_some(()) }
    })
    .await?;
    wait::until("the manual checkpoint's directory to be deleted", T, || {
        let gone = !std::path::Path::new(&cp.location).exists();
        async move { gone.then_some(()) }
    })
    .await?;
    assert!(std::path::Path::new(&sp.location).join("_metadata").exists(), "the savepoint must stay");

    // A new job restored from the savepoint: IDs continue above it, the output continues.
    client.register_job("b", &spec(&output, Some(&sp.location))).await?;
    let expect = Expectation { keys: Some(KEYS), records_per_key: Some(RECORDS_PER_KEY), counts: None };
    wait::until("job b to commit every record", T, || {
        let output = output.clone();
        let expect = expect.clone();
        async move {
            let v = verify_output(&output, &expect).ok()?;
            v.is_exactly_once().then_some(())
        }
    })
    .await?;
    let b = client.get_job("b").await?;
    assert!(
        b.completed_checkpoint_ids.iter().all(|id| *id > sp.checkpoint_id),
        "{:?}",
        b.completed_checkpoint_ids
    );
    worker.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}
