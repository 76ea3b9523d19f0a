//! Structure-aware fuzzing of the protobuf decoding of the messages a replica or a worker takes
//! from the network: the task gateway's `WorkerMessage` (decoded by the leader) and
//! `LeaderMessage` (decoded by a worker), and the Raft transport's `RaftPayload`, decoded by
//! prost exactly as tonic's codec does (`prost::Message::decode`). See `docs/FUZZING.md`.
//!
//! Valid encodings of real messages are damaged with raw byte edits and with protobuf-aware
//! ones: fields with lengths far beyond the buffer, overlong varints, invalid wire types, field
//! number 0, deeply nested groups, unknown fields. prost must refuse or decode, never panic, and
//! never allocate more than the input could hold.

#[path = "../../protocol/tests/support/harness.rs"]
mod harness;

use cairn_proto::v1::{
    AttachedTask, GatewayError, Heartbeat, LeaderMessage, RaftPayload, RegisterWorker, Registered, Report,
    ReportBatch, ReportsConfirmed, TaskTime, TaskTimes, WorkerMessage, leader_message, worker_message,
};
use harness::{ByteOp, Verdict, apply_bytes, byte_ops, config, few_byte_ops, fuzz};
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z0-9/_-]{0,16}", 1 => "\\PC{0,24}"]
}

fn json_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::sample::select(vec![
            concat!(
                r#"{"type":"status","task":{"task":{"job":"j","vertex":"v","subtask":0},"attempt":1},"#,
                r#""status":{"status":"running"}}"#
            ),
            r#"{"job_id":"j","attempt":1,"body":{"type":"cancel"}}"#,
            "{}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn u64s() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0u64..1_000, 1 => any::<u64>()]
}

fn worker_message() -> impl Strategy<Value = WorkerMessage> {
    let task = (text(), text(), any::<u32>(), u64s(), text()).prop_map(
        |(job_id, vertex, subtask, attempt, status)| AttachedTask {
            job_id,
            vertex,
            subtask,
            attempt,
            status,
        },
    );
    let register = (text(), any::<u32>(), prop::collection::vec(task, 0..4), u64s()).prop_map(
        |(worker_id, slots, tasks, highest_term_seen)| RegisterWorker {
            worker_id,
            slots,
            tasks,
            highest_term_seen,
            data_addr: String::new(),
        },
    );
    let body = prop_oneof![
        register.prop_map(worker_message::Body::Register),
        u64s().prop_map(|sequence| worker_message::Body::Heartbeat(Heartbeat { sequence })),
        json_bytes().prop_map(worker_message::Body::ReportJson),
        (u64s(), json_bytes()).prop_map(|(seq, json)| worker_message::Body::Report(Report { seq, json })),
        prop::collection::vec((u64s(), json_bytes()), 0..4).prop_map(|reports| {
            let reports = reports.into_iter().map(|(seq, json)| Report { seq, json }).collect();
            worker_message::Body::Reports(ReportBatch { reports })
        }),
        prop::collection::vec(task_time(), 0..4)
            .prop_map(|tasks| worker_message::Body::TaskTimes(TaskTimes { tasks })),
    ];
    proptest::option::of(body).prop_map(|body| WorkerMessage { body })
}

fn task_time() -> impl Strategy<Value = TaskTime> {
    (text(), text(), any::<u32>(), u64s(), u64s(), u64s(), u64s()).prop_map(
        |(job_id, vertex, subtask, attempt, busy_ms, idle_ms, back_pressured_ms)| TaskTime {
            job_id,
            vertex,
            subtask,
            attempt,
            busy_ms,
            idle_ms,
            back_pressured_ms,
        },
    )
}

fn leader_message() -> impl Strategy<Value = LeaderMessage> {
    let body = prop_oneof![
        (u64s(), u64s(), u64s(), any::<bool>()).prop_map(
            |(leader_id, heartbeat_interval_ms, heartbeat_timeout_ms, report_batches)| {
                leader_message::Body::Registered(Registered {
                    leader_id,
                    heartbeat_interval_ms,
                    heartbeat_timeout_ms,
                    report_batches,
                })
            }
        ),
        u64s().prop_map(|sequence| leader_message::Body::Heartbeat(Heartbeat { sequence })),
        json_bytes().prop_map(leader_message::Body::DeployJson),
        json_bytes().prop_map(leader_message::Body::CommandJson),
        (any::<i32>(), text())
            .prop_map(|(code, message)| leader_message::Body::Error(GatewayError { code, message })),
        u64s().prop_map(|up_to| leader_message::Body::Confirmed(ReportsConfirmed { up_to })),
    ];
    (u64s(), proptest::option::of(body)).prop_map(|(term, body)| LeaderMessage { term, body })
}

fn raft_payload() -> impl Strategy<Value = RaftPayload> {
    json_bytes().prop_map(|data| RaftPayload { data })
}

// ---------------------------------------------------------------------------------------------
// Protobuf-aware damage
// ---------------------------------------------------------------------------------------------

/// Field encodings that are each wrong in a way a decoder must survive.
fn hostile_field() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // A length-delimited field (numbers 1-7) claiming 2^32 - 1, 2^63 and 2^64 - 1 bytes.
        (1u8..8).prop_map(|f| [vec![f << 3 | 2], vec![0xff, 0xff, 0xff, 0xff, 0x0f]].concat()),
        (1u8..8).prop_map(|f| [
            vec![f << 3 | 2],
            vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]
        ]
        .concat()),
        (1u8..8).prop_map(|f| [vec![f << 3 | 2], vec![0xff; 9], vec![0x01]].concat()),
        // An overlong varint (11 bytes) and a truncated one.
        (1u8..8).prop_map(|f| [vec![f << 3], vec![0xff; 10], vec![0x01]].concat()),
        (1u8..8).prop_map(|f| vec![f << 3, 0xff]),
        // Invalid wire types 6 and 7; field number 0; the largest field number.
        (1u8..8, 6u8..8).prop_map(|(f, w)| vec![f << 3 | w, 0]),
        Just(vec![0x00, 0x01]),
        Just(vec![0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01]),
        // Groups (deprecated wire types 3/4) nested deeper than any recursion limit, or unclosed.
        (1usize..400, 1u8..16)
            .prop_map(|(depth, f)| { [vec![f << 3 | 3; depth], vec![f << 3 | 4; depth]].concat() }),
        (1usize..400).prop_map(|depth| vec![0x63; depth]),
        // A mismatched end-group, a fixed64 / fixed32 cut short.
        Just(vec![0x0c]),
        (1u8..8).prop_map(|f| vec![f << 3 | 1, 1, 2, 3]),
        (1u8..8).prop_map(|f| vec![f << 3 | 5, 1]),
        // An unknown field (valid) that decoders must skip.
        (16u8..30, prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(f, b)| [
            vec![f << 3 | 2, b.len() as u8],
            b
        ]
        .concat()),
    ]
}

