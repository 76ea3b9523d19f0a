//! The durability rules: what `fsync` makes durable, and what a power loss keeps.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::{Rng, RngCore};

use super::node::{Content, Inode, Live};
use super::{FsError, Ino, Model, ROOT_INO, SECTOR_SIZE};

/// Whether, and how, unsynced writes tear at a power loss.
pub enum Tear<'a> {
    /// Unsynced data is dropped whole: files come back exactly as last synced.
    Never,
    /// Each unsynced 512-byte sector of a surviving file independently survives with
    /// probability `keep_probability` (clamped to `[0, 1]`), drawn from `rng`.
    Sectors {
        /// Source of the draws (seed it for reproducible trials).
        rng: &'a mut dyn RngCore,
        /// Probability that one unsynced sector survives.
        keep_probability: f64,
    },
}

/// What one power loss discarded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerLossReport {
    /// Bytes of file contents programs could read before the cut that read differently (or
    /// not at all) after it: unsynced writes, unsynced truncations' lost data, lost files.
    pub bytes_dropped: u64,
    /// Regular files (and symlinks) that had a name before the cut and have none after.
    pub files_lost: u64,
    /// Directories that had a name before the cut and have none after.
    pub dirs_lost: u64,
    /// Unsynced sectors that survived (torn writes).
    pub sectors_torn_kept: u64,
    /// Unsynced sectors that were dropped while torn writes were enabled.
    pub sectors_torn_dropped: u64,
    /// Durable entries that could not be kept: a second name of a directory (the durable
    /// state can hold one when a directory was moved and only one of the two parents was
    /// fsynced), or a cycle of directories.
    pub entries_dropped: u64,
}

impl Model {
    /// `fsync` (`datasync == false`) or `fdatasync` (`datasync == true`) of a file: its current
    /// data and size become durable; a full `fsync` also makes its metadata (permissions,
    /// owner, times) durable. Its names do not: they are durable when their directories are
    /// synced. On a directory this is [`Model::fsync_dir`].
    pub fn fsync(&mut self, ino: Ino, datasync: bool) -> Result<(), FsError> {
        let live = self.live(ino)?;
        if matches!(live.inode.content, Content::Dir(_)) {
            return self.fsync_dir(ino);
        }
        let synced = live.inode.clone();
        let durable = self.durable.entry(ino).or_insert_with(|| shell(&synced));
        durable.content = synced.content;
        if datasync {
            self.counters.fdatasyncs += 1;
        } else {
            durable.meta = synced.meta;
            self.counters.fsyncs += 1;
        }
        Ok(())
    }

    /// `fsync` of a directory: its current entries (name → inode) and metadata become durable.
    /// An inode that gets its first durable name this way, without ever having been synced
    /// itself, survives empty (a file with no data, a directory with no entries).
    pub fn fsync_dir(&mut self, ino: Ino) -> Result<(), FsError> {
        let live = self.live(ino)?;
        let Content::Dir(entries) = &live.inode.content else {
            return Err(FsError::NotDir);
        };
        let children: Vec<Ino> = entries.values().copied().collect();
        let synced = live.inode.clone();
        for child in children {
            if !self.durable.contains_key(&child)
                && let Some(child_live) = self.live.get(&child)
            {
                self.durable.insert(child, shell(&child_live.inode));
            }
        }
        self.durable.insert(ino, synced);
        self.counters.dir_fsyncs += 1;
        self.collect_durable_garbage();
        Ok(())
    }

    /// A power cut: the volatile state becomes what is reachable from the durable root
    /// through durable directory entries, each inode with its durable contents (torn with
    /// unsynced sectors if `tear` says so). Kernel references are forgotten: the file system
    /// must be mounted anew.
    pub fn power_loss(&mut self, tear: Tear<'_>) -> PowerLossReport {
        let mut report = PowerLossReport::default();
        let (reachable, parents, links) = self.durable_namespace(&mut report);
        if let Tear::Sectors { rng, keep_probability } = tear {
            let keep_probability =
                if keep_probability.is_nan() { 0.0 } else { keep_probability.clamp(0.0, 1.0) };
            for ino in &reachable {
                let (Some(live), Some(durable)) = (self.live.get(ino), self.durable.get_mut(ino)) else {
                    continue;
                };
                if let (Content::File(volatile), Content::File(synced)) =
                    (&live.inode.content, &mut durable.content)
                {
                    tear_sectors(synced, volatile, rng, keep_probability, &mut report);
                }
            }
        }
        let mut live = BTreeMap::new();
        for ino in &reachable {
            if let Some(inode) = self.durable.get(ino) {
                let entry = Live {
                    inode: inode.clone(),
                    links: links.get(ino).copied().unwrap_or(1),
                    parent: parents.get(ino).copied().unwrap_or(ROOT_INO),
                    lookups: 0,
                };
                live.insert(*ino, entry);
            }
        }
        self.count_losses(&live, &mut report);
        self.live = live;
        self.durable.retain(|ino, _| reachable.contains(ino));
        self.counters.power_losses += 1;
        report
    }

