//! The chaos suite behind `cairn-chaos` (see `deploy/chaos/`): a nemesis injects faults into a
//! Docker compose cluster running the demo job on a seeded schedule, an observer records what
//! the cluster does, and the invariants of the design are checked over that history.
//!
//! - [`cluster`]: the compose project's replicas, worker, network and host paths.
//! - [`observer`]: the polling task that records the history and publishes progress.
//! - [`probe`]: direct, token-carrying gRPC reads of each replica by container address.
//! - [`schedule`]: the seeded fault sequence (`--seed N` replays it).
//! - [`nemesis`]: the faults as Docker operations, and the checkpoint-volume filler.
//! - [`history`]: what was observed, with times; recovery times derive from it.
//! - [`invariants`]: one pure checker per invariant, unit-tested on synthetic histories.
//! - [`runner`]: one run from discovery to verdict.
//! - [`report`]: per fault kind counts and recovery percentiles, then the verdicts.

pub mod cluster;
pub mod history;
pub mod invariants;
pub mod nemesis;
pub mod observer;
pub mod probe;
pub mod report;
pub mod runner;
pub mod schedule;
