//! Structure-aware fuzzing of what a worker decodes: its TOML configuration
//! (`WorkerConfig::from_file` + `validate`), the leader's deployments and task commands as the
//! gateway session decodes them (and what the job host does with a deployment next: decode its
//! graph, name its task attempts), the key-group state files a task restores, and a restore as a
//! whole (`state::restore::load`). See `docs/FUZZING.md`.

#[path = "../../protocol/tests/support/harness.rs"]
mod harness;
#[path = "../../protocol/tests/support/mutate.rs"]
mod mutate;
#[path = "../../protocol/tests/support/mutate_toml.rs"]
mod mutate_toml;
#[path = "../../protocol/tests/support/strategies.rs"]
mod strategies;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cairn_protocol::assign::{AssignedListState, ByteRange, ListStatePart, OperatorRestore, TaskRestore};
use cairn_protocol::checkpoint::{
    KeyGroupRange, KeyGroupSegment, KeyedStateHandle, OperatorStateMode, StateFile,
};
use cairn_protocol::graph::MAX_MAX_PARALLELISM;
use cairn_protocol::messages::{Deployment, TaskCommand};
use cairn_protocol::operators::OperatorCatalog;
use cairn_taskrt::demo::source::{decode_offset, encode_offset};
use cairn_taskrt::state::StateError;
use cairn_taskrt::state::codec::{self, KeyGroupData};
use cairn_taskrt::state::restore::load;
use cairn_taskrt::worker::config::{ConfigError, LogFormat, WorkerConfig};
use cairn_taskrt::worker::deploy::{MAX_REPORTED_TASKS, decode_graph, task_attempts};
use harness::{ByteOp, Verdict, apply_bytes, byte_ops, config, few_byte_ops, fuzz, rarely, verdict};
use mutate::{JsonOp, case, check_json, json_ops, mutated};
use mutate_toml::{TomlOp, apply_toml_ops, mutate_toml, toml_ops};
use proptest::prelude::*;
use strategies::{deployment, task_command};

// ---------------------------------------------------------------------------------------------
// 7. The worker's TOML configuration
// ---------------------------------------------------------------------------------------------

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (1u64..20_000).prop_map(Duration::from_millis),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

fn worker_config() -> impl Strategy<Value = WorkerConfig> {
    let endpoint = prop_oneof![
        (1u16..=u16::MAX).prop_map(|p| format!("127.0.0.1:{p}")),
        ("[a-z]{1,8}", 1u16..=u16::MAX).prop_map(|(h, p)| format!("http://{h}:{p}/")),
    ];
    let tls = proptest::option::of(
        (proptest::option::of(Just(PathBuf::from("/nonexistent/ca.pem"))), any::<bool>()).prop_map(
            |(ca_file, cert)| cairn_proto::tls::TlsFiles {
                cert_file: cert.then(|| PathBuf::from("/nonexistent/cert.pem")),
                key_file: cert.then(|| PathBuf::from("/nonexistent/key.pem")),
                ca_file,
            },
        ),
    );
    (
        (prop::collection::vec(endpoint, 0..4), proptest::option::of("[a-z0-9-]{1,20}"), 0u32..64),
        (duration(), duration(), duration(), duration(), duration()),
        (0usize..16, prop::sample::select(vec!["info", "debug", "cairn_taskrt=trace"]), any::<bool>()),
        proptest::option::of((1u16..=u16::MAX).prop_map(|p| format!("0.0.0.0:{p}"))),
        prop_oneof![4 => Just(None), 1 => tls],
    )
        .prop_map(
            |(
                (coordinators, worker_id, slots),
                (backoff_min, backoff_extra, connect_timeout, register_timeout, cancel_timeout),
                (snapshot_concurrency, log, json),
                metrics_listen,
                tls,
            )| WorkerConfig {
                coordinators,
                worker_id,
                slots,
                reconnect_backoff_min: backoff_min,
                reconnect_backoff_max: backoff_min.saturating_add(backoff_extra),
                connect_timeout,
                register_timeout,
                cancel_timeout,
                snapshot_concurrency,
                log: log.to_owned(),
                log_format: if json { LogFormat::Json } else { LogFormat::Text },
                metrics_listen,
                data_listen: "127.0.0.1:0".to_owned(),
                data_advertise: None,
                tls,
                token_file: None,
                token: None,
            },
        )
}

