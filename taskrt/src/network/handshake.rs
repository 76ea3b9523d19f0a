//! How two workers prove to each other that both run the same job attempt.
//!
//! The coordinator gives every worker of a job attempt the same [`ExchangeKey`] over its
//! authenticated gateway stream. The key itself never crosses a data connection: each side
//! proves it holds the key with an HMAC-SHA256 over the whole exchange, bound to fresh nonces
//! from both sides (so a recorded handshake cannot be replayed):
//!
//! ```text
//! dialer                                              acceptor
//!   HELLO  magic, version, job, attempt, from, to,
//!          plan digest, credit, dialer nonce      ──▶  looks the attempt up (unknown: REFUSE)
//!                                                 ◀──  CHALLENGE acceptor nonce, credit,
//!                                                       mac(key, "acceptor" ‖ hello ‖ nonce ‖ credit)
//!   checks the acceptor's mac (wrong: gives up)
//!   PROOF  mac(key, "dialer" ‖ hello ‖ nonce ‖ credit) ──▶  checks it (wrong: REFUSE, nothing changes)
//!                                                       compares the plan digest (differs: REFUSE)
//!                                                 ◀──  ACCEPT
//! ```
//!
//! Until ACCEPT, an acceptor keeps the attempt's registration in place: a caller that fails the
//! proof changes nothing, and the real peer can still connect.

use std::fmt;

use ring::hmac;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::wire::{
    FrameWriter, KIND_ACCEPT, KIND_CHALLENGE, KIND_HELLO, KIND_PROOF, KIND_REFUSE, Reader, WireError, put_str,
};
use super::{MAX_CREDIT, NetworkError};

const MAGIC: &[u8; 8] = b"CAIRNX\r\n";
const VERSION: u16 = 1;
/// Longest job or worker id in a HELLO, in bytes.
pub(crate) const MAX_ID: usize = 256;
/// Largest handshake frame.
const MAX_HANDSHAKE_FRAME: usize = 2048;

/// The secret a job attempt's workers share: 32 random bytes chosen by the coordinator for each
/// deployment. Its `Debug` output never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ExchangeKey([u8; 32]);

impl fmt::Debug for ExchangeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExchangeKey(<redacted>)")
    }
}

impl ExchangeKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn hmac(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

/// Why an acceptor turned a dialer away. Sent to the dialer as a code and a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// The acceptor has no registration for this attempt and dialer (yet): worth retrying.
    Unknown = 1,
    /// The dialer could not prove it holds the attempt's key.
    Unauthenticated = 2,
    /// Both hold the key but disagree on the channels between them.
    PlanMismatch = 3,
    /// Malformed or unsupported HELLO.
    BadHello = 4,
}

impl RefuseReason {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Unknown,
            2 => Self::Unauthenticated,
            3 => Self::PlanMismatch,
            4 => Self::BadHello,
            _ => return None,
        })
    }
}

/// The dialer's opening message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub job: String,
    pub attempt: u64,
    pub from_worker: String,
    pub to_worker: String,
    pub plan_digest: [u8; 8],
    pub credit: u32,
    pub nonce: [u8; 32],
}

impl Hello {
    fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        put_str(&mut b, "the job id", self.job.as_bytes(), MAX_ID)?;
        b.extend_from_slice(&self.attempt.to_le_bytes());
        put_str(&mut b, "the dialing worker id", self.from_worker.as_bytes(), MAX_ID)?;
        put_str(&mut b, "the accepting worker id", self.to_worker.as_bytes(), MAX_ID)?;
        b.extend_from_slice(&self.plan_digest);
        b.extend_from_slice(&self.credit.to_le_bytes());
        b.extend_from_slice(&self.nonce);
        Ok(b)
    }

    fn decode(body: &[u8]) -> Result<Self, NetworkError> {
        let mut r = Reader::new(body);
        let magic: [u8; 8] = r.array("magic")?;
        if &magic != MAGIC {
            return Err(NetworkError::Protocol("not a Cairn data connection (bad magic)".into()));
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(NetworkError::Protocol(format!(
                "data connection version {version} is not supported (this worker speaks {VERSION})"
            )));
        }
        let hello = Self {
            job: r.string("the job id", MAX_ID)?,
            attempt: r.u64("attempt")?,
            from_worker: r.string("the dialing worker id", MAX_ID)?,
            to_worker: r.string("the accepting worker id", MAX_ID)?,
            plan_digest: r.array("plan digest")?,
            credit: r.u32("credit")?,
            nonce: r.array("nonce")?,
        };
        r.end()?;
        check_credit(hello.credit)?;
        Ok(hello)
    }
}

