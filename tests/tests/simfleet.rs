//! The simulated worker fleet the scale benchmark runs on: through real gateway streams, its
//! jobs deploy once, checkpoint on their interval, and keep checkpointing without a restart
//! after the leader stops (the fleet re-attaches its tasks to the new leader).

use std::time::Duration;

use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::init_test_logging;
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::simfleet::{Fleet, FleetConfig, Observed};
use cairn_tests::wait;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(30);
const JOBS: usize = 4;

fn spec() -> String {
    let graph = DemoJob {
        source: SourceConfig::default(),
        output_dir: "/nonexistent/simulated".into(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 8,
    }
    .graph();
    serde_json::json!({ "graph": graph, "checkpoint": { "interval": "100ms" } }).to_string()
}

/// Waits until every job has at least `n` completions seen by the fleet after `since`.
async fn completions_after(observed: &Observed, since: Instant, n: usize) -> anyhow::Result<()> {
    wait::until("every job to complete checkpoints on the fleet", T, || async {
        let table = observed.lock();
        let done =
            table.values().filter(|o| o.completions.iter().filter(|c| c.at > since).count() >= n).count();
        (done == JOBS).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_jobs_checkpoint_and_survive_a_leader_change_without_restarting() -> anyhow::Result<()> {
    init_test_logging();
    let mut cluster = InProcCluster::start(3, test_timing()).await?;
    let mut client = cluster.client()?;
    for i in 0..JOBS {
        client.register_job(&format!("sim-{i}"), &spec()).await?;
    }
    let fleet = Fleet::start(FleetConfig {
        addrs: cluster.addrs.values().map(|a| a.to_string()).collect(),
        token: cluster.worker_token().expose().to_owned(),
        workers: 2,
        slots: 12,
    });
    completions_after(&fleet.observed, Instant::now(), 3).await?;
    {
        let table = fleet.observed.lock();
        assert_eq!(table.len(), JOBS, "every job deployed on the fleet: {table:?}");
        for (job, o) in table.iter() {
            assert_eq!(o.deployments, 1, "{job} deployed once");
            assert_eq!(o.aborted, 0, "{job} aborted nothing: {o:?}");
            // Ids increase, and each completion follows its trigger.
            assert!(o.completions.windows(2).all(|w| w[0].checkpoint_id < w[1].checkpoint_id), "{o:?}");
        }
    }
    // The coordinator's record agrees with what the fleet saw.
    for i in 0..JOBS {
        let job = format!("sim-{i}");
        let record = client.get_job(&job).await?;
        let seen = fleet.observed.lock().get(&job).map_or(0, |o| o.completions.len()) as u64;
        assert!(
            record.num_completed >= seen,
            "{job}: the store holds {} completions, the fleet saw {seen}",
            record.num_completed
        );
    }

    let leader = cluster.wait_leader(T).await?;
    cluster.stop(leader).await;
    let stopped = Instant::now();
    completions_after(&fleet.observed, stopped, 2).await?;
    let table = fleet.observed.lock().clone();
    for (job, o) in &table {
        assert_eq!(o.deployments, 1, "{job} was not redeployed by the new leader: {o:?}");
    }
    fleet.stop().await;
    cluster.shutdown().await;
    Ok(())
}
