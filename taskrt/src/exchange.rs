//! Data exchange between the subtasks of a job inside one worker.
//!
//! Every (upstream subtask, downstream subtask) pair connected by an edge gets one bounded
//! channel of [`StreamElement`]s, so a slow consumer back-pressures its producers and per-channel
//! FIFO order keeps barriers in place between records. The producing task owns an
//! [`OutputGate`] (one [`EdgeOutput`] per outgoing edge, partitioning records by the edge's
//! [`Partitioning`]); the consuming task owns an [`InputGate`] that reads its channels fairly and
//! skips the channels that alignment has parked.
//!
//! A send that finds its channel full waits for room; the [`OutputGate`] counts that wait as the
//! task's back-pressured time ([`TaskCounters`]). A send into a channel with room does not
//! read the clock.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use cairn_protocol::graph::Partitioning;
use cairn_protocol::keygroups::subtask_for_key;
use cairn_protocol::messages::CheckpointOptions;

use crate::metrics::{TaskCounters, Wait};

/// A data record. Records are plain `u64` triples, which is all the demo pipeline and the
/// benchmarks need and keeps the hot path allocation-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Record {
    /// Partitioning key (hash edges, keyed state).
    pub key: u64,
    pub value: u64,
    /// Provenance: the per-key sequence number of the source record this one derives from.
    pub seq: u64,
}

/// A checkpoint barrier as it travels through the data channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Barrier {
    pub checkpoint_id: u64,
    pub timestamp_ms: u64,
    pub options: CheckpointOptions,
}

/// What travels on a data channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamElement {
    Record(Record),
    /// Event time: no record with a smaller timestamp follows on this channel.
    Watermark(u64),
    Barrier(Barrier),
    /// The producer declined this checkpoint: do not wait for its barrier.
    CancelMarker(u64),
    /// The producer emits no more records; barriers and cancel markers still follow until
    /// `EndOfInput` (it waits for its final checkpoint, which crosses this channel).
    EndOfData,
    /// The producer finished; nothing follows.
    EndOfInput,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExchangeError {
    #[error("downstream subtask {subtask} of edge to {to:?} is gone")]
    DownstreamGone { to: String, subtask: usize },
}

/// The channels of one outgoing edge of one upstream subtask.
#[derive(Debug)]
pub struct EdgeOutput {
    /// Downstream vertex id, for errors.
    pub to: String,
    pub partitioning: Partitioning,
    /// Max parallelism of the downstream vertex (for hash partitioning).
    pub max_parallelism: u32,
    /// One sender per downstream subtask (indexed by subtask); a single one for forward edges.
    pub senders: Vec<mpsc::Sender<StreamElement>>,
    next_rebalance: usize,
}

impl EdgeOutput {
    pub fn new(
        to: String,
        partitioning: Partitioning,
        max_parallelism: u32,
        senders: Vec<mpsc::Sender<StreamElement>>,
        start: usize,
    ) -> Self {
        Self { to, partitioning, max_parallelism, senders, next_rebalance: start }
    }

    /// Sends `element` to downstream subtask `target`. Only when its channel is full does the
    /// send wait, and only then is the clock read: the wait counts as back-pressured time in
    /// `counters`.
    async fn send(
        &self,
        target: usize,
        element: StreamElement,
        counters: Option<&TaskCounters>,
    ) -> Result<(), ExchangeError> {
        let gone = || ExchangeError::DownstreamGone { to: self.to.clone(), subtask: target };
        let Some(tx) = self.senders.get(target) else { return Err(gone()) };
        // `try_send` does not take part in tokio's cooperative scheduling as `send` does: keep
        // the yield point, so that a producer whose channels always have room still lets the
        // other tasks of its worker thread run. (A yield is not back-pressure: it is not timed.)
        tokio::task::coop::consume_budget().await;
        match tx.try_send(element) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(gone()),
            Err(TrySendError::Full(element)) => {
                let _blocked = counters.map(|c| c.wait(Wait::BackPressured));
                tx.send(element).await.map_err(|_| gone())
            }
        }
    }

    async fn emit(&mut self, record: Record, counters: Option<&TaskCounters>) -> Result<(), ExchangeError> {
        let n = self.senders.len();
        match self.partitioning {
            Partitioning::Forward => self.send(0, StreamElement::Record(record), counters).await,
            Partitioning::Hash => {
                let target = subtask_for_key(record.key, self.max_parallelism, n as u32) as usize;
                self.send(target, StreamElement::Record(record), counters).await
            }
            Partitioning::Rebalance => {
                let target = self.next_rebalance % n.max(1);
                self.next_rebalance = self.next_rebalance.wrapping_add(1);
                self.send(target, StreamElement::Record(record), counters).await
            }
            Partitioning::Broadcast => self.broadcast(StreamElement::Record(record), counters).await,
        }
    }

    async fn broadcast(
        &self,
        element: StreamElement,
        counters: Option<&TaskCounters>,
    ) -> Result<(), ExchangeError> {
        for target in 0..self.senders.len() {
            self.send(target, element.clone(), counters).await?;
        }
        Ok(())
    }
}

