//! The task gateway and the leader's job driver, exercised by a scripted worker over real gRPC:
//! deployment, checkpoint completion notified only after the Raft commit, precise refusals of
//! bad input that change nothing, a leader that hands over naming its successor, a leader
//! stopped between the acknowledgements and the completion, and tasks' time figures turned into
//! the rates `DescribeJob` shows.

use std::time::Duration;

use anyhow::Context;
use cairn_client::LeaderClient;
use cairn_proto::auth::Secret;
use cairn_proto::leader_hint::parse_not_leader;
use cairn_proto::v1::task_gateway_client::TaskGatewayClient;
use cairn_proto::v1::{
    AttachedTask, Heartbeat, RegisterWorker, Report, ReportBatch, TaskTime, TaskTimes, WorkerMessage,
    leader_message, worker_message,
};
use cairn_protocol::checkpoint::{SubtaskState, TaskCheckpointMetrics};
use cairn_protocol::messages::{Deployment, TaskMessage, TaskStatus, ToTask};
use cairn_raft::model::JobId;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::init_test_logging;
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::scripted::{
    FromLeader, ScriptedWorker, attach_raw, attached, attempt_id, bearer, report_all_running, subtasks,
};
use cairn_tests::wait;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const T: Duration = Duration::from_secs(20);

fn spec(output: &std::path::Path, interval_ms: Option<u64>) -> String {
    let graph = DemoJob {
        source: SourceConfig::default(),
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 1,
        max_parallelism: 8,
    }
    .graph();
    let mut checkpoint = serde_json::json!({ "timeout": "30s" });
    if let Some(ms) = interval_ms {
        checkpoint["interval"] = serde_json::json!(format!("{ms}ms"));
    }
    serde_json::json!({ "graph": graph, "checkpoint": checkpoint }).to_string()
}

/// The replica a scripted worker is attached to.
fn attached_to(cluster: &InProcCluster, w: &ScriptedWorker) -> anyhow::Result<u64> {
    cluster
        .addrs
        .iter()
        .find(|(_, a)| a.to_string() == w.leader_addr)
        .map(|(id, _)| *id)
        .ok_or_else(|| anyhow::anyhow!("attached to {} which is no replica", w.leader_addr))
}

async fn deployed(w: &mut ScriptedWorker) -> anyhow::Result<Deployment> {
    match w.next_non_heartbeat(T).await? {
        FromLeader::Deploy(d) => Ok(*d),
        other => anyhow::bail!("expected a deployment, got {other:?}"),
    }
}

/// One replica running job `j` (the demo job's graph, checkpoints every `interval_ms` when
/// given, a 30 s checkpoint timeout), with scripted worker `w1` (8 slots) attached.
struct OneReplica {
    cluster: InProcCluster,
    client: LeaderClient,
    token: Secret,
    /// The job's output directory, kept for the test's life.
    _out: tempfile::TempDir,
}

impl OneReplica {
    /// The replica, the job, and worker `w1` with the job's deployment in hand.
    async fn start(interval_ms: Option<u64>) -> anyhow::Result<(Self, ScriptedWorker, Deployment)> {
        init_test_logging();
        let cluster = InProcCluster::start(1, test_timing()).await?;
        cluster.wait_leader(T).await?;
        let out = tempfile::tempdir()?;
        let mut client = cluster.client()?;
        client.register_job("j", &spec(out.path(), interval_ms)).await?;
        let token = cluster.worker_token();
        let setup = Self { cluster, client, token, _out: out };
        let mut w = setup.attach(vec![]).await?;
        let d = deployed(&mut w).await?;
        Ok((setup, w, d))
    }

    /// Worker `w1` attaching on a new stream, registering `tasks` as running.
    async fn attach(&self, tasks: Vec<AttachedTask>) -> anyhow::Result<ScriptedWorker> {
        let addrs: Vec<String> = self.cluster.addrs.values().map(|a| a.to_string()).collect();
        ScriptedWorker::attach(&addrs, self.token.expose(), "w1", 8, tasks, T).await
    }

    /// Waits (bounded) for job `j` to run.
    async fn job_running(&self) -> anyhow::Result<()> {
        wait::until("the job to run", T, || async {
            let r = self.cluster.client().ok()?.job_runtimes().await.ok()?;
            r.jobs.iter().any(|j| j.job_id == "j" && j.phase == "running").then_some(())
        })
        .await
    }
}

fn ack(d: &Deployment, vertex: &str, subtask: u32, checkpoint_id: u64) -> TaskMessage {
    TaskMessage::Acknowledge {
        task: attempt_id(d, vertex, subtask),
        checkpoint_id,
        state: SubtaskState::default(),
        metrics: TaskCheckpointMetrics::default(),
    }
}

fn is_trigger(c: &cairn_protocol::messages::TaskCommand) -> Option<u64> {
    match c.body {
        ToTask::TriggerCheckpoint { checkpoint_id, .. } => Some(checkpoint_id),
        _ => None,
    }
}

/// Waits (bounded) for the next trigger on `w`'s stream: its checkpoint id.
async fn next_trigger(w: &mut ScriptedWorker) -> anyhow::Result<u64> {
    let trigger = w.expect_command(T, |c| is_trigger(c).is_some()).await?;
    is_trigger(&trigger).ok_or_else(|| anyhow::anyhow!("no trigger"))
}

