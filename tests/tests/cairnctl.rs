//! `cairnctl` as an operator runs it: the real binary against three real `cairn` replicas and a
//! `cairn-worker` running the demo job. Every assertion reads what the operator would read: the
//! exit code, the table, or the `--output json` reply.

use std::path::PathBuf;
use std::time::Duration;

use cairn_tests::ctl::{Ctl, demo_graph, str_at, u64_at};
use cairn_tests::procs::{ProcCluster, binary, failover_args, free_port};
use cairn_tests::{init_test_logging, wait};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_tour_against_a_three_replica_cluster() -> anyhow::Result<()> {
    init_test_logging();
    let args = failover_args("5s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(3, &refs)?;
    cluster.launch_worker("w1", 8)?;
    let result = tour(&cluster).await;
    if result.is_err() {
        eprintln!("{}", cluster.logs(80));
        eprintln!("--- worker ---\n{}", cluster.worker_log_text("w1"));
    }
    result
}

async fn tour(cluster: &ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;

    // Cluster status: three voters, one leader (the first call also waits for the election).
    let status = ctl.json(&["cluster", "status", "--timeout", "60s"]).await?;
    let nodes = status["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(nodes.len(), 3, "{status}");
    assert_eq!(nodes.iter().filter(|n| n["is_leader"] == true).count(), 1, "{status}");
    let leader = u64_at(&status, &["leader_id"]);
    assert!((1..=3).contains(&leader), "{status}");
    let table = ctl.ok(&["cluster", "status"]).await?;
    assert!(table.contains("leader:") && table.contains("HEALTH"), "{table}");
    assert_eq!(table.lines().filter(|l| l.contains("voter")).count(), 3, "{table}");

    // A dead endpoint in the list is skipped.
    let dead = format!("127.0.0.1:{}", free_port()?);
    let with_dead = format!("{dead},{}", cluster.addrs().join(","));
    ctl.ok(&["--endpoints", &with_dead, "cluster", "status"]).await?;

    // Submit the demo job from a graph file, with checkpoint flags.
    let graph_file = cluster.scratch("input")?.join("graph.json");
    let graph = demo_graph(&cluster.scratch("out")?).graph();
    let subtasks: u32 = graph.vertices.iter().map(|v| v.parallelism).sum();
    std::fs::write(&graph_file, graph.to_json())?;
    let savepoints = cluster.scratch("savepoints")?;
    let submitted = ctl
        .ok(&[
            "job",
            "submit",
            "demo",
            "--graph",
            &graph_file.display().to_string(),
            "--interval",
            "200ms",
            "--retained",
            "2",
            "--savepoint-dir",
            &savepoints.display().to_string(),
        ])
        .await?;
    assert!(submitted.contains("job demo submitted"), "{submitted}");

    let list = ctl.json(&["job", "list"]).await?;
    let jobs = list["jobs"].as_array().cloned().unwrap_or_default();
    assert!(jobs.iter().any(|j| j["job_id"] == "demo"), "{list}");
    let details = ctl.json(&["job", "describe", "demo"]).await?;
    assert_eq!(str_at(&details, &["summary", "job_id"]), "demo");
    assert_eq!(u64_at(&details, &["checkpoint_config", "interval_ms"]), 200, "{details}");
    assert_eq!(u64_at(&details, &["checkpoint_config", "retained"]), 2, "{details}");

    // Periodic checkpoints complete; the overview counts them.
    wait::until("a completed checkpoint in `checkpoint list`", T, || async {
        let v = ctl.json(&["checkpoint", "list", "demo"]).await.ok()?;
        (u64_at(&v, &["counts", "completed"]) > 0).then_some(())
    })
    .await?;
    let table = ctl.ok(&["checkpoint", "list", "demo"]).await?;
    assert!(table.contains("latest completed:") && table.contains("DURATION"), "{table}");

    // The leader's workers: w1, attached with 8 slots, runs the demo job.
    let workers = ctl.json(&["cluster", "workers"]).await?;
    let w1 = workers["workers"].as_array().and_then(|w| w.first()).cloned().unwrap_or_default();
    assert_eq!(workers["workers"].as_array().map_or(0, Vec::len), 1, "{workers}");
    assert_eq!((str_at(&w1, &["worker_id"]), str_at(&w1, &["state"])), ("w1", "attached"), "{w1}");
    assert_eq!(u64_at(&w1, &["slots"]), 8, "{w1}");
    // Slot sharing: one slot per slot-sharing group, as many as the highest parallelism.
    let groups = graph.vertices.iter().map(|v| v.parallelism).max().unwrap_or(0);
    assert_eq!(u64_at(&w1, &["slots_used"]), u64::from(groups), "{w1}");
    assert_eq!(w1["jobs"], serde_json::json!(["demo"]), "{w1}");
    let table = ctl.ok(&["cluster", "workers"]).await?;
    assert!(
        table.contains("AUTHENTICATED BY") && table.contains(&format!("{groups} of 8 slots in use")),
        "{table}"
    );

    // A manual checkpoint, waited for; then its per-subtask figures.
    let outcome = ctl.json(&["checkpoint", "trigger", "demo", "--wait", "--timeout", "60s"]).await?;
    assert_eq!(str_at(&outcome, &["status"]), "completed", "{outcome}");
    let id = u64_at(&outcome, &["checkpoint_id"]);
    assert!(id > 0, "{outcome}");
    let described = ctl.json(&["checkpoint", "describe", "demo", &id.to_string()]).await?;
    assert_eq!(u64_at(&described, &["summary", "id"]), id, "{described}");
    assert_eq!(str_at(&described, &["summary", "status"]), "completed", "{described}");
    let figures = described["subtasks"].as_array().map_or(0, Vec::len);
    assert_eq!(figures, subtasks as usize, "one row per subtask: {described}");
    let table = ctl.ok(&["checkpoint", "describe", "demo", &id.to_string()]).await?;
    assert!(table.contains("START DELAY") && table.contains("source"), "{table}");
    let text = ctl.ok(&["checkpoint", "trigger", "demo", "--wait"]).await?;
    assert!(text.contains("completed"), "{text}");

    // The checkpoint configuration changes at once.
    ctl.ok(&["job", "config", "demo", "--interval", "300ms", "--tolerable-failures", "3"]).await?;
    let details = ctl.json(&["job", "describe", "demo"]).await?;
    assert_eq!(u64_at(&details, &["checkpoint_config", "interval_ms"]), 300, "{details}");
    assert_eq!(u64_at(&details, &["checkpoint_config", "tolerable_failures"]), 3, "{details}");

    // A savepoint: its directory exists, it is listed, and dispose deletes it.
    let sp = ctl.json(&["savepoint", "trigger", "demo"]).await?;
    let sp_id = u64_at(&sp, &["checkpoint_id"]);
    let sp_path = PathBuf::from(str_at(&sp, &["path"]));
    assert!(sp_path.starts_with(&savepoints), "{sp}");
    assert!(sp_path.is_dir(), "savepoint directory {} missing", sp_path.display());
    let listed = ctl.json(&["savepoint", "list", "demo"]).await?;
    let ids: Vec<u64> = listed["savepoints"]
        .as_array()
        .map(|a| a.iter().map(|s| u64_at(s, &["checkpoint_id"])).collect())
        .unwrap_or_default();
    assert!(ids.contains(&sp_id), "{listed}");
    let table = ctl.ok(&["savepoint", "list", "demo"]).await?;
    assert!(table.contains(&sp_path.display().to_string()), "{table}");
    let dispose = ["--request-id", "dispose-1", "savepoint", "dispose", "demo", &sp_id.to_string()];
    let disposed = ctl.ok(&dispose).await?;
    assert!(disposed.contains("disposed"), "{disposed}");
    // Re-running with the same request id answers with the first result instead of acting again.
    assert_eq!(ctl.ok(&dispose).await?, disposed);
    assert!(!sp_path.exists(), "{} still exists after dispose", sp_path.display());
    let listed = ctl.json(&["savepoint", "list", "demo"]).await?;
    assert!(!listed.to_string().contains(&sp_path.display().to_string()), "{listed}");

    // A wrong token is refused with exit 3, and nothing changes.
    let wrong = ctl.without_token();
    let err = wrong.fails(3, &["--token", "not-the-token", "job", "cancel", "demo"]).await?;
    assert!(err.contains("admin token"), "{err}");
    let err = wrong.fails(3, &["job", "cancel", "demo"]).await?;
    assert!(err.contains("no admin token"), "{err}");
    let details = ctl.json(&["job", "describe", "demo"]).await?;
    assert_eq!(str_at(&details, &["summary", "status"]), "running", "{details}");

    // Unknown job and unknown checkpoint: exit 4.
    let err = ctl.fails(4, &["job", "describe", "no-such-job"]).await?;
    assert!(err.contains("not found"), "{err}");
    ctl.fails(4, &["savepoint", "dispose", "demo", "999999"]).await?;

    // Stop with a savepoint ends the job; a checkpoint of a finished job is refused (exit 5).
    let stopped = ctl.json(&["job", "stop", "demo", "--savepoint"]).await?;
    let final_sp = PathBuf::from(str_at(&stopped, &["path"]));
    assert!(final_sp.is_dir(), "{stopped}");
    wait::until("the stopped job to finish", T, || async {
        let v = ctl.json(&["job", "describe", "demo"]).await.ok()?;
        (str_at(&v, &["summary", "status"]) == "finished").then_some(())
    })
    .await?;
    ctl.fails(5, &["checkpoint", "trigger", "demo"]).await?;
    Ok(())
}

/// What needs no cluster: completions, usage errors, a missing token, nothing reachable.
#[tokio::test]
async fn exit_codes_without_a_cluster() -> anyhow::Result<()> {
    let dead = format!("127.0.0.1:{}", free_port()?);
    let ctl = Ctl { bin: binary("cairnctl")?, endpoints: dead.clone(), token_file: None };

    let script = ctl.ok(&["completions", "bash"]).await?;
    assert!(script.contains("cairnctl") && script.contains("savepoint"), "{script}");
    let script = ctl.ok(&["completions", "zsh"]).await?;
    assert!(script.contains("#compdef cairnctl"), "{script}");

    let help = ctl.ok(&["--help"]).await?;
    assert!(help.contains("Exit codes") && help.contains("7  the checkpoint"), "{help}");

    // Usage errors (2), caught before any call.
    ctl.fails(2, &["job", "describe", "bad/id"]).await?;
    let err = ctl.fails(2, &["--token", "t", "job", "submit", "j", "--graph", "/no/such/graph.json"]).await?;
    assert!(err.contains("/no/such/graph.json"), "{err}");
    ctl.fails(2, &["--token", "t", "job", "config", "j"]).await?;

    // No token (3), before any call.
    let err = ctl.fails(3, &["cluster", "status"]).await?;
    assert!(err.contains("no admin token") && err.contains("admin-token"), "{err}");

    // Nothing reachable (6): the message names the endpoints tried.
    let err = ctl.fails(6, &["--token", "t", "--timeout", "1s", "cluster", "status"]).await?;
    assert!(err.contains(&dead) && err.contains("--endpoints"), "{err}");
    Ok(())
}