#[derive(Debug, Clone)]
enum Damage {
    /// Hostile fields inserted at byte positions (often inside another field), then byte edits.
    Fields(Vec<(Index, Vec<u8>)>, Vec<ByteOp>),
    Bytes(Vec<ByteOp>),
    Random(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (prop::collection::vec((any::<Index>(), hostile_field()), 1..4), few_byte_ops())
            .prop_map(|(f, b)| Damage::Fields(f, b)),
        4 => byte_ops().prop_map(Damage::Bytes),
        1 => harness::random_bytes().prop_map(Damage::Random),
    ]
}

fn damaged(valid: &[u8], donor: &[u8], damage: &Damage) -> Vec<u8> {
    match damage {
        Damage::Fields(fields, bytes) => {
            let mut out = valid.to_vec();
            for (at, field) in fields {
                let i = at.index(out.len() + 1);
                out.splice(i..i, field.iter().copied());
            }
            apply_bytes(&out, bytes, donor)
        }
        Damage::Bytes(ops) => apply_bytes(valid, ops, donor),
        Damage::Random(bytes) => bytes.clone(),
    }
}

/// prost decoding of `valid`'s damaged encoding: an error, or a message that re-encodes to bytes
/// no longer than the input (nothing is invented; unknown fields are dropped) and decodes again
/// to itself.
fn check<M: Message + Default + PartialEq + std::fmt::Debug>(
    valid: &M,
    donor: &M,
    damage: &Damage,
) -> Verdict {
    let bytes = valid.encode_to_vec();
    assert_eq!(M::decode(bytes.as_slice()).as_ref(), Ok(valid), "a valid message does not round-trip");
    let input = damaged(&bytes, &donor.encode_to_vec(), damage);
    match M::decode(input.as_slice()) {
        Ok(decoded) => {
            let again = decoded.encode_to_vec();
            assert_eq!(again.len(), decoded.encoded_len());
            assert_eq!(M::decode(again.as_slice()).as_ref(), Ok(&decoded), "re-encoded message differs");
            Verdict::Accepted
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            Verdict::Refused
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Task gateway and Raft transport
// ---------------------------------------------------------------------------------------------

#[test]
fn worker_messages_decode_or_are_refused_never_panic() {
    fuzz(
        "WorkerMessage (protobuf)",
        config(),
        (worker_message(), worker_message(), damage()),
        |(m, donor, d)| Ok(check(&m, &donor, &d)),
    );
}

#[test]
fn leader_messages_decode_or_are_refused_never_panic() {
    fuzz(
        "LeaderMessage (protobuf)",
        config(),
        (leader_message(), leader_message(), damage()),
        |(m, donor, d)| Ok(check(&m, &donor, &d)),
    );
}

#[test]
fn raft_payloads_decode_or_are_refused_never_panic() {
    fuzz("RaftPayload (protobuf)", config(), (raft_payload(), raft_payload(), damage()), |(m, donor, d)| {
        Ok(check(&m, &donor, &d))
    });
}

#[test]
fn a_length_beyond_the_buffer_is_refused_without_allocating_it() {
    // Field 3 (`report_json`) claiming 2^62 bytes, followed by 3 bytes.
    let mut input = vec![0x1a];
    input.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
    input.extend_from_slice(b"abc");
    assert!(WorkerMessage::decode(input.as_slice()).is_err());
}