/// Every task of `d` acknowledges checkpoint `id` with empty state, one report each.
async fn ack_all(w: &ScriptedWorker, d: &Deployment, id: u64) -> anyhow::Result<()> {
    for (v, i) in subtasks(d)? {
        w.report(&ack(d, &v, i, id)).await?;
    }
    Ok(())
}

/// Waits (bounded) for the completion notice of checkpoint `id` on `w`'s stream.
async fn notified_complete(w: &mut ScriptedWorker, id: u64) -> anyhow::Result<()> {
    w.expect_command(
        T,
        |c| matches!(c.body, ToTask::NotifyCheckpointComplete { checkpoint_id } if checkpoint_id == id),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_gateway_input_is_refused_precisely_and_changes_nothing() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(1, test_timing()).await?;
    let leader = cluster.wait_leader(T).await?;
    let out = tempfile::tempdir()?;
    let mut client = cluster.client()?;
    client.register_job("j", &spec(out.path(), Some(300))).await?;
    let addrs: Vec<String> = cluster.addrs.values().map(|a| a.to_string()).collect();
    let token = cluster.worker_token();

    // A stream whose first message is not `register` is refused.
    let mut raw = TaskGatewayClient::connect(format!("http://{}", addrs[0])).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WorkerMessage { body: Some(worker_message::Body::Heartbeat(Heartbeat { sequence: 1 })) }).await?;
    let st = raw.attach(bearer(ReceiverStream::new(rx), token.expose())).await.expect_err("must be refused");
    assert_eq!(st.code(), Code::InvalidArgument);
    assert!(st.message().contains("register"), "{}", st.message());

    // Garbage bytes where a protobuf message should be: a precise status, nothing registered.
    let st = attach_raw(&addrs[0], token.expose(), vec![vec![0xff, 0xfe, 0x07, 0x00, 0x13]]).await?;
    assert_eq!(st.code(), Code::InvalidArgument, "{st}");
    assert!(st.message().contains("decode"), "{}", st.message());

    // A data exchange address that is not host:port: refused, naming the field.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let register = cairn_proto::v1::RegisterWorker {
        worker_id: "w-bad".into(),
        slots: 4,
        data_addr: "no port here".into(),
        ..Default::default()
    };
    tx.send(WorkerMessage { body: Some(worker_message::Body::Register(register)) }).await?;
    let st = raw.attach(bearer(ReceiverStream::new(rx), token.expose())).await.expect_err("must be refused");
    assert_eq!(st.code(), Code::InvalidArgument);
    assert!(st.message().contains("register.data_addr"), "{}", st.message());

    let mut w = ScriptedWorker::attach(&addrs, token.expose(), "w1", 8, vec![], T).await?;
    let d = deployed(&mut w).await?;
    assert_eq!(d.job_id, "j");
    assert_eq!(d.attempt, 1);
    report_all_running(&w, &d).await?;
    let trigger = w.expect_command(T, |c| is_trigger(c).is_some()).await?;
    let id = is_trigger(&trigger).ok_or_else(|| anyhow::anyhow!("no trigger"))?;
    assert_eq!(trigger.tasks, vec![("source".to_string(), 0)], "only sources are triggered");

    let job = JobId::new("j")?;
    let reader =
        cluster.replica(leader).ok_or_else(|| anyhow::anyhow!("no leader"))?.context().reader.clone();
    let before = reader.job(&job).map(|j| (j.completed.clone(), j.status.clone()));

    // Garbage report bytes.
    w.send(worker_message::Body::ReportJson(b"\x00\xffnot json".to_vec())).await?;
    let e = w.expect_error(T).await?;
    assert_eq!(e.code, Code::InvalidArgument as i32);
    assert!(e.message.contains("report_json"), "{}", e.message);
    // Unknown job.
    let mut other = ack(&d, "source", 0, id);
    if let TaskMessage::Acknowledge { task, .. } = &mut other {
        task.task.job = "nope".into();
    }
    w.report(&other).await?;
    let e = w.expect_error(T).await?;
    assert_eq!(e.code, Code::NotFound as i32, "{}", e.message);
    assert!(e.message.contains("unknown job `nope`"), "{}", e.message);
    // Unknown task.
    w.report(&ack(&d, "nope", 0, id)).await?;
    let e = w.expect_error(T).await?;
    assert_eq!(e.code, Code::NotFound as i32, "{}", e.message);
    // An ack for a future checkpoint id.
    w.report(&ack(&d, "source", 0, id + 1000)).await?;
    let e = w.expect_error(T).await?;
    assert_eq!(e.code, Code::InvalidArgument as i32);
    assert!(e.message.contains("never triggered"), "{}", e.message);
    // An ack from an unknown attempt.
    let mut stale = ack(&d, "source", 0, id);
    if let TaskMessage::Acknowledge { task, .. } = &mut stale {
        task.attempt = 77;
    }
    w.report(&stale).await?;
    let e = w.expect_error(T).await?;
    assert_eq!(e.code, Code::FailedPrecondition as i32, "{}", e.message);
    // A valid ack, then the same ack again.
    w.report(&ack(&d, "source", 0, id)).await?;
    w.report(&ack(&d, "source", 0, id)).await?;
    let e = w.expect_error(T).await?;
    assert_eq!(e.code, Code::AlreadyExists as i32, "{}", e.message);

    // None of it changed the replicated store, and the stream still works.
    assert_eq!(reader.job(&job).map(|j| (j.completed.clone(), j.status.clone())), before);

    // The remaining acks complete the checkpoint; the notification comes after the commit.
    for (v, i) in subtasks(&d)? {
        if v != "source" {
            w.report(&ack(&d, &v, i, id)).await?;
        }
    }
    notified_complete(&mut w, id).await?;
    let rec = reader.job(&job).ok_or_else(|| anyhow::anyhow!("job gone"))?;
    assert_eq!(rec.completed.last().map(|c| c.id), Some(id), "notified before it was in the store");
    assert!(std::path::Path::new(&rec.completed[0].metadata_path).exists(), "_metadata was not written");

    // An oversized message ends that stream with a precise status; a new stream works.
    w.send(worker_message::Body::ReportJson(vec![b' '; 17 * 1024 * 1024])).await?;
    let refusal = loop {
        match w.next(T).await {
            Ok(FromLeader::Error(e)) => break e,
            Ok(_) => continue,
            Err(e) => anyhow::bail!("the stream ended without saying why: {e}"),
        }
    };
    assert_eq!(refusal.code, Code::OutOfRange as i32, "{refusal:?}");
    let w2 = ScriptedWorker::attach(&addrs, token.expose(), "w1", 8, attached(&d)?, T).await?;
    assert_eq!(w2.term, w.term);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_refuses_attach_with_leader_hint() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    let token = cluster.worker_token();
    // Under load a follower may briefly lose track of the leader (an election in progress, when
    // the hint is rightly empty) or not know its address yet; poll until the cluster is stable
    // and check the hint then.
    let (leader, hint) = cairn_tests::wait::until("a follower's refusal naming the leader", T, || async {
        let leader = cluster.wait_leader(T).await.ok()?;
        let follower = *cluster.addrs.keys().find(|id| **id != leader)?;
        let mut raw =
            TaskGatewayClient::connect(format!("http://{}", cluster.addrs[&follower])).await.ok()?;
        let (_tx, rx) = tokio::sync::mpsc::channel::<WorkerMessage>(1);
        let st = raw.attach(bearer(ReceiverStream::new(rx), token.expose())).await.err()?;
        let hint = parse_not_leader(&st)?;
        // A follower that knows the leader from its heartbeats but has not applied the
        // membership entry naming its address yet rightly hints the id alone.
        (hint.leader_id.is_some() && hint.leader_addr.is_some()).then_some((leader, hint))
    })
    .await?;
    assert_eq!(hint.leader_id, Some(leader));
    assert_eq!(hint.leader_addr, Some(cluster.addrs[&leader].to_string()));
    cluster.shutdown().await;
    Ok(())
}

