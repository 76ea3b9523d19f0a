//! The keyed part of one operator's snapshot: one file per operator and checkpoint, its key
//! groups one after another, indexed by the handle.
//!
//! - Synchronous part ([`plan_keyed`]): decides which key groups are written and which are
//!   referenced in earlier files, and encodes the written ones into one buffer.
//! - Asynchronous part ([`PlannedKeyed::finish`]): once the buffer is written, computes each
//!   segment's CRC-32 (and, combined, the file's) and builds the handle.
//!
//! Incremental mode writes only key groups changed since the last confirmed checkpoint, into a
//! new `shared/` file, and references the unchanged ones' segments in earlier shared files. A
//! shared file stays in storage while any retained checkpoint references any segment of it, so
//! a segment is reused only while the reused segments of its file make up at least
//! [`MIN_LIVE_SHARE_PERCENT`] of the file; below that, its groups are written again and the
//! file can go once older checkpoints are subsumed. This bounds the bytes a checkpoint keeps
//! alive per byte of state (at most 100 / [`MIN_LIVE_SHARE_PERCENT`]) at the cost of writing
//! some unchanged groups again: about 1 / (1 - share) times the changed bytes in a steady state,
//! every byte rewritten freeing more than itself.

use std::collections::{BTreeMap, BTreeSet};

use cairn_protocol::checkpoint::layout::SHARED_DIR;
use cairn_protocol::checkpoint::{KeyGroupSegment, KeyedStateHandle, StateFile};

use super::codec::{self, KeyGroupData};
use super::keyed::{KeyedStateBackend, UploadedGroup, UploadedGroups};

/// Reused segments of a shared file must make up at least this share of it (percent): at most
/// four times the state is kept alive, about a third more than the changed bytes is written.
pub const MIN_LIVE_SHARE_PERCENT: u64 = 25;

/// A key group to write, located in the planned buffer.
#[derive(Debug, Clone, Copy)]
struct WrittenGroup {
    key_group: u32,
    version: u64,
    offset: u64,
    length: u64,
}

/// The new keyed-state file of a plan.
#[derive(Debug, Clone)]
pub struct PlannedKeyedFile {
    pub rel: String,
    pub bytes: Vec<u8>,
    groups: Vec<WrittenGroup>,
}

/// The keyed part of one operator's snapshot, after the synchronous part.
#[derive(Debug, Clone, Default)]
pub struct PlannedKeyed {
    /// The file to write, when some key group must be written.
    pub file: Option<PlannedKeyedFile>,
    /// Key groups referenced in earlier shared files.
    reused: UploadedGroups,
}

impl PlannedKeyed {
    pub fn is_empty(&self) -> bool {
        self.file.is_none() && self.reused.groups.is_empty()
    }

    /// Key groups written by this plan.
    pub fn written_groups(&self) -> usize {
        self.file.as_ref().map_or(0, |f| f.groups.len())
    }

    /// Key groups referenced in earlier files.
    pub fn reused_groups(&self) -> usize {
        self.reused.groups.len()
    }

    /// The handle and the incremental bookkeeping, once `file` (if any) is written as planned.
    pub fn finish(self) -> (KeyedStateHandle, UploadedGroups) {
        let mut uploaded = self.reused;
        if let Some(file) = self.file {
            let mut whole = crc32fast::Hasher::new();
            for g in &file.groups {
                // Offsets come from the buffer this plan built: always in range.
                let bytes = file.bytes.get(g.offset as usize..(g.offset + g.length) as usize).unwrap_or(&[]);
                let mut h = crc32fast::Hasher::new();
                h.update(bytes);
                whole.combine(&h);
                let segment = KeyGroupSegment {
                    file: file.rel.clone(),
                    offset: g.offset,
                    length: g.length,
                    crc32: h.finalize(),
                };
                uploaded.groups.insert(g.key_group, UploadedGroup { version: g.version, segment });
            }
            let state_file =
                StateFile { path: file.rel.clone(), size: file.bytes.len() as u64, crc32: whole.finalize() };
            uploaded.files.insert(file.rel, state_file);
        }
        let handle = KeyedStateHandle {
            key_groups: uploaded.groups.iter().map(|(kg, g)| (*kg, g.segment.clone())).collect(),
            files: uploaded.files.values().cloned().collect(),
        };
        (handle, uploaded)
    }
}

/// Synchronous part of the keyed state of one operator. `exclusive_rel` is the file's path in
/// full mode; incremental mode writes `shared/<operator>-<subtask>-<random>.state`.
pub fn plan_keyed(
    keyed: &KeyedStateBackend,
    operator_id: &str,
    subtask: u32,
    exclusive_rel: String,
    incremental: bool,
) -> PlannedKeyed {
    type Candidate<'a> = (u32, u64, &'a KeyGroupData, Option<(&'a KeyGroupSegment, &'a StateFile)>);
    let candidates: Vec<Candidate<'_>> = keyed
        .snapshot_groups()
        .map(|(kg, version, data)| (kg, version, data, keyed.reusable(kg, version).filter(|_| incremental)))
        .collect();
    let thin = thin_files(candidates.iter().filter_map(|c| c.3));
    let mut to_write: Vec<(u32, u64, &KeyGroupData)> = Vec::new();
    let mut reused = UploadedGroups::default();
    for (kg, version, data, reusable) in candidates {
        match reusable.filter(|(segment, _)| !thin.contains(segment.file.as_str())) {
            Some((segment, file)) => {
                reused.groups.insert(kg, UploadedGroup { version, segment: segment.clone() });
                reused.files.insert(file.path.clone(), file.clone());
            }
            None => to_write.push((kg, version, data)),
        }
    }
    let file = (!to_write.is_empty()).then(|| {
        let rel = if incremental {
            format!("{SHARED_DIR}/{operator_id}-{subtask}-{:032x}.state", rand::random::<u128>())
        } else {
            exclusive_rel
        };
        let mut bytes = Vec::new();
        let mut groups = Vec::with_capacity(to_write.len());
        // `snapshot_groups` is in key-group order, so the file is too.
        for (kg, version, data) in to_write {
            let offset = bytes.len() as u64;
            codec::encode_into(&mut bytes, kg, data);
            groups.push(WrittenGroup { key_group: kg, version, offset, length: bytes.len() as u64 - offset });
        }
        PlannedKeyedFile { rel, bytes, groups }
    });
    PlannedKeyed { file, reused }
}

/// The files whose reusable segments make up less than [`MIN_LIVE_SHARE_PERCENT`] of their size.
fn thin_files<'a>(reusable: impl Iterator<Item = (&'a KeyGroupSegment, &'a StateFile)>) -> BTreeSet<&'a str> {
    let mut live: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (segment, file) in reusable {
        let entry = live.entry(file.path.as_str()).or_insert((0, file.size));
        entry.0 = entry.0.saturating_add(segment.length);
    }
    live.into_iter()
        .filter(|(_, (live, size))| live.saturating_mul(100) < size.saturating_mul(MIN_LIVE_SHARE_PERCENT))
        .map(|(path, _)| {
            tracing::debug!(file = %path, "rewriting the key groups of a mostly unreferenced shared file");
            path
        })
        .collect()
}
