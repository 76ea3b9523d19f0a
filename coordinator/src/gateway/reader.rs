//! The reading side of one worker stream: heartbeats in, to the term's runtime; task reports
//! in, straight to their jobs' drivers (see `TermHandle::submit_reports`); time figures in, to
//! the drivers too, unanswered (`TermHandle::submit_times`).
//!
//! Reports are pipelined: the reader hands each one to its job's driver and goes on reading,
//! while one answering task awaits the outcomes in arrival order (at most [`IN_FLIGHT`]
//! outstanding) and then sends what the worker must hear: an `error` for a refused report,
//! `confirmed` for numbered ones (handled, accepted or refused). A job driver takes its inputs in
//! order, so a worker's reports about one job are handled in the order it sent them; what the
//! pipeline removes is the wait for each report's round trip through its job driver before the
//! next one is read. A worker with a hundred tasks sends a hundred acknowledgements per
//! checkpoint.
//!
//! Reports may come in batches (`reports`, to a leader that announced `report_batches`): the
//! batch's reports are decoded together and handed over once per job they name, each job's in
//! the batch's order, and the batch is answered as one: its refusals (in no particular order),
//! then one confirmation covering it. A worker whose hundred tasks acknowledge a checkpoint
//! together then costs one stream message, one hand-over and one wake-up of the job's driver,
//! not a hundred of each.
//!
//! Confirmations are coalesced: `confirmed { up_to }` covers every report numbered up to it, so
//! while more outcomes are already waiting only the last of the run is sent. A burst of a
//! hundred acknowledgements costs the worker's outbox one confirmation, not a hundred, and the
//! outbox keeps its room for the commands that matter (triggers, notifications).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use cairn_proto::v1::{
    LeaderMessage, Report, ReportsConfirmed, WorkerMessage, leader_message, worker_message,
};
use cairn_protocol::messages::TaskMessage;
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, Streaming};

use crate::leader::job::error_message;
use crate::leader::{Session, TermHandle};

/// Reports handed to the runtime whose outcome is not known yet, per stream.
const IN_FLIGHT: usize = 256;

/// Numbered reports answered by one confirmation at most.
const CONFIRM_EVERY: usize = 64;

/// Most tasks one time-figures message may name: a worker has at most 4096 slots.
const MAX_TIMED_TASKS: usize = 4096;

/// Most reports one batch may carry (a worker sends at most a few hundred at a time).
pub const MAX_BATCH_REPORTS: usize = 4096;

/// Where the refusals of reports handed to one job's driver arrive (none: all were taken).
type Outcome = oneshot::Receiver<Vec<Status>>;

/// Sends refusals and confirmations to the worker on its stream (while the stream is open).
#[derive(Clone)]
struct Replies {
    term: TermHandle,
    worker_id: String,
    outbox: mpsc::WeakSender<LeaderMessage>,
}

impl Replies {
    fn refuse(&self, status: &Status) {
        tracing::info!(worker = %self.worker_id, code = ?status.code(), message = status.message(), "worker message refused");
        if let Some(tx) = self.outbox.upgrade() {
            let _ = tx.try_send(error_message(self.term.term, status));
        }
    }

    /// A full outbox skips a confirmation; the next one covers it.
    fn confirm(&self, up_to: u64) {
        if let Some(tx) = self.outbox.upgrade() {
            let confirmed = ReportsConfirmed { up_to };
            let _ = tx.try_send(self.term.leader_message(leader_message::Body::Confirmed(confirmed)));
        }
    }
}

/// One stream message's reports on their way: where their refusals arrive, how many reports
/// they are, and the highest number among them when the worker numbered them.
struct InFlight {
    outcomes: Vec<Outcome>,
    reports: usize,
    seq: Option<u64>,
}

/// Refusals known already (reports that did not decode, or a runtime that is gone).
fn settled(refusals: Vec<Status>) -> Outcome {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(refusals);
    rx
}

/// Which field of the worker's message a report came in, for refusals that name it.
#[derive(Clone, Copy)]
enum Field {
    ReportJson,
    Report,
    Batch(usize),
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::ReportJson => f.write_str("report_json"),
            Field::Report => f.write_str("report.json"),
            Field::Batch(i) => write!(f, "reports.reports[{i}].json"),
        }
    }
}

/// Reports of one stream message as they came (JSON, and the field that carried it).
type Encoded = Vec<(Vec<u8>, Field)>;

/// The reports of one batch, checked as a whole (a refused batch changes nothing), with the
/// highest number among them.
fn batch_reports(reports: Vec<Report>) -> Result<(Encoded, Option<u64>), Status> {
    if reports.is_empty() {
        return Err(Status::invalid_argument("reports: the batch holds no report"));
    }
    if reports.len() > MAX_BATCH_REPORTS {
        return Err(Status::invalid_argument(format!(
            "reports: {} reports in one batch; at most {MAX_BATCH_REPORTS}",
            reports.len()
        )));
    }
    if let Some(w) = reports.windows(2).find(|w| w[0].seq >= w[1].seq) {
        return Err(Status::invalid_argument(format!(
            "reports: sequence numbers must increase within a batch, got {} then {}",
            w[0].seq, w[1].seq
        )));
    }
    let seq = reports.last().map(|r| r.seq);
    Ok((reports.into_iter().enumerate().map(|(i, r)| (r.json, Field::Batch(i))).collect(), seq))
}

