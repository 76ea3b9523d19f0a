//! Failover benchmark with real processes: three `cairn` replicas and two `cairn-worker`s running
//! the demo job with 200 ms checkpoints.
//!
//! Over N leader kills (SIGKILL, then the replica is restarted), prints the time from the kill to
//! (a) a new leader answering, (b) the job running again under it with all its tasks re-attached
//! (no restart), (c) the first checkpoint completed under the new leader. Over M worker kills,
//! the time from the kill to the job running again from its latest checkpoint on the other
//! worker. Over E checkpoint expiries (the job's checkpoint timeout cut to 10 ms and the workers
//! paused until the job fails over, as a stalled disk would make checkpoints expire), the time from the failover to the
//! job running again under the default restart strategy (exponential delay; the job completes a
//! checkpoint between expiries, which resets the backoff, so each failover waits about the
//! initial backoff of 1 s). Over S rolling-restart steps (the leader stopped with SIGTERM, so it
//! hands leadership over first, then started again, right after a checkpoint completed), the
//! time the stopping leader took to exit and the gap from that completion to the next one, as
//! the leaders stamp them (the interval is 200 ms). Over W kills of a worker of a second job
//! spread over the workers (`"placement": "spread"`: 10 tasks in 4 slot-sharing groups, three
//! more 8-slot workers started for it, data exchanged over the workers' links), the time from
//! the kill to that job running again on the others. p50, p99, max; figures are printed, never
//! asserted.
//!
//! ```text
//! cargo build --release --bins
//! cargo run --release -p cairn-tests --bin cairn-bench-failover -- [--leader-kills 20] [--worker-kills 5] [--expiries 5] [--leader-stops 10] [--spread-worker-kills 5]
//! ```

use std::time::{Duration, Instant};

use cairn_client::LeaderClient;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::chaos::history::now_ms;
use cairn_tests::procs::ProcCluster;
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 20)]
    leader_kills: usize,
    #[arg(long, default_value_t = 5)]
    worker_kills: usize,
    #[arg(long, default_value_t = 5)]
    expiries: usize,
    /// Rolling-restart steps: the leader stopped with SIGTERM (it hands leadership over), then
    /// started again.
    #[arg(long, default_value_t = 10)]
    leader_stops: usize,
    /// Kills of a worker running part of a job spread over the workers.
    #[arg(long, default_value_t = 5)]
    spread_worker_kills: usize,
}

