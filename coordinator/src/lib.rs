//! `cairn-coordinator` owns a Cairn coordinator replica:
//!
//! - [`config`]: the `cairn` binary's configuration (file, env, flags, defaults, validation).
//! - [`node`]: wiring of the sled stores, Raft, the gRPC server and cluster bootstrap.
//! - [`services`]: client-facing gRPC services (cluster status and membership, the replicated
//!   store API); [`error`] maps their errors to gRPC statuses in one place.
//! - [`client`]: a leader-following client for those services (used by tools, tests, benches).
//! - [`checkpoint`]: the checkpoint coordinator core (pure rules).
//! - [`leader`]: what runs on the leader: worker registry, job drivers (deploy, restart,
//!   failover, checkpoint actions); [`gateway`]: the task gateway service workers attach to.
//! - [`metrics`]: the replica's Prometheus metrics (Raft health, per-job checkpoint figures).

pub mod checkpoint;
pub mod client;
pub mod config;
pub mod error;
pub mod gateway;
pub mod leader;
pub mod metrics;
pub mod node;
pub mod services;
