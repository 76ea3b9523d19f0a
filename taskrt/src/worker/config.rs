//! Configuration of a `cairn-worker run` process: one struct ([`WorkerConfig`]), defaults
//! defined once (its `Default`), a TOML file, `CAIRN_WORKER_*` environment variables and
//! command-line flags ([`RunArgs`]), in increasing order of precedence, and a
//! [`WorkerConfig::validate`] that names the offending key.
//!
//! Timing defaults, and why:
//! - `reconnect_backoff_min/max = 50ms / 2s`: a leader change takes about 1-2 s (the replicas'
//!   election timeout), so a worker probing every replica a few times per second finds the new
//!   leader soon after it is elected, while a cluster that is down entirely is probed at most
//!   every ~2 s per worker. The backoff is jittered so that workers do not reconnect in lockstep.
//! - `connect_timeout = 2s`: bounds the TCP connect and the `Attach` call; a replica that does
//!   not answer in 2 s on a LAN is as good as down, and the next one is tried.
//! - `register_timeout = 5s`: how long to wait for `registered` after attaching.
//! - `cancel_timeout = 10s`: how long canceled tasks (or all tasks, on shutdown) may take to
//!   stop before they are aborted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_proto::addr::{is_host_port, normalize as normalize_endpoint};
use serde::{Deserialize, Serialize};

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Everything a worker process needs to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Coordinator replicas (`host:port`), any of them; the worker finds the leader. Required.
    pub coordinators: Vec<String>,
    /// Stable identity of this process towards the leader; `<hostname>-<pid>` when unset.
    pub worker_id: Option<String>,
    /// How many subtasks this worker runs at most.
    pub slots: u32,
    /// First pause after a round of failed connection attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_min: Duration,
    /// Longest pause between rounds of connection attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_max: Duration,
    /// Bound on connecting to a replica and on its answer to `Attach`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on the wait for `registered` after attaching.
    #[serde(with = "humantime_serde")]
    pub register_timeout: Duration,
    /// Bound on the wait for canceled tasks to stop before they are aborted.
    #[serde(with = "humantime_serde")]
    pub cancel_timeout: Duration,
    /// Concurrent asynchronous snapshot parts across all tasks of this worker.
    pub snapshot_concurrency: usize,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `cairn_taskrt=debug`.
    pub log: String,
    pub log_format: LogFormat,
    /// `host:port` of the Prometheus `/metrics` endpoint; none when unset.
    pub metrics_listen: Option<String>,
    /// `ip:port` the data exchange listens on, for the channels of jobs that span workers (port
    /// 0 picks a free one).
    pub data_listen: String,
    /// Where other workers dial to reach the data exchange: `host:port`, `[ipv6]:port`, or a bare
    /// host or IP address (v4 or v6) that takes the port the exchange listens on; the bound address
    /// when unset (required when `data_listen` is a wildcard address such as `0.0.0.0`).
    pub data_advertise: Option<String>,
    /// TLS towards the replicas (`[tls]`: `ca_file`, and `cert_file` + `key_file` to present a
    /// client certificate); unset connects in plaintext. A client certificate naming this worker
    /// (`cairn://worker/<id>`) authenticates it without a token.
    pub tls: Option<cairn_proto::tls::TlsFiles>,
    /// File holding the worker token the replicas accept (one line; a replica alone generates
    /// one into `<data_dir>/worker-token`).
    pub token_file: Option<PathBuf>,
    /// The worker token itself (from `CAIRN_WORKER_TOKEN`; never from flags or the file, so it
    /// stays out of `ps` and `--print-config`). Takes precedence over `token_file`.
    #[serde(skip)]
    pub token: Option<cairn_proto::auth::Secret>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            coordinators: Vec::new(),
            worker_id: None,
            slots: 8,
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            register_timeout: Duration::from_secs(5),
            cancel_timeout: Duration::from_secs(10),
            snapshot_concurrency: 4,
            log: "info".to_owned(),
            log_format: LogFormat::Text,
            metrics_listen: None,
            data_listen: "127.0.0.1:0".to_owned(),
            data_advertise: None,
            tls: None,
            token_file: None,
            token: None,
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
    #[error("worker token: {0}")]
    Token(String),
}