/// A leader that hands its leadership over (as on SIGTERM, in a rolling restart) ends its
/// workers' streams with the not-leader status naming its successor, so they go straight there
/// instead of searching the replicas with pauses in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_ends_worker_streams_naming_the_successor() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(T).await?;
    let addrs: Vec<String> = cluster.addrs.values().map(|a| a.to_string()).collect();
    let token = cluster.worker_token();
    let mut w = ScriptedWorker::attach(&addrs, token.expose(), "w1", 8, vec![], T).await?;
    let old = attached_to(&cluster, &w)?;
    let replica = cluster.replica(old).ok_or_else(|| anyhow::anyhow!("replica {old} is not running"))?;
    let ended = async {
        loop {
            if let Err(e) = w.next_non_heartbeat(T).await {
                return e;
            }
        }
    };
    let (handed, ended) = tokio::join!(replica.hand_off_leadership(T), ended);
    let (new, term) = handed?.ok_or_else(|| anyhow::anyhow!("replica {old} had nothing to hand over"))?;
    assert_ne!(new, old);
    assert!(term > w.term, "the new term {term} is not above {}", w.term);
    let status = ended
        .downcast_ref::<tonic::Status>()
        .ok_or_else(|| anyhow::anyhow!("the stream ended without a status: {ended:#}"))?;
    let hint =
        parse_not_leader(status).ok_or_else(|| anyhow::anyhow!("not a not-leader status: {status:?}"))?;
    assert_eq!(hint.leader_id, Some(new), "{status:?}");
    assert_eq!(hint.leader_addr, Some(cluster.addrs[&new].to_string()), "{status:?}");
    cluster.shutdown().await;
    Ok(())
}

