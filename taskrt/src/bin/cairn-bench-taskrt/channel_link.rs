//! Scenario 5: stream elements per second through channels within one worker (bounded tokio
//! channels) versus between two workers' data exchanges over loopback TCP (credit-based link),
//! with `channels` producer/consumer pairs running at once. Both exchanges run in this process;
//! the bytes still cross the kernel's loopback.

use std::time::{Duration, Instant};

use anyhow::Context;
use cairn_taskrt::exchange::{Record, StreamElement};
use cairn_taskrt::network::{ChannelId, ExchangeKey, ExchangeService, NetworkOptions, PeerSpec};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub channels: u32,
    pub capacity: usize,
    pub warmup: Duration,
    pub window: Duration,
}

#[derive(Debug, Clone, Copy)]
pub struct Figures {
    pub elements_per_sec: f64,
}

/// Pumps records from every producer to its consumer until `stop`, counting what the consumers
/// received inside the measured window.
async fn pump(
    producers: Vec<mpsc::Sender<StreamElement>>,
    consumers: Vec<mpsc::Receiver<StreamElement>>,
    p: Params,
) -> anyhow::Result<Figures> {
    let start = Instant::now();
    let (measure_from, stop_at) = (start + p.warmup, start + p.warmup + p.window);
    let mut senders = Vec::new();
    for tx in producers {
        senders.push(tokio::spawn(async move {
            let mut seq = 0u64;
            while Instant::now() < stop_at {
                for _ in 0..256 {
                    seq += 1;
                    if tx.send(StreamElement::Record(Record { key: seq, value: seq, seq })).await.is_err() {
                        return;
                    }
                }
            }
        }));
    }
    let mut receivers = Vec::new();
    for mut rx in consumers {
        receivers.push(tokio::spawn(async move {
            let mut counted = 0u64;
            while let Some(_e) = rx.recv().await {
                let now = Instant::now();
                if now >= stop_at {
                    break;
                }
                if now >= measure_from {
                    counted += 1;
                }
            }
            counted
        }));
    }
    let mut total = 0u64;
    for r in receivers {
        total += r.await.context("consumer task")?;
    }
    for s in senders {
        s.abort();
    }
    Ok(Figures { elements_per_sec: total as f64 / p.window.as_secs_f64() })
}

pub async fn in_process(p: Params) -> anyhow::Result<Figures> {
    let (producers, consumers) = (0..p.channels).map(|_| mpsc::channel(p.capacity)).unzip();
    pump(producers, consumers, p).await
}

pub async fn over_loopback(p: Params) -> anyhow::Result<Figures> {
    let options = NetworkOptions::default();
    let addr = "127.0.0.1:0".parse()?;
    let a = ExchangeService::bind(addr, "bench-a", options.clone()).await?;
    let b = ExchangeService::bind(addr, "bench-b", options).await?;
    let key = ExchangeKey::generate();
    let ids: Vec<ChannelId> = (0..p.channels).map(|i| ChannelId { edge: 0, from: i, to: i }).collect();
    let (mut producers, mut outbound, mut inbound, mut consumers) = (vec![], vec![], vec![], vec![]);
    for id in &ids {
        let (tx, rx) = mpsc::channel(p.capacity);
        producers.push(tx);
        outbound.push((*id, rx));
        let (tx, rx) = mpsc::channel(p.capacity);
        inbound.push((*id, tx));
        consumers.push(rx);
    }
    let spec = |peer: &str, peer_addr, outbound, inbound| PeerSpec {
        job: "bench".into(),
        attempt: 0,
        key: key.clone(),
        peer_worker: peer.into(),
        peer_addr,
        outbound,
        inbound,
        outbound_priority: vec![],
        inbound_priority: vec![],
    };
    let _la = a.open(spec("bench-b", b.local_addr(), outbound, vec![]))?;
    let _lb = b.open(spec("bench-a", a.local_addr(), vec![], inbound))?;
    pump(producers, consumers, p).await
}
