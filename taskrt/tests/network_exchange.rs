//! Channels between two workers' data exchanges over real loopback TCP: order, credit-based
//! backpressure, authentication, and what a lost peer does to the channels it carried.

use std::net::SocketAddr;
use std::time::Duration;

use cairn_protocol::messages::CheckpointOptions;
use cairn_taskrt::exchange::{Barrier, Record, StreamElement};
use cairn_taskrt::network::{
    ChannelId, ExchangeKey, ExchangeService, NetworkError, NetworkOptions, PeerLink, PeerSpec, RefuseReason,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const LOCAL: &str = "127.0.0.1:0";

fn ch(edge: u32, from: u32, to: u32) -> ChannelId {
    ChannelId { edge, from, to }
}

fn rec(seq: u64) -> StreamElement {
    StreamElement::Record(Record { key: seq % 7, value: seq * 3, seq })
}

fn barrier(id: u64) -> StreamElement {
    StreamElement::Barrier(Barrier {
        checkpoint_id: id,
        timestamp_ms: id * 10,
        options: CheckpointOptions::checkpoint(),
    })
}

async fn service(id: &str, options: NetworkOptions) -> ExchangeService {
    ExchangeService::bind(LOCAL.parse().unwrap(), id, options).await.unwrap()
}

/// One side of a link: the producers' senders of its outbound channels and the consumers'
/// receivers of its inbound ones.
struct Side {
    producers: Vec<mpsc::Sender<StreamElement>>,
    consumers: Vec<mpsc::Receiver<StreamElement>>,
    link: PeerLink,
}

#[allow(clippy::too_many_arguments)]
fn open(
    svc: &ExchangeService,
    peer: &str,
    peer_addr: SocketAddr,
    key: &ExchangeKey,
    sends: &[ChannelId],
    receives: &[ChannelId],
    capacity: usize,
) -> Result<Side, NetworkError> {
    let (producers, outbound): (Vec<_>, Vec<_>) = sends
        .iter()
        .map(|c| {
            let (tx, rx) = mpsc::channel(capacity);
            (tx, (*c, rx))
        })
        .unzip();
    let (inbound, consumers): (Vec<_>, Vec<_>) = receives
        .iter()
        .map(|c| {
            let (tx, rx) = mpsc::channel(capacity);
            ((*c, tx), rx)
        })
        .unzip();
    let link = svc.open(PeerSpec {
        job: "job-1".into(),
        attempt: 4,
        key: key.clone(),
        peer_worker: peer.into(),
        peer_addr,
        outbound,
        inbound,
        outbound_priority: vec![],
        inbound_priority: vec![],
    })?;
    Ok(Side { producers, consumers, link })
}

/// Bounded wait for a condition (the test fails instead of hanging).
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn records_and_markers_cross_in_order_in_both_directions() {
    let a = service("w-a", NetworkOptions::default()).await;
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let a_to_b = [ch(0, 0, 0), ch(0, 1, 0)];
    let b_to_a = [ch(1, 0, 1)];
    let mut sa = open(&a, "w-b", b.local_addr(), &key, &a_to_b, &b_to_a, 64).unwrap();
    let mut sb = open(&b, "w-a", a.local_addr(), &key, &b_to_a, &a_to_b, 64).unwrap();

    let n = 20_000u64;
    let mut producers = Vec::new();
    for tx in sa.producers.drain(..).chain(sb.producers.drain(..)) {
        producers.push(tokio::spawn(async move {
            for seq in 0..n {
                tx.send(rec(seq)).await.unwrap();
                if seq % 5_000 == 4_999 {
                    tx.send(barrier(seq / 5_000 + 1)).await.unwrap();
                }
            }
            tx.send(StreamElement::EndOfData).await.unwrap();
            tx.send(StreamElement::EndOfInput).await.unwrap();
        }));
    }
    for mut rx in sb.consumers.drain(..).chain(sa.consumers.drain(..)) {
        let mut expected = Vec::new();
        for seq in 0..n {
            expected.push(rec(seq));
            if seq % 5_000 == 4_999 {
                expected.push(barrier(seq / 5_000 + 1));
            }
        }
        expected.push(StreamElement::EndOfData);
        expected.push(StreamElement::EndOfInput);
        let mut got = Vec::with_capacity(expected.len());
        while let Some(e) = within("the channel to close", rx.recv()).await {
            got.push(e);
        }
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "elements arrived out of order or changed");
    }
    for p in producers {
        p.await.unwrap();
    }
    within("link a", sa.link.finished()).await.unwrap();
    within("link b", sb.link.finished()).await.unwrap();
}