/// Only failed attaches count against their source address: more workers than the limiter's
/// burst attach from one address, one right after the other, each at its first attempt (as a
/// fleet behind one address re-attaches after a failover); a caller from that address that keeps
/// failing authentication is refused once its failures used up the burst, and then so is
/// everything from that address, valid token or not, while the attached workers stay attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_failed_attaches_count_against_their_source() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(1, test_timing()).await?;
    let leader = cluster.wait_leader(T).await?;
    let addr = cluster.addrs[&leader].to_string();
    let token = cluster.worker_token();
    let burst = cairn_coordinator::gateway::limit::ATTACH_BURST;
    let mut workers = Vec::new();
    for i in 0..burst + 10 {
        // No time to retry: one attempt each.
        let w = ScriptedWorker::attach(
            std::slice::from_ref(&addr),
            token.expose(),
            &format!("w{i}"),
            1,
            vec![],
            Duration::ZERO,
        )
        .await
        .with_context(|| format!("worker {i} of {}", burst + 10))?;
        workers.push(w);
    }
    for i in 0..burst {
        let st = attach_raw(&addr, "not-the-token", vec![]).await?;
        assert_eq!(st.code(), Code::Unauthenticated, "guess {i}: {st:?}");
    }
    let st = attach_raw(&addr, "not-the-token", vec![]).await?;
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert!(st.message().contains("too many failed attach attempts from 127.0.0.1"), "{st:?}");
    let late = ScriptedWorker::attach(
        std::slice::from_ref(&addr),
        token.expose(),
        "late",
        1,
        vec![],
        Duration::ZERO,
    )
    .await;
    let error = late.err().ok_or_else(|| anyhow::anyhow!("attached from a source that is locked out"))?;
    assert!(format!("{error:#}").contains("too many failed attach attempts"), "{error:#}");
    // The workers that attached are still attached: the leader keeps talking to every one.
    for w in &mut workers {
        let msg = w.next(T).await.with_context(|| format!("worker {}", w.worker_id))?;
        assert!(matches!(msg, FromLeader::Heartbeat), "worker {}: {msg:?}", w.worker_id);
    }
    cluster.shutdown().await;
    Ok(())
}

/// The leader is stopped right after the last acknowledgement. Either the checkpoint made it
/// into the store (and the new leader notifies it), or it did not (and nobody ever notifies it);
/// checkpoint ids continue above every id seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_stopped_between_ack_and_completion() -> anyhow::Result<()> {
    init_test_logging();
    let mut cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(T).await?;
    let out = tempfile::tempdir()?;
    let mut client = cluster.client()?;
    client.register_job("j", &spec(out.path(), Some(200))).await?;
    let addrs: Vec<String> = cluster.addrs.values().map(|a| a.to_string()).collect();
    let token = cluster.worker_token();

    let mut w = ScriptedWorker::attach(&addrs, token.expose(), "w1", 8, vec![], T).await?;
    let d = deployed(&mut w).await?;
    report_all_running(&w, &d).await?;
    let id = next_trigger(&mut w).await?;
    ack_all(&w, &d, id).await?;
    // Stop the replica this worker is attached to (under load, leadership may have moved since the
    // trigger; the scenario is the same: the replica that heard the acknowledgements goes away).
    let old = attached_to(&cluster, &w)?;
    cluster.stop(old).await;
    // The stopped replica's port is free for anyone (another test's cluster may take it): only
    // dial the replicas that still run.
    let addrs: Vec<String> =
        cluster.addrs.iter().filter(|(id, _)| **id != old).map(|(_, a)| a.to_string()).collect();
    // Drain what the old leader sent before it stopped.
    let mut notified_by_old = false;
    while let Ok(m) = w.next(Duration::from_millis(500)).await {
        if let FromLeader::Command(c) = m
            && matches!(c.body, ToTask::NotifyCheckpointComplete { checkpoint_id } if checkpoint_id == id)
        {
            notified_by_old = true;
        }
    }
    // A linearizable read on whichever replica leads next: is the checkpoint in the replicated
    // store? It runs while the worker re-attaches (a real worker does not wait for it: the
    // re-attach grace period runs from the new leader's start).
    let mut reader = LeaderClient::new(&addrs, cluster.client_config())?;
    let in_store =
        tokio::spawn(
            async move { reader.get_job("j").await.map(|r| r.completed_checkpoint_ids.contains(&id)) },
        );

    // The tasks re-attach to the new leader, which keeps them (no restart). Under load another
    // election may end a stream; the worker then re-attaches again, as a real worker does.
    let old_term = w.term;
    let mut notified = notified_by_old;
    let mut next_trigger = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while next_trigger.is_none() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        anyhow::ensure!(!left.is_zero(), "no trigger under a new leader within 90s");
        let mut w = ScriptedWorker::attach(&addrs, token.expose(), "w1", 8, attached(&d)?, left)
            .await
            .context("re-attaching to a new leader")?;
        assert!(w.term > old_term, "re-attached to term {} after term {old_term}", w.term);
        while next_trigger.is_none() {
            let Ok(msg) = w.next_non_heartbeat(T).await else { break };
            match msg {
                FromLeader::Command(c) => match c.body {
                    ToTask::NotifyCheckpointComplete { checkpoint_id } if checkpoint_id == id => {
                        notified = true
                    }
                    ToTask::TriggerCheckpoint { checkpoint_id, .. } => next_trigger = Some(checkpoint_id),
                    ToTask::Cancel => anyhow::bail!("the new leader restarted tasks that all re-attached"),
                    _ => {}
                },
                FromLeader::Deploy(_) => {
                    anyhow::bail!("the new leader redeployed tasks that all re-attached")
                }
                _ => {}
            }
        }
    }
    let in_store = in_store.await?.context("reading the job from the new leader")?;
    if notified_by_old {
        assert!(
            in_store,
            "checkpoint {id} was notified by the old leader but is not in the replicated store"
        );
    }
    assert_eq!(notified, in_store, "notified ({notified}) must equal present in the store ({in_store})");
    let next = next_trigger.ok_or_else(|| anyhow::anyhow!("no trigger"))?;
    assert!(next > id, "checkpoint id {next} under the new leader is not above {id}");
    cluster.shutdown().await;
    Ok(())
}