/// Longest accepted timeout or backoff.
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key, reason: reason.into() }
}

impl WorkerConfig {
    /// A configuration with defaults and the given coordinator endpoints.
    pub fn new(coordinators: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self { coordinators: coordinators.into_iter().map(Into::into).collect(), ..Self::default() }
    }

    /// Reads a TOML file; unknown keys are rejected.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source: Box::new(source) })
    }

    /// The worker id in use: the configured one, or `<hostname>-<pid>`.
    pub fn effective_worker_id(&self) -> String {
        match &self.worker_id {
            Some(id) => id.clone(),
            None => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "worker".to_owned());
                format!("{host}-{}", std::process::id())
            }
        }
    }

    /// The coordinator endpoints, normalized (`http://` and trailing `/` removed).
    pub fn endpoints(&self) -> Vec<String> {
        self.coordinators.iter().map(|e| normalize_endpoint(e)).collect()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.coordinators.is_empty() {
            return Err(invalid(
                "coordinators",
                "is required: give at least one coordinator replica address (host:port)",
            ));
        }
        for e in self.endpoints() {
            if !is_host_port(&e) {
                return Err(invalid("coordinators", format!("{e:?} is not a host:port address")));
            }
        }
        if let Some(id) = &self.worker_id
            && (id.trim().is_empty() || id.len() > 256)
        {
            return Err(invalid("worker_id", "must be 1-256 characters (or unset for <hostname>-<pid>)"));
        }
        if self.slots == 0 {
            return Err(invalid("slots", "must be at least 1"));
        }
        if self.reconnect_backoff_min.is_zero() {
            return Err(invalid("reconnect_backoff_min", "must be above zero"));
        }
        if self.reconnect_backoff_max < self.reconnect_backoff_min {
            return Err(invalid("reconnect_backoff_max", "must not be below reconnect_backoff_min"));
        }
        for (key, d) in [
            ("reconnect_backoff_max", self.reconnect_backoff_max),
            ("connect_timeout", self.connect_timeout),
            ("register_timeout", self.register_timeout),
            ("cancel_timeout", self.cancel_timeout),
        ] {
            if d.is_zero() {
                return Err(invalid(key, "must be above zero"));
            }
            // Larger values overflow the arithmetic of timers.
            if d > MAX_TIMEOUT {
                return Err(invalid(key, "must be at most 1 day"));
            }
        }
        if self.snapshot_concurrency == 0 {
            return Err(invalid("snapshot_concurrency", "must be at least 1"));
        }
        if let Some(addr) = &self.metrics_listen
            && !is_host_port(addr)
        {
            return Err(invalid(
                "metrics_listen",
                format!("{addr:?} is not a host:port address (e.g. 127.0.0.1:9101), or leave it unset"),
            ));
        }
        let listen = self.data_listen_addr()?;
        match &self.data_advertise {
            Some(_) => {
                self.data_advertise_addr(listen.port().max(1))?;
            }
            None if listen.ip().is_unspecified() => {
                return Err(invalid(
                    "data_advertise",
                    format!(
                        "is required when data_listen is the wildcard {listen}: give the host:port other workers reach"
                    ),
                ));
            }
            _ => {}
        }
        let tls = self.tls.as_ref();
        if let Some((key, why)) = cairn_protocol::operators::first_climbing_path(&[
            ("token_file", self.token_file.as_deref()),
            ("tls.cert_file", tls.and_then(|t| t.cert_file.as_deref())),
            ("tls.key_file", tls.and_then(|t| t.key_file.as_deref())),
            ("tls.ca_file", tls.and_then(|t| t.ca_file.as_deref())),
        ]) {
            return Err(ConfigError::Invalid { key, reason: why });
        }
        self.client_tls()?;
        Ok(())
    }

    /// `data_listen` as a socket address.
    pub fn data_listen_addr(&self) -> Result<std::net::SocketAddr, ConfigError> {
        self.data_listen.parse().map_err(|_| {
            invalid(
                "data_listen",
                format!(
                    "{:?} is not an ip:port address (e.g. 0.0.0.0:7500, or 127.0.0.1:0)",
                    self.data_listen
                ),
            )
        })
    }

    /// The address other workers dial for this worker's data exchange, given the port the
    /// exchange is bound to: `data_advertise` as given when it names a port, with that port when it
    /// is a bare host or IP address (an IPv6 address gets its brackets, so a Kubernetes pod IP can
    /// be passed as it is), or the bound address when unset.
    pub fn data_advertise_addr(&self, bound_port: u16) -> Result<Option<String>, ConfigError> {
        let Some(given) = self.data_advertise.as_deref() else { return Ok(None) };
        let given = given.trim();
        if let Ok(ip) = given.parse::<std::net::IpAddr>() {
            return Ok(Some(std::net::SocketAddr::new(ip, bound_port).to_string()));
        }
        if given.parse::<std::net::SocketAddr>().is_ok() {
            return Ok(Some(given.to_owned()));
        }
        if given.matches(':').count() > 1 {
            return Err(invalid(
                "data_advertise",
                format!(
                    "{given:?} is ambiguous: write an IPv6 address as [address]:port, or give the bare address"
                ),
            ));
        }
        let host_ok = |h: &str| {
            !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        };
        match given.rsplit_once(':') {
            None if host_ok(given) => Ok(Some(format!("{given}:{bound_port}"))),
            Some((host, _)) if host_ok(host) && is_host_port(given) => Ok(Some(given.to_owned())),
            _ => Err(invalid(
                "data_advertise",
                format!("{given:?} is not a host:port address, or a bare host or IP address"),
            )),
        }
    }

    /// The worker token to present: `token` (`CAIRN_WORKER_TOKEN`), else the one in
    /// `token_file`, else none (a client certificate may authenticate the worker instead). Read
    /// when the worker starts, like the admin token of a replica.
    pub fn resolve_token(&self) -> Result<Option<cairn_proto::auth::Secret>, ConfigError> {
        if let Some(t) = &self.token {
            return Ok(Some(t.clone()));
        }
        let Some(path) = &self.token_file else { return Ok(None) };
        cairn_proto::auth::read_secret_file(path, "the worker token").map(Some).map_err(ConfigError::Token)
    }

    /// The TLS material to connect with, loaded and checked; `None` when TLS is not configured.
    pub fn client_tls(&self) -> Result<Option<cairn_proto::tls::ClientTls>, ConfigError> {
        Ok(self.tls.as_ref().map(|t| t.load_client()).transpose()?)
    }
}