#[derive(Debug, Clone)]
enum Damage {
    Structure(Vec<JsonOp>, Vec<TomlOp>, Vec<ByteOp>),
    Random(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        9 => (json_ops(), rarely(toml_ops()), rarely(few_byte_ops()))
            .prop_map(|(j, t, b)| Damage::Structure(j, t, b)),
        1 => harness::random_bytes().prop_map(Damage::Random),
    ]
}

#[test]
fn worker_configs_decode_validate_or_are_refused_never_panic() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("worker.toml");
    fuzz(
        "WorkerConfig (TOML) + validate",
        config(),
        (worker_config(), worker_config(), damage()),
        |(c, donor, damage)| {
            let text = toml::to_string(&c).unwrap_or_else(|e| panic!("encode: {e}"));
            let back: WorkerConfig =
                toml::from_str(&text).unwrap_or_else(|e| panic!("valid config refused: {e}\n{text}"));
            prop_assert_eq!(&back, &c);

            let input = match &damage {
                Damage::Structure(json, toml_ops, bytes) => {
                    let doc = serde_json::to_value(&c).unwrap_or_default();
                    let text = mutate_toml(&doc, json).unwrap_or(text);
                    let donor = toml::to_string(&donor).unwrap_or_default();
                    apply_bytes(apply_toml_ops(&text, toml_ops).as_bytes(), bytes, donor.as_bytes())
                }
                Damage::Random(bytes) => bytes.clone(),
            };
            std::fs::write(&path, &input).unwrap_or_else(|e| panic!("write: {e}"));
            match WorkerConfig::from_file(&path) {
                Ok(decoded) => {
                    let text = String::from_utf8(input)
                        .unwrap_or_else(|_| panic!("a file that is not UTF-8 decoded"));
                    let from_str = toml::from_str::<WorkerConfig>(&text).ok();
                    prop_assert_eq!(from_str.as_ref(), Some(&decoded));
                    let again = toml::to_string(&decoded)
                        .unwrap_or_else(|e| panic!("decoded config must encode: {e}"));
                    let reread = toml::from_str::<WorkerConfig>(&again).ok();
                    prop_assert_eq!(reread.as_ref(), Some(&decoded), "{}", again);
                    match decoded.validate() {
                        Ok(()) => {
                            prop_assert!(!decoded.endpoints().is_empty());
                            let _ = decoded.effective_worker_id();
                        }
                        Err(e) => prop_assert!(!e.to_string().is_empty()),
                    }
                    Ok(Verdict::Accepted)
                }
                Err(e) => {
                    prop_assert!(matches!(e, ConfigError::Parse { .. } | ConfigError::Read { .. }), "{e}");
                    Ok(Verdict::Refused)
                }
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Leader messages, as the gateway session decodes them and the job host uses them
// ---------------------------------------------------------------------------------------------

#[test]
fn deployments_decode_and_name_their_tasks_never_panic() {
    fuzz("Deployment (worker)", config(), case(deployment), |(d, donor, m)| {
        let decoded = check_json(&d, &mutated(&d, &donor, &m));
        let Some(d) = decoded else {
            return Ok(Verdict::Refused);
        };
        // What `HostState::on_deploy` does next.
        let graph = decode_graph(&d);
        if let Ok(g) = &graph {
            let _ = g.validate(&OperatorCatalog::builtin());
        }
        let tasks = task_attempts(&d, graph.as_ref().ok());
        prop_assert!(tasks.iter().all(|t| t.attempt == d.attempt && t.task.job == d.job_id));
        if let Ok(g) = &graph {
            let named: u64 =
                g.vertices.iter().map(|v| u64::from(v.parallelism.min(MAX_MAX_PARALLELISM))).sum();
            prop_assert_eq!(tasks.len() as u64, named.min(MAX_REPORTED_TASKS as u64));
        }
        Ok(Verdict::Accepted)
    });
}

/// How a placement the leader would send is damaged before the worker reads it.
#[derive(Debug, Clone)]
enum PlacementDamage {
    None,
    DropSubtask(usize),
    DuplicateSubtask(usize),
    UnknownVertex(usize),
    SubtaskOutOfRange(usize, u32),
    DropAddress(usize),
    Address(usize, String),
    Key(String),
}

fn placement_damage() -> impl Strategy<Value = PlacementDamage> {
    let address = prop_oneof![
        Just(String::new()),
        Just("no-port".to_owned()),
        Just("fd00::5:7500".to_owned()),
        Just("[fd00::5]:7500".to_owned()),
        Just("127.0.0.1:99999".to_owned()),
        // Printable, without a `:`: nothing here makes the worker ask a DNS server.
        "[ -9;-~]{0,12}",
    ];
    let key = prop_oneof![
        "[0-9a-f]{0,70}",
        "[0-9a-fA-F]{64}",
        "[g-z]{64}",
        prop::collection::vec(any::<char>(), 16..33).prop_map(|c| c.into_iter().collect::<String>()),
        Just(format!("é{}", "a".repeat(62))),
    ];
    prop_oneof![
        4 => Just(PlacementDamage::None),
        1 => any::<usize>().prop_map(PlacementDamage::DropSubtask),
        1 => any::<usize>().prop_map(PlacementDamage::DuplicateSubtask),
        1 => any::<usize>().prop_map(PlacementDamage::UnknownVertex),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(i, s)| PlacementDamage::SubtaskOutOfRange(i, s)),
        1 => any::<usize>().prop_map(PlacementDamage::DropAddress),
        1 => (any::<usize>(), address).prop_map(|(i, a)| PlacementDamage::Address(i, a)),
        1 => key.prop_map(PlacementDamage::Key),
    ]
}

#[test]
fn placements_are_checked_whole_or_refused_never_panic() {
    use cairn_protocol::messages::{DeploymentPlacement, PlacedSubtask};
    use cairn_taskrt::worker::deploy::placement;

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = runtime.unwrap_or_else(|e| panic!("a test runtime: {e}"));
    let strategy = (strategies::valid_graph(), 1usize..4, any::<u64>(), placement_damage());
    fuzz("placement (worker)", config(), strategy, |(graph, workers, seed, damage)| {
        // What the leader sends: every subtask on one of `workers` workers, each with an address.
        let mut subtasks: Vec<PlacedSubtask> = graph
            .vertices
            .iter()
            .flat_map(|v| (0..v.parallelism).map(move |i| (v.id.clone(), i)))
            .enumerate()
            .map(|(n, (vertex, subtask))| PlacedSubtask {
                vertex,
                subtask,
                worker: format!("w{}", (seed as usize).wrapping_add(n) % workers),
            })
            .collect();
        let mut addresses: BTreeMap<String, String> =
            (0..workers).map(|w| (format!("w{w}"), format!("127.0.0.1:{}", 7500 + w))).collect();
        let mut key = "ab".repeat(32);
        let pick = |i: usize, len: usize| i % len.max(1);
        match &damage {
            PlacementDamage::None => {}
            PlacementDamage::DropSubtask(i) if !subtasks.is_empty() => {
                subtasks.remove(pick(*i, subtasks.len()));
            }
            PlacementDamage::DuplicateSubtask(i) if !subtasks.is_empty() => {
                let mut again = subtasks[pick(*i, subtasks.len())].clone();
                again.worker = "w0".into();
                subtasks.push(again);
            }
            PlacementDamage::UnknownVertex(i) if !subtasks.is_empty() => {
                let at = pick(*i, subtasks.len());
                subtasks[at].vertex.push_str("-unknown");
            }
            PlacementDamage::SubtaskOutOfRange(i, s) if !subtasks.is_empty() => {
                let at = pick(*i, subtasks.len());
                let parallelism = graph.vertex(&subtasks[at].vertex).map_or(0, |v| v.parallelism);
                subtasks[at].subtask = parallelism.saturating_add(*s % 8);
            }
            PlacementDamage::DropAddress(i) => {
                addresses.remove(&format!("w{}", pick(*i, workers)));
            }
            PlacementDamage::Address(i, a) => {
                addresses.insert(format!("w{}", pick(*i, workers)), a.clone());
            }
            PlacementDamage::Key(k) => key = k.clone(),
            _ => {}
        }
        let sent = DeploymentPlacement { subtasks, addresses, exchange_key: key };
        // Round-trip through JSON as the gateway delivers it.
        let Some(sent) = check_json(&sent, &serde_json::to_vec(&sent).unwrap_or_default()) else {
            return Ok(Verdict::Refused);
        };
        match runtime.block_on(placement(&sent, &graph)) {
            Ok(p) => {
                let all: Vec<(String, u32)> = graph
                    .vertices
                    .iter()
                    .flat_map(|v| (0..v.parallelism).map(move |i| (v.id.clone(), i)))
                    .collect();
                prop_assert_eq!(p.subtasks.len(), all.len(), "{:?}", damage);
                prop_assert!(all.iter().all(|t| p.subtasks.contains_key(t)), "{:?}", damage);
                prop_assert!(p.subtasks.values().all(|w| p.addresses.contains_key(w)), "{:?}", damage);
                prop_assert_eq!(sent.subtasks.len(), all.len(), "a duplicate was accepted: {:?}", damage);
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(!matches!(damage, PlacementDamage::None), "a sound placement refused: {e}");
                prop_assert!(e.to_string().contains("placement"), "{e}");
                Ok(Verdict::Refused)
            }
        }
    });
}

#[test]
fn task_commands_decode_or_are_refused_never_panic() {
    fuzz("TaskCommand (worker)", config(), case(task_command), |(c, donor, m)| {
        Ok(verdict(&check_json::<TaskCommand>(&c, &mutated(&c, &donor, &m))))
    });
}

// ---------------------------------------------------------------------------------------------
// Key-group state files and restores
// ---------------------------------------------------------------------------------------------

fn state_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,64}"
}

