//! Making sled's writes durable.
//!
//! sled 0.34's `Db::flush`/`flush_async` write the log with `pwrite` and
//! `sync_file_range(2)`, never `fsync`, and sled never fsyncs a directory. `sync_file_range`
//! only starts write-back of the data pages: it does not write the file's metadata nor flush
//! the drive's cache, so it promises nothing across a power loss (and on file systems that
//! implement durability only through `fsync`, such as FUSE file systems, it does nothing).
//! sled's background flusher does call `fsync`, but only every `flush_every_ms`.
//!
//! So after every flush whose data is about to be acknowledged, [`DurableFiles::sync`]:
//! - fdatasyncs the `db` file (through a descriptor kept open for this): its data and size,
//!   not its timestamps;
//! - fdatasyncs every new file in `blobs/` (values too large to be stored inline, which sled
//!   writes without any sync) and then fsyncs the `blobs/` directory;
//! - fsyncs the data directory when the set of names in it changed (sled's own snapshot files
//!   `snap.*` are renamed into place and their predecessors removed without a directory sync).
//!
//! Several flushes waiting at once share one fsync: a caller whose flush completed before an
//! fsync started is covered by it.
//!
//! At open, the directory itself is made durable: [`create_dir_all_durably`] fsyncs every
//! directory it creates into its parent, and [`DurableFiles::open`] fsyncs sled's `conf`, `db`
//! and `blobs/`, the directory, and its parent.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// sled's data file.
const DB_FILE: &str = "db";
/// sled's configuration file, written once when the database is created.
const CONF_FILE: &str = "conf";
/// sled's directory of large values.
const BLOBS_DIR: &str = "blobs";

/// Why making the store durable failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot make {} durable: {source}", path.display())]
pub struct SyncError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> SyncError + '_ {
    move |source| SyncError { path: path.to_owned(), source }
}

/// Fsyncs a file or directory by path.
pub(crate) fn sync_path(path: &Path) -> Result<(), SyncError> {
    File::open(path).and_then(|f| f.sync_all()).map_err(at(path))
}

/// `create_dir_all`, durably: every directory it creates is fsynced into its parent.
pub(crate) fn create_dir_all_durably(dir: &Path) -> Result<(), SyncError> {
    // The directories that do not exist yet, outermost first.
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.as_os_str().is_empty() || path.try_exists().map_err(at(path))? {
            break;
        }
        missing.push(path.to_owned());
        cursor = path.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(at(dir))?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        sync_path(parent)?;
    }
    Ok(())
}

/// What has been synced, for noticing what changed since.
#[derive(Debug, Default)]
struct Synced {
    /// Names in the data directory as of its last fsync.
    dir_names: BTreeSet<OsString>,
    /// Blob files present at the last sync, with the size they had when fsynced (a blob that
    /// sled was still writing then is fsynced again once its size changed).
    blobs: BTreeMap<OsString, u64>,
    /// The highest flush ticket covered by a completed sync.
    covered: u64,
}

/// The files of one sled database that must be fsynced for its flushes to be durable.
#[derive(Debug)]
pub(crate) struct DurableFiles {
    dir: PathBuf,
    /// Kept open for fsync; sled's own descriptor is not reachable.
    db: File,
    /// Flush tickets handed out ([`DurableFiles::ticket`]).
    tickets: AtomicU64,
    synced: Mutex<Synced>,
}

