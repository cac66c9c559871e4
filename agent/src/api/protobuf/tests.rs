use serde_json::json;

use super::*;

fn round_trip(object: Value) {
    // What the writer wrote is what prost-reflect reads and writes back the same.
    let text = |name: &str| object[name].as_str().unwrap_or("").to_owned();
    let desc = message_for(&text("apiVersion"), &text("kind")).unwrap();
    let mut raw = Vec::new();
    write_message(&desc, &object, &At::Root, &mut raw).unwrap();
    let read = DynamicMessage::decode(desc.clone(), raw.as_slice()).unwrap();
    let again = DynamicMessage::decode(desc, read.encode_to_vec().as_slice()).unwrap();
    assert_eq!(read, again, "message of {}", object["kind"]);
    let bytes = encode(&object).unwrap_or_else(|e| panic!("encode {object}: {e}"));
    assert!(bytes.starts_with(MAGIC));
    let back = decode(&bytes).unwrap_or_else(|e| panic!("decode {object}: {e}"));
    assert_eq!(back, object, "round trip of {}", object["kind"]);
}

fn meta(name: &str) -> Value {
    json!({
        "name": name,
        "namespace": "default",
        "uid": "5f0c6c8e-1d2b-4c1a-9a57-3a3b2f3b9a10",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2026-12-01T21:00:00Z",
        "labels": {"app": name, "empty": ""},
        "annotations": {"deployment.kubernetes.io/revision": "2"},
        "managedFields": [{
            "manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1",
            "time": "2026-12-01T21:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}
        }],
        "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-6d4cf56db6",
            "uid": "0b5a6c8e-1d2b-4c1a-9a57-3a3b2f3b9a10", "controller": true,
            "blockOwnerDeletion": false
        }],
    })
}

fn pod_spec() -> Value {
    json!({
        "containers": [{
            "name": "web",
            "image": "busybox:stable",
            "command": ["sh", "-c", "httpd -f -p 80"],
            "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
            "env": [
                {"name": "A", "value": "1"},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": false}}},
                {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ],
            "envFrom": [{"configMapRef": {"name": "cm"}}],
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "100m"}},
            "readinessProbe": {
                "httpGet": {"path": "/", "port": "http"},
                "periodSeconds": 2, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3
            },
            "livenessProbe": {"tcpSocket": {"port": 80}, "initialDelaySeconds": 5},
            "startupProbe": {"exec": {"command": ["true"]}},
            "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": true}],
            "resources_unknown_to_proto": null,
        }],
        "volumes": [
            {"name": "config", "configMap": {"name": "cm", "defaultMode": 420}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "token", "projected": {"sources": [{"secret": {"name": "s"}}]}},
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": false,
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
        }}},
    })
}

