//! Data exchange between the subtasks of a job inside one worker.
//!
//! Every (upstream subtask, downstream subtask) pair connected by an edge gets one bounded
//! channel of [`StreamElement`]s, so a slow consumer back-pressures its producers and per-channel
//! FIFO order keeps barriers in place between records. The producing task owns an
//! [`OutputGate`] (one [`EdgeOutput`] per outgoing edge, partitioning records by the edge's
//! [`Partitioning`]); the consuming task owns an [`InputGate`] that reads its channels fairly and
//! skips the channels that alignment has parked.
//!
//! Next to its data channel, a channel may have a **priority lane** (a small bounded channel of
//! [`PriorityBarrier`]s) that the consumer reads before any data: unaligned barriers travel on
//! it and overtake the records buffered in the data channel (FLIP-76), and aligned barriers that
//! may turn unaligned announce themselves on it. Each carries the number of records the producer
//! had sent on the channel before it, which tells the consumer exactly which buffered records
//! the barrier overtook. Without a lane, such barriers travel in the data channel, in order.
//!
//! A send that finds its channel full waits for room; the [`OutputGate`] counts that wait as the
//! task's back-pressured time ([`TaskCounters`]). A send into a channel with room does not
//! read the clock.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use cairn_protocol::graph::Partitioning;
use cairn_protocol::keygroups::subtask_for_key;

pub use crate::element::{Barrier, PriorityBarrier, Record, StreamElement};

use crate::checkpoint::alignment::ChannelMark;
use crate::checkpoint::channel_state::ChannelRecorder;
use crate::metrics::{TaskCounters, Wait};

/// Capacity of a channel's priority lane. Unaligned checkpoints run one at a time, so a lane
/// holds at most a barrier and an announcement in practice.
pub const PRIORITY_CAPACITY: usize = 16;

/// A channel's priority lane, both ends.
pub fn priority_lane() -> (mpsc::Sender<PriorityBarrier>, mpsc::Receiver<PriorityBarrier>) {
    mpsc::channel(PRIORITY_CAPACITY)
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
    /// Priority lane per downstream subtask, where there is one.
    priority: Vec<Option<mpsc::Sender<PriorityBarrier>>>,
    /// Records sent per downstream subtask.
    sent: Vec<u64>,
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
        let n = senders.len();
        Self {
            to,
            partitioning,
            max_parallelism,
            senders,
            priority: vec![None; n],
            sent: vec![0; n],
            next_rebalance: start,
        }
    }

    /// Gives the channels priority lanes (one per downstream subtask, `None` for none).
    pub fn with_priority(mut self, lanes: Vec<Option<mpsc::Sender<PriorityBarrier>>>) -> Self {
        let n = self.senders.len();
        self.priority = lanes;
        self.priority.resize(n, None);
        self
    }

    /// Sends a barrier to every downstream subtask: an unaligned one on the priority lane
    /// (in the data channel where there is no lane); an aligned one in the data channel, and
    /// announced on the lane if it may turn unaligned.
    async fn barrier(&self, barrier: &Barrier, counters: Option<&TaskCounters>) -> Result<(), ExchangeError> {
        let unaligned = barrier.options.is_unaligned();
        let announce = barrier.options.unaligned_after_ms.is_some();
        for target in 0..self.senders.len() {
            let lane = self.priority.get(target).and_then(Option::as_ref);
            if !(unaligned && lane.is_some()) {
                self.send(target, StreamElement::Barrier(barrier.clone()), counters).await?;
            }
            if let Some(lane) = lane.filter(|_| announce) {
                let records_before = self.sent.get(target).copied().unwrap_or(0);
                let event = PriorityBarrier { barrier: barrier.clone(), records_before };
                lane.send(event)
                    .await
                    .map_err(|_| ExchangeError::DownstreamGone { to: self.to.clone(), subtask: target })?;
            }
        }
        Ok(())
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
        let target = match self.partitioning {
            Partitioning::Forward => 0,
            Partitioning::Hash => subtask_for_key(record.key, self.max_parallelism, n as u32) as usize,
            Partitioning::Rebalance => {
                let target = self.next_rebalance % n.max(1);
                self.next_rebalance = self.next_rebalance.wrapping_add(1);
                target
            }
            Partitioning::Broadcast => {
                self.broadcast(StreamElement::Record(record), counters).await?;
                self.sent.iter_mut().for_each(|c| *c += 1);
                return Ok(());
            }
        };
        self.send(target, StreamElement::Record(record), counters).await?;
        if let Some(c) = self.sent.get_mut(target) {
            *c += 1;
        }
        Ok(())
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

    /// Whether every outgoing channel has room for `n` more elements (at most its capacity), or
    /// is closed, which the next send reports. A task takes new input, or polls its source, only
    /// while its outputs have room for what that may emit: a back-pressured task then waits in
    /// its mailbox, where triggers, priority barriers and finished asynchronous parts reach it,
    /// instead of inside a send (Flink's output availability).
    pub fn has_room(&self, n: usize) -> bool {
        self.edges
            .iter()
            .flat_map(|e| &e.senders)
            .all(|tx| tx.capacity() >= n.clamp(1, tx.max_capacity()) || tx.is_closed())
    }

    /// Waits until [`OutputGate::has_room`] holds for `n`. Only this subtask sends into its
    /// channels, so room found in one channel stays while the next is waited for.
    pub async fn room(&self, n: usize) {
        for tx in self.edges.iter().flat_map(|e| &e.senders) {
            let n = n.clamp(1, tx.max_capacity());
            if tx.capacity() < n {
                // The permits are dropped at once: only the wait matters. A closed channel
                // returns at once.
                let _ = tx.reserve_many(n).await;
            }
        }
    }

    /// Sends a record along every outgoing edge, partitioned per edge.
    pub async fn emit(&mut self, record: Record) -> Result<(), ExchangeError> {
        let counters = self.counters.as_deref();
        for edge in &mut self.edges {
            edge.emit(record, counters).await?;
        }
        Ok(())
    }

    /// Sends an event (barrier, watermark, cancel marker, end of input) to every channel. A
    /// barrier takes the priority lanes as [`EdgeOutput`] describes.
    pub async fn broadcast(&mut self, element: StreamElement) -> Result<(), ExchangeError> {
        let counters = self.counters.as_deref();
        for edge in &self.edges {
            match &element {
                StreamElement::Barrier(b) => edge.barrier(b, counters).await?,
                other => edge.broadcast(other.clone(), counters).await?,
            }
        }
        Ok(())
    }
}

