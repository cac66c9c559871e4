//! Fuzz targets for what reaches a Shoal agent from outside (issue #35; DESIGN.md §11,
//! invariant 8: no manifest, image, peer message or DNS packet stops an agent or a task of it).
//!
//! Each `pub fn NAME(data: &[u8])` hands arbitrary bytes to the product's public entry points
//! and must never panic: an error is an answer, a panic is a bug. `chaos-tests/fuzz` (cargo-fuzz,
//! libFuzzer, nightly) drives them; the tests at the end replay its committed corpus and every
//! crash input kept in `chaos-tests/fuzz/regressions/` under stable `cargo test`.
//!
//! The admission, patch and selector targets go through the Kubernetes API as a client reaches
//! it, [`shoal_agent::api::router`], served in-process (no socket) over a one-node store, with
//! `dryRun=All` wherever nothing needs writing (`api.rs`): so they cover the object model's
//! checks (`shoal_model::validation`, `shoal_model::selector`) and the agent's own steps
//! around them (`api::patch`, which is private, and the unknown-field check).
//!
//! An input made of several parts separates them with NUL bytes (never part of JSON or YAML).

mod api;
mod chitchat_node;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use serde_json::{Value, json};
use shoal_core::controllers::workload::{Action, PodView};
use shoal_core::controllers::{
    cron_job, daemon_set, deployment, hpa, job, replica_set, service_ip, workload,
};
use shoal_net::dns::{DnsEndpoint, DnsPort, DnsService, Records, Reply};
use shoal_state::sync::{self, SyncRequest, SyncResponse, SyncSession};
use shoal_state::{KindInfo, Store, StoreConfig, WriteMode};

use api::api;
use chitchat_node::{VICTIM, gossip_runtime, survives};

/// "Now" for everything that takes the time as an input: fixed, so an input replays the same.
const NOW_MS: u64 = 1_750_000_000_000;

/// The kinds `admission` submits every input as.
const ADMITTED_KINDS: [&str; 10] = [
    "Pod",
    "Deployment",
    "ReplicaSet",
    "DaemonSet",
    "Job",
    "CronJob",
    "Service",
    "ConfigMap",
    "Secret",
    "HorizontalPodAutoscaler",
];

/// What the API accepts as a patch body.
const PATCH_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// Objects a controller creates in one reconcile that are followed further (their pods parsed).
const FOLLOWED: usize = 4;

/// The first `N` NUL-separated parts of `data` (missing ones empty; the last takes the rest).
fn parts<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&[][..]; N];
    let mut rest = data;
    for (i, part) in out.iter_mut().enumerate() {
        if i + 1 == N {
            *part = rest;
            break;
        }
        match rest.iter().position(|b| *b == 0) {
            Some(at) => {
                *part = &rest[..at];
                rest = &rest[at + 1..];
            }
            None => {
                *part = rest;
                rest = &[];
            }
        }
    }
    out
}

fn kind_info(kind: &str) -> &'static KindInfo {
    shoal_state::KINDS
        .iter()
        .find(|k| k.kind == kind)
        .expect("every admitted kind is a stored kind")
}

/// The collection URL of `info` in namespace `default`.
fn collection(info: &KindInfo) -> String {
    let prefix = if info.group.is_empty() {
        format!("/api/{}", info.version)
    } else {
        format!("/apis/{}/{}", info.group, info.version)
    };
    format!("{prefix}/namespaces/default/{}", info.plural)
}