fn key_group_data() -> impl Strategy<Value = KeyGroupData> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..24);
    let values = prop::collection::btree_map(
        state_name(),
        prop::collection::hash_map(any::<u64>(), bytes(), 0..6),
        0..3,
    );
    let maps = prop::collection::btree_map(
        state_name(),
        prop::collection::hash_map(any::<u64>(), prop::collection::btree_map(bytes(), bytes(), 0..4), 0..4),
        0..3,
    );
    (values, maps).prop_map(|(values, maps)| KeyGroupData { values, maps })
}

#[derive(Debug, Clone)]
enum FileDamage {
    Bytes(Vec<ByteOp>),
    Random(Vec<u8>),
}

fn file_damage() -> impl Strategy<Value = FileDamage> {
    prop_oneof![
        9 => byte_ops().prop_map(FileDamage::Bytes),
        1 => harness::random_bytes().prop_map(FileDamage::Random),
    ]
}

#[test]
fn key_group_files_decode_or_are_refused_never_panic() {
    let strategy = (any::<u32>(), key_group_data(), key_group_data(), file_damage());
    fuzz("key-group state file", config(), strategy, |(kg, data, donor, damage)| {
        let valid = codec::encode(kg, &data);
        prop_assert_eq!(codec::decode(&valid), Ok((kg, data.clone())));
        let input = match &damage {
            FileDamage::Bytes(ops) => apply_bytes(&valid, ops, &codec::encode(kg, &donor)),
            FileDamage::Random(bytes) => bytes.clone(),
        };
        match codec::decode(&input) {
            Ok((declared, decoded)) => {
                // Accepted: re-encoding and decoding again gives the same state.
                let again = codec::encode(declared, &decoded);
                prop_assert_eq!(codec::decode(&again), Ok((declared, decoded)));
                prop_assert!(
                    again.len() <= input.len(),
                    "re-encoding grew: duplicate entries collapse, nothing appears"
                );
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(!e.0.is_empty());
                Ok(Verdict::Refused)
            }
        }
    });
}

