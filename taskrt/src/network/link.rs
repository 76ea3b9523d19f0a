//! One authenticated data connection: its writer, its reader, and a forwarder per channel that
//! turns credit into sends (outbound) or returns credit as the consumer takes elements (inbound).
//!
//! A channel's priority lane crosses the same connection without credit: the outbound
//! forwarder of a channel sends a priority barrier as soon as it is there, even while it waits
//! for credit for a record, and never after a record the producer sent later (so the consumer's
//! side sees the barrier before any record that followed it). The reader hands priority
//! barriers to the consumer's lane at once; a peer that floods a lane the consumer does not
//! drain ends the link.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::wire::{Frame, FrameWriter, MAX_FRAME, decode_frame};
use super::{ChannelId, MAX_CREDIT, NetworkError};
use crate::exchange::{PriorityBarrier, StreamElement};

/// The channels a link carries and the credit each side grants.
#[derive(Debug)]
pub(crate) struct LinkPlan {
    pub peer: String,
    /// Channels produced here and consumed on the peer.
    pub outbound: Vec<(ChannelId, mpsc::Receiver<StreamElement>)>,
    /// Channels produced on the peer and consumed here.
    pub inbound: Vec<(ChannelId, mpsc::Sender<StreamElement>)>,
    pub outbound_priority: Vec<(ChannelId, mpsc::Receiver<PriorityBarrier>)>,
    pub inbound_priority: Vec<(ChannelId, mpsc::Sender<PriorityBarrier>)>,
    /// Elements this side buffers per inbound channel.
    pub local_credit: u32,
    /// Elements the peer buffers per outbound channel.
    pub peer_credit: u32,
    pub write_queue: usize,
}

/// Writes at most this many bytes before yielding to the socket.
const WRITE_BATCH: usize = 64 * 1024;

/// Runs the link until every channel closed in both directions (`Ok`) or the connection failed
/// (`Err`; every channel it carried is closed, so its tasks see their peers gone).
pub(crate) async fn run<S>(stream: S, plan: LinkPlan) -> Result<(), NetworkError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    let (wtx, wrx) = mpsc::channel::<Frame>(plan.write_queue.max(1));
    let mut tasks = JoinSet::new();

    let mut credits: HashMap<ChannelId, Arc<Semaphore>> = HashMap::with_capacity(plan.outbound.len());
    let mut lanes: HashMap<ChannelId, mpsc::Receiver<PriorityBarrier>> =
        plan.outbound_priority.into_iter().collect();
    for (ch, rx) in plan.outbound {
        let sem = Arc::new(Semaphore::new(plan.peer_credit as usize));
        credits.insert(ch, sem.clone());
        tasks.spawn(forward_out(ch, rx, lanes.remove(&ch), sem, wtx.clone()));
    }
    let mut priority_inboxes = Lanes {
        open: plan.inbound_priority.into_iter().collect(),
        known: plan.inbound.iter().map(|(ch, _)| *ch).collect(),
    };
    let mut inboxes: HashMap<ChannelId, mpsc::Sender<StreamElement>> =
        HashMap::with_capacity(plan.inbound.len());
    for (ch, local) in plan.inbound {
        let (itx, irx) = mpsc::channel(plan.local_credit as usize);
        inboxes.insert(ch, itx);
        tasks.spawn(forward_in(ch, irx, local, plan.local_credit, wtx.clone()));
    }
    drop(wtx);

    let writer = tokio::spawn(write_frames(wr, wrx));
    let read = read_frames(rd, &credits, &mut inboxes, &mut priority_inboxes, &plan.peer).await;
    // Whatever ended the reader, no more credit arrives: release producers waiting for it, and
    // close the inboxes still open so their consumers see the link gone.
    credits.values().for_each(|s| s.close());
    drop(inboxes);
    drop(priority_inboxes);
    let written = match read {
        // The peer closed cleanly: let the writer finish what this side still sends.
        Ok(()) => writer.await.map_err(|e| NetworkError::Protocol(format!("writer task: {e}")))?,
        Err(e) => {
            writer.abort();
            tasks.abort_all();
            return Err(e);
        }
    };
    while tasks.join_next().await.is_some() {}
    written
}

/// The priority lanes of the channels consumed here.
struct Lanes {
    open: HashMap<ChannelId, mpsc::Sender<PriorityBarrier>>,
    /// Every inbound channel of the link (a lane may be closed, or absent).
    known: std::collections::HashSet<ChannelId>,
}

/// Sends a channel's elements while holding credit, and its priority barriers at once;
/// `Closed` once its producers are gone.
async fn forward_out(
    ch: ChannelId,
    mut rx: mpsc::Receiver<StreamElement>,
    mut lane: Option<mpsc::Receiver<PriorityBarrier>>,
    credit: Arc<Semaphore>,
    wtx: mpsc::Sender<Frame>,
) {
    loop {
        // Priority first: a barrier already on the lane was sent before any record still in
        // `rx` that the producer sent after it.
        let element = tokio::select! {
            biased;
            p = recv_lane(&mut lane), if lane.is_some() => {
                match p {
                    Some(p) => {
                        if wtx.send(Frame::Priority(ch, p)).await.is_err() {
                            return;
                        }
                    }
                    None => lane = None,
                }
                continue;
            }
            e = rx.recv() => match e {
                Some(e) => e,
                None => break,
            },
        };
        // Waiting for credit for this record must not hold back a barrier that overtakes it.
        let permit = loop {
            tokio::select! {
                biased;
                p = recv_lane(&mut lane), if lane.is_some() => match p {
                    Some(p) => {
                        if wtx.send(Frame::Priority(ch, p)).await.is_err() {
                            return;
                        }
                    }
                    None => lane = None,
                },
                permit = credit.acquire() => break permit,
            }
        };
        match permit {
            Ok(permit) => permit.forget(),
            // The connection is gone: dropping `rx` fails the producer's next send.
            Err(_) => return,
        }
        if wtx.send(Frame::Data(ch, element)).await.is_err() {
            return;
        }
    }
    let _ = wtx.send(Frame::Closed(ch)).await;
}

