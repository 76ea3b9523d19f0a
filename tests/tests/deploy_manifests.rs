//! The deployment files under `deploy/`, checked for the invariants a broken rollout would
//! violate: an odd Raft group, a disruption budget of one replica, gRPC health probes on the
//! serving port, a persistent data volume per replica, one checkpoint volume shared at the same
//! path by replicas and workers, a peer list that names exactly the replicas that exist, the
//! admin token taken from a secret, and every configuration file accepted by the real loaders
//! (so a misspelt key fails here, not at 3 a.m.).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cairn_coordinator::config::NodeConfig;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::worker::WorkerConfig;
use serde::Deserialize as _;
use serde_yaml::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("deploy")
}

fn read(rel: &str) -> String {
    let path = deploy_dir().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Loads a replica configuration through the loader `cairn --config` uses, and validates it.
fn load_node_config(name: &str, text: &str) -> NodeConfig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.toml");
    std::fs::write(&path, text).unwrap();
    let config = NodeConfig::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    config.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    config
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str().unwrap_or_else(|| panic!("{what} must be a string, found {v:?}"))
}

fn seq_of<'a>(v: &'a Value, what: &str) -> &'a Vec<Value> {
    v.as_sequence().unwrap_or_else(|| panic!("{what} must be a list, found {v:?}"))
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    seq_of(v, what).iter().map(|s| str_of(s, what).to_owned()).collect()
}

/// The value following `flag` in an argument list.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("{addr:?} has no port"))
}

/// `id → addr` of a configuration's initial members.
fn peer_map(config: &NodeConfig) -> BTreeMap<u64, String> {
    config.peers.iter().map(|p| (p.id, p.addr.clone())).collect()
}

/// The demo job as the compose file submits it: the graph must be the one `DemoJob` builds, so
/// that a change of the graph format shows up here.
fn compose_demo_job() -> DemoJob {
    DemoJob {
        source: SourceConfig {
            keys: 16,
            records_per_key: None,
            rate_per_sec: Some(1000),
            batch: 64,
            idle_after_limit: false,
        },
        output_dir: "/output/demo".into(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 128,
    }
}

// ---------------------------------------------------------------------------------- Kubernetes

/// Every document of every manifest listed in kustomization.yaml.
struct K8s {
    docs: Vec<Value>,
}

impl K8s {
    fn load() -> Self {
        let kustomization: Value = serde_yaml::from_str(&read("k8s/kustomization.yaml")).unwrap();
        let mut docs = Vec::new();
        for file in strings(&kustomization["resources"], "kustomization resources") {
            let text = read(&format!("k8s/{file}"));
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value = Value::deserialize(doc).unwrap_or_else(|e| panic!("k8s/{file}: {e}"));
                if !value.is_null() {
                    docs.push(value);
                }
            }
        }
        Self { docs }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect()
    }

    fn one(&self, kind: &str, name: &str) -> &Value {
        let found: Vec<_> =
            self.all(kind).into_iter().filter(|d| d["metadata"]["name"].as_str() == Some(name)).collect();
        assert_eq!(found.len(), 1, "expected exactly one {kind} named {name}");
        found[0]
    }

    fn statefulset(&self) -> &Value {
        let sets = self.all("StatefulSet");
        assert_eq!(sets.len(), 1, "the replicas are one StatefulSet");
        sets[0]
    }

    fn workers(&self) -> &Value {
        self.one("Deployment", "cairn-worker")
    }

    fn config(&self) -> NodeConfig {
        let cm = self.one("ConfigMap", "cairn-config");
        load_node_config("ConfigMap cairn-config cairn.toml", str_of(&cm["data"]["cairn.toml"], "cairn.toml"))
    }
}

fn containers(workload: &Value) -> &Vec<Value> {
    seq_of(&workload["spec"]["template"]["spec"]["containers"], "containers")
}

fn args_of(container: &Value) -> Vec<String> {
    let mut all = Vec::new();
    for key in ["command", "args"] {
        if !container[key].is_null() {
            all.extend(strings(&container[key], key));
        }
    }
    all
}

fn container_port(container: &Value, name: &str) -> u16 {
    seq_of(&container["ports"], "ports")
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("container {:?} declares no port named {name}", container["name"]))
        as u16
}

fn env_var<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"].as_sequence()?.iter().find(|e| e["name"].as_str() == Some(name))
}