/// `bytes` percent-encoded for a URL's query.
fn query_value(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(*b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// admission

/// An object (JSON, else YAML; a body that is not JSON also goes in as protobuf) submitted with
/// `dryRun=All` as each kind of [`ADMITTED_KINDS`]; what is admitted goes through its
/// controller's first reconcile (no pods yet) and, for pods, the kubelet's and the scheduler's
/// reading of the spec.
pub fn admission(data: &[u8]) {
    let api = api();
    let answers: Vec<(u16, Vec<u8>)> = match serde_json::from_slice::<Value>(data) {
        Ok(Value::Object(object)) => ADMITTED_KINDS
            .iter()
            .map(|kind| {
                let info = kind_info(kind);
                let mut object = Value::Object(object.clone());
                object["apiVersion"] = json!(info.api_version());
                object["kind"] = json!(info.kind);
                let body = serde_json::to_vec(&object).expect("a JSON value serializes");
                let path = format!("{}?dryRun=All", collection(info));
                api.request("POST", &path, "application/json", &body)
            })
            .collect(),
        Ok(_) => return,
        Err(_) => {
            let mut answers: Vec<_> = ADMITTED_KINDS
                .iter()
                .map(|kind| {
                    let path = format!("{}?dryRun=All", collection(kind_info(kind)));
                    api.request("POST", &path, "application/yaml", data)
                })
                .collect();
            let pods = format!("{}?dryRun=All", collection(kind_info("Pod")));
            answers.push(api.request("POST", &pods, "application/vnd.kubernetes.protobuf", data));
            answers
        }
    };
    drop(api);
    for (status, body) in answers {
        if status == 201
            && let Ok(object) = serde_json::from_slice::<Value>(&body)
        {
            reconcile_admitted(&object);
        }
    }
}

/// The first reconcile of an admitted object by the pure controller cores.
fn reconcile_admitted(object: &Value) {
    let mut counter = 0u64;
    let mut random = move || {
        counter += 1;
        counter
    };
    let one = std::slice::from_ref(object);
    match object["kind"].as_str().unwrap_or_default() {
        "Pod" => read_pod(object),
        "ReplicaSet" => reconcile_replica_set(object, &mut random),
        "Deployment" => {
            for action in deployment::reconcile(object, &[], &[], NOW_MS) {
                if let Action::Create(set) = action {
                    reconcile_replica_set(&set, &mut random);
                }
            }
            let _ = deployment::surge_and_unavailable(object, 3);
            let _ = deployment::status(object, &[], &[], NOW_MS);
        }
        "DaemonSet" => {
            let cluster = shoal_core::placement::cluster::ClusterView::default();
            let _ = daemon_set::fitting_nodes(object, &cluster);
            read_pod(&daemon_set::daemon_pod(object, "fuzz-node"));
            let round = daemon_set::Round {
                me: "fuzz-node",
                cluster: &cluster,
                listed: &|_| true,
                settled: true,
                owns: &|_| true,
                now_ms: NOW_MS,
            };
            let _ = daemon_set::reconcile_node(&round, one, &[]);
            let _ = daemon_set::status(object, &cluster, &[], NOW_MS);
            let _ = daemon_set::max_unavailable(object, 3);
            let _ = daemon_set::current_hash(object);
        }
        "Job" => reconcile_job(object, &mut random),
        "CronJob" => {
            if let Ok(schedule) = shoal_model::cron::schedule(object) {
                let _ = schedule.next(NOW_MS);
                let _ = schedule.latest(NOW_MS - 3_600_000, NOW_MS);
            }
            for action in cron_job::reconcile(object, &[], &[], NOW_MS)
                .into_iter()
                .take(FOLLOWED)
            {
                if let Action::Create(job) = action {
                    reconcile_job(&job, &mut random);
                }
            }
            let _ = cron_job::next_due(object, NOW_MS);
            let _ = cron_job::status(object, &[], NOW_MS);
        }
        "Service" => serve_service(object),
        "HorizontalPodAutoscaler" => {
            let _ = shoal_model::hpa::Spec::parse(object);
            let mut memory = hpa::Memory::default();
            let _ = hpa::reconcile(
                object,
                None,
                &[],
                &HashMap::new(),
                &mut memory,
                NOW_MS,
                15_000,
            );
            let _ = hpa::status(object);
            let _ = hpa::targets_column(object);
        }
        _ => {}
    }
}

/// A pod as the kubelet, the scheduler and the controllers read it.
fn read_pod(pod: &Value) {
    let _ = shoal_core::pod::plan::PodPlan::parse(pod);
    let _ = shoal_model::placement::PodRequest::from_pod(pod);
    let _ = PodView::new(pod, None);
}

fn reconcile_replica_set(set: &Value, random: &mut dyn FnMut() -> u64) {
    let created = replica_set::reconcile(set, &[] as &[PodView], random);
    for action in created.into_iter().take(FOLLOWED) {
        if let Action::Create(pod) = action {
            read_pod(&pod);
        }
    }
    let _ = replica_set::status(set, &[], NOW_MS);
}

fn reconcile_job(job: &Value, random: &mut dyn FnMut() -> u64) {
    let _ = shoal_model::job::failure_policy(job);
    for action in job::reconcile(job, &[], NOW_MS, random)
        .into_iter()
        .take(FOLLOWED)
    {
        if let Action::Create(pod) = action {
            read_pod(&pod);
        }
    }
    let _ = job::progress(job, &job::ledger(job), NOW_MS);
    let _ = job::status(job, &[], NOW_MS);
}

/// A Service as the ClusterIP allocator, the endpoints controller and the DNS server see it,
/// backed by one ready pod, then asked for by name.
fn serve_service(service: &Value) {
    let cidr = "10.96.0.0/16".parse().expect("a CIDR");
    let one = std::slice::from_ref(service);
    let _ = service_ip::cluster_ip(service, cidr);
    let _ = service_ip::reconcile(one, cidr);
    let _ = service_ip::reconcile_node_ports(one);
    let pod = json!({
        "metadata": {"name": "backend", "namespace": "default", "uid": "u-1",
                     "labels": service["spec"]["selector"].clone()},
        "spec": {"nodeName": "fuzz-node", "hostname": "backend", "subdomain": service["metadata"]["name"].clone(),
                 "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
    });
    let status = json!({"phase": "Running", "podIP": "10.88.1.2",
                        "conditions": [{"type": "Ready", "status": "True"}]});
    let backends = shoal_agent::endpoints::backends(service, &[(pod, Some(status))]);
    let _ = shoal_agent::endpoints::endpoints(service, &backends);
    let _ = shoal_agent::endpoints::endpoint_slices(service, &backends);
    let _ = shoal_agent::services::service_ports(service, &backends);
    let records = Records::build(
        "cluster.local",
        &[shoal_agent::services::dns_service(service, &backends)],
    );
    let name = format!(
        "{}.{}.svc.cluster.local.",
        service["metadata"]["name"].as_str().unwrap_or_default(),
        service["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
    );
    if let Ok(name) = Name::from_ascii(&name) {
        for qtype in [RecordType::A, RecordType::SRV] {
            let mut query = Message::query();
            query.add_query(Query::query(name.clone(), qtype));
            answer_and_encode(&records, &query);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// patches

/// `target \0 patch`: the target (as the kind it names, else a ConfigMap) is created, then
/// patched with `dryRun=All` in each patch type, then deleted; a target the API refuses leaves
/// the patch to a stored seed pod. The patched objects go through their first reconcile.
pub fn patches(data: &[u8]) {
    let [target, patch] = parts::<2>(data);
    let mut api = api();
    let stored = serde_json::from_slice::<Value>(target)
        .ok()
        .filter(Value::is_object)
        .and_then(|target| api.store_patch_target(target));
    let path = stored
        .clone()
        .unwrap_or_else(|| format!("{}/seed-a", collection(kind_info("Pod"))));
    let mut answers = Vec::new();
    for content_type in PATCH_TYPES {
        let url = format!("{path}?dryRun=All&fieldManager=fuzz");
        answers.push(api.request("PATCH", &url, content_type, patch));
    }
    // Server-side apply of an object that is not there starts from `{}`.
    let absent = format!(
        "{}/fuzz-absent?dryRun=All&fieldManager=fuzz",
        collection(kind_info("ConfigMap"))
    );
    answers.push(api.request("PATCH", &absent, PATCH_TYPES[3], patch));
    if let Some(path) = stored {
        api.delete_patch_target(&path);
    }
    drop(api);
    for (status, body) in answers {
        if status == 200
            && let Ok(object) = serde_json::from_slice::<Value>(&body)
        {
            reconcile_admitted(&object);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// selectors

/// `labels \0 fields \0 quantity`: a label and a field selector as list queries give them
/// (pods, services, events, nodes), the label helpers of the store (`k=v,…` lists, keys, values,
/// names, paths), a label selector object (when `labels` is JSON), the API's path parser (on
/// `fields`) and resource quantities (CPU and bytes).
pub fn selectors(data: &[u8]) {
    let [labels, fields, quantity] = parts::<3>(data);
    if let Ok(text) = std::str::from_utf8(labels) {
        use shoal_state::labels;
        if let Ok(map) = labels::parse_list(text) {
            let _ = labels::validate(&map);
        }
        let (key, value) = text.split_once('=').unwrap_or((text, ""));
        let _ = labels::validate_key(key);
        let _ = labels::validate_value(key, value);
        let _ = labels::check_dns_subdomain(text);
        let _ = labels::check_dns_label(text);
        let _ = labels::check_config_key(text);
        let _ = labels::check_descending_path(text, true);
    }
    if let Ok(selector) = serde_json::from_slice::<Value>(labels) {
        let term = workload::selector(&json!({"spec": {"selector": selector}}));
        let pod_labels = [("app".to_owned(), "web".to_owned())].into();
        let _ = workload::selects(&term, &pod_labels);
    }
    if let Ok(text) = std::str::from_utf8(fields) {
        let _ = shoal_agent::api::parse_path(text);
    }
    if let Ok(text) = std::str::from_utf8(quantity) {
        let _ = shoal_model::quantity::cpu_millis(text);
        let _ = shoal_model::quantity::bytes(text);
    }
    let query = format!(
        "labelSelector={}&fieldSelector={}",
        query_value(labels),
        query_value(fields)
    );
    let api = api();
    for path in [
        "/api/v1/namespaces/default/pods",
        "/api/v1/pods",
        "/api/v1/namespaces/default/services",
        "/api/v1/namespaces/default/events",
        "/api/v1/nodes",
    ] {
        api.request("GET", &format!("{path}?{query}"), "application/json", b"");
    }
}

// ---------------------------------------------------------------------------------------------
// dns

/// A DNS packet: as a query to the cluster's DNS records (a Service with a ClusterIP and a
/// headless one with named endpoints) whose answer is encoded whole and truncated as a UDP
/// reply is; and as an upstream's reply relayed (re-encoded and truncated).
pub fn dns(data: &[u8]) {
    let Ok(message) = Message::from_vec(data) else {
        return;
    };
    answer_and_encode(dns_records(), &message);
    if let Ok(bytes) = message.to_vec() {
        let _ = Message::from_vec(&bytes);
    }
    let _ = message.truncate().to_vec();
}

/// `records`' answer to `query`, encoded (and decoded again) whole and truncated: what the DNS
/// server's private `encode`/`fit` do with it.
fn answer_and_encode(records: &Records, query: &Message) {
    if let Reply::Answer(answer) = records.answer(query)
        && let Ok(bytes) = answer.to_vec()
    {
        let _ = Message::from_vec(&bytes);
        let _ = answer.truncate().to_vec();
    }
}

fn dns_records() -> &'static Records {
    static RECORDS: OnceLock<Records> = OnceLock::new();
    RECORDS.get_or_init(|| {
        let endpoint = |ip: [u8; 4], hostname: Option<&str>, ready| DnsEndpoint {
            ip: Ipv4Addr::from(ip),
            hostname: hostname.map(str::to_owned),
            ready,
        };
        let port = |name: &str, port| DnsPort {
            name: name.into(),
            protocol: "TCP".into(),
            port,
        };
        Records::build(
            "cluster.local",
            &[
                DnsService {
                    namespace: "default".into(),
                    name: "web".into(),
                    cluster_ip: Some(Ipv4Addr::new(10, 96, 0, 20)),
                    headless: false,
                    ports: vec![port("http", 80)],
                    endpoints: vec![endpoint([10, 88, 1, 2], None, true)],
                },
                DnsService {
                    namespace: "db".into(),
                    name: "pg".into(),
                    cluster_ip: None,
                    headless: true,
                    ports: vec![port("sql", 5432)],
                    endpoints: vec![
                        endpoint([10, 88, 1, 5], Some("pg-0"), true),
                        endpoint([10, 88, 2, 6], None, true),
                        endpoint([10, 88, 2, 7], None, false),
                    ],
                },
            ],
        )
    })
}

// ---------------------------------------------------------------------------------------------
// sync_frames

/// A peer's sync message (MessagePack): as a request, served against a fresh store holding two
/// objects; as a response, fed to an anti-entropy session over such a store.
pub fn sync_frames(data: &[u8]) {
    if let Ok(request) = SyncRequest::decode(data) {
        let (_dir, mut store) = seeded_store();
        let (response, _) = sync::serve(&mut store, request, NOW_MS);
        let _ = SyncResponse::decode(&response.encode());
        let _ = store.collect_tombstones(NOW_MS + 48 * 3_600_000);
    }
    if let Ok(response) = SyncResponse::decode(data) {
        let (_dir, mut store) = seeded_store();
        let (mut session, _) = SyncSession::start();
        if let Ok(sync::Step::Send(request)) = session.on_response(&mut store, response, NOW_MS) {
            let _ = SyncRequest::decode(&request.encode());
        }
    }
}

/// A store in a fresh temporary directory with a ConfigMap and a Pod written at [`NOW_MS`].
fn seeded_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut store =
        Store::open(StoreConfig::new(dir.path().join("state.redb"), 0xf1)).expect("a new store");
    for object in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"k": "v"}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "web"}},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    ] {
        let valid = shoal_state::validate(object, "default").expect("a valid seed object");
        store
            .write_at(valid, WriteMode::Create, NOW_MS)
            .expect("a seed object is written");
    }
    (dir, store)
}

// ---------------------------------------------------------------------------------------------
// gossip_deltas

/// Gossip messages (chitchat 0.11's wire format), each a little-endian u16 length and that many
/// bytes, checked by a [`shoal_gossip::GossipGuard`] as the node's gossip transport does; each
/// message it lets through is decoded and handed to a live chitchat node, which must survive it
/// (a `Syn` of another cluster afterwards must still be answered).
pub fn gossip_deltas(data: &[u8]) {
    let mut messages = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 && messages.len() < 8 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        messages.push(&rest[2..2 + len]);
        rest = &rest[2 + len..];
    }
    let mut guard = shoal_gossip::GossipGuard::new(VICTIM, 1, Duration::from_secs(600));
    let now = std::time::Instant::now();
    let passed: Vec<chitchat::ChitchatMessage> = messages
        .into_iter()
        .filter(|m| guard.check(now, m).is_ok())
        .filter_map(|m| {
            use chitchat::Deserializable as _;
            chitchat::ChitchatMessage::deserialize(&mut &m[..]).ok()
        })
        .collect();
    if passed.is_empty() {
        return;
    }
    gossip_runtime().block_on(survives(passed));
}

// ---------------------------------------------------------------------------------------------
// oci_manifest

/// `config \0 manifest \0 index \0 layer`: an image archive made of these, imported into a
/// fresh image store, then each image it tagged resolved (its layers unpacked, within small
/// limits) and removed. An `index` that is a JSON array is a `docker save` `manifest.json`
/// (with `config.json` and `layer.tar` beside it), else the OCI layout's `index.json` (with the
/// three blobs). Digests and sizes are filled in where the parts say `{config}`,
/// `{config_size}`, `{manifest}`, `{manifest_size}`, `{layer}`, `{layer_size}`; `{layer_diff}`
/// is the layer's digest too (its diff id when it is not compressed). Also: the first line of
/// `index` as an image reference and a digest.
pub fn oci_manifest(data: &[u8]) {
    let [config, manifest, index, layer] = parts::<4>(data);
    if let Ok(text) = std::str::from_utf8(index) {
        let line = text.lines().next().unwrap_or_default();
        let _ = shoal_agent::images::reference::normalize(line);
        let _ = shoal_agent::images::reference::parse_digest(line);
    }
    let mut fills = vec![
        (
            "{layer}".to_owned(),
            format!("sha256:{}", sha256_hex(layer)),
        ),
        (
            "{layer_diff}".to_owned(),
            format!("sha256:{}", sha256_hex(layer)),
        ),
        ("{layer_size}".to_owned(), layer.len().to_string()),
    ];
    let config = fill(config, &fills);
    fills.push(("{config}".into(), format!("sha256:{}", sha256_hex(&config))));
    fills.push(("{config_size}".into(), config.len().to_string()));
    let manifest = fill(manifest, &fills);
    fills.push((
        "{manifest}".into(),
        format!("sha256:{}", sha256_hex(&manifest)),
    ));
    fills.push(("{manifest_size}".into(), manifest.len().to_string()));
    let index = fill(index, &fills);
    let docker = index.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let mut archive = Vec::new();
    if docker {
        tar_file(&mut archive, "manifest.json", &index);
        tar_file(&mut archive, "config.json", &config);
        tar_file(&mut archive, "layer.tar", layer);
    } else {
        tar_file(
            &mut archive,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        );
        tar_file(&mut archive, "index.json", &index);
        for blob in [&config[..], &manifest, layer] {
            tar_file(
                &mut archive,
                &format!("blobs/sha256/{}", sha256_hex(blob)),
                blob,
            );
        }
    }
    archive.extend([0; 1024]);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("image.tar");
    std::fs::write(&path, &archive).expect("the archive is written");
    let store = shoal_agent::images::ImageStore::open(dir.path().join("images"))
        .expect("an image store")
        .with_layer_limits(small_layer_limits());
    let named = [&b"ref.name"[..], b"RepoTags"]
        .iter()
        .any(|needle| index.windows(needle.len()).any(|w| w == *needle));
    let tag = (!named).then_some("fuzz.local/image:1");
    let Ok(imported) = store.import(&path, tag) else {
        return;
    };
    for image in imported.iter().take(FOLLOWED) {
        let _ = store.resolve(&image.reference);
        let _ = store.manifest_bytes(&image.reference);
    }
    let _ = store.list();
    for image in imported.iter().take(FOLLOWED) {
        let _ = store.remove(&image.reference);
    }
}

/// `text` with every `(placeholder, value)` filled in.
fn fill(text: &[u8], fills: &[(String, String)]) -> Vec<u8> {
    let mut out = text.to_vec();
    for (placeholder, value) in fills {
        let (from, to) = (placeholder.as_bytes(), value.as_bytes());
        let mut filled = Vec::with_capacity(out.len());
        let mut i = 0;
        while i < out.len() {
            if out[i..].starts_with(from) {
                filled.extend_from_slice(to);
                i += from.len();
            } else {
                filled.push(out[i]);
                i += 1;
            }
        }
        out = filled;
    }
    out
}

/// The hex SHA-256 of `bytes` (ring's, through rustls: no hash crate of our own here).
fn sha256_hex(bytes: &[u8]) -> String {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
        .tls13()
        .expect("a TLS 1.3 suite");
    let digest = suite.common.hash_provider.hash(bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Appends one regular file to a ustar archive.
fn tar_file(archive: &mut Vec<u8>, name: &str, content: &[u8]) {
    let mut header = [0u8; 512];
    let mut put = |at: usize, field: &[u8]| header[at..at + field.len()].copy_from_slice(field);
    put(0, name.as_bytes());
    put(100, b"0000644\0");
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{:011o}\0", content.len()).as_bytes());
    put(136, b"00000000000\0");
    put(148, b"        ");
    put(156, b"0");
    // Magic "ustar\0", version "00".
    put(257, b"ustar\x0000");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    archive.extend_from_slice(&header);
    archive.extend_from_slice(content);
    archive.resize(archive.len().next_multiple_of(512), 0);
}

fn small_layer_limits() -> shoal_agent::images::layer::LayerLimits {
    shoal_agent::images::layer::LayerLimits {
        max_bytes: 1 << 20,
        max_entries: 1_000,
        ..shoal_agent::images::layer::LayerLimits::default()
    }
}

// ---------------------------------------------------------------------------------------------
// tar_layer

/// A layer blob (tar, gzip or not) unpacked into a fresh directory within 1 MiB and 1,000
/// entries.
pub fn tar_layer(data: &[u8]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let blob = dir.path().join("blob");
    std::fs::write(&blob, data).expect("the blob is written");
    let dest = dir.path().join("layer");
    std::fs::create_dir(&dest).expect("the layer directory is made");
    let _ = shoal_agent::images::layer::unpack(&blob, &dest, None, None, small_layer_limits());
    remove_tree(dir.path());
}

/// Removes `root` whatever modes the layer gave the directories in it.
fn remove_tree(root: &Path) {
    fn open_up(dir: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&entry.path());
            }
        }
    }
    if std::fs::remove_dir_all(root).is_err() {
        open_up(root);
        let _ = std::fs::remove_dir_all(root);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// Every committed corpus input and kept crash input of `target`, through `run`.
    fn replay(target: &str, run: fn(&[u8])) {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut inputs = Vec::new();
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            inputs.extend(entries.map(|e| e.expect("a directory entry").path()));
        }
        inputs.sort();
        assert!(!inputs.is_empty(), "no corpus for {target}");
        for input in inputs {
            let data = std::fs::read(&input).expect("an input file");
            eprintln!("{target}: {}", input.display());
            run(&data);
        }
    }

    #[test]
    fn admission() {
        replay("admission", super::admission);
    }

    #[test]
    fn patches() {
        replay("patches", super::patches);
    }

    #[test]
    fn selectors() {
        replay("selectors", super::selectors);
    }

    #[test]
    fn dns() {
        replay("dns", super::dns);
    }

    #[test]
    fn sync_frames() {
        replay("sync_frames", super::sync_frames);
    }

    #[test]
    fn gossip_deltas() {
        replay("gossip_deltas", super::gossip_deltas);
    }

    #[test]
    fn oci_manifest() {
        replay("oci_manifest", super::oci_manifest);
    }

    #[test]
    fn tar_layer() {
        replay("tar_layer", super::tar_layer);
    }
}