async fn recv_lane(lane: &mut Option<mpsc::Receiver<PriorityBarrier>>) -> Option<PriorityBarrier> {
    match lane {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Hands a channel's buffered elements to the consuming task and returns credit for them.
async fn forward_in(
    ch: ChannelId,
    mut inbox: mpsc::Receiver<StreamElement>,
    local: mpsc::Sender<StreamElement>,
    credit: u32,
    wtx: mpsc::Sender<Frame>,
) {
    // Return credit in batches of a quarter of the window, or at once when the inbox ran dry, so
    // the producer never waits on a credit this side is holding back.
    let batch = (credit / 4).max(1);
    let mut owed = 0u32;
    while let Some(element) = inbox.recv().await {
        if local.send(element).await.is_err() {
            // The consuming task is gone; its job is failing. Stop granting credit.
            return;
        }
        owed += 1;
        if (owed >= batch || inbox.is_empty()) && wtx.send(Frame::Credit(ch, owed)).await.is_ok() {
            owed = 0;
        }
    }
}

async fn write_frames<W: AsyncWrite>(wr: W, mut rx: mpsc::Receiver<Frame>) -> Result<(), NetworkError> {
    let mut wr = std::pin::pin!(wr);
    let mut out = FrameWriter::default();
    while let Some(first) = rx.recv().await {
        out.clear();
        out.frame(&first)?;
        while out.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(f) => out.frame(&f)?,
                Err(_) => break,
            }
        }
        wr.write_all(out.buffer()).await?;
        if rx.is_empty() {
            wr.flush().await?;
        }
    }
    wr.shutdown().await?;
    Ok(())
}

async fn read_frames<R: AsyncRead>(
    rd: R,
    credits: &HashMap<ChannelId, Arc<Semaphore>>,
    inboxes: &mut HashMap<ChannelId, mpsc::Sender<StreamElement>>,
    lanes: &mut Lanes,
    peer: &str,
) -> Result<(), NetworkError> {
    let mut rd = std::pin::pin!(BufReader::with_capacity(64 * 1024, rd));
    let mut buf = Vec::with_capacity(256);
    loop {
        let len = match rd.read_u32_le().await {
            Ok(len) => len as usize,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return if inboxes.is_empty() {
                    Ok(())
                } else {
                    Err(NetworkError::ConnectionLost { peer: peer.to_owned(), open: inboxes.len() })
                };
            }
            Err(e) => return Err(e.into()),
        };
        if len == 0 || len > MAX_FRAME {
            return Err(NetworkError::Protocol(format!("frame of {len} bytes (expected 1..={MAX_FRAME})")));
        }
        buf.resize(len, 0);
        rd.read_exact(&mut buf).await?;
        match decode_frame(&buf)? {
            Frame::Data(ch, element) => {
                let Some(inbox) = inboxes.get(&ch) else {
                    return Err(NetworkError::Protocol(format!(
                        "data on {ch}, which is not an open channel of this link"
                    )));
                };
                match inbox.try_send(element) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        return Err(NetworkError::Protocol(format!(
                            "the peer sent more than its credit on {ch}"
                        )));
                    }
                    // The consuming task is gone; drop what still arrives for it.
                    Err(mpsc::error::TrySendError::Closed(_)) => {}
                }
            }
            Frame::Credit(ch, n) => {
                let Some(sem) = credits.get(&ch) else {
                    return Err(NetworkError::Protocol(format!(
                        "credit for {ch}, which this side does not produce"
                    )));
                };
                if n == 0 || sem.available_permits() as u64 + u64::from(n) > u64::from(MAX_CREDIT) {
                    return Err(NetworkError::Protocol(format!("credit of {n} on {ch} exceeds the window")));
                }
                sem.add_permits(n as usize);
            }
            Frame::Priority(ch, p) => {
                if !lanes.known.contains(&ch) {
                    return Err(NetworkError::Protocol(format!(
                        "priority barrier on {ch}, which is not a channel of this link"
                    )));
                }
                if let Some(lane) = lanes.open.get(&ch) {
                    match lane.try_send(p) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            return Err(NetworkError::Protocol(format!(
                                "the peer sent more priority barriers on {ch} than the consumer takes"
                            )));
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            lanes.open.remove(&ch);
                        }
                    }
                }
            }
            Frame::Closed(ch) => {
                lanes.open.remove(&ch);
                if inboxes.remove(&ch).is_none() {
                    return Err(NetworkError::Protocol(format!(
                        "close of {ch}, which is not an open channel"
                    )));
                }
            }
        }
    }
}
