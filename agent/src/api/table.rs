//! `Accept: application/json;as=Table;g=meta.k8s.io;v=v1`: server-side printing with the columns
//! kubectl users know, rows carrying PartialObjectMetadata.

use std::time::SystemTime;

use serde_json::{Value, json};

/// Whether the client asked for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.contains("as=Table")
}

struct Column {
    name: &'static str,
    kind: &'static str,
    priority: u8,
    cell: fn(&Value) -> Value,
}

const fn col(
    name: &'static str,
    kind: &'static str,
    priority: u8,
    cell: fn(&Value) -> Value,
) -> Column {
    Column {
        name,
        kind,
        priority,
        cell,
    }
}

/// kubectl's age format: `45s`, `12m`, `5h`, `3d`.
pub fn age(object: &Value) -> Value {
    since(&object["metadata"]["creationTimestamp"], "<unknown>")
}

/// How long ago the RFC 3339 time `at` was, as kubectl prints ages; `missing` if it is absent.
fn since(at: &Value, missing: &str) -> Value {
    let Some(t) = at.as_str().and_then(|s| humantime::parse_rfc3339(s).ok()) else {
        return json!(missing);
    };
    let secs = SystemTime::now()
        .duration_since(t)
        .map_or(0, |d| d.as_secs());
    json!(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 10 * 60 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    })
}

/// kubectl's printers of claims and volumes: `Terminating` while being deleted (a protection
/// finalizer holds it), else the phase.
fn terminating_or_phase(o: &Value) -> Value {
    if o["metadata"]["deletionTimestamp"].is_string() {
        json!("Terminating")
    } else {
        o["status"]["phase"].clone()
    }
}

/// A binding's subjects of `kind`, comma-separated (service accounts as `namespace/name`).
fn subjects(o: &Value, kind: &str) -> Value {
    let names: Vec<String> = o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .map(|s| {
            let name = s["name"].as_str().unwrap_or("");
            match (kind, s["namespace"].as_str()) {
                ("ServiceAccount", Some(ns)) => format!("{ns}/{name}"),
                _ => name.to_owned(),
            }
        })
        .collect();
    json!(names.join(", "))
}

fn name(o: &Value) -> Value {
    o["metadata"]["name"].clone()
}

fn int(v: &Value) -> Value {
    json!(v.as_i64().unwrap_or(0))
}

fn containers(o: &Value, path: &str) -> Vec<Value> {
    o.pointer(path)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn join(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "<none>".into()
    } else {
        v.join(",")
    }
}

fn selector(o: &Value) -> Value {
    let labels = o
        .pointer("/spec/selector/matchLabels")
        .or_else(|| o.pointer("/spec/selector"));
    json!(join(
        labels
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
    ))
}

fn template_containers(o: &Value) -> Value {
    json!(join(
        containers(o, "/spec/template/spec/containers")
            .iter()
            .map(|c| c["name"].as_str().unwrap_or("").to_owned())
    ))
}

fn template_images(o: &Value) -> Value {
    json!(join(
        containers(o, "/spec/template/spec/containers")
            .iter()
            .map(|c| c["image"].as_str().unwrap_or("").to_owned())
    ))
}

/// Access modes as kubectl abbreviates them (`RWO,ROX`).
fn access_modes(modes: &Value) -> Value {
    let modes = modes.as_array().map_or(&[][..], Vec::as_slice);
    if modes.is_empty() {
        return json!("");
    }
    json!(join(modes.iter().map(|m| {
        match m.as_str().unwrap_or("") {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        }
        .to_owned()
    })))
}

