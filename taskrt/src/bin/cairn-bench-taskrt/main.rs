//! Benchmarks of the task runtime with the demo job (sequence source → keyed counter → two-phase
//! commit file sink) deployed in-process and driven by the scripted coordinator. Figures are
//! printed, never asserted. Every run is bounded: a warm-up, then a fixed wall-clock window.
//!
//! 1. Records/s through the job (records into the sink tasks, from the task monitors) with an
//!    unbounded, unthrottled source: without checkpoints, and with a checkpoint every 100 ms; in
//!    one worker, and spread over two workers' data exchanges (loopback TCP between them).
//! 2. The synchronous-part pause per checkpoint and task (p50, p99, max), from the monitors'
//!    microsecond sync-pause counters (cross-checked against `sync_ms` of the acknowledgements).
//! 3. State bytes written per checkpoint (`bytes_persisted` of the acknowledgements, summed over
//!    the tasks), full versus incremental mode, with many keys; also the state size referenced.
//!    The unthrottled source touches every key between two checkpoints, so incremental mode can
//!    only save when fewer keys change: a throttled variant (`--throttled-rate`) shows that case.
//! 4. The asynchronous part of one keyed operator's snapshot (`keys` keys over `max_parallelism`
//!    key groups in one subtask), full and incremental: its duration, state files and fsyncs per
//!    snapshot, measured directly on the snapshot functions (see `keyed_snapshot`).
//! 5. Stream elements/s through `--link-channels` channels at once: within one worker (bounded
//!    channels) versus between two workers' data exchanges over loopback TCP (see `channel_link`).
//! 6. Checkpoints under backpressure: the sink takes `--backpressure-sink-rate` records/s per
//!    subtask while the source emits as fast as it can, so every channel is full. Trigger to
//!    completion, aligned versus unaligned, in one worker and over two; and the in-flight records
//!    an unaligned checkpoint persists (bytes of channel state per checkpoint).
//!
//! ```text
//! cargo run --release -p cairn-taskrt --bin cairn-bench-taskrt -- [--window-secs 10] [--keys 10000]
//! cargo run --release -p cairn-taskrt --bin cairn-bench-taskrt -- --snapshot-only
//! cargo run --release -p cairn-taskrt --bin cairn-bench-taskrt -- --link-only [--link-channels 4]
//! cargo run --release -p cairn-taskrt --bin cairn-bench-taskrt -- --backpressure-only
//! ```

mod channel_link;
mod keyed_snapshot;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cairn_protocol::assign::StateAssignment;
use cairn_protocol::graph::JobGraph;
use cairn_taskrt::checkpoint::pool::SnapshotPool;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::metrics::{TaskCounters, TaskMonitor};
use cairn_taskrt::network::{ExchangeKey, ExchangeService, NetworkOptions};
use cairn_taskrt::registry::OperatorRegistry;
use cairn_taskrt::runtime::{JobDeployment, LocalJob, Placement, RuntimeOptions};
use cairn_taskrt::state::storage::CheckpointStorage;
use cairn_taskrt::testkit::{Event, ScriptedCoordinator};
use clap::Parser;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::prelude::*;

/// Set while a job is being killed: its tasks' complaints about closed channels are expected.
static TEARING_DOWN: AtomicBool = AtomicBool::new(false);

const SOURCE: &str = "source";
const COUNT: &str = "count";
const SINK: &str = "sink";
const VERTICES: [&str; 3] = [SOURCE, COUNT, SINK];

