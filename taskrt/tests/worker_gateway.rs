//! The worker side of the task gateway against fake `TaskGateway` replicas (tonic servers on
//! 127.0.0.1:0): leader following, re-registration without restarting tasks, term fencing,
//! deployments and checkpoint acknowledgements over the stream, heartbeat timeouts, slots.

mod common;

use std::path::Path;
use std::time::Duration;

use cairn_protocol::assign::StateAssignment;
use cairn_protocol::messages::{
    CheckpointOptions, Deployment, DeploymentPlacement, PlacedSubtask, TaskCommand, TaskMessage, TaskStatus,
    ToTask,
};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::worker::{JobsView, Worker, WorkerConfig, WorkerHandle, WorkerStatus};
use common::{WAIT, init_tracing};
use fake::{FakeReplica, LeaderMode, Mode, dead_addr};
use tokio::sync::watch;

const JOB: &str = "demo";
/// The demo graph below: 1 source + 2 counters + 2 sinks.
const DEMO_TASKS: usize = 5;

fn config(coordinators: &[&str]) -> WorkerConfig {
    WorkerConfig {
        worker_id: Some("w-test".into()),
        reconnect_backoff_min: Duration::from_millis(20),
        reconnect_backoff_max: Duration::from_millis(200),
        connect_timeout: Duration::from_secs(1),
        register_timeout: Duration::from_secs(2),
        cancel_timeout: Duration::from_secs(5),
        ..WorkerConfig::new(coordinators.iter().copied())
    }
}

fn demo_deployment(dir: &Path, attempt: u32) -> Deployment {
    let graph = DemoJob {
        source: SourceConfig {
            keys: 8,
            records_per_key: None,
            rate_per_sec: Some(400),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: dir.join("out").to_string_lossy().into_owned(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    Deployment {
        job_id: JOB.into(),
        attempt,
        graph: serde_json::to_value(&graph).expect("a graph encodes"),
        storage_root: dir.join("checkpoints"),
        restore: None,
        incremental: false,
        placement: None,
    }
}

fn trigger(attempt: u32, checkpoint_id: u64) -> TaskCommand {
    TaskCommand {
        job_id: JOB.into(),
        attempt,
        tasks: vec![("source".into(), 0)],
        body: ToTask::TriggerCheckpoint {
            checkpoint_id,
            timestamp_ms: 1,
            options: CheckpointOptions::checkpoint(),
        },
    }
}

fn cancel(attempt: u32) -> TaskCommand {
    TaskCommand { job_id: JOB.into(), attempt, tasks: vec![], body: ToTask::Cancel }
}

async fn wait_status(
    rx: &mut watch::Receiver<WorkerStatus>,
    what: &str,
    f: impl FnMut(&WorkerStatus) -> bool,
) {
    let ok = matches!(tokio::time::timeout(WAIT, rx.wait_for(f)).await, Ok(Ok(_)));
    assert!(ok, "timed out waiting for {what}; status: {:?}", *rx.borrow());
}

async fn wait_jobs(rx: &mut watch::Receiver<JobsView>, what: &str, f: impl FnMut(&JobsView) -> bool) {
    let ok = matches!(tokio::time::timeout(WAIT, rx.wait_for(f)).await, Ok(Ok(_)));
    assert!(ok, "timed out waiting for {what}; jobs: {:?}", *rx.borrow());
}

async fn all_running(worker: &WorkerHandle, attempt: u32) {
    let mut jobs = worker.jobs();
    wait_jobs(&mut jobs, "every demo task running", |v| {
        v.job(JOB).len() == DEMO_TASKS
            && v.all_in(JOB, &TaskStatus::Running)
            && v.job(JOB).iter().all(|t| t.id.attempt == attempt)
    })
    .await;
}

fn acks_of(reports: &[TaskMessage], checkpoint: u64) -> usize {
    reports
        .iter()
        .filter(
            |m| matches!(m, TaskMessage::Acknowledge { checkpoint_id, .. } if *checkpoint_id == checkpoint),
        )
        .count()
}

fn statuses_of(reports: &[TaskMessage], wanted: &TaskStatus) -> usize {
    reports.iter().filter(|m| matches!(m, TaskMessage::Status { status, .. } if status == wanted)).count()
}

#[tokio::test]
async fn follows_a_not_leader_hint_to_the_leader() {
    init_tracing();
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(3))).await;
    let follower = FakeReplica::start(Mode::not_leader(Some(2), Some(&leader.addr))).await;
    let worker = Worker::start(config(&[&follower.addr])).expect("starts");

    let session = leader.next_session().await;
    assert_eq!(session.register.worker_id, "w-test");
    assert_eq!(session.register.slots, 8);
    assert!(session.register.tasks.is_empty());
    assert!(follower.attaches() >= 1, "the worker asked the follower first");

    let mut status = worker.status();
    wait_status(&mut status, "registered with the leader", |s| {
        s.leader.as_ref().is_some_and(|l| l.addr == leader.addr && l.term == 3 && l.leader_id == 1)
    })
    .await;
    assert!(status.borrow().endpoints.contains(&leader.addr), "the hinted leader is remembered");
    worker.shutdown().await;
}

#[tokio::test]
async fn tries_the_next_replica_when_the_hinted_leader_is_down() {
    init_tracing();
    let dead = dead_addr().await;
    let stale_hint = FakeReplica::start(Mode::not_leader(Some(9), Some(&dead))).await;
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(4))).await;
    let worker = Worker::start(config(&[&stale_hint.addr, &leader.addr])).expect("starts");

    let session = leader.next_session().await;
    assert_eq!(session.register.worker_id, "w-test");
    let mut status = worker.status();
    wait_status(&mut status, "registered with the live leader", |s| {
        s.leader.as_ref().is_some_and(|l| l.addr == leader.addr)
    })
    .await;
    assert!(status.borrow().endpoints.contains(&dead), "the hinted address was learned");
    worker.shutdown().await;
}

