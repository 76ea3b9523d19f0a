//! Scale benchmark: how many jobs one 3-replica cluster coordinates.
//!
//! Three `cairn` replica processes (default settings) and a fleet of simulated workers in this
//! process ([`cairn_tests::simfleet`]: real gateway streams and protocol, tasks that acknowledge
//! at once with empty state). N jobs of T tasks each (a source, a keyed count and a sink, as the
//! demo job) checkpoint at the given interval. After a warm-up, over a measured window, it
//! prints:
//!
//! - checkpoint end-to-end p50/p99/max: as the coordinator records it (trigger to completion,
//!   from every job's checkpoint history) and as the workers see it (trigger received to
//!   completion notice received);
//! - checkpoints completed vs expected (jobs × window / interval) and missed intervals (a gap
//!   between a job's completions longer than 1.5 intervals counts its lost intervals);
//! - CPU (% of one core) and RSS of each replica process, and of the simulated fleet;
//! - Raft entries/s (the leader's log index), bytes/s the leader process wrote to disk, and the
//!   size of the last state-machine snapshot the leader built (from its log);
//!
//! then SIGKILLs the leader and prints the time from the kill until every job completed a
//! checkpoint under the new leader (p50/p99/max over jobs), and how many jobs restarted. Figures
//! are printed, never asserted.
//!
//! ```text
//! cargo build --release --workspace --bins
//! cargo run --release -p cairn-tests --bin cairn-bench-scale -- --jobs 100 --tasks 100 [--interval 1s] [--warmup 20s] [--window 60s] [--workers N] [--no-failover]
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use cairn_client::LeaderClient;
use cairn_proto::admin::JobRequest;
use cairn_proto::admin::admin_client::AdminClient;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::chaos::history::now_ms;
use cairn_tests::procs::ProcCluster;
use cairn_tests::simfleet::{Fleet, FleetConfig, Observed};
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Parser)]
#[command(about = "Checkpoint coordination of many jobs by one 3-replica cluster")]
struct Args {
    /// Jobs registered.
    #[arg(long, default_value_t = 100)]
    jobs: usize,
    /// Tasks per job (at least 3: a third each for the count and the sink, the rest sources).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(3..=3000))]
    tasks: u32,
    /// Checkpoint interval of every job.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Time between every job running and the measured window.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// The measured window.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Simulated workers (the jobs spread over them); 0: one per 2,000 tasks (a worker offers at
    /// most 4,096 slots).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Skip the leader kill at the end.
    #[arg(long)]
    no_failover: bool,
}

/// Bound on every wait of the benchmark (jobs running, the failover).
const LIMIT: Duration = Duration::from_secs(600);
/// Registrations in flight at once.
const REGISTER_CONCURRENCY: usize = 32;
/// Checkpoint-history reads in flight at once.
const HISTORY_CONCURRENCY: usize = 8;
/// Slots a worker may offer (the gateway refuses more).
const MAX_SLOTS: u32 = 4096;
/// A second of the window whose p99 is above this is counted as slow.
const SLOW_SECOND_MS: u64 = 100;
/// Linux reports process CPU time in ticks of 1/100 s (USER_HZ).
const TICKS_PER_SEC: f64 = 100.0;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    anyhow::ensure!(args.jobs > 0, "--jobs must be positive");
    if args.workers == 0 {
        args.workers = (args.jobs * args.tasks as usize).div_ceil(2000).max(1);
    }
    let per_worker = args.jobs.div_ceil(args.workers) + 1;
    let slots = u32::try_from(per_worker)?.saturating_mul(args.tasks);
    anyhow::ensure!(
        slots <= MAX_SLOTS,
        "{} workers would need {slots} slots each (at most {MAX_SLOTS}): pass more --workers",
        args.workers
    );
    println!(
        "cairn-bench-scale: 3 replicas (defaults), {} jobs x {} tasks, checkpoints every {:?}, {} simulated workers; load average {}",
        args.jobs,
        args.tasks,
        args.interval,
        args.workers,
        loadavg()
    );
    let mut cluster = ProcCluster::start(3, &[])?;
    let mut client = cluster.client()?;
    client.status().await?;

    let started = Instant::now();
    register_jobs(&client, &args).await?;
    println!("registered {} jobs in {:.1} s", args.jobs, started.elapsed().as_secs_f64());

    let token = std::fs::read_to_string(cluster.worker_token_file())?.trim().to_owned();
    let fleet = Fleet::start(FleetConfig { addrs: cluster.addrs(), token, workers: args.workers, slots });
    let running = until("every job to run", async || {
        let r = client.clone().job_runtimes().await.ok()?;
        (r.jobs.iter().filter(|j| j.phase == "running").count() >= args.jobs).then_some(())
    })
    .await;
    if let Err(error) = running {
        let r = client.job_runtimes().await?;
        let mut phases = BTreeMap::<String, usize>::new();
        for j in &r.jobs {
            *phases.entry(j.phase.clone()).or_default() += 1;
        }
        anyhow::bail!("{error}; jobs by phase: {phases:?}");
    }
    println!("every job running {:.1} s after the first registration", started.elapsed().as_secs_f64());

    tokio::time::sleep(args.warmup).await;
    let window = measure_window(&cluster, &mut client, &fleet.observed, &args).await?;
    window.print(&args);
    coordinator_durations(&client, &args, window.wall).await?;

    if !args.no_failover {
        failover(&mut cluster, &mut client, &fleet.observed, &args).await?;
    }
    fleet.stop().await;
    println!("load average at the end: {}", loadavg());
    Ok(())
}

