//! `cairn-client`: how every Cairn client reaches the cluster. `cairnctl`, the worker's gateway
//! connection, `cairn-probe`, the demo and the tests all use it; it links no server code.
//!
//! | module | owns |
//! | --- | --- |
//! | [`follow`] | where to look for the leader next: known endpoints, hints, jittered backoff (pure) |
//! | [`leader`] | [`LeaderClient`]: unary calls that follow the leader within a deadline |
//! | [`auth`] | the admin token as `authorization: Bearer` metadata |
//!
//! Addresses are parsed and compared with `cairn_proto::addr`; TLS material is loaded with
//! `cairn_proto::tls` and given in [`ClientConfig::tls`].

pub mod auth;
pub mod follow;
pub mod leader;

pub use auth::{AuthChannel, BearerAuth};
pub use leader::{ClientConfig, ClientError, LeaderClient};