fn mount_path<'a>(container: &'a Value, volume: &str) -> Option<&'a str> {
    container["volumeMounts"]
        .as_sequence()?
        .iter()
        .find(|m| m["name"].as_str() == Some(volume))
        .and_then(|m| m["mountPath"].as_str())
}

fn volume<'a>(workload: &'a Value, name: &str) -> &'a Value {
    seq_of(&workload["spec"]["template"]["spec"]["volumes"], "volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no volume named {name}"))
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    let Some(wanted) = selector.as_mapping() else { return false };
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn kustomization_lists_every_manifest() {
    let kustomization: Value = serde_yaml::from_str(&read("k8s/kustomization.yaml")).unwrap();
    let listed: BTreeSet<String> =
        strings(&kustomization["resources"], "kustomization resources").into_iter().collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir().join("k8s"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk, "deploy/k8s/kustomization.yaml must list exactly the manifests there");
}

#[test]
fn replicas_are_an_odd_raft_group_with_stable_dns_names() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    let replicas = sts["spec"]["replicas"].as_u64().expect("spec.replicas");
    assert!(replicas >= 3 && replicas % 2 == 1, "a Raft group needs an odd number (>= 3) of replicas");

    let pod_labels = &sts["spec"]["template"]["metadata"]["labels"];
    assert!(labels_match(&sts["spec"]["selector"]["matchLabels"], pod_labels));
    let service = k8s.one("Service", str_of(&sts["spec"]["serviceName"], "serviceName"));
    assert_eq!(
        service["spec"]["clusterIP"].as_str(),
        Some("None"),
        "the StatefulSet's Service must be headless"
    );
    assert_eq!(
        service["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true),
        "replicas must resolve each other before they are ready, or no leader is ever elected"
    );
    assert!(labels_match(&service["spec"]["selector"], pod_labels));

    // Node ids are pod ordinals, which start at 1 (node id 0 is refused).
    assert_eq!(sts["spec"]["ordinals"]["start"].as_u64(), Some(1));
    let cairn = &containers(sts)[0];
    let node_id = env_var(cairn, "CAIRN_NODE_ID").expect("CAIRN_NODE_ID is set");
    assert_eq!(
        node_id["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.labels['apps.kubernetes.io/pod-index']")
    );
}

#[test]
fn peer_lists_name_exactly_the_statefulset_pods() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    let name = str_of(&sts["metadata"]["name"], "name");
    let service = str_of(&sts["spec"]["serviceName"], "serviceName");
    let replicas = sts["spec"]["replicas"].as_u64().unwrap();
    let start = sts["spec"]["ordinals"]["start"].as_u64().unwrap_or(0);
    let cairn = &containers(sts)[0];
    let port = container_port(cairn, "grpc");

    let config = k8s.config();
    let expected: BTreeMap<u64, String> =
        (start..start + replicas).map(|i| (i, format!("{name}-{i}.{service}:{port}"))).collect();
    assert_eq!(peer_map(&config), expected, "ConfigMap peers vs StatefulSet pods");
    assert_eq!(port_of(&config.listen), port, "the replica listens on its grpc containerPort");

    let args = args_of(cairn);
    assert_eq!(flag_value(&args, "--config"), Some("/etc/cairn/cairn.toml"));
    assert_eq!(mount_path(cairn, "config"), Some("/etc/cairn"));
    assert_eq!(volume(sts, "config")["configMap"]["name"].as_str(), Some("cairn-config"));
    assert!(flag_value(&args, "--peers").is_none(), "peers come from the ConfigMap alone");
    let advertise = env_var(cairn, "CAIRN_ADVERTISE").expect("CAIRN_ADVERTISE is set");
    assert_eq!(advertise["value"].as_str(), Some(format!("$(POD_NAME).{service}:{port}").as_str()));
    let pod_name = env_var(cairn, "POD_NAME").expect("POD_NAME is set");
    assert_eq!(pod_name["valueFrom"]["fieldRef"]["fieldPath"].as_str(), Some("metadata.name"));

    let worker_args = args_of(&containers(k8s.workers())[0]);
    let coordinators: Vec<String> = flag_value(&worker_args, "--coordinators")
        .expect("workers are given --coordinators")
        .split(',')
        .map(str::to_owned)
        .collect();
    assert_eq!(coordinators, expected.values().cloned().collect::<Vec<_>>(), "workers know every replica");
}

