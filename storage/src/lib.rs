//! `cairn-storage` owns the sled-backed Raft log store and state-machine store of a Cairn
//! replica: everything a node must find again on its own disk after a crash or a restart.
//!
//! - [`LogStore`] implements openraft's [`RaftLogStorage`](openraft::storage::RaftLogStorage)
//!   and [`RaftLogReader`](openraft::RaftLogReader): the Raft log, the vote, the committed log
//!   id and the last purged log id.
//! - [`StateMachineStore`] implements [`RaftStateMachine`](openraft::storage::RaftStateMachine):
//!   it applies committed [`Command`](cairn_raft::model::Command)s to the job registry
//!   ([`StateMachineData`](cairn_raft::model::StateMachineData)), persisting every touched job
//!   row together with the last applied log id in one transaction, records the leader history
//!   (each term's leader, from the blank entry it appends first), and keeps the current
//!   snapshot durable. [`SnapshotBuilder`] builds snapshots from it.
//! - [`StateReader`] is the read side the coordinator uses after linearizable reads.
//!
//! Checkpoint *data* (state handles, directory layout, `_metadata` files) is not here: it is
//! the contract between coordinator and tasks, in `cairn-protocol`.
//!
//! Both stores share one sled [`Db`](sled::Db) per node, opened by [`open`]; the trees and keys
//! it uses are documented in [`layout`]. Every persisted value is JSON (self-describing, so a
//! human can inspect a node's disk and old records stay readable as types evolve); any record
//! that fails to decode is reported as a [`StorageError`], never treated as absent.

// openraft's storage traits fix the error type to `StorageError` (about 250 bytes); the
// helpers behind the trait methods return it too, so that errors pass through unchanged.
#![allow(clippy::result_large_err, reason = "StorageError is the error type openraft's traits require")]

mod codec;
mod durable;
mod group_commit;
pub mod layout;
mod leaders;
mod log_store;
mod purger;
mod segments;
mod state_machine;
mod tail;

use std::path::{Path, PathBuf};

use cairn_raft::types::StorageError;

pub use durable::SyncError;
pub use leaders::{LEADER_HISTORY_LEN, LeaderTerm};
pub use log_store::LogStore;
pub use state_machine::{SnapshotBuilder, StateMachineStore, StateReader, check_snapshot};

/// Tuning of the sled database behind both stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageOptions {
    /// Size in bytes of sled's page cache. The state machine is kept in memory by
    /// [`StateMachineStore`] anyway and Raft mostly reads the log tail, so a modest cache
    /// suffices.
    pub cache_capacity: u64,
    /// Interval of sled's background flush, in milliseconds; `None` disables it. Writes that
    /// Raft requires to be durable (vote, appended entries, applied state, snapshots,
    /// truncation, purge) are flushed and fsynced explicitly before they are acknowledged; the
    /// background flush only bounds how stale the optionally persisted committed log id can get.
    pub flush_every_ms: Option<u64>,
    /// Use sled's `LowSpace` mode (favor disk space over write throughput). What keeps the
    /// directory bounded is purging the log behind snapshots: sled then reuses its 512 KiB
    /// segments once everything in them has been rewritten or freed (see the
    /// `bounded_growth` test). In that workload `LowSpace` and `HighThroughput` measured the
    /// same, and Cairn's write rate is tiny, so the space-favoring mode is the default.
    pub low_space: bool,
}

impl Default for StorageOptions {
    fn default() -> Self {
        Self { cache_capacity: 16 * 1024 * 1024, flush_every_ms: Some(500), low_space: true }
    }
}

