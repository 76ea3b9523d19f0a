//! A long-running node's storage stays bounded when the log is purged behind snapshots.
//!
//! 20,000 `AllocateCheckpointId` entries are appended in batches of 100 and applied; every
//! 1,000 entries a snapshot is built and the log purged up to 500 entries behind it, as
//! openraft does with `max_in_snapshot_log_to_keep = 500`.
//!
//! Measured (sled 0.34, ext4, default `StorageOptions`): the directory grows while the first
//! segments fill (0.48 MB after 1k entries, 2.3 MB after 4k) and then plateaus at 2,621,525
//! bytes (five 512 KiB log segments + `conf` + the marker) for the rest of the run; longer
//! runs (100k entries, with or without reopening every 5k) stay at that plateau. Without
//! purging, the same run reaches 6.98 MB and grows linearly (~260 bytes per entry). sled
//! reuses a segment once every page in it has been rewritten or freed, so the size is set by
//! the live working set (up to 1,600 log entries plus the rewritten job and meta rows),
//! not by the number of entries ever written. `LowSpace` vs `HighThroughput` and the cache
//! size made no measurable difference for this workload.
//!
//! The bound below, 8 segments (4 MiB), leaves room for sled's segment rotation while being
//! far below what the unpurged run needs, and growth over the second half of the run must
//! stay within one segment.

mod common;

use std::time::Instant;

use cairn_storage::open;
use common::*;
use openraft::RaftSnapshotBuilder;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use tempfile::TempDir;

const TOTAL: u64 = 20_000;
const BATCH: u64 = 100;
const SNAPSHOT_EVERY: u64 = 1_000;
const KEEP: u64 = 500;

const SEGMENT: u64 = 512 * 1024;
const MAX_DIR_BYTES: u64 = 8 * SEGMENT;
const MAX_LOG_ENTRIES: usize = (KEEP + SNAPSHOT_EVERY + BATCH) as usize;

#[tokio::test]
async fn log_and_directory_stay_bounded() {
    let dir = TempDir::new().unwrap();
    let started = Instant::now();
    let (mut log, mut sm) = open(dir.path()).unwrap();

    let first = vec![membership(1, 1, &[1]), normal(1, 2, register("job"))];
    append(&mut log, first.clone()).await;
    sm.apply(first).await.unwrap();

    let mut next = 3;
    let mut max_entries = 0;
    let mut sizes = Vec::new();
    while next <= TOTAL {
        let batch: Vec<_> = (next..next + BATCH).map(|i| normal(1, i, allocate("job"))).collect();
        next += BATCH;
        append(&mut log, batch.clone()).await;
        let last = batch.last().map(|e| e.log_id);
        sm.apply(batch).await.unwrap();
        log.save_committed(last).await.unwrap();
        max_entries = max_entries.max(log.entry_count());

        let applied = next - 1;
        if applied % SNAPSHOT_EVERY < BATCH {
            let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
            let upto = snapshot.meta.last_log_id.unwrap().index - KEEP;
            log.purge(log_id(1, upto)).await.unwrap();
            log.purged_entries_deleted(upto).await;
            assert_eq!(log.entry_count() as u64, KEEP);
            sizes.push((applied, dir_size(dir.path())));
        }
    }

    let last_applied = sm.reader().last_applied().unwrap().index;
    assert_eq!(last_applied, TOTAL + 2);
    assert_eq!(sm.reader().job(&job_id("job")).unwrap().next_checkpoint_id, TOTAL + 1);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(1, TOTAL + 2)));

    eprintln!("elapsed {:?}, max log entries {max_entries}", started.elapsed());
    for (applied, size) in &sizes {
        eprintln!("applied {applied:>6}: {size:>9} bytes");
    }
    for file in dir_listing(dir.path()) {
        eprintln!("{file:?}");
    }

    assert!(max_entries <= MAX_LOG_ENTRIES, "log tree held {max_entries} entries");
    let max_size = sizes.iter().map(|(_, s)| *s).max().unwrap_or(0);
    assert!(max_size <= MAX_DIR_BYTES, "directory reached {max_size} bytes (bound {MAX_DIR_BYTES})");
    let half = sizes.len() / 2;
    let first_half = sizes[..half].iter().map(|(_, s)| *s).max().unwrap_or(0);
    let second_half = sizes[half..].iter().map(|(_, s)| *s).max().unwrap_or(0);
    assert!(
        second_half <= first_half + SEGMENT,
        "directory kept growing: {first_half} bytes in the first half, {second_half} in the second"
    );
}
