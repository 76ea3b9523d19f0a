//! The shared-state registry: which state files the retained checkpoints reference.
//!
//! Incremental checkpoints share files under `<job>/shared/`; a shared file may be deleted only
//! when no retained checkpoint references it any more. The registry holds a reference count per
//! shared file and the exact file list of every retained checkpoint, so that releasing a
//! subsumed checkpoint yields the shared files that became unreferenced.
//!
//! It is derived state, not replicated: after a leader change, [`SharedStateRegistry::rebuild`]
//! recomputes it from the retained checkpoints' `_metadata`. A retained checkpoint whose metadata
//! cannot be read is registered as *opaque*: while one is retained, every shared file counts as
//! referenced, so nothing shared is deleted on a guess.
//!
//! Savepoints are not registered: their paths are relative to their own directory, so they can
//! never reference the job's shared files.

use std::collections::{BTreeMap, BTreeSet};

use cairn_protocol::checkpoint::{CheckpointMetadata, StateFile};

/// Reference counts of the state files of the retained checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedStateRegistry {
    /// Shared file (relative path) → number of registered checkpoints that reference it.
    shared: BTreeMap<String, u32>,
    /// Exclusive files (relative paths) of registered checkpoints; they belong to one checkpoint
    /// each, so a set suffices. Kept so that a stray acknowledgement can never delete them.
    exclusive: BTreeSet<String>,
    /// Files of each registered checkpoint, to release them when it is subsumed.
    checkpoints: BTreeMap<u64, CheckpointFiles>,
    /// Registered checkpoints whose files are unknown; while any exists, every shared file is
    /// treated as referenced.
    opaque: BTreeSet<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CheckpointFiles {
    shared: BTreeSet<String>,
    exclusive: BTreeSet<String>,
}

