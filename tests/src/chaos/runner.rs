//! One chaos run from start to verdict: find the compose project's containers and the demo
//! job, start the observer, inject the scheduled faults one after another (each after the
//! cluster recovered from the previous one, or the recovery bound passed), heal everything,
//! stop the job with a savepoint, verify its output, and check the invariants.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use cairn_proto::v1::{TriggerCheckpointRequest, TriggerKind};
use cairn_protocol::checkpoint::layout::METADATA_FILE;
use cairn_protocol::checkpoint::read_metadata_unverified;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_taskrt::demo::{SINK_KIND, SOURCE_KIND, source_offsets};
use tokio::sync::watch;
use tokio::time::Instant;

use super::cluster::Topology;
use super::history::{FaultRecord, FinalCheck, History, now_ms};
use super::invariants::{Verdict, check_all};
use super::nemesis;
use super::observer::{self, HostPaths, Progress};
use super::probe::Probe;
use super::report::render;
use super::schedule::{FaultKind, PlannedFault, Schedule};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The compose project name (`docker-compose -p`).
    pub project: String,
    pub job: String,
    /// The cluster's admin token.
    pub token: String,
    pub schedule: Schedule,
    /// Run the whole schedule (`--quick`), instead of faults until `duration` passed.
    pub whole_schedule: bool,
    pub duration: Duration,
    /// A fault not followed by a completed checkpoint within this long fails liveness.
    pub recovery_bound: Duration,
    /// The command line that replays this run.
    pub replay: String,
}

/// What a run produced.
pub struct Outcome {
    pub history: History,
    pub verdicts: Vec<Verdict>,
    pub report: String,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(Verdict::passed)
    }
}

/// Progress lines while the run goes (the report comes at the end).
fn say(started: Instant, msg: impl AsRef<str>) {
    eprintln!("[cairn-chaos +{:>6.1}s] {}", started.elapsed().as_secs_f64(), msg.as_ref());
}

