//! Data exchange between workers: the channels of a job whose producer and consumer subtasks run
//! on different workers.
//!
//! Each worker runs one [`ExchangeService`] (a TCP listener). For a job attempt, every pair of
//! workers that share channels uses one connection that multiplexes all of that attempt's
//! channels between them, in both directions: the worker with the smaller id dials, the other
//! accepts. Tasks do not know the difference: a remote channel is still a bounded
//! `mpsc::Sender<StreamElement>` on the producer's worker and a bounded
//! `mpsc::Receiver<StreamElement>` on the consumer's, and the link forwards between them.
//!
//! # Flow control
//!
//! Credit-based, per channel, as in Flink's network stack: the consumer's worker buffers at most
//! `credit` elements of a channel and announces that credit in the handshake; the producer's
//! worker sends an element only while it holds credit for that channel and gets credit back as
//! the consumer task takes elements. A slow consumer therefore stops its producers (they block
//! on their bounded channel, which is backpressure, visible as back-pressured time) instead of
//! growing memory, and never blocks the connection: the reader of a connection never waits, so
//! one parked channel (barrier alignment) cannot stall the others. Barriers, cancel markers and
//! end-of-input markers travel in order with the records of their channel.
//!
//! # Failure
//!
//! A lost connection closes every channel it carried: consumers see their input disconnect and
//! producers see their output fail, so the job fails over from its latest checkpoint, as for any
//! task failure. A peer that sends more than its credit, an unknown channel or a malformed frame
//! ends the connection the same way.
//!
//! # Authentication
//!
//! See [`handshake`]: both workers prove they hold the job attempt's [`ExchangeKey`]. Data
//! connections are not encrypted; run workers on a trusted network or a private overlay.

pub mod handshake;
mod link;
mod service;
pub mod wire;

use std::collections::BTreeSet;
use std::time::Duration;

pub use handshake::{ExchangeKey, RefuseReason};
pub use service::{ExchangeService, PeerLink, PeerSpec};
pub use wire::WireError;

/// Largest credit per channel a worker may announce.
pub const MAX_CREDIT: u32 = 1 << 16;

/// One channel of a job graph: edge `edge` (its index in the graph's edge list) from upstream
/// subtask `from` to downstream subtask `to`. Both workers derive the same ids from the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChannelId {
    pub edge: u32,
    pub from: u32,
    pub to: u32,
}

impl std::fmt::Display for ChannelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "edge {} subtask {}→{}", self.edge, self.from, self.to)
    }
}

/// Settings of a worker's data exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkOptions {
    /// Elements of one channel the consuming worker buffers (the credit it grants).
    pub credit: u32,
    /// How long the two workers of a link have to reach each other (dial retries included).
    pub connect_timeout: Duration,
    /// How long a connection may take to complete its handshake.
    pub handshake_timeout: Duration,
    /// Frames queued for one connection's writer.
    pub write_queue: usize,
    /// Handshakes in progress at once; further connections are closed at once.
    pub max_handshakes: usize,
}

impl Default for NetworkOptions {
    fn default() -> Self {
        Self {
            credit: 256,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            write_queue: 1024,
            max_handshakes: 64,
        }
    }
}

impl NetworkOptions {
    pub fn validate(&self) -> Result<(), NetworkError> {
        if self.credit == 0 || self.credit > MAX_CREDIT {
            return Err(NetworkError::Config(format!(
                "credit must be within 1..={MAX_CREDIT}, not {}",
                self.credit
            )));
        }
        if self.write_queue == 0 || self.max_handshakes == 0 {
            return Err(NetworkError::Config("write_queue and max_handshakes must be at least 1".into()));
        }
        if self.connect_timeout.is_zero() || self.handshake_timeout.is_zero() {
            return Err(NetworkError::Config(
                "connect_timeout and handshake_timeout must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// What can go wrong on a data connection.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("data connection i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    #[error("data connection protocol violation: {0}")]
    Protocol(String),
    #[error("the peer worker refused the data connection: {message}")]
    Refused { reason: Option<RefuseReason>, message: String },
    #[error("the peer worker could not prove it holds the job attempt's exchange key")]
    PeerUnauthenticated,
    #[error("no data connection with worker {peer} within {timeout:?}: {last}")]
    ConnectTimeout { peer: String, timeout: Duration, last: String },
    #[error("the data connection with worker {peer} was lost with {open} channels still open")]
    ConnectionLost { peer: String, open: usize },
    #[error("invalid exchange settings: {0}")]
    Config(String),
    #[error("invalid link: {0}")]
    InvalidLink(String),
}

/// A digest of the channels between two workers, seen from the dialer: what it sends, then what
/// it receives. Both ends compute it; a mismatch refuses the link before any data flows.
pub(crate) fn plan_digest(
    dialer_sends: &BTreeSet<ChannelId>,
    dialer_receives: &BTreeSet<ChannelId>,
) -> [u8; 8] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for set in [dialer_sends, dialer_receives] {
        ctx.update(&(set.len() as u64).to_le_bytes());
        for ch in set {
            ctx.update(&ch.edge.to_le_bytes());
            ctx.update(&ch.from.to_le_bytes());
            ctx.update(&ch.to.to_le_bytes());
        }
    }
    let mut out = [0; 8];
    out.copy_from_slice(&ctx.finish().as_ref()[..8]);
    out
}
