//! The state-machine store: the applied job registry, its position in the log, and the current
//! snapshot.
//!
//! [`StateMachineStore`] owns the [`SM_JOBS_TREE`](crate::layout::SM_JOBS_TREE),
//! [`SM_META_TREE`](crate::layout::SM_META_TREE) and
//! [`SNAPSHOT_TREE`](crate::layout::SNAPSHOT_TREE) trees, and keeps the whole
//! [`StateMachineData`] in memory (loaded at open) so that reads never touch the disk.
//!
//! The state is persisted as it is applied, not only through snapshots. `apply` first writes
//! the apply journal ([`APPLY_JOURNAL_KEY`]): one record holding the new applied state (last
//! applied log id, last membership), every job row the batch touched (or its removal) and the
//! leader history if it changed. Then it writes those rows (and the history) under their own
//! keys, publishes the new state in memory and returns the responses. Commands are applied to a
//! working copy of the touched jobs, so a failed write leaves the in-memory state untouched.
//!
//! These are single-key writes, not a sled transaction: a transaction makes sled seal and write
//! its I/O buffer twice, each time waking every thread of sled's I/O pool, which cost more than
//! the rest of an apply. A single-key write is atomic, and sled recovers a prefix of its writes
//! after a crash, so opening the store reads the rows, then lays the journal over them: a
//! journal that survived implies that every write before it survived (the previous applies'
//! rows), and it holds exactly the rows of its own apply that may have been lost. Installing a
//! snapshot removes the journal in the same transaction that replaces the rows.
//!
//! `apply` does **not** flush: the Raft log is the truth. Every applied entry is committed,
//! hence durable in the log of a majority, before it is applied; the writes become durable
//! with the next log flush (the database is flushed as a whole) or snapshot. A node that loses
//! power may come back with an older applied id and rows that match it; openraft then
//! re-applies the entries after it. Entries are purged only behind a snapshot, and building or
//! installing a snapshot flushes, so the entries to re-apply are always still in the log.
//!
//! The in-memory state sits behind an `Arc<std::sync::RwLock<..>>` shared with the
//! [`SnapshotBuilder`] and with [`StateReader`]s; the lock is only ever held for synchronous
//! work, never across an `.await`.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cairn_raft::TypeConfig;
use cairn_raft::model::{CommandResponse, JobId, JobRecord, StateMachineData};
use cairn_raft::types::{Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership};
use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde_json::value::RawValue;
use sled::IVec;
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use crate::codec::{
    self, AppliedState, ApplyJournal, ApplyJournalRef, SNAPSHOT_VERSION, SnapshotPayload, SnapshotPayloadRef,
};
use crate::layout::{
    APPLIED_KEY, APPLY_JOURNAL_KEY, FlushError, LEADERS_KEY, SNAPSHOT_DATA_KEY, SNAPSHOT_META_KEY,
    SNAPSHOT_SEQ_KEY, Trees,
};
use crate::leaders::{LeaderHistory, LeaderTerm};

/// What the state machine holds in memory; mirrors the state-machine trees.
#[derive(Debug, Default)]
struct SmState {
    data: StateMachineData,
    applied: AppliedState,
    leaders: LeaderHistory,
}

type Shared = Arc<RwLock<SmState>>;

/// Lock helpers. A poisoned lock is recovered rather than propagated: every critical section
/// below is a plain assignment or a read that cannot leave the state half-updated.
fn read(state: &Shared) -> RwLockReadGuard<'_, SmState> {
    state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(state: &Shared) -> RwLockWriteGuard<'_, SmState> {
    state.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The sled-backed Raft state machine. Openraft owns it; the coordinator reads the applied
/// state through [`StateMachineStore::reader`].
pub struct StateMachineStore {
    trees: Trees,
    state: Shared,
}

