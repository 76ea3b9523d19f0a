//! Failover with real processes: three `cairn` replicas, `cairn-worker`s running the demo job
//! with 200 ms checkpoints, and SIGKILL / SIGSTOP of leaders and workers. At the end the
//! verifier proves the committed output exactly once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_client::LeaderClient;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::Expectation;
use cairn_tests::output::until_exactly_once;
use cairn_tests::procs::{ProcCluster, failover_args};
use cairn_tests::{init_test_logging, wait};

const KEYS: u64 = 8;
const RECORDS_PER_KEY: u64 = 2000;
const T: Duration = Duration::from_secs(60);

/// A running scenario: three replicas, worker `w1`, and the demo job submitted.
struct Scenario {
    cluster: ProcCluster,
    output: PathBuf,
    client: LeaderClient,
}

async fn scenario(grace: &str) -> anyhow::Result<Scenario> {
    init_test_logging();
    let args = failover_args(grace);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(3, &refs)?;
    let output = cluster.scratch("out")?;
    cluster.launch_worker("w1", 8)?;
    let mut client = cluster.client()?;
    client.register_job("demo", &demo_spec(&output)).await?;
    Ok(Scenario { cluster, output, client })
}

fn demo_spec(output: &Path) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(RECORDS_PER_KEY),
            rate_per_sec: Some(800),
            batch: 16,
            idle_after_limit: true,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    serde_json::json!({ "graph": graph, "checkpoint": { "interval": "200ms", "timeout": "10s" } }).to_string()
}

/// Completed checkpoints ever, and the latest completed id.
async fn progress(client: &mut LeaderClient) -> anyhow::Result<(u64, u64)> {
    let job = client.get_job("demo").await?;
    Ok((job.num_completed, job.completed_checkpoint_ids.last().copied().unwrap_or(0)))
}

/// Waits until at least `n` more checkpoints completed than `from`; checks ids only increase.
async fn completions(client: &LeaderClient, from: u64, n: u64, last_id: &mut u64) -> anyhow::Result<u64> {
    let seen = std::cell::Cell::new(*last_id);
    let got = wait::until(&format!("{n} more completed checkpoints"), T, || {
        let mut c = client.clone();
        let seen = &seen;
        async move {
            let (count, latest) = progress(&mut c).await.ok()?;
            assert!(
                latest >= seen.get(),
                "latest completed checkpoint went back from {} to {latest}",
                seen.get()
            );
            seen.set(latest);
            (count >= from + n).then_some(count)
        }
    })
    .await?;
    *last_id = seen.get();
    Ok(got)
}

/// Waits until the committed output holds every record exactly once.
async fn exactly_once(output: PathBuf) -> anyhow::Result<()> {
    let expect = Expectation { keys: Some(KEYS), records_per_key: Some(RECORDS_PER_KEY), counts: None };
    until_exactly_once(&output, &expect, Duration::from_secs(120)).await.map(|_| ())
}

/// The demo job still runs its first attempt, and its output holds every record exactly once.
async fn never_restarted_and_exactly_once(c: &mut LeaderClient, output: PathBuf) -> anyhow::Result<()> {
    let job = c.get_job("demo").await?;
    assert_eq!(job.attempts, 1, "the tasks were restarted ({} attempts)", job.attempts);
    exactly_once(output).await
}