/// The incoming channels of one subtask; reads them round-robin, skipping parked ones.
///
/// While an unaligned checkpoint records its in-flight records (see [`ChannelRecorder`]) the
/// gate also *absorbs*: it moves what the recording channels hold into its own per-channel
/// buffer as soon as it is there, recording the records that precede each channel's barrier, so
/// the recording completes at the speed of the network, not of the task. The buffer is bounded:
/// a channel is absorbed only up to its boundary, or by at most its capacity while the boundary
/// is not known.
#[derive(Debug)]
pub struct InputGate {
    channels: Vec<mpsc::Receiver<StreamElement>>,
    /// Priority lanes, read before any data (also of parked channels).
    priority: Vec<Option<mpsc::Receiver<PriorityBarrier>>>,
    /// Records delivered to the task per channel.
    delivered: Vec<u64>,
    /// Records taken from each channel (delivered, or in `buffer`).
    received: Vec<u64>,
    /// Elements taken from a channel and not yet delivered, in order.
    buffer: Vec<VecDeque<StreamElement>>,
    /// The channel closed (after whatever is still in `buffer`).
    closed: Vec<bool>,
    recording: Option<ChannelRecorder>,
    /// Restored in-flight records, delivered before anything the channels hold.
    recovered: VecDeque<Record>,
    /// The recording completed during a poll and the task has not been told yet.
    recording_done: bool,
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
    /// A barrier from a channel's priority lane.
    Priority {
        channel: usize,
        event: PriorityBarrier,
    },
    /// The in-flight records of the recording checkpoint are all in.
    RecordingComplete,
    /// A restored in-flight record.
    Recovered(Record),
    /// A channel closed without `EndOfInput`: its producer died.
    Disconnected {
        channel: usize,
    },
}

impl InputGate {
    pub fn new(channels: Vec<mpsc::Receiver<StreamElement>>) -> Self {
        let n = channels.len();
        Self {
            channels,
            priority: (0..n).map(|_| None).collect(),
            delivered: vec![0; n],
            received: vec![0; n],
            buffer: (0..n).map(|_| VecDeque::new()).collect(),
            closed: vec![false; n],
            recording: None,
            recovered: VecDeque::new(),
            recording_done: false,
            parked: vec![false; n],
            finished: vec![false; n],
            next: 0,
        }
    }

    /// Gives the channels priority lanes (by channel index, `None` for none).
    pub fn with_priority(mut self, lanes: Vec<Option<mpsc::Receiver<PriorityBarrier>>>) -> Self {
        let n = self.channels.len();
        self.priority = lanes;
        self.priority.resize_with(n, || None);
        self
    }

    /// Restored in-flight records (an unaligned checkpoint's channel state): delivered as
    /// [`InputEvent::Recovered`] before any new input, barriers on the priority lanes aside.
    pub fn set_recovered(&mut self, records: Vec<Record>) {
        self.recovered = records.into();
    }

