//! Configuration of a `cairn` replica: one struct, defaults defined once, a TOML file, `CAIRN_*`
//! environment variables and command-line flags, in increasing order of precedence, and a
//! `validate()` that names the offending key.
//!
//! Timing defaults, and why:
//! - `heartbeat_interval = 30ms`: the leader's heartbeat (an empty append-entries call, no
//!   fsync anywhere); about 33 small calls a second per follower.
//! - `election_timeout_min/max = 90ms / 180ms`: openraft 0.9 gives the leader a lease of
//!   `election_timeout_max`: a follower that heard from the leader refuses votes for that long,
//!   and its own election fires only after lease + timeout, i.e. 270-360 ms after the last
//!   heartbeat it processed. That is how long a healthy leader may go unheard (9-12 heartbeats:
//!   a slow fsync does not count, since neither heartbeats nor elections wait for the disk, only
//!   a stalled process or network does), and how long a dead one is waited for: leader SIGKILL
//!   to the first checkpoint on the new leader is about half a second. Raise all three on a
//!   network with long pauses (the production template uses 100ms / 800ms / 1600ms).
//! - `snapshot_after_logs = 5000`, `logs_to_keep = 1000`: the state machine is small (per-job
//!   records), so snapshots are cheap; the log stays bounded, and a follower that lags by
//!   fewer than 1000 entries catches up from the log without a snapshot transfer. Replica `n`
//!   waits `(n mod 3) / 3` of that longer (see [`NodeConfig::snapshot_threshold`]), so that the
//!   replicas of a group do not build a snapshot and purge the log behind it at the same index.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_proto::auth::Secret;
use cairn_raft::service::PeerAuth;
use serde::{Deserialize, Serialize};

use crate::auth::{AdminToken, WorkerTokens};

/// Default gRPC listen address of a single local replica.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";

/// A member of the initial cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    pub id: u64,
    /// `host:port` of the peer's gRPC listener, as other replicas reach it.
    pub addr: String,
}

/// Raft timing and log-compaction knobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTiming {
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub election_timeout_min: Duration,
    #[serde(with = "humantime_serde")]
    pub election_timeout_max: Duration,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_after_logs: u64,
    /// Log entries kept behind the last snapshot for lagging followers.
    pub logs_to_keep: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(30),
            election_timeout_min: Duration::from_millis(90),
            election_timeout_max: Duration::from_millis(180),
            snapshot_after_logs: 5000,
            logs_to_keep: 1000,
        }
    }
}

/// How the leader deals with workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerTiming {
    /// Heartbeats in both directions on the task gateway.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// A worker not heard from for this long is lost: its jobs restart from their latest
    /// checkpoint elsewhere.
    #[serde(with = "humantime_serde")]
    pub heartbeat_timeout: Duration,
    /// After a leader change, how long the new leader waits for running tasks to re-attach
    /// before restarting the jobs whose tasks did not all come back.
    #[serde(with = "humantime_serde")]
    pub reattach_grace: Duration,
}

impl Default for WorkerTiming {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            reattach_grace: Duration::from_secs(10),
        }
    }
}