/// Flags of `cairn-worker run`. Each one overrides the config file; each has a
/// `CAIRN_WORKER_*` environment variable that does the same (flags win over the environment).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// TOML config file (keys as in `--print-config`).
    #[arg(long, short = 'c', env = "CAIRN_WORKER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Coordinator replicas, any of them, comma-separated `host:port` (required here or in the
    /// config file).
    #[arg(long, env = "CAIRN_WORKER_COORDINATORS", value_delimiter = ',')]
    pub coordinators: Vec<String>,
    /// Stable worker id (default `<hostname>-<pid>`).
    #[arg(long, env = "CAIRN_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Subtasks this worker runs at most (default 8).
    #[arg(long, env = "CAIRN_WORKER_SLOTS")]
    pub slots: Option<u32>,
    /// First pause between rounds of failed connection attempts, e.g. `50ms` (default 50ms).
    #[arg(long, env = "CAIRN_WORKER_RECONNECT_BACKOFF_MIN", value_parser = humantime::parse_duration)]
    pub reconnect_backoff_min: Option<Duration>,
    /// Longest pause between rounds of connection attempts (default 2s).
    #[arg(long, env = "CAIRN_WORKER_RECONNECT_BACKOFF_MAX", value_parser = humantime::parse_duration)]
    pub reconnect_backoff_max: Option<Duration>,
    /// Bound on connecting to a replica and its answer to Attach (default 2s).
    #[arg(long, env = "CAIRN_WORKER_CONNECT_TIMEOUT", value_parser = humantime::parse_duration)]
    pub connect_timeout: Option<Duration>,
    /// Bound on the wait for `registered` after attaching (default 5s).
    #[arg(long, env = "CAIRN_WORKER_REGISTER_TIMEOUT", value_parser = humantime::parse_duration)]
    pub register_timeout: Option<Duration>,
    /// Bound on the wait for canceled tasks to stop before they are aborted (default 10s).
    #[arg(long, env = "CAIRN_WORKER_CANCEL_TIMEOUT", value_parser = humantime::parse_duration)]
    pub cancel_timeout: Option<Duration>,
    /// Concurrent asynchronous snapshot writes across all tasks (default 4).
    #[arg(long, env = "CAIRN_WORKER_SNAPSHOT_CONCURRENCY")]
    pub snapshot_concurrency: Option<usize>,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `cairn_taskrt=debug` (default info).
    #[arg(long, env = "CAIRN_WORKER_LOG")]
    pub log: Option<String>,
    /// Log format (default text).
    #[arg(long, env = "CAIRN_WORKER_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Serve Prometheus metrics on GET /metrics at this host:port (default: off).
    #[arg(long, env = "CAIRN_WORKER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// ip:port of the data exchange for jobs spanning workers (default 127.0.0.1:0).
    #[arg(long, env = "CAIRN_WORKER_DATA_LISTEN")]
    pub data_listen: Option<String>,
    /// host:port other workers dial for the data exchange, or a bare host or IP address that
    /// takes the listen port (default: the bound address).
    #[arg(long, env = "CAIRN_WORKER_DATA_ADVERTISE")]
    pub data_advertise: Option<String>,
    /// The CA (PEM) that signed the replicas' certificates: connect with TLS.
    #[arg(long, env = "CAIRN_WORKER_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) to present, with --tls-key-file (optional).
    #[arg(long, env = "CAIRN_WORKER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM).
    #[arg(long, env = "CAIRN_WORKER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// File holding the worker token (the token itself may come from CAIRN_WORKER_TOKEN).
    #[arg(long, env = "CAIRN_WORKER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl RunArgs {
    /// The config file (or the defaults) with these flags applied, validated.
    pub fn to_config(&self) -> Result<WorkerConfig, ConfigError> {
        let mut c = match &self.config {
            Some(path) => WorkerConfig::from_file(path)?,
            None => WorkerConfig::default(),
        };
        self.apply(&mut c);
        // The value only from the environment: a flag would show it in `ps`.
        if let Some(t) = cairn_proto::auth::secret_from_env("CAIRN_WORKER_TOKEN", "the worker token")
            .map_err(ConfigError::Token)?
        {
            c.token = Some(t);
        }
        c.validate()?;
        Ok(c)
    }

    /// Overrides the keys given as flags (or environment variables).
    pub fn apply(&self, c: &mut WorkerConfig) {
        if !self.coordinators.is_empty() {
            c.coordinators =
                self.coordinators.iter().map(|e| e.trim().to_owned()).filter(|e| !e.is_empty()).collect();
        }
        if let Some(v) = &self.worker_id {
            c.worker_id = Some(v.clone());
        }
        if let Some(v) = self.slots {
            c.slots = v;
        }
        if let Some(v) = self.reconnect_backoff_min {
            c.reconnect_backoff_min = v;
        }
        if let Some(v) = self.reconnect_backoff_max {
            c.reconnect_backoff_max = v;
        }
        if let Some(v) = self.connect_timeout {
            c.connect_timeout = v;
        }
        if let Some(v) = self.register_timeout {
            c.register_timeout = v;
        }
        if let Some(v) = self.cancel_timeout {
            c.cancel_timeout = v;
        }
        if let Some(v) = self.snapshot_concurrency {
            c.snapshot_concurrency = v;
        }
        if let Some(v) = &self.log {
            c.log = v.clone();
        }
        if let Some(v) = self.log_format {
            c.log_format = v;
        }
        if let Some(v) = &self.metrics_listen {
            c.metrics_listen = Some(v.trim().to_owned());
        }
        if let Some(v) = &self.data_listen {
            c.data_listen = v.trim().to_owned();
        }
        if let Some(v) = &self.data_advertise {
            c.data_advertise = Some(v.trim().to_owned());
        }
        c.tls = cairn_proto::tls::TlsFiles::overlay(
            c.tls.take(),
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
            self.tls_ca_file.as_deref(),
        );
        if let Some(v) = &self.token_file {
            c.token_file = Some(v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_only_coordinators() {
        let err = WorkerConfig::default().validate().unwrap_err();
        assert!(err.to_string().starts_with("`coordinators`"), "{err}");
        let c = WorkerConfig::new(["127.0.0.1:7400"]);
        c.validate().unwrap();
        assert_eq!(c.slots, 8);
        assert_eq!(c.reconnect_backoff_min, Duration::from_millis(50));
    }

    #[test]
    fn toml_uses_humantime_and_rejects_unknown_keys() {
        let c: WorkerConfig =
            toml::from_str("coordinators = [\"a:1\"]\nconnect_timeout = \"250ms\"\nlog_format = \"json\"")
                .unwrap();
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.slots, WorkerConfig::default().slots);
        let err = toml::from_str::<WorkerConfig>("coordinator = [\"a:1\"]").unwrap_err();
        assert!(err.to_string().contains("coordinator"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = WorkerConfig::new(["http://a:1/", "b"]);
        assert!(c.validate().unwrap_err().to_string().contains("\"b\" is not a host:port"));
        c.coordinators = vec!["a:1".into()];
        c.slots = 0;
        assert!(c.validate().unwrap_err().to_string().starts_with("`slots`"));
        c.slots = 1;
        c.reconnect_backoff_max = Duration::from_millis(1);
        assert!(c.validate().unwrap_err().to_string().starts_with("`reconnect_backoff_max`"));
    }

    #[test]
    fn metrics_listen_is_optional_and_validated() {
        let mut c = WorkerConfig::new(["a:1"]);
        assert_eq!(c.metrics_listen, None);
        let args = RunArgs { metrics_listen: Some(" 127.0.0.1:9101 ".into()), ..RunArgs::default() };
        args.apply(&mut c);
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:9101"));
        c.validate().unwrap();
        c.metrics_listen = Some("9101".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("`metrics_listen`") && err.contains("host:port"), "{err}");
        let file: WorkerConfig =
            toml::from_str("coordinators = [\"a:1\"]\nmetrics_listen = \"0.0.0.0:9101\"").unwrap();
        assert_eq!(file.metrics_listen.as_deref(), Some("0.0.0.0:9101"));
    }

    #[test]
    fn the_data_exchange_address_is_validated() {
        let base = WorkerConfig::new(["127.0.0.1:7400"]);
        let with = |listen: &str, advertise: Option<&str>| WorkerConfig {
            data_listen: listen.into(),
            data_advertise: advertise.map(str::to_owned),
            ..base.clone()
        };
        with("127.0.0.1:0", None).validate().unwrap();
        with("0.0.0.0:7500", Some("worker-1.internal:7500")).validate().unwrap();
        let err = with("0.0.0.0:7500", None).validate().unwrap_err();
        assert!(err.to_string().starts_with("`data_advertise` is required"), "{err}");
        let err = with("worker-1:7500", None).validate().unwrap_err();
        assert!(err.to_string().starts_with("`data_listen`"), "{err}");
        let err = with("127.0.0.1:7500", Some("no port")).validate().unwrap_err();
        assert!(err.to_string().starts_with("`data_advertise`"), "{err}");
        let err = with("127.0.0.1:7500", Some("h:0")).validate().unwrap_err();
        assert!(err.to_string().starts_with("`data_advertise`"), "{err}");
        // A Kubernetes pod IP as it comes, v4 or v6: the listener's port is added, v6 bracketed.
        let advertised = |listen: &str, advertise: &str, bound: u16| {
            let c = with(listen, Some(advertise));
            c.validate()?;
            c.data_advertise_addr(bound)
        };
        assert_eq!(advertised("0.0.0.0:7500", "10.1.2.3", 7500).unwrap().as_deref(), Some("10.1.2.3:7500"));
        assert_eq!(advertised("[::]:7500", "fd00::5", 7500).unwrap().as_deref(), Some("[fd00::5]:7500"));
        assert_eq!(
            advertised("[::]:7500", "[fd00::5]:7600", 7500).unwrap().as_deref(),
            Some("[fd00::5]:7600")
        );
        assert_eq!(
            advertised("0.0.0.0:7500", "worker-1.internal", 7501).unwrap().as_deref(),
            Some("worker-1.internal:7501")
        );
        // Eight groups or fewer with `::` is an address: `fd00::5:7500` is one, and gets the port.
        assert_eq!(
            advertised("[::]:7500", "fd00::5:7500", 7500).unwrap().as_deref(),
            Some("[fd00::5:7500]:7500")
        );
        let err = advertised("[::]:7500", "fd00::g:7500", 7500).unwrap_err().to_string();
        assert!(err.starts_with("`data_advertise`") && err.contains("[address]:port"), "{err}");
        assert_eq!(with("127.0.0.1:0", None).data_advertise_addr(4242).unwrap(), None);
        let args = RunArgs {
            data_listen: Some(" 0.0.0.0:7501 ".into()),
            data_advertise: Some("h:7501".into()),
            ..Default::default()
        };
        let mut c = base;
        args.apply(&mut c);
        assert_eq!((c.data_listen.as_str(), c.data_advertise.as_deref()), ("0.0.0.0:7501", Some("h:7501")));
    }

    #[test]
    fn tls_comes_from_flags_or_the_file_and_is_checked() {
        let mut c: WorkerConfig =
            toml::from_str("coordinators = [\"a:1\"]\n[tls]\nca_file = \"/nope/ca.pem\"").unwrap();
        assert_eq!(c.validate().unwrap_err().to_string(), "CA file /nope/ca.pem does not exist");
        let args = RunArgs { tls_cert_file: Some("/nope/c.pem".into()), ..RunArgs::default() };
        args.apply(&mut c);
        let tls = c.tls.clone().unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/nope/ca.pem")));
        assert_eq!(tls.cert_file.as_deref(), Some(Path::new("/nope/c.pem")));
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("`tls.key_file` is required with `tls.cert_file`"), "{err}");
        let mut plain = WorkerConfig::new(["a:1"]);
        RunArgs::default().apply(&mut plain);
        assert_eq!(plain.tls, None);
    }

    #[test]
    fn flags_override_the_file() {
        let args = RunArgs {
            coordinators: vec!["x:1".into(), " y:2 ".into()],
            slots: Some(3),
            ..RunArgs::default()
        };
        let mut c = WorkerConfig::new(["a:1"]);
        args.apply(&mut c);
        assert_eq!(c.coordinators, vec!["x:1".to_owned(), "y:2".to_owned()]);
        assert_eq!(c.slots, 3);
        assert!(c.effective_worker_id().ends_with(&format!("-{}", std::process::id())));
    }
}
