//! Real `cairn` processes on loopback, for kill -9 and restart tests.
//!
//! Ports are picked by binding port 0 and releasing it just before the process starts (the
//! peers list must be known up front). Every process writes its log to a file in the cluster's
//! temp directory; [`ProcCluster::logs`] returns them for failure messages. Processes are ended
//! only by their own PID, and always on drop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn_client::{ClientConfig, LeaderClient};
use cairn_coordinator::auth::AdminToken;
use cairn_coordinator::config::{ensure_secret_file, write_private};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// Path of a workspace binary (`cairn`, `cairn-worker`, ...) built next to the test executable.
/// Run `cargo build --bins` before the tests (the README's test command does).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // A test runs from target/<profile>/deps/, a benchmark binary from target/<profile>/.
    let dir = exe.parent().ok_or_else(|| anyhow::anyhow!("unexpected executable path {exe:?}"))?;
    for candidate in [Some(dir), dir.parent()].into_iter().flatten() {
        let path = candidate.join(name);
        if path.exists() {
            return Ok(path);
        }
    }
    anyhow::bail!(
        "{name} not found next to {}; build the binaries first with `cargo build --workspace --bins` \
         (add --release for the benchmarks)",
        exe.display()
    )
}

/// Replica flags for fast failover on a loaded test machine: 100 ms Raft heartbeats, 0.6-1.2 s
/// election timeouts, 200 ms worker heartbeats with a 2 s timeout, and the given re-attach grace.
pub fn failover_args(reattach_grace: &str) -> Vec<String> {
    [
        "--heartbeat-interval",
        "100ms",
        "--election-timeout-min",
        "600ms",
        "--election-timeout-max",
        "1200ms",
        "--worker-heartbeat-interval",
        "200ms",
        "--worker-heartbeat-timeout",
        "2s",
        "--reattach-grace",
        reattach_grace,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Picks a free loopback port for a process started later (its address must be known up front).
///
/// Why not port 0: a port the kernel hands out for `bind(0)` comes from the ephemeral range,
/// the same range outgoing connections take their local ports from, so between releasing it
/// and the process binding it any connection on the machine may take it. Ports are drawn
/// below that range instead (where only explicit binds land), at random, checked bindable,
/// and never handed out twice by this process.
pub fn free_port() -> anyhow::Result<u16> {
    free_port_run(1)
}

/// The first of `len` consecutive free loopback ports (see [`free_port`]).
pub fn free_port_run(len: u16) -> anyhow::Result<u16> {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.saturating_sub(len).max(10_001));
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1000 {
        let first = rand::Rng::gen_range(&mut rand::thread_rng(), low..high);
        let ports = first..first.saturating_add(len);
        if ports.clone().any(|p| handed_out.contains(&p)) {
            continue;
        }
        if ports.clone().all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            handed_out.extend(ports);
            return Ok(first);
        }
    }
    anyhow::bail!("no run of {len} free loopback ports found in {low}..{high}")
}

/// One `cairn` replica process.
pub struct CairnProcess {
    pub id: u64,
    pub addr: String,
    /// Where the process serves `/metrics` (`--metrics-listen`), when it does.
    pub metrics_addr: Option<String>,
    /// Where the replica serves the web console (`--console-listen`), when it does.
    pub console_addr: Option<String>,
    child: Option<Child>,
}

impl CairnProcess {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow::anyhow!("node {} is not running", self.id))?;
        kill(Pid::from_raw(pid as i32), sig)?;
        Ok(())
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL)?;
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit; returns the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let mut child =
            self.child.take().ok_or_else(|| anyhow::anyhow!("node {} is not running", self.id))?;
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM)?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if std::time::Instant::now() >= deadline {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.wait();
                anyhow::bail!("node {} did not exit within {timeout:?} after SIGTERM", self.id);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGCONT)
    }
}

impl Drop for CairnProcess {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
        }
        let _ = self.kill9();
    }
}

