//! Encoding of Raft messages inside `RaftPayload.data`.
//!
//! JSON, via openraft's serde support: self-describing, so a field added to a message by a later
//! Cairn version is ignored by an older one during a rolling upgrade, and easy to inspect when
//! debugging. Raft messages are small (commands are a few hundred bytes), so the codec is not
//! the bottleneck; fsync is.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A payload that could not be decoded: garbage bytes or a message from an incompatible peer.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode {what}: {source}")]
pub struct DecodeError {
    pub what: &'static str,
    #[source]
    pub source: serde_json::Error,
}

/// A value that could not be encoded (never happens for Cairn's own types).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode {what}: {source}")]
pub struct EncodeError {
    pub what: &'static str,
    #[source]
    pub source: serde_json::Error,
}

pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, EncodeError> {
    serde_json::to_vec(value).map_err(|source| EncodeError { what, source })
}

pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(bytes).map_err(|source| DecodeError { what, source })
}