fn check_credit(credit: u32) -> Result<(), NetworkError> {
    if credit == 0 || credit > MAX_CREDIT {
        return Err(NetworkError::Protocol(format!(
            "credit {credit} per channel is outside 1..={MAX_CREDIT}"
        )));
    }
    Ok(())
}

fn transcript(role: &[u8], hello: &[u8], nonce: &[u8; 32], credit: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(role.len() + hello.len() + 36 + 16);
    t.extend_from_slice(b"cairn-exchange/1 ");
    t.extend_from_slice(role);
    t.extend_from_slice(hello);
    t.extend_from_slice(nonce);
    t.extend_from_slice(&credit.to_le_bytes());
    t
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, kind: u8, body: &[u8]) -> Result<(), NetworkError> {
    let mut w = FrameWriter::default();
    w.raw(kind, body)?;
    s.write_all(w.buffer()).await?;
    s.flush().await?;
    Ok(())
}

/// Reads one handshake frame: its kind and body.
async fn recv<S: AsyncRead + Unpin>(s: &mut S) -> Result<(u8, Vec<u8>), NetworkError> {
    let len = s.read_u32_le().await? as usize;
    if len == 0 || len > MAX_HANDSHAKE_FRAME {
        return Err(NetworkError::Protocol(format!(
            "handshake frame of {len} bytes (expected 1..={MAX_HANDSHAKE_FRAME})"
        )));
    }
    let mut buf = vec![0; len];
    s.read_exact(&mut buf).await?;
    let kind = buf.remove(0);
    Ok((kind, buf))
}

fn refusal(body: &[u8]) -> NetworkError {
    let mut r = Reader::new(body);
    let code = r.u8("refusal code").ok().and_then(RefuseReason::from_code);
    let message = r.string("refusal message", 1024).unwrap_or_else(|_| "(unreadable message)".into());
    NetworkError::Refused { reason: code, message }
}

/// The dialer's side. Returns the acceptor's credit per channel once accepted.
pub(crate) async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    hello: &Hello,
    key: &ExchangeKey,
) -> Result<u32, NetworkError> {
    let hello_bytes = hello.encode()?;
    send(s, KIND_HELLO, &hello_bytes).await?;
    let (kind, body) = recv(s).await?;
    match kind {
        KIND_CHALLENGE => {}
        KIND_REFUSE => return Err(refusal(&body)),
        other => return Err(NetworkError::Protocol(format!("expected a challenge, got frame kind {other}"))),
    }
    let mut r = Reader::new(&body);
    let nonce: [u8; 32] = r.array("acceptor nonce")?;
    let credit = r.u32("acceptor credit")?;
    let mac: [u8; 32] = r.array("acceptor mac")?;
    r.end()?;
    check_credit(credit)?;
    let hkey = key.hmac();
    if hmac::verify(&hkey, &transcript(b"acceptor", &hello_bytes, &nonce, credit), &mac).is_err() {
        return Err(NetworkError::PeerUnauthenticated);
    }
    let proof = hmac::sign(&hkey, &transcript(b"dialer", &hello_bytes, &nonce, credit));
    send(s, KIND_PROOF, proof.as_ref()).await?;
    let (kind, body) = recv(s).await?;
    match kind {
        KIND_ACCEPT => Ok(credit),
        KIND_REFUSE => Err(refusal(&body)),
        other => Err(NetworkError::Protocol(format!("expected accept or refuse, got frame kind {other}"))),
    }
}

/// The acceptor's first step: read and check the HELLO. A malformed one is refused here.
pub(crate) async fn read_hello<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<(Hello, Vec<u8>), NetworkError> {
    let (kind, body) = recv(s).await?;
    if kind != KIND_HELLO {
        return Err(NetworkError::Protocol(format!("expected a hello, got frame kind {kind}")));
    }
    match Hello::decode(&body) {
        Ok(hello) => Ok((hello, body)),
        Err(e) => {
            let _ = refuse(s, RefuseReason::BadHello, &e.to_string()).await;
            Err(e)
        }
    }
}

/// Tells the dialer why it was turned away.
pub(crate) async fn refuse<S: AsyncWrite + Unpin>(
    s: &mut S,
    reason: RefuseReason,
    message: &str,
) -> Result<(), NetworkError> {
    let mut body = vec![reason as u8];
    let message = &message.as_bytes()[..message.len().min(1024)];
    put_str(&mut body, "refusal message", message, 1024)?;
    send(s, KIND_REFUSE, &body).await
}