#[tokio::test]
async fn deploys_the_demo_job_and_acknowledges_a_triggered_checkpoint() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(2))).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let mut session = leader.next_session().await;

    session.deploy(2, &demo_deployment(dir.path(), 1)).await;
    let reports = session
        .reports_until("every task running", |r| statuses_of(r, &TaskStatus::Running) == DEMO_TASKS)
        .await;
    assert!(reports.iter().all(|m| m.task().attempt == 1 && m.task().task.job == JOB));
    all_running(&worker, 1).await;

    session.command(2, &trigger(1, 1)).await;
    session.reports_until("5 acknowledgements of checkpoint 1", |r| acks_of(r, 1) == DEMO_TASKS).await;

    // Invalid JSON is logged and ignored; the stream stays usable.
    session.send_raw_command(2, b"{not json".to_vec()).await;
    session.command(2, &trigger(1, 2)).await;
    session.reports_until("acknowledgements of checkpoint 2", |r| acks_of(r, 2) == DEMO_TASKS).await;
    worker.shutdown().await;
}

/// The reports a broken stream left unconfirmed come again, in order, on the next stream: to a
/// leader that announced batches all in one message (they are all waiting when it attaches),
/// else one per message. Once confirmed, none is sent again.
async fn unconfirmed_reports_are_sent_again(batches: bool) {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    // This leader handles reports but its confirmations never arrive (the stream breaks first).
    let mode = LeaderMode { confirms: false, ..LeaderMode::new(2) };
    let mut leader = FakeReplica::start(Mode::Leader(mode)).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let mut session = leader.next_session().await;
    session.deploy(2, &demo_deployment(dir.path(), 3)).await;
    all_running(&worker, 3).await;
    session.command(2, &trigger(3, 1)).await;
    session.reports_until("acknowledgements of checkpoint 1", |r| acks_of(r, 1) == DEMO_TASKS).await;
    let unconfirmed: Vec<u64> = session.messages.lock().expect("messages lock").concat();
    assert!(
        session.messages.lock().expect("messages lock").iter().all(|m| m.len() == 1),
        "a leader that did not announce batches got one"
    );
    drop(session);
    // Whatever the first stream did not confirm comes again, in order, on the next one.
    leader.set_mode(Mode::Leader(LeaderMode { batches, ..LeaderMode::new(2) }));
    let mut again = leader.next_session().await;
    again.reports_until("the unconfirmed acknowledgements again", |r| acks_of(r, 1) == DEMO_TASKS).await;
    if batches {
        let first = again.messages.lock().expect("messages lock").first().cloned();
        assert_eq!(first, Some(unconfirmed), "the unconfirmed reports did not come as one batch, in order");
    }
    // Confirmed now: a third stream gets none of them.
    again.command(2, &trigger(3, 2)).await;
    again.reports_until("acknowledgements of checkpoint 2", |r| acks_of(r, 2) == DEMO_TASKS).await;
    let seqs: Vec<u64> = again.messages.lock().expect("messages lock").concat();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "reports out of order: {seqs:?}");
    drop(again);
    let mut third = leader.next_session().await;
    third.command(2, &trigger(3, 3)).await;
    let reports =
        third.reports_until("acknowledgements of checkpoint 3", |r| acks_of(r, 3) == DEMO_TASKS).await;
    assert_eq!(
        acks_of(&reports, 1) + acks_of(&reports, 2),
        0,
        "confirmed reports were sent again: {reports:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn acknowledgements_the_leader_did_not_confirm_are_sent_again_on_the_next_stream() {
    unconfirmed_reports_are_sent_again(false).await;
}