impl Drop for ProcCluster {
    fn drop(&mut self) {
        // The processes go (each killed and waited for) before the fields, the temporary
        // directory first among them: a replica still running while its directory is removed
        // writes on into it, and the removal gave up, leaving a benchmark's gigabyte behind.
        self.workers.clear();
        self.nodes.clear();
    }
}

/// How [`ProcCluster::start_with_options`] lays a cluster out.
#[derive(Debug, Clone, Default)]
pub struct ProcOptions {
    /// Every replica also serves `/metrics` on a free port of its own.
    pub metrics: bool,
    /// The data directory of a node, by node id (e.g. on a file system of its own); nodes not
    /// listed keep theirs in the cluster's temp directory.
    pub data_dirs: BTreeMap<u64, PathBuf>,
    /// Workers that get a token of their own (a `<worker-id> <token>` line each in the replicas'
    /// token file), so that each worker id is bound to its token; empty: one token shared by
    /// every worker.
    pub worker_ids: Vec<String>,
    /// Every replica also serves the web console on a free port of its own.
    pub console: bool,
}

/// A cluster of `cairn` processes, and `cairn-worker` processes attached to it.
pub struct ProcCluster {
    root: TempDir,
    binary: PathBuf,
    peers: String,
    /// Data directories placed by [`ProcOptions::data_dirs`].
    data_dirs: BTreeMap<u64, PathBuf>,
    pub nodes: BTreeMap<u64, CairnProcess>,
    /// Workers by name; `CairnProcess::id` is unused for them.
    pub workers: BTreeMap<String, CairnProcess>,
    extra_args: Vec<String>,
    /// The admin token of this cluster, and the file (mode 0600) every replica reads it from.
    token: String,
    token_file: PathBuf,
    /// The cluster secret the replicas authenticate each other with (a file, mode 0600).
    cluster_secret_file: PathBuf,
    /// The worker token every worker of this cluster attaches with (a file, mode 0600).
    worker_token_file: PathBuf,
}

impl ProcCluster {
    /// Starts `n` replicas with the given extra flags (e.g. timing).
    pub fn start(n: u64, extra_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(n, extra_args, false)
    }

    /// Like [`ProcCluster::start`], every replica also serving `/metrics` on a free port of its
    /// own ([`CairnProcess::metrics_addr`]).
    pub fn start_with_metrics(n: u64, extra_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(n, extra_args, true)
    }

    fn start_with(n: u64, extra_args: &[&str], metrics: bool) -> anyhow::Result<Self> {
        Self::start_with_options(n, extra_args, ProcOptions { metrics, ..ProcOptions::default() })
    }