#[test]
fn disruption_budget_allows_exactly_one_replica_down() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    let pdbs = k8s.all("PodDisruptionBudget");
    assert_eq!(pdbs.len(), 1);
    let pdb = pdbs[0];
    assert_eq!(pdb["spec"]["maxUnavailable"].as_u64(), Some(1));
    assert!(pdb["spec"]["minAvailable"].is_null(), "maxUnavailable and minAvailable are exclusive");
    let selector = &pdb["spec"]["selector"]["matchLabels"];
    assert!(
        labels_match(selector, &sts["spec"]["template"]["metadata"]["labels"]),
        "the PDB selects the replicas"
    );
    assert!(
        !labels_match(selector, &k8s.workers()["spec"]["template"]["metadata"]["labels"]),
        "the PDB must not count workers against the replicas' budget"
    );
}

#[test]
fn every_container_has_readiness_and_liveness_probes_on_a_port_it_serves() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    for c in containers(sts) {
        let grpc = container_port(c, "grpc");
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(
                c[probe]["grpc"]["port"].as_u64(),
                Some(grpc as u64),
                "replica {probe} must be the gRPC health check on the serving port"
            );
        }
    }
    // Workers serve no gRPC: their probes hit the /metrics endpoint they are told to serve.
    for c in containers(k8s.workers()) {
        let metrics = container_port(c, "metrics");
        let listen =
            flag_value(&args_of(c), "--metrics-listen").map(str::to_owned).expect("--metrics-listen");
        assert_eq!(port_of(&listen), metrics);
        for probe in ["readinessProbe", "livenessProbe"] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"].as_str(), Some("/metrics"), "worker {probe}");
            let port = &get["port"];
            assert!(
                port.as_str() == Some("metrics") || port.as_u64() == Some(metrics as u64),
                "worker {probe} must target the metrics port"
            );
        }
    }
}

#[test]
fn replicas_keep_their_data_and_share_the_checkpoint_volume_with_workers() {
    let k8s = K8s::load();
    let sts = k8s.statefulset();
    let config = k8s.config();
    let cairn = &containers(sts)[0];

    let templates = seq_of(&sts["spec"]["volumeClaimTemplates"], "volumeClaimTemplates");
    let data = templates
        .iter()
        .find(|t| {
            mount_path(cairn, str_of(&t["metadata"]["name"], "claim name")) == config.data_dir().to_str()
        })
        .expect("a volumeClaimTemplate is mounted at the configured data_dir");
    assert_eq!(strings(&data["spec"]["accessModes"], "accessModes"), ["ReadWriteOnce"]);

    let pvc = k8s.one("PersistentVolumeClaim", "cairn-checkpoints");
    assert_eq!(strings(&pvc["spec"]["accessModes"], "accessModes"), ["ReadWriteMany"]);
    let checkpoint_dir = config.checkpoint_dir();
    for workload in [sts, k8s.workers()] {
        assert_eq!(
            volume(workload, "checkpoints")["persistentVolumeClaim"]["claimName"].as_str(),
            Some("cairn-checkpoints")
        );
        for c in containers(workload) {
            assert_eq!(
                mount_path(c, "checkpoints"),
                checkpoint_dir.to_str(),
                "checkpoints must be at the same path for replicas and workers"
            );
        }
    }
}

#[test]
fn admin_token_comes_from_a_secret_and_never_a_literal() {
    let k8s = K8s::load();
    for secret in k8s.all("Secret") {
        assert!(
            secret["data"].is_null() && secret["stringData"].is_null(),
            "no Secret with a token may be committed; create it with kubectl (see deploy/README.md)"
        );
    }
    let cairn = &containers(k8s.statefulset())[0];
    let token = env_var(cairn, "CAIRN_ADMIN_TOKEN").expect("replicas get CAIRN_ADMIN_TOKEN");
    assert!(token["value"].is_null(), "the admin token must not be a literal");
    let key = &token["valueFrom"]["secretKeyRef"];
    assert_eq!(key["name"].as_str(), Some("cairn-admin-token"));
    assert_eq!(key["key"].as_str(), Some("token"));
    for workload in [k8s.statefulset(), k8s.workers()] {
        for c in containers(workload) {
            for arg in args_of(c) {
                assert!(!arg.contains("token"), "no token on a command line: {arg}");
            }
        }
    }
}

