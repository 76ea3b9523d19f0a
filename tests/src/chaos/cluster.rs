//! The compose project as the chaos run sees it: which containers are replicas (and their Raft
//! node ids), which is the worker, the network they share, and where container paths live on
//! the host (bind mounts and volumes both have a host source directory).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::nemesis::docker;

/// One container of the project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub service: String,
    /// Environment variables as `KEY=value`.
    pub env: Vec<String>,
    /// Entrypoint path and arguments.
    pub args: Vec<String>,
    /// `(host source, container destination)` of every mount.
    pub mounts: Vec<(PathBuf, PathBuf)>,
    pub networks: Vec<String>,
}

impl Container {
    /// The value of a setting given as `--flag value`, `--flag=value` or environment `ENV`.
    pub fn setting(&self, flag: &str, env: &str) -> Option<String> {
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            if a == flag {
                return it.next().cloned();
            }
            if let Some(v) = a.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
                return Some(v.to_owned());
            }
        }
        self.env
            .iter()
            .find_map(|e| e.strip_prefix(env).and_then(|rest| rest.strip_prefix('=')).map(str::to_owned))
    }

    /// Where `path` (inside the container) is on the host: the mount with the longest matching
    /// destination.
    pub fn host_path(&self, path: &Path) -> Option<PathBuf> {
        self.mounts
            .iter()
            .filter_map(|(src, dst)| {
                path.strip_prefix(dst).ok().map(|rest| (dst.as_os_str().len(), src.join(rest)))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, p)| p)
    }

    fn is_worker(&self) -> bool {
        self.args.iter().any(|a| a.ends_with("cairn-worker")) || self.service.contains("worker")
    }
}

/// A replica: its container and Raft node id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub container: Container,
    pub node_id: u64,
    /// gRPC port inside the container.
    pub port: u16,
}

/// The project's replicas, its workers and its network.
#[derive(Debug, Clone)]
pub struct Topology {
    pub project: String,
    pub network: String,
    pub replicas: Vec<Replica>,
    pub workers: Vec<Container>,
}

impl Topology {
    /// Finds the project's containers (running or not) by their compose labels.
    pub async fn discover(project: &str) -> anyhow::Result<Self> {
        let names = docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label=com.docker.compose.project={project}"),
            "--format",
            "{{.Names}}",
        ])
        .await?;
        let mut replicas = Vec::new();
        let mut workers = Vec::new();
        for name in names.lines().filter(|l| !l.trim().is_empty()) {
            let c = inspect(name.trim()).await?;
            if c.is_worker() {
                workers.push(c);
            } else if let Some(id) = c.setting("--node-id", "CAIRN_NODE_ID") {
                let node_id =
                    id.parse().with_context(|| format!("{}: node id {id:?} is not a number", c.name))?;
                let listen = c.setting("--listen", "CAIRN_LISTEN").unwrap_or_else(|| "0.0.0.0:7400".into());
                let port = listen
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse().ok())
                    .with_context(|| format!("{}: listen address {listen:?} has no port", c.name))?;
                replicas.push(Replica { container: c, node_id, port });
            }
        }
        replicas.sort_by_key(|r| r.node_id);
        if replicas.len() < 3 {
            bail!(
                "compose project {project:?} has {} replica container(s) (containers with --node-id or \
                 CAIRN_NODE_ID); the chaos run needs at least 3: is the project up?",
                replicas.len()
            );
        }
        if workers.is_empty() {
            bail!("compose project {project:?} has no worker container (one running cairn-worker)");
        }
        workers.sort_by(|a, b| a.name.cmp(&b.name));
        let network = replicas[0]
            .container
            .networks
            .first()
            .cloned()
            .with_context(|| format!("{} is on no network", replicas[0].container.name))?;
        if let Some(w) = workers.iter().find(|w| !w.networks.contains(&network)) {
            bail!("the worker {} is not on the replicas' network {network}", w.name);
        }
        Ok(Self { project: project.to_owned(), network, replicas, workers })
    }

    pub fn replica(&self, node_id: u64) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.node_id == node_id)
    }

    /// The worker container started with `--worker-id <id>` (or `CAIRN_WORKER_ID`).
    pub fn worker(&self, worker_id: &str) -> Option<&Container> {
        self.workers
            .iter()
            .find(|w| w.setting("--worker-id", "CAIRN_WORKER_ID").as_deref() == Some(worker_id))
    }
}

async fn inspect(name: &str) -> anyhow::Result<Container> {
    let json = docker(&["inspect", name]).await?;
    let v: serde_json::Value =
        serde_json::from_str(&json).with_context(|| format!("docker inspect {name}: not JSON"))?;
    let c = v.get(0).with_context(|| format!("docker inspect {name}: empty answer"))?;
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let mut args = vec![c["Path"].as_str().unwrap_or_default().to_owned()];
    args.extend(strings(&c["Args"]));
    let mounts = c["Mounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| {
                    Some((PathBuf::from(m["Source"].as_str()?), PathBuf::from(m["Destination"].as_str()?)))
                })
                .collect()
        })
        .unwrap_or_default();
    let networks =
        c["NetworkSettings"]["Networks"].as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    Ok(Container {
        name: name.to_owned(),
        service: c["Config"]["Labels"]["com.docker.compose.service"].as_str().unwrap_or_default().to_owned(),
        env: strings(&c["Config"]["Env"]),
        args,
        mounts,
        networks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container() -> Container {
        Container {
            name: "chaos-cairn-1-1".into(),
            service: "cairn-1".into(),
            env: vec!["CAIRN_NODE_ID=1".into(), "CAIRN_CHECKPOINT_DIR=/data/checkpoints".into()],
            args: vec!["/cairn".into(), "--listen=0.0.0.0:7400".into(), "--peers".into(), "1=a:1".into()],
            mounts: vec![
                ("/var/lib/docker/volumes/p_cp/_data".into(), "/data/checkpoints".into()),
                ("/var/lib/docker/volumes/p_data/_data".into(), "/data".into()),
            ],
            networks: vec!["p_default".into()],
        }
    }

    #[test]
    fn settings_come_from_flags_then_environment() {
        let c = container();
        assert_eq!(c.setting("--listen", "CAIRN_LISTEN").as_deref(), Some("0.0.0.0:7400"));
        assert_eq!(c.setting("--peers", "CAIRN_PEERS").as_deref(), Some("1=a:1"));
        assert_eq!(c.setting("--node-id", "CAIRN_NODE_ID").as_deref(), Some("1"));
        assert_eq!(c.setting("--data-dir", "CAIRN_DATA_DIR"), None);
    }

    #[test]
    fn container_paths_map_through_the_longest_mount() {
        let c = container();
        assert_eq!(
            c.host_path(Path::new("/data/checkpoints/demo/chk-3/_metadata")),
            Some(PathBuf::from("/var/lib/docker/volumes/p_cp/_data/demo/chk-3/_metadata"))
        );
        assert_eq!(
            c.host_path(Path::new("/data/node-1")),
            Some(PathBuf::from("/var/lib/docker/volumes/p_data/_data/node-1"))
        );
        assert_eq!(c.host_path(Path::new("/etc/passwd")), None);
    }
}
