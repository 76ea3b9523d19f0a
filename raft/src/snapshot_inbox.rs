//! Assembles the snapshot a leader streams in chunks, so that a peer cannot make this replica
//! allocate without bound or hand Raft a snapshot its storage would fail on.
//!
//! openraft writes each chunk at the offset the sender names, zero-filling any gap, and a storage
//! error while installing stops Raft on this replica. So the inbox takes chunks first: a new
//! snapshot starts at offset 0, each further chunk must continue exactly where the previous one
//! ended and belong to the same snapshot, and the whole must stay within
//! [`MAX_SNAPSHOT_BYTES`]. Only the last chunk hands Raft the whole snapshot, in one piece, after
//! the [`SnapshotCheck`] accepted it (it decodes and matches its metadata).

use std::sync::{Arc, Mutex};

use openraft::SnapshotMeta;
use openraft::raft::InstallSnapshotRequest;
use tonic::Status;

use crate::types::{Node, NodeId, TypeConfig};

/// Largest snapshot a replica accepts from a peer. Cairn's state machine holds job records and
/// checkpoint metadata, a few KiB per job; 1 GiB leaves room for far more jobs than one Raft
/// group can serve (see docs/SCALING.md).
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Checks an assembled snapshot before Raft installs it; the error says why it is refused.
pub type SnapshotCheck = Arc<dyn Fn(&SnapshotMeta<NodeId, Node>, &[u8]) -> Result<(), String> + Send + Sync>;

/// The snapshot being received, one at a time.
pub struct SnapshotInbox {
    check: SnapshotCheck,
    max_bytes: u64,
    /// A std mutex: held only to append a chunk, never across an await.
    receiving: Mutex<Option<Receiving>>,
}

struct Receiving {
    snapshot_id: String,
    data: Vec<u8>,
}

impl SnapshotInbox {
    pub fn new(check: SnapshotCheck) -> Self {
        Self::with_limit(check, MAX_SNAPSHOT_BYTES)
    }

    /// An inbox that refuses snapshots larger than `max_bytes`.
    pub fn with_limit(check: SnapshotCheck, max_bytes: u64) -> Self {
        Self { check, max_bytes, receiving: Mutex::new(None) }
    }