impl DurableFiles {
    /// Opens the handles for the sled database in `dir` (opened by sled already), and makes
    /// everything sled created at open durable: `conf`, `db`, `blobs/` and the directory.
    pub(crate) fn open(dir: &Path) -> Result<Self, SyncError> {
        let db_path = dir.join(DB_FILE);
        let db = File::open(&db_path).map_err(at(&db_path))?;
        let files = Self {
            dir: dir.to_owned(),
            db,
            tickets: AtomicU64::new(0),
            synced: Mutex::new(Synced::default()),
        };
        let conf = dir.join(CONF_FILE);
        if conf.try_exists().map_err(at(&conf))? {
            sync_path(&conf)?;
        }
        files.db.sync_all().map_err(at(&db_path))?;
        {
            let mut synced = files.lock();
            files.sync_blobs(&mut synced)?;
            let blobs = dir.join(BLOBS_DIR);
            if blobs.try_exists().map_err(at(&blobs))? {
                sync_path(&blobs)?;
            }
            synced.dir_names = files.dir_names()?;
            sync_path(dir)?;
        }
        // The directory's own entry, in case someone else created it without syncing.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_path(parent)?;
        }
        Ok(files)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Synced> {
        // Every critical section leaves `Synced` consistent (sets are only extended after a
        // successful sync), so a poisoned lock is still usable.
        self.synced.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a ticket; call it after a flush completed, then [`DurableFiles::sync`] with it.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Makes everything flushed before `ticket` was taken durable. Blocking.
    pub(crate) fn sync(&self, ticket: u64) -> Result<(), SyncError> {
        let mut synced = self.lock();
        if synced.covered >= ticket {
            return Ok(());
        }
        // Every ticket handed out so far was taken after its flush completed, so this fsync
        // covers them all.
        let target = self.tickets.load(Ordering::SeqCst);
        // fdatasync: the data and the file's size, all a read needs; not its timestamps, whose
        // journal commit made every flush's sync a third slower on ext4.
        self.db.sync_data().map_err(at(&self.dir.join(DB_FILE)))?;
        self.sync_blobs(&mut synced)?;
        let names = self.dir_names()?;
        if names != synced.dir_names {
            sync_path(&self.dir)?;
            synced.dir_names = names;
        }
        synced.covered = synced.covered.max(target);
        Ok(())
    }

    fn dir_names(&self) -> Result<BTreeSet<OsString>, SyncError> {
        let entries = std::fs::read_dir(&self.dir).map_err(at(&self.dir))?;
        entries.map(|e| e.map(|e| e.file_name()).map_err(at(&self.dir))).collect()
    }

    /// Fsyncs blob files not synced yet (or grown since), then the blob directory if any was
    /// new.
    fn sync_blobs(&self, synced: &mut Synced) -> Result<(), SyncError> {
        let blobs = self.dir.join(BLOBS_DIR);
        let entries = match std::fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(at(&blobs)(e)),
        };
        let mut present = BTreeMap::new();
        let mut new = false;
        for entry in entries {
            let entry = entry.map_err(at(&blobs))?;
            let (name, path) = (entry.file_name(), entry.path());
            // The size is read before the fsync: an fsync covers every write made before it.
            let size = match entry.metadata() {
                Ok(meta) => meta.len(),
                // Removed by sled meanwhile (garbage collected): nothing to keep.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(at(&path)(e)),
            };
            if synced.blobs.get(&name) != Some(&size) {
                match File::open(&path).and_then(|f| f.sync_data()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(at(&path)(e)),
                }
            }
            new |= !synced.blobs.contains_key(&name);
            present.insert(name, size);
        }
        if new {
            sync_path(&blobs)?;
        }
        synced.blobs = present;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creating_nested_directories_durably_creates_them_all() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/c");
        create_dir_all_durably(&dir).unwrap();
        assert!(dir.is_dir());
        create_dir_all_durably(&dir).unwrap();
        let file = root.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(create_dir_all_durably(&file.join("below-a-file")).is_err());
    }

    #[test]
    fn sync_covers_earlier_tickets_and_notices_new_blobs_and_names() {
        let root = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(root.path()).flush_every_ms(None).open().unwrap();
        let files = DurableFiles::open(root.path()).unwrap();
        let first = files.ticket();
        let second = files.ticket();
        files.sync(first).unwrap();
        assert!(files.lock().covered >= second, "one fsync covers every ticket taken before it");
        files.sync(second).unwrap();

        // A value above sled's inline threshold goes to a blob file.
        db.insert(b"big", vec![7u8; 1 << 20]).unwrap();
        db.flush().unwrap();
        files.sync(files.ticket()).unwrap();
        assert!(!files.lock().blobs.is_empty(), "the blob was synced");
        std::fs::write(root.path().join("extra"), b"").unwrap();
        files.sync(files.ticket()).unwrap();
        assert!(files.lock().dir_names.contains(&OsString::from("extra")));
    }
}
