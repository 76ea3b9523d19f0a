//! Channel state of unaligned checkpoints (FLIP-76): which in-flight records a checkpoint must
//! persist, and their file.
//!
//! When a task takes an unaligned checkpoint it snapshots its operators at once, although some
//! of its input channels still hold records their producers sent before the barrier. Those
//! records are processed normally, and also recorded: a [`ChannelRecorder`] knows per channel
//! how many records the producer sent before its barrier (the `records_before` of a priority
//! barrier, or the position of an in-band one), and records every record delivered after the
//! snapshot and before that boundary. Once every channel reached its boundary (or ended) the
//! recording is complete and written next to the checkpoint's other files. On restore the
//! records are replayed into the task before it reads any new input, so the snapshot of the
//! operators plus the channel state is exactly what a checkpoint aligned at that instant would
//! have held.

use std::path::Path;

use cairn_protocol::assign::ChannelStatePart;
use cairn_protocol::checkpoint::{ChannelStateHandle, StateFile};
use cairn_protocol::keygroups::key_group_of;

use crate::element::Record;
use crate::state::StateError;
use crate::state::storage::{CheckpointStorage, read_verified};

/// Where a channel stands in the recording of one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// Records are recorded until the boundary is known and reached.
    Recording { boundary: Option<u64> },
    /// Everything before the barrier was received.
    Done,
}

/// Records the in-flight records of one unaligned checkpoint.
///
/// Records are numbered per channel in the order they are received from the channel (0, 1,
/// ...); the input gate calls [`ChannelRecorder::on_record`] as it receives them, and the
/// recorder keeps those from the snapshot's delivered count up to the channel's boundary. A
/// record kept before its channel's boundary was known and found beyond it is dropped again.
#[derive(Debug)]
pub struct ChannelRecorder {
    checkpoint_id: u64,
    channels: Vec<Channel>,
    /// Per channel: (number, record) in receive order.
    records: Vec<Vec<(u64, Record)>>,
    /// Restored in-flight records not replayed yet when the checkpoint was taken: they precede
    /// everything the channels hold.
    recovered: Vec<Record>,
}

impl ChannelRecorder {
    /// Starts recording for `checkpoint_id` over `channels` channels.
    pub fn new(checkpoint_id: u64, channels: usize) -> Self {
        Self {
            checkpoint_id,
            channels: vec![Channel::Recording { boundary: None }; channels],
            records: vec![Vec::new(); channels],
            recovered: Vec::new(),
        }
    }

    /// Restored in-flight records still to be replayed when the checkpoint was taken.
    pub fn set_recovered(&mut self, records: Vec<Record>) {
        self.recovered = records;
    }

    pub fn checkpoint_id(&self) -> u64 {
        self.checkpoint_id
    }

    /// The producer of `channel` sent `boundary` records before the barrier; `received` have
    /// been received from it so far.
    pub fn set_boundary(&mut self, channel: usize, boundary: u64, received: u64) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        if *ch == Channel::Done {
            return;
        }
        if let Some(kept) = self.records.get_mut(channel) {
            kept.retain(|(n, _)| *n < boundary);
        }
        *ch = if received >= boundary {
            Channel::Done
        } else {
            Channel::Recording { boundary: Some(boundary) }
        };
    }

    /// `channel` ended: nothing more arrives on it.
    pub fn channel_ended(&mut self, channel: usize) {
        if let Some(ch) = self.channels.get_mut(channel) {
            *ch = Channel::Done;
        }
    }

    /// The boundary of `channel`, once known (`None` also once it is done).
    pub fn boundary(&self, channel: usize) -> Option<u64> {
        match self.channels.get(channel) {
            Some(Channel::Recording { boundary }) => *boundary,
            _ => None,
        }
    }

    /// Whether `channel` still waits for records before its barrier (or for its boundary).
    pub fn is_recording(&self, channel: usize) -> bool {
        matches!(self.channels.get(channel), Some(Channel::Recording { .. }))
    }

    /// Record number `n` of `channel` was received: kept when it precedes the channel's barrier
    /// (or while that is not known).
    pub fn on_record(&mut self, channel: usize, n: u64, record: Record) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        let Channel::Recording { boundary } = *ch else { return };
        if boundary.is_none_or(|b| n < b)
            && let Some(kept) = self.records.get_mut(channel)
        {
            kept.push((n, record));
        }
        if boundary.is_some_and(|b| n + 1 >= b) {
            *ch = Channel::Done;
        }
    }

    /// Every channel received everything sent before its barrier.
    pub fn is_complete(&self) -> bool {
        self.channels.iter().all(|c| *c == Channel::Done)
    }

    /// Records kept so far.
    pub fn len(&self) -> usize {
        self.recovered.len() + self.records.iter().map(Vec::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records kept: the restored ones not replayed yet, then channel by channel, each
    /// channel's in order.
    pub fn into_records(self) -> Vec<Record> {
        let mut out = self.recovered;
        out.extend(self.records.into_iter().flatten().map(|(_, r)| r));
        out
    }
}

/// Version of the channel-state file format.
const FORMAT_VERSION: u32 = 1;
const RECORD_BYTES: usize = 24;

/// `u32 version | (u64 key, u64 value, u64 seq)*`, little endian.
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + records.len() * RECORD_BYTES);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    for r in records {
        out.extend_from_slice(&r.key.to_le_bytes());
        out.extend_from_slice(&r.value.to_le_bytes());
        out.extend_from_slice(&r.seq.to_le_bytes());
    }
    out
}