impl std::fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = read(&self.state);
        f.debug_struct("StateMachineStore")
            .field("last_applied", &state.applied.last_applied)
            .field("jobs", &state.data.jobs.len())
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// Loads every job row and the applied state, lays the apply journal over them (see the
    /// module documentation), and checks the current snapshot's metadata.
    pub(crate) fn open(trees: &Trees) -> Result<Self, StorageError> {
        let mut data = StateMachineData::default();
        for item in trees.jobs.iter() {
            let (key, value) = item.map_err(|e| StorageIOError::read_state_machine(&e))?;
            let job = decode_job(&key, &value)?;
            data.jobs.insert(job.id.clone(), Arc::new(job));
        }
        let mut applied: AppliedState = read_meta_record(&trees.sm_meta, APPLIED_KEY, "applied state")?;
        let mut leaders: LeaderHistory = read_meta_record(&trees.sm_meta, LEADERS_KEY, "leader history")?;
        let journal: Option<ApplyJournal> =
            read_meta_record(&trees.sm_meta, APPLY_JOURNAL_KEY, "apply journal")?;
        if let Some(journal) = journal {
            for (id, row) in journal.rows {
                match row {
                    Some(raw) => {
                        let job = decode_job(id.as_str().as_bytes(), raw.get().as_bytes())?;
                        data.jobs.insert(id, Arc::new(job));
                    }
                    None => {
                        data.jobs.remove(&id);
                    }
                }
            }
            applied = journal.applied;
            if let Some(history) = journal.leaders {
                leaders = history;
            }
        }
        leaders.check().map_err(|e| StorageIOError::read_state_machine(AnyError::error(e)))?;
        read_snapshot_meta(&trees.snapshot)?;
        let state = Arc::new(RwLock::new(SmState { data, applied, leaders }));
        Ok(Self { trees: trees.clone(), state })
    }

    /// Metadata of the current snapshot, if any.
    pub fn current_snapshot_meta(&self) -> Result<Option<SnapshotMeta>, StorageError> {
        read_snapshot_meta(&self.trees.snapshot)
    }

    /// A cheap, clonable handle for reading the applied state.
    pub fn reader(&self) -> StateReader {
        StateReader { state: self.state.clone() }
    }

    fn snapshot_builder(&self) -> SnapshotBuilder {
        SnapshotBuilder { trees: self.trees.clone(), state: self.state.clone() }
    }

    /// Flushes and fsyncs (see [`Trees::flush_durably`]).
    async fn flush(&self, err: impl FnOnce(&FlushError) -> StorageIOError<u64>) -> Result<(), StorageError> {
        self.trees.flush_durably().await.map_err(|e| err(&e))?;
        Ok(())
    }

    async fn apply_entries(&mut self, entries: Vec<Entry>) -> Result<Vec<CommandResponse>, StorageError> {
        let Some(last_log_id) = entries.last().map(|e| e.log_id) else {
            return Ok(Vec::new());
        };

        // The jobs this batch touches, in their pre-batch state.
        let touched: BTreeSet<JobId> = entries
            .iter()
            .flat_map(|e| match &e.payload {
                EntryPayload::Normal(cmd) => cmd.jobs().into_iter().cloned().collect(),
                _ => Vec::new(),
            })
            .collect();
        let (mut work, mut applied) = {
            let state = read(&self.state);
            let jobs: BTreeMap<JobId, Arc<JobRecord>> = touched
                .iter()
                .filter_map(|id| state.data.jobs.get(id).map(|j| (id.clone(), j.clone())))
                .collect();
            (StateMachineData { jobs }, state.applied.clone())
        };
        // Copied only in the rare batch holding a blank entry; written back only if it changed.
        let mut leaders: Option<LeaderHistory> = None;
        let mut new_leader = false;

        // `StateMachineData::apply` only reads and writes `cmd.jobs()`, so applying to a copy
        // holding just the touched jobs computes exactly what applying to the whole state would.
        let mut responses = Vec::with_capacity(entries.len());
        for entry in &entries {
            applied.last_applied = Some(entry.log_id);
            let response = match &entry.payload {
                EntryPayload::Blank => {
                    // Each new leader appends a blank entry first: the start of its term.
                    let history = leaders.get_or_insert_with(|| read(&self.state).leaders.clone());
                    new_leader |= history.record(&entry.log_id);
                    CommandResponse::done()
                }
                EntryPayload::Membership(membership) => {
                    applied.last_membership = StoredMembership::new(Some(entry.log_id), membership.clone());
                    CommandResponse::done()
                }
                EntryPayload::Normal(cmd) => {
                    let result = work.apply(cmd);
                    if let Err(e) = &result {
                        tracing::debug!(log_id = %entry.log_id, command = %cmd, error = %e, "command rejected");
                    }
                    CommandResponse(result)
                }
            };
            responses.push(response);
        }

        // The journal, then the rows and the history it covers (see the module documentation).
        let apply_err = |e: &(dyn std::error::Error + 'static)| {
            StorageIOError::apply(last_log_id, AnyError::from_dyn(e, None))
        };
        let mut rows: Vec<(JobId, Option<Box<RawValue>>)> = Vec::with_capacity(touched.len());
        for id in &touched {
            let value = match work.jobs.get(id) {
                Some(job) => Some(codec::encode_raw(job).map_err(|e| apply_err(&e))?),
                None => None,
            };
            rows.push((id.clone(), value));
        }
        let leaders = leaders.filter(|_| new_leader);
        let journal =
            codec::encode(&ApplyJournalRef { applied: &applied, rows: &rows, leaders: leaders.as_ref() })
                .map_err(|e| apply_err(&e))?;
        self.trees.sm_meta.insert(APPLY_JOURNAL_KEY, journal).map_err(|e| apply_err(&e))?;
        for (id, value) in &rows {
            let key = id.as_str().as_bytes();
            match value {
                Some(raw) => self.trees.jobs.insert(key, raw.get().as_bytes()).map(drop),
                None => self.trees.jobs.remove(key).map(drop),
            }
            .map_err(|e| apply_err(&e))?;
        }
        if let Some(history) = &leaders {
            let bytes = codec::encode(history).map_err(|e| apply_err(&e))?;
            self.trees.sm_meta.insert(LEADERS_KEY, bytes).map_err(|e| apply_err(&e))?;
        }
        // Not flushed: the entries are durable in the log already, and a node that loses these
        // rows in a crash re-applies the entries from its durable applied id (see the module
        // documentation). The next log flush, or any snapshot, makes them durable.
        {
            let mut state = write(&self.state);
            for id in touched {
                match work.jobs.remove(&id) {
                    Some(job) => state.data.jobs.insert(id, job),
                    None => state.data.jobs.remove(&id),
                };
            }
            state.applied = applied;
            if let Some(history) = leaders {
                state.leaders = history;
            }
        }
        tracing::trace!(entries = entries.len(), last = %last_log_id, "applied raft log entries");
        Ok(responses)
    }

    async fn install(&mut self, meta: &SnapshotMeta, bytes: Vec<u8>) -> Result<(), StorageError> {
        let sig = || Some(meta.signature());
        let payload: SnapshotPayload = codec::decode(&bytes).map_err(|e| {
            tracing::error!(snapshot_id = %meta.snapshot_id, error = %e, "received an undecodable snapshot");
            StorageIOError::read_snapshot(sig(), &e)
        })?;
        check_payload(meta, &payload).map_err(|e| StorageIOError::read_snapshot(sig(), e))?;
        let write_err = |e: &(dyn std::error::Error + 'static)| {
            StorageIOError::write_snapshot(sig(), AnyError::from_dyn(e, None))
        };

        let mut new_rows: Vec<(IVec, IVec)> = Vec::with_capacity(payload.data.jobs.len());
        for (id, job) in &payload.data.jobs {
            if &job.id != id {
                return Err(StorageIOError::read_snapshot(
                    sig(),
                    AnyError::error(format!("job `{}` is stored under id `{id}`", job.id)),
                )
                .into());
            }
            let value = codec::encode(job).map_err(|e| write_err(&e))?;
            new_rows.push((IVec::from(id.as_str().as_bytes()), IVec::from(value)));
        }
        let mut stale: Vec<IVec> = Vec::new();
        for key in self.trees.jobs.iter().keys() {
            let key = key.map_err(|e| StorageIOError::read_state_machine(&e))?;
            let keep = std::str::from_utf8(&key)
                .ok()
                .and_then(|s| JobId::new(s).ok())
                .is_some_and(|id| payload.data.jobs.contains_key(&id));
            if !keep {
                stale.push(key);
            }
        }
        let applied =
            AppliedState { last_applied: meta.last_log_id, last_membership: meta.last_membership.clone() };
        let applied_bytes = IVec::from(codec::encode(&applied).map_err(|e| write_err(&e))?);
        let leaders_bytes = IVec::from(codec::encode(&payload.leaders).map_err(|e| write_err(&e))?);
        let meta_bytes = IVec::from(codec::encode(meta).map_err(|e| write_err(&e))?);
        let data_bytes = IVec::from(bytes);

        (&self.trees.jobs, &self.trees.sm_meta, &self.trees.snapshot)
            .transaction(|(jobs, sm_meta, snapshot)| {
                for key in &stale {
                    jobs.remove(key)?;
                }
                for (key, value) in &new_rows {
                    jobs.insert(key, value.clone())?;
                }
                sm_meta.insert(APPLIED_KEY, applied_bytes.clone())?;
                sm_meta.insert(LEADERS_KEY, leaders_bytes.clone())?;
                // The journal describes an apply before this snapshot: it must not be laid
                // over the snapshot's rows at the next open.
                sm_meta.remove(APPLY_JOURNAL_KEY)?;
                snapshot.insert(SNAPSHOT_META_KEY, meta_bytes.clone())?;
                snapshot.insert(SNAPSHOT_DATA_KEY, data_bytes.clone())?;
                Ok::<_, ConflictableTransactionError<Infallible>>(())
            })
            .map_err(|e: TransactionError<Infallible>| write_err(&e))?;
        self.flush(|e| StorageIOError::write_snapshot(sig(), e)).await?;

        {
            let mut state = write(&self.state);
            state.data = payload.data;
            state.applied = applied;
            state.leaders = payload.leaders;
        }
        tracing::info!(
            snapshot_id = %meta.snapshot_id,
            last_log_id = ?meta.last_log_id,
            jobs = new_rows.len(),
            "installed snapshot"
        );
        Ok(())
    }
}