#[test]
fn source_offsets_decode_only_from_sixteen_bytes() {
    let strategy = (any::<u64>(), any::<u64>(), file_damage());
    fuzz("source offset element", config(), strategy, |(k, n, damage)| {
        let valid = encode_offset(k, n);
        prop_assert_eq!(decode_offset(&valid), Ok((k, n)));
        let input = match &damage {
            FileDamage::Bytes(ops) => apply_bytes(&valid, ops, &valid),
            FileDamage::Random(bytes) => bytes.clone(),
        };
        let decoded = decode_offset(&input);
        prop_assert_eq!(decoded.is_ok(), input.len() == 16);
        Ok(verdict(&decoded.ok()))
    });
}

/// A restore of one operator: a keyed-state file (one key group) and a list-state file written
/// under `base`.
fn write_restore(base: &std::path::Path, kg: u32, data: &KeyGroupData, elements: &[Vec<u8>]) -> TaskRestore {
    let write = |rel: &str, bytes: &[u8]| {
        let path = base.join(rel);
        std::fs::create_dir_all(path.parent().unwrap_or(base)).unwrap_or_else(|e| panic!("mkdir: {e}"));
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write: {e}"));
        StateFile { path: rel.to_owned(), size: bytes.len() as u64, crc32: crc32fast::hash(bytes) }
    };
    let keyed = write("chk-1/op-0.state", &codec::encode(kg, data));
    let segment =
        KeyGroupSegment { file: keyed.path.clone(), offset: 0, length: keyed.size, crc32: keyed.crc32 };
    let mut list_bytes = Vec::new();
    let mut ranges = Vec::new();
    for e in elements {
        let start = list_bytes.len() as u64;
        list_bytes.extend_from_slice(e);
        ranges.push(ByteRange { start, end: list_bytes.len() as u64 });
    }
    let list = write("chk-1/op-0-offsets.state", &list_bytes);
    let op = OperatorRestore {
        keyed: KeyedStateHandle { key_groups: BTreeMap::from([(kg, segment)]), files: vec![keyed] },
        list_states: vec![AssignedListState {
            name: "offsets".into(),
            mode: OperatorStateMode::RoundRobin,
            parts: vec![ListStatePart { file: list, elements: ranges }],
        }],
        channel_state: Vec::new(),
    };
    TaskRestore {
        checkpoint_id: 1,
        base_dir: base.to_owned(),
        key_groups: KeyGroupRange { start: kg, end: kg },
        operators: BTreeMap::from([("op".to_owned(), op)]),
    }
}

