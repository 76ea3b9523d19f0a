//! Where the console's figures come from and where its actions go: the admin API
//! (`cairn.admin.v1.Admin`) through the leader-following client, with the admin token, exactly as
//! `cairnctl` calls it. A console on a follower is given that replica's address; the follower
//! answers not-leader with the leader's address and the client follows it, so every replica
//! serves the same, linearizable figures.

use std::future::Future;
use std::time::Duration;

use cairn_client::{AuthChannel, ClientConfig, ClientError, LeaderClient};
use cairn_proto::admin as pb;
use cairn_proto::admin::admin_client::AdminClient;
use tonic::{Code, Status};

/// Bound on one read (a page load), retries and leader following included.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Bound on one action: a savepoint or a stop-with-savepoint waits for the savepoint.
pub const ACTION_DEADLINE: Duration = Duration::from_secs(120);

/// Why the admin API did not give what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The cluster refused the call (unknown job, bad argument, wrong state, ...).
    #[error("{what}: {message}")]
    Refused { what: &'static str, code: Code, message: String },
    /// No leader answered in time.
    #[error("{0}")]
    Unavailable(String),
    /// The client could not be built (bad endpoint, bad token).
    #[error("console misconfigured: {0}")]
    Setup(String),
}

impl SourceError {
    fn from_client(e: ClientError) -> Self {
        match e {
            ClientError::Rejected { what, status } => {
                Self::Refused { what, code: status.code(), message: status.message().to_owned() }
            }
            ClientError::NoLeader { .. } => Self::Unavailable(e.to_string()),
            other => Self::Setup(other.to_string()),
        }
    }
}

/// The console's handle on the cluster. Cloning is cheap (channels are shared).
#[derive(Clone)]
pub struct Source {
    reads: LeaderClient,
    actions: LeaderClient,
}

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Replica addresses (`host:port`); a replica's console gives its own.
    pub endpoints: Vec<String>,
    /// The cluster's admin token.
    pub token: String,
    /// TLS towards the replicas.
    pub tls: Option<cairn_proto::tls::ClientTls>,
}

impl Source {
    pub fn new(config: &SourceConfig) -> Result<Self, SourceError> {
        let client = |deadline: Duration, attempt: Duration| {
            LeaderClient::new(
                &config.endpoints,
                ClientConfig {
                    deadline,
                    attempt_timeout: attempt,
                    token: Some(config.token.clone()),
                    tls: config.tls.clone(),
                    ..ClientConfig::default()
                },
            )
            .map_err(SourceError::from_client)
        };
        Ok(Self {
            reads: client(READ_DEADLINE, Duration::from_secs(2))?,
            actions: client(ACTION_DEADLINE, ACTION_DEADLINE)?,
        })
    }