/// Everything a replica needs to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This replica's Raft node id; stable for the life of its data directory.
    pub node_id: u64,
    /// Address the gRPC server binds.
    pub listen: String,
    /// Address other replicas and clients use to reach this one (defaults to `listen`).
    pub advertise: Option<String>,
    /// Where the Raft log and state machine live (sled); `cairn-data/node-<node_id>` if unset.
    pub data_dir: Option<PathBuf>,
    /// Initial cluster members. Empty means a single-node cluster of this replica. A replica
    /// that is not in the list does not bootstrap: it waits to be added as a learner.
    pub peers: Vec<Peer>,
    /// Default checkpoint storage root shared by replicas and workers (a job's
    /// `checkpoint.storage_dir` overrides it); `cairn-data/checkpoints` if unset.
    pub checkpoint_dir: Option<PathBuf>,
    /// Deploy jobs with incremental keyed-state checkpoints (only changed key groups are written).
    pub incremental_checkpoints: bool,
    /// `host:port` of the Prometheus `/metrics` endpoint; none when unset.
    pub metrics_listen: Option<String>,
    /// `host:port` of the web console (cluster, jobs, checkpoints, actions); none when unset.
    pub console_listen: Option<String>,
    /// Whether the console's read-only views need the admin token too (its actions always do).
    pub console_views_need_token: bool,
    pub raft: RaftTiming,
    pub workers: WorkerTiming,
    /// The restart strategy of jobs whose spec names none (`[restart_strategy]`, Flink's names:
    /// `type = "fixed-delay"`, `attempts`, `delay`, ...). Unset: exponential delay for jobs that
    /// checkpoint periodically, none for the others (Flink's rule).
    pub restart_strategy: Option<cairn_protocol::restart::RestartStrategy>,
    /// TLS (`[tls]`: `cert_file`, `key_file`, `ca_file`): when set, the replica serves TLS only,
    /// and replicas talk Raft over mutual TLS. Unset: plaintext.
    pub tls: Option<cairn_proto::tls::TlsFiles>,
    /// File holding the admin token every operator call must present (`authorization: Bearer
    /// <token>`). See [`NodeConfig::resolve_admin_token`].
    pub admin_token_file: Option<PathBuf>,
    /// The admin token itself (from `CAIRN_ADMIN_TOKEN`; never read from flags or the file, so it
    /// stays out of `ps` and configuration dumps). Takes precedence over `admin_token_file`.
    #[serde(skip)]
    pub admin_token: Option<crate::auth::AdminToken>,
    /// File holding the cluster secret that authenticates Raft calls between replicas when they
    /// do not use TLS (the same on every replica, at least 16 bytes, not the admin token). See
    /// [`NodeConfig::resolve_peer_auth`].
    pub cluster_secret_file: Option<PathBuf>,
    /// The cluster secret itself (from `CAIRN_CLUSTER_SECRET`); takes precedence over the file.
    #[serde(skip)]
    pub cluster_secret: Option<Secret>,
    /// File holding the worker tokens: one token shared by every worker, or `<worker-id> <token>`
    /// lines that bind each token to one worker. See [`NodeConfig::resolve_worker_tokens`].
    pub worker_token_file: Option<PathBuf>,
    /// One worker token shared by every worker (from `CAIRN_WORKER_TOKEN`); takes precedence over
    /// the file.
    #[serde(skip)]
    pub worker_token: Option<Secret>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            node_id: 1,
            listen: DEFAULT_LISTEN.to_owned(),
            advertise: None,
            data_dir: None,
            peers: Vec::new(),
            checkpoint_dir: None,
            incremental_checkpoints: false,
            metrics_listen: None,
            console_listen: None,
            console_views_need_token: false,
            raft: RaftTiming::default(),
            workers: WorkerTiming::default(),
            restart_strategy: None,
            tls: None,
            admin_token_file: None,
            admin_token: None,
            cluster_secret_file: None,
            cluster_secret: None,
            worker_token_file: None,
            worker_token: None,
        }
    }
}

/// A configuration that cannot be used, naming the key and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is invalid: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("`{key}` {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error(transparent)]
    Tls(#[from] cairn_proto::tls::TlsError),
    #[error("admin token: {0}")]
    AdminToken(String),
    #[error("cluster secret: {0}")]
    ClusterSecret(String),
    #[error("worker tokens: {0}")]
    WorkerTokens(String),
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key, reason: reason.into() }
}

