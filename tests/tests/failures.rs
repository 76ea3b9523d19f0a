//! Failures that are not a leader change, through the real binaries (`cairn`, `cairn-worker`,
//! `cairnctl`) with the defaults users get: a failed checkpoint costs checkpoints, never the job
//! or its state.
//!
//! - Checkpoints that expire (a timeout far too short, as a slow disk gives) cross the default
//!   tolerance of 0: the job fails *over* through its default restart strategy and runs again from
//!   its latest checkpoint; the retained checkpoints stay on disk; the failures are counted; the
//!   output is exactly once.
//! - A `fixed-delay` job that uses up its restarts ends `failed` with its latest checkpoint kept,
//!   and a new job restores from that retained checkpoint.
//! - A leader killed while a job waits out its restart backoff: the next leader continues the
//!   same backoff instead of redeploying at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::ctl::{Ctl, completed, demo_graph, exactly_once, job_status, stop, str_at, u64_at};
use cairn_tests::procs::{ProcCluster, failover_args};
use cairn_tests::{init_test_logging, wait};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// Starts three replicas (fast failover settings, as the other process tests) and a worker,
/// runs `body`, and prints the logs when it fails.
async fn with_cluster<F, Fut>(body: F) -> anyhow::Result<()>
where
    F: FnOnce(ProcCluster) -> Fut,
    Fut: std::future::Future<Output = (ProcCluster, anyhow::Result<()>)>,
{
    init_test_logging();
    let args = failover_args("5s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(3, &refs)?;
    cluster.launch_worker("w1", 16)?;
    let (cluster, result) = body(cluster).await;
    if result.is_err() {
        eprintln!("{}", cluster.logs(120));
        for name in cluster.workers.keys() {
            eprintln!("--- worker {name} ---\n{}", cluster.worker_log_text(name));
        }
    }
    result
}

/// Submits `graph` as `job` with a 200 ms interval, `retained` checkpoints and extra flags.
async fn submit(
    ctl: &Ctl,
    cluster: &ProcCluster,
    job: &str,
    graph: &DemoJob,
    extra: &[&str],
) -> anyhow::Result<()> {
    let graph_file = cluster.scratch("input")?.join(format!("{job}.json"));
    std::fs::write(&graph_file, graph.graph().to_json())?;
    let graph_path = graph_file.display().to_string();
    let mut args = vec!["job", "submit", job, "--graph", &graph_path, "--interval", "200ms"];
    args.extend(extra);
    let out = ctl.ok(&args).await?;
    anyhow::ensure!(out.contains(&format!("job {job} submitted")), "{out}");
    Ok(())
}

async fn describe(ctl: &Ctl, job: &str) -> anyhow::Result<Value> {
    ctl.json(&["job", "describe", job]).await
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The `chk-<id>` directories of the retained checkpoints of `job`.
fn retained_dirs(cluster: &ProcCluster, job: &str, overview: &Value) -> Vec<PathBuf> {
    overview["retained_checkpoint_ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(Value::as_u64)
                .map(|id| cluster.checkpoint_dir().join(job).join(format!("chk-{id}")))
                .collect()
        })
        .unwrap_or_default()
}

fn has_metadata(dir: &Path) -> bool {
    dir.join("_metadata").is_file()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_checkpoints_fail_the_job_over_and_it_runs_again_from_its_latest_checkpoint()
-> anyhow::Result<()> {
    with_cluster(|cluster| async move {
        let r = expiry(&cluster).await;
        (cluster, r)
    })
    .await
}

async fn expiry(cluster: &ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let output = cluster.scratch("out")?;
    // The shape: 10,000 keys, so a checkpoint's asynchronous part writes many files.
    let graph = DemoJob {
        source: SourceConfig {
            keys: 10_000,
            records_per_key: None,
            rate_per_sec: Some(2000),
            batch: 64,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 128,
    };
    submit(&ctl, cluster, "tol", &graph, &["--retained", "2"]).await?;
    let before = completed(&ctl, "tol", 3, T).await?;
    let latest_before = u64_at(&before, &["latest_completed", "id"]);

    // Far too short a timeout: checkpoints expire; the default tolerance (0) fails the job over.
    // A checkpoint of this job can complete within 30 ms on an idle machine, so the worker is
    // also paused (SIGSTOP) until one has expired: no acknowledgement can arrive in time, however
    // fast the machine. Resumed at once, well inside its heartbeat timeout.
    ctl.ok(&["job", "config", "tol", "--checkpoint-timeout", "30ms"]).await?;
    let worker = cluster.workers.get("w1").ok_or_else(|| anyhow::anyhow!("no worker process"))?;
    worker.pause()?;
    let expired = wait::until("a checkpoint to expire while the worker is paused", T, || async {
        let v = ctl.json(&["checkpoint", "list", "tol"]).await.ok()?;
        (u64_at(&v, &["counts", "failed"]) >= 1).then_some(())
    })
    .await;
    worker.resume()?;
    expired?;
    let failed_over = wait::until("the job to fail over for its expired checkpoints", T, || async {
        let d = describe(&ctl, "tol").await.ok()?;
        let cause = str_at(&d, &["restart", "last_failure_cause"]).to_owned();
        (u64_at(&d, &["restart", "failures"]) >= 1 && cause.contains("tolerable failure threshold"))
            .then_some(d)
    })
    .await?;
    assert_ne!(str_at(&failed_over, &["summary", "status"]), "failed", "{failed_over}");
    assert!(
        str_at(&failed_over, &["restart", "strategy_json"]).contains("exponential-delay"),
        "{failed_over}"
    );
    // Nothing retained was deleted, and the failures are counted.
    let overview = ctl.json(&["checkpoint", "list", "tol"]).await?;
    let dirs = retained_dirs(cluster, "tol", &overview);
    assert!(
        !dirs.is_empty() && dirs.iter().all(|d| has_metadata(d)),
        "retained checkpoints gone: {overview}"
    );
    assert!(u64_at(&overview, &["counts", "failed"]) >= 1, "{overview}");
    assert_eq!(str_at(&overview, &["latest_failed", "failure_reason"]), "CheckpointExpired", "{overview}");

    // A sane timeout again: the job runs from its latest checkpoint and checkpoints again.
    ctl.ok(&["job", "config", "tol", "--checkpoint-timeout", "10m"]).await?;
    let after = wait::until("the job to run again and complete checkpoints", T, || async {
        let v = ctl.json(&["checkpoint", "list", "tol"]).await.ok()?;
        let status = job_status(&ctl, "tol").await.ok()?;
        let restored = u64_at(&v, &["latest_restored", "id"]);
        (status == "running"
            && restored >= latest_before
            && u64_at(&v, &["latest_completed", "id"]) > restored)
            .then_some(v)
    })
    .await?;
    assert!(u64_at(&after, &["latest_completed", "id"]) > latest_before, "{after}");

    // Exactly once across the failover.
    let (_, savepoint) = stop(&ctl, "tol", &cluster.scratch("stops")?).await?;
    let offsets = cairn_tests::ctl::savepoint_offsets(&savepoint)?;
    exactly_once(&output, &offsets, T).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_out_of_restarts_fails_keeping_its_checkpoints_and_a_new_job_restores_one() -> anyhow::Result<()>
{
    with_cluster(out_of_restarts).await
}

async fn out_of_restarts(mut cluster: ProcCluster) -> (ProcCluster, anyhow::Result<()>) {
    let r = out_of_restarts_body(&mut cluster).await;
    (cluster, r)
}

async fn out_of_restarts_body(cluster: &mut ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let output = cluster.scratch("out")?;
    let restart =
        ["--restart-strategy", "fixed-delay", "--restart-attempts", "1", "--restart-delay", "200ms"];
    let mut flags = vec!["--retained", "2"];
    flags.extend(restart);
    submit(&ctl, cluster, "fx", &demo_graph(&output), &flags).await?;
    completed(&ctl, "fx", 2, T).await?;

    // Failure 1: the worker dies. The one restart allowed is granted; it runs on a new worker.
    kill_worker(cluster, "w1")?;
    wait::until("the first failure to be recorded", T, || async {
        let d = describe(&ctl, "fx").await.ok()?;
        (u64_at(&d, &["restart", "restarts"]) == 1).then_some(())
    })
    .await?;
    cluster.launch_worker("w2", 16)?;
    let running = completed(&ctl, "fx", 2, T).await?;
    let before_second = u64_at(&running, &["counts", "completed"]);
    completed(&ctl, "fx", before_second + 1, T).await?;

    // Failure 2: no restart left: `failed`, with the strategy's reason; checkpoints kept.
    kill_worker(cluster, "w2")?;
    let failed = wait::until("the job to fail for good", T, || async {
        let d = describe(&ctl, "fx").await.ok()?;
        (str_at(&d, &["summary", "status"]) == "failed").then_some(d)
    })
    .await?;
    assert!(str_at(&failed, &["summary", "status_reason"]).contains("fixed-delay"), "{failed}");
    let overview = ctl.json(&["checkpoint", "list", "fx"]).await?;
    let dirs = retained_dirs(cluster, "fx", &overview);
    anyhow::ensure!(!dirs.is_empty(), "a failed job lost its retained checkpoints: {overview}");
    for d in &dirs {
        anyhow::ensure!(has_metadata(d), "retained checkpoint {} was deleted", d.display());
    }

    // A new job restores from the failed job's latest retained checkpoint, into the same output.
    let latest = dirs.last().cloned().unwrap_or_default();
    let latest_id = u64_at(&overview, &["latest_completed", "id"]);
    cluster.launch_worker("w3", 16)?;
    let from = latest.display().to_string();
    submit(&ctl, cluster, "fx2", &demo_graph(&output), &["--from-savepoint", &from]).await?;
    wait::until("the new job to restore the retained checkpoint and checkpoint twice", T, || async {
        let v = completed(&ctl, "fx2", 2, T).await.ok()?;
        (u64_at(&v, &["latest_restored", "id"]) == latest_id).then_some(v)
    })
    .await?;
    anyhow::ensure!(has_metadata(&latest), "no_claim restore deleted the source {}", latest.display());
    let (_, savepoint) = stop(&ctl, "fx2", &cluster.scratch("stops")?).await?;
    let offsets = cairn_tests::ctl::savepoint_offsets(&savepoint)?;
    exactly_once(&output, &offsets, T).await
}

fn kill_worker(cluster: &mut ProcCluster, name: &str) -> anyhow::Result<()> {
    cluster.workers.get_mut(name).ok_or_else(|| anyhow::anyhow!("no worker {name}"))?.kill9()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_during_a_restart_backoff_leaves_the_next_leader_to_continue_it() -> anyhow::Result<()>
{
    with_cluster(|mut cluster| async move {
        let r = backoff(&mut cluster).await;
        (cluster, r)
    })
    .await
}

async fn backoff(cluster: &mut ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let output = cluster.scratch("out")?;
    let restart = ["--restart-strategy", "fixed-delay", "--restart-attempts", "3", "--restart-delay", "12s"];
    submit(&ctl, cluster, "bk", &demo_graph(&output), &restart).await?;
    completed(&ctl, "bk", 1, T).await?;

    // The worker dies; a new one is available at once, so only the backoff holds the restart.
    kill_worker(cluster, "w1")?;
    cluster.launch_worker("w2", 16)?;
    let waiting = wait::until("the failure to be recorded with a backoff", T, || async {
        let d = describe(&ctl, "bk").await.ok()?;
        let next = d["restart"]["next_restart_time_ms"].as_u64()?;
        (str_at(&d, &["summary", "status"]) == "restarting").then_some((d, next))
    })
    .await?;
    let (d, next_restart_ms) = waiting;
    let attempts = u64_at(&d, &["summary", "attempts"]);
    anyhow::ensure!(next_restart_ms > now_ms() + 3_000, "too little backoff left to test: {d}");

    // Kill the leader during the backoff.
    let status = ctl.json(&["cluster", "status", "--timeout", "30s"]).await?;
    let leader = u64_at(&status, &["leader_id"]);
    cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader {leader}"))?.kill9()?;
    let survivors: Vec<String> =
        cluster.nodes.values().filter(|n| n.id != leader).map(|n| n.addr.clone()).collect();
    let ctl = Ctl { endpoints: survivors.join(","), ..ctl };

    // Until the backoff is over, nobody deploys the job again.
    while now_ms() + 1_000 < next_restart_ms {
        if let Ok(d) = describe(&ctl, "bk").await {
            let now = u64_at(&d, &["summary", "attempts"]);
            anyhow::ensure!(
                now == attempts,
                "the job was redeployed {} ms before its backoff ended: {d}",
                next_restart_ms.saturating_sub(now_ms())
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Then it runs again and checkpoints.
    wait::until("the job to be redeployed after its backoff and checkpoint", T, || async {
        let d = describe(&ctl, "bk").await.ok()?;
        let v = ctl.json(&["checkpoint", "list", "bk"]).await.ok()?;
        (u64_at(&d, &["summary", "attempts"]) > attempts
            && str_at(&d, &["summary", "status"]) == "running"
            && u64_at(&v, &["latest_completed", "id"]) > u64_at(&v, &["latest_restored", "id"]))
        .then_some(())
    })
    .await?;
    cluster.launch(leader)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_mode_takes_over_the_retained_checkpoint_of_an_ended_job() -> anyhow::Result<()> {
    with_cluster(|cluster| async move {
        let r = claim(&cluster).await;
        (cluster, r)
    })
    .await
}

async fn claim(cluster: &ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let output = cluster.scratch("out")?;
    submit(&ctl, cluster, "a", &demo_graph(&output), &["--externalized-retention", "retain_on_cancellation"])
        .await?;
    completed(&ctl, "a", 2, T).await?;
    // No further checkpoints: the latest stays retained while `a` runs.
    ctl.ok(&["job", "config", "a", "--interval", "off"]).await?;
    let overview = wait::until("a checkpoint still in flight to finish", T, || async {
        let v = ctl.json(&["checkpoint", "list", "a"]).await.ok()?;
        (u64_at(&v, &["counts", "in_progress"]) == 0).then_some(v)
    })
    .await?;
    let latest = u64_at(&overview, &["latest_completed", "id"]);
    let source = cluster.checkpoint_dir().join("a").join(format!("chk-{latest}"));
    let from = source.display().to_string();

    // Claiming a checkpoint a running job retains is refused, and changes nothing.
    let claim_flags = ["--from-savepoint", from.as_str(), "--restore-mode", "claim"];
    let graph_file = cluster.scratch("input")?.join("b.json");
    std::fs::write(&graph_file, demo_graph(&output).graph().to_json())?;
    let graph = graph_file.display().to_string();
    let mut args = vec!["job", "submit", "b", "--graph", &graph, "--interval", "200ms"];
    args.extend(claim_flags);
    let err = ctl.fails(5, &args).await?;
    assert!(err.contains("still live"), "{err}");
    assert!(
        !ctl.json(&["job", "list"]).await?.to_string().contains("\"b\""),
        "a refused submit registered b"
    );

    // Once `a` ended (its checkpoints retained on cancellation), `b` takes it over: after b's
    // first checkpoint the source is gone from the store and from disk.
    ctl.ok(&["job", "cancel", "a"]).await?;
    let mut latest_a = latest;
    let ended = ctl.json(&["checkpoint", "list", "a"]).await?;
    if let Some(ids) = ended["retained_checkpoint_ids"].as_array() {
        latest_a = ids.iter().filter_map(Value::as_u64).max().unwrap_or(latest);
    }
    let source = cluster.checkpoint_dir().join("a").join(format!("chk-{latest_a}"));
    let from = source.display().to_string();
    anyhow::ensure!(has_metadata(&source), "a canceled job with retain_on_cancellation lost {from}");
    submit(&ctl, cluster, "b", &demo_graph(&output), &["--from-savepoint", &from, "--restore-mode", "claim"])
        .await?;
    completed(&ctl, "b", 1, T).await?;
    wait::until("the claimed checkpoint to be taken over", T, || async {
        let a = ctl.json(&["checkpoint", "list", "a"]).await.ok()?;
        let listed = a["retained_checkpoint_ids"]
            .as_array()
            .is_some_and(|ids| ids.iter().any(|id| id.as_u64() == Some(latest_a)));
        (!listed && !source.exists()).then_some(())
    })
    .await?;
    let details = describe(&ctl, "b").await?;
    assert_eq!(str_at(&details, &["restore_mode"]), "claim", "{details}");
    let (_, savepoint) = stop(&ctl, "b", &cluster.scratch("stops")?).await?;
    let offsets = cairn_tests::ctl::savepoint_offsets(&savepoint)?;
    exactly_once(&output, &offsets, T).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_source_that_disappears_fails_the_job_through_its_strategy_naming_it() -> anyhow::Result<()>
{
    with_cluster(|mut cluster| async move {
        let r = vanished_source(&mut cluster).await;
        (cluster, r)
    })
    .await
}

async fn vanished_source(cluster: &mut ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let output = cluster.scratch("out")?;
    submit(&ctl, cluster, "src", &demo_graph(&output), &[]).await?;
    completed(&ctl, "src", 1, T).await?;
    let (_, savepoint) = stop(&ctl, "src", &cluster.scratch("savepoints")?).await?;

    // A job restored from the savepoint, without periodic checkpoints of its own: a restart
    // restores from the savepoint again.
    let graph_file = cluster.scratch("input")?.join("dst.json");
    std::fs::write(&graph_file, demo_graph(&output).graph().to_json())?;
    let graph = graph_file.display().to_string();
    let from = savepoint.display().to_string();
    let args = [
        "job",
        "submit",
        "dst",
        "--graph",
        &graph,
        "--from-savepoint",
        &from,
        "--restart-strategy",
        "fixed-delay",
        "--restart-attempts",
        "2",
        "--restart-delay",
        "200ms",
    ];
    ctl.ok(&args).await?;
    wait::until("the restored job to run", T, || async {
        (job_status(&ctl, "dst").await.ok()? == "running").then_some(())
    })
    .await?;

    // The savepoint disappears, then the worker dies: every restart finds its source gone.
    std::fs::remove_dir_all(&savepoint)?;
    kill_worker(cluster, "w1")?;
    cluster.launch_worker("w2", 16)?;
    let failed = wait::until("the job to fail for good", T, || async {
        let d = describe(&ctl, "dst").await.ok()?;
        (str_at(&d, &["summary", "status"]) == "failed").then_some(d)
    })
    .await?;
    let reason = str_at(&failed, &["summary", "status_reason"]);
    assert!(reason.contains("fixed-delay") && reason.contains("_metadata"), "{failed}");
    assert!(reason.contains(&from), "the reason names the missing source: {failed}");
    assert_eq!(u64_at(&failed, &["restart", "restarts"]), 2, "{failed}");
    Ok(())
}
