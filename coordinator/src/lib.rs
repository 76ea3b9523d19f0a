//! `cairn-coordinator` owns a Cairn coordinator replica (the control plane). It depends on the
//! contract crate (`cairn-protocol`) and never on the task runtime.
//!
//! - [`config`]: the `cairn` binary's configuration (file, env, flags, defaults, validation).
//! - [`replica`]: what every part of a replica shares (context, proposing, linearizable reads);
//!   [`proposer`] packs concurrent proposals into one entry, [`read_barrier`] answers concurrent
//!   linearizable reads with one leadership confirmation.
//! - [`handoff`]: leadership transfer (the operator's call, and a leader asked to stop).
//! - [`auth`]: the admin token and the bearer-token interceptor of the operator services.
//! - [`node`]: wiring of the sled stores, Raft, the gRPC server and cluster bootstrap.
//! - [`services`]: client-facing gRPC services (cluster status and membership, the replicated
//!   store API, the operator API); [`error`] maps their errors to gRPC statuses in one place.
//! - [`checkpoint`]: the checkpoint coordinator core (pure rules).
//! - [`leader`]: what runs on the leader: worker registry, job drivers (deploy, restart,
//!   failover, checkpoint actions); [`gateway`]: the task gateway service workers attach to.
//! - [`metrics`]: the replica's Prometheus metrics (Raft health, per-job checkpoint figures).

pub mod auth;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod gateway;
pub mod handoff;
pub mod leader;
pub mod metrics;
pub mod node;
pub mod proposer;
pub mod read_barrier;
pub mod replica;
pub mod services;