#[test]
fn pods_run_as_uid_10001_on_a_read_only_root() {
    let k8s = K8s::load();
    for workload in [k8s.statefulset(), k8s.workers()] {
        let pod = &workload["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
        assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(10001));
        for c in containers(workload) {
            let sc = &c["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
            assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
            assert_eq!(mount_path(c, "tmp"), Some("/tmp"), "a read-only root needs a writable /tmp");
            assert!(volume(workload, "tmp")["emptyDir"].is_mapping());
        }
    }
}

// ------------------------------------------------------------------------------------- compose

struct Compose {
    file: Value,
    config: NodeConfig,
}

impl Compose {
    fn load() -> Self {
        let mut file: Value = serde_yaml::from_str(&read("compose/docker-compose.yml")).unwrap();
        // `<<: *replica` and the like, as compose applies them.
        file.apply_merge().unwrap();
        let config = load_node_config("compose/cairn.toml", &read("compose/cairn.toml"));
        Self { file, config }
    }

    fn services(&self) -> BTreeMap<String, &Value> {
        self.file["services"]
            .as_mapping()
            .expect("services")
            .iter()
            .map(|(k, v)| (str_of(k, "service name").to_owned(), v))
            .collect()
    }

    /// Services whose command starts with `program`.
    fn running(&self, program: &str) -> BTreeMap<String, &Value> {
        self.services()
            .into_iter()
            .filter(|(_, s)| {
                s["command"].as_sequence().and_then(|c| c.first()).and_then(Value::as_str) == Some(program)
            })
            .collect()
    }
}

fn command(service: &Value) -> Vec<String> {
    strings(&service["command"], "command")
}

/// `volume → mount path` of a compose service (short syntax `source:target[:mode]`).
fn compose_mounts(service: &Value) -> BTreeMap<String, String> {
    strings(&service["volumes"], "volumes")
        .iter()
        .map(|v| {
            let mut parts = v.split(':');
            let source = parts.next().unwrap_or_default().to_owned();
            let target = parts.next().unwrap_or_else(|| panic!("volume {v:?} has no target")).to_owned();
            (source, target)
        })
        .collect()
}

#[test]
fn compose_replicas_match_the_peer_list() {
    let compose = Compose::load();
    let replicas = compose.running("cairn");
    assert!(replicas.len() >= 3 && replicas.len() % 2 == 1, "an odd Raft group of at least 3");
    let peers = peer_map(&compose.config);
    let mut ids = BTreeSet::new();
    for (name, service) in &replicas {
        let args = command(service);
        assert_eq!(flag_value(&args, "--config"), Some("/etc/cairn/cairn.toml"), "{name}");
        assert_eq!(
            compose_mounts(service).get("./cairn.toml").map(String::as_str),
            Some("/etc/cairn/cairn.toml")
        );
        let id: u64 = flag_value(&args, "--node-id").and_then(|v| v.parse().ok()).expect("--node-id");
        ids.insert(id);
        let advertise = flag_value(&args, "--advertise").expect("--advertise");
        assert_eq!(
            peers.get(&id).map(String::as_str),
            Some(advertise),
            "{name}: --advertise vs the peer list"
        );
        assert_eq!(
            advertise,
            format!("{name}:{}", port_of(&compose.config.listen)),
            "{name} is reached by its name"
        );
        assert_eq!(service["hostname"].as_str(), Some(name.as_str()));
    }
    assert_eq!(ids, peers.keys().copied().collect(), "one replica service per peer");

    for (name, worker) in compose.running("cairn-worker") {
        let args = command(worker);
        let coordinators: BTreeSet<&str> =
            flag_value(&args, "--coordinators").expect("--coordinators").split(',').collect();
        assert_eq!(coordinators, peers.values().map(String::as_str).collect(), "{name} knows every replica");
    }
}

#[test]
fn compose_volumes_are_private_per_replica_and_checkpoints_shared() {
    let compose = Compose::load();
    let declared: BTreeSet<String> = compose.file["volumes"]
        .as_mapping()
        .expect("volumes")
        .keys()
        .map(|k| str_of(k, "volume").to_owned())
        .collect();
    let data_dir = compose.config.data_dir();
    let checkpoint_dir = compose.config.checkpoint_dir();
    let mut data_volumes = BTreeSet::new();
    for (name, service) in compose.running("cairn") {
        let mounts = compose_mounts(service);
        let data = mounts
            .iter()
            .find(|(_, target)| Path::new(target) == data_dir)
            .map(|(source, _)| source.clone())
            .unwrap_or_else(|| panic!("{name} has no volume at {}", data_dir.display()));
        assert!(declared.contains(&data), "{name}: {data} must be a named volume");
        assert!(data_volumes.insert(data.clone()), "{name} shares its data volume {data}");
        assert_eq!(mounts.get("checkpoints").map(PathBuf::from), Some(checkpoint_dir.clone()), "{name}");
    }
    let workers = compose.running("cairn-worker");
    assert!(workers.len() >= 2, "two workers, so a lost one's jobs can move");
    let demo = compose_demo_job();
    let output_root = Path::new(&demo.output_dir).parent().unwrap();
    for (name, worker) in workers {
        let mounts = compose_mounts(worker);
        assert_eq!(mounts.get("checkpoints").map(PathBuf::from), Some(checkpoint_dir.clone()), "{name}");
        assert_eq!(mounts.get("output").map(Path::new), Some(output_root), "{name}: the demo sink's output");
    }
}

#[test]
fn compose_network_is_private_and_the_token_a_secret_file() {
    let compose = Compose::load();
    assert_eq!(compose.file["networks"]["cairn"]["internal"].as_bool(), Some(true));
    for (name, service) in compose.services() {
        assert_eq!(strings(&service["networks"], "networks"), ["cairn"], "{name}");
        assert!(service["ports"].is_null(), "{name} publishes no port: the network is private");
        if let Some(env) = service["environment"].as_mapping() {
            for key in env.keys() {
                assert!(!str_of(key, "env").contains("TOKEN"), "{name}: no token in the environment");
            }
        }
        for arg in command(service) {
            assert!(
                !arg.contains("token") || arg == "--token-file" || arg.starts_with("/run/secrets/"),
                "{name}: the token is read from the secret file only ({arg})"
            );
        }
    }
    assert_eq!(compose.config.admin_token_file.as_deref(), Some(Path::new("/run/secrets/admin-token")));
    assert_eq!(compose.config.cluster_secret_file.as_deref(), Some(Path::new("/run/secrets/cluster-secret")));
    assert_eq!(compose.config.worker_token_file.as_deref(), Some(Path::new("/run/secrets/worker-token")));
    // Replicas hold all three credentials; workers only theirs.
    for name in compose.running("cairn").keys() {
        assert_eq!(
            strings(&compose.services()[name]["secrets"], "secrets"),
            ["admin-token", "cluster-secret", "worker-token"],
            "{name}"
        );
    }
    for name in compose.running("cairn-worker").keys() {
        assert_eq!(strings(&compose.services()[name]["secrets"], "secrets"), ["worker-token"], "{name}");
    }
    for key in ["admin-token", "cluster-secret", "worker-token"] {
        let secret = str_of(&compose.file["secrets"][key]["file"], "secret file");
        assert!(secret.contains("./secrets/"), "the default {key} file lives in the git-ignored secrets/");
    }
    assert_eq!(read("compose/.gitignore").lines().map(str::trim).collect::<Vec<_>>(), ["secrets/"]);
}

#[test]
fn compose_submits_the_demo_graph_that_demojob_builds() {
    let compose = Compose::load();
    let file: serde_json::Value = serde_json::from_str(&read("compose/demo-graph.json")).unwrap();
    let expected = serde_json::to_value(compose_demo_job().graph()).unwrap();
    assert_eq!(
        file,
        expected,
        "deploy/compose/demo-graph.json is stale; regenerate it as:\n{}",
        serde_json::to_string_pretty(&expected).unwrap()
    );
    let submit = compose.running("cairnctl");
    let (name, service) = submit.iter().next().expect("a one-shot service submits the demo job");
    let args = command(service);
    let graph = flag_value(&args, "--graph").expect("--graph");
    assert_eq!(compose_mounts(service).get("./demo-graph.json").map(String::as_str), Some(graph), "{name}");
    for replica in compose.running("cairn").keys() {
        assert_eq!(
            service["depends_on"][replica.as_str()]["condition"].as_str(),
            Some("service_healthy"),
            "{name} waits for {replica}"
        );
    }
}

// ------------------------------------------------------------------------- sample configurations

/// Keys set in `text` (a TOML file) that are not directly preceded by a comment line.
fn uncommented_keys(text: &str, keys: &BTreeSet<String>) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut missing = Vec::new();
    for key in keys {
        let leaf = key.rsplit('.').next().unwrap_or(key);
        let at = lines.iter().position(|l| l.split('=').next().map(str::trim) == Some(leaf));
        match at {
            Some(i) if i > 0 && lines[i - 1].starts_with('#') => {}
            _ => missing.push(key.clone()),
        }
    }
    missing
}