impl SharedStateRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds the registry from the retained checkpoints, as a new leader must. `None`
    /// metadata marks a checkpoint whose `_metadata` could not be read: it is registered opaque.
    pub fn rebuild<'a>(retained: impl IntoIterator<Item = (u64, Option<&'a CheckpointMetadata>)>) -> Self {
        let mut registry = Self::new();
        for (id, meta) in retained {
            match meta {
                Some(meta) => registry.register(id, meta.subtasks.values().flat_map(|s| s.files())),
                None => registry.register_opaque(id),
            }
        }
        registry
    }

    /// Registers the files of checkpoint `id`. Registering an id twice is a no-op (a checkpoint
    /// whose commit outcome was unknown may later be confirmed).
    pub fn register<'a>(&mut self, id: u64, files: impl IntoIterator<Item = &'a StateFile>) {
        if self.checkpoints.contains_key(&id) || self.opaque.contains(&id) {
            return;
        }
        let mut entry = CheckpointFiles::default();
        for f in files {
            if f.is_shared() {
                if entry.shared.insert(f.path.clone()) {
                    *self.shared.entry(f.path.clone()).or_insert(0) += 1;
                }
            } else if entry.exclusive.insert(f.path.clone()) {
                self.exclusive.insert(f.path.clone());
            }
        }
        self.checkpoints.insert(id, entry);
    }

    /// Registers checkpoint `id` without knowing its files.
    pub fn register_opaque(&mut self, id: u64) {
        if !self.checkpoints.contains_key(&id) {
            self.opaque.insert(id);
        }
    }

    /// Releases checkpoint `id` (subsumed or discarded) and returns the shared files that no
    /// registered checkpoint references any more. Unknown ids release nothing. While an opaque
    /// checkpoint is registered nothing shared is returned, since it might reference any file:
    /// files withheld that way are left in storage (orphans), never deleted on a guess.
    pub fn release(&mut self, id: u64) -> Vec<String> {
        self.opaque.remove(&id);
        let Some(entry) = self.checkpoints.remove(&id) else {
            return Vec::new();
        };
        for path in &entry.exclusive {
            self.exclusive.remove(path);
        }
        let mut unreferenced = Vec::new();
        for path in entry.shared {
            if let Some(count) = self.shared.get_mut(&path) {
                *count -= 1;
                if *count == 0 {
                    self.shared.remove(&path);
                    unreferenced.push(path);
                }
            }
        }
        if !self.opaque.is_empty() {
            // An opaque checkpoint might reference any of them.
            return Vec::new();
        }
        unreferenced
    }

    /// Whether a registered checkpoint (possibly) references this relative path.
    pub fn is_referenced(&self, path: &str) -> bool {
        if path.starts_with("shared/") {
            !self.opaque.is_empty() || self.shared.contains_key(path)
        } else {
            self.exclusive.contains(path)
        }
    }

    pub fn is_registered(&self, id: u64) -> bool {
        self.checkpoints.contains_key(&id) || self.opaque.contains(&id)
    }

    /// Ids of the registered checkpoints, ascending.
    pub fn registered_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.checkpoints.keys().chain(self.opaque.iter()).copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Reference count of a shared file (0 when unreferenced).
    pub fn ref_count(&self, path: &str) -> u32 {
        self.shared.get(path).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cairn_protocol::checkpoint::{OperatorSubtaskState, SubtaskState, VertexInfo};

    use super::*;

    fn file(path: &str) -> StateFile {
        StateFile { path: path.into(), size: 1, crc32: 0 }
    }

    fn meta(id: u64, paths: &[&str]) -> CheckpointMetadata {
        let mut op = OperatorSubtaskState::default();
        for (i, p) in paths.iter().enumerate() {
            op.keyed.insert_whole_file(i as u32, file(p));
        }
        let st = SubtaskState { operators: BTreeMap::from([("op".to_string(), op)]) };
        CheckpointMetadata {
            version: 1,
            job: "j".into(),
            checkpoint_id: id,
            kind: "checkpoint".into(),
            trigger_time_ms: 0,
            completion_time_ms: 0,
            vertices: BTreeMap::from([("v".into(), VertexInfo { parallelism: 1, max_parallelism: 8 })]),
            subtasks: BTreeMap::from([("v/0".into(), st)]),
            master_states: BTreeMap::new(),
        }
    }

    #[test]
    fn shared_file_still_referenced_is_kept() {
        let mut r = SharedStateRegistry::new();
        r.register(1, [&file("chk-1/a"), &file("shared/x"), &file("shared/y")]);
        r.register(2, [&file("chk-2/a"), &file("shared/y"), &file("shared/z")]);
        assert_eq!(r.ref_count("shared/y"), 2);
        assert_eq!(r.release(1), vec!["shared/x".to_string()]);
        assert!(r.is_referenced("shared/y"));
        assert!(!r.is_referenced("chk-1/a"));
        assert!(r.is_referenced("chk-2/a"));
        assert_eq!(r.release(2), vec!["shared/y".to_string(), "shared/z".to_string()]);
        assert_eq!(r.release(2), Vec::<String>::new(), "releasing twice is harmless");
    }

    /// Incremental checkpoints reference segments of earlier shared files: a file counts once per
    /// checkpoint however many of its segments it references, and is released only when no
    /// registered checkpoint references any segment of it.
    #[test]
    fn a_shared_file_is_kept_while_any_segment_of_it_is_referenced() {
        use cairn_protocol::checkpoint::{KeyGroupSegment, KeyedStateHandle};
        let shared = StateFile { path: "shared/op-0-a.state".into(), size: 30, crc32: 1 };
        let later = StateFile { path: "shared/op-0-b.state".into(), size: 10, crc32: 2 };
        let segment =
            |f: &StateFile, offset| KeyGroupSegment { file: f.path.clone(), offset, length: 10, crc32: 0 };
        // Checkpoint 1 wrote key groups 0..3 into `shared`; checkpoint 2 rewrote key group 0 into
        // `later` and references key groups 1 and 2 in `shared`.
        let one = KeyedStateHandle {
            key_groups: BTreeMap::from([
                (0, segment(&shared, 0)),
                (1, segment(&shared, 10)),
                (2, segment(&shared, 20)),
            ]),
            files: vec![shared.clone()],
        };
        let two = KeyedStateHandle {
            key_groups: BTreeMap::from([
                (0, segment(&later, 0)),
                (1, segment(&shared, 10)),
                (2, segment(&shared, 20)),
            ]),
            files: vec![shared.clone(), later.clone()],
        };
        let op = |keyed: KeyedStateHandle| OperatorSubtaskState {
            keyed,
            list_states: Vec::new(),
            channel_state: None,
        };
        let (one, two) = (op(one), op(two));
        let mut r = SharedStateRegistry::new();
        r.register(1, one.files());
        r.register(2, two.files());
        assert_eq!(r.ref_count(&shared.path), 2, "once per checkpoint, not per segment");
        assert_eq!(r.release(1), Vec::<String>::new(), "checkpoint 2 still references two of its segments");
        assert!(r.is_referenced(&shared.path));
        assert_eq!(r.release(2), vec![shared.path.clone(), later.path.clone()]);
    }

    #[test]
    fn registry_rebuild_matches_live_registry() {
        let m1 = meta(1, &["chk-1/a", "shared/x", "shared/y"]);
        let m2 = meta(2, &["chk-2/a", "shared/y"]);
        let mut live = SharedStateRegistry::new();
        live.register(1, m1.subtasks.values().flat_map(|s| s.files()));
        live.register(2, m2.subtasks.values().flat_map(|s| s.files()));
        let rebuilt = SharedStateRegistry::rebuild([(1, Some(&m1)), (2, Some(&m2))]);
        assert_eq!(live, rebuilt);
    }

    #[test]
    fn registry_with_unreadable_metadata_protects_all_shared_files() {
        let m2 = meta(2, &["chk-2/a", "shared/y"]);
        let mut r = SharedStateRegistry::rebuild([(1, None), (2, Some(&m2))]);
        assert!(r.is_referenced("shared/anything"));
        assert_eq!(
            r.release(2),
            Vec::<String>::new(),
            "nothing shared is released while an opaque one is retained"
        );
        r.release(1);
        assert!(!r.is_referenced("shared/anything"));
        assert!(r.registered_ids().is_empty());
    }
}