#[tokio::test]
async fn a_slow_consumer_backpressures_its_producer_within_the_credit() {
    let credit = 8;
    let capacity = 4;
    let options = NetworkOptions { credit, ..NetworkOptions::default() };
    let a = service("w-a", options.clone()).await;
    let b = service("w-b", options).await;
    let key = ExchangeKey::generate();
    let c = [ch(0, 0, 0)];
    let mut sa = open(&a, "w-b", b.local_addr(), &key, &c, &[], capacity).unwrap();
    let mut sb = open(&b, "w-a", a.local_addr(), &key, &[], &c, capacity).unwrap();

    let tx = sa.producers.remove(0);
    let (sent_tx, mut sent_rx) = tokio::sync::watch::channel(0u64);
    let producer = tokio::spawn({
        let tx = tx.clone();
        async move {
            for seq in 0..1_000 {
                tx.send(rec(seq)).await.unwrap();
                sent_tx.send_replace(seq + 1);
            }
        }
    });
    // The consumer reads nothing: the producer fills its own channel, the credit window and the
    // consumer's channel, then stops. The most the link can hold: both bounded channels, the
    // credit, and one element in each forwarder's hands.
    let most = (2 * capacity + credit as usize + 2) as u64;
    let filled =
        within("the producer to fill the window", sent_rx.wait_for(|s| *s >= most - 1)).await.map(|s| *s);
    assert!(filled.unwrap() <= most);
    assert!(
        matches!(tx.try_send(rec(999_999)), Err(mpsc::error::TrySendError::Full(_))),
        "the producer is backpressured"
    );
    assert!(*sent_rx.borrow() <= most, "the link buffered more than its credit allows");

    // Once the consumer reads, everything arrives, in order.
    let mut rx = sb.consumers.remove(0);
    for seq in 0..1_000 {
        assert_eq!(within("a record", rx.recv()).await, Some(rec(seq)));
    }
    producer.await.unwrap();
    drop(tx);
    assert_eq!(within("the close", rx.recv()).await, None);
    within("link a", sa.link.finished()).await.unwrap();
    within("link b", sb.link.finished()).await.unwrap();
}

#[tokio::test]
async fn a_caller_without_the_key_changes_nothing() {
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let c = [ch(0, 0, 0)];
    let mut sb = open(&b, "w-a", "127.0.0.1:9".parse().unwrap(), &key, &[], &c, 16).unwrap();

    // 1. A worker that claims to be w-a but holds another key gives up: the acceptor cannot
    //    prove to it that it holds its key, and it never proves its own.
    let impostor = service("w-a", NetworkOptions::default()).await;
    let fake = open(&impostor, "w-b", b.local_addr(), &ExchangeKey::generate(), &c, &[], 16).unwrap();
    fake.producers[0].try_send(rec(666)).unwrap();
    let err = within("the impostor's link", fake.link.finished()).await.unwrap_err();
    assert!(matches!(err, NetworkError::PeerUnauthenticated), "{err}");

    // 2. A raw caller that skips the check and sends a forged proof, then data frames.
    let mut raw = tokio::net::TcpStream::connect(b.local_addr()).await.unwrap();
    raw.write_all(&forged_hello()).await.unwrap();
    let mut len = [0u8; 4];
    raw.read_exact(&mut len).await.unwrap();
    let mut challenge = vec![0u8; u32::from_le_bytes(len) as usize];
    raw.read_exact(&mut challenge).await.unwrap();
    assert_eq!(challenge[0], 17, "a challenge");
    let mut proof = 33u32.to_le_bytes().to_vec();
    proof.push(18);
    proof.extend_from_slice(&[0xAB; 32]);
    raw.write_all(&proof).await.unwrap();
    raw.read_exact(&mut len).await.unwrap();
    let mut refusal = vec![0u8; u32::from_le_bytes(len) as usize];
    raw.read_exact(&mut refusal).await.unwrap();
    assert_eq!((refusal[0], refusal[1]), (20, RefuseReason::Unauthenticated as u8));
    let mut data = 38u32.to_le_bytes().to_vec();
    data.push(1);
    data.extend_from_slice(&[0; 12]);
    data.push(0);
    data.extend_from_slice(&[0x66; 24]);
    let _ = raw.write_all(&data).await;
    let mut rest = Vec::new();
    let _ = within("the acceptor to close", raw.read_to_end(&mut rest)).await;

    // 3. Garbage that is not a Cairn data connection at all.
    let mut junk = tokio::net::TcpStream::connect(b.local_addr()).await.unwrap();
    let _ = junk.write_all(b"\x10\x00\x00\x00GET / HTTP/1.1\r\n\r\n").await;
    let _ = within("the acceptor to close", junk.read_to_end(&mut rest)).await;

    // Nothing reached the consumer, and the real peer still links and delivers.
    assert!(matches!(sb.consumers[0].try_recv(), Err(mpsc::error::TryRecvError::Empty)));
    let a = service("w-a", NetworkOptions::default()).await;
    let sa = open(&a, "w-b", b.local_addr(), &key, &c, &[], 16).unwrap();
    sa.producers[0].send(rec(1)).await.unwrap();
    assert_eq!(within("the real record", sb.consumers[0].recv()).await, Some(rec(1)));
}

