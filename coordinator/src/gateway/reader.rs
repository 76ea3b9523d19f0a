//! The reading side of one worker stream: heartbeats in, to the term's runtime; task reports
//! in, straight to their jobs' drivers (see `TermHandle::submit_report`); time figures in, to
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
//! Confirmations are coalesced: `confirmed { up_to }` covers every report numbered up to it, so
//! while more outcomes are already waiting only the last of the run is sent. A burst of a
//! hundred acknowledgements costs the worker's outbox one confirmation, not a hundred, and the
//! outbox keeps its room for the commands that matter (triggers, notifications).

use std::time::Duration;

use cairn_proto::v1::{LeaderMessage, ReportsConfirmed, WorkerMessage, leader_message, worker_message};
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

/// Where a report's outcome arrives: `Err` is a refusal for the worker.
type Outcome = oneshot::Receiver<Result<(), Status>>;

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

/// One report on its way: its outcome, and its number when the worker numbered it.
struct InFlight {
    outcome: Outcome,
    seq: Option<u64>,
}

/// An outcome known already (a report that did not decode, or a runtime that is gone).
fn settled(outcome: Result<(), Status>) -> Outcome {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(outcome);
    rx
}

/// Decodes a report and hands it to the runtime.
async fn submit(term: &TermHandle, worker_id: &str, session: &Session, json: &[u8], field: &str) -> Outcome {
    match serde_json::from_slice::<TaskMessage>(json) {
        Ok(report) => match term.submit_report(worker_id.to_owned(), session, report).await {
            Ok(outcome) => outcome,
            Err(status) => settled(Err(status)),
        },
        Err(e) => settled(Err(Status::invalid_argument(format!("{field} is not a task message: {e}")))),
    }
}

/// Awaits the outcomes in order and answers the worker; a confirmation waits until no further
/// outcome is queued behind it (the next one covers it), or [`CONFIRM_EVERY`] reports went
/// unconfirmed (so a worker that keeps its reports until confirmed never holds many).
async fn answer(replies: Replies, mut pending: mpsc::Receiver<InFlight>) {
    let mut unconfirmed = None;
    let mut held = 0;
    while let Some(report) = pending.recv().await {
        let outcome = report.outcome.await.unwrap_or_else(|_| {
            Err(Status::unavailable("the leader's runtime stopped before handling the report"))
        });
        if let Err(status) = outcome {
            replies.refuse(&status);
        }
        if report.seq.is_some() {
            unconfirmed = report.seq;
            held += 1;
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
        let (json, field, seq) = match body {
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
            Some(worker_message::Body::ReportJson(bytes)) => (bytes, "report_json", None),
            Some(worker_message::Body::Report(report)) => (report.json, "report.json", Some(report.seq)),
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
        let outcome = submit(&term, &worker_id, &session, &json, field).await;
        if pending.send(InFlight { outcome, seq }).await.is_err() {
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