    /// Starts `n` replicas with the given extra flags, laid out as `options` says.
    pub fn start_with_options(n: u64, extra_args: &[&str], options: ProcOptions) -> anyhow::Result<Self> {
        let ProcOptions { metrics, data_dirs, worker_ids, console } = options;
        let binary = binary("cairn")?;
        let root = tempfile::tempdir()?;
        let mut addrs = BTreeMap::new();
        for id in 1..=n {
            addrs.insert(id, format!("127.0.0.1:{}", free_port()?));
        }
        let peers = addrs.iter().map(|(id, a)| format!("{id}={a}")).collect::<Vec<_>>().join(",");
        let nodes = addrs
            .into_iter()
            .map(|(id, addr)| {
                (id, CairnProcess { id, addr, metrics_addr: None, console_addr: None, child: None })
            })
            .collect();
        let token = AdminToken::generate().expose().to_owned();
        let token_file = root.path().join("admin-token");
        write_private(&token_file, &token)?;
        let cluster_secret_file = root.path().join("cluster-secret");
        ensure_secret_file(&cluster_secret_file, "the cluster secret").map_err(anyhow::Error::msg)?;
        let worker_token_file = root.path().join("worker-token");
        if worker_ids.is_empty() {
            ensure_secret_file(&worker_token_file, "the worker token").map_err(anyhow::Error::msg)?;
        } else {
            let mut lines = String::new();
            for id in &worker_ids {
                let own = root.path().join(format!("worker-token-{id}"));
                let token = ensure_secret_file(&own, "a worker token").map_err(anyhow::Error::msg)?;
                lines.push_str(&format!("{id} {}\n", token.expose()));
            }
            write_private(&worker_token_file, lines.trim_end())?;
        }
        let mut c = Self {
            root,
            binary,
            peers,
            data_dirs,
            nodes,
            workers: BTreeMap::new(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            token,
            token_file,
            cluster_secret_file,
            worker_token_file,
        };
        if metrics {
            for node in c.nodes.values_mut() {
                node.metrics_addr = Some(format!("127.0.0.1:{}", free_port()?));
            }
        }
        if console {
            for node in c.nodes.values_mut() {
                node.console_addr = Some(format!("127.0.0.1:{}", free_port()?));
            }
        }
        for id in 1..=n {
            c.launch(id)?;
        }
        Ok(c)
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.root.path().join(format!("node-{id}.log"))
    }

    /// (Re)starts node `id` with its data directory.
    pub fn launch(&mut self, id: u64) -> anyhow::Result<()> {
        let peers = self.peers.clone();
        self.launch_with_peers(id, &peers)
    }

    /// Starts stopped node `id` again as a new replica: its data directory wiped, and `--peers`
    /// naming the other initial members only, so it waits to be added (`AddLearner`) instead of
    /// initialising a cluster. Same address as before.
    pub fn relaunch_fresh(&mut self, id: u64) -> anyhow::Result<()> {
        if self.nodes.get(&id).is_some_and(CairnProcess::is_running) {
            anyhow::bail!("node {id} is still running; stop it before wiping its data");
        }
        let data_dir = self.data_dir(id);
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        let others = self
            .peers
            .split(',')
            .filter(|p| p.split_once('=').is_none_or(|(pid, _)| pid != id.to_string()))
            .collect::<Vec<_>>()
            .join(",");
        self.launch_with_peers(id, &others)
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        match self.data_dirs.get(&id) {
            Some(dir) => dir.clone(),
            None => self.root.path().join(format!("node-{id}")),
        }
    }

    /// The cluster's temp directory (process logs, the admin token, scratch directories).
    pub fn root(&self) -> &std::path::Path {
        self.root.path()
    }

    fn launch_with_peers(&mut self, id: u64, peers: &str) -> anyhow::Result<()> {
        let data_dir = self.data_dir(id);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(id))?;
        let node = self.nodes.get_mut(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        if node.child.is_some() {
            anyhow::bail!("node {id} is already running");
        }
        let child = Command::new(&self.binary)
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&node.addr)
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--peers")
            .arg(peers)
            .arg("--checkpoint-dir")
            .arg(self.root.path().join("checkpoints"))
            .arg("--admin-token-file")
            .arg(&self.token_file)
            .arg("--cluster-secret-file")
            .arg(&self.cluster_secret_file)
            .arg("--worker-token-file")
            .arg(&self.worker_token_file)
            .args(&self.extra_args)
            .args(node.metrics_addr.iter().flat_map(|m| ["--metrics-listen", m.as_str()]))
            .args(node.console_addr.iter().flat_map(|c| ["--console-listen", c.as_str()]))
            .env("CAIRN_LOG", "info,openraft=off")
            .env_remove("CAIRN_CONFIG")
            .env_remove("CAIRN_ADMIN_TOKEN")
            .env_remove("CAIRN_CLUSTER_SECRET")
            .env_remove("CAIRN_WORKER_TOKEN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        node.child = Some(child);
        Ok(())
    }

    /// Starts (or restarts) a `cairn-worker` named `name` attached to this cluster.
    pub fn launch_worker(&mut self, name: &str, slots: u32) -> anyhow::Result<()> {
        self.launch_worker_with(name, slots, None, &[])
    }

    /// Like [`ProcCluster::launch_worker`], with more `cairn-worker run` arguments.
    pub fn launch_worker_with_args(&mut self, name: &str, slots: u32, args: &[&str]) -> anyhow::Result<()> {
        self.launch_worker_with(name, slots, None, args)
    }

    /// Like [`ProcCluster::launch_worker`], the worker also serving `/metrics` on a free port;
    /// returns that address.
    pub fn launch_worker_with_metrics(&mut self, name: &str, slots: u32) -> anyhow::Result<String> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        self.launch_worker_with(name, slots, Some(addr.clone()), &[])?;
        Ok(addr)
    }

