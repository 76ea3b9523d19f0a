//! `cairn-console`: Cairn's web console. Every replica can serve it (`console_listen`); it shows
//! the cluster, the jobs, their checkpoints and the workers, and runs the operator actions
//! (checkpoint, savepoint, stop with savepoint, cancel, checkpoint interval).
//!
//! The console is a client of the admin API, like `cairnctl`: it reads and acts through the
//! leader-following client with the admin token, so a follower's console reads through the
//! leader, and actions carry request ids the cluster applies once.
//!
//! | module | owns |
//! | --- | --- |
//! | [`source`] | the admin API calls, with their deadlines |
//! | [`observer`] | the cluster status read once per interval, and the leader history |
//! | [`model`] | what each view shows (rendered as HTML and as JSON) |
//! | [`views`] | the pages (maud templates) |
//! | [`charts`] | SVG charts drawn on the server |
//! | [`actions`] | the actions, their validation and request ids |
//! | [`auth`] | the admin token, the session cookie, the same-origin check |
//! | [`server`] | the HTTP routes |

pub mod actions;
pub mod auth;
pub mod charts;
pub mod model;
pub mod observer;
pub mod server;
pub mod source;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use source::SourceConfig;

/// How often the cluster status is read (and the leader history updated).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);
/// How long shutting down waits for requests in progress.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the console could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("console_listen: cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("console: {0}")]
    Listener(std::io::Error),
    #[error("console: {0}")]
    Source(#[from] source::SourceError),
    #[error("console: {0}")]
    Token(String),
}

/// What a console serves and how.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub source: SourceConfig,
    /// Whether read-only views need the admin token too (actions always do).
    pub views_need_token: bool,
    /// How often the cluster status is read.
    pub refresh: Duration,
}

/// Binds the console's listener (`host:port`).
pub async fn bind(addr: &str) -> Result<TcpListener, ConsoleError> {
    TcpListener::bind(addr).await.map_err(|source| ConsoleError::Bind { addr: addr.to_owned(), source })
}

/// A running console.
pub struct Console {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
    observer: JoinHandle<()>,
}

impl Console {
    /// Serves the console on `listener`.
    pub fn start(listener: TcpListener, config: ConsoleConfig) -> Result<Self, ConsoleError> {
        let addr = listener.local_addr().map_err(ConsoleError::Listener)?;
        let source = source::Source::new(&config.source)?;
        let gate =
            auth::Gate::new(&config.source.token, config.views_need_token).map_err(ConsoleError::Token)?;
        let (cluster, observer) = observer::spawn(source.clone(), config.refresh);
        let app = Arc::new(server::AppState { source, cluster, gate });
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(
            axum::serve(listener, server::router(app))
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .into_future(),
        );
        tracing::info!(%addr, views_need_token = config.views_need_token, "console serving");
        Ok(Self { addr, stop, server, observer })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to open in a browser.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stops serving; requests in progress get a few seconds to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        self.observer.abort();
        let _ = self.observer.await;
        let mut server = self.server;
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "console server ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "console server task failed"),
            Err(_) => {
                server.abort();
                tracing::warn!("console requests still open after {SHUTDOWN_GRACE:?}; closed");
            }
        }
        tracing::info!(addr = %self.addr, "console stopped");
    }
}