/// Numbered reports sent back to back (the leader pipelines them) are answered in order: the
/// refusal of an undecodable one arrives before it is confirmed, confirmations only grow, the
/// last one covers every report, and the reports around the bad one take effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbered_reports_are_answered_in_order() -> anyhow::Result<()> {
    let (setup, mut w, d) = OneReplica::start(None).await?;

    let mut seq = 0u64;
    let mut bad_seq = 0u64;
    for (k, (v, i)) in subtasks(&d)?.into_iter().enumerate() {
        if k == 1 {
            seq += 1;
            bad_seq = seq;
            w.send(worker_message::Body::Report(Report { seq, json: b"{not json".to_vec() })).await?;
        }
        seq += 1;
        let running = TaskMessage::Status { task: attempt_id(&d, &v, i), status: TaskStatus::Running };
        w.send(worker_message::Body::Report(Report { seq, json: serde_json::to_vec(&running)? })).await?;
    }
    anyhow::ensure!(bad_seq > 0, "the job has fewer than two tasks");

    let (mut confirmed, mut refusals) = (Vec::new(), Vec::new());
    while confirmed.last() != Some(&seq) {
        match w.next_non_heartbeat(T).await? {
            FromLeader::Confirmed(up_to) => confirmed.push(up_to),
            FromLeader::Error(e) => refusals.push((e, confirmed.last().copied().unwrap_or(0))),
            _ => {}
        }
    }
    assert!(confirmed.windows(2).all(|c| c[0] < c[1]), "confirmations go back: {confirmed:?}");
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    let (refusal, confirmed_before) = &refusals[0];
    assert_eq!(refusal.code, Code::InvalidArgument as i32, "{refusal:?}");
    assert!(refusal.message.contains("report.json"), "{}", refusal.message);
    assert!(*confirmed_before < bad_seq, "report {bad_seq} was confirmed before its refusal");
    // Every running report was handled: the job runs.
    setup.job_running().await?;
    setup.cluster.shutdown().await;
    Ok(())
}

fn numbered(first_seq: u64, reports: &[TaskMessage]) -> anyhow::Result<Vec<Report>> {
    let mut seq = first_seq;
    reports
        .iter()
        .map(|m| {
            let json = serde_json::to_vec(m)?;
            seq += 1;
            Ok(Report { seq: seq - 1, json })
        })
        .collect()
}

fn batch(reports: Vec<Report>) -> worker_message::Body {
    worker_message::Body::Reports(ReportBatch { reports })
}

/// Reads leader messages until `up_to` is confirmed; returns the refusals seen before it and
/// the commands seen on the way.
async fn until_confirmed(
    w: &mut ScriptedWorker,
    up_to: u64,
) -> anyhow::Result<(Vec<cairn_proto::v1::GatewayError>, Vec<u64>, Vec<cairn_protocol::messages::TaskCommand>)>
{
    let (mut refusals, mut confirmed, mut commands) = (Vec::new(), Vec::new(), Vec::new());
    while confirmed.last() != Some(&up_to) {
        match w.next_non_heartbeat(T).await? {
            FromLeader::Confirmed(c) => {
                anyhow::ensure!(c <= up_to, "confirmed {c}, beyond the {up_to} reports sent");
                confirmed.push(c);
            }
            FromLeader::Error(e) => refusals.push(e),
            FromLeader::Command(c) => commands.push(c),
            other => anyhow::bail!("unexpected {other:?} before confirmation {up_to}"),
        }
    }
    Ok((refusals, confirmed, commands))
}

