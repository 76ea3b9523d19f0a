//! Headless Chromium driven over the DevTools protocol, for the web console's browser suite
//! (`cairn-console-browser`). Chromium is started with `--remote-debugging-port=0` on loopback;
//! one page target is driven over a minimal WebSocket client (RFC 6455: masked text frames out,
//! whole messages in), which is all the protocol needs.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A running headless Chromium; killed (by its own PID) on drop.
pub struct Browser {
    child: Child,
    pub devtools: SocketAddr,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `binary` headless with a fresh profile and waits for its DevTools address.
    pub fn start(binary: &Path, window: (u32, u32)) -> anyhow::Result<Self> {
        let profile = tempfile::tempdir()?;
        let mut child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                &format!("--window-size={},{}", window.0, window.1),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        // Chromium prints `DevTools listening on ws://127.0.0.1:PORT/devtools/browser/<id>`.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && let Some(rest) = line.split("DevTools listening on ws://").nth(1) {
                    let addr = rest.split('/').next().unwrap_or_default().to_owned();
                    sent = tx.send(addr).is_ok();
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("{} printed no DevTools address within 60 s", binary.display());
            }
        };
        let devtools = addr.parse().with_context(|| format!("DevTools address {addr:?}"))?;
        Ok(Self { child, devtools, _profile: profile })
    }

    /// The page Chromium opened, as a DevTools session.
    pub async fn page(&self) -> anyhow::Result<Page> {
        let list = crate::http::get("/json/list").send(self.devtools).await?.json()?;
        let url = list
            .as_array()
            .and_then(|targets| targets.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .ok_or_else(|| anyhow::anyhow!("no page target in {list}"))?;
        let path = url
            .strip_prefix("ws://")
            .and_then(|r| r.find('/').map(|i| r[i..].to_owned()))
            .ok_or_else(|| anyhow::anyhow!("unexpected target url {url}"))?;
        let ws = WebSocket::connect(self.devtools, &path).await?;
        let mut page = Page { ws, next_id: 0 };
        page.call("Page.enable", json!({})).await?;
        page.call("Runtime.enable", json!({})).await?;
        Ok(page)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One page, driven by DevTools calls.
pub struct Page {
    ws: WebSocket,
    next_id: u64,
}

impl Page {
    /// Sends a command and returns its result (events in between are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.ws.send(&json!({ "id": id, "method": method, "params": params }).to_string()).await?;
        loop {
            let msg: Value = serde_json::from_str(&self.ws.receive().await?)?;
            if msg["id"] == id {
                if let Some(e) = msg.get("error") {
                    anyhow::bail!("{method}: {e}");
                }
                return Ok(msg["result"].clone());
            }
        }
    }

    pub async fn navigate(&mut self, url: &str) -> anyhow::Result<()> {
        let r = self.call("Page.navigate", json!({ "url": url })).await?;
        if let Some(e) = r["errorText"].as_str() {
            anyhow::bail!("navigating to {url}: {e}");
        }
        Ok(())
    }

    /// Evaluates `expression` in the page and returns its value.
    pub async fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let r =
            self.call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true })).await?;
        if let Some(e) = r.get("exceptionDetails") {
            anyhow::bail!("{expression}: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls `expression` until it is truthy (not false, null, 0 or ""), within `timeout`.
    pub async fn wait_for(
        &mut self,
        what: &str,
        expression: &str,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.eval(expression).await {
                Ok(v)
                    if !matches!(&v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("") =>
                {
                    return Ok(v);
                }
                Ok(v) => v,
                // The page may be between two documents.
                Err(e) => Value::String(e.to_string()),
            };
            if Instant::now() >= deadline {
                let url = self.eval("location.href").await.unwrap_or_default();
                anyhow::bail!("timed out after {timeout:?} waiting for {what} on {url} (last: {last})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes a PNG of the whole page to `path`.
    pub async fn screenshot(&mut self, path: &Path) -> anyhow::Result<PathBuf> {
        // A page being laid out (a live refresh, a navigation) may have no size for a moment.
        let mut attempt = 0;
        let r = loop {
            attempt += 1;
            let params = json!({ "format": "png", "captureBeyondViewport": true });
            match self.call("Page.captureScreenshot", params).await {
                Ok(r) => break r,
                Err(e) if attempt < 10 => {
                    tracing::debug!(error = %e, attempt, "screenshot not taken yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let data = r["data"].as_str().ok_or_else(|| anyhow::anyhow!("no screenshot data"))?;
        let png = base64::engine::general_purpose::STANDARD.decode(data)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(path.to_owned())
    }
}

/// A client WebSocket over plain TCP.
struct WebSocket {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl WebSocket {
    async fn connect(addr: SocketAddr, path: &str) -> anyhow::Result<Self> {
        let mut stream = TcpStream::connect(addr).await?;
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "DevTools closed the connection during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        anyhow::ensure!(head.starts_with("HTTP/1.1 101"), "WebSocket handshake refused: {head}");
        Ok(Self { stream, buf: buf[end..].to_vec() })
    }

    async fn send(&mut self, text: &str) -> anyhow::Result<()> {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask: [u8; 4] = rand::random();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    async fn fill(&mut self, n: usize) -> anyhow::Result<()> {
        while self.buf.len() < n {
            let mut chunk = vec![0u8; 64 * 1024];
            let got = self.stream.read(&mut chunk).await?;
            anyhow::ensure!(got > 0, "DevTools closed the connection");
            self.buf.extend_from_slice(&chunk[..got]);
        }
        Ok(())
    }

    async fn take(&mut self, n: usize) -> anyhow::Result<Vec<u8>> {
        self.fill(n).await?;
        Ok(self.buf.drain(..n).collect())
    }

    /// The next whole text message (pings answered, continuation frames joined).
    async fn receive(&mut self) -> anyhow::Result<String> {
        let mut message = Vec::new();
        loop {
            let head = self.take(2).await?;
            let (fin, opcode, masked) = (head[0] & 0x80 != 0, head[0] & 0x0f, head[1] & 0x80 != 0);
            let len = match head[1] & 0x7f {
                126 => {
                    let b = self.take(2).await?;
                    u16::from_be_bytes([b[0], b[1]]) as usize
                }
                127 => {
                    let b = self.take(8).await?;
                    u64::from_be_bytes(b.try_into().map_err(|_| anyhow::anyhow!("bad length"))?) as usize
                }
                n => n as usize,
            };
            let mask = if masked { Some(self.take(4).await?) } else { None };
            let mut payload = self.take(len).await?;
            if let Some(m) = mask {
                payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= m[i % 4]);
            }
            match opcode {
                0x9 => {
                    // Ping: answer with a pong carrying the same payload (masked, as a client).
                    let mut frame = vec![0x8a, 0x80 | payload.len().min(125) as u8, 0, 0, 0, 0];
                    frame.extend_from_slice(&payload[..payload.len().min(125)]);
                    self.stream.write_all(&frame).await?;
                }
                0x8 => anyhow::bail!("DevTools closed the WebSocket"),
                0xa => {}
                _ => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return Ok(String::from_utf8(message)?);
                    }
                }
            }
        }
    }
}
