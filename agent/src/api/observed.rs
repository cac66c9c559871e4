//! Status joined from observed state at read time (DESIGN.md §3): the store holds what users
//! want; what is true now comes from the agents. PodScheduled comes from the binding or the
//! auctioneer's verdict; everything else about a pod from the status its node gossips
//! ([`crate::observed::pod_status`]); Deployments and ReplicaSets count the pods of their
//! ReplicaSets as the pods' nodes report them (`shoal_core::controllers`).

use serde_json::{Value, json};
use shoal_gossip::{Member, MemberState};

use super::ApiState;
use crate::scheduling::Scheduling;

/// The PodScheduled condition: bound (spec.nodeName set by the auction), refused with the
/// auctioneer's reasons, or waiting for its auction.
fn pod_scheduled(scheduling: &Scheduling, object: &Value) -> Value {
    let since = object["metadata"]["creationTimestamp"].clone();
    if object["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty())
    {
        return json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": since});
    }
    let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
    let (reason, message) = match scheduling.unschedulable_reason(uid) {
        Some(message) => ("Unschedulable", message),
        None => ("Pending", "waiting for its auction".to_owned()),
    };
    json!({"type": "PodScheduled", "status": "False", "reason": reason, "message": message, "lastProbeTime": null, "lastTransitionTime": since})
}

/// A pod's status: what its node publishes, with PodScheduled in front; Pending until then.
fn pod_status(state: &ApiState, pod: &Value) -> Value {
    let scheduled = pod_scheduled(&state.scheduling, pod);
    match state.pod_statuses.status_of(pod) {
        Some(mut status) => {
            if let Some(conditions) = status["conditions"].as_array_mut() {
                conditions.insert(0, scheduled);
            }
            status
        }
        None => json!({"phase": "Pending", "conditions": [scheduled], "qosClass": "BestEffort"}),
    }
}

use crate::controllers::now_ms;

/// The ReplicaSets and pods (with their observed statuses) of a workload's namespace.
fn workload_world(
    state: &ApiState,
    object: &Value,
) -> (Vec<Value>, Vec<shoal_core::controllers::workload::PodView>) {
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let (sets, pods) = state.replication.read(|s| {
        (
            s.list("apps", "ReplicaSet", Some(namespace)),
            s.list("", "Pod", Some(namespace)),
        )
    });
    let views = pods
        .into_iter()
        .map(|mut p| {
            shoal_core::controllers::garbage::render_deletion(&mut p);
            let status = state.pod_statuses.status_of(&p);
            shoal_core::controllers::workload::PodView::from_object(p, status.as_ref())
        })
        .collect();
    (sets, views)
}

/// Adds the observed `status` to a stored object.
pub fn with_status(state: &ApiState, kind: &str, mut object: Value) -> Value {
    shoal_core::controllers::garbage::render_deletion(&mut object);
    let status = match kind {
        "Pod" => pod_status(state, &object),
        "Deployment" => {
            let (sets, pods) = workload_world(state, &object);
            shoal_core::controllers::deployment::status(&object, &sets, &pods, now_ms())
        }
        "ReplicaSet" => {
            let (_, pods) = workload_world(state, &object);
            shoal_core::controllers::replica_set::status(&object, &pods, now_ms())
        }
        "StatefulSet" => {
            let (_, pods) = workload_world(state, &object);
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            let revisions = state
                .replication
                .read(|s| s.list("apps", "ControllerRevision", Some(namespace)));
            shoal_core::controllers::stateful_set::status(&object, &pods, &revisions, now_ms())
        }
        "DaemonSet" => {
            let (_, pods) = workload_world(state, &object);
            state.scheduling.daemon_set_status(&object, &pods)
        }
        "Job" => {
            let (_, pods) = workload_world(state, &object);
            shoal_core::controllers::job::status(&object, &pods, now_ms())
        }
        "CronJob" => {
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            let jobs = state
                .replication
                .read(|s| s.list("batch", "Job", Some(namespace)));
            shoal_core::controllers::cron_job::status(&object, &jobs, now_ms())
        }
        "Namespace" if shoal_core::controllers::namespace::terminating(&object) => {
            let since = shoal_core::controllers::namespace::deletion_requested(&object)
                .unwrap_or_default()
                .to_owned();
            object["metadata"]["deletionTimestamp"] = json!(since);
            json!({"phase": "Terminating"})
        }
        "Namespace" => json!({"phase": "Active"}),
        "Service" => json!({"loadBalancer": {}}),
        "PersistentVolumeClaim" => {
            let volume = object["spec"]["volumeName"]
                .as_str()
                .filter(|v| !v.is_empty())
                .and_then(|v| {
                    let info = shoal_state::kind::lookup("v1", "PersistentVolume")?;
                    state
                        .replication
                        .read(|s| s.get(&shoal_state::ObjectKey::new(info, "", v)))
                });
            shoal_model::storage::claim_status(&object, volume.as_ref())
        }
        "PersistentVolume" => {
            let reference = &object["spec"]["claimRef"];
            let claim = reference["name"].as_str().and_then(|name| {
                let info = shoal_state::kind::lookup("v1", "PersistentVolumeClaim")?;
                let namespace = reference["namespace"].as_str().unwrap_or("default");
                state
                    .replication
                    .read(|s| s.get(&shoal_state::ObjectKey::new(info, namespace, name)))
            });
            shoal_model::storage::volume_status(&object, claim.as_ref())
        }
        "HorizontalPodAutoscaler" => shoal_core::controllers::hpa::status(&object),
        _ => return object,
    };
    if let Some(map) = object.as_object_mut() {
        map.insert("status".into(), status);
    }
    object
}

/// The Endpoints (or, with `slices`, the EndpointSlices) of the Services in `namespace` (all
/// when `None`), from the stored pods and their nodes' reports (`crate::endpoints`).
pub async fn service_endpoints(
    state: &ApiState,
    namespace: Option<&str>,
    slices: bool,
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut derived = crate::endpoints::services_with_backends(
        &state.replication,
        &state.pod_statuses,
        namespace,
    );
    crate::endpoints::with_api_servers(
        &mut derived,
        &crate::services::api_servers(&state.membership).await,
    );
    for (service, backends) in derived {
        if slices {
            out.extend(crate::endpoints::endpoint_slices(&service, &backends));
        } else {
            out.push(crate::endpoints::endpoints(&service, &backends));
        }
    }
    out
}

/// A Node object for one member, from what it gossips about itself.
pub fn node(
    member: &Member,
    now_rfc3339: &str,
    pod_cidr: Option<ipnet::Ipv4Net>,
    settings: Option<&crate::node_settings::Settings>,
) -> Value {
    let mut node = observed_node(member, now_rfc3339, pod_cidr);
    let agent_taints = member.meta.as_ref().map_or(&[][..], |m| &m.taints[..]);
    crate::node_settings::apply_to_node(&mut node, agent_taints, settings);
    node
}

/// The Node as membership shows it, before the settings users made through the API.
fn observed_node(member: &Member, now_rfc3339: &str, pod_cidr: Option<ipnet::Ipv4Net>) -> Value {
    let meta = member.meta.as_ref();
    let info = meta.and_then(|m| m.info.clone()).unwrap_or_default();
    let cap = meta.map(|m| m.capacity);
    let capacity = json!({
        "cpu": cap.map_or("0".into(), |c| format!("{}m", c.cpu_millis)),
        "memory": cap.map_or("0".into(), |c| format!("{}Ki", c.memory_bytes / 1024)),
        "pods": cap.map_or("0".into(), |c| c.pods.to_string()),
    });
    let (ready, reason, message) = match member.state {
        MemberState::Alive => ("True", "AgentReady", "the shoal agent is gossiping"),
        MemberState::Suspect => ("Unknown", "AgentSuspect", "the agent's heartbeats are late"),
        MemberState::Joining => ("Unknown", "AgentJoining", "the agent is joining"),
        MemberState::Dead => (
            "False",
            "AgentDead",
            "the failure detector declared the agent dead",
        ),
    };
    let started = if info.started_unix_ms > 0 {
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(info.started_unix_ms),
        )
        .to_string()
    } else {
        now_rfc3339.to_owned()
    };
    let ip = member.gossip_addr.ip().to_string();
    let mut spec = serde_json::Map::new();
    if let Some(taints) = meta.filter(|m| !m.taints.is_empty()).map(|m| {
        m.taints
            .iter()
            .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect}))
            .collect::<Vec<_>>()
    }) {
        spec.insert("taints".into(), json!(taints));
    }
    if let Some(cidr) = pod_cidr {
        spec.insert("podCIDR".into(), json!(cidr.to_string()));
        spec.insert("podCIDRs".into(), json!([cidr.to_string()]));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": member.name(),
            "uid": shoal_state::object::uuid_string(&hex::decode(&member.node_id).unwrap_or_default()),
            "resourceVersion": member.generation.to_string(),
            "creationTimestamp": started,
            "labels": meta.map(|m| json!(m.labels)).unwrap_or(json!({})),
            "annotations": {"shoal.io/node-id": member.node_id, "shoal.io/generation": member.generation.to_string()},
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{
                "type": "Ready", "status": ready, "reason": reason, "message": message,
                "lastHeartbeatTime": now_rfc3339, "lastTransitionTime": started,
            }],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": member.name()}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": member.gossip_addr.port()}},
            "nodeInfo": {
                "machineID": info.machine_id,
                "systemUUID": info.machine_id,
                "bootID": info.boot_id,
                "kernelVersion": info.kernel_version,
                "osImage": info.os_image,
                "containerRuntimeVersion": if info.container_runtime.is_empty() { "none".to_owned() } else { info.container_runtime.clone() },
                "kubeletVersion": format!("v1.{}.0-shoal-{}", super::discovery::KUBE_MINOR, meta.map_or("", |m| m.agent_version.as_str())),
                "kubeProxyVersion": "",
                "operatingSystem": std::env::consts::OS,
                "architecture": meta.and_then(|m| m.labels.get("kubernetes.io/arch").cloned()).unwrap_or_default(),
            },
        },
    })
}