/// `pod_spec()` without the JSON field the schema lacks (it is not written).
fn pod_spec_as_decoded() -> Value {
    let mut spec = pod_spec();
    spec["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("resources_unknown_to_proto");
    spec
}

#[test]
fn every_served_kind_round_trips_through_protobuf() {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta("web-1"), "spec": pod_spec(),
        "status": {
            "phase": "Running", "podIP": "10.88.1.5", "podIPs": [{"ip": "10.88.1.5"}],
            "startTime": "2026-12-01T21:00:01Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T21:00:02Z"}],
            "containerStatuses": [{
                "name": "web", "ready": true, "restartCount": 2, "image": "busybox:stable",
                "imageID": "", "started": false,
                "state": {"running": {"startedAt": "2026-12-01T21:00:01Z"}}
            }],
        },
    });
    // An empty imageID is absent once decoded (a non-pointer Go string).
    let encoded = encode(&pod).unwrap();
    pod["spec"] = pod_spec_as_decoded();
    pod["status"]["containerStatuses"][0]
        .as_object_mut()
        .unwrap()
        .remove("imageID");
    assert_eq!(decode(&encoded).unwrap(), pod);

    let template = json!({"metadata": {"labels": {"app": "web"}}, "spec": pod_spec_as_decoded()});
    round_trip(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("web"),
        "spec": {
            "replicas": 0, "revisionHistoryLimit": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"}},
            "template": template,
        },
        "status": {"replicas": 3, "observedGeneration": 3, "conditions": [{
            "type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
            "lastUpdateTime": "2026-12-01T21:00:00Z", "lastTransitionTime": "2026-12-01T21:00:00Z"
        }]},
    }));
    round_trip(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta("web-6d4cf56db6"),
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template},
    }));
    round_trip(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("agent"),
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}}, "template": template,
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        },
    }));
    round_trip(json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta("pi"),
        "spec": {
            "completions": 3, "parallelism": 1, "backoffLimit": 0, "completionMode": "Indexed",
            "ttlSecondsAfterFinished": 0, "suspend": false, "template": template,
        },
        "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
    }));
    round_trip(json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta("tick"),
        "spec": {
            "schedule": "*/5 * * * *", "timeZone": "Europe/Paris", "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 0, "suspend": true,
            "jobTemplate": {"spec": {"template": template}},
        },
    }));
    round_trip(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": meta("web"),
        "spec": {
            "selector": {"app": "web"}, "clusterIP": "10.96.0.10", "type": "ClusterIP",
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                {"name": "alt", "port": 8080, "targetPort": 80},
            ],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
        },
    }));
    round_trip(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cm"),
        "data": {"a": "1", "empty": ""}, "binaryData": {"b": "AAEC"}, "immutable": false,
    }));
    round_trip(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": meta("s"),
        "type": "Opaque", "data": {"k": "c2VjcmV0"},
    }));
    round_trip(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    round_trip(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
        "spec": {"podCIDR": "10.88.1.0/24", "podCIDRs": ["10.88.1.0/24"], "unschedulable": true,
                 "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
        "status": {"capacity": {"cpu": "2", "memory": "24Gi", "pods": "110"},
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
    }));
    round_trip(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta("web-abc"),
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.88.1.5"], "conditions": {"ready": false, "serving": true, "terminating": false}, "nodeName": "node-1"}],
        "ports": [{"name": "http", "port": 0, "protocol": "TCP"}],
    }));
    round_trip(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("web-1.abc"),
        "eventTime": "2026-12-01T21:00:00.123456Z", "reason": "Scheduled", "action": "Binding",
        "note": "Successfully assigned default/web-1 to node-1", "type": "Normal",
        "regarding": {"kind": "Pod", "name": "web-1", "namespace": "default"},
        "reportingController": "shoal", "reportingInstance": "node-1",
    }));
    round_trip(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta("web"),
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": 1, "maxReplicas": 5,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]},
    }));
    round_trip(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("default"),
        "automountServiceAccountToken": false,
    }));
    // client-go's leader election (MicroTime, and a first holder's zero transitions).
    round_trip(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta("leader"),
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 15,
                 "acquireTime": "2026-12-01T21:00:00.123456Z", "renewTime": "2026-12-01T21:00:05.654321Z",
                 "leaseTransitions": 0},
    }));
    round_trip(json!({
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 0},
    }));
    round_trip(json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "pods \"x\" not found", "reason": "NotFound", "code": 404,
        "details": {"name": "x", "kind": "pods"},
    }));
    round_trip(json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"},
        "items": [{"metadata": {"name": "a", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}],
    }));
}

#[test]
fn zero_values_of_non_pointer_fields_decode_as_absent_and_pointer_zeros_are_kept() {
    // Go's encoder writes these zeros on every request; the apiserver cannot tell them from
    // absent fields either.
    let sent = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "generateName": "", "generation": 0, "creationTimestamp": null},
        "spec": {
            "containers": [{"name": "c", "image": "i", "stdin": false, "ports": [{"containerPort": 80, "hostPort": 0}]}],
            "hostNetwork": false, "nodeName": "", "terminationGracePeriodSeconds": 0,
        },
    });
    let back = decode(&encode(&sent).unwrap()).unwrap();
    assert_eq!(
        back,
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}]}],
                "terminationGracePeriodSeconds": 0,
            },
        })
    );
    // A zero IntOrString in a non-pointer field (a Service port's targetPort) is absent, so the
    // port's own number is defaulted in; in a pointer field (maxSurge) it is kept.
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                     "spec": {"ports": [{"port": 80, "targetPort": 0}]}});
    let back = decode(&encode(&svc).unwrap()).unwrap();
    assert_eq!(back["spec"]["ports"][0], json!({"port": 80}));
}

/// Appends field `number` (varint `value`) to the message inside an encoded envelope.
fn with_unknown_field(object: &Value, number: u32, value: u64) -> Vec<u8> {
    let bytes = encode(object).unwrap();
    let unknown_desc = POOL.get_message_by_name(UNKNOWN).unwrap();
    let mut envelope = DynamicMessage::decode(unknown_desc, &bytes[4..]).unwrap();
    let mut raw = envelope
        .get_field_by_name("raw")
        .unwrap()
        .as_bytes()
        .unwrap()
        .to_vec();
    prost::encoding::encode_key(number, prost::encoding::WireType::Varint, &mut raw);
    prost::encoding::encode_varint(value, &mut raw);
    envelope.set_field_by_name("raw", PValue::Bytes(raw.into()));
    let mut out = MAGIC.to_vec();
    envelope.encode(&mut out).unwrap();
    out
}

#[test]
fn a_field_newer_than_the_schema_is_refused_unless_it_is_zero() {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}});
    let err = decode(&with_unknown_field(&ns, 999, 5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "<root>: field number 999 of api.core.v1.Namespace is newer than this server's schema (Kubernetes 1.35)"
    );
    assert_eq!(decode(&with_unknown_field(&ns, 999, 0)).unwrap(), ns);
}