impl NodeConfig {
    /// Reads a TOML file; unknown keys are rejected.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source: Box::new(source) })
    }

    /// The address this replica is known by.
    pub fn advertise_addr(&self) -> &str {
        self.advertise.as_deref().unwrap_or(&self.listen)
    }

    /// The data directory in use.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("cairn-data/node-{}", self.node_id)))
    }

    /// The default checkpoint storage root.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.checkpoint_dir.clone().unwrap_or_else(|| PathBuf::from("cairn-data/checkpoints"))
    }

    /// The initial membership: the configured peers, or this replica alone.
    pub fn initial_members(&self) -> BTreeMap<u64, String> {
        if self.peers.is_empty() {
            BTreeMap::from([(self.node_id, self.advertise_addr().to_owned())])
        } else {
            self.peers.iter().map(|p| (p.id, p.addr.clone())).collect()
        }
    }

    /// Whether this replica takes part in bootstrapping the cluster.
    pub fn bootstraps(&self) -> bool {
        self.initial_members().contains_key(&self.node_id)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_id == 0 {
            return Err(invalid("node_id", "must be at least 1"));
        }
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("listen", format!("{:?} is not an ip:port address ({e})", self.listen)))?;
        check_host_port("advertise", self.advertise_addr())?;
        if let Some(addr) = &self.metrics_listen {
            check_host_port("metrics_listen", addr)?;
        }
        if let Some(addr) = &self.console_listen {
            check_host_port("console_listen", addr)?;
        }
        if self.data_dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
            return Err(invalid("data_dir", "must not be empty"));
        }
        let tls = self.tls.as_ref();
        if let Some((key, why)) = cairn_protocol::operators::first_climbing_path(&[
            ("data_dir", self.data_dir.as_deref()),
            ("checkpoint_dir", self.checkpoint_dir.as_deref()),
            ("admin_token_file", self.admin_token_file.as_deref()),
            ("cluster_secret_file", self.cluster_secret_file.as_deref()),
            ("worker_token_file", self.worker_token_file.as_deref()),
            ("tls.cert_file", tls.and_then(|t| t.cert_file.as_deref())),
            ("tls.key_file", tls.and_then(|t| t.key_file.as_deref())),
            ("tls.ca_file", tls.and_then(|t| t.ca_file.as_deref())),
        ]) {
            return Err(ConfigError::Invalid { key, reason: why });
        }
        let mut seen = BTreeMap::new();
        for p in &self.peers {
            if p.id == 0 {
                return Err(invalid("peers", "node ids must be at least 1"));
            }
            check_host_port("peers", &p.addr)?;
            if let Some(prev) = seen.insert(p.id, &p.addr) {
                return Err(invalid(
                    "peers",
                    format!("node {} is listed twice ({prev} and {})", p.id, p.addr),
                ));
            }
        }
        let t = &self.raft;
        for (key, d) in [
            ("raft.heartbeat_interval", t.heartbeat_interval),
            ("raft.election_timeout_min", t.election_timeout_min),
            ("raft.election_timeout_max", t.election_timeout_max),
        ] {
            check_at_most(key, d, MAX_RAFT_TIMING)?;
        }
        if t.heartbeat_interval.is_zero() {
            return Err(invalid("raft.heartbeat_interval", "must be above zero"));
        }
        if t.election_timeout_min <= t.heartbeat_interval * 2 {
            return Err(invalid(
                "raft.election_timeout_min",
                "must be more than twice raft.heartbeat_interval, or healthy leaders get deposed",
            ));
        }
        if t.election_timeout_max <= t.election_timeout_min {
            return Err(invalid(
                "raft.election_timeout_max",
                "must be greater than raft.election_timeout_min",
            ));
        }
        if t.snapshot_after_logs == 0 {
            return Err(invalid("raft.snapshot_after_logs", "must be at least 1"));
        }
        self.server_tls()?;
        let w = &self.workers;
        for (key, d) in [
            ("workers.heartbeat_interval", w.heartbeat_interval),
            ("workers.heartbeat_timeout", w.heartbeat_timeout),
            ("workers.reattach_grace", w.reattach_grace),
        ] {
            check_at_most(key, d, MAX_WORKER_TIMING)?;
        }
        if w.heartbeat_interval.is_zero() {
            return Err(invalid("workers.heartbeat_interval", "must be above zero"));
        }
        if w.heartbeat_timeout <= w.heartbeat_interval * 2 {
            return Err(invalid(
                "workers.heartbeat_timeout",
                "must be more than twice workers.heartbeat_interval, or live workers are declared lost",
            ));
        }
        if let Some(s) = &self.restart_strategy {
            s.validate().map_err(|e| invalid("restart_strategy", e.to_string()))?;
        }
        Ok(())
    }

    /// The admin token this replica accepts, in order: `admin_token` (`CAIRN_ADMIN_TOKEN`),
    /// `admin_token_file`, or, for a single-node cluster with neither, a token generated into
    /// `<data_dir>/admin-token` (mode 0600) on first start and reused afterwards. A replica with
    /// peers must be given one. Call after the data directory exists.
    pub fn resolve_admin_token(&self) -> Result<AdminToken, ConfigError> {
        if let Some(t) = &self.admin_token {
            return Ok(t.clone());
        }
        if let Some(path) = &self.admin_token_file {
            return read_token_file(path);
        }
        if !self.peers.is_empty() {
            return Err(ConfigError::AdminToken(
                "a replica with peers needs the cluster's admin token: write one token (at least 16 \
                 printable characters, e.g. `openssl rand -hex 32`) to a file readable only by cairn \
                 and pass it to every replica with --admin-token-file (or set CAIRN_ADMIN_TOKEN)"
                    .into(),
            ));
        }
        self.secret_in_data_dir(ADMIN_TOKEN_FILE, "the admin token", "cairnctl --token-file")
            .map(AdminToken::from)
            .map_err(ConfigError::AdminToken)
    }

    /// The secret this replica keeps in its data directory as `name`, generated there (mode 0600)
    /// on first start and reused afterwards; the log says which, and who needs the file.
    fn secret_in_data_dir(&self, name: &str, what: &str, used_by: &str) -> Result<Secret, String> {
        let path = self.data_dir().join(name);
        let generated = !path.exists();
        let secret = ensure_secret_file(&path, what)?;
        if generated {
            tracing::info!(path = %path.display(), secret = what, used_by, "generated a secret in the data directory");
        } else {
            tracing::info!(path = %path.display(), secret = what, "secret read from the data directory");
        }
        Ok(secret)
    }

    /// How this replica authenticates the replicas that call its Raft service: their TLS
    /// certificates when it serves TLS, else the cluster secret (`cluster_secret`, from
    /// `CAIRN_CLUSTER_SECRET`, or `cluster_secret_file`). A replica with peers and neither
    /// refuses to start, naming both fixes; a single replica without either accepts no Raft calls
    /// (it has no peers). The secret must differ from the admin token, which operators hold.
    pub fn resolve_peer_auth(&self, admin: &AdminToken) -> Result<PeerAuth, ConfigError> {
        let secret = match (&self.cluster_secret, &self.cluster_secret_file) {
            (Some(s), _) => Some(s.clone()),
            (None, Some(path)) => {
                Some(read_secret_file(path, "the cluster secret").map_err(ConfigError::ClusterSecret)?)
            }
            (None, None) => None,
        };
        if let Some(s) = &secret
            && s == admin.secret()
        {
            return Err(ConfigError::ClusterSecret(
                "the cluster secret must differ from the admin token: operators hold the admin token, \
                 only replicas may hold the cluster secret (generate one with `openssl rand -hex 32`)"
                    .into(),
            ));
        }
        if self.tls.is_some() {
            return Ok(PeerAuth::Certificates);
        }
        match secret {
            Some(s) => Ok(PeerAuth::Secret(s)),
            None if self.peers.is_empty() => Ok(PeerAuth::Closed),
            None => Err(ConfigError::ClusterSecret(
                "a replica with peers must authenticate raft calls: give every replica the same \
                 cluster secret (at least 16 printable characters, not the admin token, e.g. \
                 `openssl rand -hex 32`) with --cluster-secret-file (or CAIRN_CLUSTER_SECRET), or serve \
                 TLS ([tls] cert_file, key_file, ca_file) with a certificate naming each replica \
                 (cairn://node/<id>)"
                    .into(),
            )),
        }
    }

    /// The worker tokens this replica accepts: `worker_token` (`CAIRN_WORKER_TOKEN`, shared by
    /// every worker), `worker_token_file`, or, for a single replica with neither, a token
    /// generated into `<data_dir>/worker-token` (mode 0600) on first start and reused. A replica
    /// with peers and neither accepts only workers with a certificate, so it needs TLS. No worker
    /// token may be the admin token or the cluster secret of `peers`. Call after the data
    /// directory exists.
    pub fn resolve_worker_tokens(
        &self,
        admin: &AdminToken,
        peers: &PeerAuth,
    ) -> Result<WorkerTokens, ConfigError> {
        let tokens = if let Some(t) = &self.worker_token {
            WorkerTokens::shared(t.clone())
        } else if let Some(path) = &self.worker_token_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::WorkerTokens(format!("cannot read the token file {}: {e}", path.display()))
            })?;
            WorkerTokens::parse(&text)
                .map_err(|e| ConfigError::WorkerTokens(format!("token file {}: {e}", path.display())))?
        } else if !self.peers.is_empty() {
            if self.tls.is_some() {
                return Ok(WorkerTokens::default());
            }
            return Err(ConfigError::WorkerTokens(
                "a replica with peers needs the workers' credentials: write a worker token (at least 16 \
                 printable characters, not the admin token) to a file and pass it to every replica \
                 with --worker-token-file (or CAIRN_WORKER_TOKEN) and to every worker with \
                 cairn-worker --token-file, or serve TLS and give each worker a certificate naming it \
                 (cairn://worker/<id>)"
                    .into(),
            ));
        } else {
            let token = self
                .secret_in_data_dir(WORKER_TOKEN_FILE, "the worker token", "cairn-worker --token-file")
                .map_err(ConfigError::WorkerTokens)?;
            WorkerTokens::shared(token)
        };
        if tokens.contains(admin.secret()) {
            return Err(ConfigError::WorkerTokens(
                "a worker token must differ from the admin token: a worker holding it could administer \
                 the cluster"
                    .into(),
            ));
        }
        if let PeerAuth::Secret(secret) = peers
            && tokens.contains(secret)
        {
            return Err(ConfigError::WorkerTokens(
                "a worker token must differ from the cluster secret: a worker holding it could act as \
                 a replica"
                    .into(),
            ));
        }
        Ok(tokens)
    }

    /// The replica's TLS material, loaded and checked (files exist, are PEM, hold a certificate
    /// and its key); `None` when TLS is not configured.
    pub fn server_tls(&self) -> Result<Option<cairn_proto::tls::ServerTls>, ConfigError> {
        Ok(self.tls.as_ref().map(|t| t.load_server()).transpose()?)
    }

    /// Entries after which this replica builds a snapshot: `raft.snapshot_after_logs`, plus
    /// `(node_id mod 3) / 3` of it. A snapshot is followed by the purge of the entries behind
    /// it (thousands of removals from the log tree), and replicas with one threshold do both at
    /// the same index, so at the same moment: on a cluster coordinating a thousand jobs, the
    /// seconds around that moment were most of the checkpoints' p99 (docs/SCALING.md, round
    /// 10). With thresholds a third apart, the three replicas of a group do it at different
    /// times, and a leader's commit finds a follower that is not purging.
    pub fn snapshot_threshold(&self) -> u64 {
        let n = self.raft.snapshot_after_logs;
        n.saturating_add((n / 3).saturating_mul(self.node_id % 3))
    }

    /// The openraft configuration derived from this one.
    pub fn openraft_config(&self) -> Result<openraft::Config, ConfigError> {
        let t = &self.raft;
        let ms = |d: Duration| d.as_millis() as u64;
        let cfg = openraft::Config {
            cluster_name: "cairn".to_owned(),
            heartbeat_interval: ms(t.heartbeat_interval),
            election_timeout_min: ms(t.election_timeout_min),
            election_timeout_max: ms(t.election_timeout_max),
            install_snapshot_timeout: ms(t.election_timeout_max).max(1000).saturating_mul(4),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_threshold()),
            max_in_snapshot_log_to_keep: t.logs_to_keep,
            purge_batch_size: 256,
            ..Default::default()
        };
        cfg.validate().map_err(|e| invalid("raft", e.to_string()))
    }
}

