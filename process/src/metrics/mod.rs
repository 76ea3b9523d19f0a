//! Prometheus metrics of a Cairn process: its registry and the `/metrics` endpoint.
//!
//! | module | owns |
//! | --- | --- |
//! | [`http`] | [`serve`]: a small HTTP/1.1 server answering `GET /metrics` from a [`Registry`] |
//! | [`owners`] | [`SeriesOwners`]: series shared by several owners, removed when the last one goes |

pub mod http;
pub mod owners;

pub use http::{CONTENT_TYPE, render, serve};
pub use owners::SeriesOwners;
pub use prometheus_client::registry::Registry;

/// Prefix of every metric Cairn exports (`cairn_...`).
pub const PREFIX: &str = "cairn";

/// Binds the metrics listener when `metrics_listen` is set (before anything else starts, so a
/// taken port fails the start with the address and the setting named).
pub async fn bind(addr: Option<&str>) -> Result<Option<tokio::net::TcpListener>, BindError> {
    match addr {
        None => Ok(None),
        Some(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|source| BindError { addr: addr.to_owned(), source }),
    }
}

/// The metrics listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr} (--metrics-listen / metrics_listen): {source}")]
pub struct BindError {
    pub addr: String,
    #[source]
    pub source: std::io::Error,
}

/// An empty registry whose metrics are all named `cairn_<name>`.
pub fn new_registry() -> Registry {
    Registry::with_prefix(PREFIX)
}

/// Milliseconds as the seconds Prometheus expects.
pub fn ms_to_seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}