    /// Walks the durable namespace from the root, dropping (from the durable state too) the
    /// entries that cannot survive: entries to unknown inodes, second names of directories.
    /// Returns the reachable inodes, each directory's parent and each inode's link count.
    fn durable_namespace(
        &mut self,
        report: &mut PowerLossReport,
    ) -> (BTreeSet<Ino>, BTreeMap<Ino, Ino>, BTreeMap<Ino, u32>) {
        let mut reachable = BTreeSet::from([ROOT_INO]);
        let mut parents = BTreeMap::from([(ROOT_INO, ROOT_INO)]);
        let mut links = BTreeMap::from([(ROOT_INO, 1)]);
        let mut queue = VecDeque::from([ROOT_INO]);
        while let Some(dir) = queue.pop_front() {
            let Some(Content::Dir(entries)) = self.durable.get(&dir).map(|inode| inode.content.clone())
            else {
                continue;
            };
            let mut kept = BTreeMap::new();
            for (name, child) in entries {
                let child_is_dir = match self.durable.get(&child) {
                    None => {
                        report.entries_dropped += 1;
                        continue;
                    }
                    Some(inode) => matches!(inode.content, Content::Dir(_)),
                };
                if child_is_dir {
                    if !reachable.insert(child) {
                        report.entries_dropped += 1;
                        continue;
                    }
                    parents.insert(child, dir);
                    links.insert(child, 1);
                    queue.push_back(child);
                } else {
                    reachable.insert(child);
                    *links.entry(child).or_insert(0) += 1;
                }
                kept.insert(name, child);
            }
            if let Some(inode) = self.durable.get_mut(&dir) {
                inode.content = Content::Dir(kept);
            }
        }
        (reachable, parents, links)
    }

    /// Adds to `report` what programs could see before the cut and cannot after it.
    fn count_losses(&self, after: &BTreeMap<Ino, Live>, report: &mut PowerLossReport) {
        for (ino, before) in &self.live {
            if before.links == 0 {
                continue;
            }
            let survivor = after.get(ino);
            match &before.inode.content {
                Content::File(data) => {
                    let kept: &[u8] = match survivor.map(|live| &live.inode.content) {
                        Some(Content::File(kept)) => kept,
                        _ => &[],
                    };
                    let differing = data.iter().enumerate().filter(|(i, byte)| kept.get(*i) != Some(byte));
                    report.bytes_dropped += differing.count() as u64;
                    if survivor.is_none() {
                        report.files_lost += 1;
                    }
                }
                Content::Symlink(_) if survivor.is_none() => report.files_lost += 1,
                Content::Dir(_) if survivor.is_none() => report.dirs_lost += 1,
                _ => {}
            }
        }
    }

    /// Drops durable inodes that can no longer matter: not reachable from the durable root
    /// and not live (only a live inode can get a durable name by a later directory fsync).
    fn collect_durable_garbage(&mut self) {
        let mut reachable = BTreeSet::from([ROOT_INO]);
        let mut queue = VecDeque::from([ROOT_INO]);
        while let Some(dir) = queue.pop_front() {
            if let Some(Inode { content: Content::Dir(entries), .. }) = self.durable.get(&dir) {
                for child in entries.values() {
                    if reachable.insert(*child) {
                        queue.push_back(*child);
                    }
                }
            }
        }
        let live = &self.live;
        self.durable.retain(|ino, _| reachable.contains(ino) || live.contains_key(ino));
    }
}

/// The durable form of an inode that was never synced itself.
fn shell(inode: &Inode) -> Inode {
    Inode { content: inode.content.empty_like(), meta: inode.meta }
}

/// Torn writes: each sector where `volatile` differs from `synced` survives (is copied into
/// `synced`) with probability `keep`. Only sectors within the volatile size count; the file
/// grows to cover a surviving sector past its synced size, and never shrinks.
fn tear_sectors(
    synced: &mut Vec<u8>,
    volatile: &[u8],
    rng: &mut dyn RngCore,
    keep: f64,
    report: &mut PowerLossReport,
) {
    for start in (0..volatile.len()).step_by(SECTOR_SIZE) {
        let end = (start + SECTOR_SIZE).min(volatile.len());
        let new = &volatile[start..end];
        let old = synced.get(start..end.min(synced.len())).unwrap_or(&[]);
        if new == old {
            continue;
        }
        if rng.gen_bool(keep) {
            if synced.len() < end {
                synced.resize(end, 0);
            }
            synced[start..end].copy_from_slice(new);
            report.sectors_torn_kept += 1;
        } else {
            report.sectors_torn_dropped += 1;
        }
    }
}
