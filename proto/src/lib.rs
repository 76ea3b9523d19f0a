//! `cairn-proto` owns Cairn's wire contracts: the `.proto` files under `proto/cairn/` and the
//! Rust code tonic/prost generate from them, compiled once here so that every other crate (the
//! replicas, the workers, the CLI) speaks exactly the same messages.
//!
//! It also owns the conventions that are part of the contract but not expressible in protobuf:
//! the metadata keys that carry leader hints on a not-leader error ([`leader_hint`]), how every
//! connection loads and uses its TLS material ([`tls`]), how replica addresses are written
//! and compared ([`addr`]), that a message which does not decode is the caller's error
//! ([`codec`]), and how every caller proves who it is ([`auth`] for secrets, [`identity`] for
//! what a client certificate names).

pub mod addr;
pub mod auth;
pub mod codec;
pub mod identity;
pub mod leader_hint;
pub mod tls;

/// Encoded descriptors of every Cairn service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("cairn_descriptor");

/// Generated code for package `cairn.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("cairn.v1");
}

/// Generated code for package `cairn.admin.v1`, the operator API.
#[allow(clippy::all, missing_docs)]
pub mod admin {
    tonic::include_proto!("cairn.admin.v1");
}