fn with_logs(cluster: &ProcCluster, r: anyhow::Result<()>) -> anyhow::Result<()> {
    if r.is_err() {
        eprintln!("{}", cluster.logs(150));
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_three_times_tasks_keep_running_exactly_once() -> anyhow::Result<()> {
    let Scenario { mut cluster, output, client } = scenario("8s").await?;
    let mut c = client.clone();
    let result: anyhow::Result<()> = async {
        let mut last_id = 0;
        let mut count = completions(&client, 0, 2, &mut last_id).await?;
        for round in 0..3 {
            let leader = c.status().await?.leader_id;
            cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader process"))?.kill9()?;
            let before = count;
            count = completions(&client, before, 2, &mut last_id).await?;
            let now_leader = c.status().await?.leader_id;
            assert_ne!(now_leader, leader, "round {round}: the killed replica leads again");
            cluster.launch(leader)?;
        }
        never_restarted_and_exactly_once(&mut c, output.clone()).await
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_hands_leadership_over_and_no_task_restarts() -> anyhow::Result<()> {
    let Scenario { mut cluster, output, client } = scenario("8s").await?;
    let mut c = client.clone();
    let result: anyhow::Result<()> = async {
        let mut last_id = 0;
        let mut count = completions(&client, 0, 2, &mut last_id).await?;
        // Restart every replica once, the leader first, with SIGTERM as an orchestrator does.
        let first = c.status().await?.leader_id;
        let order: Vec<u64> =
            std::iter::once(first).chain(cluster.nodes.keys().copied().filter(|id| *id != first)).collect();
        for id in order {
            let status = c.status().await?;
            let was_leader = status.leader_id == id;
            let handed_before = cluster.node_log_text(id).matches("leadership handed over").count();
            let node = cluster.nodes.get_mut(&id).ok_or_else(|| anyhow::anyhow!("no process for {id}"))?;
            let exit = node.terminate(T)?;
            assert!(exit.success(), "replica {id} exited with {exit} after SIGTERM");
            let log = cluster.node_log_text(id);
            let handed: Vec<&str> = log.lines().filter(|l| l.contains("leadership handed over")).collect();
            let handed = &handed[handed_before..];
            if was_leader {
                // The leader named its successor before it exited, and that successor still
                // leads in the term it was elected in: nobody waited out an election timeout.
                assert_eq!(
                    handed.len(),
                    1,
                    "leader {id} stopped without handing over:\n{}",
                    cluster.logs(40)
                );
                let now = c.status().await?;
                assert_ne!(now.leader_id, id);
                let named = format!("leader={} term={}", now.leader_id, now.term);
                assert!(handed[0].contains(&named), "handed over as {:?}, but now {named}", handed[0]);
            } else {
                assert!(handed.is_empty(), "follower {id} claims to have handed leadership over");
            }
            cluster.launch(id)?;
            count = completions(&client, count, 2, &mut last_id).await?;
        }
        never_restarted_and_exactly_once(&mut c, output.clone()).await
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_every_replica_leader_first_hands_over_while_a_quorum_is_left() -> anyhow::Result<()> {
    let Scenario { mut cluster, client, .. } = scenario("8s").await?;
    let mut c = client.clone();
    let result: anyhow::Result<()> = async {
        completions(&client, 0, 1, &mut 0).await?;
        let mut stopped = Vec::new();
        for _ in 0..3 {
            // The current leader (the last one standing has no followers left to ask).
            let leader = match stopped.len() {
                2 => *cluster
                    .nodes
                    .keys()
                    .find(|id| !stopped.contains(*id))
                    .ok_or_else(|| anyhow::anyhow!("none left"))?,
                _ => c.status().await?.leader_id,
            };
            let node =
                cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no process for {leader}"))?;
            let exit = node.terminate(T)?;
            assert!(exit.success(), "replica {leader} exited with {exit}");
            stopped.push(leader);
            let log = cluster.node_log_text(leader);
            let handed = log.contains("leadership handed over");
            // Two voters left (a quorum): the leader hands over. One left: nobody could win.
            assert_eq!(
                handed,
                stopped.len() < 3,
                "replica {leader} (stop {}):\n{}",
                stopped.len(),
                cluster.logs(30)
            );
            assert!(!log.contains("could not hand leadership over"), "{}", cluster.logs(30));
        }
        Ok(())
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_job_restarts_on_another_worker_exactly_once() -> anyhow::Result<()> {
    let Scenario { mut cluster, output, client } = scenario("8s").await?;
    let mut c = client.clone();
    let result: anyhow::Result<()> = async {
        let mut last_id = 0;
        let count = completions(&client, 0, 2, &mut last_id).await?;
        cluster.launch_worker("w2", 8)?;
        cluster.workers.get_mut("w1").ok_or_else(|| anyhow::anyhow!("no w1"))?.kill9()?;
        let count = completions(&client, count, 6, &mut last_id).await?;
        let job = c.get_job("demo").await?;
        assert_eq!(job.attempts, 2, "expected one restart");
        // The restore is counted, and the count survives a leader change (it is not derivable
        // from the replicated checkpoint store).
        let restored = |json: &str| -> anyhow::Result<u64> {
            let stats: serde_json::Value = serde_json::from_str(json)?;
            Ok(stats["counts"]["restored"].as_u64().unwrap_or(0))
        };
        assert_eq!(restored(&job.stats_json)?, 1, "{}", job.stats_json);
        let leader = c.status().await?.leader_id;
        cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader"))?.kill9()?;
        completions(&client, count, 8, &mut last_id).await?;
        let job = c.get_job("demo").await?;
        assert_eq!(restored(&job.stats_json)?, 1, "restore count lost on leader change: {}", job.stats_json);
        exactly_once(output.clone()).await
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_and_worker_killed_at_once_job_restarts_from_latest_checkpoint() -> anyhow::Result<()> {
    let Scenario { mut cluster, output, client } = scenario("3s").await?;
    let mut c = client.clone();
    let result: anyhow::Result<()> = async {
        let mut last_id = 0;
        let count = completions(&client, 0, 2, &mut last_id).await?;
        cluster.launch_worker("w2", 8)?;
        let leader = c.status().await?.leader_id;
        cluster.workers.get_mut("w1").ok_or_else(|| anyhow::anyhow!("no w1"))?.kill9()?;
        cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader"))?.kill9()?;
        completions(&client, count, 2, &mut last_id).await?;
        let job = c.get_job("demo").await?;
        assert!(job.attempts >= 2, "the job was not restarted");
        exactly_once(output.clone()).await
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_old_leader_commits_nothing_and_steps_down() -> anyhow::Result<()> {
    let Scenario { cluster, output, client } = scenario("8s").await?;
    let mut c = client.clone();
    let result: anyhow::Result<()> = async {
        let mut last_id = 0;
        let count = completions(&client, 0, 2, &mut last_id).await?;
        let st = c.status().await?;
        let (old, old_term) = (st.leader_id, st.term);
        let old_proc = cluster.nodes.get(&old).ok_or_else(|| anyhow::anyhow!("no leader"))?;
        old_proc.pause()?;
        let count = completions(&client, count, 2, &mut last_id).await?;
        let st = c.status().await?;
        assert_ne!(st.leader_id, old);
        assert!(st.term > old_term);
        cluster.nodes.get(&old).ok_or_else(|| anyhow::anyhow!("gone"))?.resume()?;
        // The resumed replica learns the higher term and steps down.
        let old_addr = cluster.nodes[&old].addr.clone();
        let token = cluster.admin_token().to_owned();
        wait::until("the old leader to step down", T, || {
            let (addr, token) = (old_addr.clone(), token.clone());
            async move {
                let channel = cairn_tests::direct_channel(&addr, &token).await.ok()?;
                let mut direct = cairn_proto::v1::cluster_client::ClusterClient::new(channel);
                let st = direct.status(cairn_proto::v1::StatusRequest {}).await.err()?;
                cairn_proto::leader_hint::parse_not_leader(&st).map(|_| ())
            }
        })
        .await?;
        completions(&client, count, 2, &mut last_id).await?;
        never_restarted_and_exactly_once(&mut c, output.clone()).await
    }
    .await;
    with_logs(&cluster, result)
}