/// Name of the generated admin token file inside a single node's data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";
/// Name of the generated worker token file inside a single node's data directory.
pub const WORKER_TOKEN_FILE: &str = "worker-token";
/// Longest accepted Raft timing: beyond an hour a cluster never elects in practice, and larger
/// values overflow the arithmetic of timers.
pub const MAX_RAFT_TIMING: Duration = Duration::from_secs(3600);
/// Longest accepted worker timing (heartbeats, re-attach grace).
pub const MAX_WORKER_TIMING: Duration = Duration::from_secs(86_400);

fn check_at_most(key: &'static str, d: Duration, max: Duration) -> Result<(), ConfigError> {
    if d > max {
        return Err(invalid(key, format!("must be at most {}", humantime::format_duration(max))));
    }
    Ok(())
}

/// The secret in `path`, generated there first (mode 0600) when the file does not exist; `what`
/// names it in errors. For tools that set up a cluster on one machine (the demo, tests).
pub fn ensure_secret_file(path: &Path, what: &str) -> Result<Secret, String> {
    if !path.exists() {
        write_private(path, Secret::generate().expose())
            .map_err(|e| format!("cannot write {what} to {}: {e}", path.display()))?;
    }
    read_secret_file(path, what)
}

pub use cairn_proto::auth::read_secret_file;

