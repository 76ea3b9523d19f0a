//! One trial: a fresh cluster on crashfs machines, the workload, a power loss as the schedule
//! says, a restart of everything that lost power, and the checks.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_client::{ClientConfig, LeaderClient};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::{Expectation, Verdict, Violation as OutputViolation, verify_output};
use cairn_tests::procs::{ProcCluster, ProcOptions};
use tonic::Code;

use super::history::Allocation;
use super::history::check_allocations;
use super::inspect::{StoreView, check_checkpoint_files, open_store};
use super::machines::{Machine, Machines};
use super::schedule::{Scenario, Schedule, resolve};
use super::workload::{AckedSavepoint, Sample, Workload, WorkloadConfig};

const REPLICAS: u64 = 3;
const DEMO_JOB: &str = "demo";
const ALLOC_JOBS: [&str; 2] = ["alloc-0", "alloc-1"];
const WORKER: &str = "w1";
const KEYS: u64 = 4;
const RECORDS_PER_KEY: u64 = 600;
/// Per source subtask (two of them, two keys each): about four seconds of input.
const RATE_PER_SEC: u64 = 300;
/// Bound on the steps before the power loss (start, first checkpoint).
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The invariant a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// An acknowledged checkpoint ID is not below every later allocation of its job.
    Allocation,
    /// An acknowledged savepoint is not in the store.
    Savepoint,
    /// A checkpoint or savepoint the store lists lacks its `_metadata` or a state file.
    Checkpoint,
    /// The demo job's committed output is not exactly once.
    ExactlyOnce,
    /// A replica's store does not open, or opens without what it acknowledged.
    Store,
    /// The system did not recover (no progress within the bound) after the power came back.
    Recovery,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::Allocation => "allocation",
            Invariant::Savepoint => "savepoint",
            Invariant::Checkpoint => "checkpoint",
            Invariant::ExactlyOnce => "exactly-once",
            Invariant::Store => "store",
            Invariant::Recovery => "recovery",
        })
    }
}

#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.detail)
    }
}

/// How trials run.
#[derive(Debug, Clone)]
pub struct TrialConfig {
    /// Where a failed trial's logs and disks are copied (`<dir>/<scenario>-<seed>/`).
    pub artifacts: Option<PathBuf>,
    /// Bound on the recovery after the power loss.
    pub recovery_timeout: Duration,
}

/// One power loss.
#[derive(Debug, Clone)]
pub struct Cut {
    /// Replicas that lost power.
    pub victims: Vec<u64>,
    /// The leader when the power went (as last sampled).
    pub leader: Option<u64>,
}

/// What one trial did and found.
#[derive(Debug, Clone)]
pub struct TrialReport {
    pub schedule: Schedule,
    /// The power losses.
    pub cuts: Vec<Cut>,
    pub violations: Vec<Violation>,
    pub elapsed: Duration,
    pub allocations: usize,
    pub savepoints: usize,
    pub checkpoints: u64,
    /// Unsynced bytes the power loss dropped, over every machine that lost power.
    pub bytes_dropped: u64,
    /// Files and directories whose unsynced names the power loss dropped.
    pub names_lost: u64,
    pub artifacts: Option<PathBuf>,
}

struct Findings {
    violations: Vec<Violation>,
}

impl Findings {
    fn add(&mut self, invariant: Invariant, detail: impl Into<String>) {
        self.violations.push(Violation { invariant, detail: detail.into() });
    }
}

