//! Counters for reports.

use std::fmt;

use crate::model::{Counters, PowerLossReport};

/// What a mounted file system has seen since it was mounted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `fsync` calls on files.
    pub fsyncs: u64,
    /// `fdatasync` calls on files.
    pub fdatasyncs: u64,
    /// `fsync` calls on directories.
    pub dir_fsyncs: u64,
    /// `write` calls.
    pub writes: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Power losses.
    pub power_losses: u64,
    /// Bytes dropped over all power losses.
    pub bytes_dropped_total: u64,
    /// What the last power loss discarded.
    pub last_power_loss: Option<PowerLossReport>,
}

impl Stats {
    pub(crate) fn new(counters: Counters, last: Option<PowerLossReport>, bytes_dropped_total: u64) -> Stats {
        Stats {
            fsyncs: counters.fsyncs,
            fdatasyncs: counters.fdatasyncs,
            dir_fsyncs: counters.dir_fsyncs,
            writes: counters.writes,
            bytes_written: counters.bytes_written,
            power_losses: counters.power_losses,
            bytes_dropped_total,
            last_power_loss: last,
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} writes ({} bytes), {} fsyncs, {} fdatasyncs, {} directory fsyncs, {} power losses \
             ({} bytes dropped in all)",
            self.writes,
            self.bytes_written,
            self.fsyncs,
            self.fdatasyncs,
            self.dir_fsyncs,
            self.power_losses,
            self.bytes_dropped_total
        )?;
        if let Some(last) = &self.last_power_loss {
            write!(f, "; last power loss: {last}")?;
        }
        Ok(())
    }
}

impl fmt::Display for PowerLossReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes dropped, {} files and {} directories lost, {} torn sectors kept and {} dropped, \
             {} durable entries dropped",
            self.bytes_dropped,
            self.files_lost,
            self.dirs_lost,
            self.sectors_torn_kept,
            self.sectors_torn_dropped,
            self.entries_dropped
        )
    }
}