/// The snapshot's content must describe the position its metadata claims.
fn check_payload(meta: &SnapshotMeta, payload: &SnapshotPayload) -> Result<(), AnyError> {
    if payload.version != SNAPSHOT_VERSION {
        return Err(AnyError::error(format!(
            "snapshot payload version {} is not supported (expected {SNAPSHOT_VERSION})",
            payload.version
        )));
    }
    if payload.last_applied != meta.last_log_id || payload.last_membership != meta.last_membership {
        return Err(AnyError::error(format!(
            "snapshot content is at {:?} / membership {}, but its metadata says {:?} / {}",
            payload.last_applied, payload.last_membership, meta.last_log_id, meta.last_membership
        )));
    }
    payload.leaders.check().map_err(AnyError::error)?;
    Ok(())
}

fn decode_job(key: &[u8], value: &[u8]) -> Result<JobRecord, StorageError> {
    let job: JobRecord = codec::decode(value).map_err(|e| {
        tracing::error!(key = %String::from_utf8_lossy(key), error = %e, "corrupt job row");
        StorageIOError::read_state_machine(
            AnyError::new(&e).add_context(|| format!("job row {:?}", String::from_utf8_lossy(key))),
        )
    })?;
    if job.id.as_str().as_bytes() != key {
        tracing::error!(key = %String::from_utf8_lossy(key), job = %job.id, "job row stored under the wrong key");
        return Err(StorageIOError::read_state_machine(AnyError::error(format!(
            "job `{}` is stored under key {:?}",
            job.id,
            String::from_utf8_lossy(key)
        )))
        .into());
    }
    Ok(job)
}