#[test]
fn bad_bodies_get_errors_naming_what_is_wrong() {
    assert_eq!(decode(b"{\"kind\":\"Pod\"}"), Err(ProtoError::NoMagic));
    assert!(matches!(
        decode(b"k8s\0\xff\xff"),
        Err(ProtoError::Envelope(_))
    ));
    let err = encode(&json!({"apiVersion": "example.com/v1", "kind": "Widget"})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no protobuf schema for example.com/v1/Widget"
    );
    let err = encode(
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": "three"}}),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.replicas: expected an integer in -2147483648..=2147483647"
    );
    let err =
        encode(&json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": 7}]}}))
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.containers[0].name: expected a string"
    );
    let err = encode(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"creationTimestamp": "yesterday"}}),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("metadata.creationTimestamp: \"yesterday\" is not an RFC 3339"),
        "{err}"
    );
    // A message truncated in the middle of a field.
    let mut bytes =
        encode(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}))
            .unwrap();
    let unknown_desc = POOL.get_message_by_name(UNKNOWN).unwrap();
    let mut envelope = DynamicMessage::decode(unknown_desc, &bytes[4..]).unwrap();
    let raw = envelope
        .get_field_by_name("raw")
        .unwrap()
        .as_bytes()
        .unwrap()
        .to_vec();
    envelope.set_field_by_name("raw", PValue::Bytes(raw[..raw.len() - 1].to_vec().into()));
    bytes.truncate(4);
    envelope.encode(&mut bytes).unwrap();
    assert!(
        matches!(decode(&bytes), Err(ProtoError::Decode { .. })),
        "{:?}",
        decode(&bytes)
    );
}

#[test]
fn durations_print_as_go_does() {
    assert_eq!(go_duration(0), "0s");
    assert_eq!(go_duration(1_500), "1.5µs");
    assert_eq!(go_duration(2_000_000), "2ms");
    assert_eq!(go_duration(1_500_000_000), "1.5s");
    assert_eq!(go_duration(61_000_000_000), "1m1s");
    assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
    assert_eq!(go_duration(-90_000_000_000), "-1m30s");
}

#[test]
fn clients_that_ask_for_protobuf_first_get_it() {
    assert!(prefers_protobuf("application/vnd.kubernetes.protobuf, */*"));
    assert!(prefers_protobuf(
        "application/vnd.kubernetes.protobuf;stream=watch"
    ));
    assert!(!prefers_protobuf(
        "application/json, application/vnd.kubernetes.protobuf"
    ));
    assert!(!prefers_protobuf(
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    ));
    assert!(!prefers_protobuf(""));
}

#[test]
fn unknown_fields_are_found_at_any_depth_and_pruned_on_request() {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"any.key/x": "y"}, "annotations": {"a": "b"}, "colour": "red"},
        "spec": {
            "containers": [{
                "name": "c", "image": "i", "imagee": "typo",
                "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 3, "sucessThreshold": 1},
                "readinessProbe": {"httpGet": {"port": "http", "path": "/"}},
                "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}},
                "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name", "extra": 1}}}],
            }],
            "volumes": [{"name": "v", "configMap": {"name": "cm", "nme": "typo"}}],
            "nodeSelector": {"disk": "ssd"},
        },
        "status": {"anything": "observed"},
    });
    let mut found = unknown_fields(&mut pod.clone(), false).unwrap();
    found.sort();
    assert_eq!(
        found,
        [
            "metadata.colour",
            "spec.containers[0].env[0].valueFrom.fieldRef.extra",
            "spec.containers[0].imagee",
            "spec.containers[0].livenessProbe.sucessThreshold",
            "spec.volumes[0].configMap.nme",
        ]
    );
    // Pruned: what is left has no unknown field, and every known one (inline probe handlers,
    // quantities, maps) is still there.
    assert_eq!(unknown_fields(&mut pod, true).unwrap().len(), 5);
    assert_eq!(
        unknown_fields(&mut pod, false).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        pod["spec"]["containers"][0]["livenessProbe"]["exec"]["command"][0],
        "true"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
        "http"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"],
        "500m"
    );
    assert_eq!(pod["metadata"]["labels"]["any.key/x"], "y");
    assert_eq!(pod["status"]["anything"], "observed");
    let mut deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 2, "strategy": {"rollingUpdate": {"maxSurge": "25%"}},
                 "template": {"spec": {"containers": [{"name": "c", "image": "i", "port": 80}]}}},
    });
    assert_eq!(
        unknown_fields(&mut deployment, false).unwrap(),
        ["spec.template.spec.containers[0].port"]
    );
    assert!(
        unknown_fields(
            &mut json!({"apiVersion": "x.io/v1", "kind": "Thing"}),
            false
        )
        .is_none()
    );
}
