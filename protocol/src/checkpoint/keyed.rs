//! Keyed-state handles: where each key group's bytes are.
//!
//! A subtask writes the keyed state of one operator for one checkpoint as one file, the key
//! groups one after another; the handle indexes it: key group → [`KeyGroupSegment`] (file,
//! offset, length, CRC-32 of those bytes). A restoring subtask reads and verifies only the
//! segments of the key groups it owns. In incremental mode a handle also points at segments of
//! earlier `shared/` files (key groups unchanged since), so a handle may span several files;
//! [`KeyedStateHandle::files`] lists each of them once, with its size and whole-file CRC-32,
//! for the leader's bookkeeping (reference counts, disposal).
//!
//! Handles written before this layout had one file per key group (`{"<kg>": StateFile}`); they
//! still decode: each such file is a file holding one segment that spans all of it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::handles::{KeyGroupRange, StateFile};
use super::layout::{is_safe_relative, is_shared_path};

/// The bytes of one key group inside a keyed-state file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyGroupSegment {
    /// Relative path of the file, as listed in [`KeyedStateHandle::files`].
    pub file: String,
    pub offset: u64,
    pub length: u64,
    /// CRC-32 (IEEE) of the segment's bytes; verified when the segment is read.
    pub crc32: u32,
}

impl KeyGroupSegment {
    /// Whether the segment lies in a shared (reference-counted) file.
    pub fn is_shared(&self) -> bool {
        is_shared_path(&self.file)
    }

    /// End offset (exclusive), `None` when it does not fit in a `u64`.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.length)
    }
}

/// The keyed state of one operator in one subtask.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct KeyedStateHandle {
    /// Every non-empty key group.
    pub key_groups: BTreeMap<u32, KeyGroupSegment>,
    /// The files the segments lie in, each once.
    pub files: Vec<StateFile>,
}

/// Why a state handle (a keyed-state handle, or a list state next to it) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    #[error("path {path:?} is not a safe relative path")]
    UnsafePath { path: String },
    #[error("keyed state file {path:?} is listed more than once")]
    DuplicateFile { path: String },
    #[error("key group {key_group} lies in {path:?}, which is not among the handle's files")]
    UnlistedFile { key_group: u32, path: String },
    #[error("key group {key_group} has an empty segment in {path:?}")]
    EmptySegment { key_group: u32, path: String },
    #[error("key group {key_group}: segment at offset {offset} of {length} bytes in {path:?} overflows")]
    SegmentOverflow { key_group: u32, path: String, offset: u64, length: u64 },
    #[error("key group {key_group}: segment {offset}..{end} is outside {path:?} of {size} bytes")]
    SegmentOutsideFile { key_group: u32, path: String, offset: u64, end: u64, size: u64 },
    #[error("key groups {first} and {second} overlap in {path:?}")]
    OverlappingSegments { first: u32, second: u32, path: String },
    #[error("keyed state file {path:?} holds no key group")]
    UnusedFile { path: String },
    #[error("list state {name:?} has element offsets that decrease or exceed its {size}-byte file")]
    ListOffsets { name: String, size: u64 },
}

impl KeyedStateHandle {
    pub fn is_empty(&self) -> bool {
        self.key_groups.is_empty() && self.files.is_empty()
    }

    /// The handle of the former layout: one file per key group, each file one segment.
    pub fn from_file_per_key_group(groups: BTreeMap<u32, StateFile>) -> Self {
        let mut handle = Self::default();
        for (kg, file) in groups {
            handle.insert_whole_file(kg, file);
        }
        handle
    }

    /// Adds key group `key_group` as the only content of `file` (the former layout), listing the
    /// file unless it is listed already.
    pub fn insert_whole_file(&mut self, key_group: u32, file: StateFile) {
        let segment =
            KeyGroupSegment { file: file.path.clone(), offset: 0, length: file.size, crc32: file.crc32 };
        self.key_groups.insert(key_group, segment);
        if !self.files.contains(&file) {
            self.files.push(file);
            self.files.sort();
        }
    }

    /// Removes key group `key_group`, and its file when no other key group lies in it.
    pub fn remove_key_group(&mut self, key_group: u32) -> Option<KeyGroupSegment> {
        let segment = self.key_groups.remove(&key_group)?;
        if !self.key_groups.values().any(|s| s.file == segment.file) {
            self.files.retain(|f| f.path != segment.file);
        }
        Some(segment)
    }