/// Reads and validates a token file (one line; a trailing newline is ignored).
pub fn read_token_file(path: &Path) -> Result<crate::auth::AdminToken, ConfigError> {
    read_secret_file(path, "the admin token")
        .map(crate::auth::AdminToken::from)
        .map_err(ConfigError::AdminToken)
}

/// Writes `contents` to a new file readable and writable by its owner only.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(contents.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

/// Whether `addr` looks like `host:port` with a non-zero port.
pub fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0))
}

fn check_host_port(key: &'static str, addr: &str) -> Result<(), ConfigError> {
    if is_host_port(addr) {
        Ok(())
    } else {
        Err(invalid(key, format!("{addr:?} is not a host:port address")))
    }
}

/// Parses `--peers 1=host:port,2=host:port`.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (id, addr) = p
                .trim()
                .split_once('=')
                .ok_or_else(|| format!("peer {p:?} must look like <id>=<host:port>, e.g. 1=10.0.0.1:7400"))?;
            let id = id.trim().parse::<u64>().map_err(|e| format!("peer id {id:?} is not a number ({e})"))?;
            Ok(Peer { id, addr: addr.trim().to_owned() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_a_valid_single_node() {
        let c = NodeConfig::default();
        c.validate().unwrap();
        assert!(c.bootstraps());
        assert_eq!(c.initial_members(), BTreeMap::from([(1, DEFAULT_LISTEN.to_owned())]));
        c.openraft_config().unwrap();
    }

    #[test]
    fn replicas_snapshot_at_different_thresholds() {
        let threshold = |node_id: u64, after: u64| {
            let mut c = NodeConfig { node_id, ..NodeConfig::default() };
            c.raft.snapshot_after_logs = after;
            c.snapshot_threshold()
        };
        let three: Vec<u64> = (1..=3).map(|id| threshold(id, 5000)).collect();
        assert_eq!(three, vec![6666, 8332, 5000]);
        assert_eq!(threshold(4, 5000), threshold(1, 5000), "the spread repeats every three ids");
        assert_eq!(threshold(2, u64::MAX), u64::MAX, "a huge setting saturates");
        assert_eq!(threshold(2, 1), 1, "a tiny setting stays as set");
        let c = NodeConfig { node_id: 2, ..NodeConfig::default() };
        match c.openraft_config().unwrap().snapshot_policy {
            openraft::SnapshotPolicy::LogsSinceLast(n) => assert_eq!(n, 8332),
            other => panic!("unexpected policy {other:?}"),
        }
    }

    #[test]
    fn toml_with_unknown_key_is_rejected() {
        let err = toml::from_str::<NodeConfig>("node_id = 2\nlisten_addr = \"x\"").unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
    }

    #[test]
    fn durations_are_humantime() {
        let c: NodeConfig = toml::from_str("[raft]\nheartbeat_interval = \"50ms\"").unwrap();
        assert_eq!(c.raft.heartbeat_interval, Duration::from_millis(50));
        assert_eq!(c.raft.election_timeout_min, RaftTiming::default().election_timeout_min);
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = NodeConfig { node_id: 0, ..Default::default() };
        assert!(c.validate().unwrap_err().to_string().starts_with("`node_id`"));
        c.node_id = 1;
        c.raft.election_timeout_min = Duration::from_millis(50);
        assert!(c.validate().unwrap_err().to_string().contains("raft.election_timeout_min"));
        c.raft = RaftTiming::default();
        c.peers = parse_peers("1=a:1,1=b:2").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("listed twice"));
    }

    #[test]
    fn admin_token_sources_and_rules() {
        let dir = tempfile::tempdir().unwrap();
        // Single node without a token: generated once (mode 0600), then reused.
        let single = NodeConfig { data_dir: Some(dir.path().join("n1")), ..Default::default() };
        let first = single.resolve_admin_token().unwrap();
        assert_eq!(single.resolve_admin_token().unwrap(), first);
        let path = dir.path().join("n1").join(ADMIN_TOKEN_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Peers without a token: an error that says how to fix it.
        let mut cluster = NodeConfig { peers: parse_peers("1=a:1,2=b:2").unwrap(), ..Default::default() };
        assert!(cluster.resolve_admin_token().unwrap_err().to_string().contains("--admin-token-file"));
        // A token file: trailing newline ignored; bad content and unreadable files name the file.
        let file = dir.path().join("token");
        std::fs::write(&file, "0123456789abcdef\n").unwrap();
        cluster.admin_token_file = Some(file.clone());
        assert_eq!(cluster.resolve_admin_token().unwrap().expose(), "0123456789abcdef");
        std::fs::write(&file, "short\n").unwrap();
        let err = cluster.resolve_admin_token().unwrap_err().to_string();
        assert!(err.contains(&file.display().to_string()) && err.contains("at least 16"), "{err}");
        cluster.admin_token_file = Some(dir.path().join("missing"));
        assert!(cluster.resolve_admin_token().unwrap_err().to_string().contains("missing"));
        // The value itself wins over the file.
        cluster.admin_token = Some(crate::auth::AdminToken::new("fedcba9876543210").unwrap());
        assert_eq!(cluster.resolve_admin_token().unwrap().expose(), "fedcba9876543210");
    }

    #[test]
    fn raft_and_worker_credentials_are_required_with_peers_and_kept_apart() {
        let dir = tempfile::tempdir().unwrap();
        let admin = AdminToken::new("0123456789abcdef").unwrap();
        // Alone: no peers to authenticate, a worker token generated once and reused.
        let single = NodeConfig { data_dir: Some(dir.path().join("n1")), ..Default::default() };
        assert!(matches!(single.resolve_peer_auth(&admin).unwrap(), PeerAuth::Closed));
        let tokens = single.resolve_worker_tokens(&admin, &PeerAuth::Closed).unwrap();
        assert_eq!(single.resolve_worker_tokens(&admin, &PeerAuth::Closed).unwrap(), tokens);
        assert!(dir.path().join("n1").join(WORKER_TOKEN_FILE).exists());
        // With peers: both missing credentials are named with their fixes.
        let mut cluster = NodeConfig { peers: parse_peers("1=a:1,2=b:2").unwrap(), ..Default::default() };
        let err = cluster.resolve_peer_auth(&admin).unwrap_err().to_string();
        assert!(err.contains("--cluster-secret-file") && err.contains("TLS"), "{err}");
        let err = cluster.resolve_worker_tokens(&admin, &PeerAuth::Closed).unwrap_err().to_string();
        assert!(err.contains("--worker-token-file") && err.contains("cairn://worker/<id>"), "{err}");
        // The secrets of different roles must differ.
        cluster.cluster_secret = Some(admin.secret().clone());
        assert!(cluster.resolve_peer_auth(&admin).unwrap_err().to_string().contains("differ"));
        cluster.worker_token = Some(admin.secret().clone());
        assert!(
            cluster
                .resolve_worker_tokens(&admin, &PeerAuth::Closed)
                .unwrap_err()
                .to_string()
                .contains("differ")
        );
        cluster.cluster_secret = Some(Secret::new("s", "fedcba9876543210").unwrap());
        assert!(matches!(cluster.resolve_peer_auth(&admin).unwrap(), PeerAuth::Secret(_)));
        let raft = PeerAuth::Secret(Secret::new("s", "fedcba9876543210").unwrap());
        cluster.worker_token = Some(Secret::new("w", "fedcba9876543210").unwrap());
        let err = cluster.resolve_worker_tokens(&admin, &raft).unwrap_err().to_string();
        assert!(err.contains("differ from the cluster secret"), "{err}");
        // A bound token file.
        let file = dir.path().join("tokens");
        std::fs::write(&file, "w-1 1111111111111111\n").unwrap();
        cluster.worker_token = None;
        cluster.worker_token_file = Some(file);
        assert!(!cluster.resolve_worker_tokens(&admin, &PeerAuth::Closed).unwrap().is_empty());
    }

    #[test]
    fn configured_paths_must_not_climb_out_with_dot_dot() {
        let c = NodeConfig { checkpoint_dir: Some("/srv/cairn/../etc".into()), ..Default::default() };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("`checkpoint_dir`") && err.contains("`..`"), "{err}");
        let c = NodeConfig { worker_token_file: Some("../tokens".into()), ..Default::default() };
        assert!(c.validate().unwrap_err().to_string().starts_with("`worker_token_file`"));
        NodeConfig { data_dir: Some("relative/is/fine".into()), ..Default::default() }.validate().unwrap();
    }

    #[test]
    fn console_listen_is_off_by_default_and_validated() {
        assert_eq!(NodeConfig::default().console_listen, None);
        assert!(!NodeConfig::default().console_views_need_token);
        let c: NodeConfig =
            toml::from_str("console_listen = \"127.0.0.1:7480\"\nconsole_views_need_token = true").unwrap();
        assert_eq!(c.console_listen.as_deref(), Some("127.0.0.1:7480"));
        assert!(c.console_views_need_token);
        let bad = NodeConfig { console_listen: Some("7480".into()), ..Default::default() };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.starts_with("`console_listen`") && err.contains("host:port"), "{err}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_validated() {
        assert_eq!(NodeConfig::default().metrics_listen, None);
        let c: NodeConfig = toml::from_str("metrics_listen = \"0.0.0.0:9100\"").unwrap();
        assert_eq!(c.metrics_listen.as_deref(), Some("0.0.0.0:9100"));
        let bad = NodeConfig { metrics_listen: Some("9100".into()), ..Default::default() };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.starts_with("`metrics_listen`") && err.contains("host:port"), "{err}");
    }

    #[test]
    fn tls_section_is_checked_at_validation() {
        let c: NodeConfig = toml::from_str(
            "[tls]\ncert_file = \"/nope/c.pem\"\nkey_file = \"/nope/k.pem\"\nca_file = \"/nope/ca.pem\"",
        )
        .unwrap();
        assert_eq!(c.tls.as_ref().and_then(|t| t.cert_file.as_deref()), Some(Path::new("/nope/c.pem")));
        assert_eq!(c.validate().unwrap_err().to_string(), "certificate file /nope/c.pem does not exist");
        let partial: NodeConfig = toml::from_str("[tls]\nca_file = \"/nope/ca.pem\"").unwrap();
        let err = partial.validate().unwrap_err().to_string();
        assert!(err.starts_with("`tls.cert_file` is required to serve TLS"), "{err}");
        let err = toml::from_str::<NodeConfig>("[tls]\ncert = \"c.pem\"").unwrap_err();
        assert!(err.to_string().contains("cert"), "{err}");
    }

    #[test]
    fn peers_parse_and_report_bad_input() {
        assert_eq!(parse_peers("1=h:1, 2=h:2").unwrap().len(), 2);
        assert!(parse_peers("1h:1").unwrap_err().contains("<id>=<host:port>"));
        assert!(parse_peers("x=h:1").unwrap_err().contains("not a number"));
    }
}