/// Decodes reports and hands them to their jobs' drivers: one hand-over per job, each job's
/// reports in the order given.
async fn submit(term: &TermHandle, worker_id: &str, session: &Session, reports: Encoded) -> Vec<Outcome> {
    let mut refused = Vec::new();
    let mut jobs: Vec<(String, Vec<TaskMessage>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (json, field) in reports {
        match serde_json::from_slice::<TaskMessage>(&json) {
            Ok(report) => {
                let job = &report.task().task.job;
                match index.get(job) {
                    Some(&i) => jobs[i].1.push(report),
                    None => {
                        index.insert(job.clone(), jobs.len());
                        jobs.push((job.clone(), vec![report]));
                    }
                }
            }
            Err(e) => refused.push(Status::invalid_argument(format!("{field} is not a task message: {e}"))),
        }
    }
    let mut outcomes = Vec::with_capacity(jobs.len() + 1);
    for (job, msgs) in jobs {
        let count = msgs.len();
        match term.submit_reports(worker_id.to_owned(), session, &job, msgs).await {
            Ok(outcome) => outcomes.push(outcome),
            // Every report about the job hears why.
            Err(status) => refused.extend(std::iter::repeat_n(status, count)),
        }
    }
    if !refused.is_empty() {
        outcomes.push(settled(refused));
    }
    outcomes
}

/// Awaits the outcomes in order and answers the worker; a confirmation waits until no further
/// outcome is queued behind it (the next one covers it), or [`CONFIRM_EVERY`] reports went
/// unconfirmed (so a worker that keeps its reports until confirmed never holds many).
async fn answer(replies: Replies, mut pending: mpsc::Receiver<InFlight>) {
    let mut unconfirmed = None;
    let mut held = 0;
    while let Some(report) = pending.recv().await {
        for outcome in report.outcomes {
            let refusals = outcome.await.unwrap_or_else(|_| {
                vec![Status::unavailable("the leader's runtime stopped before handling the report")]
            });
            for status in &refusals {
                replies.refuse(status);
            }
        }
        if report.seq.is_some() {
            unconfirmed = report.seq;
            held += report.reports;
        }
        if (pending.is_empty() || held >= CONFIRM_EVERY)
            && let Some(seq) = unconfirmed.take()
        {
            replies.confirm(seq);
            held = 0;
        }
    }
    if let Some(seq) = unconfirmed {
        replies.confirm(seq);
    }
}

/// Reads the worker's stream until it ends, the worker breaks it, or the term ends; then
/// detaches the session and closes the leader's side of the stream.
pub async fn read_worker(
    term: TermHandle,
    worker_id: String,
    session: Session,
    mut inbound: Streaming<WorkerMessage>,
    outbox: mpsc::WeakSender<LeaderMessage>,
) {
    let replies = Replies { term: term.clone(), worker_id: worker_id.clone(), outbox: outbox.clone() };
    let (pending, pending_rx) = mpsc::channel(IN_FLIGHT);
    let answering = tokio::spawn(answer(replies.clone(), pending_rx));
    loop {
        let msg = tokio::select! {
            _ = term.closed() => break,
            m = inbound.message() => m,
        };
        let body = match msg {
            Ok(Some(m)) => m.body,
            Ok(None) => break,
            Err(status) => {
                tracing::info!(worker = %worker_id, error = %status, "worker stream failed");
                replies.refuse(&status);
                break;
            }
        };
        let (reports, seq) = match body {
            Some(worker_message::Body::Heartbeat(_)) => {
                term.heartbeat(worker_id.clone(), session.id).await;
                continue;
            }
            Some(worker_message::Body::TaskTimes(times)) => {
                if times.tasks.len() > MAX_TIMED_TASKS {
                    tracing::warn!(worker = %worker_id, tasks = times.tasks.len(), max = MAX_TIMED_TASKS,
                        "time figures for more tasks than a worker can run; ignored");
                } else {
                    term.submit_times(&worker_id, &session, times.tasks);
                }
                continue;
            }
            Some(worker_message::Body::ReportJson(bytes)) => (vec![(bytes, Field::ReportJson)], None),
            Some(worker_message::Body::Report(report)) => {
                (vec![(report.json, Field::Report)], Some(report.seq))
            }
            Some(worker_message::Body::Reports(batch)) => match batch_reports(batch.reports) {
                Ok(reports) => reports,
                Err(status) => {
                    replies.refuse(&status);
                    continue;
                }
            },
            Some(worker_message::Body::Register(_)) => {
                replies.refuse(&Status::failed_precondition(
                    "already registered on this stream; open a new stream to re-register",
                ));
                continue;
            }
            None => {
                replies.refuse(&Status::invalid_argument("empty worker message"));
                continue;
            }
        };
        let count = reports.len();
        let outcomes = submit(&term, &worker_id, &session, reports).await;
        if pending.send(InFlight { outcomes, reports: count, seq }).await.is_err() {
            break;
        }
    }
    // Every report read was handed over: answer them all before the stream closes.
    drop(pending);
    let _ = answering.await;
    term.detach(worker_id.clone(), session.id).await;
    if let Some(tx) = outbox.upgrade() {
        // Close marker: ends the response stream so the worker reconnects.
        let marker = LeaderMessage { term: term.term, body: None };
        let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(marker)).await;
    }
    tracing::debug!(worker = %worker_id, session = session.id, "worker stream reader ended");
}