/// A batch of reports is handled as its reports, in order: the tasks' `running` reports start
/// the job and their acknowledgements complete a checkpoint, each in one message. A report in
/// the batch that does not decode, and one about a job that does not exist, are refused
/// precisely without disturbing the others, and one confirmation covers the whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_reports_is_handled_as_its_reports_and_confirmed_once() -> anyhow::Result<()> {
    let (mut setup, mut w, d) = OneReplica::start(Some(200)).await?;
    assert!(w.report_batches, "the leader does not announce report batches");

    let tasks = subtasks(&d)?;
    let running: Vec<TaskMessage> = tasks
        .iter()
        .map(|(v, i)| TaskMessage::Status { task: attempt_id(&d, v, *i), status: TaskStatus::Running })
        .collect();
    let mut stranger = running[0].clone();
    if let TaskMessage::Status { task, .. } = &mut stranger {
        task.task.job = "no-such-job".into();
    }
    let mut reports = numbered(1, &running)?;
    reports.insert(1, Report { seq: 0, json: b"{not json".to_vec() });
    reports.push(Report { seq: 0, json: serde_json::to_vec(&stranger)? });
    for (k, r) in reports.iter_mut().enumerate() {
        r.seq = k as u64 + 1;
    }
    let last = reports.len() as u64;
    w.send(batch(reports)).await?;
    let (refusals, confirmed, commands) = until_confirmed(&mut w, last).await?;
    assert_eq!(confirmed, vec![last], "one confirmation covers the batch");
    let mut codes: Vec<Code> = refusals.iter().map(|e| Code::from(e.code)).collect();
    codes.sort_by_key(|c| *c as i32);
    assert_eq!(codes, vec![Code::InvalidArgument, Code::NotFound], "{refusals:?}");
    assert!(refusals.iter().any(|e| e.message.contains("reports.reports[1].json")), "{refusals:?}");
    assert!(refusals.iter().any(|e| e.message.contains("no-such-job")), "{refusals:?}");
    setup.job_running().await?;

    // Every task acknowledges the next trigger in one batch: the checkpoint completes.
    let trigger = match commands.into_iter().find(|c| is_trigger(c).is_some()) {
        Some(c) => c,
        None => w.expect_command(T, |c| is_trigger(c).is_some()).await?,
    };
    let id = is_trigger(&trigger).ok_or_else(|| anyhow::anyhow!("no trigger"))?;
    let acks: Vec<TaskMessage> = tasks.iter().map(|(v, i)| ack(&d, v, *i, id)).collect();
    let acks = numbered(last + 1, &acks)?;
    let last = acks.last().map(|r| r.seq).unwrap_or(last);
    w.send(batch(acks)).await?;
    let (refusals, _, _) = until_confirmed(&mut w, last).await?;
    assert!(refusals.is_empty(), "acknowledgements refused: {refusals:?}");
    notified_complete(&mut w, id).await?;
    let job = setup.client.get_job("j").await?;
    assert!(job.completed_checkpoint_ids.contains(&id), "checkpoint {id} is not in the store: {job:?}");
    setup.cluster.shutdown().await;
    Ok(())
}

/// A batch that is empty, too large, or numbered out of order is refused whole, precisely, and
/// none of its reports takes effect; the same reports in a proper batch then do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_batches_are_refused_whole_and_change_nothing() -> anyhow::Result<()> {
    let (mut setup, mut w, d) = OneReplica::start(None).await?;
    let running: Vec<TaskMessage> = subtasks(&d)?
        .iter()
        .map(|(v, i)| TaskMessage::Status { task: attempt_id(&d, v, *i), status: TaskStatus::Running })
        .collect();
    anyhow::ensure!(running.len() >= 2, "the job has fewer than two tasks");

    let mut backwards = numbered(1, &running)?;
    backwards.reverse();
    let too_many: Vec<Report> = (1..=4097).map(|seq| Report { seq, json: b"{}".to_vec() }).collect();
    let cases = [
        (Vec::new(), "holds no report"),
        (backwards, "sequence numbers must increase"),
        (too_many, "4097 reports in one batch; at most 4096"),
    ];
    for (reports, expected) in cases {
        w.send(batch(reports)).await?;
        let e = w.expect_error(T).await?;
        assert_eq!(e.code, Code::InvalidArgument as i32, "{e:?}");
        assert!(e.message.contains(expected), "expected {expected:?} in {:?}", e.message);
    }
    // The refusals came from the stream's reader before it handed anything over, so nothing of
    // those batches reached the job: it still waits for its tasks to run.
    let r = setup.client.job_runtimes().await?;
    let phase = r.jobs.iter().find(|j| j.job_id == "j").map(|j| j.phase.clone());
    assert_ne!(phase.as_deref(), Some("running"), "a refused batch started the job");

    let reports = numbered(1, &running)?;
    let last = reports.len() as u64;
    w.send(batch(reports)).await?;
    let (refusals, _, _) = until_confirmed(&mut w, last).await?;
    assert!(refusals.is_empty(), "{refusals:?}");
    setup.job_running().await?;
    setup.cluster.shutdown().await;
    Ok(())
}

/// A trigger that a worker's stream took but that never reached the worker (the worker attached
/// again on a new stream before acknowledging it) does not hold the job for the checkpoint's
/// whole timeout: the new stream gets the pending checkpoint's abort and a fresh trigger at once,
/// and the fresh one completes. The job is neither cancelled nor redeployed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_lost_with_a_replaced_stream_is_aborted_and_triggered_again() -> anyhow::Result<()> {
    // The checkpoint timeout (30 s) is longer than any wait below.
    let (setup, mut first, d) = OneReplica::start(Some(200)).await?;
    report_all_running(&first, &d).await?;
    let lost = next_trigger(&mut first).await?;

    // The worker attaches again, on a new stream, with its running tasks; the first stream
    // stays open but its trigger is never acknowledged.
    let mut second = setup.attach(attached(&d)?).await?;
    let mut aborted = false;
    let next = loop {
        match second.next_non_heartbeat(T).await.context("waiting for a fresh trigger")? {
            FromLeader::Command(c) => match c.body {
                ToTask::NotifyCheckpointAborted { checkpoint_id } if checkpoint_id == lost => aborted = true,
                ToTask::TriggerCheckpoint { checkpoint_id, .. } => break checkpoint_id,
                ToTask::Cancel => anyhow::bail!("the job's tasks were cancelled"),
                _ => {}
            },
            FromLeader::Deploy(_) => anyhow::bail!("the job was redeployed"),
            _ => {}
        }
    };
    assert!(next > lost, "fresh trigger {next} is not above the lost {lost}");
    assert!(aborted, "checkpoint {lost} was not aborted on the new stream before {next} was triggered");
    ack_all(&second, &d, next).await?;
    notified_complete(&mut second, next).await?;
    drop(first);
    setup.cluster.shutdown().await;
    Ok(())
}

