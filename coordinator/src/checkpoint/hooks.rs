//! Master hooks: coordinator-side state snapshotted with every checkpoint (for example the
//! offsets of an external source that the coordinator assigns), stored in
//! `_metadata.master_states` under the hook's name, given back on restore, and reset when a job
//! starts with nothing to restore.
//!
//! Hooks run inside the core, so they must be quick and must not block: they snapshot
//! in-memory state. Anything slow belongs in the driver.

use std::collections::BTreeMap;
use std::fmt;

use super::error::Error;

/// Why a hook could not snapshot, restore or reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// Coordinator-side state that takes part in checkpoints.
pub trait MasterHook: Send {
    /// Unique, stable name: the key of the hook's state in `_metadata`.
    fn name(&self) -> &str;

    /// Called when checkpoint `checkpoint_id` is triggered, before any task hears of it.
    /// `Ok(None)` means the hook has no state for this checkpoint.
    fn snapshot(&mut self, checkpoint_id: u64, timestamp_ms: u64) -> Result<Option<Vec<u8>>, HookError>;

    /// Called on restore with the state the hook stored in checkpoint `checkpoint_id`.
    fn restore(&mut self, checkpoint_id: u64, state: &[u8]) -> Result<(), HookError>;

    /// Called when the job starts with nothing to restore.
    fn reset(&mut self) -> Result<(), HookError> {
        Ok(())
    }

    /// Called once when the coordinator shuts down.
    fn close(&mut self) {}
}

/// The hooks of one job, by name.
#[derive(Default)]
pub struct MasterHooks {
    /// Registered hooks by name; names are unique so each state has one owner.
    hooks: BTreeMap<String, Box<dyn MasterHook>>,
}

impl fmt::Debug for MasterHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.hooks.keys()).finish()
    }
}

impl MasterHooks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a hook; a second hook with the same name is an error.
    pub fn add(&mut self, hook: Box<dyn MasterHook>) -> Result<(), Error> {
        let name = hook.name().to_owned();
        if name.trim().is_empty() {
            return Err(Error::EmptyHookName);
        }
        if self.hooks.contains_key(&name) {
            return Err(Error::DuplicateHook(name));
        }
        self.hooks.insert(name, hook);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.hooks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Snapshots every hook for a checkpoint; the first failure aborts the snapshot.
    pub fn snapshot(
        &mut self,
        checkpoint_id: u64,
        timestamp_ms: u64,
    ) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        let mut states = BTreeMap::new();
        for (name, hook) in &mut self.hooks {
            match hook.snapshot(checkpoint_id, timestamp_ms) {
                Ok(Some(state)) => {
                    states.insert(name.clone(), state);
                }
                Ok(None) => {}
                Err(e) => return Err(Error::HookFailed { hook: name.clone(), detail: e.0 }),
            }
        }
        Ok(states)
    }

    /// Restores the hooks from a checkpoint's master states, or resets them all when there is
    /// nothing to restore (`None`). A state no hook claims is an error unless
    /// `allow_non_restored_state`; a hook with no state in the checkpoint is left untouched.
    pub fn restore(
        &mut self,
        from: Option<(u64, &BTreeMap<String, Vec<u8>>)>,
        allow_non_restored_state: bool,
    ) -> Result<(), Error> {
        let Some((checkpoint_id, states)) = from else {
            for (name, hook) in &mut self.hooks {
                hook.reset().map_err(|e| Error::HookFailed { hook: name.clone(), detail: e.0 })?;
            }
            return Ok(());
        };
        if !allow_non_restored_state
            && let Some(unclaimed) = states.keys().find(|k| !self.hooks.contains_key(*k))
        {
            return Err(Error::UnmappedMasterState { checkpoint_id, hook: unclaimed.clone() });
        }
        for (name, state) in states {
            if let Some(hook) = self.hooks.get_mut(name) {
                hook.restore(checkpoint_id, state)
                    .map_err(|e| Error::HookFailed { hook: name.clone(), detail: e.0 })?;
            }
        }
        Ok(())
    }

    /// Closes every hook and forgets them.
    pub fn close(&mut self) {
        for hook in self.hooks.values_mut() {
            hook.close();
        }
        self.hooks.clear();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A hook whose state is a counter; records every call in a shared log for assertions.
    pub(crate) struct CountingHook {
        pub name: String,
        pub value: u64,
        pub fail_snapshot: bool,
        pub log: Arc<Mutex<Vec<String>>>,
    }

    impl CountingHook {
        pub(crate) fn new(name: &str, log: Arc<Mutex<Vec<String>>>) -> Self {
            Self { name: name.into(), value: 0, fail_snapshot: false, log }
        }
    }

    impl MasterHook for CountingHook {
        fn name(&self) -> &str {
            &self.name
        }
        fn snapshot(&mut self, checkpoint_id: u64, _ts: u64) -> Result<Option<Vec<u8>>, HookError> {
            self.log.lock().unwrap().push(format!("snapshot {checkpoint_id}"));
            if self.fail_snapshot {
                return Err(HookError("offsets unavailable".into()));
            }
            self.value += 1;
            Ok(Some(self.value.to_be_bytes().to_vec()))
        }
        fn restore(&mut self, checkpoint_id: u64, state: &[u8]) -> Result<(), HookError> {
            let bytes: [u8; 8] = state.try_into().map_err(|_| HookError("bad state".into()))?;
            self.value = u64::from_be_bytes(bytes);
            self.log.lock().unwrap().push(format!("restore {checkpoint_id} {}", self.value));
            Ok(())
        }
        fn reset(&mut self) -> Result<(), HookError> {
            self.value = 0;
            self.log.lock().unwrap().push("reset".into());
            Ok(())
        }
    }

    #[test]
    fn master_hooks_restore_and_reset() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut hooks = MasterHooks::new();
        hooks.add(Box::new(CountingHook::new("offsets", log.clone()))).unwrap();
        assert_eq!(
            hooks.add(Box::new(CountingHook::new("offsets", log.clone()))),
            Err(Error::DuplicateHook("offsets".into()))
        );
        let states = hooks.snapshot(3, 0).unwrap();
        assert_eq!(states["offsets"], 1u64.to_be_bytes().to_vec());
        hooks.restore(Some((3, &states)), false).unwrap();
        hooks.restore(None, false).unwrap();
        assert_eq!(*log.lock().unwrap(), vec!["snapshot 3", "restore 3 1", "reset"]);
    }

    #[test]
    fn unmatched_master_state_is_an_error_unless_allowed() {
        let mut hooks = MasterHooks::new();
        let states = BTreeMap::from([("gone".to_string(), vec![1])]);
        assert_eq!(
            hooks.restore(Some((4, &states)), false),
            Err(Error::UnmappedMasterState { checkpoint_id: 4, hook: "gone".into() })
        );
        assert_eq!(hooks.restore(Some((4, &states)), true), Ok(()));
    }
}