/// To a leader that takes batches, reports waiting together go out together.
#[tokio::test]
async fn reports_waiting_together_go_to_a_batching_leader_in_one_message() {
    unconfirmed_reports_are_sent_again(true).await;
}

#[tokio::test]
async fn reregisters_running_tasks_after_the_stream_breaks_without_restarting_them() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(2))).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let session = leader.next_session().await;
    session.deploy(2, &demo_deployment(dir.path(), 7)).await;
    all_running(&worker, 7).await;

    // The leader side drops the stream (e.g. a network break).
    drop(session);
    let mut again = leader.next_session().await;
    let tasks = &again.register.tasks;
    assert_eq!(tasks.len(), DEMO_TASKS, "{tasks:?}");
    assert!(tasks.iter().all(|t| t.job_id == JOB && t.attempt == 7 && t.status == "running"), "{tasks:?}");
    assert_eq!(again.register.highest_term_seen, 2);

    // Same attempt, never redeployed, and still working for the new session.
    let jobs = worker.jobs().borrow().clone();
    assert_eq!(jobs.deployments, 1);
    assert!(jobs.all_in(JOB, &TaskStatus::Running));
    again.command(2, &trigger(7, 1)).await;
    again.reports_until("acknowledgements over the new stream", |r| acks_of(r, 1) == DEMO_TASKS).await;
    let mut status = worker.status();
    wait_status(&mut status, "two registrations", |s| s.registrations == 2).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn stale_terms_are_ignored_and_higher_terms_obeyed() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(5))).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let mut session = leader.next_session().await;
    session.deploy(5, &demo_deployment(dir.path(), 1)).await;
    all_running(&worker, 1).await;

    // A cancel from term 4 (a deposed leader) is ignored. Messages are handled in order, so
    // once the trigger that follows it is acknowledged, the cancel was handled too.
    session.command(4, &cancel(1)).await;
    session.command(5, &trigger(1, 1)).await;
    let reports = session
        .reports_until("acknowledgements after the stale cancel", |r| acks_of(r, 1) == DEMO_TASKS)
        .await;
    assert_eq!(statuses_of(&reports, &TaskStatus::Canceled), 0, "{reports:?}");
    assert!(worker.jobs().borrow().all_in(JOB, &TaskStatus::Running));

    // A cancel from term 6 is obeyed: every task ends canceled and the job is forgotten.
    session.command(6, &cancel(1)).await;
    session
        .reports_until("every task canceled", |r| statuses_of(r, &TaskStatus::Canceled) == DEMO_TASKS)
        .await;
    let mut jobs = worker.jobs();
    wait_jobs(&mut jobs, "the canceled job removed", |v| v.job(JOB).is_empty()).await;
    let mut status = worker.status();
    wait_status(&mut status, "highest term 6", |s| s.highest_term == 6).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn a_registered_from_a_stale_term_makes_the_worker_look_elsewhere() {
    init_tracing();
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(7))).await;
    let mut stale = FakeReplica::start(Mode::Leader(LeaderMode::new(3))).await;
    let worker = Worker::start(config(&[&leader.addr, &stale.addr])).expect("starts");
    let first = leader.next_session().await;
    let mut status = worker.status();
    wait_status(&mut status, "term 7", |s| s.highest_term == 7).await;

    // The term-7 leader loses its leadership; the term-3 replica still believes it leads.
    leader.set_mode(Mode::not_leader(None, None));
    drop(first);
    let mut stale_attaches = 0;
    while stale_attaches < 2 {
        let s = stale.next_session().await;
        assert_eq!(s.register.highest_term_seen, 7);
        stale_attaches += 1;
    }
    assert_eq!(status.borrow().registrations, 1, "a stale leader is never taken as the leader");
    assert!(status.borrow().leader.is_none());
    worker.shutdown().await;
}

