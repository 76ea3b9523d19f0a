//! Bearer-token authentication of the operator services (`cairn.admin.v1.Admin`,
//! `cairn.v1.Cluster`, `cairn.v1.Store`).
//!
//! Every call must carry `authorization: Bearer <token>` with the cluster's admin token. The
//! comparison takes a time that depends only on the expected token's length, never on how much
//! of a guess is right. A refused call never reaches the service, so it changes nothing.

use std::fmt;
use std::sync::Arc;

use tonic::{Request, Status};

/// Shortest accepted admin token, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest accepted admin token, in bytes (it travels in a header).
pub const MAX_TOKEN_LEN: usize = 4096;

/// The cluster's admin token: at least 16 bytes of printable ASCII, no whitespace. Its `Debug`
/// output never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Arc<str>);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminToken(<{} bytes, redacted>)", self.0.len())
    }
}

impl AdminToken {
    /// Validates a token; the error says what is wrong without echoing the value.
    pub fn new(token: &str) -> Result<Self, String> {
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the admin token is {} bytes long; use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)",
                token.len()
            ));
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(format!(
                "the admin token is {} bytes long; at most {MAX_TOKEN_LEN} are allowed",
                token.len()
            ));
        }
        if let Some(pos) = token.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(format!(
                "the admin token must be printable ASCII without whitespace; byte {pos} is not"
            ));
        }
        Ok(Self(Arc::from(token)))
    }

    /// A fresh random token (64 hex digits).
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self(Arc::from(hex))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time independent of `presented`'s content.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(presented, self.0.as_bytes())
    }
}

/// Compares `presented` with `expected` in time that depends only on `expected.len()`.
pub fn constant_time_eq(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = (presented.len() ^ expected.len()) as u64;
    for (i, e) in expected.iter().enumerate() {
        // Out-of-range reads wrap (or read 0 on an empty input) so the loop never exits early.
        let p = if presented.is_empty() { 0 } else { presented[i % presented.len()] };
        diff |= u64::from(p ^ e);
    }
    std::hint::black_box(diff) == 0
}

/// Interceptor that admits only calls carrying the admin token.
#[derive(Clone, Debug)]
pub struct AdminAuth {
    token: AdminToken,
}

impl AdminAuth {
    pub fn new(token: AdminToken) -> Self {
        Self { token }
    }

    /// Checks the `authorization` metadata of a call.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(value) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "missing authorization metadata; pass the cluster's admin token \
                 (`authorization: Bearer <token>`)",
            ));
        };
        let presented = value.as_bytes();
        let Some(token) = presented.strip_prefix(b"Bearer ").or_else(|| presented.strip_prefix(b"bearer "))
        else {
            return Err(Status::unauthenticated(
                "the authorization metadata must be `Bearer <token>` with the cluster's admin token",
            ));
        };
        if self.token.matches(token) { Ok(()) } else { Err(Status::unauthenticated("wrong admin token")) }
    }
}

impl tonic::service::Interceptor for AdminAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn constant_time_compare_is_exact() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdeX", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"", b"0123456789abcdef"));
        // A repetition of a prefix must not pass through the wrapping read.
        assert!(!constant_time_eq(b"ab", b"abab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn tokens_are_validated_without_echoing_them() {
        assert!(AdminToken::new("short").unwrap_err().contains("at least 16"));
        let err = AdminToken::new("0123456789 abcdefgh").unwrap_err();
        assert!(err.contains("without whitespace") && !err.contains("0123"), "{err}");
        assert!(AdminToken::new("0123456789\u{e9}abcdefgh").is_err());
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert!(!format!("{t:?}").contains("0123"));
        assert_eq!(AdminToken::generate().expose().len(), 64);
        assert_ne!(AdminToken::generate(), AdminToken::generate());
    }

    fn req(auth: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        r
    }

    #[test]
    fn calls_without_the_right_token_are_refused_precisely() {
        let auth = AdminAuth::new(AdminToken::new("0123456789abcdef").unwrap());
        assert!(auth.check(&req(Some("Bearer 0123456789abcdef"))).is_ok());
        let missing = auth.check(&req(None)).unwrap_err();
        assert_eq!(missing.code(), Code::Unauthenticated);
        assert!(missing.message().starts_with("missing authorization metadata"));
        let wrong = auth.check(&req(Some("Bearer 0123456789abcdeX"))).unwrap_err();
        assert_eq!((wrong.code(), wrong.message()), (Code::Unauthenticated, "wrong admin token"));
        let scheme = auth.check(&req(Some("Basic 0123456789abcdef"))).unwrap_err();
        assert_eq!(scheme.code(), Code::Unauthenticated);
    }
}