    fn launch_worker_with(
        &mut self,
        name: &str,
        slots: u32,
        metrics: Option<String>,
        args: &[&str],
    ) -> anyhow::Result<()> {
        let binary = binary("cairn-worker")?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.worker_log(name))?;
        if self.workers.get(name).is_some_and(|w| w.is_running()) {
            anyhow::bail!("worker {name} is already running");
        }
        let child = Command::new(binary)
            .arg("run")
            .arg("--coordinators")
            .arg(self.addrs().join(","))
            .arg("--worker-id")
            .arg(name)
            .arg("--slots")
            .arg(slots.to_string())
            .arg("--token-file")
            .arg(self.worker_token_file_of(name))
            .args(metrics.iter().flat_map(|m| ["--metrics-listen", m.as_str()]))
            .args(args)
            .env("CAIRN_WORKER_LOG", "info")
            .env_remove("CAIRN_WORKER_CONFIG")
            .env_remove("CAIRN_WORKER_TOKEN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.workers.insert(
            name.to_owned(),
            CairnProcess {
                id: 0,
                addr: String::new(),
                metrics_addr: metrics,
                console_addr: None,
                child: Some(child),
            },
        );
        Ok(())
    }

    fn worker_log(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("worker-{name}.log"))
    }

    /// The checkpoint storage root shared by the replicas and workers.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.root.path().join("checkpoints")
    }

    /// A scratch directory inside the cluster's temp dir (e.g. a job's output).
    pub fn scratch(&self, name: &str) -> anyhow::Result<PathBuf> {
        let p = self.root.path().join(name);
        std::fs::create_dir_all(&p)?;
        Ok(p)
    }

    /// The current log of a worker.
    /// Everything replica `id` logged so far (across its restarts).
    pub fn node_log_text(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    pub fn worker_log_text(&self, name: &str) -> String {
        std::fs::read_to_string(self.worker_log(name)).unwrap_or_default()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.addr.clone()).collect()
    }

    pub fn node_by_addr(&self, addr: &str) -> Option<u64> {
        self.nodes.values().find(|n| n.addr == addr).map(|n| n.id)
    }

    /// A leader-following client carrying the admin token.
    pub fn client(&self) -> anyhow::Result<LeaderClient> {
        Ok(LeaderClient::new(self.addrs(), self.client_config())?)
    }

    /// Client settings with this cluster's admin token.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig { token: Some(self.token.clone()), ..ClientConfig::default() }
    }

    /// The admin token the replicas accept.
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// The file holding the worker token (for `cairn-worker --token-file`).
    pub fn worker_token_file(&self) -> &std::path::Path {
        &self.worker_token_file
    }

    /// The token file worker `name` attaches with: its own when the cluster binds tokens to
    /// worker ids ([`ProcOptions::worker_ids`]), else the shared one.
    pub fn worker_token_file_of(&self, name: &str) -> PathBuf {
        let own = self.root.path().join(format!("worker-token-{name}"));
        if own.exists() { own } else { self.worker_token_file.clone() }
    }

    /// The file holding the cluster secret (for a replica started by hand).
    pub fn cluster_secret_file(&self) -> &std::path::Path {
        &self.cluster_secret_file
    }

    /// The file holding the admin token (for `cairnctl --token-file`).
    pub fn admin_token_file(&self) -> &std::path::Path {
        &self.token_file
    }

    /// The last `lines` lines of every node's log, for failure messages.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for id in self.nodes.keys() {
            let text = std::fs::read_to_string(self.log_path(*id)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- node {id} ---\n{}\n",
                all[all.len().saturating_sub(lines)..].join("\n")
            ));
        }
        out
    }
}
