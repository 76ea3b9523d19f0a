//! The faults, as Docker operations on the compose project's containers, and the checkpoint
//! volume filler.
//!
//! Every operation runs the `docker` CLI (bounded by a timeout) and fails with its stderr.
//! Containers are addressed by name, never by pattern, so nothing outside the project is
//! touched. The filler writes one file into the volume's host directory (the chaos run is
//! root on the Docker host) and refuses volumes larger than [`MAX_FILL_BYTES`], so a
//! misconfigured run can never fill the host's disk.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

/// A volume with more free space than this is not filled (the chaos compose file mounts the
/// checkpoint volume as a size-limited tmpfs).
pub const MAX_FILL_BYTES: u64 = 4 << 30;
/// Name of the filler file inside the volume.
pub const FILL_FILE: &str = ".cairn-chaos-fill";
/// Bound on one `docker` command.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `docker <args>` and returns its trimmed stdout.
pub async fn docker(args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::new("docker");
    cmd.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(DOCKER_TIMEOUT, cmd.output())
        .await
        .with_context(|| format!("docker {} took longer than {DOCKER_TIMEOUT:?}", args.join(" ")))?
        .with_context(|| "cannot run docker (is the Docker CLI installed and on PATH?)".to_owned())?;
    if !out.status.success() {
        bail!(
            "docker {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub async fn kill(container: &str) -> anyhow::Result<()> {
    docker(&["kill", "-s", "KILL", container]).await.map(drop)
}

/// Starts a stopped container (a no-op for a running one, e.g. one its restart policy brought
/// back already).
pub async fn start(container: &str) -> anyhow::Result<()> {
    docker(&["start", container]).await.map(drop)
}

pub async fn pause(container: &str) -> anyhow::Result<()> {
    docker(&["pause", container]).await.map(drop)
}

pub async fn unpause(container: &str) -> anyhow::Result<()> {
    docker(&["unpause", container]).await.map(drop)
}

/// SIGTERM, up to 10 s for a clean stop, then start with the same data.
pub async fn restart(container: &str) -> anyhow::Result<()> {
    docker(&["restart", "-t", "10", container]).await.map(drop)
}

pub async fn disconnect(network: &str, container: &str) -> anyhow::Result<()> {
    docker(&["network", "disconnect", "-f", network, container]).await.map(drop)
}

/// Reconnects a container with its DNS aliases (the compose service name), so peers that
/// address it by name find it again.
pub async fn connect(network: &str, container: &str, aliases: &[String]) -> anyhow::Result<()> {
    let mut args = vec!["network", "connect"];
    for a in aliases {
        args.push("--alias");
        args.push(a);
    }
    args.push(network);
    args.push(container);
    docker(&args).await.map(drop)
}

/// What is true right now of a container: paused? running? its address and aliases on
/// `network` (`None` when disconnected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    pub running: bool,
    pub paused: bool,
    pub ip: Option<String>,
    pub aliases: Vec<String>,
}

pub async fn inspect(container: &str, network: &str) -> anyhow::Result<ContainerState> {
    let json = docker(&["inspect", container]).await?;
    let v: serde_json::Value =
        serde_json::from_str(&json).with_context(|| format!("docker inspect {container}: not JSON"))?;
    let c = v.get(0).with_context(|| format!("docker inspect {container}: empty answer"))?;
    let state = &c["State"];
    let net = &c["NetworkSettings"]["Networks"][network];
    let ip = net["IPAddress"].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let aliases = net["Aliases"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    Ok(ContainerState {
        running: state["Running"].as_bool().unwrap_or(false),
        paused: state["Paused"].as_bool().unwrap_or(false),
        ip,
        aliases,
    })
}

/// Fills the file system holding `dir` up to the last byte with one file, and returns its path
/// and size. Refuses file systems with more than [`MAX_FILL_BYTES`] free.
pub fn fill(dir: &Path) -> anyhow::Result<(PathBuf, u64)> {
    let st = nix::sys::statvfs::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    if free > MAX_FILL_BYTES {
        bail!(
            "{} has {} MiB free; refusing to fill more than {} MiB (mount the checkpoint volume as a \
             size-limited tmpfs, as deploy/chaos/docker-compose.chaos.yml does)",
            dir.display(),
            free >> 20,
            MAX_FILL_BYTES >> 20
        );
    }
    let path = dir.join(FILL_FILE);
    let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut written = 0u64;
    let chunk = vec![0u8; 1 << 20];
    let mut size = chunk.len();
    // Big chunks until the first ENOSPC, then smaller ones down to one page: the last bytes too.
    while size >= 4096 {
        match f.write(&chunk[..size]) {
            Ok(0) => size /= 2,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => size /= 2,
            Err(e) => return Err(e).with_context(|| format!("filling {}", path.display())),
        }
    }
    // Best effort: a full file system may refuse even the sync of metadata.
    let _ = f.sync_all();
    Ok((path, written))
}

/// Removes the filler file (missing is fine: nothing to free).
pub fn free(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_refuses_a_large_file_system() {
        // The temp dir lives on the host's disk (far more than the limit on any CI machine
        // that runs these tests), so the filler must refuse and leave nothing behind.
        let dir = tempfile::tempdir().unwrap();
        let st = nix::sys::statvfs::statvfs(dir.path()).unwrap();
        if st.blocks_available() as u64 * st.fragment_size() as u64 <= MAX_FILL_BYTES {
            return; // A tiny disk: the refusal cannot be shown here.
        }
        let err = fill(dir.path()).unwrap_err().to_string();
        assert!(err.contains("refusing to fill"), "{err}");
        assert!(!dir.path().join(FILL_FILE).exists());
        free(&dir.path().join(FILL_FILE)).unwrap();
    }
}