/// The job's spec: the demo job's shape with `tasks` subtasks in all.
fn spec(args: &Args, output: &str) -> anyhow::Result<String> {
    let third = args.tasks / 3;
    let graph = DemoJob {
        source: SourceConfig {
            keys: 16,
            records_per_key: None,
            rate_per_sec: Some(100),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.to_owned(),
        source_parallelism: args.tasks - 2 * third,
        parallelism: third,
        max_parallelism: args.tasks.next_power_of_two().max(128),
    }
    .graph();
    let interval = format!("{}ms", args.interval.as_millis());
    Ok(serde_json::json!({ "graph": graph, "checkpoint": { "interval": interval } }).to_string())
}

fn job_name(i: usize) -> String {
    format!("scale-{i:05}")
}

async fn register_jobs(client: &LeaderClient, args: &Args) -> anyhow::Result<()> {
    let spec = spec(args, "/nonexistent/simulated-workers-write-nothing")?;
    let mut inflight = tokio::task::JoinSet::new();
    for i in 0..args.jobs {
        if inflight.len() >= REGISTER_CONCURRENCY
            && let Some(done) = inflight.join_next().await
        {
            done??;
        }
        let (mut c, spec) = (client.clone(), spec.clone());
        inflight.spawn(async move { c.register_job(&job_name(i), &spec).await.map(|_| ()) });
    }
    while let Some(done) = inflight.join_next().await {
        done??;
    }
    Ok(())
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        anyhow::ensure!(Instant::now() < deadline, "timed out after {LIMIT:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU ticks (user + system) of a process, from `/proc/<pid>/stat`.
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 of what follows ')'.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn rss_mib(pid: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn write_bytes(pid: &str) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// The size of the last snapshot a replica's log says it built.
fn last_snapshot_bytes(log: &str) -> Option<u64> {
    number_after(log.lines().rev().find(|l| l.contains("built snapshot"))?, " bytes=")
}

/// The number a log line gives for a field (`name` ends with `=`).
fn number_after(line: &str, name: &str) -> Option<u64> {
    let at = line.find(name)? + name.len();
    line[at..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().ok()
}

/// A snapshot build or log purge the leader logged, `at_ms` after the window began.
struct StorageEvent {
    at_ms: u64,
    what: &'static str,
    took_ms: Option<u64>,
}

/// The leader's snapshot builds (`total_ms`) and log purges (`ms`) within `wall` (ms since the
/// epoch), from its log lines (which begin with an RFC 3339 time).
fn storage_events(log: &str, wall: (u64, u64)) -> Vec<StorageEvent> {
    log.lines()
        .filter_map(|line| {
            let (what, took_ms) = if line.contains("built snapshot") {
                ("snapshot built", number_after(line, " total_ms="))
            } else if line.contains("deleted purged raft log entries") {
                ("log purged", number_after(line, " ms="))
            } else {
                return None;
            };
            let time = humantime::parse_rfc3339_weak(line.split_whitespace().next()?).ok()?;
            let ms = time.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
            (wall.0..=wall.1).contains(&ms).then(|| StorageEvent { at_ms: ms - wall.0, what, took_ms })
        })
        .collect()
}

/// The process id of replica `id`, as `/proc` names it.
fn replica_pid(cluster: &ProcCluster, id: u64) -> Option<String> {
    cluster.nodes.get(&id).and_then(|n| n.pid()).map(|p| p.to_string())
}

/// Per-process readings at one instant.
struct Sample {
    at: Instant,
    ticks: BTreeMap<u64, u64>,
    own_ticks: u64,
    leader_written: u64,
    log_index: u64,
}

fn sample(cluster: &ProcCluster, leader: u64, log_index: u64) -> Sample {
    let pid = |id: &u64| replica_pid(cluster, *id);
    let ticks = cluster.nodes.keys().filter_map(|id| Some((*id, cpu_ticks(&pid(id)?)?))).collect();
    Sample {
        at: Instant::now(),
        ticks,
        own_ticks: cpu_ticks("self").unwrap_or(0),
        leader_written: pid(&leader).and_then(|p| write_bytes(&p)).unwrap_or(0),
        log_index,
    }
}

struct Window {
    leader: u64,
    /// Terms that began during the window (0: the same leader throughout).
    elections: u64,
    /// Wall-clock bounds, in ms since the epoch (to match the coordinator's trigger times).
    wall: (u64, u64),
    seconds: f64,
    cpu: BTreeMap<u64, f64>,
    own_cpu: f64,
    rss: BTreeMap<u64, f64>,
    own_rss: f64,
    entries_per_sec: f64,
    written_per_sec: f64,
    snapshot: Option<u64>,
    snapshot_index: u64,
    seen_by_workers: Histogram<u64>,
    /// The workers' end-to-end figures by the second of the window their completion arrived in.
    per_second: Vec<Histogram<u64>>,
    /// The leader's snapshot builds and log purges during the window (from its log).
    storage_events: Vec<StorageEvent>,
    completed: usize,
    missed_intervals: u64,
    aborted: u64,
}

async fn measure_window(
    cluster: &ProcCluster,
    client: &mut LeaderClient,
    observed: &Observed,
    args: &Args,
) -> anyhow::Result<Window> {
    let status = client.status().await?;
    let leader = status.leader_id;
    let before = sample(cluster, leader, status.last_log_index);
    let wall_start = now_ms();
    let aborted_before: u64 = observed.lock().values().map(|o| o.aborted).sum();
    tokio::time::sleep(args.window).await;
    let term_before = status.term;
    let status = client.status().await?;
    let elections = status.term.saturating_sub(term_before);
    let after = sample(cluster, leader, status.last_log_index);
    let wall_end = now_ms();
    let seconds = (after.at - before.at).as_secs_f64();
    let cpu = after
        .ticks
        .iter()
        .filter_map(|(id, t)| {
            let b = before.ticks.get(id)?;
            Some((*id, t.saturating_sub(*b) as f64 / TICKS_PER_SEC / seconds * 100.0))
        })
        .collect();
    let pid = |id: &u64| replica_pid(cluster, *id);
    let rss = cluster.nodes.keys().filter_map(|id| Some((*id, rss_mib(&pid(id)?)?))).collect();

    let leader_log = cluster.node_log_text(leader);
    let mut seen_by_workers = Histogram::<u64>::new(3)?;
    let mut per_second =
        (0..seconds.ceil() as usize).map(|_| Histogram::<u64>::new(3)).collect::<Result<Vec<_>, _>>()?;
    let (mut completed, mut missed_intervals) = (0usize, 0u64);
    let interval_ms = args.interval.as_millis().max(1) as u64;
    let aborted_after: u64;
    {
        let table = observed.lock();
        aborted_after = table.values().map(|o| o.aborted).sum();
        for job in table.values() {
            let mut last = None;
            for c in &job.completions {
                if c.at < before.at {
                    last = Some(c.at);
                    continue;
                }
                if c.at > after.at {
                    break;
                }
                completed += 1;
                let ms = c.end_to_end.as_millis() as u64;
                seen_by_workers.record(ms)?;
                if let Some(h) = per_second.get_mut((c.at - before.at).as_secs() as usize) {
                    h.record(ms)?;
                }
                if let Some(prev) = last {
                    let gap = (c.at - prev).as_millis() as u64;
                    if gap * 2 > interval_ms * 3 {
                        missed_intervals += (gap + interval_ms / 2) / interval_ms - 1;
                    }
                }
                last = Some(c.at);
            }
        }
    }
    Ok(Window {
        leader,
        elections,
        wall: (wall_start, wall_end),
        seconds,
        cpu,
        own_cpu: after.own_ticks.saturating_sub(before.own_ticks) as f64 / TICKS_PER_SEC / seconds * 100.0,
        rss,
        own_rss: rss_mib("self").unwrap_or(0.0),
        entries_per_sec: after.log_index.saturating_sub(before.log_index) as f64 / seconds,
        written_per_sec: after.leader_written.saturating_sub(before.leader_written) as f64 / seconds,
        snapshot: last_snapshot_bytes(&leader_log),
        snapshot_index: status.snapshot_index,
        seen_by_workers,
        per_second,
        storage_events: storage_events(&leader_log, (wall_start, wall_end)),
        completed,
        missed_intervals,
        aborted: aborted_after.saturating_sub(aborted_before),
    })
}

fn quantiles(h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return "none".into();
    }
    format!(
        "p50={} ms p99={} ms max={} ms (n={})",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        h.len()
    )
}

impl Window {
    /// Where the tail comes from: the seconds of the window with the highest p99 as the workers
    /// saw it, beside the leader's snapshot builds and log purges.
    fn print_slowest_seconds(&self) {
        let mut seconds: Vec<(usize, &Histogram<u64>)> =
            self.per_second.iter().enumerate().filter(|(_, h)| !h.is_empty()).collect();
        let over = seconds.iter().filter(|(_, h)| h.value_at_quantile(0.99) > SLOW_SECOND_MS).count();
        seconds.sort_by_key(|(_, h)| std::cmp::Reverse(h.value_at_quantile(0.99)));
        let slowest: Vec<String> = seconds
            .iter()
            .take(3)
            .map(|(s, h)| {
                format!("+{s} s p99={} ms max={} ms (n={})", h.value_at_quantile(0.99), h.max(), h.len())
            })
            .collect();
        println!(
            "slowest seconds of the window: {}; seconds with p99 over {SLOW_SECOND_MS} ms: {over} of {}",
            slowest.join(", "),
            self.per_second.len()
        );
        let events: Vec<String> = self
            .storage_events
            .iter()
            .map(|e| match e.took_ms {
                Some(ms) => format!("+{:.1} s {} ({ms} ms)", e.at_ms as f64 / 1000.0, e.what),
                None => format!("+{:.1} s {}", e.at_ms as f64 / 1000.0, e.what),
            })
            .collect();
        if !events.is_empty() {
            println!("leader's snapshot builds and log purges in the window: {}", events.join(", "));
        }
    }

    fn print(&self, args: &Args) {
        let expected = args.jobs as f64 * self.seconds / args.interval.as_secs_f64();
        println!(
            "--- measured window: {:.0} s, leader {}, load average {}",
            self.seconds,
            self.leader,
            loadavg()
        );
        if self.elections > 0 {
            println!(
                "WARNING: {} election(s) during the window: the figures include a leader change, and the \
                 per-process figures are of replica {} (the leader when the window began)",
                self.elections, self.leader
            );
        }
        println!("checkpoint end-to-end, seen by the workers: {}", quantiles(&self.seen_by_workers));
        self.print_slowest_seconds();
        println!(
            "checkpoints completed: {} of {:.0} expected ({:.1}%); missed intervals: {}; aborted: {}",
            self.completed,
            expected,
            self.completed as f64 / expected * 100.0,
            self.missed_intervals,
            self.aborted
        );
        for (id, cpu) in &self.cpu {
            let role = if *id == self.leader { "leader" } else { "follower" };
            println!(
                "replica {id} ({role}): CPU {cpu:.1}% of a core, RSS {:.0} MiB",
                self.rss.get(id).copied().unwrap_or(0.0)
            );
        }
        println!(
            "simulated workers (this process): CPU {:.1}% of a core, RSS {:.0} MiB",
            self.own_cpu, self.own_rss
        );
        println!(
            "Raft: {:.0} entries/s; the leader process wrote {:.2} MiB/s to disk",
            self.entries_per_sec,
            self.written_per_sec / (1024.0 * 1024.0)
        );
        match self.snapshot {
            Some(bytes) => println!(
                "last snapshot built by the leader: {:.1} KiB (snapshot index {})",
                bytes as f64 / 1024.0,
                self.snapshot_index
            ),
            None => {
                println!("the leader has not built a snapshot yet (snapshot index {})", self.snapshot_index)
            }
        }
    }
}

/// End-to-end durations of the window's checkpoints as the coordinator recorded them. The jobs'
/// histories are read [`HISTORY_CONCURRENCY`] at a time (one after the other, a thousand reads
/// from a saturated leader took longer than the whole measured window); a history the leader
/// does not answer for in time is counted, not fatal.
async fn coordinator_durations(client: &LeaderClient, args: &Args, wall: (u64, u64)) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut h = Histogram::<u64>::new(3)?;
    let mut failed = 0usize;
    let mut unread = 0usize;
    let mut first_unread: Option<String> = None;
    let mut reads = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < args.jobs || !reads.is_empty() {
        while next < args.jobs && reads.len() < HISTORY_CONCURRENCY {
            let req = JobRequest { job_id: job_name(next) };
            let mut client = client.clone();
            reads.spawn(async move {
                client
                    .call("list checkpoints", move |ch| {
                        let req = req.clone();
                        async move { Ok(AdminClient::new(ch).list_checkpoints(req).await?.into_inner()) }
                    })
                    .await
            });
            next += 1;
        }
        let Some(read) = reads.join_next().await else { break };
        let overview = match read? {
            Ok(o) => o,
            Err(error) => {
                unread += 1;
                first_unread.get_or_insert_with(|| error.to_string());
                continue;
            }
        };
        for cp in
            overview.history.iter().filter(|c| c.trigger_time_ms >= wall.0 && c.trigger_time_ms <= wall.1)
        {
            match cp.status.as_str() {
                "completed" => h.record(cp.duration_ms)?,
                "failed" => failed += 1,
                _ => {}
            }
        }
    }
    println!(
        "checkpoint end-to-end, recorded by the coordinator (the window's part of each job's history): {}; failed: {failed} (read in {:.1} s{})",
        quantiles(&h),
        started.elapsed().as_secs_f64(),
        match first_unread {
            Some(error) => format!("; {unread} of {} histories unanswered, the first: {error}", args.jobs),
            None => String::new(),
        }
    );
    Ok(())
}

async fn failover(
    cluster: &mut ProcCluster,
    client: &mut LeaderClient,
    observed: &Observed,
    args: &Args,
) -> anyhow::Result<()> {
    let old = client.status().await?.leader_id;
    let deployments_before: u32 = observed.lock().values().map(|o| o.deployments).sum();
    let node = cluster.nodes.get_mut(&old).ok_or_else(|| anyhow::anyhow!("no process for leader {old}"))?;
    node.kill9()?;
    let killed = Instant::now();
    let all_again = until("every job to complete a checkpoint under the new leader", async || {
        let table = observed.lock();
        let firsts: Vec<Duration> = table
            .values()
            .filter_map(|o| o.completions.iter().find(|c| c.at > killed).map(|c| c.at - killed))
            .collect();
        (firsts.len() >= args.jobs).then_some(firsts)
    })
    .await;
    let firsts = match all_again {
        Ok(f) => f,
        Err(error) => {
            let table = observed.lock();
            let done = table.values().filter(|o| o.completions.iter().any(|c| c.at > killed)).count();
            anyhow::bail!("{error}: {done} of {} jobs checkpointed again", args.jobs);
        }
    };
    let mut h = Histogram::<u64>::new(3)?;
    for f in &firsts {
        h.record(f.as_millis() as u64)?;
    }
    let status = client.status().await?;
    let deployments_after: u32 = observed.lock().values().map(|o| o.deployments).sum();
    println!("--- leader {old} SIGKILLed; new leader {} (term {})", status.leader_id, status.term);
    println!("kill -> each job's first checkpoint under the new leader: {}", quantiles(&h));
    println!(
        "every job checkpointing again {} ms after the kill; jobs redeployed (restarted): {}",
        h.max(),
        deployments_after.saturating_sub(deployments_before)
    );
    Ok(())
}
