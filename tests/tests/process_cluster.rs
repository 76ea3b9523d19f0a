//! Three real `cairn` processes: IDs keep increasing across a SIGKILL of the leader, the killed
//! replica restarts from its data directory and catches up, and SIGTERM stops a replica cleanly.

use std::time::Duration;

use cairn_tests::procs::ProcCluster;
use cairn_tests::{init_test_logging, wait};

const TIMING: &[&str] =
    &["--heartbeat-interval", "100ms", "--election-timeout-min", "600ms", "--election-timeout-max", "1200ms"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_with_sigkill_then_restarted() -> anyhow::Result<()> {
    init_test_logging();
    let mut cluster = ProcCluster::start(3, TIMING)?;
    let result = run(&mut cluster).await;
    if result.is_err() {
        eprintln!("{}", cluster.logs(40));
    }
    result
}

async fn run(cluster: &mut ProcCluster) -> anyhow::Result<()> {
    let mut client = cluster.client()?;
    // The first call also waits for the cluster to form (the client retries until a leader answers).
    client.register_job("job-1", "").await?;
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen.push(client.allocate_checkpoint_id("job-1").await?.checkpoint_id);
    }
    let status = client.status().await?;
    let leader = status.leader_id;
    let term_before = status.term;
    let max_before = *seen.iter().max().ok_or_else(|| anyhow::anyhow!("no ids"))?;

    cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader process"))?.kill9()?;

    let mut after = Vec::new();
    for _ in 0..200 {
        after.push(client.allocate_checkpoint_id("job-1").await?.checkpoint_id);
    }
    assert!(
        after.iter().all(|id| *id > max_before),
        "an ID after the kill is not above {max_before}: {after:?}"
    );
    assert!(after.windows(2).all(|w| w[0] < w[1]));
    let status = client.status().await?;
    assert_ne!(status.leader_id, leader, "the killed replica still leads");
    assert!(status.term > term_before);

    // Restart the killed replica from its data directory; it catches up with the leader.
    cluster.launch(leader)?;
    wait::until("the restarted replica to catch up", Duration::from_secs(60), || {
        let mut client = client.clone();
        async move {
            let st = client.status().await.ok()?;
            let m = st.members.iter().find(|m| m.id == leader)?;
            (m.matched_index? >= st.last_log_index).then_some(())
        }
    })
    .await?;
    let job = client.get_job("job-1").await?;
    assert_eq!(job.next_checkpoint_id, after.iter().max().copied().unwrap_or(0) + 1);

    // SIGTERM shuts a replica down cleanly (exit status 0).
    let any = *cluster.nodes.keys().next().ok_or_else(|| anyhow::anyhow!("no nodes"))?;
    let status = cluster
        .nodes
        .get_mut(&any)
        .ok_or_else(|| anyhow::anyhow!("gone"))?
        .terminate(Duration::from_secs(20))?;
    assert!(status.success(), "replica exited with {status} after SIGTERM");
    // Two of three remain: the cluster still serves.
    let next = client.allocate_checkpoint_id("job-1").await?;
    assert!(next.checkpoint_id > job.next_checkpoint_id - 1);
    Ok(())
}

/// The README's run command: a local cluster, a worker and the demo job, checkpoints visibly
/// completing, a clean stop, and an exactly-once verdict.
#[test]
fn demo_runs_checkpoints_and_stops_cleanly() -> anyhow::Result<()> {
    let bin = cairn_tests::procs::binary("cairn-demo")?;
    let dir = tempfile::tempdir()?;
    // The demo listens on base + 1, base + 2, base + 3.
    let base = cairn_tests::procs::free_port_run(4)?;
    let out = std::process::Command::new(bin)
        .args(["--duration", "6s", "--interval", "300ms", "--base-port", &base.to_string()])
        .arg("--data-dir")
        .arg(dir.path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cairn-demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let completed = stdout.lines().filter(|l| l.starts_with("checkpoint") && l.contains("completed")).count();
    assert!(completed >= 2, "fewer than 2 checkpoints printed:\n{stdout}");
    assert!(stdout.contains("EXACTLY ONCE"), "{stdout}");
    Ok(())
}