/// Runs one trial. `Err` means the trial could not be made (mounting failed, the cluster did
/// not start, the job never checkpointed before any fault): no verdict.
pub async fn run_trial(schedule: &Schedule, config: &TrialConfig) -> anyhow::Result<TrialReport> {
    let started = Instant::now();
    let machines = Machines::mount(REPLICAS, schedule)?;
    let mut data_dirs = BTreeMap::new();
    for id in 1..=REPLICAS {
        let dir = machines.data_dir(id).ok_or_else(|| anyhow::anyhow!("no machine for replica {id}"))?;
        data_dirs.insert(id, dir);
    }
    // Default Raft and worker timings; a short re-attach grace, and snapshots (with log purges
    // behind them) every few hundred entries, so that a trial crosses several.
    let refs = ["--reattach-grace", "2s", "--snapshot-after-logs", "300"];
    let mut cluster = ProcCluster::start_with_options(
        REPLICAS,
        &refs,
        ProcOptions { metrics: false, data_dirs, ..ProcOptions::default() },
    )?;
    let scratch = tempfile::Builder::new().prefix("cairn-powerloss-inspect-").tempdir()?;
    let mut report = TrialReport {
        schedule: schedule.clone(),
        cuts: Vec::new(),
        violations: Vec::new(),
        elapsed: Duration::ZERO,
        allocations: 0,
        savepoints: 0,
        checkpoints: 0,
        bytes_dropped: 0,
        names_lost: 0,
        artifacts: None,
    };
    let outcome = drive(&mut cluster, &machines, schedule, config, scratch.path(), &mut report).await;
    kill_everything(&mut cluster);
    let failed = outcome.is_err() || !report.violations.is_empty();
    if failed && let Some(root) = &config.artifacts {
        let dir = root.join(format!("{}-{:016x}", schedule.scenario, schedule.seed));
        match save_artifacts(&dir, &cluster, &machines) {
            Ok(()) => report.artifacts = Some(dir),
            Err(error) => tracing::warn!(%error, dir = %dir.display(), "cannot save the trial's artifacts"),
        }
    }
    drop(cluster);
    drop(machines);
    outcome?;
    report.elapsed = started.elapsed();
    Ok(report)
}

fn kill_everything(cluster: &mut ProcCluster) {
    for node in cluster.nodes.values_mut() {
        if let Err(error) = node.kill9() {
            tracing::warn!(%error, node = node.id, "cannot kill replica");
        }
    }
    for (name, worker) in cluster.workers.iter_mut() {
        if let Err(error) = worker.kill9() {
            tracing::warn!(%error, worker = %name, "cannot kill worker");
        }
    }
}

fn save_artifacts(dir: &Path, cluster: &ProcCluster, machines: &Machines) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(cluster.root())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log")
            && let Some(name) = path.file_name()
        {
            std::fs::copy(&path, dir.join(name))?;
        }
    }
    let disks = dir.join("disks");
    std::fs::create_dir_all(&disks)?;
    for machine in machines.all() {
        machine.copy_to(&disks.join(&machine.name))?;
    }
    Ok(())
}

fn demo_spec(schedule: &Schedule, machines: &Machines) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(RECORDS_PER_KEY),
            rate_per_sec: Some(RATE_PER_SEC),
            batch: 16,
            idle_after_limit: true,
        },
        output_dir: machines.output_dir().display().to_string(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    serde_json::json!({
        "graph": graph,
        "checkpoint": {
            "interval": format!("{}ms", schedule.checkpoint_interval.as_millis()),
            "timeout": "10s",
            "retained": 2,
            "storage_dir": machines.checkpoint_dir().display().to_string(),
            "savepoint_dir": machines.savepoint_dir().display().to_string(),
        }
    })
    .to_string()
}

fn expectation() -> Expectation {
    Expectation { keys: Some(KEYS), records_per_key: Some(RECORDS_PER_KEY), counts: None }
}

