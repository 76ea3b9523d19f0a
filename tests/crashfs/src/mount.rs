//! The control API: mount, cut the power, inspect, unmount.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::error::Error;
use crate::image;
use crate::model::{Model, PowerLossReport, Tear, Tree};
use crate::session::{self, FuseSession, SessionConfig};
use crate::shared::{Shared, lock};
use crate::stats::Stats;

/// Torn writes at power loss: each unsynced 512-byte sector of a surviving file survives
/// with probability `keep_probability`, drawn from a generator seeded with `seed`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TornWrites {
    /// Seed of the generator (one generator per mount, drawn from at each power loss).
    pub seed: u64,
    /// Probability, in `[0, 1]`, that one unsynced sector survives.
    pub keep_probability: f64,
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Torn writes at power loss; `None` drops unsynced data whole.
    pub torn_writes: Option<TornWrites>,
    /// Where the durable state is kept on the real disk, for inspection and restarts. When set:
    /// at mount, `<backing_dir>/durable` (if it exists) is the initial state; after every power
    /// loss and at unmount, the durable state is written to `<backing_dir>/durable` as an
    /// ordinary directory tree (see [`image`](crate::image)). The directory is created.
    pub backing_dir: Option<PathBuf>,
    /// Mount with `fusermount3 -o auto_unmount`, so that the mount goes away even if this
    /// process is killed. Needs `allow_other`, which a non-root user may only use with
    /// `user_allow_other` in /etc/fuse.conf. Default: true.
    pub auto_unmount: bool,
    /// How long the kernel may cache entries and attributes. Default: one second (the kernel
    /// caches are dropped with the mount at each power loss).
    pub ttl: Duration,
    /// How long unmounting waits for the session thread of a mount still in use. Default: 5 s.
    pub unmount_timeout: Duration,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            torn_writes: None,
            backing_dir: None,
            auto_unmount: true,
            ttl: Duration::from_secs(1),
            unmount_timeout: Duration::from_secs(5),
        }
    }
}

/// Entry point: mounts crashfs.
#[derive(Debug)]
pub struct CrashFs;

impl CrashFs {
    /// Mounts an empty crashfs at `mountpoint` (an existing directory), or the durable state
    /// saved in `options.backing_dir`. The file system is served by a background thread of
    /// this process until [`MountedFs::unmount`] or drop.
    pub fn mount(mountpoint: &Path, options: MountOptions) -> Result<MountedFs, Error> {
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let saved = options.backing_dir.as_ref().map(|dir| dir.join("durable")).filter(|dir| dir.exists());
        let model = match saved {
            Some(dir) => {
                let tree = image::load(&dir)?;
                Model::from_tree(&tree, uid, gid)
                    .map_err(|error| Error::BadImage { path: dir.clone(), reason: error.to_string() })?
            }
            None => Model::new(uid, gid),
        };
        CrashFs::mount_model(mountpoint, model, options)
    }

    /// Mounts crashfs serving `model` (for instance [`Model::from_tree`] of a prepared tree).
    pub fn mount_model(mountpoint: &Path, model: Model, options: MountOptions) -> Result<MountedFs, Error> {
        let tear = match options.torn_writes {
            Some(torn) if !(0.0..=1.0).contains(&torn.keep_probability) => {
                return Err(Error::InvalidOption(format!(
                    "torn_writes.keep_probability must be within [0, 1], not {}",
                    torn.keep_probability
                )));
            }
            Some(torn) => Some((StdRng::seed_from_u64(torn.seed), torn.keep_probability)),
            None => None,
        };
        if let Some(dir) = &options.backing_dir {
            std::fs::create_dir_all(dir).map_err(|source| Error::Image { path: dir.clone(), source })?;
        }
        session::preflight(mountpoint, options.auto_unmount)?;
        let mountpoint = mountpoint
            .canonicalize()
            .map_err(|_| Error::MountpointMissing { mountpoint: mountpoint.to_owned() })?;
        let shared = Arc::new(Mutex::new(Shared {
            model,
            generation: 1,
            tear,
            last_power_loss: None,
            bytes_dropped_total: 0,
        }));
        let config = SessionConfig { auto_unmount: options.auto_unmount, ttl: options.ttl };
        let session = session::start(&mountpoint, &shared, 1, config)?;
        Ok(MountedFs {
            mountpoint,
            options,
            config,
            shared,
            session: Mutex::new(Some(session)),
            finished: false,
        })
    }
}