/// `table.key` of every key under `tables` in the serialized defaults.
fn keys_of(defaults: &toml::Value, tables: &[&str]) -> BTreeSet<String> {
    tables
        .iter()
        .flat_map(|t| {
            defaults[*t]
                .as_table()
                .unwrap_or_else(|| panic!("no [{t}] table"))
                .keys()
                .map(move |k| format!("{t}.{k}"))
        })
        .collect()
}

#[test]
fn production_replica_config_loads_and_explains_every_timing_knob() {
    let text = read("config/cairn.production.toml");
    let config = load_node_config("config/cairn.production.toml", &text);
    assert_eq!(config.peers.len(), 3);
    assert!(config.peers.iter().any(|p| p.id == config.node_id), "the sample replica is one of the peers");

    let defaults = toml::Value::try_from(NodeConfig::default()).unwrap();
    let knobs = keys_of(&defaults, &["raft", "workers"]);
    let file: toml::Value = toml::from_str(&text).unwrap();
    for key in &knobs {
        let (table, leaf) = key.split_once('.').unwrap();
        assert!(file[table].get(leaf).is_some(), "config/cairn.production.toml must set {key}");
    }
    assert_eq!(uncommented_keys(&text, &knobs), Vec::<String>::new(), "timing knobs without a comment");
}

