//! A client that finds and follows the leader.
//!
//! It is given any number of replica endpoints. A call goes to the replica believed to lead; a
//! not-leader answer with an address redirects it there; a not-leader answer without one, a
//! connection failure or a timeout moves on to the next endpoint. Where to go next is the
//! [`Endpoints`] bookkeeping the worker's gateway connection uses too: after a whole round of
//! failed attempts the client pauses for a jittered, doubling [`Backoff`]. The whole call is
//! bounded by a deadline. One channel is kept per endpoint.
//!
//! Retries are safe for reads. A retried write may be applied twice if the first reply was lost
//! (e.g. two checkpoint IDs are allocated and the first one is never used; IDs stay unique and
//! increasing).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use cairn_proto::addr::{is_host_port, normalize};
use cairn_proto::leader_hint::parse_not_leader;
use cairn_proto::v1::cluster_client::ClusterClient;
use cairn_proto::v1::store_client::StoreClient;
use cairn_proto::v1::{
    AddLearnerRequest, AllocateCheckpointIdReply, AllocateCheckpointIdRequest, ClusterStatus, GetJobRequest,
    JobRecord, MembershipReply, NodeRequest, RegisterJobReply, RegisterJobRequest, StatusRequest,
};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::auth::{AuthChannel, BearerAuth};
use crate::follow::{Backoff, Endpoints, Next};

/// Why a call failed for good.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no endpoints given; pass at least one replica address (host:port)")]
    NoEndpoints,
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    BadEndpoint { endpoint: String, reason: String },
    #[error("{what}: no leader answered within {deadline:?} (last error: {last})")]
    NoLeader { what: &'static str, deadline: Duration, last: String },
    #[error("{what}: {status}")]
    Rejected { what: &'static str, status: Status },
    #[error("invalid admin token: {reason}")]
    BadToken { reason: String },
}

impl ClientError {
    /// The gRPC code of a rejected call (`None` for connection-level failures).
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Rejected { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// Timing of the leader-following client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Bound on one whole call, retries included.
    pub deadline: Duration,
    /// Bound on one attempt against one replica.
    pub attempt_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// The cluster's admin token, sent as `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
    /// TLS towards the replicas (load it with `cairn_proto::tls::TlsFiles::load_client`);
    /// `None` connects in plaintext.
    pub tls: Option<cairn_proto::tls::ClientTls>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            token: None,
            tls: None,
        }
    }
}

/// Leader-following client of the replica services.
#[derive(Clone)]
pub struct LeaderClient {
    /// The replicas known, and which one the next attempt goes to (the one believed to lead).
    endpoints: Endpoints,
    channels: HashMap<String, Channel>,
    config: ClientConfig,
    auth: BearerAuth,
}

impl LeaderClient {
    pub fn new(
        endpoints: impl IntoIterator<Item = impl AsRef<str>>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let endpoints: Vec<String> = endpoints.into_iter().map(|e| normalize(e.as_ref())).collect();
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let auth = BearerAuth::new(config.token.as_deref())?;
        let mut client =
            Self { endpoints: Endpoints::new(endpoints), channels: HashMap::new(), config, auth };
        for e in client.endpoints.all().to_vec() {
            client.channel(&e)?;
        }
        Ok(client)
    }

    /// The endpoint the next call goes to first.
    pub fn current_endpoint(&self) -> &str {
        self.endpoints.current().unwrap_or_default()
    }

    fn channel(&mut self, addr: &str) -> Result<Channel, ClientError> {
        if let Some(ch) = self.channels.get(addr) {
            return Ok(ch.clone());
        }
        let bad = |reason: String| ClientError::BadEndpoint { endpoint: addr.to_owned(), reason };
        if !is_host_port(addr) {
            return Err(bad("expected host:port".into()));
        }
        let ch = cairn_proto::tls::endpoint(addr, self.config.tls.as_ref())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        self.channels.insert(addr.to_owned(), ch.clone());
        Ok(ch)
    }

