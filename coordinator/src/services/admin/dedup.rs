//! Request ids of mutating operator calls: validation, fingerprints of the call's arguments, and
//! wrapping a command so the state machine applies it once per id (see
//! `cairn_raft::model::request`).

use cairn_raft::model::request::{fingerprint, validate_request_id};
use cairn_raft::model::{Command, Outcome};

use crate::error::NodeError;
use crate::leader::TriggerKey;

/// A validated request id with the fingerprint of its call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestKey {
    pub id: String,
    pub fingerprint: u64,
}

impl RequestKey {
    /// `None` for an empty request id (no retry protection); an error names what is wrong.
    /// `call` names the RPC, so the same id used for two kinds of calls never matches.
    pub fn parse(request_id: &str, call: &str, args: &[&[u8]]) -> Result<Option<Self>, NodeError> {
        if request_id.is_empty() {
            return Ok(None);
        }
        validate_request_id(request_id).map_err(|e| NodeError::InvalidArgument(e.to_string()))?;
        let mut parts: Vec<&[u8]> = vec![call.as_bytes()];
        parts.extend_from_slice(args);
        Ok(Some(Self { id: request_id.to_owned(), fingerprint: fingerprint(&parts) }))
    }

    pub fn trigger_key(&self) -> TriggerKey {
        TriggerKey { request_id: self.id.clone(), fingerprint: self.fingerprint }
    }
}

/// `cmd`, applied at most once for `key` when there is one.
pub fn wrap(key: Option<&RequestKey>, cmd: Command) -> Command {
    match key {
        Some(k) => Command::Deduplicated {
            request_id: k.id.clone(),
            fingerprint: k.fingerprint,
            command: Box::new(cmd),
        },
        None => cmd,
    }
}

/// The outcome of the first execution, and whether this call was a repeat.
pub fn first(outcome: Outcome) -> (Outcome, bool) {
    match outcome {
        Outcome::Repeated { first } => (*first, true),
        other => (other, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_the_call_and_its_arguments() {
        let a = RequestKey::parse("r-1", "SubmitJob", &[b"job"]).unwrap().unwrap();
        assert_eq!(a, RequestKey::parse("r-1", "SubmitJob", &[b"job"]).unwrap().unwrap());
        assert_ne!(
            a.fingerprint,
            RequestKey::parse("r-1", "CancelJob", &[b"job"]).unwrap().unwrap().fingerprint
        );
        assert_ne!(
            a.fingerprint,
            RequestKey::parse("r-1", "SubmitJob", &[b"jab"]).unwrap().unwrap().fingerprint
        );
        assert_eq!(RequestKey::parse("", "SubmitJob", &[]).unwrap(), None);
        let err = RequestKey::parse("no spaces", "SubmitJob", &[]).unwrap_err();
        assert!(matches!(err, NodeError::InvalidArgument(m) if m.contains("request_id")));
    }
}
