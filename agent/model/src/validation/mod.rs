//! Per-kind validation and defaulting, like the apiserver's, with errors naming the field
//! (`spec.template.spec.containers[0].image: Required value`).

use serde_json::{Value, json};

pub use crate::FieldError;

mod scheduling;

fn err(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
    FieldError::new(field, detail)
}

/// Top-level fields each kind accepts (for `fieldValidation=Strict`).
fn known_top_level(kind: &str) -> &'static [&'static str] {
    match kind {
        "ConfigMap" => &[
            "apiVersion",
            "kind",
            "metadata",
            "data",
            "binaryData",
            "immutable",
        ],
        "Secret" => &[
            "apiVersion",
            "kind",
            "metadata",
            "data",
            "stringData",
            "type",
            "immutable",
        ],
        "ControllerRevision" => &["apiVersion", "kind", "metadata", "data", "revision"],
        "StorageClass" => &[
            "apiVersion",
            "kind",
            "metadata",
            "provisioner",
            "parameters",
            "reclaimPolicy",
            "mountOptions",
            "allowVolumeExpansion",
            "volumeBindingMode",
            "allowedTopologies",
        ],
        _ => &["apiVersion", "kind", "metadata", "spec", "status"],
    }
}

/// The most claim templates a StatefulSet may have (each is a volume of every pod).
pub const MAX_CLAIM_TEMPLATES: usize = 16;
/// Shoal's own bound on a StatefulSet's replicas (the apiserver takes any int32): each is a
/// pod and a claim per template with an identity of its own.
pub const MAX_STATEFUL_REPLICAS: u64 = 10_000;

/// A StatefulSet's own fields (its template is checked as every workload's).
fn validate_stateful_set(object: &Value) -> Result<(), FieldError> {
    let spec = &object["spec"];
    if let Some(replicas) = spec["replicas"].as_u64()
        && replicas > MAX_STATEFUL_REPLICAS
    {
        return Err(err(
            "spec.replicas",
            format!(
                "Invalid value: {replicas}: must be less than or equal to {MAX_STATEFUL_REPLICAS} (Shoal's bound on a StatefulSet's identities)"
            ),
        ));
    }
    one_of(
        "spec.podManagementPolicy",
        &spec["podManagementPolicy"],
        &["OrderedReady", "Parallel"],
    )?;
    let strategy = &spec["updateStrategy"];
    type_check(strategy, "spec.updateStrategy", "object")?;
    one_of(
        "spec.updateStrategy.type",
        &strategy["type"],
        &["RollingUpdate", "OnDelete"],
    )?;
    let rolling = &strategy["rollingUpdate"];
    if !rolling.is_null() && strategy["type"] == "OnDelete" {
        return Err(err(
            "spec.updateStrategy.rollingUpdate",
            "Invalid value: only allowed for updateStrategy 'RollingUpdate'",
        ));
    }
    type_check(rolling, "spec.updateStrategy.rollingUpdate", "object")?;
    int32_fields(rolling, "spec.updateStrategy.rollingUpdate", &["partition"])?;
    match &rolling["maxUnavailable"] {
        Value::Null => {}
        Value::Number(n)
            if n.as_u64()
                .is_some_and(|n| (1..=i32::MAX as u64).contains(&n)) => {}
        Value::String(p)
            if p.strip_suffix('%')
                .and_then(|p| p.parse::<u64>().ok())
                .is_some_and(|p| (1..=100).contains(&p)) => {}
        other => {
            return Err(err(
                "spec.updateStrategy.rollingUpdate.maxUnavailable",
                format!(
                    "Invalid value: {other}: must be a positive integer or a percentage of 1% to 100%"
                ),
            ));
        }
    }
    type_check(&spec["ordinals"], "spec.ordinals", "object")?;
    int32_fields(&spec["ordinals"], "spec.ordinals", &["start"])?;
    type_check(&spec["serviceName"], "spec.serviceName", "string")?;
    if let Some(service) = spec["serviceName"].as_str().filter(|s| !s.is_empty()) {
        shoal_state::labels::check_dns_label(service).map_err(|r| {
            err(
                "spec.serviceName",
                format!("Invalid value: {service:?}: {r}"),
            )
        })?;
    }
    let retention = &spec["persistentVolumeClaimRetentionPolicy"];
    type_check(
        retention,
        "spec.persistentVolumeClaimRetentionPolicy",
        "object",
    )?;
    for field in ["whenDeleted", "whenScaled"] {
        one_of(
            &format!("spec.persistentVolumeClaimRetentionPolicy.{field}"),
            &retention[field],
            &["Retain", "Delete"],
        )?;
    }
    let templates = &spec["volumeClaimTemplates"];
    type_check(templates, "spec.volumeClaimTemplates", "array")?;
    let templates = templates.as_array().map_or(&[][..], Vec::as_slice);
    if templates.len() > MAX_CLAIM_TEMPLATES {
        return Err(err(
            "spec.volumeClaimTemplates",
            format!(
                "Too many: {}: must have at most {MAX_CLAIM_TEMPLATES} items",
                templates.len()
            ),
        ));
    }
    for (i, claim) in templates.iter().enumerate() {
        let path = format!("spec.volumeClaimTemplates[{i}].metadata.name");
        let name = claim["metadata"]["name"].as_str().unwrap_or_default();
        shoal_state::labels::check_dns_label(name)
            .map_err(|r| err(&path, format!("Invalid value: {name:?}: {r}")))?;
        // Each becomes a claim as written: checked as one.
        crate::storage::validate_claim(claim).map_err(|e| {
            err(
                format!("spec.volumeClaimTemplates[{i}].{}", e.field),
                e.detail,
            )
        })?;
    }
    // Its pods restart in place (an ended StatefulSet pod is replaced under its name).
    let policy = &spec["template"]["spec"]["restartPolicy"];
    if !policy.is_null() && policy != "Always" {
        return Err(err(
            "spec.template.spec.restartPolicy",
            format!("Unsupported value: {policy}: supported values: \"Always\""),
        ));
    }
    // Each pod's name `NAME-k` must be a label value (`statefulset.kubernetes.io/pod-name`).
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let start = spec["ordinals"]["start"].as_u64().unwrap_or(0);
    let replicas = spec["replicas"].as_u64().unwrap_or(1);
    let last = format!(
        "{name}-{}",
        start.saturating_add(replicas.saturating_sub(1))
    );
    if last.len() > 63 {
        return Err(err(
            "metadata.name",
            format!(
                "Invalid value: {name:?}: the name of its last pod, {last:?}, must be no more than 63 characters"
            ),
        ));
    }
    Ok(())
}

const KNOWN_METADATA: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "selfLink",
];

/// Unknown top-level and metadata fields (kubectl's default `--validate=strict` asks for this).
pub fn unknown_fields(kind: &str, object: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    if let Some(map) = object.as_object() {
        for k in map.keys() {
            if !known_top_level(kind).contains(&k.as_str()) {
                unknown.push(k.clone());
            }
        }
    }
    if let Some(meta) = object["metadata"].as_object() {
        for k in meta.keys() {
            if !KNOWN_METADATA.contains(&k.as_str()) {
                unknown.push(format!("metadata.{k}"));
            }
        }
    }
    unknown
}

