//! Series that several owners share for a while.
//!
//! A job restarted on a worker (a new task attempt) or a job driver of a new leader term may
//! start before the previous owner of the same series (same labels) has gone. Each owner
//! [`SeriesOwners::acquire`]s the labels and [`SeriesOwners::release`]s them when it ends; the
//! series are created by the first owner and removed by the last, both under one short lock,
//! so an owner never holds handles that are no longer in the registry.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// Reference counts of label sets. Cheap to clone (shared).
#[derive(Debug)]
pub struct SeriesOwners<L> {
    counts: Arc<Mutex<HashMap<L, usize>>>,
}

impl<L> Clone for SeriesOwners<L> {
    fn clone(&self) -> Self {
        Self { counts: self.counts.clone() }
    }
}

impl<L> Default for SeriesOwners<L> {
    fn default() -> Self {
        Self { counts: Arc::new(Mutex::new(HashMap::new())) }
    }
}

impl<L: Clone + Hash + Eq> SeriesOwners<L> {
    /// Registers one more owner of `labels`; `create` (which gets or creates the series and
    /// returns their handles) runs under the lock.
    pub fn acquire<T>(&self, labels: &L, create: impl FnOnce() -> T) -> T {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry(labels.clone()).or_insert(0) += 1;
        create()
    }

    /// Releases one owner of `labels`; the last one runs `remove` (removing the series) under
    /// the lock.
    pub fn release(&self, labels: &L, remove: impl FnOnce()) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(n) = counts.get_mut(labels) else { return };
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(labels);
            remove();
        }
    }

    /// Whether both share the same counts.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.counts, &other.counts)
    }

    /// How many owners `labels` has.
    pub fn owners(&self, labels: &L) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).get(labels).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_owner_removes() {
        let owners = SeriesOwners::<String>::default();
        let key = "a".to_owned();
        owners.acquire(&key, || ());
        owners.acquire(&key, || ());
        let mut removed = 0;
        owners.release(&key, || removed += 1);
        assert_eq!((removed, owners.owners(&key)), (0, 1));
        owners.release(&key, || removed += 1);
        assert_eq!((removed, owners.owners(&key)), (1, 0));
        // A stray release changes nothing.
        owners.release(&key, || removed += 1);
        assert_eq!(removed, 1);
    }
}