/// All outgoing channels of one subtask.
#[derive(Debug, Default)]
pub struct OutputGate {
    edges: Vec<EdgeOutput>,
    /// Where waits for room in a full channel are counted (none: not counted).
    counters: Option<Arc<TaskCounters>>,
}

impl OutputGate {
    pub fn new(edges: Vec<EdgeOutput>) -> Self {
        Self { edges, counters: None }
    }

    /// Counts the time sends wait for room in a full channel as back-pressured time in
    /// `counters`.
    pub fn counting_into(mut self, counters: Arc<TaskCounters>) -> Self {
        self.counters = Some(counters);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Sends a record along every outgoing edge, partitioned per edge.
    pub async fn emit(&mut self, record: Record) -> Result<(), ExchangeError> {
        let counters = self.counters.as_deref();
        for edge in &mut self.edges {
            edge.emit(record, counters).await?;
        }
        Ok(())
    }

    /// Sends an event (barrier, watermark, cancel marker, end of input) to every channel.
    pub async fn broadcast(&mut self, element: StreamElement) -> Result<(), ExchangeError> {
        let counters = self.counters.as_deref();
        for edge in &self.edges {
            edge.broadcast(element.clone(), counters).await?;
        }
        Ok(())
    }
}

/// The incoming channels of one subtask; reads them round-robin, skipping parked ones.
#[derive(Debug)]
pub struct InputGate {
    channels: Vec<mpsc::Receiver<StreamElement>>,
    /// Parked (blocked by alignment) or finished channels are not polled.
    parked: Vec<bool>,
    finished: Vec<bool>,
    next: usize,
}

/// What reading the input gate produced.
#[derive(Debug, PartialEq, Eq)]
pub enum InputEvent {
    Element {
        channel: usize,
        element: StreamElement,
    },
    /// A channel closed without `EndOfInput`: its producer died.
    Disconnected {
        channel: usize,
    },
}

impl InputGate {
    pub fn new(channels: Vec<mpsc::Receiver<StreamElement>>) -> Self {
        let n = channels.len();
        Self { channels, parked: vec![false; n], finished: vec![false; n], next: 0 }
    }