#[derive(Debug, Clone)]
enum RestoreDamage {
    /// The handles damaged (as a leader's deployment carries them).
    Handles(Vec<JsonOp>, Vec<ByteOp>),
    /// The keyed-state file damaged, its handle updated to match (so the decoder sees it).
    KeyGroupFile(Vec<ByteOp>),
    /// The keyed-state file damaged behind its handle's back.
    Stale(Vec<ByteOp>),
}

#[test]
fn restores_load_or_fail_with_a_state_error_never_panic() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let damage = prop_oneof![
        3 => (json_ops(), few_byte_ops()).prop_map(|(j, b)| RestoreDamage::Handles(j, b)),
        3 => byte_ops().prop_map(RestoreDamage::KeyGroupFile),
        1 => byte_ops().prop_map(RestoreDamage::Stale),
    ];
    let elements = prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 0..5);
    let strategy = (0u32..128, key_group_data(), elements, damage);
    fuzz("restore load", config(), strategy, |(kg, data, elements, damage)| {
        let base = dir.path();
        let restore = write_restore(base, kg, &data, &elements);
        let loaded = load(&restore).unwrap_or_else(|e| panic!("a valid restore failed: {e}"));
        let op = &loaded.operators["op"];
        prop_assert_eq!(&op.groups[0].data, &data);
        prop_assert_eq!(&op.lists[0].2, &elements);

        let restore = match &damage {
            RestoreDamage::Handles(json, bytes) => {
                let doc = serde_json::to_value(&restore).unwrap_or_default();
                let input = mutate::mutated_json(&doc, json, bytes, &[]);
                match serde_json::from_slice::<TaskRestore>(&input) {
                    // The files stay where the test wrote them: only the handles are damaged.
                    Ok(r) => TaskRestore { base_dir: base.to_owned(), ..r },
                    Err(_) => return Ok(Verdict::Refused),
                }
            }
            RestoreDamage::KeyGroupFile(ops) | RestoreDamage::Stale(ops) => {
                let mut restore = restore;
                let keyed = restore.operators.get_mut("op").map(|o| &mut o.keyed);
                let keyed = keyed.unwrap_or_else(|| panic!("the restore has keyed state"));
                let path = base.join(&keyed.files[0].path);
                let bytes = apply_bytes(&std::fs::read(&path).unwrap_or_default(), ops, &[]);
                std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("write: {e}"));
                if matches!(damage, RestoreDamage::KeyGroupFile(_)) {
                    let (size, crc32) = (bytes.len() as u64, crc32fast::hash(&bytes));
                    keyed.files[0].size = size;
                    keyed.files[0].crc32 = crc32;
                    if let Some(segment) = keyed.key_groups.get_mut(&kg) {
                        segment.length = size;
                        segment.crc32 = crc32;
                    }
                }
                restore
            }
        };
        match load(&restore) {
            Ok(loaded) => {
                for op in loaded.operators.values() {
                    for g in &op.groups {
                        let handed = restore.operators.values().any(|o| {
                            o.keyed.key_groups.get(&g.key_group) == Some(&g.segment)
                                && o.keyed.file(&g.segment.file) == Some(&g.file)
                        });
                        prop_assert!(handed, "key group {} was not in the restore", g.key_group);
                    }
                }
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                let stale_detected =
                    matches!(e, StateError::SizeMismatch { .. } | StateError::SegmentChecksumMismatch { .. });
                if matches!(damage, RestoreDamage::Stale(_)) {
                    prop_assert!(stale_detected || matches!(e, StateError::Corrupt { .. }), "{e}");
                }
                prop_assert!(!e.to_string().is_empty());
                Ok(Verdict::Refused)
            }
        }
    });
}