#[test]
fn production_worker_config_loads_and_explains_every_timing_knob() {
    let text = read("config/worker.production.toml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.toml");
    std::fs::write(&path, &text).unwrap();
    let config =
        WorkerConfig::from_file(&path).unwrap_or_else(|e| panic!("config/worker.production.toml: {e}"));
    config.validate().unwrap_or_else(|e| panic!("config/worker.production.toml: {e}"));

    // The timing knobs are the keys whose defaults are durations.
    let defaults = toml::Value::try_from(WorkerConfig::default()).unwrap();
    let knobs: BTreeSet<String> = defaults
        .as_table()
        .unwrap()
        .iter()
        .filter(|(_, v)| v.as_str().is_some_and(|s| humantime::parse_duration(s).is_ok()))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(knobs.contains("connect_timeout"), "{knobs:?}");
    let file: toml::Value = toml::from_str(&text).unwrap();
    for key in &knobs {
        assert!(file.get(key).is_some(), "config/worker.production.toml must set {key}");
    }
    assert_eq!(uncommented_keys(&text, &knobs), Vec::<String>::new(), "timing knobs without a comment");
}

#[test]
fn systemd_units_are_hardened_and_stop_gracefully() {
    for unit in ["systemd/cairn.service", "systemd/cairn-worker.service"] {
        let text = read(unit);
        let settings: Vec<(&str, &str)> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let get = |key: &str| settings.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        for (key, value) in [
            ("User", "cairn"),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("Restart", "on-failure"),
            ("KillSignal", "SIGTERM"),
        ] {
            assert_eq!(get(key), Some(value), "{unit}: {key}");
        }
        assert!(get("TimeoutStopSec").is_some(), "{unit}: TimeoutStopSec");
        let state = get("StateDirectory").unwrap_or_else(|| panic!("{unit}: StateDirectory"));
        let writable = get("ReadWritePaths").unwrap_or_else(|| panic!("{unit}: ReadWritePaths"));
        assert!(
            writable.split_whitespace().any(|p| p == format!("/var/lib/{state}")),
            "{unit}: state dir writable"
        );
        assert!(
            writable.split_whitespace().any(|p| p == "/srv/cairn/checkpoints"),
            "{unit}: checkpoints writable"
        );
    }
    // The replica unit and the sample config agree on where things live.
    let config = load_node_config("config/cairn.production.toml", &read("config/cairn.production.toml"));
    assert_eq!(config.data_dir(), Path::new("/var/lib/cairn"));
    assert_eq!(config.checkpoint_dir(), Path::new("/srv/cairn/checkpoints"));
}