#[tokio::test]
async fn a_heartbeat_timeout_drops_the_stream_and_reconnects() {
    init_tracing();
    let silent = LeaderMode {
        heartbeat_interval_ms: 30,
        heartbeat_timeout_ms: 300,
        heartbeats: false,
        ..LeaderMode::new(2)
    };
    let mut leader = FakeReplica::start(Mode::Leader(silent)).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let first = leader.next_session().await;
    // The worker beats at the interval the leader asked for...
    common::wait_for("worker heartbeats", || first.heartbeats_received() >= 2).await;
    // ...and, hearing nothing back within the timeout, attaches again (while the first stream
    // is still open on the leader side).
    let second = leader.next_session().await;
    assert_eq!(second.register.worker_id, "w-test");
    common::wait_for("the first stream closed by the worker", || first.worker_closed()).await;
    let mut status = worker.status();
    wait_status(&mut status, "two registrations", |s| s.registrations >= 2).await;
    worker.shutdown().await;
}

/// The demo deployment with subtask `i` of every vertex on `workers[i % 2]`.
fn placed_deployment(dir: &Path, attempt: u32, workers: [(&str, &str); 2], key: &str) -> Deployment {
    let mut d = demo_deployment(dir, attempt);
    let graph: cairn_protocol::graph::JobGraph =
        serde_json::from_value(d.graph.clone()).expect("the demo graph");
    let subtasks = graph
        .vertices
        .iter()
        .flat_map(|v| {
            (0..v.parallelism).map(|i| PlacedSubtask {
                vertex: v.id.clone(),
                subtask: i,
                worker: workers[(i % 2) as usize].0.to_owned(),
            })
        })
        .collect();
    let addresses = workers.iter().map(|(w, a)| ((*w).to_owned(), (*a).to_owned())).collect();
    d.placement = Some(DeploymentPlacement { subtasks, addresses, exchange_key: key.to_owned() });
    d
}

