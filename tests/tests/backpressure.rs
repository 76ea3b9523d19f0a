//! Backpressure per subtask in `cairnctl job describe`, as an operator reads it: one `cairn`
//! replica, one `cairn-worker` running the demo job with an unthrottled source behind a sink that
//! takes 200 records/s per subtask, so the source spends its time waiting for room downstream.
//! The worker sends its tasks' busy, idle and back-pressured time every few seconds; the leader
//! turns two samples into ms per second. Every subtask shows figures that add up to a second, and
//! a level (`ok`, `low`, `high`) that matches its back-pressured share by Flink's thresholds.
//! Figures from a worker that does not run the tasks are ignored (with a warning in the leader's
//! log) and change nothing.

use std::time::Duration;

use cairn_proto::v1::{TaskTime, TaskTimes, worker_message};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::ctl::{Ctl, u64_at};
use cairn_tests::procs::{ProcCluster, failover_args};
use cairn_tests::scripted::ScriptedWorker;
use cairn_tests::{init_test_logging, wait};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_describe_shows_each_subtasks_backpressure() -> anyhow::Result<()> {
    init_test_logging();
    let args = failover_args("3s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(1, &refs)?;
    cluster.launch_worker("w1", 8)?;
    let result = run(&cluster).await;
    if result.is_err() {
        eprintln!("{}\n--- worker ---\n{}", cluster.logs(60), cluster.worker_log_text("w1"));
    }
    result
}

/// The `load` of every task in a `job describe` reply, once each task runs and has one.
fn loads(details: &Value) -> Option<Vec<(String, Value)>> {
    let tasks = details["tasks"].as_array()?;
    (!tasks.is_empty()).then_some(())?;
    tasks
        .iter()
        .map(|t| {
            let ready = t["status"] == "running" && t["load"].is_object();
            ready.then(|| {
                (format!("{}/{}", t["vertex"].as_str().unwrap_or(""), t["subtask"]), t["load"].clone())
            })
        })
        .collect()
}

/// Checks one subtask's figures: they add up to about a second, and the level fits.
fn check_load(task: &str, load: &Value) -> anyhow::Result<()> {
    let bp = u64_at(load, &["back_pressured_ms_per_second"]);
    let busy = u64_at(load, &["busy_ms_per_second"]);
    let idle = u64_at(load, &["idle_ms_per_second"]);
    let sum = bp + busy + idle;
    anyhow::ensure!((900..=1100).contains(&sum), "{task}: {bp} + {busy} + {idle} = {sum} ms/s: {load}");
    let want = if bp <= 100 {
        "ok"
    } else if bp <= 500 {
        "low"
    } else {
        "high"
    };
    // At the thresholds the level comes from the exact ratio, the figures are rounded down.
    let level = load["backpressure"].as_str().unwrap_or("");
    let near_threshold = [100, 500].iter().any(|t| bp.abs_diff(*t) <= 1);
    anyhow::ensure!(level == want || near_threshold, "{task}: level {level:?}, expected {want:?}: {load}");
    Ok(())
}

async fn run(cluster: &ProcCluster) -> anyhow::Result<()> {
    let ctl = Ctl::for_cluster(cluster)?;
    let mut graph = DemoJob {
        source: SourceConfig {
            keys: 8,
            records_per_key: None,
            rate_per_sec: None,
            batch: 64,
            idle_after_limit: false,
        },
        output_dir: cluster.scratch("out")?.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    if let Some(sink) = graph.vertices.iter_mut().find(|v| v.id == "sink") {
        sink.operator.config["max_records_per_sec"] = 200.into();
    }
    let subtasks: usize = graph.vertices.iter().map(|v| v.parallelism as usize).sum();
    let graph_file = cluster.scratch("input")?.join("graph.json");
    std::fs::write(&graph_file, graph.to_json())?;
    ctl.ok(&["job", "submit", "demo", "--graph", &graph_file.display().to_string(), "--interval", "1s"])
        .await?;

    // Two samples of every subtask (the worker sends every 2 s) before this gives up.
    let figures = wait::until("figures for every subtask in `job describe`", T, || async {
        let details = ctl.json(&["job", "describe", "demo"]).await.ok()?;
        loads(&details).filter(|l| l.len() == subtasks)
    })
    .await?;
    for (task, load) in &figures {
        check_load(task, load)?;
    }
    // Behind the slow sink the source is back-pressured most of the time.
    let source = wait::until("the source's backpressure to show `high`", T, || async {
        let details = ctl.json(&["job", "describe", "demo"]).await.ok()?;
        let (_, load) = loads(&details)?.into_iter().find(|(t, _)| t.starts_with("source/"))?;
        (load["backpressure"] == "high").then_some(load)
    })
    .await?;
    check_load("source/0", &source)?;

    // The table: the columns, and figures (not `-`) on every subtask's row.
    let table = ctl.ok(&["job", "describe", "demo"]).await?;
    assert!(table.contains("BACKPRESSURED  BUSY") && table.contains("IDLE  BACKPRESSURE"), "{table}");
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| graph.vertices.iter().any(|v| l.starts_with(&format!("{} ", v.id))))
        .filter(|l| l.contains("running"))
        .collect();
    assert_eq!(rows.len(), subtasks, "{table}");
    for row in &rows {
        let level = row.split_whitespace().last().unwrap_or("");
        assert!(["ok", "low", "high"].contains(&level), "no figures on {row:?}\n{table}");
    }

    // A worker that does not run the job's tasks sends absurd figures for them: ignored.
    let details = ctl.json(&["job", "describe", "demo"]).await?;
    let attempt = u64_at(&details, &["attempt"]);
    let token = std::fs::read_to_string(cluster.worker_token_file())?;
    let intruder = ScriptedWorker::attach(&cluster.addrs(), token.trim(), "intruder", 4, vec![], T).await?;
    let tasks = graph
        .vertices
        .iter()
        .flat_map(|v| (0..v.parallelism).map(move |i| (v.id.clone(), i)))
        .map(|(vertex, subtask)| TaskTime {
            job_id: "demo".into(),
            vertex,
            subtask,
            attempt,
            busy_ms: 0,
            idle_ms: 0,
            back_pressured_ms: u64::MAX / 2,
        })
        .collect();
    intruder.send(worker_message::Body::TaskTimes(TaskTimes { tasks })).await?;
    wait::until("the leader to warn about the intruder's figures", T, || async {
        cluster.node_log_text(1).contains("time figures for a task not deployed on this worker").then_some(())
    })
    .await?;
    let details = ctl.json(&["job", "describe", "demo"]).await?;
    let after = loads(&details).ok_or_else(|| anyhow::anyhow!("figures gone: {details}"))?;
    assert_eq!(after.len(), subtasks, "{details}");
    for (task, load) in &after {
        check_load(task, load)?;
    }
    Ok(())
}