/// A record of the state-machine metadata tree, or its default while absent; one that does not
/// decode is an error naming `what`, never treated as absent.
fn read_meta_record<T: serde::de::DeserializeOwned + Default>(
    tree: &sled::Tree,
    key: &str,
    what: &'static str,
) -> Result<T, StorageError> {
    let Some(raw) = tree.get(key).map_err(|e| StorageIOError::read_state_machine(&e))? else {
        return Ok(T::default());
    };
    codec::decode(&raw).map_err(|e| {
        tracing::error!(error = %e, record = what, "corrupt state-machine record");
        StorageIOError::read_state_machine(AnyError::new(&e).add_context(|| what)).into()
    })
}

fn read_snapshot_meta(tree: &sled::Tree) -> Result<Option<SnapshotMeta>, StorageError> {
    let Some(raw) = tree.get(SNAPSHOT_META_KEY).map_err(|e| StorageIOError::read_snapshot(None, &e))? else {
        return Ok(None);
    };
    let meta = codec::decode(&raw).map_err(|e| {
        tracing::error!(error = %e, "corrupt snapshot metadata");
        StorageIOError::read_snapshot(None, &e)
    })?;
    Ok(Some(meta))
}

/// Reads the current snapshot, validating that both its metadata and content decode and agree.
fn read_current_snapshot(tree: &sled::Tree) -> Result<Option<Snapshot>, StorageError> {
    let (meta, data) = tree
        .transaction(|t| {
            Ok::<_, ConflictableTransactionError<Infallible>>((
                t.get(SNAPSHOT_META_KEY)?,
                t.get(SNAPSHOT_DATA_KEY)?,
            ))
        })
        .map_err(|e: TransactionError<Infallible>| StorageIOError::read_snapshot(None, &e))?;
    let (meta, data) = match (meta, data) {
        (None, None) => return Ok(None),
        (Some(meta), Some(data)) => (meta, data),
        (meta, _) => {
            let missing = if meta.is_some() { "content" } else { "metadata" };
            tracing::error!(missing, "incomplete current snapshot");
            return Err(StorageIOError::read_snapshot(
                None,
                AnyError::error(format!("the current snapshot has no {missing}")),
            )
            .into());
        }
    };
    let meta: SnapshotMeta = codec::decode(&meta).map_err(|e| {
        tracing::error!(error = %e, "corrupt snapshot metadata");
        StorageIOError::read_snapshot(None, &e)
    })?;
    let payload: SnapshotPayload = codec::decode(&data).map_err(|e| {
        tracing::error!(snapshot_id = %meta.snapshot_id, error = %e, "corrupt snapshot content");
        StorageIOError::read_snapshot(Some(meta.signature()), &e)
    })?;
    check_payload(&meta, &payload).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), e))?;
    Ok(Some(Snapshot { meta, snapshot: Box::new(Cursor::new(data.to_vec())) }))
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let state = read(&self.state);
        Ok((state.applied.last_applied, state.applied.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_entries(entries.into_iter().collect()).await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_builder()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        self.install(meta, snapshot.into_inner()).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        read_current_snapshot(&self.trees.snapshot)
    }
}