#[tokio::test]
async fn a_job_placed_over_two_workers_checkpoints_across_their_link_and_fails_when_one_dies() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(2))).await;
    let wa = Worker::start(WorkerConfig { worker_id: Some("w-a".into()), ..config(&[&leader.addr]) })
        .expect("starts");
    let sa = leader.next_session().await;
    let wb = Worker::start(WorkerConfig { worker_id: Some("w-b".into()), ..config(&[&leader.addr]) })
        .expect("starts");
    let sb = leader.next_session().await;
    // Each worker announces the data exchange address it listens on.
    let addr = |s: &fake::FakeSession| s.register.data_addr.clone();
    assert!(
        addr(&sa).parse::<std::net::SocketAddr>().is_ok()
            && addr(&sb).parse::<std::net::SocketAddr>().is_ok()
    );
    let (sa, sb) = if sa.register.worker_id == "w-a" { (sa, sb) } else { (sb, sa) };
    let (mut sa, mut sb) = (sa, sb);
    // A generated secret is 64 hex digits: the form of an exchange key.
    let key = cairn_proto::auth::Secret::generate().expose().to_owned();
    let d = placed_deployment(dir.path(), 1, [("w-a", &addr(&sa)), ("w-b", &addr(&sb))], &key);

    // Each worker runs its share: source 0, count 0 and sink 0 on w-a; count 1 and sink 1 on w-b.
    sa.deploy(2, &d).await;
    sb.deploy(2, &d).await;
    sa.reports_until("w-a's 3 tasks running", |r| statuses_of(r, &TaskStatus::Running) == 3).await;
    sb.reports_until("w-b's 2 tasks running", |r| statuses_of(r, &TaskStatus::Running) == 2).await;

    // The barrier reaches w-b's counter over the link: every task of both workers acknowledges.
    sa.command(2, &trigger(1, 1)).await;
    sb.command(2, &trigger(1, 1)).await;
    sa.reports_until("w-a's 3 acknowledgements", |r| acks_of(r, 1) == 3).await;
    let reports = sb.reports_until("w-b's 2 acknowledgements", |r| acks_of(r, 1) == 2).await;
    assert!(reports.iter().all(|m| m.task().task.subtask == 1), "w-b runs only subtask 1s");

    // A deployment with a malformed key fails only the receiving worker's tasks, with the reason.
    let mut bad = placed_deployment(dir.path(), 2, [("w-a", &addr(&sa)), ("w-b", &addr(&sb))], "zz");
    bad.job_id = "other".into();
    sb.deploy(2, &bad).await;
    let reports = sb
        .reports_until("the bad deployment's 2 failures", |r| {
            r.iter()
                .filter(|m| matches!(m, TaskMessage::Status { status: TaskStatus::Failed(_), .. }))
                .count()
                == 2
        })
        .await;
    assert!(reports.iter().any(|m| matches!(m, TaskMessage::Status { status: TaskStatus::Failed(c), .. } if c.contains("exchange key must be 64 hex digits"))));

    // w-b dies abruptly: w-a's source loses its downstream across the link and fails.
    drop(wb);
    let reports = sa
        .reports_until("w-a's source to fail", |r| {
            r.iter().any(|m| matches!(m, TaskMessage::Status { task, status: TaskStatus::Failed(_) } if task.task.vertex == "source"))
        })
        .await;
    let cause = reports
        .iter()
        .find_map(|m| match m {
            TaskMessage::Status { status: TaskStatus::Failed(c), .. } => Some(c.clone()),
            _ => None,
        })
        .unwrap_or_default();
    assert!(cause.contains("gone"), "{cause}");
    wa.shutdown().await;
}

#[tokio::test]
async fn deployments_beyond_the_free_slots_fail_every_task() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(1))).await;
    // The demo job at parallelism 2 needs 2 slots (one per slot-sharing group).
    let worker = Worker::start(WorkerConfig { slots: 1, ..config(&[&leader.addr]) }).expect("starts");
    let mut session = leader.next_session().await;
    session.send_raw_deploy(1, b"[1, 2".to_vec()).await;
    session.deploy(1, &demo_deployment(dir.path(), 3)).await;
    let reports = session
        .reports_until("every task failed", |r| {
            r.iter()
                .filter(|m| matches!(m, TaskMessage::Status { status: TaskStatus::Failed(_), .. }))
                .count()
                == DEMO_TASKS
        })
        .await;
    for m in &reports {
        let TaskMessage::Status { task, status: TaskStatus::Failed(cause) } = m else { continue };
        assert_eq!(task.attempt, 3);
        assert!(cause.contains("needs 2 slots but only 1 of this worker's 1 are free"), "{cause}");
    }
    let jobs = worker.jobs().borrow().clone();
    assert!(jobs.tasks.is_empty());
    assert_eq!(jobs.deployments, 0);
    worker.shutdown().await;
}

#[tokio::test]
async fn a_new_attempt_replaces_the_running_one() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(1))).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let mut session = leader.next_session().await;
    session.deploy(1, &demo_deployment(dir.path(), 1)).await;
    all_running(&worker, 1).await;

    session.deploy(1, &demo_deployment(dir.path(), 2)).await;
    all_running(&worker, 2).await;
    let reports = session
        .reports_until("the old attempt canceled, the new one running", |r| {
            let old_canceled = r
                .iter()
                .filter(|m| {
                    m.task().attempt == 1
                        && matches!(m, TaskMessage::Status { status: TaskStatus::Canceled, .. })
                })
                .count();
            let new_running = r
                .iter()
                .filter(|m| {
                    m.task().attempt == 2
                        && matches!(m, TaskMessage::Status { status: TaskStatus::Running, .. })
                })
                .count();
            old_canceled == DEMO_TASKS && new_running == DEMO_TASKS
        })
        .await;
    assert!(!reports.is_empty());
    let jobs = worker.jobs().borrow().clone();
    assert_eq!(jobs.deployments, 2);
    assert_eq!(jobs.tasks.len(), DEMO_TASKS, "only the new attempt is hosted");
    worker.shutdown().await;
}