    /// The listed file at `path`.
    pub fn file(&self, path: &str) -> Option<&StateFile> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Bytes of the key groups' segments (saturating: the lengths may come from a report).
    pub fn segment_bytes(&self) -> u64 {
        self.key_groups.values().fold(0, |total, s| total.saturating_add(s.length))
    }

    /// The key groups of `range`, with the files they lie in.
    pub fn restricted_to(&self, range: KeyGroupRange) -> Self {
        let key_groups: BTreeMap<u32, KeyGroupSegment> =
            self.key_groups.range(range.start..=range.end).map(|(kg, s)| (*kg, s.clone())).collect();
        let used: BTreeSet<&str> = key_groups.values().map(|s| s.file.as_str()).collect();
        let files = self.files.iter().filter(|f| used.contains(f.path.as_str())).cloned().collect();
        Self { key_groups, files }
    }

    /// Checks that the handle can be read: safe relative paths, each file listed once and
    /// holding at least one key group, every segment non-empty, inside a listed file and not
    /// overlapping another.
    pub fn validate(&self) -> Result<(), HandleError> {
        let mut sizes: BTreeMap<&str, u64> = BTreeMap::new();
        for f in &self.files {
            if !is_safe_relative(&f.path) {
                return Err(HandleError::UnsafePath { path: f.path.clone() });
            }
            if sizes.insert(&f.path, f.size).is_some() {
                return Err(HandleError::DuplicateFile { path: f.path.clone() });
            }
        }
        let mut by_file: BTreeMap<&str, Vec<(u64, u64, u32)>> = BTreeMap::new();
        for (kg, s) in &self.key_groups {
            let path = || s.file.clone();
            let Some(size) = sizes.get(s.file.as_str()).copied() else {
                return Err(HandleError::UnlistedFile { key_group: *kg, path: path() });
            };
            if s.length == 0 {
                return Err(HandleError::EmptySegment { key_group: *kg, path: path() });
            }
            let Some(end) = s.end() else {
                return Err(HandleError::SegmentOverflow {
                    key_group: *kg,
                    path: path(),
                    offset: s.offset,
                    length: s.length,
                });
            };
            if end > size {
                return Err(HandleError::SegmentOutsideFile {
                    key_group: *kg,
                    path: path(),
                    offset: s.offset,
                    end,
                    size,
                });
            }
            by_file.entry(&s.file).or_default().push((s.offset, end, *kg));
        }
        if let Some(unused) = sizes.keys().find(|p| !by_file.contains_key(*p)) {
            return Err(HandleError::UnusedFile { path: (*unused).to_owned() });
        }
        for (path, segments) in &mut by_file {
            segments.sort_unstable();
            if let Some(w) = segments.windows(2).find(|w| w[1].0 < w[0].1) {
                return Err(HandleError::OverlappingSegments {
                    first: w[0].2,
                    second: w[1].2,
                    path: (*path).to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// The current shape, as it is written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Current {
    key_groups: BTreeMap<u32, KeyGroupSegment>,
    files: Vec<StateFile>,
}

/// Decodes the current shape (`{"key_groups": …, "files": …}`) or the former one (a map of key
/// group → file). Goes through `serde_json::Value`, whose decoder turns the string keys JSON
/// gives to integer-keyed maps back into integers (a buffered, untagged decoder does not).
impl<'de> Deserialize<'de> for KeyedStateHandle {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;

        let value = serde_json::Value::deserialize(deserializer)?;
        let current =
            value.as_object().is_some_and(|o| o.contains_key("key_groups") || o.contains_key("files"));
        if current {
            let c: Current = serde_json::from_value(value).map_err(D::Error::custom)?;
            Ok(Self { key_groups: c.key_groups, files: c.files })
        } else {
            let legacy: BTreeMap<u32, StateFile> = serde_json::from_value(value)
                .map_err(|e| D::Error::custom(format!("keyed state (one file per key group): {e}")))?;
            Ok(Self::from_file_per_key_group(legacy))
        }
    }
}

#[cfg(test)]
mod tests;