/// A Node's `status.images` from the tags it gossips: one entry per image (manifest
/// digest), named by its tags and `repository@digest`, as the kubelet lists them (at most 50,
/// the kubelet's `nodeStatusMaxImages`; sizes are not gossiped).
pub fn node_images(tags: &std::collections::BTreeMap<String, String>) -> Value {
    let mut by_digest: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (tag, digest) in tags {
        let names = by_digest.entry(digest).or_default();
        let repository = match (tag.split_once('@'), tag.rsplit_once(':')) {
            (Some((repository, _)), _) => repository,
            (None, Some((repository, t))) if !t.contains('/') => repository,
            _ => tag.as_str(),
        };
        let pinned = format!("{repository}@{digest}");
        for name in [pinned, tag.clone()] {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    Value::Array(
        by_digest
            .into_values()
            .take(50)
            .map(|names| json!({"names": names}))
            .collect(),
    )
}

fn ms_rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

fn usage_json(cpu_nanocores: u64, memory_bytes: u64) -> Value {
    json!({"cpu": format!("{cpu_nanocores}n"), "memory": format!("{}Ki", memory_bytes / 1024)})
}

/// metrics.k8s.io PodMetrics from the nodes' usage samples.
pub fn pod_metrics(
    usage: &[crate::kubelet::metrics::NodeUsage],
    namespace: Option<&str>,
) -> Vec<Value> {
    let mut items: Vec<Value> = usage
        .iter()
        .flat_map(|node| node.pods.iter().map(move |pod| (node, pod)))
        .filter(|(_, pod)| namespace.is_none_or(|ns| pod.namespace == ns))
        .map(|(node, pod)| {
            json!({
                "kind": "PodMetrics",
                "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "creationTimestamp": ms_rfc3339(node.timestamp_ms),
                    "labels": {},
                },
                "timestamp": ms_rfc3339(node.timestamp_ms),
                "window": format!("{}s", (node.window_ms / 1000).max(1)),
                "containers": pod.containers.iter().map(|c| json!({
                    "name": c.name,
                    "usage": usage_json(c.cpu_nanocores, c.memory_working_set_bytes),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    items.sort_by(|a, b| {
        let key = |v: &Value| {
            (
                v["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
                v["metadata"]["name"].as_str().unwrap_or("").to_owned(),
            )
        };
        key(a).cmp(&key(b))
    });
    items
}

/// metrics.k8s.io NodeMetrics from the nodes' usage samples.
pub fn node_metrics(usage: &[crate::kubelet::metrics::NodeUsage]) -> Vec<Value> {
    usage
        .iter()
        .map(|node| {
            json!({
                "kind": "NodeMetrics",
                "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": node.node, "creationTimestamp": ms_rfc3339(node.timestamp_ms), "labels": {}},
                "timestamp": ms_rfc3339(node.timestamp_ms),
                "window": format!("{}s", (node.window_ms / 1000).max(1)),
                "usage": usage_json(node.cpu_nanocores, node.memory_working_set_bytes),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_images_are_named_by_their_tags_and_repository_digests() {
        let d1 = format!("sha256:{}", "1".repeat(64));
        let d2 = format!("sha256:{}", "2".repeat(64));
        let tags = [
            ("reg:5000/team/app:1".to_owned(), d1.clone()),
            ("reg:5000/team/app:latest".to_owned(), d1.clone()),
            (format!("docker.io/library/busybox@{d2}"), d2.clone()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            node_images(&tags),
            json!([
                {"names": [format!("reg:5000/team/app@{d1}"), "reg:5000/team/app:1", "reg:5000/team/app:latest"]},
                {"names": [format!("docker.io/library/busybox@{d2}")]},
            ])
        );
    }
}
