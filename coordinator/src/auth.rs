//! Who may call a replica, port by port ([`cairn_proto::auth`] holds the shared pieces):
//!
//! - operator services (`cairn.admin.v1.Admin`, `cairn.v1.Cluster`, `cairn.v1.Store`): every
//!   call carries `authorization: Bearer <admin token>` ([`AdminAuth`]);
//! - the task gateway (`cairn.v1.TaskGateway`): a worker presents a worker token or a client
//!   certificate naming it, and its worker id is bound to that identity ([`WorkerAuth`]);
//! - Raft (`cairn.v1.Raft`): only replicas, see `cairn_raft::service`.
//!
//! Secrets are compared in constant time (`subtle`) and never echoed. A refused call never
//! reaches the service, so it changes nothing.

use std::fmt;
use std::sync::Arc;

use cairn_proto::auth::{Secret, bearer};
use cairn_proto::identity::{PeerIdentity, identity_of};
use tonic::{Request, Status};

/// The cluster's admin token: at least 16 bytes of printable ASCII, no whitespace. Its `Debug`
/// output never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Secret);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminToken(<{} bytes, redacted>)", self.0.expose().len())
    }
}

impl AdminToken {
    /// Validates a token; the error says what is wrong without echoing the value.
    pub fn new(token: &str) -> Result<Self, String> {
        Secret::new("the admin token", token).map(Self)
    }

    /// A fresh random token (64 hex digits).
    pub fn generate() -> Self {
        Self(Secret::generate())
    }

    pub fn expose(&self) -> &str {
        self.0.expose()
    }

    pub fn secret(&self) -> &Secret {
        &self.0
    }

    /// Whether `presented` is this token, in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.matches(presented)
    }
}

impl From<Secret> for AdminToken {
    fn from(secret: Secret) -> Self {
        Self(secret)
    }
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
        let token = bearer(req, "the cluster's admin token")?;
        if self.token.matches(&token) { Ok(()) } else { Err(Status::unauthenticated("wrong admin token")) }
    }
}

impl tonic::service::Interceptor for AdminAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

/// The worker tokens a replica accepts. A token is either shared (any worker id may present it)
/// or bound to one worker id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerTokens {
    entries: Vec<(Option<String>, Secret)>,
}

impl WorkerTokens {
    /// One token every worker presents.
    pub fn shared(token: Secret) -> Self {
        Self { entries: vec![(None, token)] }
    }

    /// Parses a token file: one entry per line, `<token>` (shared by every worker) or
    /// `<worker-id> <token>` (only that worker); blank lines and `#` comments are skipped. The
    /// error names the line without echoing a token.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let entry = match fields.as_slice() {
                [token] => (None, Secret::new(&format!("the token on line {}", n + 1), token)?),
                [id, token] => {
                    (Some((*id).to_owned()), Secret::new(&format!("the token of worker `{id}`"), token)?)
                }
                _ => {
                    return Err(format!(
                        "line {} must be `<token>` or `<worker-id> <token>`, it has {} fields",
                        n + 1,
                        fields.len()
                    ));
                }
            };
            if entries.iter().any(|(_, s): &(Option<String>, Secret)| *s == entry.1) {
                return Err(format!("line {}: this token is listed twice; give every entry its own", n + 1));
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            return Err("no token in the file: write one token, or `<worker-id> <token>` lines".into());
        }
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether any entry is `secret` (to keep the secrets of different roles apart).
    pub fn contains(&self, secret: &Secret) -> bool {
        self.entries.iter().any(|(_, s)| s == secret)
    }

    /// The entry `presented` matches. Every entry is compared, in constant time each.
    fn find(&self, presented: &[u8]) -> Option<&Option<String>> {
        let mut found = None;
        for (id, secret) in &self.entries {
            if secret.matches(presented) {
                found = Some(id);
            }
        }
        found
    }
}

/// What a worker proved on attaching. A worker id stays bound to the identity it attached with
/// while its session lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerIdentity {
    /// The shared worker token (any worker id).
    SharedToken,
    /// A token bound to this worker id.
    Token(String),
    /// A client certificate naming this worker id.
    Certificate(String),
}

impl fmt::Display for WorkerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerIdentity::SharedToken => f.write_str("the shared worker token"),
            WorkerIdentity::Token(id) => write!(f, "the worker token of `{id}`"),
            WorkerIdentity::Certificate(id) => write!(f, "a certificate of worker `{id}`"),
        }
    }
}

impl WorkerIdentity {
    /// Whether this identity may act as worker `worker_id`.
    pub fn allows(&self, worker_id: &str) -> Result<(), Status> {
        match self {
            WorkerIdentity::SharedToken => Ok(()),
            WorkerIdentity::Token(id) | WorkerIdentity::Certificate(id) if id == worker_id => Ok(()),
            other => {
                Err(Status::permission_denied(format!("{other} may not register as worker `{worker_id}`")))
            }
        }
    }
}

/// How workers authenticate at the task gateway.
#[derive(Clone, Debug)]
pub struct WorkerAuth {
    tokens: Arc<WorkerTokens>,
    /// Whether client certificates can identify workers (the replica serves TLS).
    certificates: bool,
}

