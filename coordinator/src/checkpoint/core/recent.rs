//! Memory of recently finished checkpoints (bounded), so a late message for one of them is
//! told apart from a message for an id that is unknown, and its state can be resolved against
//! the right directory.

use std::collections::VecDeque;
use std::path::PathBuf;

use cairn_raft::model::CheckpointKind;

use crate::checkpoint::actions::FinishedOutcome;

/// One finished checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub id: u64,
    pub kind: CheckpointKind,
    pub outcome: FinishedOutcome,
    /// Directory its state handles resolve against.
    pub base_dir: PathBuf,
    /// Its own directory (`chk-<id>` or the savepoint directory).
    pub dir: PathBuf,
}

/// The last `capacity` finished checkpoints, oldest first.
#[derive(Debug, Clone)]
pub struct RecentCheckpoints {
    capacity: usize,
    entries: VecDeque<Finished>,
}

impl RecentCheckpoints {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, entries: VecDeque::with_capacity(capacity) }
    }

    pub fn remember(&mut self, finished: Finished) {
        if self.capacity == 0 {
            return;
        }
        self.entries.retain(|f| f.id != finished.id);
        while self.entries.len() >= self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(finished);
    }

    pub fn get(&self, id: u64) -> Option<&Finished> {
        self.entries.iter().find(|f| f.id == id)
    }
}
