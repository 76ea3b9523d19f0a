//! The internal call of a leadership transfer: the leader asks the target replica to start an
//! election (`cairn.v1.Raft/TriggerElection`).

use cairn_proto::v1::TriggerElectionRequest;
use cairn_proto::v1::raft_client::RaftClient;
use tokio::time::Instant;

use crate::error::NodeError;

pub(super) async fn ask_to_elect(
    addr: &str,
    leader_id: u64,
    term: u64,
    deadline: Instant,
    tls: Option<&cairn_proto::tls::ClientTls>,
    credentials: Option<&cairn_proto::auth::ClusterCredentials>,
) -> Result<(), NodeError> {
    let unreachable = |e: String| NodeError::FailedPrecondition(format!("cannot reach node at {addr}: {e}"));
    let endpoint = cairn_proto::tls::endpoint(addr, tls).map_err(|e| unreachable(e.to_string()))?;
    let call = async {
        let channel = endpoint.connect().await.map_err(|e| unreachable(e.to_string()))?;
        let mut request = tonic::Request::new(TriggerElectionRequest { leader_id, term });
        if let Some(c) = credentials {
            c.apply(&mut request);
        }
        RaftClient::new(channel).trigger_election(request).await.map_err(|s| {
            NodeError::FailedPrecondition(format!(
                "node at {addr} refused to start an election: {}",
                s.message()
            ))
        })
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(NodeError::DeadlineExceeded(format!("node at {addr} did not answer in time"))),
    }
}