/// Records the demo job's completed checkpoints (polled every 5 ms), until dropped.
struct CompletionLog {
    /// Completion time (ms since the Unix epoch, as the leader stamped it) by checkpoint id.
    times: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CompletionLog {
    /// Collects the completion times the leaders report (trigger time plus end-to-end duration),
    /// so that the gap is the cluster's, not how soon this poller found the new leader.
    fn start(c: &LeaderClient) -> Self {
        let times = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let (mut c, log) = (c.clone(), times.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Ok(overview) = list_checkpoints(&mut c).await {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    for cp in overview.history.iter().filter(|cp| cp.status == "completed") {
                        log.insert(cp.id, completed_at(cp));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Self { times, task }
    }

    /// When the first checkpoint after `id` completed (ms since the epoch).
    fn first_after(&self, id: u64) -> Option<u64> {
        let times = self.times.lock().unwrap_or_else(|e| e.into_inner());
        times.range(id.saturating_add(1)..).next().map(|(_, t)| *t)
    }
}

/// The id of the demo job's latest completed checkpoint and when it completed (ms since the
/// epoch), as the leader reports it.
async fn latest_completed(c: &mut LeaderClient) -> Option<(u64, u64)> {
    let overview = list_checkpoints(c).await.ok()?;
    overview.latest_completed.map(|cp| (cp.id, completed_at(&cp)))
}

/// When a completed checkpoint completed (ms since the epoch, the leader's clock): its trigger
/// time plus its end-to-end duration.
fn completed_at(cp: &cairn_proto::admin::CheckpointSummary) -> u64 {
    cp.trigger_time_ms.saturating_add(cp.duration_ms)
}

impl Drop for CompletionLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The demo job's checkpoint overview (recent history included) through the admin API.
async fn list_checkpoints(c: &mut LeaderClient) -> anyhow::Result<cairn_proto::admin::CheckpointOverview> {
    use cairn_proto::admin::JobRequest;
    use cairn_proto::admin::admin_client::AdminClient;
    let overview = c
        .call("list checkpoints", |ch| async move {
            Ok(AdminClient::new(ch)
                .list_checkpoints(JobRequest { job_id: "demo".into() })
                .await?
                .into_inner())
        })
        .await?;
    Ok(overview)
}

/// Sets the demo job's checkpoint timeout through the admin API.
async fn set_timeout(c: &mut LeaderClient, timeout: &str) -> anyhow::Result<()> {
    use cairn_proto::admin::UpdateCheckpointConfigRequest;
    use cairn_proto::admin::admin_client::AdminClient;
    let req = UpdateCheckpointConfigRequest {
        job_id: "demo".into(),
        checkpoint_json: serde_json::json!({ "timeout": timeout }).to_string(),
        request_id: String::new(),
    };
    c.call("update checkpoint config", |ch| {
        let req = req.clone();
        async move { Ok(AdminClient::new(ch).update_checkpoint_config(req).await?.into_inner()) }
    })
    .await?;
    Ok(())
}

const POLL: Duration = Duration::from_millis(10);
const LIMIT: Duration = Duration::from_secs(60);

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> anyhow::Result<(T, Instant)> {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = f().await {
            return Ok((v, Instant::now()));
        }
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Waits for a restarted replica to be within a few entries of the leader's log.
async fn caught_up(c: &LeaderClient, node: u64) -> anyhow::Result<()> {
    until("the restarted replica to catch up", async || {
        let s = c.clone().status().await.ok()?;
        let m = s.members.iter().find(|m| m.id == node)?;
        (m.matched_index? + 5 >= s.last_log_index).then_some(())
    })
    .await?;
    Ok(())
}

async fn job_running(c: &mut LeaderClient, min_term: u64, min_attempt: u32) -> Option<u32> {
    Some(runtime_of(c, "demo", min_term, min_attempt).await?.0)
}

/// Attempt and workers of `job` once it runs an attempt of at least `min_attempt` under a term of
/// at least `min_term`.
async fn runtime_of(
    c: &mut LeaderClient,
    job: &str,
    min_term: u64,
    min_attempt: u32,
) -> Option<(u32, Vec<String>)> {
    let r = c.job_runtimes().await.ok()?;
    let j = r.jobs.iter().find(|j| j.job_id == job)?;
    (r.term >= min_term && j.phase == "running" && j.attempt >= min_attempt)
        .then(|| (j.attempt, j.worker.split(',').map(str::to_owned).collect()))
}

/// Kills a worker of a job spread over the workers `n` times; the time from each kill to the job
/// running again on the others.
async fn spread_worker_kills(
    cluster: &mut ProcCluster,
    c: &LeaderClient,
    n: usize,
) -> anyhow::Result<Histogram<u64>> {
    let output = cluster.scratch("spread-out")?;
    for w in ["s1", "s2", "s3"] {
        cluster.launch_worker(w, 8)?;
    }
    c.clone().register_job("spread", &demo_spec(&output, 4, "spread")).await?;
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..n {
        let ((attempt, workers), _) =
            until("the spread job to run", async || runtime_of(&mut c.clone(), "spread", 0, 1).await).await?;
        // A checkpoint completes before the kill, so the restore has something recent.
        let done = c.clone().get_job("spread").await?.num_completed;
        until("a checkpoint of the spread job", async || {
            (c.clone().get_job("spread").await.ok()?.num_completed > done).then_some(())
        })
        .await?;
        let victim =
            workers.into_iter().next().ok_or_else(|| anyhow::anyhow!("the spread job has no worker"))?;
        cluster.workers.get_mut(&victim).ok_or_else(|| anyhow::anyhow!("no worker {victim}"))?.kill9()?;
        let t0 = Instant::now();
        let (_, t1) = until("the spread job to run again", async || {
            runtime_of(&mut c.clone(), "spread", 0, attempt + 1).await
        })
        .await?;
        h.record((t1 - t0).as_millis() as u64)?;
        cluster.launch_worker(&victim, 8)?;
        eprintln!("spread worker kill {}/{n}: done (killed {victim})", i + 1);
    }
    Ok(h)
}

/// The demo job (2 sources, `parallelism` counters and sinks, 16 keys at 500 records/s) with
/// 200 ms checkpoints, placed with `placement`.
fn demo_spec(output: &std::path::Path, parallelism: u32, placement: &str) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: 16,
            records_per_key: None,
            rate_per_sec: Some(500),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 2,
        parallelism,
        max_parallelism: 32,
    }
    .graph();
    serde_json::json!({
        "graph": graph,
        "checkpoint": { "interval": "200ms", "timeout": "10s" },
        "placement": placement,
    })
    .to_string()
}

fn line(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<44} p50={:>7.0}ms p99={:>7.0}ms max={:>7.0}ms (n={})",
        h.value_at_quantile(0.5) as f64,
        h.value_at_quantile(0.99) as f64,
        h.max() as f64,
        h.len()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The defaults a user gets: Raft and worker timings, re-attach grace.
    let mut cluster = ProcCluster::start(3, &[])?;
    let output = cluster.scratch("out")?;
    cluster.launch_worker("w1", 8)?;
    let mut c = cluster.client()?;
    c.register_job("demo", &demo_spec(&output, 2, "pack")).await?;
    until("the job to run", async || job_running(&mut c.clone(), 0, 1).await).await?;
    println!("cairn-bench-failover: 3 replicas, worker w1, demo job (6 tasks), 200ms checkpoints");

    let (mut elected, mut reattached, mut first_cp) =
        (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?);
    for i in 0..args.leader_kills {
        let st = c.status().await?;
        let (old, old_term) = (st.leader_id, st.term);
        let done_before = c.get_job("demo").await?.num_completed;
        let node = cluster.nodes.get_mut(&old).ok_or_else(|| anyhow::anyhow!("no leader process"))?;
        node.kill9()?;
        let t0 = Instant::now();
        let (term, t1) = until("a new leader", async || {
            let s = c.clone().status().await.ok()?;
            (s.leader_id != old && s.term > old_term).then_some(s.term)
        })
        .await?;
        let (_, t2) = until("tasks re-attached", async || job_running(&mut c.clone(), term, 1).await).await?;
        let (_, t3) = until("a checkpoint under the new leader", async || {
            let j = c.clone().get_job("demo").await.ok()?;
            (j.num_completed > done_before).then_some(())
        })
        .await?;
        elected.record((t1 - t0).as_millis() as u64)?;
        reattached.record((t2 - t0).as_millis() as u64)?;
        first_cp.record((t3 - t0).as_millis() as u64)?;
        cluster.launch(old)?;
        // Let the restarted replica catch up before the next kill.
        caught_up(&c, old).await?;
        eprintln!("leader kill {}/{}: done", i + 1, args.leader_kills);
    }
    let attempts = c.get_job("demo").await?.attempts;
    line("leader kill -> new leader elected", &elected);
    line("leader kill -> all tasks re-attached", &reattached);
    line("leader kill -> first checkpoint completed", &first_cp);
    println!("job attempts after {} leader kills: {attempts} (1 = never restarted)", args.leader_kills);

    // Rolling restart: SIGTERM the leader (it hands over, then exits), start it again.
    let (mut handoff, mut gaps) = (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?);
    let completions = CompletionLog::start(&c);
    for i in 0..args.leader_stops {
        let old = c.status().await?.leader_id;
        // The SIGTERM follows a completion at once (within a poll), as the worst case: the gap
        // then spans the whole handover.
        let seen = latest_completed(&mut c.clone()).await.map_or(0, |(id, _)| id);
        let ((before_id, before), _) = until("a checkpoint before the stop", async || {
            latest_completed(&mut c.clone()).await.filter(|(id, _)| *id > seen)
        })
        .await?;
        let node = cluster.nodes.get_mut(&old).ok_or_else(|| anyhow::anyhow!("no leader process"))?;
        let (t0, t0_ms) = (Instant::now(), now_ms());
        let exit = node.terminate(LIMIT)?;
        anyhow::ensure!(exit.success(), "the leader exited with {exit} after SIGTERM");
        handoff.record((Instant::now() - t0).as_millis() as u64)?;
        let (after, _) =
            until("a checkpoint after the stop", async || completions.first_after(before_id)).await?;
        let gap = after.saturating_sub(before);
        gaps.record(gap)?;
        eprintln!(
            "leader stop {}: gap {gap} ms (checkpoint {before_id} completed {} ms before the SIGTERM)",
            i + 1,
            t0_ms.saturating_sub(before)
        );
        cluster.launch(old)?;
        caught_up(&c, old).await?;
        eprintln!("leader stop {}/{}: done", i + 1, args.leader_stops);
    }
    drop(completions);
    line("leader SIGTERM -> process exited (handed over)", &handoff);
    line("leader SIGTERM: checkpoint gap (interval 200ms)", &gaps);
    let attempts = c.get_job("demo").await?.attempts;
    println!("job attempts after {} leader stops too: {attempts} (1 = never restarted)", args.leader_stops);

    let mut running = Histogram::<u64>::new(3)?;
    let mut spare = "w2".to_string();
    let mut active = "w1".to_string();
    cluster.launch_worker(&spare, 8)?;
    for _ in 0..args.worker_kills {
        let attempt = c.get_job("demo").await?.attempts;
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.workers.get_mut(&active).ok_or_else(|| anyhow::anyhow!("no worker {active}"))?.kill9()?;
        let t0 = Instant::now();
        let (_, t1) =
            until("the job to run again", async || job_running(&mut c.clone(), 0, attempt + 1).await).await?;
        running.record((t1 - t0).as_millis() as u64)?;
        cluster.launch_worker(&active, 8)?;
        std::mem::swap(&mut spare, &mut active);
    }
    line("worker kill -> job running again from checkpoint", &running);

    let mut recovered = Histogram::<u64>::new(3)?;
    let mut each = Vec::new();
    for _ in 0..args.expiries {
        let attempt = c.get_job("demo").await?.attempts;
        set_timeout(&mut c, "10ms").await?;
        // A checkpoint can complete within 10 ms here: the workers are paused until one expired
        // (all of them: a restart places the job on whichever has the most free slots).
        for w in cluster.workers.values() {
            w.pause()?;
        }
        let failed_over = until("the job to fail over for an expired checkpoint", async || {
            let j = c.clone().get_job("demo").await.ok()?;
            (j.status == "restarting").then_some(())
        })
        .await;
        for w in cluster.workers.values() {
            w.resume()?;
        }
        let (_, t0) = failed_over?;
        set_timeout(&mut c, "10s").await?;
        let (_, t1) = until("the job to run again after its backoff", async || {
            job_running(&mut c.clone(), 0, attempt + 1).await
        })
        .await?;
        let ms = (t1 - t0).as_millis() as u64;
        recovered.record(ms)?;
        each.push(ms);
        // A checkpoint completes again before the next expiry.
        let done = c.get_job("demo").await?.num_completed;
        until("a checkpoint after the restart", async || {
            (c.clone().get_job("demo").await.ok()?.num_completed > done).then_some(())
        })
        .await?;
    }
    line("checkpoint expiry failover -> job running again", &recovered);
    println!("  each (ms; a checkpoint completes between expiries, resetting the backoff): {each:?}");

    if args.spread_worker_kills > 0 {
        let spread = spread_worker_kills(&mut cluster, &c, args.spread_worker_kills).await?;
        line("spread job: worker kill -> running again", &spread);
        println!(
            "  (10 tasks in 4 groups spread over the workers with the most free slots, data over their links)"
        );
    }
    Ok(())
}