/// Builds a snapshot of the state machine and stores it as the node's current snapshot.
///
/// Runs concurrently with `apply`: it captures a consistent view under the read lock (a
/// reference per job: records are shared and copied on write) and encodes it after releasing
/// the lock, on a blocking thread. A snapshot is stored only if it is not older than the
/// current one (a snapshot installed from the leader meanwhile wins).
pub struct SnapshotBuilder {
    trees: Trees,
    state: Shared,
}

impl std::fmt::Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotBuilder").finish_non_exhaustive()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        // Captured under the read lock (the records are shared, so this copies a reference per
        // job), encoded after it on a blocking thread: encoding a thousand jobs took 12–47 ms,
        // which under the lock stalled every apply (and the leader's completions with it) and
        // on the async runtime took one of its workers for as long.
        let (data, applied, leaders) = {
            let state = read(&self.state);
            (state.data.clone(), state.applied.clone(), state.leaders.clone())
        };
        let captured = started.elapsed();
        let encoding = applied.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            codec::encode(&SnapshotPayloadRef {
                version: SNAPSHOT_VERSION,
                last_applied: &encoding.last_applied,
                last_membership: &encoding.last_membership,
                data: &data,
                leaders: &leaders,
            })
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let encoded = started.elapsed();
        let data = IVec::from(bytes.as_slice());

        let (meta, stored) = self
            .trees
            .snapshot
            .transaction(|t| {
                let abort = |e: AnyError| ConflictableTransactionError::Abort(e);
                let seq: u64 = match t.get(SNAPSHOT_SEQ_KEY)? {
                    Some(raw) => codec::decode(&raw)
                        .map_err(|e| abort(AnyError::new(&e).add_context(|| "snapshot sequence number")))?,
                    None => 0,
                };
                let next = seq.saturating_add(1);
                let snapshot_id = match &applied.last_applied {
                    Some(id) => format!("{}-{}-{next}", id.leader_id.term, id.index),
                    None => format!("0-0-{next}"),
                };
                let meta = SnapshotMeta {
                    last_log_id: applied.last_applied,
                    last_membership: applied.last_membership.clone(),
                    snapshot_id,
                };
                t.insert(SNAPSHOT_SEQ_KEY, codec::encode(&next).map_err(|e| abort(AnyError::new(&e)))?)?;
                let newer_exists = match t.get(SNAPSHOT_META_KEY)? {
                    Some(raw) => {
                        let current: SnapshotMeta = codec::decode(&raw).map_err(|e| {
                            abort(AnyError::new(&e).add_context(|| "current snapshot metadata"))
                        })?;
                        current.last_log_id > meta.last_log_id
                    }
                    None => false,
                };
                if newer_exists {
                    return Ok((meta, false));
                }
                t.insert(SNAPSHOT_META_KEY, codec::encode(&meta).map_err(|e| abort(AnyError::new(&e)))?)?;
                t.insert(SNAPSHOT_DATA_KEY, data.clone())?;
                Ok((meta, true))
            })
            .map_err(|e| match e {
                TransactionError::Abort(e) => StorageIOError::read_snapshot(None, e),
                TransactionError::Storage(e) => StorageIOError::write_snapshot(None, &e),
            })?;
        let written = started.elapsed();
        let sig = Some(meta.signature());
        self.trees.flush_durably().await.map_err(|e| StorageIOError::write_snapshot(sig, &e))?;
        if stored {
            tracing::info!(
                snapshot_id = %meta.snapshot_id,
                bytes = bytes.len(),
                capture_us = captured.as_micros() as u64,
                encode_ms = encoded.saturating_sub(captured).as_millis() as u64,
                write_ms = written.saturating_sub(encoded).as_millis() as u64,
                total_ms = started.elapsed().as_millis() as u64,
                "built snapshot"
            );
        } else {
            tracing::info!(
                snapshot_id = %meta.snapshot_id,
                "built snapshot is older than the current one; keeping the current one"
            );
        }
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) })
    }
}