    /// Runs `f` against the leader, following redirects and retrying transient failures.
    pub async fn call<T, F, Fut>(&mut self, what: &'static str, mut f: F) -> Result<T, ClientError>
    where
        F: FnMut(AuthChannel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let deadline = Instant::now() + self.config.deadline;
        let mut backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max);
        let mut last;
        loop {
            let addr = self.current_endpoint().to_owned();
            let ch = AuthChannel::new(self.channel(&addr)?, self.auth.clone());
            let outcome = tokio::time::timeout(self.config.attempt_timeout, f(ch)).await;
            let next = match outcome {
                Ok(Ok(v)) => {
                    self.endpoints.succeeded();
                    return Ok(v);
                }
                Ok(Err(status)) => {
                    if let Some(hint) = parse_not_leader(&status) {
                        last = format!("{addr}: {}", status.message());
                        match hint.leader_addr {
                            Some(leader) => self.endpoints.redirect(&leader),
                            None => self.endpoints.failed(),
                        }
                    } else if is_transient(&status) {
                        last = format!("{addr}: {status}");
                        self.endpoints.failed()
                    } else {
                        return Err(ClientError::Rejected { what, status });
                    }
                }
                Err(_) => {
                    last = format!("{addr}: no answer within {:?}", self.config.attempt_timeout);
                    self.endpoints.failed()
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(ClientError::NoLeader { what, deadline: self.config.deadline, last });
            }
            if next == Next::Pause {
                tokio::time::sleep(backoff.next_delay().min(deadline - now)).await;
            }
        }
    }

    pub async fn status(&mut self) -> Result<ClusterStatus, ClientError> {
        self.call("cluster status", |ch| async move {
            Ok(ClusterClient::new(ch).status(StatusRequest {}).await?.into_inner())
        })
        .await
    }

    pub async fn add_learner(&mut self, node_id: u64, addr: &str) -> Result<MembershipReply, ClientError> {
        let addr = addr.to_owned();
        self.call("add learner", move |ch| {
            let req = AddLearnerRequest { node_id, addr: addr.clone() };
            async move { Ok(ClusterClient::new(ch).add_learner(req).await?.into_inner()) }
        })
        .await
    }

    pub async fn promote_learner(&mut self, node_id: u64) -> Result<MembershipReply, ClientError> {
        self.call("promote learner", move |ch| async move {
            Ok(ClusterClient::new(ch).promote_learner(NodeRequest { node_id }).await?.into_inner())
        })
        .await
    }

    pub async fn remove_node(&mut self, node_id: u64) -> Result<MembershipReply, ClientError> {
        self.call("remove node", move |ch| async move {
            Ok(ClusterClient::new(ch).remove_node(NodeRequest { node_id }).await?.into_inner())
        })
        .await
    }

    pub async fn job_runtimes(&mut self) -> Result<cairn_proto::v1::JobRuntimesReply, ClientError> {
        self.call("job runtimes", |ch| async move {
            Ok(ClusterClient::new(ch)
                .job_runtimes(cairn_proto::v1::JobRuntimesRequest {})
                .await?
                .into_inner())
        })
        .await
    }

    pub async fn register_job(
        &mut self,
        job_id: &str,
        spec_json: &str,
    ) -> Result<RegisterJobReply, ClientError> {
        let req = RegisterJobRequest {
            job_id: job_id.to_owned(),
            name: String::new(),
            spec_json: spec_json.to_owned(),
        };
        self.call("register job", move |ch| {
            let req = req.clone();
            async move { Ok(StoreClient::new(ch).register_job(req).await?.into_inner()) }
        })
        .await
    }

    pub async fn allocate_checkpoint_id(
        &mut self,
        job_id: &str,
    ) -> Result<AllocateCheckpointIdReply, ClientError> {
        let job_id = job_id.to_owned();
        self.call("allocate checkpoint id", move |ch| {
            let req = AllocateCheckpointIdRequest { job_id: job_id.clone() };
            async move { Ok(StoreClient::new(ch).allocate_checkpoint_id(req).await?.into_inner()) }
        })
        .await
    }

    /// Triggers a checkpoint or savepoint and waits for its completion, for as long as the
    /// call's deadline. A retry after a lost reply may take a second snapshot.
    pub async fn trigger_checkpoint(
        &mut self,
        req: cairn_proto::v1::TriggerCheckpointRequest,
    ) -> Result<cairn_proto::v1::TriggerCheckpointReply, ClientError> {
        // A snapshot may take longer than one ordinary attempt: give it the whole deadline.
        let attempt = std::mem::replace(&mut self.config.attempt_timeout, self.config.deadline);
        let result = self
            .call("trigger checkpoint", move |ch| {
                let req = req.clone();
                async move { Ok(StoreClient::new(ch).trigger_checkpoint(req).await?.into_inner()) }
            })
            .await;
        self.config.attempt_timeout = attempt;
        result
    }

    pub async fn get_job(&mut self, job_id: &str) -> Result<JobRecord, ClientError> {
        let job_id = job_id.to_owned();
        self.call("get job", move |ch| {
            let req = GetJobRequest { job_id: job_id.clone() };
            async move { Ok(StoreClient::new(ch).get_job(req).await?.into_inner()) }
        })
        .await
    }
}

/// Failures worth retrying on another replica: connection problems and shutting-down replicas.
fn is_transient(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => true,
        // tonic reports a broken connection (a reset mid-call, a GOAWAY from a replica that is
        // shutting down) as Unknown or Internal with the h2/transport error as its source. A
        // status a replica sent has no source, so a replica's own Internal errors are final.
        Code::Unknown | Code::Internal => std::error::Error::source(status).is_some(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tonic::Status;

    use super::is_transient;

    #[test]
    fn a_broken_connection_is_retried_but_a_replica_error_is_final() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let mut goaway = Status::internal("h2 protocol error: http2 error");
        goaway.set_source(Arc::new(refused));
        assert!(is_transient(&goaway), "a local transport failure must be retried");

        assert!(!is_transient(&Status::internal("state machine failed")));
        assert!(!is_transient(&Status::unknown("handler panicked")));
        assert!(!is_transient(&Status::invalid_argument("bad job id")));
        assert!(is_transient(&Status::unavailable("not the leader")));
        let local = Status::from_error(Box::new(std::io::Error::other("broken pipe")));
        assert!(is_transient(&local));
    }
}