/// `registered` is the first message on every stream, even when the jobs the worker runs answer
/// its attach at once (here: a cancel for a superseded attempt it lists), because a worker
/// ignores whatever comes before `registered`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_comes_first_even_when_jobs_answer_the_attach_at_once() -> anyhow::Result<()> {
    let (setup, w, d) = OneReplica::start(None).await?;
    report_all_running(&w, &d).await?;
    setup.job_running().await?;
    let mut tasks = attached(&d)?;
    let superseded = d.attempt as u64 + 100;
    tasks.extend(attached(&d)?.into_iter().map(|t| AttachedTask { attempt: superseded, ..t }));
    for round in 0..20 {
        let mut gateway = TaskGatewayClient::connect(format!("http://{}", w.leader_addr)).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let register = RegisterWorker {
            worker_id: "w1".into(),
            slots: 8,
            tasks: tasks.clone(),
            highest_term_seen: 0,
            data_addr: String::new(),
        };
        tx.send(WorkerMessage { body: Some(worker_message::Body::Register(register)) }).await?;
        let mut inbound =
            gateway.attach(bearer(ReceiverStream::new(rx), setup.token.expose())).await?.into_inner();
        let first = tokio::time::timeout(T, inbound.message()).await??.context("the stream ended")?;
        assert!(
            matches!(first.body, Some(leader_message::Body::Registered(_))),
            "round {round}: the first message was {first:?}"
        );
        // The cancel of the superseded attempt follows on the same stream.
        loop {
            let m = tokio::time::timeout(T, inbound.message()).await??.context("the stream ended")?;
            if let Some(leader_message::Body::CommandJson(json)) = m.body {
                let c: cairn_protocol::messages::TaskCommand = serde_json::from_slice(&json)?;
                if matches!(c.body, ToTask::Cancel) && u64::from(c.attempt) == superseded {
                    break;
                }
            }
        }
    }
    setup.cluster.shutdown().await;
    Ok(())
}

/// Reports go from a stream straight to the job's driver, so the session check is the stream's
/// own: once the worker registered again on a new stream, a report on the old one is refused
/// (or finds the old stream closed) and counts for nothing; the same report on the new stream
/// is accepted and completes the checkpoint (the fresh one the new stream was triggered with).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_a_superseded_session_are_refused() -> anyhow::Result<()> {
    let (setup, mut old, d) = OneReplica::start(Some(300)).await?;
    report_all_running(&old, &d).await?;
    let id = next_trigger(&mut old).await?;

    // The same worker registers again on a new stream, with the tasks it runs. The trigger of
    // checkpoint `id` may have been lost with the old stream, so the new one gets a fresh one.
    let mut new = setup.attach(attached(&d)?).await?;
    let fresh = new.expect_command(T, |c| is_trigger(c).is_some_and(|n| n > id)).await?;
    let next = is_trigger(&fresh).ok_or_else(|| anyhow::anyhow!("no trigger"))?;
    old.report(&ack(&d, "source", 0, next)).await?;
    match old.expect_error(T).await {
        Ok(e) => {
            assert_eq!(e.code, Code::FailedPrecondition as i32, "{}", e.message);
            assert!(e.message.contains("not attached to this leader"), "{}", e.message);
        }
        Err(e) => assert!(e.to_string().contains("ended the stream"), "{e:#}"),
    }
    // Had the old stream's acknowledgement counted, this one would be a duplicate.
    ack_all(&new, &d, next).await?;
    notified_complete(&mut new, next).await?;
    setup.cluster.shutdown().await;
    Ok(())
}

/// A deployment sent on a stream that broke before the worker read it is not waited for
/// forever: when the worker registers again without the job's tasks, the job is deployed again
/// (a new attempt) on the new stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_lost_with_its_stream_is_sent_again() -> anyhow::Result<()> {
    let (setup, old, first) = OneReplica::start(Some(300)).await?;
    assert_eq!(first.attempt, 1);
    // The worker never read it: its new stream lists no tasks.
    drop(old);
    let mut new = setup.attach(vec![]).await?;
    let again = deployed(&mut new).await?;
    assert_eq!(again.job_id, "j");
    assert!(again.attempt > first.attempt, "attempt {} after {}", again.attempt, first.attempt);
    report_all_running(&new, &again).await?;
    setup.job_running().await?;
    setup.cluster.shutdown().await;
    Ok(())
}