/// Read access to the applied state, for the coordinator (after a linearizable read) and for
/// metrics. Cheap to clone; every call takes the read lock briefly and returns owned data (job
/// records shared: a later apply changes its own copy, never a record handed out).
#[derive(Clone)]
pub struct StateReader {
    state: Shared,
}

impl std::fmt::Debug for StateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateReader").field("last_applied", &self.last_applied()).finish_non_exhaustive()
    }
}

impl StateReader {
    /// The record of one job, if it exists (shared: no copy of the record is made).
    pub fn job(&self, id: &JobId) -> Option<Arc<JobRecord>> {
        read(&self.state).data.jobs.get(id).cloned()
    }

    /// Every job, ordered by id (shared: no copy of the records is made).
    pub fn jobs(&self) -> Vec<Arc<JobRecord>> {
        read(&self.state).data.jobs.values().cloned().collect()
    }

    /// The jobs a leader drives: not in a terminal status, and with a graph to deploy. Copies
    /// only their ids (a leader asks on every tick; copying records would cost every job's spec).
    pub fn drivable_jobs(&self) -> Vec<JobId> {
        read(&self.state)
            .data
            .jobs
            .values()
            .filter(|r| !r.status.is_terminal() && !r.spec.graph.is_null())
            .map(|r| r.id.clone())
            .collect()
    }

    /// Number of jobs in the registry.
    pub fn job_count(&self) -> usize {
        read(&self.state).data.jobs.len()
    }

    /// The last log id applied to the state.
    pub fn last_applied(&self) -> Option<LogId> {
        read(&self.state).applied.last_applied
    }

    /// The membership as of the last applied membership entry.
    pub fn last_membership(&self) -> StoredMembership {
        read(&self.state).applied.last_membership.clone()
    }

    /// The terms that had a leader, newest first (at most [`crate::LEADER_HISTORY_LEN`]).
    pub fn leader_history(&self) -> Vec<LeaderTerm> {
        read(&self.state).leaders.newest_first()
    }

    /// A copy of the whole state.
    pub fn data(&self) -> StateMachineData {
        read(&self.state).data.clone()
    }
}

