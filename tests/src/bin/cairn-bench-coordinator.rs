//! Benchmarks of the checkpoint coordinator. Figures are printed, never asserted.
//!
//! 1. The core alone: acknowledgements processed per second with 1,000 and 10,000 tasks per
//!    checkpoint (events in, actions out, no I/O).
//! 2. Trigger-to-complete latency with 1,000 scripted tasks on a 3-node in-process cluster: the
//!    scripted worker acknowledges every task as soon as the trigger arrives; measured from the
//!    trigger's arrival at the worker to the completion notification (which follows the
//!    `_metadata` write and the Raft commit).
//!
//! ```text
//! cargo run --release -p cairn-tests --bin cairn-bench-coordinator -- [--checkpoints 20]
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cairn_coordinator::checkpoint::{
    Action, CheckpointCoordinatorCore, CoreConfig, Event, Now, Recovered, RequestId, TaskAttemptId,
    TaskDescriptor, TaskSet, TriggerKind,
};
use cairn_protocol::checkpoint::{MetadataPointer, SubtaskState, TaskCheckpointMetrics};
use cairn_protocol::messages::{TaskMessage, ToTask};
use cairn_raft::model::{CheckpointConfig, JobId, Outcome};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::scripted::{FromLeader, ScriptedWorker, attempt_id, report_all_running, subtasks};
use clap::Parser;
use hdrhistogram::Histogram;

/// mimalloc instead of glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Checkpoints per scenario.
    #[arg(long, default_value_t = 20)]
    checkpoints: u64,
    /// Tasks for the cluster scenario.
    #[arg(long, default_value_t = 1000)]
    cluster_tasks: u32,
}

fn core_with(n: u32) -> anyhow::Result<CheckpointCoordinatorCore> {
    let tasks = (0..n)
        .map(|i| TaskDescriptor {
            vertex: "v".into(),
            subtask: i,
            parallelism: n,
            max_parallelism: n,
            is_source: true,
            inputs: Vec::new(),
            attempt: TaskAttemptId(i as u64),
        })
        .collect();
    let config =
        CoreConfig::new(JobId::new("bench")?, CheckpointConfig::default(), PathBuf::from("/tmp/cairn-bench"));
    Ok(CheckpointCoordinatorCore::new(config, TaskSet::new(tasks)?, Recovered::default())?)
}

fn now() -> Now {
    Now::new(tokio::time::Instant::now(), 1)
}

/// Runs `checkpoints` checkpoints through the core; returns acks per second over the ack phase.
fn bench_core(n: u32, checkpoints: u64) -> anyhow::Result<f64> {
    let mut core = core_with(n)?;
    let mut acks = Duration::ZERO;
    for c in 0..checkpoints {
        let actions = core
            .handle(now(), Event::TriggerRequested { request: RequestId(c), kind: TriggerKind::Checkpoint });
        let token = actions
            .iter()
            .find_map(|a| if let Action::AllocateCheckpointId { token } = a { Some(*token) } else { None })
            .ok_or_else(|| anyhow::anyhow!("no allocation"))?;
        let id = c + 1;
        core.handle(now(), Event::CheckpointIdAllocated { token, checkpoint_id: id });
        let start = Instant::now();
        let mut last = Vec::new();
        for i in 0..n {
            last = core.handle(
                now(),
                Event::TaskAcknowledged {
                    attempt: TaskAttemptId(i as u64),
                    checkpoint_id: id,
                    state: SubtaskState::default(),
                    metrics: TaskCheckpointMetrics::default(),
                },
            );
        }
        acks += start.elapsed();
        let path = last
            .iter()
            .find_map(|a| if let Action::WriteMetadata { path, .. } = a { Some(path.clone()) } else { None })
            .ok_or_else(|| anyhow::anyhow!("checkpoint {id} did not finalize"))?;
        core.handle(
            now(),
            Event::MetadataWritten {
                checkpoint_id: id,
                pointer: MetadataPointer { path, size: 1, crc32: 1 },
            },
        );
        core.handle(
            now(),
            Event::CompletionCommitted {
                checkpoint_id: id,
                outcome: Outcome::Subsumed { checkpoints: vec![] },
            },
        );
    }
    Ok((n as u64 * checkpoints) as f64 / acks.as_secs_f64())
}

async fn bench_cluster(tasks: u32, checkpoints: u64) -> anyhow::Result<Histogram<u64>> {
    let cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(Duration::from_secs(30)).await?;
    let out = tempfile::tempdir()?;
    let graph = DemoJob {
        source: SourceConfig::default(),
        output_dir: out.path().display().to_string(),
        source_parallelism: tasks,
        parallelism: 1,
        max_parallelism: tasks,
    }
    .graph();
    // Periodic every 50 ms with one checkpoint in flight: each is measured end to end.
    let spec = serde_json::json!({ "graph": graph, "checkpoint": { "interval": "50ms" } });
    cluster.client()?.register_job("bench", &spec.to_string()).await?;
    let addrs: Vec<String> = cluster.addrs.values().map(|a| a.to_string()).collect();
    let mut w = ScriptedWorker::attach(
        &addrs,
        cluster.worker_token().expose(),
        "bench-worker",
        tasks + 8,
        vec![],
        Duration::from_secs(30),
    )
    .await?;
    let d = loop {
        if let FromLeader::Deploy(d) = w.next_non_heartbeat(Duration::from_secs(30)).await? {
            break *d;
        }
    };
    report_all_running(&w, &d).await?;
    let all = subtasks(&d)?;
    let mut h = Histogram::<u64>::new(3)?;
    let mut done = 0;
    while done < checkpoints {
        let trig = w
            .expect_command(Duration::from_secs(30), |c| matches!(c.body, ToTask::TriggerCheckpoint { .. }))
            .await?;
        let start = Instant::now();
        let ToTask::TriggerCheckpoint { checkpoint_id, .. } = trig.body else { continue };
        for (v, i) in &all {
            w.report(&TaskMessage::Acknowledge {
                task: attempt_id(&d, v, *i),
                checkpoint_id,
                state: SubtaskState::default(),
                metrics: TaskCheckpointMetrics::default(),
            })
            .await?;
        }
        w.expect_command(Duration::from_secs(30), |c| {
            matches!(c.body, ToTask::NotifyCheckpointComplete { checkpoint_id: id } if id == checkpoint_id)
        })
        .await?;
        h.record(start.elapsed().as_micros() as u64)?;
        done += 1;
    }
    cluster.shutdown().await;
    Ok(h)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    for n in [1_000u32, 10_000] {
        let rate = bench_core(n, args.checkpoints)?;
        println!(
            "core alone: {n:>6} tasks/checkpoint: {rate:>12.0} acks/s ({} checkpoints)",
            args.checkpoints
        );
    }
    let h = bench_cluster(args.cluster_tasks, args.checkpoints).await?;
    let ms = |v: u64| v as f64 / 1000.0;
    println!(
        "3-node cluster, {} scripted tasks: trigger-to-complete p50={:.1}ms p99={:.1}ms max={:.1}ms ({} checkpoints)",
        args.cluster_tasks,
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    );
    Ok(())
}
