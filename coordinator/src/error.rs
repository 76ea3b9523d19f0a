//! The replica's error type for client-facing calls, and its one mapping to `tonic::Status`.
//!
//! Clients branch on the status code and metadata, never on the message: not-leader is
//! `UNAVAILABLE` with the leader hint in metadata (see `cairn_proto::leader_hint`).

use cairn_proto::leader_hint::{LeaderHint, not_leader_status};
use cairn_raft::model::CommandError;
use cairn_raft::types::{Node, NodeId};
use openraft::error::{
    ChangeMembershipError, CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError,
};
use tonic::Status;

#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeError {
    #[error("not the leader")]
    NotLeader(LeaderHint),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("raft is shutting down or has stopped: {0}")]
    Stopped(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl NodeError {
    /// Not the leader (or leading without its runtime up), and no leader to point at: the
    /// caller retries and finds the leader.
    pub fn leader_unknown() -> Self {
        Self::NotLeader(LeaderHint { leader_id: None, leader_addr: None })
    }

    pub fn forward(f: &ForwardToLeader<NodeId, Node>) -> Self {
        Self::NotLeader(LeaderHint {
            leader_id: f.leader_id,
            leader_addr: f.leader_node.as_ref().map(|n| n.addr.clone()),
        })
    }

    /// Maps to the gRPC status; `what` names the call for not-leader messages.
    pub fn into_status(self, what: &str) -> Status {
        match self {
            Self::NotLeader(hint) => not_leader_status(what, &hint),
            Self::InvalidArgument(m) => Status::invalid_argument(m),
            Self::FailedPrecondition(m) => Status::failed_precondition(m),
            Self::DeadlineExceeded(m) => Status::deadline_exceeded(m),
            Self::NotFound(m) => Status::not_found(m),
            Self::Stopped(m) => {
                Status::unavailable(format!("{what}: replica is shutting down ({m}); retry another replica"))
            }
            Self::Internal(m) => Status::internal(format!("{what}: {m}")),
            Self::Command(e) => {
                let msg = e.to_string();
                match e {
                    CommandError::UnknownJob { .. } | CommandError::UnknownSavepoint { .. } => {
                        Status::not_found(msg)
                    }
                    CommandError::JobExists { .. }
                    | CommandError::DuplicateCheckpoint { .. }
                    | CommandError::DuplicateSavepoint { .. }
                    | CommandError::RequestIdReused { .. } => Status::already_exists(msg),
                    CommandError::InvalidConfig(_)
                    | CommandError::InvalidCheckpoint { .. }
                    | CommandError::InvalidReservation { .. } => Status::invalid_argument(msg),
                    CommandError::CounterExhausted { .. } => Status::resource_exhausted(msg),
                    _ => Status::failed_precondition(msg),
                }
            }
        }
    }
}

impl From<RaftError<NodeId, ClientWriteError<NodeId, Node>>> for NodeError {
    fn from(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> Self {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => Self::forward(&f),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => membership(c),
            RaftError::Fatal(f) => Self::Stopped(f.to_string()),
        }
    }
}

impl From<RaftError<NodeId, CheckIsLeaderError<NodeId, Node>>> for NodeError {
    fn from(e: RaftError<NodeId, CheckIsLeaderError<NodeId, Node>>) -> Self {
        match e {
            RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => Self::forward(&f),
            // Leadership could not be confirmed with a quorum: the caller must look elsewhere.
            RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => {
                Self::leader_unknown().with_context(q.to_string())
            }
            RaftError::Fatal(f) => Self::Stopped(f.to_string()),
        }
    }
}

impl NodeError {
    fn with_context(self, ctx: String) -> Self {
        tracing::debug!(context = %ctx, "leadership not confirmed");
        self
    }
}

fn membership(e: ChangeMembershipError<NodeId>) -> NodeError {
    NodeError::FailedPrecondition(format!("membership change refused: {e}"))
}