    /// Takes one chunk. `Ok(Some(request))` is the whole snapshot as one request (after the
    /// last chunk); `Ok(None)` means more chunks are expected. A refused chunk discards the
    /// snapshot being received; the sender starts it over.
    pub fn receive(
        &self,
        req: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<Option<InstallSnapshotRequest<TypeConfig>>, Status> {
        let mut guard = self.receiving.lock().unwrap_or_else(|p| p.into_inner());
        let id = req.meta.snapshot_id.clone();
        let expected = match guard.as_ref() {
            _ if req.offset == 0 => 0,
            Some(r) if r.snapshot_id == id => r.data.len() as u64,
            Some(r) => {
                let other = r.snapshot_id.clone();
                *guard = None;
                return Err(Status::invalid_argument(format!(
                    "snapshot {id}: a chunk at offset {} while snapshot {other} was being received; \
                     start again at offset 0",
                    req.offset
                )));
            }
            None => {
                return Err(Status::invalid_argument(format!(
                    "snapshot {id}: a chunk at offset {} but no snapshot is being received; start at offset 0",
                    req.offset
                )));
            }
        };
        if req.offset != expected {
            *guard = None;
            return Err(Status::invalid_argument(format!(
                "snapshot {id}: a chunk at offset {}, expected {expected}; start again at offset 0",
                req.offset
            )));
        }
        let total = req.offset.checked_add(req.data.len() as u64).filter(|t| *t <= self.max_bytes);
        if total.is_none() {
            *guard = None;
            return Err(Status::invalid_argument(format!(
                "snapshot {id}: more than {} bytes; refused",
                self.max_bytes
            )));
        }
        let mut receiving = match guard.take() {
            Some(r) if req.offset > 0 => r,
            _ => Receiving { snapshot_id: id.clone(), data: Vec::new() },
        };
        receiving.data.extend_from_slice(&req.data);
        if !req.done {
            *guard = Some(receiving);
            return Ok(None);
        }
        drop(guard);
        (self.check)(&req.meta, &receiving.data)
            .map_err(|why| Status::invalid_argument(format!("snapshot {id} refused: {why}")))?;
        Ok(Some(InstallSnapshotRequest {
            vote: req.vote,
            meta: req.meta,
            offset: 0,
            data: receiving.data,
            done: true,
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId, StoredMembership, Vote};

    use super::*;

    fn chunk(id: &str, offset: u64, data: &[u8], done: bool) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: Vote::new_committed(1, 1),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), 10)),
                last_membership: StoredMembership::default(),
                snapshot_id: id.to_owned(),
            },
            offset,
            data: data.to_vec(),
            done,
        }
    }

    fn inbox() -> SnapshotInbox {
        SnapshotInbox::new(Arc::new(|_, bytes: &[u8]| {
            if bytes.starts_with(b"ok") { Ok(()) } else { Err("it does not decode".into()) }
        }))
    }

    #[test]
    fn contiguous_chunks_are_assembled_into_one_request() {
        let inbox = inbox();
        assert!(inbox.receive(chunk("s1", 0, b"ok-", false)).unwrap().is_none());
        assert!(inbox.receive(chunk("s1", 3, b"abc", false)).unwrap().is_none());
        let whole = inbox.receive(chunk("s1", 6, b"def", true)).unwrap().unwrap();
        assert_eq!((whole.offset, whole.done, whole.data.as_slice()), (0, true, &b"ok-abcdef"[..]));
        // A single-chunk snapshot passes straight through.
        assert_eq!(inbox.receive(chunk("s2", 0, b"ok", true)).unwrap().unwrap().data, b"ok");
    }

    #[test]
    fn gaps_overlaps_strangers_and_corrupt_snapshots_are_refused() {
        let inbox = inbox();
        let err = inbox.receive(chunk("s1", 5, b"x", false)).unwrap_err();
        assert!(err.message().contains("no snapshot is being received"), "{err}");
        inbox.receive(chunk("s1", 0, b"ok", false)).unwrap();
        let err = inbox.receive(chunk("s1", u64::MAX - 1, b"xyz", false)).unwrap_err();
        assert!(err.message().contains("expected 2"), "{err}");
        // The refused chunk discarded the snapshot: continuing it is refused too.
        assert!(inbox.receive(chunk("s1", 2, b"x", true)).is_err());
        inbox.receive(chunk("s1", 0, b"ok", false)).unwrap();
        let err = inbox.receive(chunk("s2", 2, b"x", true)).unwrap_err();
        assert!(err.message().contains("while snapshot s1"), "{err}");
        let err = inbox.receive(chunk("s3", 0, b"garbage", true)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("does not decode"), "{err}");
    }

    #[test]
    fn a_snapshot_beyond_the_bound_is_refused() {
        let inbox = SnapshotInbox::with_limit(Arc::new(|_, _: &[u8]| Ok(())), 16);
        inbox.receive(chunk("big", 0, b"ok", false)).unwrap();
        inbox.receive(chunk("big", 2, &[0; 14], false)).unwrap();
        let err = inbox.receive(chunk("big", 16, b"x", true)).unwrap_err();
        assert!(err.message().contains("more than 16 bytes"), "{err}");
        // Exactly the bound is accepted.
        inbox.receive(chunk("big", 0, &[1; 8], false)).unwrap();
        assert_eq!(inbox.receive(chunk("big", 8, &[2; 8], true)).unwrap().unwrap().data.len(), 16);
        // A sender cannot claim an offset past the bound either.
        inbox.receive(chunk("big", 0, b"ok", false)).unwrap();
        assert!(inbox.receive(chunk("big", MAX_SNAPSHOT_BYTES, b"x", true)).is_err());
    }
}