#[tokio::test]
async fn a_restore_assignment_that_does_not_cover_every_subtask_fails_the_deployment() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut leader = FakeReplica::start(Mode::Leader(LeaderMode::new(1))).await;
    let worker = Worker::start(config(&[&leader.addr])).expect("starts");
    let mut session = leader.next_session().await;
    let mut d = demo_deployment(dir.path(), 1);
    // The worker restores exactly what it is sent: an assignment without its subtasks is refused
    // (never read as "start empty").
    d.restore = Some(StateAssignment {
        checkpoint_id: 4,
        base_dir: dir.path().join("checkpoints").join(JOB),
        subtasks: Default::default(),
    });
    session.deploy(1, &d).await;
    let reports = session
        .reports_until("every task failed", |r| {
            r.iter()
                .filter(|m| matches!(m, TaskMessage::Status { status: TaskStatus::Failed(_), .. }))
                .count()
                == DEMO_TASKS
        })
        .await;
    for m in &reports {
        let TaskMessage::Status { status: TaskStatus::Failed(cause), .. } = m else { continue };
        assert!(cause.contains("restore assignment has no entry for subtask"), "{cause}");
    }
    assert!(worker.jobs().borrow().tasks.is_empty());
    worker.shutdown().await;
}

/// Fake replicas of the `TaskGateway` service, scripted by the test.
mod fake {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use cairn_proto::leader_hint::{LeaderHint, not_leader_status};
    use cairn_proto::v1::task_gateway_server::{TaskGateway, TaskGatewayServer};
    use cairn_proto::v1::{
        Heartbeat, LeaderMessage, RegisterWorker, Registered, ReportsConfirmed, WorkerMessage,
        leader_message, worker_message,
    };
    use cairn_protocol::messages::{Deployment, TaskCommand, TaskMessage};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
    use tonic::{Request, Response, Status, Streaming};

    use super::WAIT;

    #[derive(Debug, Clone)]
    pub struct LeaderMode {
        pub term: u64,
        pub leader_id: u64,
        pub heartbeat_interval_ms: u64,
        pub heartbeat_timeout_ms: u64,
        /// Confirms every numbered report as the real leader does.
        pub confirms: bool,
        /// Send heartbeats at the interval.
        pub heartbeats: bool,
        /// Announce that several reports may come in one message. A worker that sends a batch
        /// to a leader that did not announce it fails the test.
        pub batches: bool,
    }

    impl LeaderMode {
        pub fn new(term: u64) -> Self {
            Self {
                term,
                leader_id: 1,
                heartbeat_interval_ms: 100,
                heartbeat_timeout_ms: 10_000,
                heartbeats: true,
                confirms: true,
                batches: false,
            }
        }
    }

    #[derive(Debug, Clone)]
    pub enum Mode {
        Leader(LeaderMode),
        NotLeader(LeaderHint),
    }

    impl Mode {
        pub fn not_leader(leader_id: Option<u64>, leader_addr: Option<&str>) -> Self {
            Mode::NotLeader(LeaderHint { leader_id, leader_addr: leader_addr.map(str::to_owned) })
        }
    }