#[derive(Debug, Parser)]
#[command(name = "cairn-bench-taskrt", about = "Benchmarks of the task runtime with the demo job")]
struct Args {
    /// Measured wall-clock window of every run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    window_secs: f64,
    /// Warm-up before each window, in seconds (not measured).
    #[arg(long, default_value_t = 2.0)]
    warmup_secs: f64,
    /// Keys the source emits (`0..keys`); the counter keeps one keyed value per key.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Parallelism of the source.
    #[arg(long, default_value_t = 1)]
    source_parallelism: u32,
    /// Parallelism of the counter and the sink.
    #[arg(long, default_value_t = 2)]
    parallelism: u32,
    /// Max parallelism (number of key groups).
    #[arg(long, default_value_t = 128)]
    max_parallelism: u32,
    /// Checkpoint interval of the scripted coordinator, in milliseconds.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Records per source poll, at most.
    #[arg(long, default_value_t = 64)]
    batch: u64,
    /// Capacity of each data channel, in stream elements.
    #[arg(long, default_value_t = RuntimeOptions::default().channel_capacity)]
    channel_capacity: usize,
    /// Concurrent asynchronous snapshot parts.
    #[arg(long, default_value_t = 4)]
    snapshot_concurrency: usize,
    /// Records/s per source subtask for the throttled state-size runs (0: skip them).
    #[arg(long, default_value_t = 200)]
    throttled_rate: u64,
    /// Tokio worker threads (0: one per available core).
    #[arg(long, default_value_t = 0)]
    worker_threads: usize,
    /// Parent of the temporary storage and output directories (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Snapshots per mode in the keyed-snapshot scenario (4).
    #[arg(long, default_value_t = 20)]
    snapshot_rounds: u32,
    /// Keys updated between two incremental snapshots in the keyed-snapshot scenario (4).
    #[arg(long, default_value_t = 32)]
    snapshot_changed_keys: u64,
    /// Run only the keyed-snapshot scenario (4).
    #[arg(long)]
    snapshot_only: bool,
    /// Channels pumped at once in the channel scenario (5).
    #[arg(long, default_value_t = 4)]
    link_channels: u32,
    /// Run only the channel scenario (5).
    #[arg(long)]
    link_only: bool,
    /// Records/s per sink subtask in the backpressure scenario (6).
    #[arg(long, default_value_t = 2000)]
    backpressure_sink_rate: u64,
    /// Run only the backpressure scenario (6).
    #[arg(long)]
    backpressure_only: bool,
}

/// What one run deploys and measures.
#[derive(Debug, Clone, Copy)]
struct RunSpec {
    checkpoints: bool,
    incremental: bool,
    rate_per_sec: Option<u64>,
    /// Populate every key's state first (checkpoint, then restore the measured job from it).
    prefill: bool,
    /// Subtask `i` of every vertex on worker `i % 2` of two data exchanges (loopback TCP between
    /// them), instead of everything in one.
    split: bool,
    /// Records/s per sink subtask, at most (a slow sink: backpressure).
    sink_rate: Option<u64>,
    /// The checkpoints' `unaligned_after_ms` (`None`: aligned).
    unaligned_after_ms: Option<u64>,
}

/// Counter values of every task at one instant.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    sink_in: u64,
    source_out: u64,
}

/// Per-task counters at the previous completion, to turn sums into per-checkpoint figures.
#[derive(Debug, Clone, Copy, Default)]
struct Baseline {
    sync_micros: u64,
    acks: u64,
}

#[derive(Debug, Default)]
struct RunResult {
    window: Duration,
    sink_records: u64,
    source_records: u64,
    /// Checkpoints completed in the window.
    completed: Vec<u64>,
    /// Trigger to completion (metadata written) of the window's checkpoints, ms.
    durations_ms: Vec<u64>,
    /// Checkpoints aborted (declined or timed out) during the whole run.
    aborted: usize,
    /// Synchronous-part pause of one task for one checkpoint, µs, by vertex.
    sync_micros: BTreeMap<&'static str, Vec<u64>>,
    /// `sync_ms` of the acknowledgements of the window's checkpoints.
    sync_ms: Vec<u64>,
    /// Per checkpoint of the window: bytes persisted, summed over the tasks, by vertex.
    bytes: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Per checkpoint of the window: state size referenced, summed over the tasks, by vertex.
    state_size: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Delta of per-task sync-pause sums that covered more than one checkpoint (not sampled).
    skipped_sync_samples: usize,
    /// Per checkpoint of the window: bytes of in-flight records persisted, over all tasks.
    channel_bytes: BTreeMap<u64, u64>,
    /// The window's acknowledgements by vertex: (start delay, alignment, async part) in ms.
    phases_ms: BTreeMap<String, Vec<(u64, u64, u64)>>,
}