/// Why [`open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory could not be created.
    #[error("cannot create storage directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// sled refused to open the database (locked by another process, unreadable files, or a
    /// corrupt database).
    #[error("cannot open the sled database in {}: {source}", path.display())]
    Db {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    /// The database was written by an incompatible version of this crate.
    #[error("storage in {} has on-disk format {found}; this build reads format {expected}", path.display())]
    UnsupportedFormat { path: PathBuf, found: u64, expected: u64 },
    /// The directory holds the marker of an initialized store, but sled opened it empty: its
    /// files were damaged (sled recovers unreadable data as if it had never been written) or
    /// removed. Starting anyway would forget votes and applied state.
    #[error(
        "storage in {} was initialized but sled found no data in it; its files are damaged or \
         were removed (restore the node from a backup, or wipe the directory and rejoin it as a new node)",
        path.display()
    )]
    DataLost { path: PathBuf },
    /// The database files or directory could not be fsynced (sled's own flush is not durable
    /// without it).
    #[error(transparent)]
    Sync { source: durable::SyncError },
    /// The initialization marker could not be checked or written.
    #[error("cannot access the storage marker {}: {source}", path.display())]
    Marker {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The records decode but contradict each other, which only happens when sled lost recent
    /// writes (it recovers a damaged log by dropping everything after the damage).
    #[error("storage in {} is inconsistent: {reason}", path.display())]
    Inconsistent { path: PathBuf, reason: String },
    /// A record in the database is corrupt or unreadable.
    #[error("storage in {} is corrupt or unreadable: {source}", path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: Box<StorageError>,
    },
}

/// Opens (creating if needed) the node's storage in `dir` with default [`StorageOptions`].
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), OpenError> {
    open_with(dir, &StorageOptions::default())
}

