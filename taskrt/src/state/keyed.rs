//! Keyed state of one operator in one subtask: value state and map state, kept per key group.
//!
//! Every key group carries a version that changes on every write to it. The incremental
//! bookkeeping compares versions: a key group whose version equals the one of the segment it was
//! last uploaded to (in a checkpoint that has been *confirmed complete*) is not written again, and
//! the new checkpoint references that segment of the earlier `shared/` file. Files of checkpoints
//! that are not confirmed yet are never referenced, because such a checkpoint may still fail and
//! its files be deleted.

use std::collections::{BTreeMap, HashMap};

use cairn_protocol::checkpoint::{KeyGroupRange, KeyGroupSegment, StateFile};

use super::StateError;
use super::codec::{KeyGroupData, MapEntries};
use cairn_protocol::graph::is_valid_id;
use cairn_protocol::keygroups::key_group_of;

#[derive(Debug, Clone, Default)]
struct Group {
    version: u64,
    data: KeyGroupData,
}

/// A key group as one checkpoint wrote or referenced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedGroup {
    /// The group's version when it was written.
    pub version: u64,
    pub segment: KeyGroupSegment,
}

/// What one checkpoint wrote or referenced for one operator: each key group's segment, and the
/// files (by relative path) the segments lie in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadedGroups {
    pub groups: BTreeMap<u32, UploadedGroup>,
    pub files: BTreeMap<String, StateFile>,
}

/// Keyed value and map state of one operator, for the key groups of one subtask.
#[derive(Debug, Clone)]
pub struct KeyedStateBackend {
    max_parallelism: u32,
    range: KeyGroupRange,
    groups: BTreeMap<u32, Group>,
    /// Source of fresh versions; bumped on every write.
    next_version: u64,
    /// Shared segments of the latest confirmed checkpoint, reusable while a group is unchanged.
    confirmed: UploadedGroups,
    /// Files written by checkpoints that are acknowledged but not yet confirmed, by checkpoint.
    pending: BTreeMap<u64, UploadedGroups>,
}

impl KeyedStateBackend {
    pub fn new(max_parallelism: u32, range: KeyGroupRange) -> Self {
        Self {
            max_parallelism,
            range,
            groups: BTreeMap::new(),
            next_version: 1,
            confirmed: UploadedGroups::default(),
            pending: BTreeMap::new(),
        }
    }

    pub fn range(&self) -> KeyGroupRange {
        self.range
    }

    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    fn check(&self, key: u64) -> Result<u32, StateError> {
        let key_group = key_group_of(key, self.max_parallelism);
        if !self.range.contains(key_group) {
            return Err(StateError::KeyOutsideRange { key, key_group, range: self.range });
        }
        Ok(key_group)
    }

    fn group_mut(&mut self, key: u64) -> Result<&mut KeyGroupData, StateError> {
        let kg = self.check(key)?;
        let version = self.next_version;
        self.next_version += 1;
        let group = self.groups.entry(kg).or_default();
        group.version = version;
        Ok(&mut group.data)
    }

    fn checked_name(name: &str) -> Result<(), StateError> {
        if is_valid_id(name) { Ok(()) } else { Err(StateError::InvalidStateName { name: name.to_owned() }) }
    }

    /// Value of state `name` for `key`.
    pub fn value(&self, name: &str, key: u64) -> Result<Option<&[u8]>, StateError> {
        let kg = self.check(key)?;
        Ok(self
            .groups
            .get(&kg)
            .and_then(|g| g.data.values.get(name))
            .and_then(|m| m.get(&key))
            .map(Vec::as_slice))
    }

    pub fn put_value(&mut self, name: &str, key: u64, value: Vec<u8>) -> Result<(), StateError> {
        let data = self.group_mut(key)?;
        match data.values.get_mut(name) {
            Some(m) => {
                m.insert(key, value);
            }
            None => {
                Self::checked_name(name)?;
                data.values.entry(name.to_owned()).or_default().insert(key, value);
            }
        }
        Ok(())
    }

    pub fn remove_value(&mut self, name: &str, key: u64) -> Result<Option<Vec<u8>>, StateError> {
        let data = self.group_mut(key)?;
        Ok(data.values.get_mut(name).and_then(|m| m.remove(&key)))
    }

    /// A `u64` value state (little-endian); a malformed stored value is an error.
    pub fn value_u64(&self, name: &str, key: u64) -> Result<Option<u64>, StateError> {
        match self.value(name, key)? {
            None => Ok(None),
            Some(b) => {
                <[u8; 8]>::try_from(b).map(|a| Some(u64::from_le_bytes(a))).map_err(|_| StateError::Corrupt {
                    path: format!("<value state {name}>").into(),
                    reason: format!("value of key {key} is {} bytes, expected 8", b.len()),
                })
            }
        }
    }

    pub fn put_value_u64(&mut self, name: &str, key: u64, value: u64) -> Result<(), StateError> {
        self.put_value(name, key, value.to_le_bytes().to_vec())
    }

    pub fn map_get(&self, name: &str, key: u64, user_key: &[u8]) -> Result<Option<&[u8]>, StateError> {
        Ok(self.map_entries(name, key)?.and_then(|m| m.get(user_key)).map(Vec::as_slice))
    }

