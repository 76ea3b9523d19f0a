//! The workload of a trial, run by the driver through the replicas' gRPC APIs: concurrent
//! checkpoint-ID allocations, savepoints through the admin API, and a sampler of the leader's
//! view of replication (what each replica acknowledged).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_client::{AuthChannel, ClientConfig, ClientError, LeaderClient};
use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{ClusterStatusRequest, TriggerSavepointRequest};
use tokio::task::JoinSet;
use tonic::Status;

use super::history::Allocation;

/// Runs one admin call through a leader-following client.
pub async fn admin<T, F, Fut>(client: &mut LeaderClient, mut f: F) -> Result<T, ClientError>
where
    F: FnMut(AdminClient<AuthChannel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    client
        .call("admin call", move |channel| {
            let fut = f(AdminClient::new(channel));
            async move { fut.await.map(tonic::Response::into_inner) }
        })
        .await
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The leader's view of replication at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub leader: u64,
    pub term: u64,
    pub commit_index: u64,
    /// Highest log index each replica acknowledged, by node id (the leader's own: what it
    /// flushed).
    pub matched: BTreeMap<u64, u64>,
}

/// An acknowledged savepoint.
#[derive(Debug, Clone)]
pub struct AckedSavepoint {
    pub id: u64,
    pub path: String,
}

/// What the workload recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Acknowledged allocations by job.
    pub allocations: BTreeMap<String, Vec<Allocation>>,
    pub savepoints: Vec<AckedSavepoint>,
    pub samples: Vec<Sample>,
    pub failed_calls: u64,
}

impl Recorded {
    /// The last sample taken before `instant`.
    pub fn sample_before(&self, instant: Instant) -> Option<&Sample> {
        self.samples.iter().rev().find(|s| s.at < instant)
    }

    /// The latest sample.
    pub fn latest_sample(&self) -> Option<&Sample> {
        self.samples.last()
    }
}

/// A running workload.
pub struct Workload {
    recorded: Arc<Mutex<Recorded>>,
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
    /// Successful allocations per client (for "each client made progress since").
    progress: Arc<Vec<AtomicU64>>,
}

/// How the workload runs.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub endpoints: Vec<String>,
    pub token: String,
    /// Allocation jobs (registered without a graph); client `i` uses job `i % len`.
    pub alloc_jobs: Vec<String>,
    pub clients: usize,
    pub client_pause: Duration,
    /// The job savepoints are taken of, and the pause between two.
    pub savepoint_job: String,
    pub savepoint_every: Duration,
}

fn client_config(token: &str, deadline: Duration, attempt: Duration) -> ClientConfig {
    ClientConfig {
        token: Some(token.to_owned()),
        deadline,
        attempt_timeout: attempt,
        ..ClientConfig::default()
    }
}

impl Workload {
    pub fn start(config: &WorkloadConfig) -> anyhow::Result<Workload> {
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let progress: Arc<Vec<AtomicU64>> =
            Arc::new((0..config.clients).map(|_| AtomicU64::new(0)).collect());
        let mut tasks = JoinSet::new();
        for client_index in 0..config.clients {
            let job = config.alloc_jobs[client_index % config.alloc_jobs.len()].clone();
            let mut client = LeaderClient::new(
                &config.endpoints,
                client_config(&config.token, Duration::from_secs(10), Duration::from_secs(2)),
            )?;
            let (recorded, stop, progress, pause) =
                (recorded.clone(), stop.clone(), progress.clone(), config.client_pause);
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let invoked = Instant::now();
                    match client.allocate_checkpoint_id(&job).await {
                        Ok(reply) => {
                            let acked = Instant::now();
                            let allocation =
                                Allocation { client: client_index, id: reply.checkpoint_id, invoked, acked };
                            lock(&recorded).allocations.entry(job.clone()).or_default().push(allocation);
                            progress[client_index].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            tracing::debug!(client = client_index, %error, "allocation failed");
                            lock(&recorded).failed_calls += 1;
                        }
                    }
                    tokio::time::sleep(pause).await;
                }
            });
        }
        {
            let mut client = LeaderClient::new(
                &config.endpoints,
                client_config(&config.token, Duration::from_secs(20), Duration::from_secs(20)),
            )?;
            let (recorded, stop, job, every) =
                (recorded.clone(), stop.clone(), config.savepoint_job.clone(), config.savepoint_every);
            tasks.spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(every).await;
                    n += 1;
                    let request = TriggerSavepointRequest {
                        job_id: job.clone(),
                        target_dir: String::new(),
                        request_id: format!("powerloss-sp-{n}"),
                    };
                    let result = admin(&mut client, |mut a| {
                        let request = request.clone();
                        async move { a.trigger_savepoint(request).await }
                    })
                    .await;
                    match result {
                        Ok(reply) => lock(&recorded)
                            .savepoints
                            .push(AckedSavepoint { id: reply.checkpoint_id, path: reply.path }),
                        Err(error) => {
                            tracing::debug!(%error, "savepoint failed");
                            lock(&recorded).failed_calls += 1;
                        }
                    }
                }
            });
        }
        {
            let mut client = LeaderClient::new(
                &config.endpoints,
                client_config(&config.token, Duration::from_millis(500), Duration::from_millis(500)),
            )?;
            let (recorded, stop) = (recorded.clone(), stop.clone());
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let status =
                        admin(
                            &mut client,
                            |mut a| async move { a.cluster_status(ClusterStatusRequest {}).await },
                        )
                        .await;
                    if let Ok(status) = status {
                        let matched =
                            status.nodes.iter().filter_map(|n| n.matched_index.map(|m| (n.id, m))).collect();
                        lock(&recorded).samples.push(Sample {
                            at,
                            leader: status.leader_id,
                            term: status.term,
                            commit_index: status.commit_index,
                            matched,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
        Ok(Workload { recorded, stop, tasks, progress })
    }

    /// Reads what was recorded so far.
    pub fn with_recorded<T>(&self, f: impl FnOnce(&Recorded) -> T) -> T {
        f(&lock(&self.recorded))
    }

    /// Successful allocations of each client so far.
    pub fn progress(&self) -> Vec<u64> {
        self.progress.iter().map(|p| p.load(Ordering::Relaxed)).collect()
    }

    /// Stops every task (calls in flight are abandoned: they were never acknowledged) and
    /// returns what was recorded.
    pub async fn stop(mut self) -> Recorded {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while !self.tasks.is_empty() {
            match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        std::mem::take(&mut *lock(&self.recorded))
    }
}