/// The acceptor's second step: challenge the dialer and check its proof. On success the caller
/// still has to send [`accept`] (after its own checks).
pub(crate) async fn challenge<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    hello_bytes: &[u8],
    key: &ExchangeKey,
    credit: u32,
) -> Result<(), NetworkError> {
    let nonce: [u8; 32] = rand::random();
    let hkey = key.hmac();
    let mac = hmac::sign(&hkey, &transcript(b"acceptor", hello_bytes, &nonce, credit));
    let mut body = Vec::with_capacity(68);
    body.extend_from_slice(&nonce);
    body.extend_from_slice(&credit.to_le_bytes());
    body.extend_from_slice(mac.as_ref());
    send(s, KIND_CHALLENGE, &body).await?;
    let (kind, proof) = recv(s).await?;
    if kind != KIND_PROOF {
        return Err(NetworkError::Protocol(format!("expected a proof, got frame kind {kind}")));
    }
    if hmac::verify(&hkey, &transcript(b"dialer", hello_bytes, &nonce, credit), &proof).is_err() {
        let _ = refuse(s, RefuseReason::Unauthenticated, "authentication failed: wrong exchange key").await;
        return Err(NetworkError::PeerUnauthenticated);
    }
    Ok(())
}

pub(crate) async fn accept<S: AsyncWrite + Unpin>(s: &mut S) -> Result<(), NetworkError> {
    send(s, KIND_ACCEPT, &[]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            job: "job-1".into(),
            attempt: 3,
            from_worker: "a".into(),
            to_worker: "b".into(),
            plan_digest: [1; 8],
            credit: 64,
            nonce: [9; 32],
        }
    }

    #[tokio::test]
    async fn matching_keys_complete_the_handshake() {
        let (mut d, mut a) = tokio::io::duplex(4096);
        let key = ExchangeKey::generate();
        let k2 = key.clone();
        let acceptor = tokio::spawn(async move {
            let (h, bytes) = read_hello(&mut a).await?;
            challenge(&mut a, &bytes, &k2, 32).await?;
            accept(&mut a).await?;
            Ok::<_, NetworkError>(h)
        });
        assert_eq!(dial(&mut d, &hello(), &key).await.unwrap(), 32);
        assert_eq!(acceptor.await.unwrap().unwrap(), hello());
    }

    #[tokio::test]
    async fn a_dialer_without_the_key_is_refused() {
        let (mut d, mut a) = tokio::io::duplex(4096);
        let key = ExchangeKey::generate();
        let acceptor = tokio::spawn(async move {
            let (_, bytes) = read_hello(&mut a).await?;
            challenge(&mut a, &bytes, &key, 32).await
        });
        // The dialer holds a different key: it sees the acceptor cannot prove the key it holds.
        let err = dial(&mut d, &hello(), &ExchangeKey::generate()).await.unwrap_err();
        assert!(matches!(err, NetworkError::PeerUnauthenticated), "{err}");
        drop(d);
        assert!(acceptor.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_forged_proof_is_refused_with_a_reason() {
        let (mut d, mut a) = tokio::io::duplex(4096);
        let key = ExchangeKey::generate();
        let acceptor = tokio::spawn(async move {
            let (_, bytes) = read_hello(&mut a).await?;
            challenge(&mut a, &bytes, &key, 32).await
        });
        // A caller that skips checking the challenge and sends 32 arbitrary bytes as its proof.
        send(&mut d, KIND_HELLO, &hello().encode().unwrap()).await.unwrap();
        let (kind, _) = recv(&mut d).await.unwrap();
        assert_eq!(kind, KIND_CHALLENGE);
        send(&mut d, KIND_PROOF, &[0; 32]).await.unwrap();
        let (kind, body) = recv(&mut d).await.unwrap();
        assert_eq!(kind, KIND_REFUSE);
        assert!(matches!(
            refusal(&body),
            NetworkError::Refused { reason: Some(RefuseReason::Unauthenticated), .. }
        ));
        assert!(matches!(acceptor.await.unwrap(), Err(NetworkError::PeerUnauthenticated)));
    }

    #[tokio::test]
    async fn a_hello_that_is_not_ours_is_refused_as_malformed() {
        let (mut d, mut a) = tokio::io::duplex(4096);
        let acceptor = tokio::spawn(async move { read_hello(&mut a).await });
        send(&mut d, KIND_HELLO, b"GET / HTTP/1.1\r\n").await.unwrap();
        let (kind, body) = recv(&mut d).await.unwrap();
        assert_eq!(kind, KIND_REFUSE);
        assert!(matches!(refusal(&body), NetworkError::Refused { reason: Some(RefuseReason::BadHello), .. }));
        assert!(acceptor.await.unwrap().is_err());
    }

    #[test]
    fn the_key_is_never_printed() {
        assert_eq!(format!("{:?}", ExchangeKey::from_bytes([7; 32])), "ExchangeKey(<redacted>)");
    }
}
