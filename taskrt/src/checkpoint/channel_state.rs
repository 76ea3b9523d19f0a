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

use crate::exchange::Record;
use crate::state::StateError;
use crate::state::storage::{CheckpointStorage, read_verified};

/// Where a channel stands in the recording of one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// Records are recorded until the boundary is known and reached.
    Recording { boundary: Option<u64> },
    /// Everything before the barrier was delivered.
    Done,
}

/// Records the in-flight records of one unaligned checkpoint.
#[derive(Debug)]
pub struct ChannelRecorder {
    checkpoint_id: u64,
    channels: Vec<Channel>,
    records: Vec<Record>,
}

impl ChannelRecorder {
    /// Starts recording for `checkpoint_id` with `delivered[c]` records delivered on each
    /// channel so far; `ended[c]` channels deliver nothing more.
    pub fn new(checkpoint_id: u64, delivered: &[u64], ended: &[bool]) -> Self {
        let channels = delivered
            .iter()
            .enumerate()
            .map(|(c, _)| {
                if ended.get(c).copied().unwrap_or(false) {
                    Channel::Done
                } else {
                    Channel::Recording { boundary: None }
                }
            })
            .collect();
        Self { checkpoint_id, channels, records: Vec::new() }
    }

    pub fn checkpoint_id(&self) -> u64 {
        self.checkpoint_id
    }

    /// The producer of `channel` sent `boundary` records before the barrier; `delivered` have
    /// been delivered on it so far.
    pub fn set_boundary(&mut self, channel: usize, boundary: u64, delivered: u64) {
        if let Some(ch) = self.channels.get_mut(channel)
            && *ch != Channel::Done
        {
            *ch = if delivered >= boundary {
                Channel::Done
            } else {
                Channel::Recording { boundary: Some(boundary) }
            };
        }
    }

    /// `channel` ended: nothing more arrives on it.
    pub fn channel_ended(&mut self, channel: usize) {
        if let Some(ch) = self.channels.get_mut(channel) {
            *ch = Channel::Done;
        }
    }

    /// A record was delivered on `channel` as its `index`-th record (0-based): keeps it when
    /// it precedes the channel's barrier.
    pub fn on_record(&mut self, channel: usize, index: u64, record: Record) {
        let Some(ch) = self.channels.get_mut(channel) else { return };
        match *ch {
            Channel::Done => {}
            Channel::Recording { boundary: None } => self.records.push(record),
            Channel::Recording { boundary: Some(b) } => {
                if index < b {
                    self.records.push(record);
                }
                if index + 1 >= b {
                    *ch = Channel::Done;
                }
            }
        }
    }

    /// Every channel delivered everything sent before its barrier.
    pub fn is_complete(&self) -> bool {
        self.channels.iter().all(|c| *c == Channel::Done)
    }

    /// Records kept so far.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn into_records(self) -> Vec<Record> {
        self.records
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
        // Two channels; 3 and 5 records delivered when the snapshot is taken.
        let mut r = ChannelRecorder::new(7, &[3, 5], &[false, false]);
        // Channel 0's barrier overtook two records (its producer sent 5 before it).
        r.set_boundary(0, 5, 3);
        r.on_record(1, 5, rec(100)); // boundary of channel 1 unknown yet: recorded
        r.on_record(0, 3, rec(1));
        assert!(!r.is_complete());
        r.on_record(0, 4, rec(2));
        r.on_record(0, 5, rec(3)); // after channel 0's barrier: not recorded
        // Channel 1's barrier arrives in-band after one more record.
        r.set_boundary(1, 6, 6);
        assert!(r.is_complete());
        assert_eq!(r.into_records(), vec![rec(100), rec(1), rec(2)]);
    }

    #[test]
    fn ended_channels_and_reached_boundaries_complete_at_once() {
        let mut r = ChannelRecorder::new(1, &[4, 0], &[false, true]);
        r.set_boundary(0, 4, 4);
        assert!(r.is_complete() && r.is_empty());
        let mut r = ChannelRecorder::new(2, &[0], &[false]);
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
