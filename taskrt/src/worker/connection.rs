//! Leader following: the one task that keeps the worker attached to whichever replica leads.
//!
//! It tries the known replicas ([`Endpoints`]) one after the other; a not-leader answer with an
//! address sends it there at once (a new address is remembered); no hint, a refusal, a timeout
//! or a dead replica moves it to the next one; after a whole round of failures it pauses with a
//! jittered exponential [`Backoff`]. It never gives up while the worker runs. A session that
//! registered resets the backoff, and the next search starts at the replica that led, pausing
//! only the minimum for the first seconds (a new leader is usually elected within a second).
//!
//! It owns the worker's [`TermFence`] (lent to each session) and one lazily connected tonic
//! `Channel` per endpoint, and publishes the [`WorkerStatus`].

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use super::host::HostCommand;
use super::session::{Session, SessionError};
use super::{JobsView, WorkerStatus};
use cairn_client::follow::{Backoff, Endpoints, Next};
use cairn_proto::leader_hint::LeaderHint;
use cairn_protocol::messages::TermFence;

pub(crate) struct Connector {
    pub worker_id: String,
    pub slots: u32,
    /// This worker's data exchange address, announced on every registration.
    pub data_addr: String,
    pub connect_timeout: Duration,
    pub register_timeout: Duration,
    pub endpoints: Endpoints,
    pub backoff: Backoff,
    pub channels: HashMap<String, Channel>,
    /// TLS towards the replicas; `None` dials plaintext.
    pub tls: Option<cairn_proto::tls::ClientTls>,
    /// Adds `authorization: Bearer <worker token>` to every `Attach` (nothing when a client
    /// certificate authenticates the worker).
    pub auth: cairn_client::BearerAuth,
    pub fence: TermFence,
    pub host: mpsc::Sender<HostCommand>,
    pub jobs: watch::Receiver<JobsView>,
    pub status: watch::Sender<WorkerStatus>,
    pub shutdown: watch::Receiver<bool>,
}

impl Connector {
    /// Runs until the shutdown signal (or until the job host is gone).
    pub(crate) async fn run(mut self) {
        self.publish_endpoints();
        while !*self.shutdown.borrow() {
            let Some(addr) = self.endpoints.current().map(str::to_owned) else {
                tracing::error!("no coordinator endpoint known; stopping");
                return;
            };
            let channel = match self.channel(&addr) {
                Ok(ch) => ch,
                Err(reason) => {
                    tracing::warn!(addr = %addr, reason = %reason, "invalid coordinator endpoint; skipped");
                    if self.endpoints.failed() == Next::Pause && !self.pause().await {
                        return;
                    }
                    continue;
                }
            };
            let session = Session {
                addr: &addr,
                worker_id: &self.worker_id,
                slots: self.slots,
                data_addr: &self.data_addr,
                connect_timeout: self.connect_timeout,
                register_timeout: self.register_timeout,
                auth: &self.auth,
                fence: &mut self.fence,
                host: &self.host,
                jobs: &self.jobs,
                status: &self.status,
                shutdown: &mut self.shutdown,
            };
            let end = session.run(channel).await;
            if end.registered {
                // Reports wait in the host until the next leader registers the worker.
                let _ = self.host.send(HostCommand::Detach).await;
                self.status.send_modify(|s| s.leader = None);
                self.endpoints.succeeded();
                // A new leader is being elected: look for it at the shortest pause.
                self.backoff.search_quickly();
            }
            let next = match end.result {
                Ok(()) => return,
                Err(SessionError::HostGone) => {
                    tracing::error!("the job host stopped; the worker stops following the leader");
                    return;
                }
                Err(e) => self.on_failure(&addr, end.registered, e),
            };
            if next == Next::Pause && !self.pause().await {
                return;
            }
        }
    }

