//! Web console benchmark with real processes: three `cairn` replicas each serving the console,
//! one `cairn-worker`, 100 jobs registered (the demo job; as many run as the worker has slots,
//! checkpointing every second, the others wait for slots).
//!
//! Prints, per view of the leader's console: page load time (p50, p99, max over sequential
//! loads) and bytes per page (HTML, and its live-update fragment). Then the leader process's CPU
//! (from /proc, user + system) over a quiet window and over a window in which three "browsers"
//! poll the live fragments every 2 s (the console script's period), one on the cluster page, one
//! on the jobs page, one on a job's checkpoints; and, for each of those pages, over a window in
//! which three clients fetch it back to back (the leader CPU one poll costs). Figures are printed,
//! never asserted.
//!
//! ```text
//! cargo build --release --bins
//! cargo run --release -p cairn-tests --bin cairn-bench-console -- [--jobs 100] [--loads 30] [--window 20s]
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::http::get;
use cairn_tests::procs::{ProcCluster, ProcOptions};
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Parser)]
struct Args {
    /// Jobs registered.
    #[arg(long, default_value_t = 100)]
    jobs: usize,
    /// Sequential loads per view.
    #[arg(long, default_value_t = 30)]
    loads: usize,
    /// Length of each CPU window.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Task slots of the worker.
    #[arg(long, default_value_t = 16)]
    slots: u32,
}

const LIMIT: Duration = Duration::from_secs(120);
/// The console script's refresh period.
const POLL_EVERY: Duration = Duration::from_secs(2);

/// CPU seconds (user + system) a process has used so far; /proc reports USER_HZ (100) ticks.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Ok((ticks(11) + ticks(12)) as f64 / 100.0)
}

async fn cpu_percent_over(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let (c0, t0) = (cpu_seconds(pid)?, Instant::now());
    tokio::time::sleep(window).await;
    let (c1, t1) = (cpu_seconds(pid)?, Instant::now());
    Ok((c1 - c0) / (t1 - t0).as_secs_f64() * 100.0)
}

async fn load(
    at: SocketAddr,
    path: &str,
    fragment: bool,
    n: usize,
) -> anyhow::Result<(Histogram<u64>, usize)> {
    let mut h = Histogram::<u64>::new(3)?;
    let mut bytes = 0;
    let req = if fragment { get(path).header("x-cairn-fragment", "1") } else { get(path) };
    // One warm-up load.
    req.send(at).await?;
    for _ in 0..n {
        let t = Instant::now();
        let a = req.send(at).await?;
        h.record(t.elapsed().as_micros() as u64)?;
        anyhow::ensure!(a.status == 200, "{path}: status {}: {}", a.status, a.body);
        bytes = a.body.len();
    }
    Ok((h, bytes))
}