/// What a worker without credentials is told.
pub const WORKER_CREDENTIALS_REQUIRED: &str = "missing worker credentials: pass the worker token \
     (cairn-worker --token-file, or CAIRN_WORKER_TOKEN) or, with TLS, a client certificate naming \
     the worker (cairn://worker/<id>)";

impl WorkerAuth {
    pub fn new(tokens: WorkerTokens, certificates: bool) -> Self {
        Self { tokens: Arc::new(tokens), certificates }
    }

    /// Who the caller of `Attach` is, from its token or its client certificate.
    pub fn authenticate<T>(&self, req: &Request<T>) -> Result<WorkerIdentity, Status> {
        if req.metadata().get(cairn_proto::auth::AUTHORIZATION_KEY).is_some() {
            let token = bearer(req, "the worker token")?;
            return match self.tokens.find(&token) {
                Some(None) => Ok(WorkerIdentity::SharedToken),
                Some(Some(id)) => Ok(WorkerIdentity::Token(id.clone())),
                None => Err(Status::unauthenticated("wrong worker token")),
            };
        }
        let leaf = req.peer_certs().and_then(|certs| certs.first().cloned());
        match leaf {
            Some(cert) if self.certificates => match identity_of(cert.as_ref()) {
                Some(PeerIdentity::Worker(id)) => Ok(WorkerIdentity::Certificate(id)),
                Some(PeerIdentity::Node(id)) => Err(Status::permission_denied(format!(
                    "the client certificate names replica {id}, not a worker (cairn://worker/<id>)"
                ))),
                Some(PeerIdentity::Other(subject)) => Err(Status::permission_denied(format!(
                    "the client certificate ({subject}) names no worker (cairn://worker/<id>)"
                ))),
                None => Err(Status::unauthenticated("the client certificate cannot be parsed")),
            },
            _ => Err(Status::unauthenticated(WORKER_CREDENTIALS_REQUIRED)),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn req(auth: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        r
    }

    #[test]
    fn admin_calls_without_the_right_token_are_refused_precisely() {
        let auth = AdminAuth::new(AdminToken::new("0123456789abcdef").unwrap());
        assert!(auth.check(&req(Some("Bearer 0123456789abcdef"))).is_ok());
        let missing = auth.check(&req(None)).unwrap_err();
        assert_eq!(missing.code(), Code::Unauthenticated);
        assert!(missing.message().starts_with("missing authorization metadata"));
        let wrong = auth.check(&req(Some("Bearer 0123456789abcdeX"))).unwrap_err();
        assert_eq!((wrong.code(), wrong.message()), (Code::Unauthenticated, "wrong admin token"));
        let scheme = auth.check(&req(Some("Basic 0123456789abcdef"))).unwrap_err();
        assert_eq!(scheme.code(), Code::Unauthenticated);
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert!(!format!("{t:?}").contains("0123"));
        assert!(AdminToken::new("short").unwrap_err().contains("admin token"));
    }

    #[test]
    fn token_files_hold_shared_and_bound_tokens() {
        let t = WorkerTokens::parse(
            "# workers\n\n0123456789abcdef\nw-1 1111111111111111\nw-2   2222222222222222\n",
        )
        .unwrap();
        assert_eq!(t.find(b"0123456789abcdef"), Some(&None));
        assert_eq!(t.find(b"1111111111111111"), Some(&Some("w-1".to_owned())));
        assert_eq!(t.find(b"2222222222222222"), Some(&Some("w-2".to_owned())));
        assert_eq!(t.find(b"3333333333333333"), None);
        let err = WorkerTokens::parse("w-1 short").unwrap_err();
        assert!(
            err.contains("worker `w-1`") && err.contains("at least 16") && !err.contains("short"),
            "{err}"
        );
        assert!(WorkerTokens::parse("a b c").unwrap_err().contains("line 1"));
        assert!(WorkerTokens::parse("# nothing\n").unwrap_err().contains("no token"));
        let twice = WorkerTokens::parse("a 0123456789abcdef\nb 0123456789abcdef").unwrap_err();
        assert!(twice.contains("line 2") && twice.contains("twice"), "{twice}");
    }

    #[test]
    fn workers_prove_an_identity_that_binds_their_id() {
        let tokens = WorkerTokens::parse("0123456789abcdef\nw-1 1111111111111111").unwrap();
        let auth = WorkerAuth::new(tokens, false);
        let none = auth.authenticate(&req(None)).unwrap_err();
        assert_eq!((none.code(), none.message()), (Code::Unauthenticated, WORKER_CREDENTIALS_REQUIRED));
        let wrong = auth.authenticate(&req(Some("Bearer 9999999999999999"))).unwrap_err();
        assert_eq!((wrong.code(), wrong.message()), (Code::Unauthenticated, "wrong worker token"));
        let shared = auth.authenticate(&req(Some("Bearer 0123456789abcdef"))).unwrap();
        assert_eq!(shared, WorkerIdentity::SharedToken);
        shared.allows("anyone").unwrap();
        let bound = auth.authenticate(&req(Some("Bearer 1111111111111111"))).unwrap();
        bound.allows("w-1").unwrap();
        let denied = bound.allows("w-2").unwrap_err();
        assert_eq!(denied.code(), Code::PermissionDenied);
        assert!(denied.message().contains("`w-1` may not register as worker `w-2`"), "{denied}");
    }
}
