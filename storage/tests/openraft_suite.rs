//! Runs openraft's own storage test suite against the sled stores.

use cairn_raft::TypeConfig;
use cairn_raft::types::StorageError;
use cairn_storage::{LogStore, StateMachineStore};
use openraft::StorageIOError;
use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

/// Builds a fresh pair of stores in a new temporary directory; the directory lives as long as
/// the returned guard.
struct SledStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for SledStoreBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let (log, sm) = cairn_storage::open(dir.path()).map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, sm))
    }
}

/// `Suite::test_all` runs every case on its own runtime, so this is a plain test.
#[test]
fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(SledStoreBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
