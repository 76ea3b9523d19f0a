//! Leader hints on not-leader errors.
//!
//! A replica that cannot serve a call because it does not lead answers `UNAVAILABLE` with the
//! metadata keys below. Clients branch on the code and these keys, never on the message text.

use tonic::{Code, Status};

/// Metadata key carrying the leader's Raft node id (decimal).
pub const LEADER_ID_KEY: &str = "cairn-leader-id";
/// Metadata key carrying the leader's gRPC address (`host:port`).
pub const LEADER_ADDR_KEY: &str = "cairn-leader-addr";
/// Metadata key present (value `"1"`) on every not-leader error, so that a client can tell a
/// not-leader answer from an unrelated `UNAVAILABLE` (e.g. a connection failure).
pub const NOT_LEADER_KEY: &str = "cairn-not-leader";

/// Where the leader is, as far as the answering replica knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderHint {
    pub leader_id: Option<u64>,
    pub leader_addr: Option<String>,
}

/// Builds the not-leader status. `what` names the refused call for the message.
pub fn not_leader_status(what: &str, hint: &LeaderHint) -> Status {
    let msg = match (&hint.leader_id, &hint.leader_addr) {
        (Some(id), Some(addr)) => {
            format!("{what}: this replica is not the leader; the leader is node {id} at {addr}")
        }
        (Some(id), None) => {
            format!("{what}: this replica is not the leader; the leader is node {id} (address unknown)")
        }
        _ => format!("{what}: this replica is not the leader and knows of no leader yet; retry"),
    };
    let mut status = Status::unavailable(msg);
    let md = status.metadata_mut();
    md.insert(NOT_LEADER_KEY, tonic::metadata::MetadataValue::from_static("1"));
    if let Some(id) = hint.leader_id
        && let Ok(v) = id.to_string().parse()
    {
        md.insert(LEADER_ID_KEY, v);
    }
    if let Some(addr) = &hint.leader_addr
        && let Ok(v) = addr.parse()
    {
        md.insert(LEADER_ADDR_KEY, v);
    }
    status
}

/// Reads a not-leader hint from a status; `None` when the status is not a not-leader answer.
pub fn parse_not_leader(status: &Status) -> Option<LeaderHint> {
    if status.code() != Code::Unavailable {
        return None;
    }
    let md = status.metadata();
    md.get(NOT_LEADER_KEY)?;
    let leader_id = md.get(LEADER_ID_KEY).and_then(|v| v.to_str().ok()).and_then(|s| s.parse().ok());
    let leader_addr =
        md.get(LEADER_ADDR_KEY).and_then(|v| v.to_str().ok()).filter(|s| !s.is_empty()).map(str::to_owned);
    Some(LeaderHint { leader_id, leader_addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_round_trips_through_metadata() {
        let hint = LeaderHint { leader_id: Some(3), leader_addr: Some("127.0.0.1:7403".into()) };
        let st = not_leader_status("allocate", &hint);
        assert_eq!(st.code(), Code::Unavailable);
        assert_eq!(parse_not_leader(&st), Some(hint));
    }

    #[test]
    fn unknown_leader_has_no_address() {
        let hint = LeaderHint { leader_id: None, leader_addr: None };
        let st = not_leader_status("status", &hint);
        assert_eq!(parse_not_leader(&st), Some(hint));
    }

    #[test]
    fn plain_unavailable_is_not_a_not_leader_answer() {
        assert_eq!(parse_not_leader(&Status::unavailable("connection refused")), None);
    }
}