/// A well-formed HELLO from "w-a" for job-1 attempt 4 (the acceptor's registration).
fn forged_hello() -> Vec<u8> {
    let mut body = vec![16u8];
    body.extend_from_slice(b"CAIRNX\r\n");
    body.extend_from_slice(&1u16.to_le_bytes());
    body.extend_from_slice(&5u16.to_le_bytes());
    body.extend_from_slice(b"job-1");
    body.extend_from_slice(&4u64.to_le_bytes());
    for s in ["w-a", "w-b"] {
        body.extend_from_slice(&(s.len() as u16).to_le_bytes());
        body.extend_from_slice(s.as_bytes());
    }
    body.extend_from_slice(&[0; 8]);
    body.extend_from_slice(&16u32.to_le_bytes());
    body.extend_from_slice(&[1; 32]);
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

#[tokio::test]
async fn a_lost_peer_closes_every_channel_it_carried() {
    let a = service("w-a", NetworkOptions::default()).await;
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let (a_to_b, b_to_a) = ([ch(0, 0, 0)], [ch(1, 0, 0)]);
    let sa = open(&a, "w-b", b.local_addr(), &key, &a_to_b, &b_to_a, 16).unwrap();
    let mut sb = open(&b, "w-a", a.local_addr(), &key, &b_to_a, &a_to_b, 16).unwrap();
    sa.producers[0].send(rec(1)).await.unwrap();
    assert_eq!(within("a record", sb.consumers[0].recv()).await, Some(rec(1)));

    // Worker a goes away mid-stream (its link and listener with it).
    drop(sa);
    drop(a);
    // b's consumer sees its input end without an end-of-input marker: the producer died.
    assert_eq!(within("the consumer's input to close", sb.consumers[0].recv()).await, None);
    // b's producer towards a sees its output fail.
    let tx = sb.producers.remove(0);
    within("the producer's output to fail", async { while tx.send(rec(2)).await.is_ok() {} }).await;
    let err = within("b's link", sb.link.finished()).await.unwrap_err();
    assert!(matches!(err, NetworkError::ConnectionLost { open: 1, .. } | NetworkError::Io(_)), "{err}");
}

#[tokio::test]
async fn links_that_disagree_about_their_channels_are_refused() {
    let a = service("w-a", NetworkOptions::default()).await;
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let sa = open(&a, "w-b", b.local_addr(), &key, &[ch(0, 0, 0)], &[], 16).unwrap();
    let sb = open(&b, "w-a", a.local_addr(), &key, &[], &[ch(0, 0, 1)], 16).unwrap();
    let err = within("a's link", sa.link.finished()).await.unwrap_err();
    assert!(matches!(err, NetworkError::Refused { reason: Some(RefuseReason::PlanMismatch), .. }), "{err}");
    drop(sb);
}

#[tokio::test]
async fn a_dialer_that_comes_first_waits_for_the_peer_to_deploy() {
    let a = service("w-a", NetworkOptions::default()).await;
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let c = [ch(0, 0, 0)];
    let sa = open(&a, "w-b", b.local_addr(), &key, &c, &[], 16).unwrap();
    sa.producers[0].send(rec(9)).await.unwrap();
    // b deploys later: a's first dials are refused as unknown and retried.
    tokio::task::yield_now().await;
    let mut sb = open(&b, "w-a", a.local_addr(), &key, &[], &c, 16).unwrap();
    assert_eq!(within("the record", sb.consumers[0].recv()).await, Some(rec(9)));
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_never_shows_up_is_a_clear_timeout() {
    let a = service("w-a", NetworkOptions::default()).await;
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let c = [ch(0, 0, 0)];
    // b waits for a's dial that never comes.
    let sb = open(&b, "w-a", a.local_addr(), &key, &[], &c, 16).unwrap();
    let err = sb.link.finished().await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::ConnectTimeout { last, .. } if last.contains("did not dial")),
        "{err}"
    );
    // a dials a b that never registers the attempt: refused as unknown until the deadline.
    let sa = open(&a, "w-b", b.local_addr(), &key, &c, &[], 16).unwrap();
    let err = sa.link.finished().await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::ConnectTimeout { last, .. } if last.contains("has no link")),
        "{err}"
    );
}