fn columns(kind: &str) -> Vec<Column> {
    match kind {
        "Pod" => vec![
            col("Name", "string", 0, name),
            col("Ready", "string", 0, |o| {
                let total = containers(o, "/spec/containers").len();
                let ready = containers(o, "/status/containerStatuses")
                    .iter()
                    .filter(|c| c["ready"] == true)
                    .count();
                json!(format!("{ready}/{total}"))
            }),
            // kubectl's printer: a pod being deleted is `Terminating` whatever its phase.
            col("Status", "string", 0, |o| {
                if o["metadata"]["deletionTimestamp"].is_string() {
                    json!("Terminating")
                } else {
                    o["status"]["phase"].clone()
                }
            }),
            col("Restarts", "string", 0, |o| {
                json!(
                    containers(o, "/status/containerStatuses")
                        .iter()
                        .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                        .sum::<i64>()
                        .to_string()
                )
            }),
            col("Age", "string", 0, age),
            col("IP", "string", 1, |o| {
                json!(o["status"]["podIP"].as_str().unwrap_or("<none>"))
            }),
            col("Node", "string", 1, |o| {
                json!(o["spec"]["nodeName"].as_str().unwrap_or("<none>"))
            }),
            col("Nominated Node", "string", 1, |_| json!("<none>")),
            col("Readiness Gates", "string", 1, |_| json!("<none>")),
        ],
        "Deployment" => vec![
            col("Name", "string", 0, name),
            col("Ready", "string", 0, |o| {
                json!(format!(
                    "{}/{}",
                    o["status"]["readyReplicas"].as_i64().unwrap_or(0),
                    o["spec"]["replicas"].as_i64().unwrap_or(1)
                ))
            }),
            col("Up-to-date", "integer", 0, |o| {
                int(&o["status"]["updatedReplicas"])
            }),
            col("Available", "integer", 0, |o| {
                int(&o["status"]["availableReplicas"])
            }),
            col("Age", "string", 0, age),
            col("Containers", "string", 1, template_containers),
            col("Images", "string", 1, template_images),
            col("Selector", "string", 1, selector),
        ],
        "ReplicaSet" => vec![
            col("Name", "string", 0, name),
            col("Desired", "integer", 0, |o| {
                json!(o["spec"]["replicas"].as_i64().unwrap_or(1))
            }),
            col("Current", "integer", 0, |o| int(&o["status"]["replicas"])),
            col("Ready", "integer", 0, |o| {
                int(&o["status"]["readyReplicas"])
            }),
            col("Age", "string", 0, age),
            col("Containers", "string", 1, template_containers),
            col("Images", "string", 1, template_images),
            col("Selector", "string", 1, selector),
        ],
        "PersistentVolumeClaim" => vec![
            col("Name", "string", 0, name),
            col("Status", "string", 0, terminating_or_phase),
            col("Volume", "string", 0, |o| {
                json!(o["spec"]["volumeName"].as_str().unwrap_or(""))
            }),
            col("Capacity", "string", 0, |o| {
                json!(o["status"]["capacity"]["storage"].as_str().unwrap_or(""))
            }),
            col("Access Modes", "string", 0, |o| {
                access_modes(&o["status"]["accessModes"])
            }),
            col("StorageClass", "string", 0, |o| {
                json!(o["spec"]["storageClassName"].as_str().unwrap_or("<unset>"))
            }),
            col("VolumeAttributesClass", "string", 0, |_| json!("<unset>")),
            col("Age", "string", 0, age),
            col("VolumeMode", "string", 1, |o| {
                o["spec"]["volumeMode"].clone()
            }),
        ],
        "PersistentVolume" => vec![
            col("Name", "string", 0, name),
            col("Capacity", "string", 0, |o| {
                json!(o["spec"]["capacity"]["storage"].as_str().unwrap_or(""))
            }),
            col("Access Modes", "string", 0, |o| {
                access_modes(&o["spec"]["accessModes"])
            }),
            col("Reclaim Policy", "string", 0, |o| {
                o["spec"]["persistentVolumeReclaimPolicy"].clone()
            }),
            col("Status", "string", 0, terminating_or_phase),
            col("Claim", "string", 0, |o| {
                let r = &o["spec"]["claimRef"];
                json!(match (r["namespace"].as_str(), r["name"].as_str()) {
                    (Some(ns), Some(n)) => format!("{ns}/{n}"),
                    _ => String::new(),
                })
            }),
            col("StorageClass", "string", 0, |o| {
                json!(o["spec"]["storageClassName"].as_str().unwrap_or(""))
            }),
            col("VolumeAttributesClass", "string", 0, |_| json!("<unset>")),
            col("Reason", "string", 0, |_| json!("")),
            col("Age", "string", 0, age),
            col("VolumeMode", "string", 1, |o| {
                o["spec"]["volumeMode"].clone()
            }),
        ],
        // kubectl's printers of RBAC: roles by creation time; bindings by role and subjects.
        "Role" | "ClusterRole" => vec![
            col("Name", "string", 0, name),
            col("Created At", "date", 0, |o| {
                o["metadata"]["creationTimestamp"].clone()
            }),
        ],
        "RoleBinding" | "ClusterRoleBinding" => vec![
            col("Name", "string", 0, name),
            col("Role", "string", 0, |o| {
                json!(format!(
                    "{}/{}",
                    o["roleRef"]["kind"].as_str().unwrap_or(""),
                    o["roleRef"]["name"].as_str().unwrap_or("")
                ))
            }),
            col("Age", "string", 0, age),
            col("Users", "string", 1, |o| subjects(o, "User")),
            col("Groups", "string", 1, |o| subjects(o, "Group")),
            col("ServiceAccounts", "string", 1, |o| {
                subjects(o, "ServiceAccount")
            }),
        ],
        "StorageClass" => vec![
            col("Name", "string", 0, |o| {
                let n = o["metadata"]["name"].as_str().unwrap_or("");
                let default = o["metadata"]["annotations"]
                    [shoal_model::storage::DEFAULT_CLASS_ANNOTATION]
                    == "true";
                json!(if default {
                    format!("{n} (default)")
                } else {
                    n.to_owned()
                })
            }),
            col("Provisioner", "string", 0, |o| o["provisioner"].clone()),
            col("ReclaimPolicy", "string", 0, |o| o["reclaimPolicy"].clone()),
            col("VolumeBindingMode", "string", 0, |o| {
                o["volumeBindingMode"].clone()
            }),
            col("AllowVolumeExpansion", "string", 0, |o| {
                json!(
                    o["allowVolumeExpansion"]
                        .as_bool()
                        .unwrap_or(false)
                        .to_string()
                )
            }),
            col("Age", "string", 0, age),
        ],
        "StatefulSet" => vec![
            col("Name", "string", 0, name),
            col("Ready", "string", 0, |o| {
                json!(format!(
                    "{}/{}",
                    o["status"]["readyReplicas"].as_i64().unwrap_or(0),
                    o["spec"]["replicas"].as_i64().unwrap_or(1)
                ))
            }),
            col("Age", "string", 0, age),
            col("Containers", "string", 1, template_containers),
            col("Images", "string", 1, template_images),
        ],
        "ControllerRevision" => vec![
            col("Name", "string", 0, name),
            col("Controller", "string", 0, |o| {
                let owner = o["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["controller"] == true);
                json!(owner.map_or("<none>".to_owned(), |r| {
                    let group = r["apiVersion"]
                        .as_str()
                        .and_then(|v| v.split_once('/'))
                        .map_or(String::new(), |(g, _)| format!(".{g}"));
                    format!(
                        "{}{group}/{}",
                        r["kind"].as_str().unwrap_or("").to_lowercase(),
                        r["name"].as_str().unwrap_or("")
                    )
                }))
            }),
            col("Revision", "integer", 0, |o| int(&o["revision"])),
            col("Age", "string", 0, age),
        ],
        "DaemonSet" => vec![
            col("Name", "string", 0, name),
            col("Desired", "integer", 0, |o| {
                int(&o["status"]["desiredNumberScheduled"])
            }),
            col("Current", "integer", 0, |o| {
                int(&o["status"]["currentNumberScheduled"])
            }),
            col("Ready", "integer", 0, |o| int(&o["status"]["numberReady"])),
            col("Up-to-date", "integer", 0, |o| {
                int(&o["status"]["updatedNumberScheduled"])
            }),
            col("Available", "integer", 0, |o| {
                int(&o["status"]["numberAvailable"])
            }),
            col("Node Selector", "string", 0, |o| {
                json!(join(
                    o.pointer("/spec/template/spec/nodeSelector")
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                ))
            }),
            col("Age", "string", 0, age),
        ],
        "Job" => vec![
            col("Name", "string", 0, name),
            col("Status", "string", 0, |o| {
                // kubectl's words: the finishing condition, else Suspended or Running.
                let holds = |kind: &str| {
                    o["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == kind && c["status"] == "True")
                };
                json!(if holds("Complete") {
                    "Complete"
                } else if holds("Failed") {
                    "Failed"
                } else if holds("Suspended") {
                    "Suspended"
                } else {
                    "Running"
                })
            }),
            col("Completions", "string", 0, |o| {
                json!(format!(
                    "{}/{}",
                    o["status"]["succeeded"].as_i64().unwrap_or(0),
                    o["spec"]["completions"].as_i64().unwrap_or(1)
                ))
            }),
            col("Duration", "string", 0, |_| json!("")),
            col("Age", "string", 0, age),
        ],
        "CronJob" => vec![
            col("Name", "string", 0, name),
            col("Schedule", "string", 0, |o| o["spec"]["schedule"].clone()),
            col("Timezone", "string", 0, |o| {
                json!(o["spec"]["timeZone"].as_str().unwrap_or("<none>"))
            }),
            col("Suspend", "boolean", 0, |o| {
                json!(o["spec"]["suspend"].as_bool().unwrap_or(false))
            }),
            col("Active", "integer", 0, |o| {
                json!(o["status"]["active"].as_array().map_or(0, Vec::len))
            }),
            col("Last Schedule", "string", 0, |o| {
                since(&o["status"]["lastScheduleTime"], "<none>")
            }),
            col("Age", "string", 0, age),
        ],
        "Service" => vec![
            col("Name", "string", 0, name),
            col("Type", "string", 0, |o| {
                json!(o["spec"]["type"].as_str().unwrap_or("ClusterIP"))
            }),
            col("Cluster-IP", "string", 0, |o| {
                json!(o["spec"]["clusterIP"].as_str().unwrap_or("<none>"))
            }),
            col("External-IP", "string", 0, |_| json!("<none>")),
            col("Port(s)", "string", 0, |o| {
                json!(join(containers(o, "/spec/ports").iter().map(|p| format!(
                    "{}/{}",
                    p["port"],
                    p["protocol"].as_str().unwrap_or("TCP")
                ))))
            }),
            col("Age", "string", 0, age),
            col("Selector", "string", 1, |o| {
                json!(join(
                    o["spec"]["selector"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                ))
            }),
        ],
        "Node" => vec![
            col("Name", "string", 0, name),
            col("Status", "string", 0, |o| {
                let ready = containers(o, "/status/conditions")
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let status = if ready { "Ready" } else { "NotReady" };
                if o["spec"]["unschedulable"] == true {
                    json!(format!("{status},SchedulingDisabled"))
                } else {
                    json!(status)
                }
            }),
            col("Roles", "string", 0, |_| json!("<none>")),
            col("Age", "string", 0, age),
            col("Version", "string", 0, |o| {
                o["status"]["nodeInfo"]["kubeletVersion"].clone()
            }),
            col("Internal-IP", "string", 1, |o| {
                json!(
                    containers(o, "/status/addresses")
                        .iter()
                        .find(|a| a["type"] == "InternalIP")
                        .and_then(|a| a["address"].as_str())
                        .unwrap_or("<none>")
                )
            }),
            col("External-IP", "string", 1, |_| json!("<none>")),
            col("OS-Image", "string", 1, |o| {
                o["status"]["nodeInfo"]["osImage"].clone()
            }),
            col("Kernel-Version", "string", 1, |o| {
                o["status"]["nodeInfo"]["kernelVersion"].clone()
            }),
            col("Container-Runtime", "string", 1, |o| {
                o["status"]["nodeInfo"]["containerRuntimeVersion"].clone()
            }),
        ],
        // The apiserver's columns for Events (core/v1 and events.k8s.io/v1 fields alike).
        "Event" => {
            fn pick<'a>(o: &'a Value, core: &str, v1: &str) -> &'a Value {
                if o[core].is_null() { &o[v1] } else { &o[core] }
            }
            vec![
                col("Last Seen", "string", 0, |o| {
                    since(
                        pick(o, "lastTimestamp", "deprecatedLastTimestamp"),
                        "<unknown>",
                    )
                }),
                col("Type", "string", 0, |o| o["type"].clone()),
                col("Reason", "string", 0, |o| o["reason"].clone()),
                col("Object", "string", 0, |o| {
                    let r = pick(o, "involvedObject", "regarding");
                    json!(format!(
                        "{}/{}",
                        r["kind"].as_str().unwrap_or("").to_ascii_lowercase(),
                        r["name"].as_str().unwrap_or("")
                    ))
                }),
                col("Subobject", "string", 1, |o| {
                    pick(o, "involvedObject", "regarding")["fieldPath"].clone()
                }),
                col("Source", "string", 1, |o| {
                    let s = pick(o, "source", "deprecatedSource");
                    json!(
                        [s["component"].as_str(), s["host"].as_str()]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }),
                col("Message", "string", 0, |o| {
                    pick(o, "message", "note").clone()
                }),
                col("First Seen", "string", 1, |o| {
                    since(
                        pick(o, "firstTimestamp", "deprecatedFirstTimestamp"),
                        "<unknown>",
                    )
                }),
                col("Count", "string", 1, |o| {
                    json!(
                        pick(o, "count", "deprecatedCount")
                            .as_u64()
                            .unwrap_or(1)
                            .to_string()
                    )
                }),
                col("Name", "string", 1, name),
            ]
        }
        "Namespace" => vec![
            col("Name", "string", 0, name),
            col("Status", "string", 0, |o| {
                json!(o["status"]["phase"].as_str().unwrap_or("Active"))
            }),
            col("Age", "string", 0, age),
        ],
        "ConfigMap" => vec![
            col("Name", "string", 0, name),
            col("Data", "integer", 0, |o| {
                json!(
                    o["data"].as_object().map_or(0, |m| m.len())
                        + o["binaryData"].as_object().map_or(0, |m| m.len())
                )
            }),
            col("Age", "string", 0, age),
        ],
        "ServiceAccount" => vec![
            col("Name", "string", 0, name),
            col("Secrets", "integer", 0, |o| {
                json!(o["secrets"].as_array().map_or(0, Vec::len))
            }),
            col("Age", "string", 0, age),
        ],
        "Lease" => vec![
            col("Name", "string", 0, name),
            col("Holder", "string", 0, |o| {
                json!(o["spec"]["holderIdentity"].as_str().unwrap_or(""))
            }),
            col("Age", "string", 0, age),
        ],
        "Secret" => vec![
            col("Name", "string", 0, name),
            col("Type", "string", 0, |o| {
                json!(o["type"].as_str().unwrap_or("Opaque"))
            }),
            col("Data", "integer", 0, |o| {
                json!(o["data"].as_object().map_or(0, |m| m.len()))
            }),
            col("Age", "string", 0, age),
        ],
        "Endpoints" => vec![
            col("Name", "string", 0, name),
            col("Endpoints", "string", 0, |o| {
                json!(join(containers(o, "/subsets").iter().flat_map(|s| {
                    let ports: Vec<i64> = s["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["port"].as_i64())
                        .collect();
                    s["addresses"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(move |a| {
                            let ip = a["ip"].as_str().unwrap_or("").to_owned();
                            ports.clone().into_iter().map(move |p| format!("{ip}:{p}"))
                        })
                })))
            }),
            col("Age", "string", 0, age),
        ],
        "EndpointSlice" => vec![
            col("Name", "string", 0, name),
            col("AddressType", "string", 0, |o| json!(o["addressType"])),
            col("Ports", "string", 0, |o| {
                let ports: Vec<String> = o["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["port"].as_i64().map(|p| p.to_string()))
                    .collect();
                json!(if ports.is_empty() {
                    "<unset>".to_owned()
                } else {
                    ports.join(",")
                })
            }),
            col("Endpoints", "string", 0, |o| {
                let ips: Vec<String> = o["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                    .filter_map(|a| a.as_str().map(str::to_owned))
                    .collect();
                json!(if ips.is_empty() {
                    "<none>".to_owned()
                } else {
                    ips.join(",")
                })
            }),
            col("Age", "string", 0, age),
        ],
        "HorizontalPodAutoscaler" => vec![
            col("Name", "string", 0, name),
            col("Reference", "string", 0, |o| {
                json!(format!(
                    "{}/{}",
                    o["spec"]["scaleTargetRef"]["kind"].as_str().unwrap_or(""),
                    o["spec"]["scaleTargetRef"]["name"].as_str().unwrap_or("")
                ))
            }),
            col("Targets", "string", 0, |o| {
                json!(shoal_core::controllers::hpa::targets_column(o))
            }),
            col("MinPods", "integer", 0, |o| {
                json!(o["spec"]["minReplicas"].as_i64().unwrap_or(1))
            }),
            col("MaxPods", "integer", 0, |o| int(&o["spec"]["maxReplicas"])),
            col("Replicas", "integer", 0, |o| {
                int(&o["status"]["currentReplicas"])
            }),
            col("Age", "string", 0, age),
        ],
        _ => vec![col("Name", "string", 0, name), col("Age", "string", 0, age)],
    }
}

/// A Table of `objects` of `kind`.
pub fn table(kind: &str, objects: &[Value], resource_version: &str) -> Value {
    let cols = columns(kind);
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.kind,
                "format": if c.name == "Name" { "name" } else { "" },
                "description": c.name,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({
                "cells": cols.iter().map(|c| (c.cell)(o)).collect::<Vec<_>>(),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"].clone(),
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_rows_have_kubectl_columns() {
        let pod = json!({"metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}});
        let t = table("Pod", &[pod], "5");
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(&names[..5], ["Name", "Ready", "Status", "Restarts", "Age"]);
        assert_eq!(t["rows"][0]["cells"][1], "0/1");
        assert_eq!(t["rows"][0]["cells"][2], "Pending");
        assert!(t["rows"][0]["cells"][4].as_str().unwrap().ends_with('d'));
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