/// Whether `bytes` is a snapshot this store would install for `meta`: it decodes, its version is
/// supported, it is where its metadata says, and every job row is stored under its own id. The
/// Raft service checks a snapshot received from a peer with this before handing its last chunk
/// to Raft, so a corrupt snapshot is refused without a storage error (which stops Raft).
pub fn check_snapshot(meta: &SnapshotMeta, bytes: &[u8]) -> Result<(), String> {
    let payload: SnapshotPayload =
        codec::decode(bytes).map_err(|e| format!("the snapshot does not decode: {e}"))?;
    check_payload(meta, &payload).map_err(|e| e.to_string())?;
    if let Some((id, job)) = payload.data.jobs.iter().find(|(id, job)| job.id != **id) {
        return Err(format!("the snapshot holds job {} under the id {id}", job.id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use cairn_raft::model::{Command, JobSpec};
    use openraft::CommittedLeaderId;

    use super::*;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn register(index: u64, job: &str) -> Entry {
        let job = JobId::new(job).unwrap_or_else(|e| panic!("{e}"));
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Command::RegisterJob {
                job,
                name: String::new(),
                spec: JobSpec::default(),
            }),
        }
    }

    #[test]
    fn reader_can_be_shared_across_tasks() {
        fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}
        assert_send_sync_clone::<StateReader>();
    }

    /// A builder racing with the install of a newer snapshot must not replace it.
    #[tokio::test]
    async fn built_snapshot_older_than_current_is_not_stored() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(dir.path()).unwrap();
        sm.apply(vec![register(1, "a"), register(2, "b")]).await.unwrap();
        let newer = SnapshotMeta {
            last_log_id: Some(log_id(10)),
            last_membership: StoredMembership::default(),
            snapshot_id: "1-10-7".to_owned(),
        };
        sm.trees.snapshot.insert(SNAPSHOT_META_KEY, codec::encode(&newer).unwrap()).unwrap();

        let built = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(built.meta.last_log_id, Some(log_id(2)));
        assert_eq!(read_snapshot_meta(&sm.trees.snapshot).unwrap(), Some(newer));
    }

    /// A snapshot from a peer is checked before it is installed: what this store builds passes,
    /// garbage and a snapshot that does not match its metadata are refused with the reason.
    #[tokio::test]
    async fn snapshots_from_peers_are_checked_before_install() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(dir.path()).unwrap();
        sm.apply(vec![register(1, "a"), register(2, "b")]).await.unwrap();
        let built = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let bytes = built.snapshot.into_inner();
        check_snapshot(&built.meta, &bytes).unwrap();
        assert!(check_snapshot(&built.meta, b"garbage").unwrap_err().contains("does not decode"));
        let elsewhere = SnapshotMeta { last_log_id: Some(log_id(9)), ..built.meta.clone() };
        assert!(check_snapshot(&elsewhere, &bytes).is_err());
    }

    /// Corruption appearing while the store is open is reported by reads, not only at open.
    #[tokio::test]
    async fn corrupt_snapshot_meta_while_running_is_a_read_error() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(dir.path()).unwrap();
        sm.apply(vec![register(1, "a")]).await.unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        sm.trees.snapshot.insert(SNAPSHOT_META_KEY, b"{".to_vec()).unwrap();
        assert!(sm.get_current_snapshot().await.is_err());
        assert!(sm.current_snapshot_meta().is_err());
        // Building a new snapshot must not paper over the unreadable current one.
        assert!(sm.get_snapshot_builder().await.build_snapshot().await.is_err());
    }

    /// The jobs a leader drives: those with a graph, until they end.
    #[tokio::test]
    async fn drivable_jobs_are_the_live_ones_with_a_graph() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(dir.path()).unwrap();
        let with_graph = |index: u64, job: &str| {
            let mut entry = register(index, job);
            if let EntryPayload::Normal(Command::RegisterJob { spec, .. }) = &mut entry.payload {
                spec.graph = serde_json::json!({ "vertices": [] });
            }
            entry
        };
        let ended = Entry {
            log_id: log_id(4),
            payload: EntryPayload::Normal(Command::SetJobStatus {
                job: JobId::new("c").unwrap(),
                status: cairn_raft::model::JobStatus::Canceled,
            }),
        };
        sm.apply(vec![register(1, "a"), with_graph(2, "b"), with_graph(3, "c"), ended]).await.unwrap();
        assert_eq!(sm.reader().drivable_jobs(), vec![JobId::new("b").unwrap()]);
    }

    /// A rejected command is an ordinary response and leaves its job as it was.
    #[tokio::test]
    async fn rejected_commands_change_nothing_and_are_ok_responses() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(dir.path()).unwrap();
        let responses = sm.apply(vec![register(1, "a"), register(2, "a")]).await.unwrap();
        assert!(responses[0].0.is_ok());
        assert!(responses[1].0.is_err(), "registering twice is rejected");
        assert_eq!(sm.reader().jobs().len(), 1);
        assert_eq!(sm.reader().last_applied(), Some(log_id(2)));
    }
}