#[tokio::test]
async fn bad_links_are_refused_before_anything_runs() {
    let a = service("w-a", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let addr = a.local_addr();
    let err = open(&a, "w-a", addr, &key, &[ch(0, 0, 0)], &[], 4).err().unwrap();
    assert!(err.to_string().contains("cannot link to itself"), "{err}");
    let err = open(&a, "w-z", addr, &key, &[ch(0, 0, 0), ch(0, 0, 0)], &[], 4).err().unwrap();
    assert!(err.to_string().contains("listed twice"), "{err}");
    let err = ExchangeService::bind(
        LOCAL.parse().unwrap(),
        "w",
        NetworkOptions { credit: 0, ..Default::default() },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("credit"), "{err}");
}

/// A priority barrier crosses a link whose channel is out of credit (its consumer reads
/// nothing), and reaches the consumer's lane ahead of the records it overtook, which still
/// arrive, in order, once the consumer reads again.
#[tokio::test]
async fn a_priority_barrier_overtakes_a_channel_blocked_on_credit() {
    use cairn_taskrt::exchange::{PriorityBarrier, priority_lane};
    let a = service("w-a", NetworkOptions::default()).await;
    let b = service("w-b", NetworkOptions::default()).await;
    let key = ExchangeKey::generate();
    let c = ch(0, 0, 0);
    let (tx, out_rx) = mpsc::channel(8);
    let (in_tx, mut rx) = mpsc::channel(8);
    let (lane_tx, lane_out) = priority_lane();
    let (lane_in, mut lane_rx) = priority_lane();
    let spec = |peer: &str, addr, outbound, inbound, outbound_priority, inbound_priority| PeerSpec {
        job: "job-1".into(),
        attempt: 4,
        key: key.clone(),
        peer_worker: peer.into(),
        peer_addr: addr,
        outbound,
        inbound,
        outbound_priority,
        inbound_priority,
    };
    let _la =
        a.open(spec("w-b", b.local_addr(), vec![(c, out_rx)], vec![], vec![(c, lane_out)], vec![])).unwrap();
    let _lb =
        b.open(spec("w-a", a.local_addr(), vec![], vec![(c, in_tx)], vec![], vec![(c, lane_in)])).unwrap();

    // Fill everything: the consumer's channel, the link's credit window, the producer's channel.
    let producer = tokio::spawn(async move {
        for seq in 0..2_000u64 {
            if tx.send(rec(seq)).await.is_err() {
                return;
            }
        }
    });
    within("the consumer's channel to fill", async {
        while rx.capacity() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let unaligned = Barrier {
        checkpoint_id: 9,
        timestamp_ms: 1,
        options: CheckpointOptions { unaligned_after_ms: Some(0), ..CheckpointOptions::checkpoint() },
    };
    lane_tx.send(PriorityBarrier { barrier: unaligned.clone(), records_before: 1_234 }).await.unwrap();
    let got = within("the priority barrier", lane_rx.recv()).await.expect("lane open");
    assert_eq!(got, PriorityBarrier { barrier: unaligned, records_before: 1_234 });

    for seq in 0..2_000u64 {
        assert_eq!(within("the overtaken records", rx.recv()).await, Some(rec(seq)));
    }
    producer.await.unwrap();
}