/// Decodes a channel-state file; `path` names it in errors.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<Record>, StateError> {
    let corrupt = |reason: String| StateError::Corrupt { path: path.to_owned(), reason };
    let (version, body) =
        bytes.split_at_checked(4).ok_or_else(|| corrupt("shorter than its header".into()))?;
    let version = u32::from_le_bytes([version[0], version[1], version[2], version[3]]);
    if version != FORMAT_VERSION {
        return Err(corrupt(format!("channel-state format {version}, this worker reads {FORMAT_VERSION}")));
    }
    if body.len() % RECORD_BYTES != 0 {
        return Err(corrupt(format!("{} bytes of records is not a multiple of {RECORD_BYTES}", body.len())));
    }
    let u64_at = |chunk: &[u8], at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&chunk[at..at + 8]);
        u64::from_le_bytes(b)
    };
    Ok(body
        .chunks_exact(RECORD_BYTES)
        .map(|c| Record { key: u64_at(c, 0), value: u64_at(c, 8), seq: u64_at(c, 16) })
        .collect())
}

/// Writes `records` durably as `rel` under `base_dir` and returns the handle.
pub fn write(
    storage: &CheckpointStorage,
    base_dir: &Path,
    rel: String,
    records: &[Record],
) -> Result<ChannelStateHandle, StateError> {
    let bytes = encode(records);
    let abs = base_dir.join(&rel);
    storage.write_file(&abs, &bytes)?;
    if let Some(dir) = abs.parent() {
        storage.sync_dir(dir)?;
    }
    let file = StateFile { path: rel, size: bytes.len() as u64, crc32: crc32fast::hash(&bytes) };
    Ok(ChannelStateHandle { file, records: records.len() as u64 })
}

/// Reads the records a restoring subtask replays: each part verified, filtered by key group
/// after rescaling.
pub fn read(base_dir: &Path, parts: &[ChannelStatePart]) -> Result<Vec<Record>, StateError> {
    let mut out = Vec::new();
    for part in parts {
        let bytes = read_verified(base_dir, &part.file)?;
        let records = decode(&base_dir.join(&part.file.path), &bytes)?;
        match part.only {
            None => out.extend(records),
            Some(f) => out.extend(
                records.into_iter().filter(|r| f.range.contains(key_group_of(r.key, f.max_parallelism))),
            ),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: u64) -> Record {
        Record { key, value: key.wrapping_mul(10), seq: key }
    }

    #[test]
    fn records_only_what_precedes_each_channels_barrier() {
        // Two channels; records are numbered in receive order from the snapshot's delivered count.
        let mut r = ChannelRecorder::new(7, 2);
        // Channel 0's barrier overtook two records (its producer sent 5 before it; 3 received).
        r.set_boundary(0, 5, 3);
        r.on_record(1, 5, rec(100)); // boundary of channel 1 unknown yet: kept
        r.on_record(1, 6, rec(101)); // kept for now
        r.on_record(0, 3, rec(1));
        assert!(!r.is_complete());
        r.on_record(0, 4, rec(2));
        assert!(!r.is_recording(0), "channel 0 reached its boundary");
        r.on_record(0, 5, rec(3)); // after channel 0's barrier: not kept
        // Channel 1's barrier shows it was sent after 6 records: 101 came after it.
        r.set_boundary(1, 6, 7);
        assert!(r.is_complete());
        assert_eq!(r.into_records(), vec![rec(1), rec(2), rec(100)]);
    }

    #[test]
    fn ended_channels_and_reached_boundaries_complete_at_once() {
        let mut r = ChannelRecorder::new(1, 2);
        r.set_boundary(0, 4, 4);
        r.channel_ended(1);
        assert!(r.is_complete() && r.is_empty());
        let mut r = ChannelRecorder::new(2, 1);
        r.on_record(0, 0, rec(9));
        r.channel_ended(0);
        assert!(r.is_complete());
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn files_round_trip_and_damage_is_named() {
        let records = vec![rec(1), rec(u64::MAX)];
        let bytes = encode(&records);
        let path = Path::new("chk-3/x.channels");
        assert_eq!(decode(path, &bytes).unwrap(), records);
        let err = decode(path, &bytes[..bytes.len() - 1]).unwrap_err().to_string();
        assert!(err.contains("not a multiple of 24"), "{err}");
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(decode(path, &other).unwrap_err().to_string().contains("format 9"));
        assert!(decode(path, &[1]).is_err());
    }
}