// Defects in `taskrt/src/worker/` the fuzzer found, now fixed: a deployment names a bounded number
// of tasks, and timeouts beyond what an `Instant` holds are refused.

#[test]
fn a_deployment_names_a_bounded_number_of_tasks() {
    let graph = serde_json::json!({
        "vertices": [{ "id": "v", "name": "v", "parallelism": 200_000, "max_parallelism": 200_000,
                       "operator": { "kind": "sequence_source" } }],
        "edges": []
    });
    let d = Deployment {
        job_id: "j".into(),
        attempt: 1,
        graph,
        storage_root: "/tmp".into(),
        restore: None,
        incremental: false,
        placement: None,
    };
    let graph = decode_graph(&d).unwrap_or_else(|e| panic!("{e}"));
    assert!(graph.validate(&OperatorCatalog::builtin()).is_err(), "no valid graph has this parallelism");
    assert!(task_attempts(&d, Some(&graph)).len() <= MAX_REPORTED_TASKS);
}

#[test]
fn validated_worker_timeouts_fit_an_instant() {
    // `HostState` computes `Instant::now() + cancel_timeout + 1s` when it cancels a job, and the
    // session `Instant::now() + register_timeout` when it attaches.
    for key in ["cancel_timeout", "register_timeout"] {
        let text = format!("coordinators = [\"127.0.0.1:7400\"]\n{key} = \"584542046090years\"\n");
        let c: WorkerConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        if c.validate().is_ok() {
            let now = std::time::Instant::now();
            let cancel =
                c.cancel_timeout.checked_add(Duration::from_secs(1)).and_then(|d| now.checked_add(d));
            assert!(cancel.is_some(), "{key}: cancel_timeout validated but overflows");
            assert!(
                now.checked_add(c.register_timeout).is_some(),
                "{key}: register_timeout validated but overflows"
            );
        }
    }
}