impl RunResult {
    fn sink_rate(&self) -> f64 {
        self.sink_records as f64 / self.window.as_secs_f64()
    }

    fn source_rate(&self) -> f64 {
        self.source_records as f64 / self.window.as_secs_f64()
    }

    fn all_sync_micros(&self) -> Vec<u64> {
        self.sync_micros.values().flatten().copied().collect()
    }

    /// Per checkpoint totals (all vertices, or one).
    fn per_checkpoint(map: &BTreeMap<u64, BTreeMap<String, u64>>, vertex: Option<&str>) -> Vec<u64> {
        map.values()
            .map(|by_vertex| match vertex {
                Some(v) => by_vertex.get(v).copied().unwrap_or(0),
                None => by_vertex.values().sum(),
            })
            .collect()
    }
}

struct Monitors(Vec<(&'static str, TaskMonitor)>);

impl Monitors {
    fn of(job: &LocalJob) -> Self {
        Self(
            job.tasks()
                .iter()
                .map(|t| {
                    let vertex = VERTICES.iter().copied().find(|v| *v == t.id.task.vertex).unwrap_or("other");
                    (vertex, t.monitor.clone())
                })
                .collect(),
        )
    }

    fn sample(&self) -> Sample {
        let sum = |vertex: &str, f: fn(&TaskCounters) -> u64| -> u64 {
            self.0.iter().filter(|(v, _)| *v == vertex).map(|(_, m)| f(&m.counters)).sum()
        };
        Sample {
            at: Instant::now(),
            sink_in: sum(SINK, |c| TaskCounters::get(&c.records_in)),
            source_out: sum(SOURCE, |c| TaskCounters::get(&c.records_out)),
        }
    }

    fn baselines(&self) -> Vec<Baseline> {
        self.0
            .iter()
            .map(|(_, m)| Baseline {
                sync_micros: TaskCounters::get(&m.counters.sync_pause_micros),
                acks: TaskCounters::get(&m.counters.checkpoints_acknowledged),
            })
            .collect()
    }
}

/// Sorted copy.
fn sorted(values: &[u64]) -> Vec<u64> {
    let mut v = values.to_vec();
    v.sort_unstable();
    v
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn mean(values: &[u64]) -> f64 {
    if values.is_empty() { 0.0 } else { values.iter().sum::<u64>() as f64 / values.len() as f64 }
}

fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{v:.0} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

fn micros(us: u64) -> String {
    if us >= 10_000 { format!("{:.1} ms", us as f64 / 1000.0) } else { format!("{us} µs") }
}

/// Kills a job abruptly (as `LocalJob::kill` does) and lets its aborted tasks and in-flight
/// asynchronous parts wind down, without logging what they say about their closed channels.
async fn kill(job: LocalJob) {
    TEARING_DOWN.store(true, Ordering::Relaxed);
    job.kill();
    tokio::time::sleep(Duration::from_millis(200)).await;
    TEARING_DOWN.store(false, Ordering::Relaxed);
}

async fn run(args: &Args, spec: RunSpec) -> anyhow::Result<RunResult> {
    let dir = match &args.dir {
        Some(parent) => tempfile::Builder::new().prefix("cairn-bench-taskrt").tempdir_in(parent),
        None => tempfile::Builder::new().prefix("cairn-bench-taskrt").tempdir(),
    }
    .context("creating a temporary directory")?;
    let output = dir.path().join("out");
    let storage = CheckpointStorage::new(dir.path().join("checkpoints"), "bench");
    let demo = |source: SourceConfig| DemoJob {
        source,
        output_dir: output.to_string_lossy().into_owned(),
        source_parallelism: args.source_parallelism,
        parallelism: args.parallelism,
        max_parallelism: args.max_parallelism,
    };
    let exchanges = if spec.split {
        let local = "127.0.0.1:0".parse()?;
        Some([
            ExchangeService::bind(local, "bench-a", NetworkOptions::default()).await?,
            ExchangeService::bind(local, "bench-b", NetworkOptions::default()).await?,
        ])
    } else {
        None
    };
    let deploy = |graph: &JobGraph, attempt: u32, restore: Option<StateAssignment>| {
        let d = JobDeployment {
            job_id: "bench".into(),
            graph: graph.clone(),
            attempt,
            storage: storage.clone(),
            restore,
            options: RuntimeOptions {
                channel_capacity: args.channel_capacity,
                incremental: spec.incremental,
                ..RuntimeOptions::default()
            },
        };
        let registry = OperatorRegistry::with_builtins();
        let pool = SnapshotPool::new(args.snapshot_concurrency);
        let Some(workers) = &exchanges else {
            return LocalJob::deploy(d, &registry, pool).context("deploying the demo job");
        };
        let placement = Placement {
            subtasks: graph
                .vertices
                .iter()
                .flat_map(|v| {
                    (0..v.parallelism)
                        .map(move |i| ((v.id.clone(), i), workers[(i % 2) as usize].worker_id().to_owned()))
                })
                .collect(),
            addresses: workers.iter().map(|w| (w.worker_id().to_owned(), w.local_addr())).collect(),
            key: ExchangeKey::generate(),
        };
        let mut job = LocalJob::deploy_placed(d.clone(), &registry, pool.clone(), &placement, &workers[0])
            .context("deploying the demo job's first part")?;
        job.absorb(
            LocalJob::deploy_placed(d, &registry, pool, &placement, &workers[1])
                .context("deploying the demo job's second part")?,
        );
        Ok(job)
    };
    let source = SourceConfig {
        keys: args.keys,
        records_per_key: None,
        rate_per_sec: spec.rate_per_sec,
        batch: args.batch,
        idle_after_limit: false,
    };
    let mut graph = demo(source.clone()).graph();
    if let Some(rate) = spec.sink_rate
        && let Some(sink) = graph.vertices.iter_mut().find(|v| v.id == SINK)
    {
        sink.operator.config["max_records_per_sec"] = rate.into();
    }
    let mut coordinator = ScriptedCoordinator::new("bench", storage.clone(), &graph);
    coordinator.interval = Duration::from_millis(args.interval_ms.max(1));
    coordinator.periodic = spec.checkpoints;
    coordinator.options.unaligned_after_ms = spec.unaligned_after_ms;
    let mut job = if spec.prefill {
        // One record per key, unthrottled, checkpointed; then the measured job restores from that
        // checkpoint, so every key has keyed state even if the measured source is slow.
        let prefill = demo(SourceConfig {
            records_per_key: Some(1),
            rate_per_sec: None,
            idle_after_limit: true,
            ..source
        })
        .graph();
        let mut job = deploy(&prefill, 0, None)?;
        let monitors = Monitors::of(&job);
        let keys = args.keys;
        let mut emitted_at = None;
        coordinator
            .drive_until(&mut job, Duration::from_secs(120), |c| {
                if emitted_at.is_none() && monitors.sample().source_out >= keys {
                    emitted_at = Some(c.completed_count());
                }
                // The checkpoint pending when the source finished may predate its last records.
                emitted_at.is_some_and(|n| c.completed_count() >= n + 2)
            })
            .await
            .context("prefilling the keyed state")?;
        kill(job).await;
        coordinator.events.clear();
        let restore = coordinator.restore(&graph).transpose().context("assigning the prefilled state")?;
        deploy(&graph, 1, restore)?
    } else {
        deploy(&graph, 0, None)?
    };
    let monitors = Monitors::of(&job);

    let warmup = Duration::from_secs_f64(args.warmup_secs);
    let window = Duration::from_secs_f64(args.window_secs);
    let start = Instant::now();
    let window_start = start + warmup;
    let window_end = window_start + window;
    let mut result = RunResult::default();

    let (first, last) = if spec.checkpoints {
        // Everything is observed from the coordinator's goal check, which runs after every event
        // (and so right after a completion, before the next trigger can be sent).
        let mut first: Option<Sample> = None;
        let mut last: Option<Sample> = None;
        let mut completed_seen = 0;
        let mut baselines = monitors.baselines();
        let mut window_ids = BTreeSet::new();
        let goal = |c: &ScriptedCoordinator| -> bool {
            let now = Instant::now();
            if first.is_none() && now >= window_start {
                first = Some(monitors.sample());
            }
            if c.completed_count() != completed_seen {
                completed_seen = c.completed_count();
                let current = monitors.baselines();
                for (i, (before, after)) in baselines.iter().zip(&current).enumerate() {
                    if first.is_none() {
                        continue;
                    }
                    if after.acks == before.acks + 1 {
                        let vertex = monitors.0[i].0;
                        result
                            .sync_micros
                            .entry(vertex)
                            .or_default()
                            .push(after.sync_micros - before.sync_micros);
                    } else {
                        result.skipped_sync_samples += 1;
                    }
                }
                baselines = current;
                if first.is_some()
                    && let Some(meta) = c.latest_completed()
                {
                    window_ids.insert(meta.checkpoint_id);
                    result.durations_ms.push(meta.completion_time_ms.saturating_sub(meta.trigger_time_ms));
                }
            }
            if now >= window_end {
                last = Some(monitors.sample());
                return true;
            }
            false
        };
        coordinator
            .drive_until(&mut job, warmup + window + Duration::from_secs(60), goal)
            .await
            .context("driving checkpoints")?;
        result.completed = window_ids.iter().copied().collect();
        for e in &coordinator.events {
            match e {
                Event::Acknowledged { checkpoint_id, task, metrics }
                    if window_ids.contains(checkpoint_id) =>
                {
                    let vertex = task.task.vertex.clone();
                    *result.bytes.entry(*checkpoint_id).or_default().entry(vertex.clone()).or_default() +=
                        metrics.bytes_persisted;
                    *result.state_size.entry(*checkpoint_id).or_default().entry(vertex).or_default() +=
                        metrics.state_size;
                    *result.channel_bytes.entry(*checkpoint_id).or_default() += metrics.channel_state_bytes;
                    result.sync_ms.push(metrics.sync_ms);
                    result.phases_ms.entry(task.task.vertex.clone()).or_default().push((
                        metrics.start_delay_ms,
                        metrics.alignment_ms,
                        metrics.async_ms,
                    ));
                }
                Event::Aborted { .. } => result.aborted += 1,
                _ => {}
            }
        }
        (first.context("no window start")?, last.context("no window end")?)
    } else {
        tokio::time::sleep_until(window_start.into()).await;
        let first = monitors.sample();
        tokio::time::sleep_until(window_end.into()).await;
        (first, monitors.sample())
    };
    result.window = last.at - first.at;
    result.sink_records = last.sink_in - first.sink_in;
    result.source_records = last.source_out - first.source_out;

    kill(job).await;
    dir.close().context("removing the temporary directory")?;
    Ok(result)
}

fn print_throughput(label: &str, r: &RunResult) {
    println!(
        "  {label:<28} {:>12.0} records/s into the sink   (source emitted {:.0}/s; {} records in {:.2} s)",
        r.sink_rate(),
        r.source_rate(),
        r.sink_records,
        r.window.as_secs_f64()
    );
}

fn print_checkpoint_rate(r: &RunResult) {
    let n = r.completed.len();
    let per_sec = n as f64 / r.window.as_secs_f64();
    let d = sorted(&r.durations_ms);
    println!(
        "  {:<28} {n} checkpoints completed in the window ({per_sec:.1}/s, one every {:.0} ms on average; \
         trigger->complete p50 {} ms, max {} ms), {} aborted in the run",
        "",
        if per_sec > 0.0 { 1000.0 / per_sec } else { 0.0 },
        percentile(&d, 50.0),
        d.last().copied().unwrap_or(0),
        r.aborted
    );
}

fn print_sync(r: &RunResult) {
    let line = |label: &str, values: &[u64]| {
        let s = sorted(values);
        println!(
            "  {label:<28} p50 {:>9}   p99 {:>9}   max {:>9}   (n={})",
            micros(percentile(&s, 50.0)),
            micros(percentile(&s, 99.0)),
            micros(s.last().copied().unwrap_or(0)),
            s.len()
        );
    };
    line("all tasks", &r.all_sync_micros());
    for v in VERTICES {
        if let Some(values) = r.sync_micros.get(v) {
            line(&format!("{v} tasks"), values);
        }
    }
    let ms = sorted(&r.sync_ms);
    println!(
        "  {:<28} p50 {:>6} ms   p99 {:>6} ms   max {:>6} ms   (n={}, whole ms)",
        "ack sync_ms cross-check",
        percentile(&ms, 50.0),
        percentile(&ms, 99.0),
        ms.last().copied().unwrap_or(0),
        ms.len()
    );
    if r.skipped_sync_samples > 0 {
        println!(
            "  ({} task samples spanned more than one checkpoint and were skipped)",
            r.skipped_sync_samples
        );
    }
}

fn print_bytes(label: &str, r: &RunResult) {
    let total = RunResult::per_checkpoint(&r.bytes, None);
    let s = sorted(&total);
    println!(
        "  {label:<34} written/checkpoint: avg {:>10}  p50 {:>10}   (n={})",
        human_bytes(mean(&total)),
        human_bytes(percentile(&s, 50.0) as f64),
        s.len()
    );
    let parts: Vec<String> = VERTICES
        .iter()
        .map(|v| {
            let values = RunResult::per_checkpoint(&r.bytes, Some(v));
            format!("{v} avg {}", human_bytes(mean(&values)))
        })
        .collect();
    println!("  {:<34}   by vertex: {}", "", parts.join(", "));
    let size = RunResult::per_checkpoint(&r.state_size, None);
    let keyed = RunResult::per_checkpoint(&r.state_size, Some(COUNT));
    println!(
        "  {:<34}   state referenced/checkpoint: avg {} (keyed counter state: avg {}, last {})",
        "",
        human_bytes(mean(&size)),
        human_bytes(mean(&keyed)),
        human_bytes(keyed.last().copied().unwrap_or(0) as f64)
    );
}

fn print_snapshot_rounds(label: &str, rounds: &[keyed_snapshot::Round]) {
    if rounds.is_empty() {
        println!("  {label:<34} (no rounds)");
        return;
    }
    let async_us: Vec<u64> = rounds.iter().map(|r| r.async_part.as_micros() as u64).collect();
    let sync_us: Vec<u64> = rounds.iter().map(|r| r.sync_part.as_micros() as u64).collect();
    let (a, s) = (sorted(&async_us), sorted(&sync_us));
    let per = |f: fn(&keyed_snapshot::Round) -> u64| mean(&rounds.iter().map(f).collect::<Vec<_>>());
    println!(
        "  {label:<34} async part p50 {:>9}  max {:>9}   fsyncs {:>6.1}   state files {:>6.1}   written {:>10}   (sync part p50 {}, n={})",
        micros(percentile(&a, 50.0)),
        micros(a.last().copied().unwrap_or(0)),
        per(|r| r.fsyncs),
        per(|r| r.files),
        human_bytes(per(|r| r.bytes_persisted)),
        micros(percentile(&s, 50.0)),
        rounds.len()
    );
}

fn print_keyed_snapshot(args: &Args, full: &keyed_snapshot::ModeResult, inc: &keyed_snapshot::ModeResult) {
    println!(
        "4. Asynchronous part of one keyed operator's snapshot: {} keys over {} key groups in one subtask, \
         {} snapshots per mode (per snapshot: duration, fsyncs of files and directories, state files, bytes)",
        args.keys, args.max_parallelism, args.snapshot_rounds
    );
    print_snapshot_rounds("full", &full.rounds);
    print_snapshot_rounds("incremental, first (all groups)", &inc.rounds[..inc.rounds.len().min(1)]);
    let later = inc.rounds.get(1..).unwrap_or(&[]);
    let changed = mean(&later.iter().map(|r| r.changed_groups as u64).collect::<Vec<_>>());
    print_snapshot_rounds(&format!("incremental, {} keys changed", args.snapshot_changed_keys), later);
    println!("  {:<34}   ({changed:.1} key groups changed per snapshot on average)", "");
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cairn-bench-taskrt: demo job source(p={}) -hash-> keyed counter(p={}) -forward-> 2PC file sink(p={}); \
         keys={} max_parallelism={} batch={} channel_capacity={} snapshot_concurrency={}; \
         checkpoint interval={} ms; per run: warm-up {} s + window {} s; throttled rate={}/s per source subtask",
        args.source_parallelism,
        args.parallelism,
        args.parallelism,
        args.keys,
        args.max_parallelism,
        args.batch,
        args.channel_capacity,
        args.snapshot_concurrency,
        args.interval_ms,
        args.warmup_secs,
        args.window_secs,
        args.throttled_rate,
    );
    println!(
        "machine: {cores} cores, tokio worker threads: {}, storage under {}",
        if args.worker_threads == 0 { cores } else { args.worker_threads },
        args.dir.clone().unwrap_or_else(std::env::temp_dir).display()
    );

    if args.link_only {
        println!();
        return print_channel_link(&args).await;
    }

    let unthrottled = |checkpoints, incremental| RunSpec {
        checkpoints,
        incremental,
        rate_per_sec: None,
        prefill: false,
        split: false,
        sink_rate: None,
        unaligned_after_ms: None,
    };
    if args.backpressure_only {
        println!();
        return print_backpressure(&args, unthrottled(true, false)).await;
    }

    let snapshot_params = keyed_snapshot::Params {
        keys: args.keys,
        max_parallelism: args.max_parallelism,
        rounds: args.snapshot_rounds,
        changed_keys: args.snapshot_changed_keys,
        dir: args.dir.clone(),
    };
    let (snap_full, snap_inc) =
        tokio::task::spawn_blocking(move || keyed_snapshot::run(&snapshot_params)).await??;
    if args.snapshot_only {
        println!();
        print_keyed_snapshot(&args, &snap_full, &snap_inc);
        return Ok(());
    }

    let none = run(&args, unthrottled(false, false)).await?;
    let full = run(&args, unthrottled(true, false)).await?;
    let incremental = run(&args, unthrottled(true, true)).await?;
    let split = |checkpoints| RunSpec { split: true, ..unthrottled(checkpoints, false) };
    let split_none = run(&args, split(false)).await?;
    let split_full = run(&args, split(true)).await?;
    let throttled = if args.throttled_rate > 0 {
        let spec = |incremental| RunSpec {
            checkpoints: true,
            incremental,
            rate_per_sec: Some(args.throttled_rate),
            prefill: true,
            split: false,
            sink_rate: None,
            unaligned_after_ms: None,
        };
        Some((run(&args, spec(false)).await?, run(&args, spec(true)).await?))
    } else {
        None
    };

    println!();
    println!("1. Throughput (unbounded, unthrottled source; records into the sink tasks over the window)");
    print_throughput("no checkpoints", &none);
    print_throughput(&format!("checkpoints every {} ms", args.interval_ms), &full);
    print_checkpoint_rate(&full);
    print_throughput("same, incremental mode", &incremental);
    print_checkpoint_rate(&incremental);
    print_throughput("over 2 workers, no ckpts", &split_none);
    print_throughput("over 2 workers, checkpoints", &split_full);
    print_checkpoint_rate(&split_full);
    println!(
        "  (over 2 workers: subtask i of every vertex on worker i % 2, the hash exchange crossing their loopback TCP link)"
    );
    println!(
        "  (without checkpoints the sink only buffers in memory; with them it fsyncs a pending file per checkpoint)"
    );

    println!();
    println!(
        "2. Synchronous-part pause per checkpoint and task (full mode, unthrottled, every {} ms; µs monitor counters)",
        args.interval_ms
    );
    print_sync(&full);

    println!();
    println!(
        "3. State bytes written per checkpoint (bytes_persisted summed over all tasks), {} keys",
        args.keys
    );
    print_bytes("full, unthrottled", &full);
    print_bytes("incremental, unthrottled", &incremental);
    if let Some((tf, ti)) = &throttled {
        print_bytes(&format!("full, throttled {}/s", args.throttled_rate), tf);
        print_bytes(&format!("incremental, throttled {}/s", args.throttled_rate), ti);
    }

    println!();
    print_keyed_snapshot(&args, &snap_full, &snap_inc);
    println!();
    print_channel_link(&args).await?;
    println!();
    print_backpressure(&args, unthrottled(true, false)).await
}

/// Scenario 6: aligned versus unaligned checkpoints behind a slow sink.
async fn print_backpressure(args: &Args, base: RunSpec) -> anyhow::Result<()> {
    let spec = |split, unaligned_after_ms| RunSpec {
        split,
        sink_rate: Some(args.backpressure_sink_rate),
        unaligned_after_ms,
        ..base
    };
    let mut runs = Vec::new();
    for (label, split, unaligned) in [
        ("one worker, aligned", false, None),
        ("one worker, unaligned", false, Some(0)),
        ("over 2 workers, aligned", true, None),
        ("over 2 workers, unaligned", true, Some(0)),
    ] {
        runs.push((label, run(args, spec(split, unaligned)).await?));
    }
    println!(
        "6. Checkpoints under backpressure (sink at {}/s per subtask, unthrottled source, channel capacity {}, every {} ms)",
        args.backpressure_sink_rate, args.channel_capacity, args.interval_ms
    );
    for (label, r) in &runs {
        let d = sorted(&r.durations_ms);
        let channel: Vec<u64> = r.channel_bytes.values().copied().collect();
        let c = sorted(&channel);
        println!(
            "  {label:<28} trigger->complete p50 {:>6} ms  p99 {:>6} ms  max {:>6} ms  ({} completed, {} aborted)   \
             in-flight data/checkpoint avg {:>9}  p50 {:>9}  max {:>9}   sink {:.0} records/s",
            percentile(&d, 50.0),
            percentile(&d, 99.0),
            d.last().copied().unwrap_or(0),
            r.completed.len(),
            r.aborted,
            human_bytes(mean(&channel)),
            human_bytes(percentile(&c, 50.0) as f64),
            human_bytes(c.last().copied().unwrap_or(0) as f64),
            r.sink_rate(),
        );
        for (vertex, phases) in &r.phases_ms {
            let p50 = |pick: fn(&(u64, u64, u64)) -> u64| {
                percentile(&sorted(&phases.iter().map(pick).collect::<Vec<_>>()), 50.0)
            };
            println!(
                "      {vertex:<14} p50 start delay {:>5} ms  alignment {:>5} ms  async part {:>5} ms",
                p50(|p| p.0),
                p50(|p| p.1),
                p50(|p| p.2),
            );
        }
    }
    Ok(())
}

async fn print_channel_link(args: &Args) -> anyhow::Result<()> {
    let p = channel_link::Params {
        channels: args.link_channels.max(1),
        capacity: args.channel_capacity,
        warmup: Duration::from_secs_f64(args.warmup_secs),
        window: Duration::from_secs_f64(args.window_secs),
    };
    let local = channel_link::in_process(p).await?;
    let remote = channel_link::over_loopback(p).await?;
    println!(
        "5. Stream elements/s through {} channels at once (records of 24 bytes, capacity {})",
        p.channels, p.capacity
    );
    println!("  within one worker (bounded channels):        {:>12.0}/s", local.elements_per_sec);
    println!("  between two workers (loopback TCP, credit):  {:>12.0}/s", remote.elements_per_sec);
    println!("  ratio remote/local: {:.2}", remote.elements_per_sec / local.elements_per_sec.max(1.0));
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.window_secs > 0.0 && args.warmup_secs >= 0.0, "window must be positive");
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(env)
                .with_filter(filter_fn(|_| !TEARING_DOWN.load(Ordering::Relaxed))),
        )
        .try_init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if args.worker_threads > 0 {
        builder.worker_threads(args.worker_threads);
    }
    let runtime = builder.enable_all().build().context("building the tokio runtime")?;
    runtime.block_on(bench(args))
}