/// One task's cumulative figures, `[busy, idle, back-pressured]` in ms.
fn task_time(
    d: &Deployment,
    vertex: &str,
    subtask: u32,
    attempt: u32,
    [busy, idle, bp]: [u64; 3],
) -> TaskTime {
    TaskTime {
        job_id: d.job_id.clone(),
        vertex: vertex.to_owned(),
        subtask,
        attempt: u64::from(attempt),
        busy_ms: busy,
        idle_ms: idle,
        back_pressured_ms: bp,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_figures_become_rates_in_describe_and_nonsense_is_ignored() -> anyhow::Result<()> {
    let (setup, mut w, d) = OneReplica::start(None).await?;
    report_all_running(&w, &d).await?;
    let tasks = subtasks(&d)?;
    let all = |figures: [u64; 3]| -> Vec<TaskTime> {
        tasks.iter().map(|(v, i)| task_time(&d, v, *i, d.attempt, figures)).collect()
    };
    let send = |times: Vec<TaskTime>| w.send(worker_message::Body::TaskTimes(TaskTimes { tasks: times }));

    send(all([0, 0, 0])).await?;
    // Nonsense in between: a task the job does not have, and another attempt's figures.
    let (v0, i0) = tasks.first().cloned().context("no tasks")?;
    send(vec![
        task_time(&d, "nope", 0, d.attempt, [1, 1, 1]),
        task_time(&d, &v0, i0, d.attempt + 1, [0, 0, 1_000]),
    ])
    .await?;
    // 1.5 s of running time each: 450 ms back-pressured, 300 ms idle.
    send(all([750, 300, 450])).await?;
    // After it: counters going backwards, and an hour of back-pressure in no time.
    send(all([0, 0, 0])).await?;
    send(all([750, 300, 450 + 3_600_000])).await?;
    // A refused report after them: once its refusal is back, the driver took all of the above.
    let unknown = TaskMessage::Status { task: attempt_id(&d, "nope", 0), status: TaskStatus::Running };
    w.report(&unknown).await?;
    let refused = w.expect_error(T).await?;
    assert!(refused.message.contains("no task nope/0"), "{}", refused.message);

    let details = wait::until("figures for every task in DescribeJob", T, || {
        let mut c = setup.client.clone();
        async move {
            let req = cairn_proto::admin::JobRequest { job_id: "j".into() };
            let d = c
                .call("describe", move |ch| {
                    let req = req.clone();
                    async move {
                        cairn_proto::admin::admin_client::AdminClient::new(ch)
                            .describe_job(req)
                            .await
                            .map(tonic::Response::into_inner)
                    }
                })
                .await
                .ok()?;
            d.tasks.iter().all(|t| t.load.is_some()).then_some(d)
        }
    })
    .await?;
    assert_eq!(details.tasks.len(), tasks.len());
    let want = cairn_proto::admin::TaskLoad {
        back_pressured_ms_per_second: 300,
        busy_ms_per_second: 500,
        idle_ms_per_second: 200,
        backpressure: "low".into(),
    };
    for t in &details.tasks {
        assert_eq!(t.load.as_ref(), Some(&want), "{}/{}", t.vertex, t.subtask);
    }
    Ok(())
}

/// Checkpoints whose tasks write no file into their `chk-<id>` directory reuse the directory
/// of a checkpoint the store subsumed (no inode allocated or freed per checkpoint); a job that
/// ends leaves neither its checkpoints nor a spare directory behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_directories_are_reused_and_an_ended_job_leaves_none() -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (setup, mut w, d) = OneReplica::start(Some(100)).await?;
    report_all_running(&w, &d).await?;
    let job_dir = setup.cluster.checkpoint_dir().join("j");
    let inode = |id: u64| std::fs::metadata(job_dir.join(format!("chk-{id}/_metadata"))).map(|m| m.ino());
    let mut inodes = Vec::new();
    let mut previous: Option<u64> = None;
    for round in 0..5 {
        let id = next_trigger(&mut w).await?;
        ack_all(&w, &d, id).await?;
        notified_complete(&mut w, id).await?;
        let ino = inode(id).with_context(|| format!("checkpoint {id}'s _metadata"))?;
        if round >= 2 {
            assert!(
                inodes.contains(&ino),
                "checkpoint {id}'s _metadata is a new file, not one of {inodes:?}"
            );
        } else {
            inodes.push(ino);
        }
        // The store retains one checkpoint: the one this one subsumed becomes a spare (before the
        // next checkpoint's acknowledgements, so that its `_metadata` goes into it).
        if let Some(subsumed) = previous {
            let spare = job_dir.join(format!(".spare-chk-{subsumed}"));
            wait::until("the subsumed checkpoint's directory to become a spare", T, || {
                let kept = spare.exists() && !job_dir.join(format!("chk-{subsumed}")).exists();
                async move { kept.then_some(()) }
            })
            .await?;
        }
        previous = Some(id);
    }

    // Every task finishes: the finished job keeps no checkpoint, and no spare.
    for (v, i) in subtasks(&d)? {
        w.report(&TaskMessage::Status { task: attempt_id(&d, &v, i), status: TaskStatus::Finished }).await?;
    }
    wait::until("the finished job's checkpoint directory to be empty", T, || {
        let left: Vec<String> = std::fs::read_dir(&job_dir)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned())).collect())
            .unwrap_or_default();
        async move { left.is_empty().then_some(()) }
    })
    .await?;
    setup.cluster.shutdown().await;
    Ok(())
}