pub async fn run(cfg: &RunConfig) -> anyhow::Result<Outcome> {
    let t0 = Instant::now();
    let started_ms = now_ms();
    let topology = Topology::discover(&cfg.project).await?;
    say(
        t0,
        format!(
            "project {}: replicas {}, workers {}, network {}",
            cfg.project,
            topology
                .replicas
                .iter()
                .map(|r| format!("{}(node {})", r.container.name, r.node_id))
                .collect::<Vec<_>>()
                .join(" "),
            topology.workers.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(" "),
            topology.network
        ),
    );
    let mut probe = Probe::new(&topology, &cfg.token)?;
    probe.refresh_addresses().await;
    let spec_json = wait_for_job(&mut probe, &cfg.job, Duration::from_secs(180)).await?;
    let paths = host_paths(&topology, &cfg.job, &spec_json)?;
    say(
        t0,
        format!(
            "job {}: checkpoints in {}, output in {}",
            cfg.job,
            paths.job_checkpoints.display(),
            paths.output.display()
        ),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let (observer, mut progress) = observer::spawn(probe.clone(), &cfg.job, paths.clone(), stop_rx);
    let outcome = async {
        wait_progress(&mut progress, Duration::from_secs(120), |p| p.latest_checkpoint > 0)
            .await
            .context("no checkpoint of the job completed within 120 s of the start")?;
        say(
            t0,
            format!(
                "first checkpoint completed; {} faults planned (seed {})",
                planned(cfg),
                cfg.schedule.seed
            ),
        );
        let timeout = checkpoint_timeout(&spec_json);
        let mut nemesis = Nemesis::new(&topology, probe.clone(), &cfg.job, &paths, timeout);
        let faults = nemesis.run_schedule(cfg, &mut progress, t0).await;
        nemesis.heal_all().await;
        say(t0, "faults over; stopping the job with a savepoint");
        let final_check = final_check(&mut probe, &topology, &paths, &cfg.job, &mut progress).await;
        say(t0, format!("final check: {}", final_check.verdict.lines().next().unwrap_or_default()));
        anyhow::Ok((faults, final_check))
    }
    .await;
    let _ = stop_tx.send(true);
    let rec = observer.await.context("the observer task failed")?;
    let (faults, final_check) = outcome?;
    let history = History {
        seed: cfg.schedule.seed,
        started_ms,
        observations: rec.observations,
        statuses: rec.statuses,
        completions: rec.completions,
        faults,
        sink_scans: rec.sink_scans,
        retained_scans: rec.retained_scans,
        final_check: Some(final_check),
    };
    let verdicts = check_all(&history, cfg.recovery_bound.as_millis() as u64);
    let report = render(&history, &verdicts, &cfg.replay, t0.elapsed().as_secs());
    Ok(Outcome { history, verdicts, report })
}

fn planned(cfg: &RunConfig) -> String {
    if cfg.whole_schedule {
        cfg.schedule.faults.len().to_string()
    } else {
        format!("faults for {} s", cfg.duration.as_secs())
    }
}

/// Waits until the leader serves the job's record; returns its spec.
async fn wait_for_job(probe: &mut Probe, job: &str, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some((_, _, rec)) = probe.leader_read(job).await {
            return Ok(rec.value.spec_json);
        }
        if Instant::now() >= deadline {
            bail!(
                "no leader served job {job:?} within {timeout:?}: is the job submitted and the token right?"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        probe.refresh_addresses().await;
    }
}

/// Where the job's checkpoints and output are, on the host.
fn host_paths(topology: &Topology, job: &str, spec_json: &str) -> anyhow::Result<HostPaths> {
    let spec: serde_json::Value =
        serde_json::from_str(spec_json).with_context(|| format!("job {job}: spec is not JSON"))?;
    let vertices = spec["graph"]["vertices"].as_array().with_context(|| format!("job {job} has no graph"))?;
    let of_kind = |kind: &str| vertices.iter().find(|v| v["operator"]["kind"] == kind);
    let sink =
        of_kind(SINK_KIND).with_context(|| format!("job {job} has no {SINK_KIND}: not the demo job"))?;
    let source =
        of_kind(SOURCE_KIND).with_context(|| format!("job {job} has no {SOURCE_KIND}: not the demo job"))?;
    let output = sink["operator"]["config"]["output_dir"].as_str().context("the sink has no output_dir")?;
    let replica = &topology.replicas[0].container;
    let root = spec["checkpoint"]["storage_dir"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| replica.setting("--checkpoint-dir", "CAIRN_CHECKPOINT_DIR"))
        .context("neither the job nor the replica names a checkpoint directory")?;
    let root = PathBuf::from(root);
    let root_host = replica
        .host_path(&root)
        .with_context(|| format!("{} is not on a volume of {}", root.display(), replica.name))?;
    let worker = &topology.workers[0];
    let output_host = worker
        .host_path(Path::new(output))
        .with_context(|| format!("{output} is not on a volume of {}", worker.name))?;
    Ok(HostPaths {
        job_checkpoints: root_host.join(job),
        checkpoint_root: root_host,
        checkpoint_root_in_container: root,
        source_vertex: source["id"].as_str().context("the source vertex has no id")?.to_owned(),
        output: output_host,
    })
}

/// Waits until `ok(progress)`, at most `timeout`.
async fn wait_progress(
    progress: &mut watch::Receiver<Progress>,
    timeout: Duration,
    ok: impl Fn(&Progress) -> bool,
) -> anyhow::Result<Progress> {
    let r = tokio::time::timeout(timeout, progress.wait_for(|p| ok(p))).await;
    match r {
        Ok(Ok(p)) => Ok(p.clone()),
        Ok(Err(_)) => bail!("the observer stopped"),
        Err(_) => bail!("not reached within {timeout:?}"),
    }
}

/// The job's checkpoint timeout as submitted (`checkpoint.timeout`, humantime), else Flink's
/// default of 10 minutes.
fn checkpoint_timeout(spec_json: &str) -> Duration {
    serde_json::from_str::<serde_json::Value>(spec_json)
        .ok()
        .and_then(|s| s["checkpoint"]["timeout"].as_str().and_then(|t| humantime::parse_duration(t).ok()))
        .unwrap_or(Duration::from_secs(600))
}

/// Injects faults and remembers what it must undo.
struct Nemesis {
    topology: Topology,
    probe: Probe,
    job: String,
    paths: HostPaths,
    fill_dir: PathBuf,
    /// The job's own checkpoint timeout, restored after `expire-checkpoints`.
    timeout: Duration,
    /// Network aliases of containers it disconnected, to reconnect them with.
    aliases: Vec<(String, Vec<String>)>,
    filler: Option<PathBuf>,
    /// The checkpoint timeout is cut (`expire-checkpoints` in place).
    timeout_cut: bool,
    /// Directories made read-only, with the mode to give back.
    read_only: Vec<(PathBuf, u32)>,
}

impl Nemesis {
    fn new(topology: &Topology, probe: Probe, job: &str, paths: &HostPaths, timeout: Duration) -> Self {
        Self {
            topology: topology.clone(),
            probe,
            job: job.to_owned(),
            paths: paths.clone(),
            fill_dir: paths.checkpoint_root.clone(),
            timeout,
            aliases: Vec::new(),
            filler: None,
            timeout_cut: false,
            read_only: Vec::new(),
        }
    }

    /// Makes `dir` read-only (for the job's uid; the run is root), remembering its mode.
    fn make_read_only(&mut self, dir: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?.permissions().mode();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
            .with_context(|| format!("chmod 0555 {}", dir.display()))?;
        self.read_only.push((dir.to_owned(), mode));
        Ok(())
    }

    /// Gives back the modes `make_read_only` took.
    fn restore_modes(&mut self) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        for (dir, mode) in std::mem::take(&mut self.read_only) {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {mode:o} {}", dir.display()))?;
        }
        Ok(())
    }

    async fn run_schedule(
        &mut self,
        cfg: &RunConfig,
        progress: &mut watch::Receiver<Progress>,
        t0: Instant,
    ) -> Vec<FaultRecord> {
        let deadline = t0 + cfg.duration;
        let mut records = Vec::new();
        for (index, planned) in cfg.schedule.faults.iter().enumerate() {
            if !cfg.whole_schedule && Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(planned.settle).await;
            let record = self.inject(index, planned, progress).await;
            match &record.error {
                Some(e) => say(t0, format!("fault #{index} {}: FAILED: {e}", planned.kind)),
                None => say(
                    t0,
                    format!(
                        "fault #{index} {} on {} (window {:.1} s)",
                        planned.kind,
                        record.target,
                        record.healed_ms.unwrap_or(record.injected_ms).saturating_sub(record.injected_ms)
                            as f64
                            / 1e3
                    ),
                ),
            }
            if record.error.is_none() {
                let injected = record.injected_ms;
                match wait_progress(progress, cfg.recovery_bound, |p| p.latest_trigger_ms >= injected).await {
                    Ok(p) => say(
                        t0,
                        format!(
                            "recovered: checkpoint {} completed (seen {:.1} s after the injection)",
                            p.latest_checkpoint,
                            (now_ms().saturating_sub(injected)) as f64 / 1e3
                        ),
                    ),
                    Err(e) => say(t0, format!("NOT recovered from fault #{index}: {e}")),
                }
            }
            records.push(record);
        }
        records
    }

    async fn inject(
        &mut self,
        index: usize,
        planned: &PlannedFault,
        progress: &watch::Receiver<Progress>,
    ) -> FaultRecord {
        let mut record = FaultRecord {
            index,
            kind: planned.kind,
            target: String::new(),
            injected_ms: now_ms(),
            healed_ms: None,
            error: None,
        };
        if let Err(e) = self.apply(planned, progress, &mut record).await {
            record.error = Some(format!("{e:#}"));
            self.heal_all().await;
        }
        record
    }

    /// Carries out one fault. The injection time is taken once the fault is in place (the
    /// Docker command returned), so a checkpoint triggered before cannot count as a recovery;
    /// a restart counts from its start (SIGTERM), as it is one step.
    async fn apply(
        &mut self,
        planned: &PlannedFault,
        progress: &watch::Receiver<Progress>,
        record: &mut FaultRecord,
    ) -> anyhow::Result<()> {
        let window = planned.window;
        match planned.kind {
            FaultKind::KillLeader => {
                let c = self.leader(progress).await?;
                record.target = c.clone();
                nemesis::kill(&c).await?;
                record.injected_ms = now_ms();
                tokio::time::sleep(window).await;
                nemesis::start(&c).await?;
            }
            FaultKind::PauseLeader => {
                let c = self.leader(progress).await?;
                record.target = c.clone();
                nemesis::pause(&c).await?;
                record.injected_ms = now_ms();
                tokio::time::sleep(window).await;
                nemesis::unpause(&c).await?;
            }
            FaultKind::PartitionLeader => {
                let c = self.leader(progress).await?;
                record.target = c.clone();
                self.partition(&c, window, record).await?;
            }
            FaultKind::PartitionWorker => {
                let c = self.job_worker(planned.replica_pick).await;
                record.target = c.clone();
                self.partition(&c, window, record).await?;
            }
            FaultKind::RestartReplica => {
                let r = &self.topology.replicas[planned.replica_pick as usize % self.topology.replicas.len()];
                let c = r.container.name.clone();
                record.target = c.clone();
                record.injected_ms = now_ms();
                nemesis::restart(&c).await?;
            }
            FaultKind::FillCheckpointVolume => {
                record.target = self.fill_dir.display().to_string();
                record.injected_ms = now_ms();
                let dir = self.fill_dir.clone();
                let (path, bytes) = tokio::task::spawn_blocking(move || nemesis::fill(&dir)).await??;
                self.filler = Some(path.clone());
                record.injected_ms = now_ms();
                record.target = format!("{} ({} MiB)", self.fill_dir.display(), bytes >> 20);
                tokio::time::sleep(window).await;
                nemesis::free(&path)?;
                self.filler = None;
            }
            FaultKind::ExpireCheckpoints => {
                record.target = format!("job {} checkpoint timeout 10ms", self.job);
                self.timeout_cut = true;
                self.probe
                    .set_checkpoint_timeout(&self.job, Duration::from_millis(10))
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot cut the checkpoint timeout: {e}"))?;
                record.injected_ms = now_ms();
                tokio::time::sleep(window).await;
                self.probe
                    .set_checkpoint_timeout(&self.job, self.timeout)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot restore the checkpoint timeout: {e}"))?;
                self.timeout_cut = false;
            }
            FaultKind::FailSnapshots => {
                let pending = self.paths.output.join(cairn_taskrt::demo::sink::PENDING_DIR);
                record.target =
                    format!("{} and {} read-only", self.paths.job_checkpoints.display(), pending.display());
                let dirs = [self.paths.job_checkpoints.clone(), pending];
                for dir in &dirs {
                    self.make_read_only(dir)?;
                }
                record.injected_ms = now_ms();
                tokio::time::sleep(window).await;
                self.restore_modes()?;
            }
            FaultKind::DeleteSavepoint => {
                let req = TriggerCheckpointRequest {
                    job_id: self.job.clone(),
                    kind: TriggerKind::Savepoint as i32,
                    target_dir: String::new(),
                    drain: false,
                };
                let reply = self
                    .probe
                    .trigger(req, Duration::from_secs(60))
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot take the savepoint: {e}"))?;
                let in_container = PathBuf::from(&reply.location);
                let replica = &self.topology.replicas[0].container;
                let on_host = replica
                    .host_path(&in_container)
                    .with_context(|| format!("{} is not on a volume", in_container.display()))?;
                record.target = format!("savepoint {} at {}", reply.checkpoint_id, on_host.display());
                std::fs::remove_dir_all(&on_host)
                    .with_context(|| format!("deleting {}", on_host.display()))?;
                record.injected_ms = now_ms();
            }
        }
        record.healed_ms = Some(now_ms());
        Ok(())
    }

    async fn partition(&mut self, c: &str, window: Duration, record: &mut FaultRecord) -> anyhow::Result<()> {
        let net = self.topology.network.clone();
        let state = nemesis::inspect(c, &net).await?;
        self.aliases.retain(|(name, _)| name != c);
        self.aliases.push((c.to_owned(), state.aliases));
        nemesis::disconnect(&net, c).await?;
        record.injected_ms = now_ms();
        tokio::time::sleep(window).await;
        self.reconnect(c).await
    }

    async fn reconnect(&mut self, c: &str) -> anyhow::Result<()> {
        let aliases =
            self.aliases.iter().find(|(name, _)| name == c).map(|(_, a)| a.clone()).unwrap_or_default();
        nemesis::connect(&self.topology.network, c, &aliases).await?;
        self.aliases.retain(|(name, _)| name != c);
        Ok(())
    }

    /// The container of the replica that answered as leader most recently (after a fresh
    /// observation).
    async fn leader(&self, progress: &watch::Receiver<Progress>) -> anyhow::Result<String> {
        let mut rx = progress.clone();
        rx.mark_unchanged();
        let _ = tokio::time::timeout(Duration::from_secs(10), rx.changed()).await;
        let p = rx.borrow().clone();
        let (node, _) = p.leader.context("no replica has answered as leader")?;
        Ok(self
            .topology
            .replica(node)
            .with_context(|| format!("leader node {node} has no container"))?
            .container
            .name
            .clone())
    }

    /// The worker running the job (a drawn one when the leader does not say).
    async fn job_worker(&mut self, pick: u32) -> String {
        if let Some(id) = self.probe.job_worker(&self.job).await
            && let Some(w) = self.topology.worker(&id)
        {
            return w.name.clone();
        }
        self.topology.workers[pick as usize % self.topology.workers.len()].name.clone()
    }

    /// Undoes whatever may still be in place: paused, disconnected or stopped containers, the
    /// filler file. Errors are reported, not fatal: the project is torn down afterwards.
    async fn heal_all(&mut self) {
        if let Some(path) = self.filler.take()
            && let Err(e) = nemesis::free(&path)
        {
            eprintln!("cairn-chaos: {e:#}");
        }
        if let Err(e) = self.restore_modes() {
            eprintln!("cairn-chaos: {e:#}");
        }
        if self.timeout_cut {
            match self.probe.set_checkpoint_timeout(&self.job, self.timeout).await {
                Ok(()) => self.timeout_cut = false,
                Err(e) => eprintln!("cairn-chaos: cannot restore the checkpoint timeout: {e}"),
            }
        }
        let net = self.topology.network.clone();
        let names: Vec<String> = self
            .topology
            .replicas
            .iter()
            .map(|r| r.container.name.clone())
            .chain(self.topology.workers.iter().map(|w| w.name.clone()))
            .collect();
        for c in names {
            let Ok(state) = nemesis::inspect(&c, &net).await else { continue };
            let healed = async {
                if state.paused {
                    nemesis::unpause(&c).await?;
                }
                if state.ip.is_none() && state.running {
                    self.reconnect(&c).await?;
                }
                if !state.running {
                    nemesis::start(&c).await?;
                }
                anyhow::Ok(())
            };
            if let Err(e) = healed.await {
                eprintln!("cairn-chaos: healing {c}: {e:#}");
            }
        }
    }
}

/// Stops the job with a savepoint, waits until it finished, and verifies its output against
/// the source offsets the savepoint recorded.
async fn final_check(
    probe: &mut Probe,
    topology: &Topology,
    paths: &HostPaths,
    job: &str,
    progress: &mut watch::Receiver<Progress>,
) -> FinalCheck {
    let target_dir = paths.checkpoint_root_in_container.join("savepoints").display().to_string();
    let req = TriggerCheckpointRequest {
        job_id: job.to_owned(),
        kind: TriggerKind::StopWithSavepoint as i32,
        target_dir,
        drain: false,
    };
    let mut stop_error = None;
    let mut savepoint = None;
    for _ in 0..5 {
        match probe.trigger(req.clone(), Duration::from_secs(60)).await {
            Ok(r) => {
                savepoint = Some(r);
                stop_error = None;
                break;
            }
            Err(e) => {
                stop_error = Some(e);
                tokio::time::sleep(Duration::from_secs(3)).await;
                probe.refresh_addresses().await;
            }
        }
    }
    if savepoint.is_some()
        && let Err(e) = wait_progress(progress, Duration::from_secs(60), |p| p.job_status == "finished").await
    {
        stop_error = Some(format!("the job did not finish after its stop-with-savepoint: {e}"));
    }
    let replica = &topology.replicas[0].container;
    let expectation = savepoint.as_ref().map(|sp| -> Result<Expectation, String> {
        let dir = replica
            .host_path(Path::new(&sp.location))
            .ok_or_else(|| format!("savepoint {} is not on a volume", sp.location))?;
        let meta = read_metadata_unverified(&dir.join(METADATA_FILE)).map_err(|e| e.to_string())?;
        let counts = source_offsets(&meta, &dir, &paths.source_vertex).map_err(|e| e.to_string())?;
        Ok(Expectation { counts: Some(counts), ..Expectation::default() })
    });
    let (expect, exact_counts, note) = match expectation {
        Some(Ok(e)) => (e, true, String::new()),
        Some(Err(e)) => (Expectation::default(), false, format!(" (savepoint unreadable: {e})")),
        None => (Expectation::default(), false, String::new()),
    };
    let (exactly_once, verdict) = match verify_output(&paths.output, &expect) {
        Ok(v) => (v.is_exactly_once(), format!("{v}{note}")),
        Err(e) => (false, format!("the verifier could not read the output: {e}")),
    };
    FinalCheck {
        at_ms: now_ms(),
        savepoint: savepoint.map(|s| (s.checkpoint_id, s.location)),
        stop_error,
        exact_counts,
        exactly_once,
        verdict,
    }
}