/// Polls `check` every 100 ms for at most `timeout`.
async fn poll<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn drive(
    cluster: &mut ProcCluster,
    machines: &Machines,
    schedule: &Schedule,
    config: &TrialConfig,
    scratch: &Path,
    report: &mut TrialReport,
) -> anyhow::Result<()> {
    let mut findings = Findings { violations: Vec::new() };
    let client_config = ClientConfig {
        token: Some(cluster.admin_token().to_owned()),
        deadline: SETUP_TIMEOUT,
        attempt_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let mut client = LeaderClient::new(cluster.addrs(), client_config)?;

    // Setup: jobs, the worker, the workload; then the demo job's first checkpoint.
    for job in ALLOC_JOBS {
        register(&mut client, job, "").await?;
    }
    register(&mut client, DEMO_JOB, &demo_spec(schedule, machines)).await?;
    cluster.launch_worker(WORKER, 8)?;
    let workload = Workload::start(&WorkloadConfig {
        endpoints: cluster.addrs(),
        token: cluster.admin_token().to_owned(),
        alloc_jobs: ALLOC_JOBS.iter().map(|j| j.to_string()).collect(),
        clients: schedule.clients,
        client_pause: schedule.client_pause,
        savepoint_job: DEMO_JOB.to_owned(),
        savepoint_every: schedule.savepoint_every,
    })?;
    let first = poll(SETUP_TIMEOUT, || {
        let mut c = client.clone();
        async move { (c.get_job(DEMO_JOB).await.ok()?.num_completed >= 1).then_some(()) }
    })
    .await;
    if first.is_none() {
        workload.stop().await;
        anyhow::bail!(
            "the demo job completed no checkpoint within {SETUP_TIMEOUT:?} before any fault\n{}\n--- worker ---\n{}",
            strip_ansi(&cluster.logs(30)),
            tail(&cluster.worker_log_text(WORKER), 30)
        );
    }
    let storage_too = schedule.scenario == Scenario::All;
    let mut restart_progress = workload.progress();
    let mut restarted_at = Instant::now();
    for (round, wait) in schedule.cuts.iter().enumerate() {
        tokio::time::sleep(*wait).await;
        let when = if round == 0 {
            "after the power loss".to_owned()
        } else {
            format!("after power loss #{}", round + 1)
        };

        // The power loss, on replicas chosen by their role now.
        let nodes: Vec<u64> = cluster.nodes.keys().copied().collect();
        let leader = if storage_too {
            // Everything loses power: the leader is only reported.
            workload.with_recorded(|r| r.latest_sample().filter(|s| s.at > restarted_at).map(|s| s.leader))
        } else {
            current_leader(&workload, restarted_at).await
        };
        let victims = if storage_too { nodes.clone() } else { resolve(&schedule.picks, leader, &nodes) };
        report.cuts.push(Cut { victims: victims.clone(), leader });
        let cut_at = Instant::now();
        for id in &victims {
            cluster.nodes.get_mut(id).ok_or_else(|| anyhow::anyhow!("no replica {id}"))?.kill9()?;
        }
        if storage_too && let Some(worker) = cluster.workers.get_mut(WORKER) {
            worker.kill9()?;
        }
        let mut losing: Vec<&Machine> = Vec::new();
        for id in &victims {
            losing.push(machines.replicas.get(id).ok_or_else(|| anyhow::anyhow!("no machine {id}"))?);
        }
        if storage_too {
            losing.extend([&machines.checkpoints, &machines.output]);
        }
        for machine in losing {
            let lost = machine.power_loss()?;
            report.bytes_dropped += lost.bytes_dropped;
            report.names_lost += lost.files_lost + lost.dirs_lost;
        }

        // What the machines that lost power boot with, before anything runs on them again.
        let sample = workload.with_recorded(|r| r.sample_before(cut_at).cloned());
        let mut boot_views = Vec::new();
        for id in &victims {
            if let Some(view) = inspect_replica(*id, machines, scratch, &mut findings, &when)? {
                check_acknowledged_log(&view, sample.as_ref(), &when, &mut findings);
                boot_views.push(view);
            }
        }
        if storage_too {
            // Nothing runs: the most advanced log (the one a new leader would have, re-applied
            // after its applied entry) holds the committed state as of the power loss (every
            // reply was sent after its command was committed: durable in a majority's logs).
            let (savepoints, allocations) =
                workload.with_recorded(|r| (r.savepoints.clone(), r.allocations.clone()));
            if let Some(view) = boot_views.iter().max_by_key(|v| (v.last_log_term, v.last_log_index)) {
                check_store_against_acks(view, &savepoints, &allocations, &when, &mut findings);
            }
        }

        // Power back: restart what lost it.
        restart_progress = workload.progress();
        restarted_at = Instant::now();
        for id in &victims {
            cluster.launch(*id)?;
        }
        if storage_too {
            cluster.launch_worker(WORKER, 8)?;
        }
    }

    // Recovery: the job's output completes exactly once, and every client allocates again.
    let mut monitor = client.clone();
    let verdict = await_output(machines, config.recovery_timeout).await;
    // When the output did not recover, the clients get a short while more, not a whole bound.
    let mut client_wait = config.recovery_timeout;
    match verdict {
        OutputWait::Complete => {}
        OutputWait::Violated(verdict) => {
            findings.add(Invariant::ExactlyOnce, format!("the committed output: {verdict}"));
        }
        OutputWait::Incomplete(last) => {
            client_wait = client_wait.min(Duration::from_secs(10));
            let job = match monitor.get_job(DEMO_JOB).await {
                Ok(job) => format!(
                    "status {}, attempts {}, {} checkpoints completed, retained {:?}",
                    job.status, job.attempts, job.num_completed, job.completed_checkpoint_ids
                ),
                Err(error) => format!("unknown ({error})"),
            };
            findings.add(
                Invariant::Recovery,
                format!(
                    "the demo job's output was not complete {:?} after the restart; job {job}; last verdict: \
                     {}; worker log:\n{}",
                    config.recovery_timeout,
                    last.map_or_else(|| "none".to_owned(), |v| v.to_string()),
                    tail(&cluster.worker_log_text(WORKER), 20)
                ),
            );
        }
    }
    let progressed = poll(client_wait, || {
        let now = workload.progress();
        let done = now.iter().zip(&restart_progress).all(|(now, then)| *now >= then + 2);
        async move { done.then_some(()) }
    })
    .await;
    if progressed.is_none() {
        findings.add(
            Invariant::Recovery,
            format!(
                "clients made no allocations for {:?} after the restart (acknowledged per client: {:?} at the \
                 restart, {:?} now)",
                client_wait,
                restart_progress,
                workload.progress()
            ),
        );
    }
    if let Ok(job) = monitor.get_job(DEMO_JOB).await {
        report.checkpoints = job.num_completed;
    }
    let recorded = workload.stop().await;
    report.allocations = recorded.allocations.values().map(Vec::len).sum();
    report.savepoints = recorded.savepoints.len();

    // The end: stop everything (a kill loses nothing here: no power loss) and read every store.
    kill_everything(cluster);
    for (job, allocations) in &recorded.allocations {
        for problem in check_allocations(job, allocations, 10) {
            findings.add(Invariant::Allocation, problem);
        }
    }
    let mut final_views = Vec::new();
    for id in 1..=REPLICAS {
        if let Some(view) = inspect_replica(id, machines, scratch, &mut findings, "at the end")? {
            final_views.push(view);
        }
    }
    if let Some(view) = final_views.iter().max_by_key(|v| (v.last_log_term, v.last_log_index)) {
        check_store_against_acks(
            view,
            &recorded.savepoints,
            &recorded.allocations,
            "at the end",
            &mut findings,
        );
    }
    report.violations = findings.violations;
    Ok(())
}

/// The leader as sampled after `since` (the last restart), waiting up to 3 s for a sample.
async fn current_leader(workload: &Workload, since: Instant) -> Option<u64> {
    poll(Duration::from_secs(3), || {
        let leader = workload.with_recorded(|r| r.latest_sample().filter(|s| s.at > since).map(|s| s.leader));
        async move { leader }
    })
    .await
}

async fn register(client: &mut LeaderClient, job: &str, spec: &str) -> anyhow::Result<()> {
    match client.register_job(job, spec).await {
        Ok(_) => Ok(()),
        // A retry after a lost reply.
        Err(error) if error.code() == Some(Code::AlreadyExists) => Ok(()),
        Err(error) => Err(anyhow::anyhow!("registering job {job}: {error}")),
    }
}

/// The last `lines` lines of a log, without terminal colour codes.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    strip_ansi(&all[all.len().saturating_sub(lines)..].join("\n"))
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

enum OutputWait {
    Complete,
    Violated(Verdict),
    Incomplete(Option<Verdict>),
}

/// Waits until the demo job's committed output is complete and exactly once; stops at the
/// first violation that more output cannot repair (a duplicate, a gap, a wrong line).
async fn await_output(machines: &Machines, timeout: Duration) -> OutputWait {
    let output = machines.output_dir();
    let expect = expectation();
    let mut last = None;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let verdict = tokio::task::block_in_place(|| verify_output(&output, &expect));
        if let Ok(verdict) = verdict {
            if verdict.is_exactly_once() {
                return OutputWait::Complete;
            }
            let permanent = verdict.violations.iter().any(|v| {
                !matches!(v, OutputViolation::WrongTotal { .. } | OutputViolation::MissingKey { .. })
            });
            if permanent {
                return OutputWait::Violated(verdict);
            }
            last = Some(verdict);
        }
        if tokio::time::Instant::now() >= deadline {
            return OutputWait::Incomplete(last);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Opens replica `id`'s store from a copy of its disk; a refusal is a violation.
fn inspect_replica(
    id: u64,
    machines: &Machines,
    scratch: &Path,
    findings: &mut Findings,
    when: &str,
) -> anyhow::Result<Option<StoreView>> {
    let machine = machines.replicas.get(&id).ok_or_else(|| anyhow::anyhow!("no machine {id}"))?;
    let data_dir = machines.data_dir(id).ok_or_else(|| anyhow::anyhow!("no data dir {id}"))?;
    match tokio::task::block_in_place(|| open_store(id, machine, &data_dir, scratch)) {
        Ok(view) => Ok(Some(view)),
        Err(error) => {
            findings.add(Invariant::Store, format!("{when}: {error:#}"));
            Ok(None)
        }
    }
}

/// A replica that lost power must still hold what it acknowledged: the log up to what the
/// leader last saw it match (of that, what was committed: only committed entries cannot be
/// legitimately replaced), and a vote at least as new as that leader's term.
fn check_acknowledged_log(view: &StoreView, sample: Option<&Sample>, when: &str, findings: &mut Findings) {
    let Some(sample) = sample else { return };
    let Some(matched) = sample.matched.get(&view.node).copied() else { return };
    let bound = matched.min(sample.commit_index);
    let last = view.last_log_index.unwrap_or(0);
    if last < bound {
        findings.add(
            Invariant::Store,
            format!(
                "{when}: replica {} came back with its log ending at index {last}, but it had acknowledged \
                 index {matched} to leader {} in term {} (committed up to {}); applied at open: {:?}",
                view.node, sample.leader, sample.term, sample.commit_index, view.last_applied
            ),
        );
    }
    // The cluster API reports a follower the leader has heard nothing from yet as matched at 0: a
    // replica that lost power just as a new leader was elected never acknowledged that leader,
    // and need not have its vote. Anything it did acknowledge in that term is past index 0 (the
    // term's first entry at least).
    let term = view.vote_term.unwrap_or(0);
    if matched > 0 && term < sample.term {
        findings.add(
            Invariant::Store,
            format!(
                "{when}: replica {} came back with a vote of term {term}, but it had acknowledged index \
                 {matched} to leader {} of term {}",
                view.node, sample.leader, sample.term
            ),
        );
    }
}

/// The store's state against what clients were told: acknowledged IDs below the next one,
/// acknowledged savepoints listed, and the files of everything listed intact.
fn check_store_against_acks(
    view: &StoreView,
    savepoints: &[AckedSavepoint],
    allocations: &BTreeMap<String, Vec<Allocation>>,
    when: &str,
    findings: &mut Findings,
) {
    for (job, acked) in allocations {
        let Some(max) = acked.iter().map(|a| a.id).max() else { continue };
        match view.jobs.get(job) {
            Some(record) if record.next_checkpoint_id > max => {}
            Some(record) => findings.add(
                Invariant::Allocation,
                format!(
                    "{when}: job {job}'s next id is {} on replica {} (the most advanced), but id {max} was \
                     acknowledged",
                    record.next_checkpoint_id, view.node
                ),
            ),
            None => findings.add(
                Invariant::Allocation,
                format!("{when}: job {job} is missing on replica {} (the most advanced)", view.node),
            ),
        }
    }
    let Some(demo) = view.jobs.get(DEMO_JOB) else {
        findings.add(
            Invariant::Checkpoint,
            format!("{when}: job {DEMO_JOB} is missing on replica {}", view.node),
        );
        return;
    };
    for savepoint in savepoints {
        if !demo.savepoints.iter().any(|s| s.checkpoint.id == savepoint.id) {
            findings.add(
                Invariant::Savepoint,
                format!(
                    "{when}: savepoint {} ({}) was acknowledged but replica {} (the most advanced) does not list it",
                    savepoint.id, savepoint.path, view.node
                ),
            );
        }
    }
    let ids: Vec<u64> = demo.completed.iter().map(|c| c.id).collect();
    if ids.windows(2).any(|w| w[0] >= w[1]) {
        findings.add(Invariant::Checkpoint, format!("{when}: retained checkpoints out of order: {ids:?}"));
    }
    for problem in tokio::task::block_in_place(|| check_checkpoint_files(demo)) {
        findings.add(Invariant::Checkpoint, format!("{when}: {problem}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: u64, last: u64, vote_term: u64) -> StoreView {
        StoreView {
            node,
            last_log_index: Some(last),
            last_log_term: Some(vote_term),
            vote_term: Some(vote_term),
            last_applied: None,
            jobs: BTreeMap::new(),
        }
    }

    fn sample(term: u64, matched: u64) -> Sample {
        Sample { at: Instant::now(), leader: 3, term, commit_index: 500, matched: [(1, matched)].into() }
    }

    /// A replica must come back with the vote of a leader it acknowledged entries to; one the
    /// new leader had not heard from yet (matched 0 in the cluster API) acknowledged nothing.
    #[test]
    fn a_vote_is_owed_only_to_a_leader_that_was_acknowledged() {
        let mut findings = Findings { violations: Vec::new() };
        check_acknowledged_log(&view(1, 400, 1), Some(&sample(2, 0)), "after", &mut findings);
        assert!(findings.violations.is_empty(), "{:?}", findings.violations);
        check_acknowledged_log(&view(1, 420, 1), Some(&sample(2, 410)), "after", &mut findings);
        assert_eq!(findings.violations.len(), 1, "{:?}", findings.violations);
        assert!(findings.violations[0].detail.contains("vote of term 1"), "{:?}", findings.violations);
        check_acknowledged_log(&view(1, 420, 2), Some(&sample(2, 410)), "after", &mut findings);
        assert_eq!(findings.violations.len(), 1, "a replica with the leader's vote is fine");
    }

    #[test]
    fn colour_codes_are_stripped_from_logs() {
        let line = "\u{1b}[2m2026-12-03T11:22:58Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m worker started";
        assert_eq!(strip_ansi(line), "2026-12-03T11:22:58Z  INFO worker started");
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
    }
}