    /// An address nothing listens on.
    pub async fn dead_addr() -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        drop(l);
        addr
    }

    #[derive(Clone)]
    struct Gateway {
        mode: Arc<Mutex<Mode>>,
        attaches: Arc<AtomicUsize>,
        sessions: mpsc::Sender<FakeSession>,
    }

    pub struct FakeReplica {
        pub addr: String,
        mode: Arc<Mutex<Mode>>,
        attaches: Arc<AtomicUsize>,
        sessions: mpsc::Receiver<FakeSession>,
        server: tokio::task::JoinHandle<()>,
    }

    impl Drop for FakeReplica {
        fn drop(&mut self) {
            self.server.abort();
        }
    }

    impl FakeReplica {
        pub async fn start(mode: Mode) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr").to_string();
            let (tx, sessions) = mpsc::channel(16);
            let gateway = Gateway {
                mode: Arc::new(Mutex::new(mode)),
                attaches: Arc::new(AtomicUsize::new(0)),
                sessions: tx,
            };
            let (mode, attaches) = (gateway.mode.clone(), gateway.attaches.clone());
            let server = tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(TaskGatewayServer::new(gateway))
                    .serve_with_incoming(TcpListenerStream::new(listener))
                    .await;
            });
            Self { addr, mode, attaches, sessions, server }
        }

        pub fn set_mode(&self, mode: Mode) {
            *self.mode.lock().expect("mode lock") = mode;
        }

        pub fn attaches(&self) -> usize {
            self.attaches.load(Ordering::SeqCst)
        }

        /// The next registered session (bounded wait).
        pub async fn next_session(&mut self) -> FakeSession {
            match tokio::time::timeout(WAIT, self.sessions.recv()).await {
                Ok(Some(s)) => s,
                _ => panic!("no worker registered at {} within {WAIT:?}", self.addr),
            }
        }
    }

    /// One worker stream, from the leader's side. Dropping it ends the stream.
    pub struct FakeSession {
        pub register: RegisterWorker,
        to_worker: mpsc::Sender<LeaderMessage>,
        reports: mpsc::Receiver<TaskMessage>,
        heartbeats: Arc<AtomicUsize>,
        closed: Arc<AtomicBool>,
        received: Vec<TaskMessage>,
        /// The sequence numbers of every stream message's reports, in arrival order.
        pub messages: Arc<Mutex<Vec<Vec<u64>>>>,
    }

    impl FakeSession {
        pub async fn send(&self, term: u64, body: leader_message::Body) {
            self.to_worker.send(LeaderMessage { term, body: Some(body) }).await.expect("session open");
        }

        pub async fn deploy(&self, term: u64, d: &Deployment) {
            let json = serde_json::to_vec(d).expect("encodes");
            self.send(term, leader_message::Body::DeployJson(json)).await;
        }

        pub async fn command(&self, term: u64, c: &TaskCommand) {
            let json = serde_json::to_vec(c).expect("encodes");
            self.send(term, leader_message::Body::CommandJson(json)).await;
        }

        pub async fn send_raw_command(&self, term: u64, bytes: Vec<u8>) {
            self.send(term, leader_message::Body::CommandJson(bytes)).await;
        }

        pub async fn send_raw_deploy(&self, term: u64, bytes: Vec<u8>) {
            self.send(term, leader_message::Body::DeployJson(bytes)).await;
        }

        pub fn heartbeats_received(&self) -> usize {
            self.heartbeats.load(Ordering::SeqCst)
        }

        /// The worker ended its side of the stream.
        pub fn worker_closed(&self) -> bool {
            self.closed.load(Ordering::SeqCst)
        }

        /// Collects reports until `done` holds for all received so far (bounded wait).
        pub async fn reports_until(
            &mut self,
            what: &str,
            mut done: impl FnMut(&[TaskMessage]) -> bool,
        ) -> Vec<TaskMessage> {
            let deadline = tokio::time::Instant::now() + WAIT;
            while !done(&self.received) {
                match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                    Ok(Some(m)) => self.received.push(m),
                    Ok(None) => panic!("stream ended while waiting for {what}: {:?}", self.received),
                    Err(_) => panic!("timed out waiting for {what}; reports: {:#?}", self.received),
                }
            }
            self.received.clone()
        }
    }

    fn registered(mode: &LeaderMode) -> LeaderMessage {
        LeaderMessage {
            term: mode.term,
            body: Some(leader_message::Body::Registered(Registered {
                leader_id: mode.leader_id,
                heartbeat_interval_ms: mode.heartbeat_interval_ms,
                heartbeat_timeout_ms: mode.heartbeat_timeout_ms,
                report_batches: mode.batches,
            })),
        }
    }

    #[tonic::async_trait]
    impl TaskGateway for Gateway {
        type AttachStream = ReceiverStream<Result<LeaderMessage, Status>>;

        async fn attach(
            &self,
            request: Request<Streaming<WorkerMessage>>,
        ) -> Result<Response<Self::AttachStream>, Status> {
            self.attaches.fetch_add(1, Ordering::SeqCst);
            let mode = self.mode.lock().map_err(|_| Status::internal("poisoned"))?.clone();
            let mode = match mode {
                Mode::NotLeader(hint) => return Err(not_leader_status("attach", &hint)),
                Mode::Leader(m) => m,
            };
            let mut inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(64);
            let sessions = self.sessions.clone();
            tokio::spawn(async move {
                let Ok(Some(WorkerMessage { body: Some(worker_message::Body::Register(register)) })) =
                    inbound.message().await
                else {
                    let _ = tx.send(Err(Status::invalid_argument("first message must be register"))).await;
                    return;
                };
                if tx.send(Ok(registered(&mode))).await.is_err() {
                    return;
                }
                let (to_worker, mut from_test) = mpsc::channel(64);
                let (reports_tx, reports) = mpsc::channel(4096);
                let heartbeats = Arc::new(AtomicUsize::new(0));
                let closed = Arc::new(AtomicBool::new(false));
                let messages = Arc::new(Mutex::new(Vec::new()));
                let session = FakeSession {
                    register,
                    to_worker,
                    reports,
                    heartbeats: heartbeats.clone(),
                    closed: closed.clone(),
                    received: Vec::new(),
                    messages: messages.clone(),
                };
                if sessions.send(session).await.is_err() {
                    return;
                }
                let mut beat =
                    tokio::time::interval(Duration::from_millis(mode.heartbeat_interval_ms.max(1)));
                loop {
                    tokio::select! {
                        m = from_test.recv() => match m {
                            Some(m) => if tx.send(Ok(m)).await.is_err() { break },
                            // The test dropped the session: end the stream.
                            None => break,
                        },
                        m = inbound.message() => match m {
                            Ok(Some(WorkerMessage { body: Some(worker_message::Body::Heartbeat(_)) })) => {
                                heartbeats.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(Some(WorkerMessage { body: Some(body @ (worker_message::Body::Report(_) | worker_message::Body::Reports(_))) })) => {
                                let reports = match body {
                                    worker_message::Body::Reports(batch) => {
                                        assert!(mode.batches, "a batch of reports to a leader that did not announce batches");
                                        batch.reports
                                    }
                                    worker_message::Body::Report(r) => vec![r],
                                    _ => Vec::new(),
                                };
                                messages.lock().expect("messages lock").push(reports.iter().map(|r| r.seq).collect());
                                for r in &reports {
                                    let report: TaskMessage = serde_json::from_slice(&r.json).expect("a report decodes");
                                    let _ = reports_tx.try_send(report);
                                }
                                if mode.confirms && let Some(last) = reports.last() {
                                    let confirmed = LeaderMessage {
                                        term: mode.term,
                                        body: Some(leader_message::Body::Confirmed(ReportsConfirmed { up_to: last.seq })),
                                    };
                                    let _ = tx.try_send(Ok(confirmed));
                                }
                            }
                            // Time figures, every few seconds while attached: not what these tests look at.
                            Ok(Some(WorkerMessage { body: Some(worker_message::Body::TaskTimes(_)) })) => {}
                            Ok(Some(other)) => panic!("unexpected worker message {other:?}"),
                            Ok(None) | Err(_) => {
                                closed.store(true, Ordering::SeqCst);
                                break;
                            }
                        },
                        _ = beat.tick(), if mode.heartbeats => {
                            let hb = LeaderMessage {
                                term: mode.term,
                                body: Some(leader_message::Body::Heartbeat(Heartbeat { sequence: 0 })),
                            };
                            if tx.send(Ok(hb)).await.is_err() { break }
                        }
                    }
                }
            });
            Ok(Response::new(ReceiverStream::new(rx)))
        }
    }
}
