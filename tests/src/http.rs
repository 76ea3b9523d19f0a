//! A minimal HTTP/1.1 client for the console tests and benchmark: one request per connection
//! (`Connection: close`), the whole answer read, headers kept as sent.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound on one request.
const TIMEOUT: Duration = Duration::from_secs(150);

/// An answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .map_err(|e| anyhow::anyhow!("not JSON ({e}): status {}: {}", self.status, self.body))
    }
}

/// A request under construction.
#[derive(Debug, Clone)]
pub struct Request {
    method: &'static str,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

pub fn get(path: &str) -> Request {
    Request { method: "GET", path: path.to_owned(), headers: Vec::new(), body: String::new() }
}

/// A form POST (`application/x-www-form-urlencoded`; the fields must need no encoding).
pub fn post_form(path: &str, fields: &[(&str, &str)]) -> Request {
    let body = fields.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
    Request { method: "POST", path: path.to_owned(), headers: Vec::new(), body }
        .header("content-type", "application/x-www-form-urlencoded")
}

impl Request {
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn bearer(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    pub async fn send(&self, addr: SocketAddr) -> anyhow::Result<Answer> {
        tokio::time::timeout(TIMEOUT, self.exchange(addr))
            .await
            .map_err(|_| anyhow::anyhow!("{} {}: no answer within {TIMEOUT:?}", self.method, self.path))?
    }

    /// The request as sent, for byte counts.
    fn encode(&self, addr: SocketAddr) -> String {
        let mut req =
            format!("{} {} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n", self.method, self.path);
        for (k, v) in &self.headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !self.body.is_empty() || self.method == "POST" {
            req.push_str(&format!("content-length: {}\r\n", self.body.len()));
        }
        req.push_str("\r\n");
        req.push_str(&self.body);
        req
    }

    async fn exchange(&self, addr: SocketAddr) -> anyhow::Result<Answer> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(self.encode(addr).as_bytes()).await?;
        // Read to the end of the body: its content-length when given (a server may keep the
        // connection open regardless), else until the server closes.
        let mut raw = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                let length = head
                    .split("\r\n")
                    .filter_map(|l| l.strip_prefix("content-length:"))
                    .find_map(|v| v.trim().parse::<usize>().ok());
                if length.is_some_and(|n| raw.len() >= end + 4 + n) {
                    break;
                }
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&chunk[..n]);
        }
        parse(&raw)
    }
}

fn parse(raw: &[u8]) -> anyhow::Result<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) =
        text.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("no header end in {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(body)? } else { body.to_owned() };
    Ok(Answer { status, headers, body })
}

fn dechunk(mut s: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").ok_or_else(|| anyhow::anyhow!("bad chunk"))?;
        let n = usize::from_str_radix(size.trim(), 16)?;
        if n == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..n).ok_or_else(|| anyhow::anyhow!("short chunk"))?);
        s = rest.get(n + 2..).unwrap_or_default();
    }
}
