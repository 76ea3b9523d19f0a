//! `cairn-process`: what every Cairn server process (`cairn`, `cairn-worker`, `cairn-demo`)
//! shares to be operated.
//!
//! | module | owns |
//! | --- | --- |
//! | [`metrics`] | the process's Prometheus registry, the `/metrics` HTTP endpoint, series shared by several owners |
//! | [`shutdown`] | SIGTERM / SIGINT handling |
//!
//! Nothing here is global: a process builds one registry ([`metrics::new_registry`]), registers
//! its metric families into it, hands the families (cheap handles over atomics) to whoever owns
//! the figures, and serves the registry. Tests in one process therefore stay independent.

pub mod metrics;
pub mod shutdown;