    async fn call<T, F, Fut>(client: &LeaderClient, what: &'static str, mut f: F) -> Result<T, SourceError>
    where
        F: FnMut(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut client = client.clone();
        client
            .call(what, move |ch| {
                let fut = f(AdminClient::new(ch));
                async move { fut.await.map(tonic::Response::into_inner) }
            })
            .await
            .map_err(SourceError::from_client)
    }

    async fn read<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, SourceError>
    where
        F: FnMut(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        Self::call(&self.reads, what, f).await
    }

    async fn act<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, SourceError>
    where
        F: FnMut(AdminClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        Self::call(&self.actions, what, f).await
    }

    pub async fn cluster_status(&self) -> Result<pb::ClusterStatusReply, SourceError> {
        self.read(
            "cluster status",
            |mut a| async move { a.cluster_status(pb::ClusterStatusRequest {}).await },
        )
        .await
    }

    pub async fn list_workers(&self) -> Result<pb::ListWorkersReply, SourceError> {
        self.read("list workers", |mut a| async move { a.list_workers(pb::ListWorkersRequest {}).await })
            .await
    }

    pub async fn list_jobs(&self) -> Result<pb::ListJobsReply, SourceError> {
        self.read("list jobs", |mut a| async move { a.list_jobs(pb::ListJobsRequest {}).await }).await
    }

    pub async fn describe_job(&self, job: &str) -> Result<pb::JobDetails, SourceError> {
        let req = pb::JobRequest { job_id: job.to_owned() };
        self.read("describe job", |mut a| {
            let req = req.clone();
            async move { a.describe_job(req).await }
        })
        .await
    }

    pub async fn list_checkpoints(&self, job: &str) -> Result<pb::CheckpointOverview, SourceError> {
        let req = pb::JobRequest { job_id: job.to_owned() };
        self.read("list checkpoints", |mut a| {
            let req = req.clone();
            async move { a.list_checkpoints(req).await }
        })
        .await
    }

    pub async fn list_savepoints(&self, job: &str) -> Result<pb::ListSavepointsReply, SourceError> {
        let req = pb::JobRequest { job_id: job.to_owned() };
        self.read("list savepoints", |mut a| {
            let req = req.clone();
            async move { a.list_savepoints(req).await }
        })
        .await
    }

    pub async fn describe_checkpoint(
        &self,
        job: &str,
        id: u64,
    ) -> Result<pb::CheckpointDetails, SourceError> {
        let req = pb::DescribeCheckpointRequest { job_id: job.to_owned(), checkpoint_id: id };
        self.read("describe checkpoint", |mut a| {
            let req = req.clone();
            async move { a.describe_checkpoint(req).await }
        })
        .await
    }

    pub async fn trigger_checkpoint(
        &self,
        job: &str,
        request_id: &str,
    ) -> Result<pb::TriggerCheckpointReply, SourceError> {
        let req = pb::TriggerCheckpointRequest { job_id: job.to_owned(), request_id: request_id.to_owned() };
        self.act("trigger checkpoint", |mut a| {
            let req = req.clone();
            async move { a.trigger_checkpoint(req).await }
        })
        .await
    }

    pub async fn trigger_savepoint(
        &self,
        job: &str,
        request_id: &str,
    ) -> Result<pb::SavepointReply, SourceError> {
        let req = pb::TriggerSavepointRequest {
            job_id: job.to_owned(),
            target_dir: String::new(),
            request_id: request_id.to_owned(),
        };
        self.act("trigger savepoint", |mut a| {
            let req = req.clone();
            async move { a.trigger_savepoint(req).await }
        })
        .await
    }

    pub async fn stop_with_savepoint(
        &self,
        job: &str,
        request_id: &str,
    ) -> Result<pb::SavepointReply, SourceError> {
        let req = pb::StopWithSavepointRequest {
            job_id: job.to_owned(),
            target_dir: String::new(),
            drain: false,
            request_id: request_id.to_owned(),
        };
        self.act("stop with savepoint", |mut a| {
            let req = req.clone();
            async move { a.stop_with_savepoint(req).await }
        })
        .await
    }

    pub async fn cancel_job(&self, job: &str, request_id: &str) -> Result<pb::CancelJobReply, SourceError> {
        let req = pb::CancelJobRequest { job_id: job.to_owned(), request_id: request_id.to_owned() };
        self.act("cancel job", |mut a| {
            let req = req.clone();
            async move { a.cancel_job(req).await }
        })
        .await
    }

    /// Sets the periodic checkpoint interval (`interval` in humantime syntax, e.g. `10s`).
    pub async fn set_interval(
        &self,
        job: &str,
        interval: &str,
        request_id: &str,
    ) -> Result<pb::UpdateCheckpointConfigReply, SourceError> {
        let req = pb::UpdateCheckpointConfigRequest {
            job_id: job.to_owned(),
            checkpoint_json: serde_json::json!({ "interval": interval }).to_string(),
            request_id: request_id.to_owned(),
        };
        self.act("update checkpoint config", |mut a| {
            let req = req.clone();
            async move { a.update_checkpoint_config(req).await }
        })
        .await
    }
}