/// The leader's CPU while one client per path fetches its live fragment, every `every` (or back
/// to back), and the polls answered.
async fn poll_window(
    at: SocketAddr,
    pid: u32,
    paths: &[String],
    every: Option<Duration>,
    window: Duration,
) -> anyhow::Result<(f64, u64)> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pollers = Vec::new();
    for path in paths {
        let (stop, path) = (stop.clone(), path.clone());
        pollers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.unwrap_or(Duration::from_millis(1)));
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if every.is_some() {
                    tick.tick().await;
                }
                if get(&path).header("x-cairn-fragment", "1").send(at).await.is_ok_and(|a| a.status == 200) {
                    n += 1;
                }
            }
            n
        }));
    }
    let cpu = cpu_percent_over(pid, window).await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut polls = 0;
    for p in pollers {
        polls += p.await?;
    }
    Ok((cpu, polls))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cluster =
        ProcCluster::start_with_options(3, &[], ProcOptions { console: true, ..ProcOptions::default() })?;
    let output = cluster.scratch("out")?;
    cluster.launch_worker("w1", args.slots)?;
    let mut c = cluster.client()?;
    let graph = DemoJob {
        source: SourceConfig {
            keys: 16,
            records_per_key: None,
            rate_per_sec: Some(100),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 1,
        max_parallelism: 16,
    }
    .graph();
    for i in 0..args.jobs {
        let spec = serde_json::json!({ "graph": graph, "checkpoint": { "interval": "1s", "retained": 3 } });
        c.register_job(&format!("job-{i:03}"), &spec.to_string()).await?;
    }
    let status = c.status().await?;
    let leader = status.leader_id;
    let node = cluster.nodes.get(&leader).ok_or_else(|| anyhow::anyhow!("no leader process"))?;
    let pid = node.pid().ok_or_else(|| anyhow::anyhow!("leader not running"))?;
    let at: SocketAddr =
        node.console_addr.as_deref().ok_or_else(|| anyhow::anyhow!("no console"))?.parse()?;
    // Which jobs get the worker's slots is the leader's choice: measure the first running job
    // with some checkpoint history.
    let deadline = Instant::now() + LIMIT;
    let (job, latest) = loop {
        let jobs = get("/api/jobs").send(at).await?.json()?;
        let found = jobs["jobs"].as_array().and_then(|jobs| {
            jobs.iter()
                .find(|j| j["completed_checkpoints"].as_u64().unwrap_or(0) >= 10)
                .and_then(|j| Some((j["job_id"].as_str()?.to_owned(), j["latest_checkpoint_id"].as_u64()?)))
        });
        if let Some(found) = found {
            break found;
        }
        anyhow::ensure!(Instant::now() < deadline, "no job completed 10 checkpoints within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let jobs = get("/api/jobs").send(at).await?.json()?;
    let running =
        jobs["jobs"].as_array().map(|j| j.iter().filter(|j| j["status"] == "running").count()).unwrap_or(0);
    println!(
        "cairn-bench-console: 3 replicas (leader node {leader}, pid {pid}), worker w1 with {} slots, {} jobs registered, {running} running, 1s checkpoints",
        args.slots, args.jobs
    );

    println!("\npage load from the leader's console, {} sequential loads per view:", args.loads);
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "view", "p50 ms", "p99 ms", "max ms", "HTML B", "fragment B"
    );
    let views = [
        ("/cluster".to_owned(), true),
        ("/jobs".to_owned(), true),
        (format!("/jobs/{job}"), true),
        (format!("/jobs/{job}/checkpoints"), true),
        (format!("/jobs/{job}/checkpoints/{latest}"), true),
        ("/workers".to_owned(), true),
        ("/api/jobs".to_owned(), false),
        (format!("/api/jobs/{job}/checkpoints"), false),
    ];
    for (path, html) in &views {
        let (h, bytes) = load(at, path, false, args.loads).await?;
        let fragment = if *html { load(at, path, true, 1).await?.1.to_string() } else { "-".into() };
        println!(
            "{path:<34} {:>9.1} {:>9.1} {:>9.1} {bytes:>10} {fragment:>10}",
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
        );
    }

    println!("\nleader CPU (user + system, % of one core), {:?} windows:", args.window);
    let quiet = cpu_percent_over(pid, args.window).await?;
    println!("{:<50} {quiet:>6.1}%", "no browser (consoles only read the status)");
    let paths = ["/cluster".to_owned(), "/jobs".to_owned(), format!("/jobs/{job}/checkpoints")];
    let (polling, polls) = poll_window(at, pid, &paths, Some(POLL_EVERY), args.window).await?;
    println!("{:<50} {polling:>6.1}%  ({polls} polls)", "three browsers polling every 2 s");
    println!("{:<50} {:>6.1}%", "console cost on the leader", polling - quiet);
    // Three clients fetching one page back to back: what one poll of it costs the leader.
    for path in &paths {
        let three = [path.clone(), path.clone(), path.clone()];
        let (busy, polls) = poll_window(at, pid, &three, None, args.window).await?;
        let per_poll_ms = (busy - quiet) / 100.0 * args.window.as_secs_f64() * 1000.0 / polls.max(1) as f64;
        println!(
            "{:<50} {busy:>6.1}%  ({:.0} polls/s: {per_poll_ms:.3} ms of leader CPU per poll)",
            format!("three clients polling {path} back to back"),
            polls as f64 / args.window.as_secs_f64()
        );
    }
    drop(cluster);
    Ok(())
}
