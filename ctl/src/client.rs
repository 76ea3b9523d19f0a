//! Building the leader-following client of a command, in one place (transport security options
//! join here).

use std::future::Future;
use std::time::Duration;

use cairn_client::{AuthChannel, ClientConfig, LeaderClient};
use tokio::time::Instant;
use tonic::Status;

use crate::errors::CtlError;
use crate::token::TokenSources;

/// Longest single attempt of a quick call against one replica before trying the next.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to reach the cluster.
#[derive(Debug, Clone)]
pub struct Target {
    pub endpoints: Vec<String>,
    pub token: TokenSources,
    /// TLS towards the replicas (`--ca-file`, `--cert-file`, `--key-file`), loaded once.
    pub tls: Option<cairn_proto::tls::ClientTls>,
}

/// How long one attempt may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// An ordinary call: a replica that does not answer within a few seconds is skipped.
    Quick,
    /// A call the server holds open until something happened (catch-up, savepoint, wait):
    /// an attempt may use the whole remaining time.
    Long,
}

/// Builds the client for one call, with `remaining` as its deadline.
pub fn connect(target: &Target, remaining: Duration, wait: Wait) -> Result<LeaderClient, CtlError> {
    let token = target.token.resolve(|p| std::fs::read_to_string(p))?;
    let attempt_timeout = match wait {
        Wait::Quick => ATTEMPT_TIMEOUT.min(remaining),
        Wait::Long => remaining,
    };
    let config = ClientConfig {
        deadline: remaining,
        attempt_timeout,
        token: Some(token),
        tls: target.tls.clone(),
        ..Default::default()
    };
    LeaderClient::new(&target.endpoints, config).map_err(|e| CtlError::from_client(e, &target.endpoints))
}

/// A command's connection to the cluster, bounded by one deadline for all its calls.
pub struct Session {
    target: Target,
    deadline: Instant,
    timeout: Duration,
}

impl Session {
    pub fn new(target: Target, timeout: Duration) -> Self {
        Self { target, deadline: Instant::now() + timeout, timeout }
    }

    /// Time left before the command's deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `f` against the leader; `f` is called again for every retry.
    pub async fn call<T, F, Fut>(&self, what: &'static str, wait: Wait, f: F) -> Result<T, CtlError>
    where
        F: FnMut(AuthChannel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let remaining = self.remaining();
        if remaining.is_zero() {
            return Err(CtlError::NoLeader {
                what,
                endpoints: self.target.endpoints.clone(),
                deadline: self.timeout,
                last: "the command's --timeout elapsed".into(),
            });
        }
        let mut client = connect(&self.target, remaining, wait)?;
        client.call(what, f).await.map_err(|e| match CtlError::from_client(e, &self.target.endpoints) {
            // Report the command's whole timeout, not what was left of it for this call.
            CtlError::NoLeader { what, endpoints, last, .. } => {
                CtlError::NoLeader { what, endpoints, deadline: self.timeout, last }
            }
            other => other,
        })
    }
}
