//! `cairn-raft` owns Cairn's consensus layer, minus the disk:
//!
//! - [`types`]: the openraft type configuration ([`TypeConfig`]).
//! - [`model`]: the replicated state machine (job registry, per-job checkpoint ID counters,
//!   completed checkpoint stores with retention, savepoints): commands, outcomes, typed errors,
//!   and the pure, deterministic `apply`.
//! - [`network`]: openraft's `RaftNetwork` over tonic gRPC, one cached channel per peer, with
//!   per-RPC deadlines and backoff for unreachable peers.
//! - [`service`]: the server side of that transport, a tonic service that admits only the
//!   cluster's replicas, each speaking for itself, and hands their RPCs to the local `Raft`.
//! - [`snapshot_inbox`]: snapshots from peers, assembled within bounds and checked before Raft
//!   installs them.
//! - [`codec`]: how Raft messages are encoded inside the gRPC payloads.
//!
//! The sled-backed stores live in `cairn-storage`; the node that wires stores, network and
//! services together lives in `cairn-coordinator`.

pub mod codec;
pub mod model;
pub mod network;
pub mod service;
pub mod snapshot_inbox;
pub mod types;

pub use types::{NodeId, Raft, TypeConfig};
