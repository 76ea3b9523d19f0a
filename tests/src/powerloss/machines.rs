//! The machines of a trial, each a crashfs mount that can lose power: one per replica (its
//! data directory), one for the checkpoint storage (checkpoints and savepoints, shared by the
//! replicas and the worker as a network file system would be) and one for the sink's output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cairn_crashfs::{CrashFs, MountOptions, MountedFs, PowerLossReport, TornWrites};
use tempfile::TempDir;

use super::schedule::Schedule;

/// A mount and what lives on it.
pub struct Machine {
    pub name: String,
    pub fs: MountedFs,
}

impl Machine {
    pub fn path(&self, relative: &str) -> PathBuf {
        self.fs.mountpoint().join(relative)
    }

    /// Writes what the machine's programs see now as an ordinary directory tree at `dir` (for
    /// inspection without touching the mount, and for a failed trial's artifacts).
    pub fn copy_to(&self, dir: &Path) -> anyhow::Result<()> {
        cairn_crashfs::image::save(&self.fs.volatile_tree(), dir)?;
        Ok(())
    }

    pub fn power_loss(&self) -> anyhow::Result<PowerLossReport> {
        Ok(self.fs.power_loss()?)
    }
}

/// Every mount of a trial. Unmounted on drop (kill the processes first).
pub struct Machines {
    pub replicas: BTreeMap<u64, Machine>,
    pub checkpoints: Machine,
    pub output: Machine,
    /// Mountpoints; removed after the mounts are gone (fields drop in order).
    _dir: TempDir,
}

impl Machines {
    /// Mounts one crashfs per replica `1..=replicas`, plus checkpoint storage and output.
    pub fn mount(replicas: u64, schedule: &Schedule) -> anyhow::Result<Machines> {
        let dir = tempfile::Builder::new().prefix("cairn-powerloss-").tempdir()?;
        let mount = |name: &str, number: u64| -> anyhow::Result<Machine> {
            let mountpoint = dir.path().join(name);
            std::fs::create_dir(&mountpoint)?;
            let torn_writes = schedule
                .torn_for(number)
                .map(|t| TornWrites { seed: t.seed, keep_probability: t.keep_probability });
            let options = MountOptions { torn_writes, ..MountOptions::default() };
            let fs = CrashFs::mount(&mountpoint, options)?;
            Ok(Machine { name: name.to_owned(), fs })
        };
        let mut nodes = BTreeMap::new();
        for id in 1..=replicas {
            nodes.insert(id, mount(&format!("replica-{id}"), id)?);
        }
        let checkpoints = mount("storage", 100)?;
        let output = mount("output", 101)?;
        Ok(Machines { replicas: nodes, checkpoints, output, _dir: dir })
    }

    /// The data directory of replica `id` (created by the replica itself, two levels below the
    /// mountpoint, so that creating it must be made durable too).
    pub fn data_dir(&self, id: u64) -> Option<PathBuf> {
        self.replicas.get(&id).map(|m| m.path(&format!("cairn/node-{id}")))
    }

    pub fn checkpoint_dir(&self) -> PathBuf {
        self.checkpoints.path("checkpoints")
    }

    pub fn savepoint_dir(&self) -> PathBuf {
        self.checkpoints.path("savepoints")
    }

    pub fn output_dir(&self) -> PathBuf {
        self.output.path("out")
    }

    /// All mounts.
    pub fn all(&self) -> impl Iterator<Item = &Machine> {
        self.replicas.values().chain([&self.checkpoints, &self.output])
    }
}
