//! The `/metrics` endpoint: HTTP/1.1 on a listener the binary binds, `GET /metrics` answered
//! with the registry in the Prometheus text format (version 0.0.4), `404` for any other path,
//! `405` for another method on `/metrics`.
//!
//! Why hyper directly (no web framework): it is already in the build through tonic, and one
//! route needs no router. Every connection runs in a task owned by the server's `JoinSet`;
//! connections are bounded in number and in how long their request head may take, so a slow or
//! idle client cannot hold the process. On shutdown the server stops accepting and drops the
//! connections in flight (a scrape is retried by Prometheus).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE as CONTENT_TYPE_HEADER, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// `Content-Type` of the answer: Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Connections served at once; more are closed right after accepting.
const MAX_CONNECTIONS: usize = 64;
/// Bound on receiving a request head (also closes idle keep-alive connections).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Encodes `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, shutdown: impl Future<Output = ()>) {
    let addr = listener.local_addr().ok();
    tracing::info!(addr = ?addr, "serving metrics on /metrics");
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::debug!(%peer, "too many metrics connections; closing this one");
                        continue;
                    }
                    let registry = registry.clone();
                    connections.spawn(async move {
                        let service = service_fn(move |req| {
                            let registry = registry.clone();
                            async move { Ok::<_, Infallible>(answer(&req, &registry)) }
                        });
                        let served = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_READ_TIMEOUT)
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        if let Err(e) = served {
                            tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a metrics connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    tracing::info!(addr = ?addr, "metrics endpoint stopped");
}

fn answer(req: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found: metrics are served on GET /metrics\n");
    }
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET /metrics\n");
        r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    match render(registry) {
        Ok(text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(CONTENT_TYPE_HEADER, HeaderValue::from_static(CONTENT_TYPE));
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the metrics");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics\n")
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE_HEADER, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;

    use super::*;

    async fn get(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_refuses_other_requests() {
        let mut registry = crate::metrics::new_registry();
        let g: Gauge = Gauge::default();
        registry.register("answer", "A test gauge", g.clone());
        g.set(42);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Arc::new(registry), async move {
            let _ = stopped.await;
        }));

        let ok = get(addr, "GET", "/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains("content-type: text/plain; version=0.0.4"), "{ok}");
        assert!(ok.contains("# TYPE cairn_answer gauge\n"), "{ok}");
        assert!(ok.contains("\ncairn_answer 42\n"), "{ok}");

        let missing = get(addr, "GET", "/").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = get(addr, "POST", "/metrics").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(post.contains("allow: GET"), "{post}");

        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still listening after shutdown");
    }
}
