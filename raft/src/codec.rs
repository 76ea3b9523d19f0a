//! Encoding of Raft messages inside `RaftPayload.data`.
//!
//! MessagePack with named fields (`rmp_serde::to_vec_named`): binary (integers, log ids and
//! byte strings are not spelled out in decimal text), about half the size of JSON for Cairn's
//! append-entries batches and several times faster to encode and decode, and still
//! self-describing, so a field added to a message by a later Cairn version is ignored by an
//! older one during a rolling upgrade.
//!
//! Decoding also accepts JSON, the encoding of earlier Cairn versions: a replica of this version
//! reads an older leader's messages and its replies, so a rolling upgrade that upgrades the
//! leader last keeps working. (A MessagePack map or array never starts with `{` or `[`, which
//! are small integers there, so the first byte tells the two apart.)

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A payload that could not be decoded: garbage bytes or a message from an incompatible peer.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode {what}: {source}")]
pub struct DecodeError {
    pub what: &'static str,
    #[source]
    pub source: DecodeErrorKind,
}

/// What the decoder refused.
#[derive(Debug, thiserror::Error)]
pub enum DecodeErrorKind {
    #[error("invalid MessagePack: {0}")]
    MessagePack(#[from] rmp_serde::decode::Error),
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A value that could not be encoded (never happens for Cairn's own types).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode {what}: {source}")]
pub struct EncodeError {
    pub what: &'static str,
    #[source]
    pub source: rmp_serde::encode::Error,
}

pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(value).map_err(|source| EncodeError { what, source })
}

pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    let result = match bytes.first() {
        Some(b'{' | b'[') => serde_json::from_slice(bytes).map_err(DecodeErrorKind::from),
        _ => rmp_serde::from_slice(bytes).map_err(DecodeErrorKind::from),
    };
    result.map_err(|source| DecodeError { what, source })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(tag = "cmd", rename_all = "snake_case")]
    enum Tagged {
        One { id: u64, data: Vec<u8> },
        Two { stats: serde_json::Value },
    }

    #[test]
    fn messages_round_trip_and_json_from_older_peers_still_decodes() {
        let values = vec![
            Tagged::One { id: u64::MAX, data: vec![0, 255, 7] },
            Tagged::Two { stats: serde_json::json!({"count": 3, "nested": [1.5, null, "x"]}) },
        ];
        let bytes = encode("test", &values).unwrap();
        assert_ne!(bytes.first(), Some(&b'{'));
        assert_eq!(decode::<Vec<Tagged>>("test", &bytes).unwrap(), values);
        let json = serde_json::to_vec(&values).unwrap();
        assert!(bytes.len() < json.len(), "{} bytes vs {} as JSON", bytes.len(), json.len());
        assert_eq!(decode::<Vec<Tagged>>("test", &json).unwrap(), values);
        let map: BTreeMap<String, u64> = [("a".to_owned(), 1)].into();
        assert_eq!(decode::<BTreeMap<String, u64>>("test", &serde_json::to_vec(&map).unwrap()).unwrap(), map);
    }

    #[test]
    fn garbage_is_a_typed_error_naming_the_message() {
        for bytes in [&b""[..], b"{", b"\xc1", b"\xdf\xff\xff\xff\xff", b"\x92\x01"] {
            let err = decode::<Vec<Tagged>>("raft reply", bytes).unwrap_err();
            assert_eq!(err.what, "raft reply");
            assert!(err.to_string().starts_with("cannot decode raft reply: invalid"), "{err}");
        }
    }

    #[test]
    fn a_field_added_by_a_later_version_is_ignored() {
        #[derive(serde::Serialize)]
        struct Newer {
            id: u64,
            added: String,
        }
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct Older {
            id: u64,
        }
        let bytes = encode("test", &Newer { id: 9, added: "x".into() }).unwrap();
        assert_eq!(decode::<Older>("test", &bytes).unwrap(), Older { id: 9 });
    }
}
