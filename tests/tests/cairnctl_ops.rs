//! Operator tasks through the real `cairnctl` against three real replicas and a worker running
//! the demo job: calls through a follower, refused tokens that change nothing, a retried
//! savepoint that is taken once, stop-with-savepoint and restore continuing exactly once, and
//! membership changes (an unreachable learner, removing a voter, re-adding it wiped, promoting
//! it, handing it the leadership) while the cluster keeps checkpointing.

use std::path::Path;
use std::time::Duration;

use cairn_tests::ctl::{Ctl, completed, demo_graph, exactly_once, savepoint_offsets, stop, str_at, u64_at};
use cairn_tests::procs::{ProcCluster, failover_args, free_port};
use cairn_tests::{init_test_logging, wait};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);
/// A well-formed admin token that is not the cluster's (so the server is the one refusing it).
const WRONG_TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// Starts three replicas and a worker, runs `body`, and prints the logs when it fails.
async fn with_cluster<F, Fut>(body: F) -> anyhow::Result<()>
where
    F: FnOnce(ProcCluster) -> Fut,
    Fut: std::future::Future<Output = (ProcCluster, anyhow::Result<()>)>,
{
    init_test_logging();
    let args = failover_args("5s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(3, &refs)?;
    cluster.launch_worker("w1", 8)?;
    let (cluster, result) = body(cluster).await;
    if result.is_err() {
        eprintln!("{}", cluster.logs(80));
        eprintln!("--- worker ---\n{}", cluster.worker_log_text("w1"));
    }
    result
}

/// The status once a leader is elected.
async fn status(ctl: &Ctl) -> anyhow::Result<Value> {
    ctl.json(&["cluster", "status", "--timeout", "60s"]).await
}

/// Writes the demo graph (output to `output`) and submits it as `job`, checkpointing every
/// 200 ms, optionally restored from a savepoint.
async fn submit(
    ctl: &Ctl,
    cluster: &ProcCluster,
    job: &str,
    output: &Path,
    from: Option<&str>,
) -> anyhow::Result<()> {
    let graph_file = cluster.scratch("input")?.join(format!("{job}.json"));
    std::fs::write(&graph_file, demo_graph(output).graph().to_json())?;
    let graph = graph_file.display().to_string();
    let savepoints = cluster.scratch("savepoints")?.display().to_string();
    let mut args = vec!["job", "submit", job, "--graph", &graph, "--interval", "200ms"];
    args.extend(["--savepoint-dir", &savepoints]);
    if let Some(dir) = from {
        args.extend(["--from-savepoint", dir]);
    }
    let out = ctl.ok(&args).await?;
    anyhow::ensure!(out.contains(&format!("job {job} submitted")), "{out}");
    Ok(())
}

fn savepoint_ids(list: &Value) -> Vec<u64> {
    list["savepoints"]
        .as_array()
        .map(|a| a.iter().map(|s| u64_at(s, &["checkpoint_id"])).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_through_a_follower_refused_tokens_retries_and_restore() -> anyhow::Result<()> {
    with_cluster(|cluster| async move {
        let r = jobs(&cluster).await;
        (cluster, r)
    })
    .await
}

async fn jobs(cluster: &ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let leader = u64_at(&status(&ctl).await?, &["leader_id"]);
    let output = cluster.scratch("out")?;
    submit(&ctl, cluster, "a", &output, None).await?;
    completed(&ctl, "a", 1, T).await?;

    // 1. Through a follower alone: the client follows the leader hint, reads and writes.
    let follower =
        cluster.nodes.values().find(|n| n.id != leader).map(|n| n.addr.clone()).unwrap_or_default();
    let via = |args: &[&'static str]| [&["--endpoints", follower.as_str()][..], args].concat();
    let st = ctl.json(&via(&["cluster", "status"])).await?;
    assert_eq!(st["nodes"].as_array().map_or(0, Vec::len), 3, "{st}");
    assert!(u64_at(&st, &["leader_id"]) > 0, "{st}");
    let list = ctl.json(&via(&["job", "list"])).await?;
    assert!(list["jobs"].as_array().is_some_and(|j| j.iter().any(|j| j["job_id"] == "a")), "{list}");
    let outcome = ctl.json(&via(&["checkpoint", "trigger", "a", "--wait"])).await?;
    assert_eq!(str_at(&outcome, &["status"]), "completed", "{outcome}");

    // 2. No token or a wrong one: exit 3, and nothing changed.
    let graph = cluster.scratch("input")?.join("a.json").display().to_string();
    let no_token = ctl.without_token();
    let refused_submit = ["job", "submit", "intruder", "--graph", &graph];
    let err = no_token.fails(3, &refused_submit).await?;
    assert!(err.contains("no admin token"), "{err}");
    let mut wrong = refused_submit.to_vec();
    wrong.extend(["--token", WRONG_TOKEN]);
    let err = no_token.fails(3, &wrong).await?;
    assert!(err.contains("refused the admin token"), "{err}");
    let list = ctl.json(&["job", "list"]).await?;
    assert!(!list.to_string().contains("intruder"), "a refused submit registered a job: {list}");

    let before = savepoint_ids(&ctl.json(&["savepoint", "list", "a"]).await?);
    no_token.fails(3, &["savepoint", "trigger", "a"]).await?;
    no_token.fails(3, &["--token", WRONG_TOKEN, "savepoint", "trigger", "a"]).await?;
    no_token.fails(3, &["--token", WRONG_TOKEN, "job", "config", "a", "--interval", "5s"]).await?;
    no_token.fails(3, &["--token", WRONG_TOKEN, "job", "cancel", "a"]).await?;
    assert_eq!(savepoint_ids(&ctl.json(&["savepoint", "list", "a"]).await?), before);
    let details = ctl.json(&["job", "describe", "a"]).await?;
    assert_eq!(u64_at(&details, &["checkpoint_config", "interval_ms"]), 200, "{details}");
    assert_eq!(str_at(&details, &["summary", "status"]), "running", "{details}");

    // 3. A savepoint trigger retried with the same request id takes one savepoint.
    let retried = ["--request-id", "savepoint-retry-1", "savepoint", "trigger", "a"];
    let first = ctl.json(&retried).await?;
    let second = ctl.json(&retried).await?;
    assert_eq!(str_at(&first, &["path"]), str_at(&second, &["path"]), "{first} vs {second}");
    assert_eq!(u64_at(&first, &["checkpoint_id"]), u64_at(&second, &["checkpoint_id"]));
    let after = savepoint_ids(&ctl.json(&["savepoint", "list", "a"]).await?);
    let new: Vec<u64> = after.iter().filter(|id| !before.contains(id)).copied().collect();
    assert_eq!(new, vec![u64_at(&first, &["checkpoint_id"])], "before {before:?}, after {after:?}");

    // 4. Stop with a savepoint, restore a new job from it into the same output, stop that one
    // too: the output holds every record of both runs exactly once.
    let stops = cluster.scratch("stops")?;
    let (sp1, path1) = stop(&ctl, "a", &stops).await?;
    let offsets1 = savepoint_offsets(&path1)?;
    assert_eq!(offsets1.len(), 4, "source offsets of every key in {}: {offsets1:?}", path1.display());
    submit(&ctl, cluster, "b", &output, Some(&path1.display().to_string())).await?;
    let overview =
        wait::until("job b restored from the savepoint with 2 completed checkpoints", T, || async {
            let v = completed(&ctl, "b", 2, T).await.ok()?;
            (u64_at(&v, &["latest_restored", "id"]) == sp1).then_some(v)
        })
        .await?;
    let completed_ids: Vec<u64> = overview["history"]
        .as_array()
        .map(|h| h.iter().filter(|c| c["status"] == "completed").map(|c| u64_at(c, &["id"])).collect())
        .unwrap_or_default();
    assert!(!completed_ids.is_empty(), "{overview}");
    assert!(completed_ids.iter().all(|id| *id > sp1), "checkpoint ids not above savepoint {sp1}: {overview}");
    let (sp2, path2) = stop(&ctl, "b", &stops).await?;
    assert!(sp2 > sp1, "{sp2} <= {sp1}");
    let offsets2 = savepoint_offsets(&path2)?;
    assert!(
        offsets1.iter().all(|(k, n)| offsets2.get(k).is_some_and(|m| m >= n))
            && offsets2.values().sum::<u64>() > offsets1.values().sum::<u64>(),
        "the restored job did not continue the source: {offsets1:?} then {offsets2:?}"
    );
    exactly_once(&output, &offsets2, T).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_keep_the_cluster_serving() -> anyhow::Result<()> {
    with_cluster(|mut cluster| async move {
        let r = membership(&mut cluster).await;
        (cluster, r)
    })
    .await
}

/// A node's entry in a status reply.
fn node(status: &Value, id: u64) -> Option<&Value> {
    status["nodes"].as_array()?.iter().find(|n| u64_at(n, &["id"]) == id)
}

async fn checkpoint_completes(ctl: &Ctl, job: &str) -> anyhow::Result<()> {
    // Retried: right after a membership or leader change the job may still be re-attaching.
    wait::until(&format!("a manual checkpoint of {job} to complete"), T, || async {
        let v = ctl.json(&["checkpoint", "trigger", job, "--wait", "--timeout", "30s"]).await.ok()?;
        (str_at(&v, &["status"]) == "completed").then_some(())
    })
    .await
}

async fn membership(cluster: &mut ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let leader = u64_at(&status(&ctl).await?, &["leader_id"]);
    let output = cluster.scratch("out")?;
    submit(&ctl, cluster, "m", &output, None).await?;
    completed(&ctl, "m", 1, T).await?;

    // An address where nothing listens: refused (exit 5) naming it, and the learner is gone.
    let nowhere = format!("127.0.0.1:{}", free_port()?);
    let err = ctl.fails(5, &["cluster", "add-learner", "9", &nowhere, "--timeout", "8s"]).await?;
    assert!(err.contains(&nowhere) && err.contains("removed from the membership again"), "{err}");
    let st = status(&ctl).await?;
    assert!(node(&st, 9).is_none(), "the unreachable learner stayed: {st}");
    assert_eq!(st["nodes"].as_array().map_or(0, Vec::len), 3, "{st}");

    // Remove a follower: two voters keep serving reads and writes.
    let x = cluster.nodes.keys().copied().find(|id| *id != leader).unwrap_or(0);
    let x_addr = cluster.nodes[&x].addr.clone();
    let removed = ctl.ok(&["cluster", "remove", &x.to_string()]).await?;
    assert!(removed.contains(&format!("node {x} removed")), "{removed}");
    let st = status(&ctl).await?;
    assert_eq!(st["nodes"].as_array().map_or(0, Vec::len), 2, "{st}");
    assert!(node(&st, x).is_none(), "{st}");
    assert!(ctl.json(&["job", "list"]).await?.to_string().contains("\"m\""));
    checkpoint_completes(&ctl, "m").await?;

    // Its process stopped, its data wiped, it starts again waiting to be added.
    let node_x = cluster.nodes.get_mut(&x).ok_or_else(|| anyhow::anyhow!("no node {x}"))?;
    tokio::task::block_in_place(|| node_x.terminate(Duration::from_secs(20)))?;
    cluster.relaunch_fresh(x)?;
    let added = ctl.ok(&["cluster", "add-learner", &x.to_string(), &x_addr]).await?;
    assert!(added.contains("added as a learner"), "{added}");
    let st = status(&ctl).await?;
    assert_eq!(node(&st, x).map(|n| str_at(n, &["role"])), Some("learner"), "{st}");
    ctl.ok(&["cluster", "promote", &x.to_string()]).await?;
    wait::until(&format!("node {x} a healthy voter"), T, || async {
        let st = status(&ctl).await.ok()?;
        let nodes = st["nodes"].as_array()?;
        let voters = nodes.iter().filter(|n| n["role"] == "voter").count();
        let healthy = node(&st, x).is_some_and(|n| n["role"] == "voter" && n["health"] == "healthy");
        (voters == 3 && healthy).then_some(())
    })
    .await?;
    checkpoint_completes(&ctl, "m").await?;

    // Hand the leadership to the re-added node.
    let moved = ctl.ok(&["cluster", "transfer-leader", &x.to_string()]).await?;
    assert!(moved.contains(&format!("node {x} leads")), "{moved}");
    wait::until(&format!("status to show node {x} leading"), T, || async {
        (u64_at(&status(&ctl).await.ok()?, &["leader_id"]) == x).then_some(())
    })
    .await?;
    checkpoint_completes(&ctl, "m").await?;
    Ok(())
}