/// How long opening waits for the database's lock. Dropping the last handle does not always
/// release it at once (one of sled's pool threads may still be finishing a write), so a replica
/// stopped and started again in the same process would otherwise fail now and then; another
/// process holding the directory still fails after this bound, naming the lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens sled, waiting (bounded by [`LOCK_WAIT`]) while another handle still holds its lock.
fn open_db(dir: &Path, options: &StorageOptions) -> sled::Result<sled::Db> {
    let mode = if options.low_space { sled::Mode::LowSpace } else { sled::Mode::HighThroughput };
    let config = sled::Config::new()
        .path(dir)
        .cache_capacity(options.cache_capacity)
        .flush_every_ms(options.flush_every_ms)
        .mode(mode);
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(sled::Error::Io(e)) if is_lock_held(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

/// Whether sled could not take the database's file lock (sled 0.34 reports it as an `Other`
/// I/O error wrapping the lock call's `WouldBlock`).
fn is_lock_held(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
        || (e.kind() == std::io::ErrorKind::Other && e.to_string().contains("could not acquire lock"))
}

/// Opens (creating if needed) the node's storage in `dir`.
///
/// Blocking (it reads the whole state machine): call it before starting the Raft node, or
/// from `spawn_blocking`.
///
/// Loads the whole state machine into memory and validates the vote, committed and purged log
/// ids, the last log entry and the current snapshot's metadata, so that a corrupt record stops
/// the node here rather than being mistaken for an empty one later.
pub fn open_with(dir: &Path, options: &StorageOptions) -> Result<(LogStore, StateMachineStore), OpenError> {
    durable::create_dir_all_durably(dir)
        .map_err(|e| OpenError::CreateDir { path: dir.to_owned(), source: e.source })?;
    let db = open_db(dir, options).map_err(|source| OpenError::Db { path: dir.to_owned(), source })?;
    let durable_files = durable::DurableFiles::open(dir).map_err(|source| OpenError::Sync { source })?;
    let trees = layout::Trees::open(db, durable_files)
        .map_err(|source| OpenError::Db { path: dir.to_owned(), source })?;

    let storage_err = |source| OpenError::Storage { path: dir.to_owned(), source: Box::new(source) };
    let marker = dir.join(layout::MARKER_FILE);
    let marker_err = |source| OpenError::Marker { path: marker.clone(), source };
    let has_marker = marker.try_exists().map_err(marker_err)?;
    match layout::read_format(&trees.raft_meta).map_err(storage_err)? {
        Some(layout::FORMAT_VERSION) => {}
        Some(found @ layout::OLDEST_FORMAT_VERSION..layout::FORMAT_VERSION) => {
            // Format 1 holds no apply journal and rows that match its applied state, which is
            // what format 2 reads when there is no journal. The new version is written before
            // any journal, so (sled recovering a prefix of its writes) a database with a journal
            // always says format 2 or later.
            //
            // Formats 1 and 2 keep the log in one tree. Its entries are copied into segment
            // trees and made durable before the new format is recorded; the old tree is dropped
            // only after that (below), so a crash at any point leaves a log that the next open
            // finds whole.
            let segments = segments::Segments::open(&trees.db).map_err(storage_err)?;
            let copied = segments::copy_legacy_log(&trees.db, &segments).map_err(storage_err)?;
            flush_now(dir, &trees)?;
            layout::write_format(&trees.raft_meta).map_err(storage_err)?;
            flush_now(dir, &trees)?;
            tracing::info!(
                path = %dir.display(),
                from = found,
                to = layout::FORMAT_VERSION,
                log_entries_moved = copied,
                "upgraded raft storage format"
            );
        }
        Some(found) => {
            return Err(OpenError::UnsupportedFormat {
                path: dir.to_owned(),
                found,
                expected: layout::FORMAT_VERSION,
            });
        }
        None if has_marker => {
            tracing::error!(path = %dir.display(), "initialized raft storage opened empty: data lost");
            return Err(OpenError::DataLost { path: dir.to_owned() });
        }
        None => {
            layout::write_format(&trees.raft_meta).map_err(storage_err)?;
            // Durable before the marker: a marker next to a database that lost its format record
            // reads as data loss.
            flush_now(dir, &trees)?;
            tracing::info!(path = %dir.display(), "initialized new raft storage");
        }
    }
    if !has_marker {
        write_marker(&marker).map_err(marker_err)?;
    }
    if segments::drop_legacy_log(&trees.db).map_err(storage_err)? {
        tracing::info!(path = %dir.display(), "dropped the log tree of the old format");
    }

    let log_store = LogStore::open(&trees).map_err(storage_err)?;
    let sm_store = StateMachineStore::open(&trees).map_err(storage_err)?;
    check_invariants(dir, &log_store, &sm_store)?;
    tracing::info!(
        path = %dir.display(),
        last_applied = ?sm_store.reader().last_applied(),
        jobs = sm_store.reader().job_count(),
        "opened raft storage"
    );
    Ok((log_store, sm_store))
}

/// Flushes sled and fsyncs what its flush leaves out, during [`open_with`].
fn flush_now(dir: &Path, trees: &layout::Trees) -> Result<(), OpenError> {
    trees.db.flush().map_err(|source| OpenError::Db { path: dir.to_owned(), source })?;
    trees.durable.sync(trees.durable.ticket()).map_err(|source| OpenError::Sync { source })
}

/// Writes the initialization marker durably (file content and directory entry).
fn write_marker(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    writeln!(file, "cairn-storage format {}", layout::FORMAT_VERSION)?;
    file.sync_all()?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Checks the invariants between the stores that hold on disk at every point in time:
/// `last_purged <= current snapshot <= last_applied` (entries are purged only behind a
/// snapshot, and a snapshot is built from, or installed together with, the applied state).
fn check_invariants(dir: &Path, log_store: &LogStore, sm_store: &StateMachineStore) -> Result<(), OpenError> {
    let storage_err = |source| OpenError::Storage { path: dir.to_owned(), source: Box::new(source) };
    let inconsistent = |reason| OpenError::Inconsistent { path: dir.to_owned(), reason };
    let last_applied = sm_store.reader().last_applied();
    let last_purged = log_store.last_purged().map_err(storage_err)?;
    let snapshot = sm_store.current_snapshot_meta().map_err(storage_err)?.and_then(|m| m.last_log_id);
    if last_purged > last_applied {
        return Err(inconsistent(format!(
            "the log is purged up to {last_purged:?} but the state machine has only applied up to {last_applied:?}"
        )));
    }
    if snapshot > last_applied {
        return Err(inconsistent(format!(
            "the current snapshot covers up to {snapshot:?} but the state machine has only applied up to {last_applied:?}"
        )));
    }
    Ok(())
}