    /// All entries of map state `name` for `key`.
    pub fn map_entries(&self, name: &str, key: u64) -> Result<Option<&MapEntries>, StateError> {
        let kg = self.check(key)?;
        Ok(self.groups.get(&kg).and_then(|g| g.data.maps.get(name)).and_then(|m| m.get(&key)))
    }

    pub fn map_put(
        &mut self,
        name: &str,
        key: u64,
        user_key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<(), StateError> {
        Self::checked_name(name)?;
        let data = self.group_mut(key)?;
        data.maps.entry(name.to_owned()).or_default().entry(key).or_default().insert(user_key, value);
        Ok(())
    }

    pub fn map_remove(
        &mut self,
        name: &str,
        key: u64,
        user_key: &[u8],
    ) -> Result<Option<Vec<u8>>, StateError> {
        let data = self.group_mut(key)?;
        let per_key: &mut HashMap<u64, MapEntries> = match data.maps.get_mut(name) {
            Some(m) => m,
            None => return Ok(None),
        };
        let removed = per_key.get_mut(&key).and_then(|m| m.remove(user_key));
        if per_key.get(&key).is_some_and(BTreeMap::is_empty) {
            per_key.remove(&key);
        }
        Ok(removed)
    }

    /// Number of keys with some state (for tests and metrics).
    pub fn key_count(&self) -> usize {
        let mut keys: Vec<u64> = self.groups.values().flat_map(|g| g.data.keys()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }

    /// Non-empty key groups with their versions, for the synchronous snapshot.
    pub fn snapshot_groups(&self) -> impl Iterator<Item = (u32, u64, &KeyGroupData)> {
        self.groups.iter().filter(|(_, g)| !g.data.is_empty()).map(|(kg, g)| (*kg, g.version, &g.data))
    }

    /// The confirmed segment for `key_group`, and its file, if it still holds the group's
    /// current `version`.
    pub fn reusable(&self, key_group: u32, version: u64) -> Option<(&KeyGroupSegment, &StateFile)> {
        let group = self.confirmed.groups.get(&key_group).filter(|g| g.version == version)?;
        let file = self.confirmed.files.get(&group.segment.file)?;
        Some((&group.segment, file))
    }

    /// Installs a restored key group. Every key must belong to it and to this subtask's range.
    /// When its segment lies in a shared file and `reusable` (the file is in this job's own
    /// checkpoint storage) it becomes reusable by incremental checkpoints.
    pub fn restore_group(
        &mut self,
        key_group: u32,
        data: KeyGroupData,
        segment: &KeyGroupSegment,
        file: &StateFile,
        reusable: bool,
    ) -> Result<(), StateError> {
        let corrupt = |reason: String| StateError::Corrupt { path: segment.file.clone().into(), reason };
        if !self.range.contains(key_group) {
            return Err(corrupt(format!(
                "key group {key_group} is outside this subtask's range {:?}",
                self.range
            )));
        }
        if let Some(stray) = data.keys().find(|k| key_group_of(*k, self.max_parallelism) != key_group) {
            return Err(corrupt(format!("key {stray} does not belong to key group {key_group}")));
        }
        if file.path != segment.file {
            return Err(corrupt(format!("key group {key_group} is restored with file {:?}", file.path)));
        }
        let version = self.next_version;
        self.next_version += 1;
        self.groups.insert(key_group, Group { version, data });
        if reusable && segment.is_shared() {
            self.confirmed.groups.insert(key_group, UploadedGroup { version, segment: segment.clone() });
            self.confirmed.files.insert(file.path.clone(), file.clone());
        }
        Ok(())
    }

    /// Remembers what an acknowledged incremental checkpoint uploaded or referenced.
    pub fn record_pending(&mut self, checkpoint_id: u64, groups: UploadedGroups) {
        self.pending.insert(checkpoint_id, groups);
    }

    /// Checkpoint `checkpoint_id` is complete: its files become the base for later increments.
    pub fn confirm(&mut self, checkpoint_id: u64) {
        if let Some(groups) = self.pending.remove(&checkpoint_id) {
            self.confirmed = groups;
        }
        self.pending.retain(|id, _| *id > checkpoint_id);
    }

    /// Checkpoint `checkpoint_id` will never complete: forget its files.
    pub fn discard_pending(&mut self, checkpoint_id: u64) {
        self.pending.remove(&checkpoint_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_outside_the_range_are_rejected() {
        let range = KeyGroupRange::for_subtask(128, 2, 0).unwrap();
        let mut b = KeyedStateBackend::new(128, range);
        let (inside, outside): (Vec<u64>, Vec<u64>) =
            (0..64).partition(|k| range.contains(key_group_of(*k, 128)));
        b.put_value_u64("count", inside[0], 3).unwrap();
        assert_eq!(b.value_u64("count", inside[0]).unwrap(), Some(3));
        assert!(matches!(b.put_value_u64("count", outside[0], 1), Err(StateError::KeyOutsideRange { .. })));
        b.map_put("m", inside[1], b"a".to_vec(), b"b".to_vec()).unwrap();
        assert_eq!(b.map_get("m", inside[1], b"a").unwrap(), Some(&b"b"[..]));
        assert_eq!(b.key_count(), 2);
        assert!(matches!(
            b.put_value("bad name", inside[0], vec![]),
            Err(StateError::InvalidStateName { .. })
        ));
    }
}
