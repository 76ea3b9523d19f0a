//! What travels on a data channel: records, barriers, markers, and the priority barriers of a
//! channel's priority lane. Plain data, shared by the exchange, the network codec and the
//! checkpointing code (see `exchange` for how it travels).

use serde::{Deserialize, Serialize};

use cairn_protocol::messages::CheckpointOptions;

/// A data record. Records are plain `u64` triples, which is all the demo pipeline and the
/// benchmarks need and keeps the hot path allocation-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Record {
    /// Partitioning key (hash edges, keyed state).
    pub key: u64,
    pub value: u64,
    /// Provenance: the per-key sequence number of the source record this one derives from.
    pub seq: u64,
}

/// A checkpoint barrier as it travels through the data channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Barrier {
    pub checkpoint_id: u64,
    pub timestamp_ms: u64,
    pub options: CheckpointOptions,
}

/// What travels on a data channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamElement {
    Record(Record),
    /// Event time: no record with a smaller timestamp follows on this channel.
    Watermark(u64),
    Barrier(Barrier),
    /// The producer declined this checkpoint: do not wait for its barrier.
    CancelMarker(u64),
    /// The producer emits no more records; barriers and cancel markers still follow until
    /// `EndOfInput` (it waits for its final checkpoint, which crosses this channel).
    EndOfData,
    /// The producer finished; nothing follows.
    EndOfInput,
}

/// A barrier on a channel's priority lane: an unaligned barrier, or the announcement of an
/// aligned one (which follows in the data channel) that may turn unaligned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityBarrier {
    pub barrier: Barrier,
    /// Records the producer sent on this channel before the barrier.
    pub records_before: u64,
}

/// Wall-clock milliseconds since the epoch, the clock of barrier timestamps (set where the
/// checkpoint was triggered, possibly on another machine).
pub(crate) fn now_ms() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