fn type_check(value: &Value, field: &str, want: &str) -> Result<(), FieldError> {
    let ok = match want {
        "integer" => value.is_i64() || value.is_u64(),
        "string" => value.is_string(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    if ok || value.is_null() {
        Ok(())
    } else {
        Err(err(
            field,
            format!("Invalid value: {value}: must be of type {want}"),
        ))
    }
}

fn validate_pod_spec(spec: &Value, path: &str) -> Result<(), FieldError> {
    type_check(spec, path, "object")?;
    // What reaches the node's filesystem and arithmetic (names, paths, quantities,
    // durations): the same check the kubelet makes again.
    crate::node_inputs::check(spec, path)?;
    let containers = &spec["containers"];
    type_check(containers, &format!("{path}.containers"), "array")?;
    let list = containers.as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        return Err(err(format!("{path}.containers"), "Required value"));
    }
    // Names unique across both lists: `node_inputs::check` above.
    let host_network = spec["hostNetwork"] == true;
    // (protocol, hostIP, hostPort) of the ports seen so far: unique in a pod, as upstream.
    let mut host_ports = std::collections::BTreeSet::new();
    for (field, list) in [
        (
            "initContainers",
            spec["initContainers"].as_array().map(Vec::as_slice),
        ),
        ("containers", Some(list)),
    ] {
        for (i, c) in list.into_iter().flatten().enumerate() {
            let at = format!("{path}.{field}[{i}]");
            type_check(c, &at, "object")?;
            match c["name"].as_str() {
                None | Some("") => return Err(err(format!("{at}.name"), "Required value")),
                Some(n) => {
                    shoal_state::labels::check_dns_subdomain(n).map_err(|r| {
                        err(format!("{at}.name"), format!("Invalid value: {n:?}: {r}"))
                    })?;
                }
            }
            if c["image"].as_str().is_none_or(str::is_empty) {
                return Err(err(format!("{at}.image"), "Required value"));
            }
            if let Some(policy) = c["imagePullPolicy"].as_str()
                && !matches!(policy, "Always" | "IfNotPresent" | "Never")
            {
                return Err(err(
                    format!("{at}.imagePullPolicy"),
                    format!(
                        "Unsupported value: {policy:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""
                    ),
                ));
            }
            for (j, p) in c["ports"].as_array().into_iter().flatten().enumerate() {
                validate_port(
                    p,
                    &format!("{at}.ports[{j}]"),
                    host_network,
                    &mut host_ports,
                )?;
            }
        }
    }
    for (i, secret) in spec["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = secret["name"].as_str().unwrap_or_default();
        shoal_state::labels::check_dns_subdomain(name).map_err(|r| {
            err(
                format!("{path}.imagePullSecrets[{i}].name"),
                format!("Invalid value: {name:?}: {r}"),
            )
        })?;
    }
    if let Some(policy) = spec["restartPolicy"].as_str()
        && !matches!(policy, "Always" | "OnFailure" | "Never")
    {
        return Err(err(
            format!("{path}.restartPolicy"),
            format!(
                "Unsupported value: {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
            ),
        ));
    }
    if let Some(policy) = spec["dnsPolicy"].as_str() {
        if !matches!(
            policy,
            "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None"
        ) {
            return Err(err(
                format!("{path}.dnsPolicy"),
                format!(
                    "Unsupported value: {policy:?}: supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\""
                ),
            ));
        }
        let nameservers = spec["dnsConfig"]["nameservers"]
            .as_array()
            .is_some_and(|n| !n.is_empty());
        if policy == "None" && !nameservers {
            return Err(err(
                format!("{path}.dnsConfig.nameservers"),
                "Required value: must provide at least one DNS nameserver when `dnsPolicy` is None",
            ));
        }
    }
    scheduling::check(spec, path)
}

/// One `ports[]` entry of a container: `containerPort` and `hostPort` in range, a supported
/// `protocol`, an address as `hostIP`, a `hostPort` equal to the `containerPort` on the host's
/// network, and no (protocol, hostIP, hostPort) twice in a pod (`seen`), with upstream's words.
fn validate_port(
    p: &Value,
    at: &str,
    host_network: bool,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<(), FieldError> {
    let in_range = |v: &Value| v.as_i64().is_some_and(|n| (1..=65535).contains(&n));
    let port = &p["containerPort"];
    if !in_range(port) {
        return Err(err(
            format!("{at}.containerPort"),
            format!("Invalid value: {port}: must be between 1 and 65535, inclusive"),
        ));
    }
    let protocol = p["protocol"].as_str().unwrap_or("TCP");
    if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
        return Err(err(
            format!("{at}.protocol"),
            format!(
                "Unsupported value: {protocol:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""
            ),
        ));
    }
    let host_ip = p["hostIP"].as_str().unwrap_or_default();
    if !host_ip.is_empty() && host_ip.parse::<std::net::IpAddr>().is_err() {
        return Err(err(
            format!("{at}.hostIP"),
            format!("Invalid value: {host_ip:?}: must be a valid IP address"),
        ));
    }
    let host_port = &p["hostPort"];
    if host_port.is_null() || host_port.as_i64() == Some(0) {
        return Ok(());
    }
    if !in_range(host_port) {
        return Err(err(
            format!("{at}.hostPort"),
            format!("Invalid value: {host_port}: must be between 1 and 65535, inclusive"),
        ));
    }
    if host_network && host_port != port {
        return Err(err(
            format!("{at}.hostPort"),
            format!(
                "Invalid value: {host_port}: must match `containerPort` when `hostNetwork` is true"
            ),
        ));
    }
    let key = format!("{protocol}/{host_ip}/{host_port}");
    if !seen.insert(key.clone()) {
        return Err(err(
            format!("{at}.hostPort"),
            format!("Duplicate value: {key:?}"),
        ));
    }
    Ok(())
}

fn validate_template(object: &Value, needs_selector: bool) -> Result<(), FieldError> {
    let spec = &object["spec"];
    if spec.is_null() {
        return Err(err("spec", "Required value"));
    }
    type_check(spec, "spec", "object")?;
    int32_fields(
        spec,
        "spec",
        &[
            "replicas",
            "minReadySeconds",
            "revisionHistoryLimit",
            "progressDeadlineSeconds",
        ],
    )?;
    type_check(&spec["selector"], "spec.selector", "object")?;
    type_check(
        &spec["selector"]["matchLabels"],
        "spec.selector.matchLabels",
        "object",
    )?;
    type_check(&spec["template"], "spec.template", "object")?;
    type_check(
        &spec["template"]["metadata"],
        "spec.template.metadata",
        "object",
    )?;
    label_map(
        &spec["template"]["metadata"]["labels"],
        "spec.template.metadata.labels",
    )?;
    if needs_selector {
        let selector = &spec["selector"];
        if selector.is_null() {
            return Err(err("spec.selector", "Required value"));
        }
        let template_labels = &spec["template"]["metadata"]["labels"];
        for (k, v) in selector["matchLabels"].as_object().into_iter().flatten() {
            if template_labels.get(k) != Some(v) {
                return Err(err(
                    "spec.template.metadata.labels",
                    format!(
                        "Invalid value: {template_labels}: `selector` does not match template `labels`"
                    ),
                ));
            }
        }
    }
    if spec["template"].is_null() {
        return Err(err("spec.template", "Required value"));
    }
    validate_pod_spec(&spec["template"]["spec"], "spec.template.spec")
}

/// A label map at `path` (absent is fine): an object of valid label keys to valid values, as
/// `metadata.labels` must be (a template's labels become its pods').
fn label_map(labels: &Value, path: &str) -> Result<(), FieldError> {
    type_check(labels, path, "object")?;
    for (k, v) in labels.as_object().into_iter().flatten() {
        let at = format!("{path}.{k}");
        type_check(v, &at, "string")?;
        shoal_state::labels::validate_key(k).map_err(|e| err(at.clone(), e.to_string()))?;
        shoal_state::labels::validate_value(k, v.as_str().unwrap_or_default())
            .map_err(|e| err(at.clone(), e.to_string()))?;
    }
    Ok(())
}

/// The fields of `spec` (at `path`) that the apiserver types as non-negative `int32`: each, if
/// present, an integer in `0..=i32::MAX`.
fn int32_fields(spec: &Value, path: &str, fields: &[&str]) -> Result<(), FieldError> {
    for field in fields {
        let Some(value) = spec.get(*field).filter(|v| !v.is_null()) else {
            continue;
        };
        let at = format!("{path}.{field}");
        type_check(value, &at, "integer")?;
        match value.as_i64() {
            Some(n) if n < 0 => {
                return Err(err(
                    at,
                    format!("Invalid value: {value}: must be greater than or equal to 0"),
                ));
            }
            Some(n) if n <= i64::from(i32::MAX) => {}
            _ => {
                return Err(err(
                    at,
                    format!(
                        "Invalid value: {value}: must be less than or equal to {}",
                        i32::MAX
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The most `completions` and `parallelism` an Indexed Job may ask for, as the apiserver's
/// `maxParallelismForIndexedJob` and `completionsSoftLimit` (10^5): its status names indexes.
pub const MAX_INDEXED_JOB_COMPLETIONS: i64 = 100_000;

/// A Job's spec (a Job's own, or a CronJob's `jobTemplate.spec`, at `path`): its counts are
/// bounded as the apiserver bounds them. The controller creates at most a burst of pods per
/// pass whatever they ask, but a count is a promise of work: 2^40 pods is refused here.
fn validate_job_spec(spec: &Value, path: &str) -> Result<(), FieldError> {
    int32_fields(
        spec,
        path,
        &[
            "parallelism",
            "completions",
            "backoffLimit",
            "backoffLimitPerIndex",
            "maxFailedIndexes",
            "ttlSecondsAfterFinished",
        ],
    )?;
    let deadline = &spec["activeDeadlineSeconds"];
    if !deadline.is_null() && deadline.as_i64().is_none_or(|n| n <= 0) {
        return Err(err(
            format!("{path}.activeDeadlineSeconds"),
            format!("Invalid value: {deadline}: must be greater than 0"),
        ));
    }
    if spec["completionMode"] == "Indexed" {
        if spec["completions"].is_null() {
            return Err(err(
                format!("{path}.completions"),
                "Required value: when completion mode is Indexed",
            ));
        }
        for field in ["completions", "parallelism"] {
            let value = &spec[field];
            if value
                .as_i64()
                .is_some_and(|n| n > MAX_INDEXED_JOB_COMPLETIONS)
            {
                return Err(err(
                    format!("{path}.{field}"),
                    format!(
                        "Invalid value: {value}: must be less than or equal to {MAX_INDEXED_JOB_COMPLETIONS} when completion mode is Indexed"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A Job's pods end: the apiserver defaults a template's absent `restartPolicy` to `Always`
/// (as any pod's) and then refuses it for a Job, so a Job that names none is refused too.
fn job_restart_policy(spec: &Value, path: &str) -> Result<(), FieldError> {
    let policy = spec["restartPolicy"].as_str().unwrap_or("Always");
    if matches!(policy, "OnFailure" | "Never") {
        return Ok(());
    }
    Err(err(
        format!("{path}.restartPolicy"),
        format!("Unsupported value: {policy:?}: supported values: \"OnFailure\", \"Never\""),
    ))
}

/// Validates kind-specific fields.
pub fn validate(kind: &str, object: &Value) -> Result<(), FieldError> {
    match kind {
        "Pod" => validate_pod_spec(&object["spec"], "spec"),
        "Deployment" | "ReplicaSet" | "DaemonSet" => validate_template(object, true),
        "StatefulSet" => {
            // Its pods get a volume per claim template (as its controller makes them): the
            // template's mounts may name those.
            let mut with_claims = object.clone();
            let claims: Vec<Value> = object["spec"]["volumeClaimTemplates"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["metadata"]["name"].as_str())
                .map(|name| json!({"name": name, "persistentVolumeClaim": {"claimName": name}}))
                .collect();
            let spec = &mut with_claims["spec"]["template"]["spec"];
            if !claims.is_empty() && spec.is_object() {
                let mut volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
                volumes.retain(|v| !claims.iter().any(|c| c["name"] == v["name"]));
                volumes.extend(claims);
                spec["volumes"] = Value::Array(volumes);
            }
            validate_template(&with_claims, true)?;
            validate_stateful_set(object)
        }
        "Role" | "ClusterRole" => crate::rbac::validate_role(object),
        "RoleBinding" | "ClusterRoleBinding" => crate::rbac::validate_binding(kind, object),
        "PersistentVolumeClaim" => crate::storage::validate_claim(object),
        "PersistentVolume" => crate::storage::validate_volume(object),
        "StorageClass" => crate::storage::validate_class(object),
        "ControllerRevision" => {
            let revision = &object["revision"];
            if revision.is_null() {
                return Err(err("revision", "Required value"));
            }
            if revision.as_i64().is_none_or(|n| n < 0) {
                return Err(err(
                    "revision",
                    format!("Invalid value: {revision}: must be greater than or equal to 0"),
                ));
            }
            type_check(&object["data"], "data", "object")
        }
        "Job" => {
            validate_template(object, false)?;
            validate_job_spec(&object["spec"], "spec")?;
            job_restart_policy(&object["spec"]["template"]["spec"], "spec.template.spec")?;
            crate::job::failure_policy(object).map(|_| ())
        }
        "CronJob" => {
            crate::cron::schedule(object)?;
            let job_spec = &object["spec"]["jobTemplate"]["spec"];
            if job_spec.is_null() {
                return Err(err("spec.jobTemplate.spec", "Required value"));
            }
            if job_spec["template"].is_null() {
                return Err(err("spec.jobTemplate.spec.template", "Required value"));
            }
            validate_job_spec(job_spec, "spec.jobTemplate.spec")?;
            int32_fields(
                &object["spec"],
                "spec",
                &["successfulJobsHistoryLimit", "failedJobsHistoryLimit"],
            )?;
            let path = "spec.jobTemplate.spec.template.spec";
            validate_pod_spec(&job_spec["template"]["spec"], path)?;
            job_restart_policy(&job_spec["template"]["spec"], path)
        }
        "Service" => {
            for (i, p) in object["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let port = &p["port"];
                if !port.as_i64().is_some_and(|n| (1..=65535).contains(&n)) {
                    return Err(err(
                        format!("spec.ports[{i}].port"),
                        format!("Invalid value: {port}: must be between 1 and 65535, inclusive"),
                    ));
                }
            }
            if let Some(t) = object["spec"]["type"].as_str()
                && !matches!(
                    t,
                    "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
                )
            {
                return Err(err("spec.type", format!("Unsupported value: {t:?}")));
            }
            Ok(())
        }
        "ConfigMap" | "Secret" => {
            for field in ["data", "binaryData", "stringData"] {
                type_check(&object[field], field, "object")?;
                for (k, v) in object[field].as_object().into_iter().flatten() {
                    type_check(v, &format!("{field}[{k}]"), "string")?;
                }
            }
            Ok(())
        }
        "HorizontalPodAutoscaler" => crate::hpa::Spec::parse(object).map(|_| ()),
        _ => Ok(()),
    }
}

/// The items of the list at `key` of `object`, if it has one (never inserting the key, as
/// indexing a `Value` mutably would: a null `ports` or `env` would be stored).
fn items_mut<'a>(object: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Value> {
    object
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// An enum field: absent, or one of `allowed` (the apiserver's `Unsupported value` error).
pub(crate) fn one_of(path: &str, value: &Value, allowed: &[&str]) -> Result<(), FieldError> {
    match value {
        Value::Null => Ok(()),
        Value::String(s) if allowed.contains(&s.as_str()) => Ok(()),
        other => Err(err(
            path,
            format!(
                "Unsupported value: {other}: supported values: {}",
                allowed
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// `map[key] = value` unless `map` has `key` already (a default).
pub(crate) fn default_field(map: &mut Value, key: &str, value: Value) {
    if let Some(m) = map.as_object_mut()
        && !m.contains_key(key)
    {
        m.insert(key.to_owned(), value);
    }
}

/// A probe's defaults (`kubectl describe` shows them; the kubelet applies the same ones).
fn default_probe(probe: &mut Value) {
    if !probe.is_object() {
        return;
    }
    default_field(probe, "timeoutSeconds", json!(1));
    default_field(probe, "periodSeconds", json!(10));
    default_field(probe, "successThreshold", json!(1));
    default_field(probe, "failureThreshold", json!(3));
    if probe["httpGet"].is_object() {
        default_field(&mut probe["httpGet"], "path", json!("/"));
        default_field(&mut probe["httpGet"], "scheme", json!("HTTP"));
    }
}

/// A pod template (`metadata` + `spec`) with the apiserver's pod defaults, as a workload
/// written through either API stores it.
pub fn default_pod_template(template: &mut Value) {
    if template["spec"].is_object() {
        default_pod_spec(&mut template["spec"]);
    }
}

/// The `imagePullPolicy` the apiserver gives a container of `image` that names none: Always
/// for the tag `latest`, written or implied, IfNotPresent otherwise (a digest included).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image_tag(image) == Some("latest") {
        "Always"
    } else {
        "IfNotPresent"
    }
}

/// The tag the apiserver's defaulting reads from an image reference (upstream's
/// `parsers.ParseImageName`): what follows a `:` in the last path component, `latest` when
/// there is neither a tag nor a digest, none for a digest alone. A registry's `host:port`
/// (before the first `/`) is not a tag.
fn image_tag(image: &str) -> Option<&str> {
    let (name, digest) = match image.split_once('@') {
        Some((name, _)) => (name, true),
        None => (image, false),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        Some((_, tag)) => Some(tag),
        None if digest => None,
        None => Some("latest"),
    }
}

/// The defaults of a pod spec wherever it is (a pod's, or a workload's template): the
/// apiserver's `SetDefaults_PodSpec`, `SetDefaults_Container`, probes', ports' and volumes'.
fn default_pod_spec(spec: &mut Value) {
    default_field(spec, "restartPolicy", json!("Always"));
    default_field(spec, "terminationGracePeriodSeconds", json!(30));
    default_field(spec, "dnsPolicy", json!("ClusterFirst"));
    default_field(spec, "schedulerName", json!("default-scheduler"));
    default_field(spec, "securityContext", json!({}));
    for field in ["containers", "initContainers"] {
        for c in items_mut(spec, field) {
            let policy = default_pull_policy(c["image"].as_str().unwrap_or_default());
            default_field(c, "imagePullPolicy", json!(policy));
            default_field(c, "terminationMessagePath", json!("/dev/termination-log"));
            default_field(c, "terminationMessagePolicy", json!("File"));
            default_field(c, "resources", json!({}));
            for p in items_mut(c, "ports") {
                default_field(p, "protocol", json!("TCP"));
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                if let Some(p) = c.get_mut(probe) {
                    default_probe(p);
                }
            }
            for e in items_mut(c, "env") {
                if e["valueFrom"]["fieldRef"].is_object() {
                    default_field(&mut e["valueFrom"]["fieldRef"], "apiVersion", json!("v1"));
                }
            }
        }
    }
    for v in items_mut(spec, "volumes") {
        for source in ["configMap", "secret", "projected", "downwardAPI"] {
            if v[source].is_object() {
                default_field(&mut v[source], "defaultMode", json!(0o644));
            }
        }
    }
}

/// What the Kubernetes API does to an object before it is written: the kind's checks, then the
/// apiserver's defaults (which assume the checks passed).
pub fn admit(kind: &str, body: &mut Value) -> Result<(), FieldError> {
    validate(kind, body)?;
    default(kind, body);
    Ok(())
}

/// Where a pod's service-account token volume is mounted in its containers (upstream's).
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of that volume's name (upstream's `kube-api-access-` and 5 random characters).
pub const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";
/// The life of an automounted token (upstream's 3607 s: an hour, and 7 s that tell it apart).
pub const AUTOMOUNT_TOKEN_SECONDS: u64 = 3607;

/// The ServiceAccount admission plugin's part that needs the store: a new pod that names no
/// `imagePullSecrets` gets its ServiceAccount's (`account`, the pod's
/// `spec.serviceAccountName` in its namespace, if it exists); and unless the pod or its
/// ServiceAccount says `automountServiceAccountToken: false`, a projected volume named
/// `kube-api-access-SUFFIX` (`suffix`: 5 random characters, an input) with a token, the
/// cluster's CA and the namespace, mounted read-only at [`TOKEN_MOUNT_PATH`] in every
/// container that has no mount there, as upstream's plugin adds it.
pub fn admit_service_account(pod: &mut Value, account: Option<&Value>, suffix: &str) {
    mount_token(pod, account, suffix);
    let has_own = pod["spec"]["imagePullSecrets"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let Some(secrets) = account.and_then(|a| a["imagePullSecrets"].as_array()) else {
        return;
    };
    if has_own || secrets.is_empty() || !pod["spec"].is_object() {
        return;
    }
    let names: Vec<Value> = secrets
        .iter()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| !n.is_empty())
        .map(|n| json!({"name": n}))
        .collect();
    pod["spec"]["imagePullSecrets"] = Value::Array(names);
}

fn mount_token(pod: &mut Value, account: Option<&Value>, suffix: &str) {
    let spec = &pod["spec"];
    let automount = spec["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| account.and_then(|a| a["automountServiceAccountToken"].as_bool()))
        .unwrap_or(true);
    if !automount || !spec.is_object() {
        return;
    }
    let mounted = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["mountPath"] == TOKEN_MOUNT_PATH))
    };
    let needs = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|f| spec[*f].as_array().into_iter().flatten())
        .any(|c| c.is_object() && !mounted(c));
    if !needs {
        return;
    }
    let name = format!("{TOKEN_VOLUME_PREFIX}{suffix}");
    let volume = json!({"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": AUTOMOUNT_TOKEN_SECONDS, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}});
    let spec = &mut pod["spec"];
    match spec["volumes"].as_array_mut() {
        Some(volumes) => volumes.push(volume),
        None => spec["volumes"] = json!([volume]),
    }
    for field in ["initContainers", "containers", "ephemeralContainers"] {
        for c in items_mut(spec, field) {
            if !c.is_object() || mounted(c) {
                continue;
            }
            let mount = json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
            match c["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
    }
}

/// The apiserver's `SetDefaults_Pod`: a limit without a request requests the limit, and
/// service links are on.
fn set_defaults_pod(spec: &mut Value) {
    default_field(spec, "enableServiceLinks", json!(true));
    for field in ["containers", "initContainers"] {
        for c in items_mut(spec, field) {
            if let Some(resources) = c.get_mut("resources").and_then(Value::as_object_mut) {
                let limits = resources.get("limits").and_then(Value::as_object).cloned();
                for (resource, limit) in limits.into_iter().flatten() {
                    let requests = resources.entry("requests").or_insert_with(|| json!({}));
                    default_field(requests, &resource, limit);
                }
            }
        }
    }
}

/// A template as `pod-template-hash` hashes it: with the pod spec's defaults and
/// `SetDefaults_Pod`'s, as templates were stored before they got the pod spec's alone; so a
/// template stored then and the same one stored now are one template, not a rollout.
pub fn hashed_template(template: &mut Value) {
    default_pod_template(template);
    let Some(spec) = template.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    set_defaults_pod(spec);
    // The defaulting of that time also inserted these lists as null where they were absent
    // (indexing a `Value` mutably does), and templates were stored so: the hash keeps them
    // null, so a template stored then and the same one sent now hash alike, as they did.
    let absent_as_null = |object: &mut Value, key: &str| {
        if let Some(map) = object.as_object_mut() {
            map.entry(key).or_insert(Value::Null);
        }
    };
    for key in ["containers", "initContainers", "volumes"] {
        absent_as_null(spec, key);
    }
    for field in ["containers", "initContainers"] {
        for c in items_mut(spec, field) {
            absent_as_null(c, "ports");
            absent_as_null(c, "env");
        }
    }
}

/// What a pod gets when it is created, and a template does not: the apiserver's `SetDefaults_Pod`
/// (a limit without a request requests the limit; service links on) and its admission plugins'
/// (the ServiceAccount and Priority plugins'). Pods a controller makes from a template get these
/// too, as they would passing through the apiserver.
///
/// One of the apiserver's additions is not made, on purpose: the DefaultTolerationSeconds
/// plugin's `node.kubernetes.io/not-ready`/`unreachable` tolerations (a dead node's pods move
/// after the agent's `--eviction-delay`, which reads no toleration). The ServiceAccount
/// plugin's `kube-api-access-*` token volume needs the store (the pod's
/// ServiceAccount may say no): [`admit_service_account`] adds it.
pub fn default_pod(spec: &mut Value) {
    default_pod_spec(spec);
    if !spec.is_object() {
        return;
    }
    set_defaults_pod(spec);
    // On the host's network a container port is a host port (upstream defaults it in pods, not
    // in templates, so a template's hash does not move).
    if spec["hostNetwork"] == true {
        for field in ["containers", "initContainers"] {
            for c in items_mut(spec, field) {
                // (Defaults run before validation: a port that is no object is left alone.)
                for p in items_mut(c, "ports").filter_map(Value::as_object_mut) {
                    if p.get("hostPort").and_then(Value::as_i64).unwrap_or(0) == 0
                        && let Some(port) = p.get("containerPort").cloned()
                    {
                        p.insert("hostPort".to_owned(), port);
                    }
                }
            }
        }
    }
    // The ServiceAccount admission's default (and the deprecated field that mirrors it).
    let account = spec["serviceAccountName"]
        .as_str()
        .or_else(|| spec["serviceAccount"].as_str())
        .filter(|a| !a.is_empty())
        .unwrap_or("default")
        .to_owned();
    spec["serviceAccountName"] = json!(account);
    spec["serviceAccount"] = json!(account);
    // The Priority admission without a PriorityClass (Shoal serves none): priority 0, which
    // may preempt lower. A priority set in the spec is what the scheduler ranks by.
    if spec["priorityClassName"].as_str().is_none_or(str::is_empty) {
        default_field(spec, "priority", json!(0));
        default_field(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    }
}

pub fn default(kind: &str, object: &mut Value) {
    match kind {
        "Pod" => default_pod(&mut object["spec"]),
        "Deployment" | "ReplicaSet" | "DaemonSet" | "Job" => {
            let name = object["metadata"]["name"].as_str().map(str::to_owned);
            let spec = &mut object["spec"];
            if kind != "DaemonSet" && kind != "Job" {
                default_field(spec, "replicas", json!(1));
            }
            default_field(spec, "revisionHistoryLimit", json!(10));
            if kind == "DaemonSet" {
                default_field(
                    spec,
                    "updateStrategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
                );
            }
            if kind == "Deployment" {
                default_field(spec, "progressDeadlineSeconds", json!(600));
                default_field(
                    spec,
                    "strategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
                );
            }
            if kind == "Job" {
                // The selector Kubernetes generates names the Job's uid, which the store
                // assigns on create: the Job's name selects here, and its pods carry both.
                if let Some(name) =
                    name.filter(|_| spec["manualSelector"] != true && spec["selector"].is_null())
                {
                    spec["selector"] =
                        json!({"matchLabels": {"batch.kubernetes.io/job-name": name}});
                    if spec["template"].is_object() {
                        let labels = &mut spec["template"]["metadata"]["labels"];
                        if !labels.is_object() {
                            *labels = json!({});
                        }
                        labels["batch.kubernetes.io/job-name"] = json!(name);
                        labels["job-name"] = json!(name);
                    }
                }
                default_field(spec, "completions", json!(1));
                default_field(spec, "parallelism", json!(1));
                default_field(spec, "backoffLimit", json!(6));
                default_field(spec, "completionMode", json!("NonIndexed"));
                default_field(spec, "suspend", json!(false));
                if let Some(m) = spec.as_object_mut() {
                    m.remove("revisionHistoryLimit");
                }
            }
            if spec["template"].is_object() && spec["template"]["spec"].is_object() {
                default_pod_spec(&mut spec["template"]["spec"]);
            }
        }
        "PersistentVolumeClaim" | "PersistentVolume" | "StorageClass" => {
            crate::storage::default(kind, object)
        }
        "StatefulSet" => {
            let spec = &mut object["spec"];
            default_field(spec, "replicas", json!(1));
            default_field(spec, "revisionHistoryLimit", json!(10));
            default_field(spec, "podManagementPolicy", json!("OrderedReady"));
            default_field(spec, "updateStrategy", json!({"type": "RollingUpdate"}));
            if spec["updateStrategy"]["type"] == "RollingUpdate" {
                default_field(
                    &mut spec["updateStrategy"],
                    "rollingUpdate",
                    json!({"partition": 0}),
                );
                default_field(
                    &mut spec["updateStrategy"]["rollingUpdate"],
                    "partition",
                    json!(0),
                );
            }
            default_field(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
            for field in ["whenDeleted", "whenScaled"] {
                default_field(
                    &mut spec["persistentVolumeClaimRetentionPolicy"],
                    field,
                    json!("Retain"),
                );
            }
            if spec["template"].is_object() && spec["template"]["spec"].is_object() {
                default_pod_spec(&mut spec["template"]["spec"]);
            }
        }
        "CronJob" => {
            let spec = &mut object["spec"];
            default_field(spec, "concurrencyPolicy", json!("Allow"));
            default_field(spec, "suspend", json!(false));
            default_field(spec, "successfulJobsHistoryLimit", json!(3));
            default_field(spec, "failedJobsHistoryLimit", json!(1));
            let template_spec = &mut spec["jobTemplate"]["spec"]["template"]["spec"];
            if template_spec.is_object() {
                default_pod_spec(template_spec);
            }
        }
        "Service" => {
            let spec = &mut object["spec"];
            default_field(spec, "type", json!("ClusterIP"));
            default_field(spec, "sessionAffinity", json!("None"));
            default_field(spec, "internalTrafficPolicy", json!("Cluster"));
            if spec["type"] != "ExternalName" {
                default_field(spec, "ipFamilies", json!(["IPv4"]));
                default_field(spec, "ipFamilyPolicy", json!("SingleStack"));
            }
            for p in items_mut(spec, "ports") {
                default_field(p, "protocol", json!("TCP"));
                let port = p["port"].clone();
                default_field(p, "targetPort", port);
            }
        }
        "Secret" => default_field(object, "type", json!("Opaque")),
        "HorizontalPodAutoscaler" => crate::hpa::default(object),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stateful_set_is_checked_as_the_apiserver_does_and_within_shoals_bounds() {
        let sts = |spec: Value| {
            let mut s = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "web"},
                "spec": {"selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "c", "image": "i",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
                    "volumeClaimTemplates": [{"metadata": {"name": "data"},
                        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}});
            if let (Some(m), Value::Object(more)) = (s["spec"].as_object_mut(), spec) {
                m.extend(more);
            }
            s
        };
        let field = |spec: Value| validate("StatefulSet", &sts(spec)).err().map(|e| e.field);
        // The mounts may name the claim templates.
        assert_eq!(field(json!({})), None);
        assert_eq!(
            field(json!({"replicas": 1_000_000_000})).as_deref(),
            Some("spec.replicas")
        );
        assert_eq!(
            field(json!({"podManagementPolicy": "Random"})).as_deref(),
            Some("spec.podManagementPolicy")
        );
        assert_eq!(
            field(
                json!({"updateStrategy": {"type": "OnDelete", "rollingUpdate": {"partition": 1}}})
            )
            .as_deref(),
            Some("spec.updateStrategy.rollingUpdate")
        );
        assert_eq!(
            field(json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}}}))
                .as_deref(),
            Some("spec.updateStrategy.rollingUpdate.maxUnavailable")
        );
        assert_eq!(
            field(json!({"volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": []}}]}))
                .as_deref(),
            Some("spec.volumeClaimTemplates[0].spec.accessModes")
        );
        assert_eq!(
            field(json!({"serviceName": "Not_A_Label"})).as_deref(),
            Some("spec.serviceName")
        );
        let mut defaulted = sts(json!({}));
        default("StatefulSet", &mut defaulted);
        assert_eq!(defaulted["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            defaulted["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
            0
        );
        assert_eq!(
            defaulted["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"],
            "Retain"
        );
    }

    /// Counts that ask for more than the apiserver allows are refused, naming the field: one
    /// Job with `parallelism: 2^40` once took down every agent in turn (issue #35, item 1).
    /// Found by the `admission` fuzz target (2026-12-06): a Deployment whose selector and
    /// template labels were strings passed, and its controller's first reconcile panicked
    /// indexing them (quarantined in the agent, but refused here now, naming the field).
    #[test]
    fn template_labels_and_selectors_must_be_maps_of_valid_labels() {
        let deployment = |selector: Value, labels: Value| {
            json!({"spec": {"selector": selector, "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
        };
        for (d, field) in [
            (
                deployment(json!("ipFamili {app: web}"), json!({"app": "web"})),
                "spec.selector",
            ),
            (
                deployment(json!({"matchLabels": "app"}), json!({"app": "web"})),
                "spec.selector.matchLabels",
            ),
            (
                deployment(json!({"matchLabels": {"app": "web"}}), json!("p{pa:web}")),
                "spec.template.metadata.labels",
            ),
            (
                deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": 7})),
                "spec.template.metadata.labels.app",
            ),
            (
                deployment(
                    json!({"matchLabels": {"app": "web"}}),
                    json!({"app": "web", "bad key!": "x"}),
                ),
                "spec.template.metadata.labels.bad key!",
            ),
        ] {
            let e = validate("Deployment", &d).unwrap_err();
            assert_eq!(e.field, field, "{e:?}");
        }
    }

    #[test]
    fn a_new_pod_gets_its_service_account_s_pull_secrets_unless_it_names_its_own() {
        let account = json!({"imagePullSecrets": [{"name": "regcred"}, {"name": ""}]});
        let mut pod = json!({"spec": {"containers": []}});
        admit_service_account(&mut pod, Some(&account), "x");
        assert_eq!(
            pod["spec"]["imagePullSecrets"],
            json!([{"name": "regcred"}])
        );
        let mut own = json!({"spec": {"imagePullSecrets": [{"name": "mine"}]}});
        admit_service_account(&mut own, Some(&account), "x");
        assert_eq!(own["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
        let mut none = json!({"spec": {}});
        admit_service_account(&mut none, None, "x");
        admit_service_account(&mut none, Some(&json!({})), "x");
        assert!(none["spec"]["imagePullSecrets"].is_null());
    }

    #[test]
    fn a_new_pod_gets_a_token_volume_unless_it_or_its_account_says_no() {
        let spec = json!({"initContainers": [{"name": "i"}], "containers": [
            {"name": "a"},
            {"name": "b", "volumeMounts": [{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]},
        ], "volumes": [{"name": "mine", "emptyDir": {}}]});
        let mut pod = json!({"spec": spec});
        admit_service_account(&mut pod, None, "abcde");
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[1]["name"], "kube-api-access-abcde");
        let sources = &volumes[1]["projected"]["sources"];
        assert_eq!(sources[0]["serviceAccountToken"]["expirationSeconds"], 3607);
        assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(
            sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        let mount = json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
        assert_eq!(
            pod["spec"]["initContainers"][0]["volumeMounts"],
            json!([mount])
        );
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"], json!([mount]));
        // A container with its own mount there keeps it.
        assert_eq!(
            pod["spec"]["containers"][1]["volumeMounts"][0]["name"],
            "mine"
        );
        assert_eq!(
            pod["spec"]["containers"][1]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        // The pod's word first, then the account's.
        let no = json!({"automountServiceAccountToken": false});
        let yes = json!({"automountServiceAccountToken": true});
        for (pod_says, account, mounted) in [
            (None, Some(&no), false),
            (Some(true), Some(&no), true),
            (Some(false), Some(&yes), false),
            (None, Some(&yes), true),
        ] {
            let mut pod = json!({"spec": {"containers": [{"name": "a"}]}});
            if let Some(v) = pod_says {
                pod["spec"]["automountServiceAccountToken"] = json!(v);
            }
            admit_service_account(&mut pod, account, "abcde");
            assert_eq!(pod["spec"]["volumes"].is_array(), mounted, "{pod}");
        }
    }

    /// `imagePullPolicy` and `imagePullSecrets` with upstream's words (issue #38).
    #[test]
    fn pull_policies_and_pull_secrets_are_validated() {
        let refused = |spec: Value| {
            let e = validate("Pod", &json!({"spec": spec})).unwrap_err();
            format!("{}: {}", e.field, e.detail)
        };
        assert_eq!(
            refused(
                json!({"containers": [{"name": "a", "image": "i", "imagePullPolicy": "Sometimes"}]})
            ),
            "spec.containers[0].imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\""
        );
        assert!(
            refused(json!({"imagePullSecrets": [{"name": "Bad_Name"}],
                           "containers": [{"name": "a", "image": "i"}]}))
            .starts_with("spec.imagePullSecrets[0].name: Invalid value: \"Bad_Name\"")
        );
        for policy in ["Always", "IfNotPresent", "Never"] {
            let spec = json!({"imagePullSecrets": [{"name": "regcred"}],
                              "containers": [{"name": "a", "image": "i", "imagePullPolicy": policy}]});
            assert!(validate("Pod", &json!({"spec": spec})).is_ok());
        }
        for (image, policy) in [
            ("busybox", "Always"),
            ("busybox:latest", "Always"),
            ("reg:5000/app", "Always"),
            ("reg:5000/app:1", "IfNotPresent"),
            (
                "app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "IfNotPresent",
            ),
        ] {
            assert_eq!(default_pull_policy(image), policy, "{image}");
        }
    }

    /// Container ports as the apiserver reads them (issue #37's hostPort): each field's
    /// range and values, hostNetwork's defaulting, and a host port once per pod.
    #[test]
    fn ports_are_validated_and_host_network_ports_defaulted() {
        let pod = |ports: Value, host_network: bool| {
            json!({"spec": {"hostNetwork": host_network, "containers": [
                {"name": "a", "image": "i", "ports": ports},
                {"name": "b", "image": "i", "ports": [{"containerPort": 9, "hostPort": 8080}]}]}})
        };
        let refused = |ports: Value, host_network: bool| {
            let e = validate("Pod", &pod(ports, host_network)).unwrap_err();
            format!("{}: {}", e.field, e.detail)
        };
        for (ports, host_network, expected) in [
            (
                json!([{"containerPort": 0}]),
                false,
                "spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 and 65535, inclusive",
            ),
            (
                json!([{"containerPort": 80, "hostPort": 70000}]),
                false,
                "spec.containers[0].ports[0].hostPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
            ),
            (
                json!([{"containerPort": 80, "protocol": "ICMP"}]),
                false,
                "spec.containers[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            ),
            (
                json!([{"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0"}]),
                false,
                "spec.containers[0].ports[0].hostIP: Invalid value: \"10.0.0\": must be a valid IP address",
            ),
            (
                json!([{"containerPort": 80, "hostPort": 81}]),
                true,
                "spec.containers[0].ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true",
            ),
            (
                json!([{"containerPort": 80, "hostPort": 8080}]),
                false,
                "spec.containers[1].ports[0].hostPort: Duplicate value: \"TCP//8080\"",
            ),
        ] {
            assert_eq!(refused(ports, host_network), expected);
        }
        // The same port on another protocol or address is another port.
        let fine = pod(
            json!([{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"},
            {"containerPort": 81, "hostPort": 8080, "hostIP": "10.0.0.1"}]),
            false,
        );
        assert_eq!(validate("Pod", &fine).map_err(|e| e.to_string()), Ok(()));
        // On the host's network a container port is a host port, in a pod (not in a template).
        let mut spec = json!({"hostNetwork": true, "containers": [{"name": "a", "image": "i", "ports": [{"containerPort": 53, "protocol": "UDP"}, "junk"]}]});
        default_pod(&mut spec);
        assert_eq!(spec["containers"][0]["ports"][0]["hostPort"], 53);
        assert_eq!(spec["containers"][0]["ports"][1], "junk");
        let mut template = json!({"spec": {"hostNetwork": true, "containers": [{"name": "a", "image": "i", "ports": [{"containerPort": 53}]}]}});
        default_pod_template(&mut template);
        assert!(
            template["spec"]["containers"][0]["ports"][0]
                .get("hostPort")
                .is_none()
        );
    }

    #[test]
    fn counts_are_bounded_as_the_apiserver_bounds_them() {
        let job = |spec: Value| {
            let mut spec = spec;
            spec["template"] = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}});
            json!({"spec": spec})
        };
        let refused = |kind: &str, object: &Value| validate(kind, object).unwrap_err().field;
        assert_eq!(
            refused("Job", &job(json!({"parallelism": 1_099_511_627_776u64}))),
            "spec.parallelism"
        );
        assert_eq!(
            refused("Job", &job(json!({"completions": i64::from(i32::MAX) + 1}))),
            "spec.completions"
        );
        assert_eq!(
            refused("Job", &job(json!({"backoffLimit": -1}))),
            "spec.backoffLimit"
        );
        assert_eq!(
            refused("Job", &job(json!({"activeDeadlineSeconds": 0}))),
            "spec.activeDeadlineSeconds"
        );
        assert_eq!(
            refused(
                "Job",
                &job(json!({"completionMode": "Indexed", "completions": 100_001}))
            ),
            "spec.completions"
        );
        assert_eq!(
            refused(
                "Job",
                &job(
                    json!({"completionMode": "Indexed", "completions": 5, "parallelism": 100_001})
                )
            ),
            "spec.parallelism"
        );
        assert_eq!(
            refused("Job", &job(json!({"completionMode": "Indexed"}))),
            "spec.completions"
        );
        let cron = json!({"spec": {"schedule": "* * * * *", "jobTemplate": job(json!({"parallelism": 1u64 << 62}))}});
        assert_eq!(
            refused("CronJob", &cron),
            "spec.jobTemplate.spec.parallelism"
        );
        let deployment = json!({"spec": {"replicas": 1u64 << 40, "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        assert_eq!(refused("Deployment", &deployment), "spec.replicas");
        // The largest counts allowed pass.
        validate(
            "Job",
            &job(json!({"parallelism": i32::MAX, "completions": i32::MAX})),
        )
        .unwrap();
        validate(
            "Job",
            &job(json!({"completionMode": "Indexed", "completions": 100_000, "parallelism": 100_000})),
        )
        .unwrap();
    }

    #[test]
    fn errors_name_fields() {
        let d = json!({"spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}}});
        assert_eq!(
            validate("Deployment", &d).unwrap_err().field,
            "spec.template.spec.containers[0].image"
        );
        let d = json!({"spec": {"replicas": "two", "selector": {}, "template": {}}});
        assert_eq!(
            validate("Deployment", &d).unwrap_err().field,
            "spec.replicas"
        );
        let d = json!({"spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        assert_eq!(
            validate("Deployment", &d).unwrap_err().field,
            "spec.template.metadata.labels"
        );
        assert_eq!(
            validate("Pod", &json!({"spec": {}})).unwrap_err().field,
            "spec.containers"
        );
        assert_eq!(
            validate("Service", &json!({"spec": {"ports": [{"port": 0}]}}))
                .unwrap_err()
                .field,
            "spec.ports[0].port"
        );
        // A Job's pods must end: no restartPolicy is the pod default, Always, which the
        // apiserver then refuses for a Job (and for a CronJob's Job template).
        let job = |policy: Option<&str>| {
            let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
            if let Some(p) = policy {
                spec["restartPolicy"] = json!(p);
            }
            json!({"spec": {"template": {"spec": spec}}})
        };
        for policy in [None, Some("Always")] {
            let e = validate("Job", &job(policy)).unwrap_err();
            assert_eq!(e.field, "spec.template.spec.restartPolicy");
            assert!(
                e.detail.contains(r#"Unsupported value: "Always""#),
                "{}",
                e.detail
            );
        }
        for policy in ["Never", "OnFailure"] {
            assert!(validate("Job", &job(Some(policy))).is_ok(), "{policy}");
        }
        let cron = json!({"spec": {"schedule": "*/5 * * * *", "jobTemplate": job(None)}});
        assert_eq!(
            validate("CronJob", &cron).unwrap_err().field,
            "spec.jobTemplate.spec.template.spec.restartPolicy"
        );
        assert_eq!(
            unknown_fields(
                "Pod",
                &json!({"spec": {}, "spex": 1, "metadata": {"nmae": "x"}})
            ),
            ["spex", "metadata.nmae"]
        );
    }

    #[test]
    fn defaults_like_the_apiserver() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
        default("Deployment", &mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        // A template gets the pod spec's defaults, not a pod's (as `kubectl get deploy -o
        // yaml` shows against Kubernetes): no service links, account or priority.
        for pod_only in [
            "enableServiceLinks",
            "serviceAccountName",
            "priority",
            "preemptionPolicy",
        ] {
            assert!(
                d["spec"]["template"]["spec"].get(pod_only).is_none(),
                "{pod_only}"
            );
        }
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Always"
        );
        // imagePullPolicy as the apiserver defaults it: Always for `latest`, written or implied
        // (no tag and no digest; a registry's port is not a tag), IfNotPresent otherwise.
        let digest = format!("sha256:{}", "a".repeat(64));
        for (image, policy) in [
            ("busybox", "Always"),
            ("busybox:latest", "Always"),
            ("busybox:1.36", "IfNotPresent"),
            ("reg:5000/team/app", "Always"),
            ("reg:5000/team/app:v2", "IfNotPresent"),
            (&format!("reg:5000/app@{digest}"), "IfNotPresent"),
            (&format!("app:latest@{digest}"), "Always"),
            ("localhost:5000/app", "Always"),
        ] {
            let mut p = json!({"spec": {"containers": [{"name": "c", "image": image}]}});
            default("Pod", &mut p);
            assert_eq!(
                p["spec"]["containers"][0]["imagePullPolicy"], policy,
                "{image}"
            );
        }
        let mut s = json!({"spec": {"ports": [{"port": 80}]}});
        default("Service", &mut s);
        assert_eq!(s["spec"]["ports"][0]["targetPort"], 80);
        // Probes are stored with their defaults, so kubectl describe shows what runs; what a
        // user set is kept.
        let mut p = json!({"spec": {
            "containers": [{"name": "c", "image": "i",
                "livenessProbe": {"httpGet": {"port": 80}},
                "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 2},
                "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}],
            "volumes": [{"name": "v", "configMap": {"name": "cm"}}],
        }});
        default("Pod", &mut p);
        let c = &p["spec"]["containers"][0];
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1,
                   "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(c["readinessProbe"]["periodSeconds"], 2);
        assert_eq!(c["readinessProbe"]["failureThreshold"], 3);
        assert!(c.get("startupProbe").is_none(), "no probe is invented");
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
        assert_eq!(p["spec"]["volumes"][0]["configMap"]["defaultMode"], 420);
        assert_eq!(p["spec"]["enableServiceLinks"], true);
        assert_eq!(p["spec"]["priority"], 0);
        // Defaulting adds no keys it has nothing for (no `ports: null`, `env: null`).
        let mut minimal = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        default("Pod", &mut minimal);
        let null_keys: Vec<&String> = minimal["spec"]["containers"][0]
            .as_object()
            .into_iter()
            .chain(minimal["spec"].as_object())
            .flatten()
            .filter(|(_, v)| v.is_null())
            .map(|(k, _)| k)
            .collect();
        assert!(null_keys.is_empty(), "{null_keys:?}");
        assert_eq!(p["spec"]["preemptionPolicy"], "PreemptLowerPriority");
        let mut high = json!({"spec": {"priority": 10, "containers": []}});
        default("Pod", &mut high);
        assert_eq!(high["spec"]["priority"], 10, "a set priority is kept");
        let mut s = json!({"spec": {"type": "ExternalName", "externalName": "a.b"}});
        default("Service", &mut s);
        assert!(s["spec"].get("ipFamilies").is_none(), "no address family");
        // A limit without a request requests the limit; a request that is set stays.
        let mut p = json!({"spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "100m"}}},
            {"name": "c", "image": "i", "resources": "not an object"},
        ]}});
        default("Pod", &mut p);
        let c = &p["spec"]["containers"];
        assert_eq!(
            c[0]["resources"]["requests"],
            json!({"cpu": "1", "memory": "64Mi"})
        );
        assert_eq!(c[1]["resources"]["requests"], json!({"cpu": "100m"}));
        assert_eq!(c[2]["resources"], "not an object");
    }
}