    /// Records delivered so far on each channel.
    pub fn records_delivered(&self) -> &[u64] {
        &self.delivered
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

    /// Starts recording the in-flight records of unaligned checkpoint `checkpoint_id`, taken
    /// just now (every delivered record is in the snapshot). `marks` tell where each channel
    /// stands relative to its barrier; `ended` channels deliver no more records. Returns
    /// `false` when nothing is in flight (the recording is complete at once and dropped).
    pub fn start_recording(&mut self, checkpoint_id: u64, marks: &[ChannelMark], ended: &[bool]) -> bool {
        let n = self.channels.len();
        let mut rec = ChannelRecorder::new(checkpoint_id, n);
        rec.set_recovered(self.recovered.iter().copied().collect());
        for c in 0..n {
            // What was taken from the channel but not delivered follows the snapshot: kept up to
            // the barrier if it is among it, else until the marks say where the barrier is.
            let mut number = self.delivered[c];
            for e in &self.buffer[c] {
                match e {
                    StreamElement::Record(r) => {
                        rec.on_record(c, number, *r);
                        number += 1;
                    }
                    StreamElement::Barrier(b) if b.checkpoint_id == checkpoint_id => {
                        rec.set_boundary(c, number, number);
                        break;
                    }
                    StreamElement::EndOfData | StreamElement::EndOfInput => {
                        rec.channel_ended(c);
                        break;
                    }
                    _ => {}
                }
            }
            match marks.get(c).copied().unwrap_or(ChannelMark::Unknown) {
                _ if ended.get(c).copied().unwrap_or(false) => rec.channel_ended(c),
                // The barrier was delivered in-band: it sat right after the delivered records.
                ChannelMark::BarrierDelivered => rec.set_boundary(c, self.delivered[c], self.received[c]),
                ChannelMark::Announced(before) => rec.set_boundary(c, before, self.received[c]),
                ChannelMark::Ended => rec.channel_ended(c),
                ChannelMark::Unknown => {}
            }
        }
        self.recording_done = false;
        if rec.is_complete() && rec.is_empty() {
            return false;
        }
        self.recording_done = rec.is_complete();
        self.recording = Some(rec);
        true
    }

    /// The checkpoint whose in-flight records are being recorded.
    pub fn recording(&self) -> Option<u64> {
        self.recording.as_ref().map(ChannelRecorder::checkpoint_id)
    }

    /// A priority lane told that `channel`'s barrier of the recording checkpoint follows
    /// `records_before` records.
    pub fn set_boundary(&mut self, channel: usize, records_before: u64) {
        let received = self.received.get(channel).copied().unwrap_or(0);
        if let Some(rec) = &mut self.recording {
            rec.set_boundary(channel, records_before, received);
            self.recording_done = rec.is_complete();
        }
    }

    /// Drops the recording of `checkpoint_id`, if it is the one recording.
    pub fn abandon_recording(&mut self, checkpoint_id: u64) {
        if self.recording() == Some(checkpoint_id) {
            self.recording = None;
            self.recording_done = false;
        }
    }

    /// The completed recording: its checkpoint and records.
    pub fn take_completed_recording(&mut self) -> Option<(u64, Vec<Record>)> {
        if !self.recording.as_ref().is_some_and(ChannelRecorder::is_complete) {
            return None;
        }
        self.recording_done = false;
        let rec = self.recording.take()?;
        Some((rec.checkpoint_id(), rec.into_records()))
    }

    /// Accounts for an element taken from `channel`: numbers records, feeds the recorder.
    fn received(&mut self, channel: usize, element: &StreamElement) {
        let Some(rec) = self.recording.as_mut() else {
            if matches!(element, StreamElement::Record(_)) {
                self.received[channel] += 1;
            }
            return;
        };
        let was_complete = rec.is_complete();
        let rec = Some(rec);
        match element {
            StreamElement::Record(r) => {
                let n = self.received[channel];
                self.received[channel] += 1;
                if let Some(rec) = rec {
                    rec.on_record(channel, n, *r);
                }
            }
            StreamElement::Barrier(b) => {
                if let Some(rec) = rec.filter(|rec| rec.checkpoint_id() == b.checkpoint_id) {
                    let n = self.received[channel];
                    rec.set_boundary(channel, n, n);
                }
            }
            StreamElement::EndOfData | StreamElement::EndOfInput => {
                if let Some(rec) = rec {
                    rec.channel_ended(channel);
                }
            }
            _ => {}
        }
        if !was_complete && self.recording.as_ref().is_some_and(ChannelRecorder::is_complete) {
            self.recording_done = true;
        }
    }

    /// Moves what the recording channels hold into the buffer (see the type's docs).
    fn absorb(&mut self, cx: &mut std::task::Context<'_>) {
        let Some(rec) = &self.recording else { return };
        if rec.is_complete() {
            return;
        }
        for c in 0..self.channels.len() {
            while !self.closed[c] {
                let Some(rec) = &self.recording else { return };
                if !rec.is_recording(c) {
                    break;
                }
                if self.buffer[c].len() >= self.channels[c].max_capacity() {
                    break;
                }
                match self.channels[c].poll_recv(cx) {
                    Poll::Ready(Some(e)) => {
                        self.received(c, &e);
                        self.buffer[c].push_back(e);
                    }
                    Poll::Ready(None) => self.closed[c] = true,
                    Poll::Pending => break,
                }
            }
        }
        if self.recording.as_ref().is_some_and(ChannelRecorder::is_complete) {
            self.recording_done = true;
        }
    }

    fn deliver(&mut self, channel: usize, element: StreamElement) -> InputEvent {
        if matches!(element, StreamElement::Record(_))
            && let Some(n) = self.delivered.get_mut(channel)
        {
            *n += 1;
        }
        InputEvent::Element { channel, element }
    }

    /// Waits for the next element on any channel that is neither parked nor finished. Pends
    /// forever when there is none (the caller selects on other events meanwhile).
    pub async fn next(&mut self) -> InputEvent {
        self.next_if(true).await
    }

    /// Like [`InputGate::next`]; without `data`, only what does not depend on the task's output
    /// having room: barriers on the priority lanes, and the absorbing of a recording checkpoint's
    /// in-flight records with its [`InputEvent::RecordingComplete`].
    pub async fn next_if(&mut self, data: bool) -> InputEvent {
        poll_fn(|cx| {
            let n = self.channels.len();
            for (channel, lane) in self.priority.iter_mut().enumerate() {
                let Some(rx) = lane else { continue };
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(event)) => return Poll::Ready(InputEvent::Priority { channel, event }),
                    // The producer is gone; its data channel tells how (end of input or not).
                    Poll::Ready(None) => *lane = None,
                    Poll::Pending => {}
                }
            }
            self.absorb(cx);
            if std::mem::take(&mut self.recording_done) {
                return Poll::Ready(InputEvent::RecordingComplete);
            }
            if !data {
                return Poll::Pending;
            }
            if let Some(r) = self.recovered.pop_front() {
                return Poll::Ready(InputEvent::Recovered(r));
            }
            for step in 0..n {
                let i = (self.next + step) % n;
                if self.parked[i] || self.finished[i] {
                    continue;
                }
                if let Some(element) = self.buffer[i].pop_front() {
                    self.next = (i + 1) % n;
                    return Poll::Ready(self.deliver(i, element));
                }
                if self.closed[i] {
                    self.finished[i] = true;
                    return Poll::Ready(InputEvent::Disconnected { channel: i });
                }
                match self.channels[i].poll_recv(cx) {
                    Poll::Ready(Some(element)) => {
                        self.next = (i + 1) % n;
                        self.received(i, &element);
                        // The producer puts a priority barrier on the lane before it sends
                        // anything after it: if one is there now, it precedes this element.
                        if let Some(Ok(event)) = self.priority[i].as_mut().map(|rx| rx.try_recv()) {
                            self.buffer[i].push_front(element);
                            return Poll::Ready(InputEvent::Priority { channel: i, event });
                        }
                        if std::mem::take(&mut self.recording_done) {
                            self.buffer[i].push_front(element);
                            return Poll::Ready(InputEvent::RecordingComplete);
                        }
                        return Poll::Ready(self.deliver(i, element));
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
    async fn absorbing_in_flight_records_holds_at_most_a_channel_capacity() {
        let (tx, rx) = mpsc::channel(4);
        let mut gate = InputGate::new(vec![rx]);
        // An unaligned checkpoint whose barrier is 100 records behind, and a task that takes
        // nothing: the producer keeps the channel full; the gate absorbs no more than a
        // channel's capacity, however far the barrier is.
        assert!(gate.start_recording(1, &[ChannelMark::Announced(100)], &[false]));
        let mut sent = 0;
        for _ in 0..10 {
            while tx.try_send(StreamElement::Record(rec(sent))).is_ok() {
                sent += 1;
            }
            let _ = tokio::time::timeout(Duration::from_millis(1), gate.next_if(false)).await;
        }
        assert_eq!(gate.buffer[0].len(), 4);
        assert_eq!(sent, 8, "a channel's worth in the gate, a channel's worth in the channel");
        // Delivering makes room for the next.
        assert!(matches!(gate.next().await, InputEvent::Element { channel: 0, .. }));
        let _ = tokio::time::timeout(Duration::from_millis(1), gate.next_if(false)).await;
        assert_eq!(gate.buffer[0].len(), 4);
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