    pub fn len(&self) -> usize {
        self.channels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    pub fn set_parked(&mut self, channel: usize, parked: bool) {
        if let Some(p) = self.parked.get_mut(channel) {
            *p = parked;
        }
    }

    pub fn unpark_all(&mut self) {
        self.parked.iter_mut().for_each(|p| *p = false);
    }

    pub fn mark_finished(&mut self, channel: usize) {
        if let Some(f) = self.finished.get_mut(channel) {
            *f = true;
        }
    }

    /// Whether every channel delivered `EndOfInput` (true without channels).
    pub fn all_finished(&self) -> bool {
        self.finished.iter().all(|f| *f)
    }

    /// Waits for the next element on any channel that is neither parked nor finished. Pends
    /// forever when there is none (the caller selects on other events meanwhile).
    pub async fn next(&mut self) -> InputEvent {
        poll_fn(|cx| {
            let n = self.channels.len();
            for step in 0..n {
                let i = (self.next + step) % n;
                if self.parked[i] || self.finished[i] {
                    continue;
                }
                match self.channels[i].poll_recv(cx) {
                    Poll::Ready(Some(element)) => {
                        self.next = (i + 1) % n;
                        return Poll::Ready(InputEvent::Element { channel: i, element });
                    }
                    Poll::Ready(None) => {
                        self.finished[i] = true;
                        return Poll::Ready(InputEvent::Disconnected { channel: i });
                    }
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rec(key: u64) -> Record {
        Record { key, value: 0, seq: 0 }
    }

    #[tokio::test]
    async fn hash_partitioning_routes_by_key_group_owner() {
        let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| mpsc::channel(64)).unzip();
        let mut gate = OutputGate::new(vec![EdgeOutput::new("d".into(), Partitioning::Hash, 128, txs, 0)]);
        for key in 0..30 {
            gate.emit(rec(key)).await.unwrap();
        }
        for (i, rx) in rxs.iter_mut().enumerate() {
            while let Ok(StreamElement::Record(r)) = rx.try_recv() {
                assert_eq!(subtask_for_key(r.key, 128, 3) as usize, i);
            }
        }
    }

    #[tokio::test]
    async fn parked_channels_are_not_read() {
        let (tx0, rx0) = mpsc::channel(4);
        let (tx1, rx1) = mpsc::channel(4);
        let mut gate = InputGate::new(vec![rx0, rx1]);
        tx0.send(StreamElement::Record(rec(0))).await.unwrap();
        tx1.send(StreamElement::Record(rec(1))).await.unwrap();
        gate.set_parked(0, true);
        assert_eq!(
            gate.next().await,
            InputEvent::Element { channel: 1, element: StreamElement::Record(rec(1)) }
        );
        gate.unpark_all();
        assert_eq!(
            gate.next().await,
            InputEvent::Element { channel: 0, element: StreamElement::Record(rec(0)) }
        );
        drop(tx1);
        assert_eq!(gate.next().await, InputEvent::Disconnected { channel: 1 });
    }

    #[tokio::test(start_paused = true)]
    async fn only_waiting_for_room_in_a_full_channel_counts_as_back_pressure() {
        let counters = Arc::new(TaskCounters::default());
        counters.start_running();
        let (tx, mut rx) = mpsc::channel(2);
        let mut gate =
            OutputGate::new(vec![EdgeOutput::new("d".into(), Partitioning::Forward, 128, vec![tx], 0)])
                .counting_into(counters.clone());
        gate.emit(rec(1)).await.unwrap();
        gate.broadcast(StreamElement::Watermark(1)).await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(counters.times().back_pressured, Duration::ZERO, "sends into room do not wait");

        // Full: the next send waits until the consumer takes something.
        let consumer = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            rx.recv().await
        };
        let (sent, taken) = tokio::join!(gate.emit(rec(2)), consumer);
        sent.unwrap();
        assert_eq!(taken, Some(StreamElement::Record(rec(1))));
        assert_eq!(counters.times().back_pressured, Duration::from_millis(300));

        // A send abandoned while blocked counts up to then.
        let abandoned = tokio::time::timeout(Duration::from_millis(200), gate.emit(rec(3))).await;
        assert!(abandoned.is_err(), "the channel is still full");
        assert_eq!(counters.times().back_pressured, Duration::from_millis(500));
    }

    #[tokio::test]
    async fn rebalance_and_broadcast_reach_every_subtask() {
        let (txs, mut rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::channel(8)).unzip();
        let mut gate =
            OutputGate::new(vec![EdgeOutput::new("d".into(), Partitioning::Rebalance, 128, txs, 0)]);
        gate.emit(rec(1)).await.unwrap();
        gate.emit(rec(2)).await.unwrap();
        gate.broadcast(StreamElement::CancelMarker(4)).await.unwrap();
        for rx in rxs.iter_mut() {
            assert!(matches!(rx.try_recv(), Ok(StreamElement::Record(_))));
            assert_eq!(rx.try_recv(), Ok(StreamElement::CancelMarker(4)));
        }
    }
}