    /// Logs a failed or ended session and picks the next endpoint.
    fn on_failure(&mut self, addr: &str, registered: bool, e: SessionError) -> Next {
        let error = e.to_string();
        self.status.send_modify(|s| s.last_error = Some(format!("{addr}: {error}")));
        let next = match &e {
            // Not (or no longer) the leader, naming it: go there at once. A leader that steps
            // down ends its sessions this way once its successor is known (a handover, or the
            // end of its term).
            SessionError::NotLeader(LeaderHint { leader_addr: Some(leader), leader_id }) => {
                tracing::info!(addr, leader = %leader, leader_id = ?leader_id, registered, "not the leader; following the hint");
                self.endpoints.redirect(leader)
            }
            // The session was up: try the same replica again first, after the shortest pause (a
            // broken stream is often transient; if the replica no longer leads, it says where the
            // leader is). The pause bounds the rate of reconnects to a replica that accepts and
            // then drops every session.
            _ if registered => {
                tracing::warn!(addr, error = %error, "lost the leader; reconnecting");
                Next::Pause
            }
            SessionError::NotLeader(_) => {
                tracing::info!(addr, "not the leader, and it knows of no leader; trying the next replica");
                self.endpoints.failed()
            }
            SessionError::StaleLeader { term, highest } => {
                tracing::warn!(addr, term, highest, "stale leader; looking for the current one");
                self.endpoints.failed()
            }
            _ => {
                tracing::warn!(addr, error = %error, "cannot attach; trying the next replica");
                self.endpoints.failed()
            }
        };
        self.publish_endpoints();
        next
    }

    /// Sleeps for the next backoff delay; `false` when shutdown came first.
    async fn pause(&mut self) -> bool {
        let delay = self.backoff.next_delay();
        tracing::debug!(delay = ?delay, "no leader found in this round; pausing");
        tokio::select! {
            biased;
            _ = self.shutdown.changed() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    fn channel(&mut self, addr: &str) -> Result<Channel, String> {
        if let Some(ch) = self.channels.get(addr) {
            return Ok(ch.clone());
        }
        if !cairn_proto::addr::is_host_port(addr) {
            return Err("expected host:port".to_owned());
        }
        let ch = cairn_proto::tls::endpoint(addr, self.tls.as_ref())
            .map_err(|e| e.to_string())?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        self.channels.insert(addr.to_owned(), ch.clone());
        Ok(ch)
    }

    fn publish_endpoints(&self) {
        let all = self.endpoints.all();
        self.status.send_if_modified(|s| {
            if s.endpoints.as_slice() == all {
                false
            } else {
                s.endpoints = all.to_vec();
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "127.0.0.1:7001";
    const B: &str = "127.0.0.1:7002";
    const C: &str = "127.0.0.1:7003";

    fn connector() -> Connector {
        let (host, _) = mpsc::channel(1);
        let (_, jobs) = watch::channel(JobsView::default());
        let (status, _) = watch::channel(WorkerStatus::default());
        let (_, shutdown) = watch::channel(false);
        Connector {
            worker_id: "w1".to_owned(),
            slots: 1,
            data_addr: "127.0.0.1:1".to_owned(),
            connect_timeout: Duration::from_secs(2),
            register_timeout: Duration::from_secs(5),
            endpoints: Endpoints::new(vec![A.to_owned(), B.to_owned(), C.to_owned()]),
            backoff: Backoff::new(Duration::from_millis(25), Duration::from_secs(2)),
            channels: HashMap::new(),
            tls: None,
            auth: cairn_client::BearerAuth::new(None).expect("no token is valid"),
            fence: TermFence::default(),
            host,
            jobs,
            status,
            shutdown,
        }
    }

    fn not_leader(addr: Option<&str>) -> SessionError {
        SessionError::NotLeader(LeaderHint {
            leader_id: addr.map(|_| 3),
            leader_addr: addr.map(str::to_owned),
        })
    }

    #[test]
    fn a_leader_that_stepped_down_naming_its_successor_is_followed_at_once() {
        let mut c = connector();
        c.endpoints.succeeded();
        assert_eq!(c.on_failure(A, true, not_leader(Some(C))), Next::Now);
        assert_eq!(c.endpoints.current(), Some(C));
        let last = c.status.borrow().last_error.clone().unwrap_or_default();
        assert!(last.starts_with(A) && last.contains(C), "{last}");
    }

    #[test]
    fn a_lost_leader_without_a_successor_is_retried_after_a_pause() {
        let mut c = connector();
        c.endpoints.succeeded();
        assert_eq!(c.on_failure(A, true, not_leader(None)), Next::Pause);
        assert_eq!(c.endpoints.current(), Some(A));
        assert_eq!(c.on_failure(A, true, SessionError::StreamEnded), Next::Pause);
        assert_eq!(c.endpoints.current(), Some(A));
    }

    #[test]
    fn a_refused_attach_follows_the_hint() {
        let mut c = connector();
        assert_eq!(c.on_failure(A, false, not_leader(Some(B))), Next::Now);
        assert_eq!(c.endpoints.current(), Some(B));
    }
}
