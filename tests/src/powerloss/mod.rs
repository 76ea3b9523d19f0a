//! Power-loss trials: real `cairn` replicas and a `cairn-worker` whose disks are crashfs mounts
//! (`tests/crashfs`), which lose everything not fsynced when the power goes.
//!
//! A trial mounts one crashfs per replica (its data directory), one for the checkpoint storage
//! (checkpoints and savepoints, shared by the replicas and the worker as a network file system
//! would be) and one for the demo job's output. It starts three replicas with fast Raft timing
//! and frequent snapshots, a worker, the demo job checkpointing every 200-500 ms, concurrent
//! checkpoint-ID allocation clients and savepoints through the admin API. At a point the seed
//! chooses, the power goes on one replica, on a majority, or on everything (the scenario): every
//! process using a mount that loses power is killed (SIGKILL), then the mount drops what was
//! not synced. The driver opens the stores of the machines that lost power from a copy of their
//! disks, restarts everything, waits for recovery, stops everything and opens every store.
//!
//! Invariants ([`trial::Invariant`]):
//! - every acknowledged checkpoint ID stays below every allocation of its job invoked after the
//!   acknowledgement, and no ID is acknowledged twice;
//! - every acknowledged savepoint stays in the store;
//! - every completed checkpoint and savepoint the store lists has its `_metadata` with the
//!   size and CRC recorded in Raft, and every state file it references, intact;
//! - the demo job restores and its committed output is exactly once and complete;
//! - a replica's store opens after a power loss, holding at least the log it acknowledged and
//!   a vote of at least the term it acknowledged in (never empty, never refusing);
//! - the system recovers (output completes, clients allocate) within a bound.
//!
//! The binary `cairn-powerloss` runs N trials per scenario from a seed; see
//! `docs/POWER-LOSS.md`.

pub mod history;
pub mod inspect;
pub mod machines;
pub mod report;
pub mod schedule;
pub mod trial;
pub mod workload;
