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

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

pub use source::SourceConfig;

/// How often the cluster status is read (and the leader history updated).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);
/// How long shutting down waits for requests in progress.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Connections served at once (a browser opens a few); more are closed right after accepting.
const MAX_CONNECTIONS: usize = 256;
/// Bound on receiving a request head (also closes idle keep-alive connections).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

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
    server: JoinHandle<()>,
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
        let server = tokio::spawn(serve(listener, server::router(app), stopped));
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
        if let Err(e) = self.server.await {
            tracing::warn!(error = %e, "console server task failed");
        }
        tracing::info!(addr = %self.addr, "console stopped");
    }
}

/// Accepts connections until `stopped`, each served by its own task (HTTP/1.1); then closes idle
/// connections, gives the requests in progress [`SHUTDOWN_GRACE`] to finish and closes the rest.
async fn serve(listener: TcpListener, router: axum::Router, mut stopped: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::debug!(%peer, "too many console connections; closing this one");
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let service = TowerToHyperService::new(router.clone());
                    let mut closing = closing_rx.clone();
                    connections.spawn(async move {
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_READ_TIMEOUT)
                            .serve_connection(TokioIo::new(stream), service);
                        tokio::pin!(conn);
                        let served = tokio::select! {
                            r = conn.as_mut() => r,
                            () = async { let _ = closing.wait_for(|c| *c).await; } => {
                                // Finish the request in progress, if any, then close.
                                conn.as_mut().graceful_shutdown();
                                conn.await
                            }
                        };
                        if let Err(e) = served {
                            tracing::debug!(%peer, error = %e, "console connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a console connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
        }
    }
    drop(listener);
    let _ = closing.send(true);
    let drained =
        tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} })
            .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "console connections still open after {SHUTDOWN_GRACE:?}; closed"
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}
