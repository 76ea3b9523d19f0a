//! The state shared by the control API and every FUSE session.

use std::sync::{Mutex, MutexGuard, PoisonError};

use rand::rngs::StdRng;

use crate::model::{Model, PowerLossReport};

/// The state shared by the control API and every session.
pub(crate) struct Shared {
    pub(crate) model: Model,
    /// Bumped at every power loss and at unmount: requests of older sessions fail.
    pub(crate) generation: u64,
    /// Source of torn-write draws, with the probability of keeping one unsynced sector.
    pub(crate) tear: Option<(StdRng, f64)>,
    pub(crate) last_power_loss: Option<PowerLossReport>,
    pub(crate) bytes_dropped_total: u64,
}

/// Locks a mutex, going on with the data of a panicked holder (every model operation leaves
/// the model consistent, or fails before changing it).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
