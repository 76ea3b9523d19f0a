//! How a caller proves who it is, for every port of a replica: the secrets (the admin token, the
//! worker token, the cluster secret), how they are read, the metadata that carries them, and the
//! credentials a replica adds to its Raft calls.
//!
//! | caller | service | credential |
//! | --- | --- | --- |
//! | operator (`cairnctl`, tools) | `cairn.admin.v1.Admin`, `cairn.v1.Cluster`, `cairn.v1.Store` | `authorization: Bearer <admin token>` |
//! | worker | `cairn.v1.TaskGateway` | `authorization: Bearer <worker token>`, or a client certificate naming the worker |
//! | replica | `cairn.v1.Raft` | a client certificate naming the node (TLS), or `cairn-cluster-secret` + `cairn-node-id` |
//!
//! A secret is compared in constant time (`subtle`), and never echoed in messages or `Debug`.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

/// Shortest accepted secret, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// Longest accepted secret, in bytes (it travels in a header).
pub const MAX_SECRET_LEN: usize = 4096;

/// Metadata carrying the cluster secret on a Raft call (plaintext clusters).
pub const CLUSTER_SECRET_KEY: &str = "cairn-cluster-secret";
/// Metadata naming the Raft node a call comes from.
pub const NODE_ID_KEY: &str = "cairn-node-id";
/// Metadata carrying a bearer token.
pub const AUTHORIZATION_KEY: &str = "authorization";

/// A shared secret: at least 16 bytes of printable ASCII, no whitespace. Its `Debug` output
/// never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

impl Secret {
    /// Validates a secret; `what` names it in the error ("the admin token"), which says what is
    /// wrong without echoing the value.
    pub fn new(what: &str, value: &str) -> Result<Self, String> {
        if value.len() < MIN_SECRET_LEN {
            return Err(format!(
                "{what} is {} bytes long; use at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 32`)",
                value.len()
            ));
        }
        if value.len() > MAX_SECRET_LEN {
            return Err(format!(
                "{what} is {} bytes long; at most {MAX_SECRET_LEN} are allowed",
                value.len()
            ));
        }
        if let Some(pos) = value.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(format!("{what} must be printable ASCII without whitespace; byte {pos} is not"));
        }
        Ok(Self(Arc::from(value)))
    }

    /// A fresh random secret (64 hex digits).
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self(Arc::from(hex))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_bytes().ct_eq(presented))
    }
}

/// Reads a one-line secret file (a trailing newline is ignored) and validates it; `what` names
/// the secret in errors, which name the file and never echo the value.
pub fn read_secret_file(path: &std::path::Path, what: &str) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the file {} holding {what}: {e}", path.display()))?;
    let value = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    Secret::new(what, value).map_err(|e| format!("file {}: {e}", path.display()))
}

/// The secret in the environment variable `var`, if set; the error names the variable.
pub fn secret_from_env(var: &str, what: &str) -> Result<Option<Secret>, String> {
    match std::env::var(var) {
        Ok(v) => Secret::new(what, &v).map(Some).map_err(|e| format!("{var}: {e}")),
        Err(_) => Ok(None),
    }
}

/// The bearer token of a call's `authorization` metadata; the error says what is missing.
pub fn bearer<T>(req: &Request<T>, what: &str) -> Result<Vec<u8>, Status> {
    let Some(value) = req.metadata().get(AUTHORIZATION_KEY) else {
        return Err(Status::unauthenticated(format!(
            "missing authorization metadata; pass {what} (`authorization: Bearer <token>`)"
        )));
    };
    let presented = value.as_bytes();
    presented
        .strip_prefix(b"Bearer ")
        .or_else(|| presented.strip_prefix(b"bearer "))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            Status::unauthenticated(format!(
                "the authorization metadata must be `Bearer <token>` with {what}"
            ))
        })
}

/// What a Raft client presents on every call when the cluster runs without TLS.
#[derive(Clone, Debug)]
pub struct ClusterCredentials {
    node_id: MetadataValue<Ascii>,
    secret: MetadataValue<Ascii>,
}

impl ClusterCredentials {
    pub fn new(node_id: u64, secret: &Secret) -> Self {
        // A validated secret is printable ASCII, always a valid header value.
        let secret =
            MetadataValue::try_from(secret.expose()).unwrap_or_else(|_| MetadataValue::from_static(""));
        Self { node_id: MetadataValue::from(node_id), secret }
    }

    /// Adds the credentials to a request's metadata.
    pub fn apply<T>(&self, req: &mut Request<T>) {
        req.metadata_mut().insert(NODE_ID_KEY, self.node_id.clone());
        req.metadata_mut().insert(CLUSTER_SECRET_KEY, self.secret.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_validated_without_echoing_them() {
        assert!(Secret::new("the admin token", "short").unwrap_err().contains("at least 16"));
        let err = Secret::new("the cluster secret", "0123456789 abcdefgh").unwrap_err();
        assert!(
            err.contains("the cluster secret") && err.contains("without whitespace") && !err.contains("0123")
        );
        assert!(Secret::new("x", "0123456789\u{e9}abcdefgh").is_err());
        let s = Secret::new("x", "0123456789abcdef").unwrap();
        assert!(!format!("{s:?}").contains("0123"));
        assert_eq!(Secret::generate().expose().len(), 64);
        assert_ne!(Secret::generate(), Secret::generate());
    }

    #[test]
    fn comparison_is_exact() {
        let s = Secret::new("x", "0123456789abcdef").unwrap();
        assert!(s.matches(b"0123456789abcdef"));
        assert!(!s.matches(b"0123456789abcdeX"));
        assert!(!s.matches(b"0123456789abcde"));
        assert!(!s.matches(b"0123456789abcdef0"));
        assert!(!s.matches(b""));
    }

    #[test]
    fn bearer_tokens_are_read_from_the_metadata() {
        let mut r = Request::new(());
        assert!(bearer(&r, "the admin token").unwrap_err().message().starts_with("missing authorization"));
        r.metadata_mut().insert("authorization", "Basic abc".parse().unwrap());
        assert!(bearer(&r, "the admin token").is_err());
        r.metadata_mut().insert("authorization", "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&r, "the admin token").unwrap(), b"abc");
    }
}