/// A mounted crashfs. Unmounts on drop (also while a test panics).
pub struct MountedFs {
    mountpoint: PathBuf,
    options: MountOptions,
    config: SessionConfig,
    shared: Arc<Mutex<Shared>>,
    /// The current FUSE session; `None` after unmount or after a failed remount.
    session: Mutex<Option<FuseSession>>,
    finished: bool,
}

impl std::fmt::Debug for MountedFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountedFs")
            .field("mountpoint", &self.mountpoint)
            .field("options", &self.options)
            .finish()
    }
}

impl MountedFs {
    /// The (canonical) mountpoint.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power: everything not durable is discarded, atomically. Kill every process
    /// using the mount first (and close this process's files in it): from the start of this
    /// call, requests to the old mount fail with `EIO`; it is unmounted (lazily if still in
    /// use), the volatile state becomes the durable state (torn, if configured), the durable
    /// state is saved to the backing directory (if any), and a fresh mount at the same
    /// mountpoint serves it, with no kernel caches left from before.
    pub fn power_loss(&self) -> Result<PowerLossReport, Error> {
        let mut slot = lock(&self.session);
        let generation = {
            let mut shared = lock(&self.shared);
            shared.generation += 1;
            shared.generation
        };
        let unmounted = match slot.take() {
            Some(old) => session::stop(&self.mountpoint, old, self.options.unmount_timeout),
            None => Ok(()),
        };
        let (report, survivors) = {
            let mut guard = lock(&self.shared);
            let shared = &mut *guard;
            let tear = match &mut shared.tear {
                Some((rng, keep_probability)) => Tear::Sectors { rng, keep_probability: *keep_probability },
                None => Tear::Never,
            };
            let report = shared.model.power_loss(tear);
            shared.last_power_loss = Some(report);
            shared.bytes_dropped_total += report.bytes_dropped;
            (report, self.options.backing_dir.as_ref().map(|_| shared.model.volatile_tree()))
        };
        unmounted?;
        if let (Some(dir), Some(tree)) = (&self.options.backing_dir, survivors) {
            image::save(&tree, &dir.join("durable"))?;
        }
        *slot = Some(session::start(&self.mountpoint, &self.shared, generation, self.config)?);
        Ok(report)
    }

    /// Counters since mount.
    pub fn stats(&self) -> Stats {
        let shared = lock(&self.shared);
        Stats::new(shared.model.counters(), shared.last_power_loss, shared.bytes_dropped_total)
    }

    /// What programs see now.
    pub fn volatile_tree(&self) -> Tree {
        lock(&self.shared).model.volatile_tree()
    }

    /// What would survive a power loss now (without torn writes).
    pub fn durable_tree(&self) -> Tree {
        lock(&self.shared).model.durable_tree()
    }

    /// Writes the durable state as a directory tree at `dir` (replaced if it exists), for
    /// inspection of a failed trial.
    pub fn save_durable(&self, dir: &Path) -> Result<(), Error> {
        image::save(&self.durable_tree(), dir)
    }

    /// Unmounts (lazily if something still uses the mount) and, with a backing directory,
    /// saves the durable state there.
    pub fn unmount(mut self) -> Result<(), Error> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        let session = lock(&self.session).take();
        lock(&self.shared).generation += 1;
        let unmounted = match session {
            Some(session) => session::stop(&self.mountpoint, session, self.options.unmount_timeout),
            None => Ok(()),
        };
        if let Some(dir) = &self.options.backing_dir {
            image::save(&self.durable_tree(), &dir.join("durable"))?;
        }
        unmounted
    }
}

impl Drop for MountedFs {
    fn drop(&mut self) {
        if let Err(error) = self.finish() {
            tracing::warn!(%error, "crashfs unmount on drop failed");
        }
    }
}
