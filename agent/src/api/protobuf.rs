//! `application/vnd.kubernetes.protobuf` bodies, converted to and from the JSON object model at
//! the API's edge, so every handler keeps working on JSON.
//!
//! The wire format is the apiserver's: the magic `k8s\0`, then a `runtime.Unknown` whose
//! `typeMeta` names apiVersion and kind and whose `raw` is the object's message. The messages
//! are described by Kubernetes' own `.proto` files (release 1.35), compiled into
//! `agent/proto/k8s.fds` (`agent/proto/generate.sh`) and read with `prost-reflect`; no message
//! is written by hand: bodies are decoded into `DynamicMessage`s, and written from the JSON
//! object in one pass guided by the descriptors ([`write_message`], values through
//! `prost::encoding`). What the descriptors cannot say, this module says, each in one table:
//! - the types whose JSON form is not their message's (`Time` is an RFC 3339 string,
//!   `IntOrString` a number or a string, `Quantity` a string, `RawExtension` embedded JSON);
//! - the Go structs embedded inline in their parent's JSON (`Probe.handler`, `Volume.volumeSource`,
//!   the `LocalObjectReference` of key selectors);
//! - the Go pointer fields whose zero value means something (`replicas: 0`, `runAsUser: 0`):
//!   Go's encoder writes every non-pointer field, zero or not, and the apiserver cannot tell a
//!   zero from an absent field either, so a zero scalar decodes to an absent JSON field unless
//!   the field is a pointer.
//!
//! A field a newer client knows and this schema does not is refused with the message and field
//! number, unless its value is zero (a newer Go encoder writes its new non-pointer fields on
//! every request); nothing a client sent is dropped silently.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, Value as PValue,
};
use serde_json::{Map, Value, json};

/// The media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// What starts every body.
const MAGIC: &[u8; 4] = b"k8s\0";

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(&include_bytes!("../../proto/k8s.fds")[..])
        .expect("the committed descriptor set decodes (agent/proto/generate.sh)")
});

/// The descriptors (with their comments: the OpenAPI models are made from them too).
pub(super) fn pool() -> &'static DescriptorPool {
    &POOL
}

const META: &str = "apimachinery.pkg.apis.meta.v1";
const UNKNOWN: &str = "apimachinery.pkg.runtime.Unknown";

/// A body this module cannot convert, with the field path it stopped at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("the body does not start with the protobuf magic \"k8s\\0\"")]
    NoMagic,
    #[error("the protobuf envelope does not decode: {0}")]
    Envelope(String),
    #[error("no protobuf schema for {api_version}/{kind}")]
    UnknownKind { api_version: String, kind: String },
    #[error("{kind}: the protobuf message does not decode: {reason}")]
    Decode { kind: String, reason: String },
    #[error("{path}: {reason}")]
    Field { path: String, reason: String },
}

fn field_error(path: &str, reason: impl Into<String>) -> ProtoError {
    ProtoError::Field {
        path: if path.is_empty() {
            "<root>".into()
        } else {
            path.into()
        },
        reason: reason.into(),
    }
}

/// The message of a kind: `metav1` kinds under any group (clients send `DeleteOptions` in the
/// group of the resource), the rest by group and version.
pub(super) fn message_for(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    const META_KINDS: &[&str] = &[
        "Status",
        "DeleteOptions",
        "CreateOptions",
        "UpdateOptions",
        "PatchOptions",
        "GetOptions",
        "ListOptions",
        "WatchEvent",
        "APIResourceList",
        "APIGroupList",
        "APIGroup",
        "APIVersions",
        "Table",
        "PartialObjectMetadata",
        "PartialObjectMetadataList",
    ];
    if META_KINDS.contains(&kind) {
        return POOL.get_message_by_name(&format!("{META}.{kind}"));
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let package = match group {
        "" => "api.core",
        "apps" => "api.apps",
        "batch" => "api.batch",
        "autoscaling" => "api.autoscaling",
        "discovery.k8s.io" => "api.discovery",
        "events.k8s.io" => "api.events",
        "policy" => "api.policy",
        "coordination.k8s.io" => "api.coordination",
        "rbac.authorization.k8s.io" => "api.rbac",
        "authorization.k8s.io" => "api.authorization",
        "authentication.k8s.io" => "api.authentication",
        "storage.k8s.io" => "api.storage",
        "meta.k8s.io" => "apimachinery.pkg.apis.meta",
        _ => return None,
    };
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    POOL.get_message_by_name(&format!("{package}.{version}.{kind}"))
}

/// Whether the server has a schema for this kind (responses of other kinds stay JSON).
pub fn knows(api_version: &str, kind: &str) -> bool {
    message_for(api_version, kind).is_some()
}

/// Go structs embedded in their parent's JSON (`json:",inline"`) that the `.proto` files give a
/// field of their own.
const INLINE: &[&str] = &[
    "api.core.v1.Probe.handler",
    "api.core.v1.Volume.volumeSource",
    "api.core.v1.PersistentVolumeSpec.persistentVolumeSource",
    "api.core.v1.EphemeralContainer.ephemeralContainerCommon",
    "api.core.v1.ConfigMapEnvSource.localObjectReference",
    "api.core.v1.ConfigMapKeySelector.localObjectReference",
    "api.core.v1.ConfigMapProjection.localObjectReference",
    "api.core.v1.ConfigMapVolumeSource.localObjectReference",
    "api.core.v1.SecretEnvSource.localObjectReference",
    "api.core.v1.SecretKeySelector.localObjectReference",
    "api.core.v1.SecretProjection.localObjectReference",
];

/// Go pointer fields of scalar or `IntOrString` type whose zero value is a value: decoded as
/// written, where other zero scalars decode as absent (see the module's doc).
const POINTERS: &[&str] = &[
    "api.core.v1.PodSpec.terminationGracePeriodSeconds",
    "api.core.v1.PodSpec.activeDeadlineSeconds",
    "api.core.v1.PodSpec.automountServiceAccountToken",
    "api.core.v1.PodSpec.shareProcessNamespace",
    "api.core.v1.PodSpec.priority",
    "api.core.v1.PodSpec.enableServiceLinks",
    "api.core.v1.PodSpec.hostUsers",
    "api.core.v1.PodSpec.setHostnameAsFQDN",
    "api.core.v1.SecurityContext.privileged",
    "api.core.v1.SecurityContext.runAsUser",
    "api.core.v1.SecurityContext.runAsGroup",
    "api.core.v1.SecurityContext.runAsNonRoot",
    "api.core.v1.SecurityContext.readOnlyRootFilesystem",
    "api.core.v1.SecurityContext.allowPrivilegeEscalation",
    "api.core.v1.PodSecurityContext.runAsUser",
    "api.core.v1.PodSecurityContext.runAsGroup",
    "api.core.v1.PodSecurityContext.runAsNonRoot",
    "api.core.v1.PodSecurityContext.fsGroup",
    "api.core.v1.Probe.terminationGracePeriodSeconds",
    "api.core.v1.ConfigMapKeySelector.optional",
    "api.core.v1.SecretKeySelector.optional",
    "api.core.v1.ConfigMapEnvSource.optional",
    "api.core.v1.SecretEnvSource.optional",
    "api.core.v1.ConfigMapVolumeSource.defaultMode",
    "api.core.v1.ConfigMapVolumeSource.optional",
    "api.core.v1.SecretVolumeSource.defaultMode",
    "api.core.v1.SecretVolumeSource.optional",
    "api.core.v1.ConfigMapProjection.optional",
    "api.core.v1.SecretProjection.optional",
    "api.core.v1.ProjectedVolumeSource.defaultMode",
    "api.core.v1.DownwardAPIVolumeSource.defaultMode",
    "api.core.v1.KeyToPath.mode",
    "api.core.v1.DownwardAPIVolumeFile.mode",
    "api.core.v1.ServiceAccountTokenProjection.expirationSeconds",
    "api.core.v1.ServiceSpec.allocateLoadBalancerNodePorts",
    "api.core.v1.ClientIPConfig.timeoutSeconds",
    "api.core.v1.ConfigMap.immutable",
    "api.core.v1.Secret.immutable",
    "api.core.v1.ContainerStatus.started",
    "api.apps.v1.DeploymentSpec.replicas",
    "api.apps.v1.DeploymentSpec.revisionHistoryLimit",
    "api.apps.v1.DeploymentSpec.progressDeadlineSeconds",
    "api.apps.v1.ReplicaSetSpec.replicas",
    "api.apps.v1.DaemonSetSpec.revisionHistoryLimit",
    "api.apps.v1.StatefulSetSpec.replicas",
    "api.apps.v1.StatefulSetSpec.revisionHistoryLimit",
    "api.apps.v1.RollingUpdateDeployment.maxSurge",
    "api.apps.v1.RollingUpdateDeployment.maxUnavailable",
    "api.apps.v1.RollingUpdateDaemonSet.maxSurge",
    "api.apps.v1.RollingUpdateDaemonSet.maxUnavailable",
    "api.apps.v1.RollingUpdateStatefulSetStrategy.partition",
    "api.apps.v1.RollingUpdateStatefulSetStrategy.maxUnavailable",
    "api.apps.v1.DeploymentStatus.collisionCount",
    "api.apps.v1.DaemonSetStatus.collisionCount",
    "api.batch.v1.JobSpec.parallelism",
    "api.batch.v1.JobSpec.completions",
    "api.batch.v1.JobSpec.activeDeadlineSeconds",
    "api.batch.v1.JobSpec.backoffLimit",
    "api.batch.v1.JobSpec.backoffLimitPerIndex",
    "api.batch.v1.JobSpec.maxFailedIndexes",
    "api.batch.v1.JobSpec.ttlSecondsAfterFinished",
    "api.batch.v1.JobSpec.suspend",
    "api.batch.v1.JobSpec.manualSelector",
    "api.batch.v1.JobStatus.ready",
    "api.batch.v1.JobStatus.terminating",
    "api.batch.v1.CronJobSpec.startingDeadlineSeconds",
    "api.batch.v1.CronJobSpec.suspend",
    "api.batch.v1.CronJobSpec.successfulJobsHistoryLimit",
    "api.batch.v1.CronJobSpec.failedJobsHistoryLimit",
    "api.autoscaling.v1.HorizontalPodAutoscalerSpec.minReplicas",
    "api.autoscaling.v1.HorizontalPodAutoscalerSpec.targetCPUUtilizationPercentage",
    "api.autoscaling.v2.HorizontalPodAutoscalerSpec.minReplicas",
    "api.autoscaling.v2.MetricTarget.averageUtilization",
    "api.autoscaling.v2.HPAScalingRules.stabilizationWindowSeconds",
    "api.discovery.v1.EndpointConditions.ready",
    "api.discovery.v1.EndpointConditions.serving",
    "api.discovery.v1.EndpointConditions.terminating",
    "api.discovery.v1.EndpointPort.port",
    "api.policy.v1.PodDisruptionBudgetSpec.minAvailable",
    "api.policy.v1.PodDisruptionBudgetSpec.maxUnavailable",
    "api.core.v1.ServiceAccount.automountServiceAccountToken",
    "api.coordination.v1.LeaseSpec.leaseDurationSeconds",
    "api.coordination.v1.LeaseSpec.leaseTransitions",
    "apimachinery.pkg.apis.meta.v1.ObjectMeta.deletionGracePeriodSeconds",
    "apimachinery.pkg.apis.meta.v1.OwnerReference.controller",
    "apimachinery.pkg.apis.meta.v1.OwnerReference.blockOwnerDeletion",
    "apimachinery.pkg.apis.meta.v1.DeleteOptions.gracePeriodSeconds",
    "apimachinery.pkg.apis.meta.v1.DeleteOptions.orphanDependents",
    "apimachinery.pkg.apis.meta.v1.ListMeta.remainingItemCount",
];

static INLINE_SET: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| INLINE.iter().copied().collect());
/// The messages with an [`INLINE`] field (one lookup per message, not one per field).
static INLINE_PARENTS: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
    INLINE
        .iter()
        .filter_map(|f| f.rsplit_once('.').map(|(message, _)| message))
        .collect()
});
static POINTER_SET: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| POINTERS.iter().copied().collect());

/// Whether `field` is a Go struct inlined into its parent's JSON ([`INLINE`]).
pub(super) fn is_inline(field: &FieldDescriptor) -> bool {
    INLINE_SET.contains(field.full_name())
}

/// Whether `field` is a Go pointer whose zero is a value ([`POINTERS`]).
fn is_pointer(field: &FieldDescriptor) -> bool {
    POINTER_SET.contains(field.full_name())
}

/// Types whose JSON form is not their message's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Special {
    Time,
    MicroTime,
    Duration,
    Quantity,
    IntOrString,
    RawExtension,
    FieldsV1,
    Verbs,
}

pub(super) fn special(message: &MessageDescriptor) -> Option<Special> {
    Some(match message.full_name() {
        "apimachinery.pkg.apis.meta.v1.Time" => Special::Time,
        "apimachinery.pkg.apis.meta.v1.MicroTime" => Special::MicroTime,
        "apimachinery.pkg.apis.meta.v1.Duration" => Special::Duration,
        "apimachinery.pkg.api.resource.Quantity" => Special::Quantity,
        "apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
        "apimachinery.pkg.runtime.RawExtension" => Special::RawExtension,
        "apimachinery.pkg.apis.meta.v1.FieldsV1" => Special::FieldsV1,
        "apimachinery.pkg.apis.meta.v1.Verbs" => Special::Verbs,
        _ => return None,
    })
}

// ---- decoding: protobuf -> JSON ----

/// Decodes a request body into the JSON object it stands for, `apiVersion` and `kind` included.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let raw = body.strip_prefix(&MAGIC[..]).ok_or(ProtoError::NoMagic)?;
    let unknown_desc = POOL
        .get_message_by_name(UNKNOWN)
        .expect("runtime.Unknown is in the descriptor set");
    let envelope = DynamicMessage::decode(unknown_desc, raw)
        .map_err(|e| ProtoError::Envelope(e.to_string()))?;
    let text = |m: &DynamicMessage, name: &str| {
        m.get_field_by_name(name)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let type_meta = envelope
        .get_field_by_name("typeMeta")
        .and_then(|v| v.as_message().cloned())
        .ok_or_else(|| ProtoError::Envelope("no typeMeta".into()))?;
    let (api_version, kind) = (text(&type_meta, "apiVersion"), text(&type_meta, "kind"));
    let encoding = text(&envelope, "contentEncoding");
    if !encoding.is_empty() {
        return Err(ProtoError::Envelope(format!(
            "contentEncoding {encoding:?} is not supported"
        )));
    }
    let payload = envelope
        .get_field_by_name("raw")
        .and_then(|v| v.as_bytes().cloned())
        .unwrap_or_default();
    let desc = message_for(&api_version, &kind).ok_or_else(|| ProtoError::UnknownKind {
        api_version: api_version.clone(),
        kind: kind.clone(),
    })?;
    let message = DynamicMessage::decode(desc, payload).map_err(|e| ProtoError::Decode {
        kind: kind.clone(),
        reason: e.to_string(),
    })?;
    let mut object = message_to_json(&message, "")?;
    if let Value::Object(map) = &mut object {
        // apiVersion and kind first, as a JSON client writes them.
        let mut out = Map::new();
        out.insert("apiVersion".into(), Value::String(api_version));
        out.insert("kind".into(), Value::String(kind));
        out.append(map);
        object = Value::Object(out);
    }
    Ok(object)
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Refuses fields this schema does not know, unless their value is zero (see the module doc).
fn check_unknown(message: &DynamicMessage, path: &str) -> Result<(), ProtoError> {
    for field in message.unknown_fields() {
        let mut bytes = Vec::new();
        field.encode(&mut bytes);
        // Skip the tag (a varint), then a zero value is all zero bytes: a varint 0, a length 0,
        // or a fixed-width 0.
        let tag_len = bytes
            .iter()
            .position(|b| b & 0x80 == 0)
            .map_or(0, |i| i + 1);
        if bytes[tag_len..].iter().any(|&b| b != 0) {
            return Err(field_error(
                path,
                format!(
                    "field number {} of {} is newer than this server's schema (Kubernetes 1.35)",
                    field.number(),
                    message.descriptor().full_name()
                ),
            ));
        }
    }
    Ok(())
}

fn message_to_json(message: &DynamicMessage, path: &str) -> Result<Value, ProtoError> {
    check_unknown(message, path)?;
    let mut out = Map::new();
    for (field, value) in message.fields() {
        let name = field.name();
        let here = join(path, name);
        if is_inline(&field) {
            if let PValue::Message(inner) = value
                && let Value::Object(fields) = message_to_json(inner, path)?
            {
                out.extend(fields);
            }
            continue;
        }
        if let Some(v) = field_to_json(&field, value, &here)? {
            out.insert(name.to_owned(), v);
        }
    }
    Ok(Value::Object(out))
}

/// A field's JSON value, or None when JSON leaves it out (zero non-pointer scalars, empty
/// lists and maps, zero times).
fn field_to_json(
    field: &FieldDescriptor,
    value: &PValue,
    path: &str,
) -> Result<Option<Value>, ProtoError> {
    let keep_zero = is_pointer(field);
    match value {
        PValue::List(items) => {
            if items.is_empty() {
                return Ok(None);
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                out.push(
                    value_to_json(item, &format!("{path}[{i}]"), true)?.unwrap_or(Value::Null),
                );
            }
            Ok(Some(Value::Array(out)))
        }
        PValue::Map(entries) => {
            if entries.is_empty() {
                return Ok(None);
            }
            let mut out = Map::new();
            for (key, item) in entries {
                let key = match key {
                    MapKey::String(s) => s.clone(),
                    other => map_key_text(other),
                };
                let v =
                    value_to_json(item, &format!("{path}[{key}]"), true)?.unwrap_or(Value::Null);
                out.insert(key, v);
            }
            Ok(Some(Value::Object(out)))
        }
        other => value_to_json(other, path, keep_zero),
    }
}

fn map_key_text(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

fn value_to_json(value: &PValue, path: &str, keep_zero: bool) -> Result<Option<Value>, ProtoError> {
    let zero = |is_zero: bool, v: Value| (keep_zero || !is_zero).then_some(v);
    Ok(match value {
        PValue::Bool(b) => zero(!b, json!(b)),
        PValue::I32(n) => zero(*n == 0, json!(n)),
        PValue::I64(n) => zero(*n == 0, json!(n)),
        PValue::U32(n) => zero(*n == 0, json!(n)),
        PValue::U64(n) => zero(*n == 0, json!(n)),
        PValue::F32(n) => zero(*n == 0.0, json!(n)),
        PValue::F64(n) => zero(*n == 0.0, json!(n)),
        PValue::EnumNumber(n) => zero(*n == 0, json!(n)),
        PValue::String(s) => zero(s.is_empty(), json!(s)),
        PValue::Bytes(b) => zero(
            b.is_empty(),
            json!(base64::engine::general_purpose::STANDARD.encode(b)),
        ),
        PValue::Message(m) => match special(&m.descriptor()) {
            Some(kind) => special_to_json(kind, m, path, keep_zero)?,
            None => Some(message_to_json(m, path)?),
        },
        PValue::List(_) | PValue::Map(_) => {
            return Err(field_error(
                path,
                "a list or map where a value was expected",
            ));
        }
    })
}

fn int_field(m: &DynamicMessage, name: &str) -> i64 {
    m.get_field_by_name(name)
        .and_then(|v| v.as_i64().or_else(|| v.as_i32().map(i64::from)))
        .unwrap_or(0)
}

fn str_field(m: &DynamicMessage, name: &str) -> String {
    m.get_field_by_name(name)
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn bytes_field(m: &DynamicMessage, name: &str) -> Vec<u8> {
    m.get_field_by_name(name)
        .and_then(|v| v.as_bytes().map(|b| b.to_vec()))
        .unwrap_or_default()
}

fn time_of(seconds: i64, nanos: i64, path: &str) -> Result<SystemTime, ProtoError> {
    let nanos = u32::try_from(nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| field_error(path, "nanos out of range"))?;
    let t = if seconds >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds.unsigned_abs(), nanos))
    } else {
        SystemTime::UNIX_EPOCH
            .checked_sub(Duration::from_secs(seconds.unsigned_abs()))
            .and_then(|t| t.checked_add(Duration::from_nanos(u64::from(nanos))))
    };
    t.ok_or_else(|| field_error(path, "time out of range"))
}

fn special_to_json(
    kind: Special,
    m: &DynamicMessage,
    path: &str,
    keep_zero: bool,
) -> Result<Option<Value>, ProtoError> {
    let empty = m.fields().next().is_none();
    Ok(match kind {
        // Go writes a zero time as an empty message, and decodes one as the zero time, which
        // JSON writes as null.
        Special::Time | Special::MicroTime if empty => None,
        Special::Time => {
            let t = time_of(int_field(m, "seconds"), 0, path)?;
            // humantime cannot print times before 1970 (the zero Go time is year 1).
            Some(json!(
                humantime::format_rfc3339_seconds(t.max(SystemTime::UNIX_EPOCH)).to_string()
            ))
        }
        Special::MicroTime => {
            let t = time_of(int_field(m, "seconds"), int_field(m, "nanos"), path)?;
            Some(json!(
                humantime::format_rfc3339_micros(t.max(SystemTime::UNIX_EPOCH)).to_string()
            ))
        }
        Special::Duration => {
            let nanos = int_field(m, "duration");
            (keep_zero || nanos != 0).then(|| json!(go_duration(nanos)))
        }
        Special::Quantity => Some(json!(str_field(m, "string"))),
        Special::IntOrString => {
            let value = if int_field(m, "type") == 1 {
                json!(str_field(m, "strVal"))
            } else {
                json!(int_field(m, "intVal"))
            };
            (keep_zero || !empty && value != json!(0) && value != json!("")).then_some(value)
        }
        Special::RawExtension | Special::FieldsV1 => {
            let raw = bytes_field(m, raw_name(kind));
            if raw.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_slice(&raw).map_err(|e| {
                        field_error(path, format!("embedded object is not JSON: {e}"))
                    })?,
                )
            }
        }
        Special::Verbs => Some(
            m.get_field_by_name("items")
                .and_then(|v| v.as_list().map(<[PValue]>::to_vec))
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.as_str().map(|s| json!(s)))
                .collect(),
        ),
    })
}

/// The bytes field of an embedded-JSON type (`FieldsV1`'s is capitalised upstream).
fn raw_name(kind: Special) -> &'static str {
    if kind == Special::FieldsV1 {
        "Raw"
    } else {
        "raw"
    }
}

/// Go's `time.Duration.String()` for the durations the API carries (`1h2m3s`, `1.5s`, `0s`).
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (unit, div) = if n < 1_000 {
            ("ns", 1)
        } else if n < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{sign}{}{unit}", fraction(n, div));
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, s) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let secs = fraction(s, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{sign}{secs}s"),
        (0, m) => format!("{sign}{m}m{secs}s"),
        (h, m) => format!("{sign}{h}h{m}m{secs}s"),
    }
}

fn fraction(n: u64, div: u64) -> String {
    let (whole, frac) = (n / div, n % div);
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

// ---- encoding: JSON -> protobuf ----

/// Encodes a JSON object (with `apiVersion` and `kind`) as a protobuf body.
pub fn encode(object: &Value) -> Result<Vec<u8>, ProtoError> {
    let text = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let desc = message_for(api_version, kind).ok_or_else(|| ProtoError::UnknownKind {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
    })?;
    let mut raw = Vec::new();
    write_message(&desc, object, &At::Root, &mut raw)?;
    let unknown_desc = POOL
        .get_message_by_name(UNKNOWN)
        .expect("runtime.Unknown is in the descriptor set");
    let type_meta_field = unknown_desc
        .get_field_by_name("typeMeta")
        .expect("runtime.Unknown has typeMeta");
    let Kind::Message(type_meta_desc) = type_meta_field.kind() else {
        unreachable!("typeMeta is a message")
    };
    let mut type_meta = DynamicMessage::new(type_meta_desc);
    type_meta.set_field_by_name("apiVersion", PValue::String(api_version.to_owned()));
    type_meta.set_field_by_name("kind", PValue::String(kind.to_owned()));
    let mut envelope = DynamicMessage::new(unknown_desc);
    envelope.set_field(&type_meta_field, PValue::Message(type_meta));
    envelope.set_field_by_name("raw", PValue::Bytes(raw.into()));
    envelope.set_field_by_name("contentEncoding", PValue::String(String::new()));
    envelope.set_field_by_name("contentType", PValue::String(String::new()));
    let mut out = MAGIC.to_vec();
    envelope
        .encode(&mut out)
        .map_err(|e| ProtoError::Envelope(e.to_string()))?;
    Ok(out)
}

/// Writes `message` (a special type's, built by [`special_from_json`]) as prost-reflect's
/// `encode` does, nested messages once each as in [`write_message`]; it holds no unknown
/// fields.
fn encode_linear(message: &DynamicMessage, out: &mut Vec<u8>) {
    for (field, value) in message.fields() {
        if !field.supports_presence() && *value == field.default_value() {
            continue;
        }
        let tag = field.number();
        match value {
            PValue::List(items) if field.is_packed() => {
                encode_packed(tag, &field.kind(), items, out)
            }
            PValue::List(items) => {
                for item in items {
                    encode_value(tag, &field.kind(), item, out);
                }
            }
            PValue::Map(entries) => {
                let Kind::Message(entry) = field.kind() else {
                    continue;
                };
                let key_kind = entry.map_entry_key_field().kind();
                let value_kind = entry.map_entry_value_field().kind();
                for (key, item) in entries {
                    let mut body = Vec::new();
                    encode_value(1, &key_kind, &map_key_value(key), &mut body);
                    encode_value(2, &value_kind, item, &mut body);
                    length_delimited(tag, &body, out);
                }
            }
            single => encode_value(tag, &field.kind(), single, out),
        }
    }
}

fn map_key_value(key: &MapKey) -> PValue {
    match key {
        MapKey::Bool(b) => PValue::Bool(*b),
        MapKey::I32(n) => PValue::I32(*n),
        MapKey::I64(n) => PValue::I64(*n),
        MapKey::U32(n) => PValue::U32(*n),
        MapKey::U64(n) => PValue::U64(*n),
        MapKey::String(s) => PValue::String(s.clone()),
    }
}

fn length_delimited(tag: u32, body: &[u8], out: &mut Vec<u8>) {
    use prost::encoding::{WireType, encode_key, encode_varint};
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

fn encode_value(tag: u32, kind: &Kind, value: &PValue, out: &mut Vec<u8>) {
    use prost::encoding as e;
    match (value, kind) {
        (PValue::Message(m), _) => {
            let mut body = Vec::new();
            encode_linear(m, &mut body);
            length_delimited(tag, &body, out);
        }
        (PValue::Bool(v), _) => e::bool::encode(tag, v, out),
        (PValue::I32(v), Kind::Sint32) => e::sint32::encode(tag, v, out),
        (PValue::I32(v), Kind::Sfixed32) => e::sfixed32::encode(tag, v, out),
        (PValue::I32(v), _) => e::int32::encode(tag, v, out),
        (PValue::I64(v), Kind::Sint64) => e::sint64::encode(tag, v, out),
        (PValue::I64(v), Kind::Sfixed64) => e::sfixed64::encode(tag, v, out),
        (PValue::I64(v), _) => e::int64::encode(tag, v, out),
        (PValue::U32(v), Kind::Fixed32) => e::fixed32::encode(tag, v, out),
        (PValue::U32(v), _) => e::uint32::encode(tag, v, out),
        (PValue::U64(v), Kind::Fixed64) => e::fixed64::encode(tag, v, out),
        (PValue::U64(v), _) => e::uint64::encode(tag, v, out),
        (PValue::F32(v), _) => e::float::encode(tag, v, out),
        (PValue::F64(v), _) => e::double::encode(tag, v, out),
        (PValue::String(v), _) => e::string::encode(tag, v, out),
        (PValue::Bytes(v), _) => e::bytes::encode(tag, v, out),
        (PValue::EnumNumber(v), _) => e::int32::encode(tag, v, out),
        // Lists and maps are fields, handled by `encode_linear`.
        (PValue::List(_) | PValue::Map(_), _) => {}
    }
}

fn encode_packed(tag: u32, kind: &Kind, items: &[PValue], out: &mut Vec<u8>) {
    use prost::encoding as e;
    macro_rules! packed {
        ($module:ident, $as:ident) => {{
            let values: Vec<_> = items.iter().filter_map(|v| v.$as()).collect();
            e::$module::encode_packed(tag, &values, out)
        }};
    }
    match kind {
        Kind::Bool => packed!(bool, as_bool),
        Kind::Int32 => packed!(int32, as_i32),
        Kind::Sint32 => packed!(sint32, as_i32),
        Kind::Sfixed32 => packed!(sfixed32, as_i32),
        Kind::Int64 => packed!(int64, as_i64),
        Kind::Sint64 => packed!(sint64, as_i64),
        Kind::Sfixed64 => packed!(sfixed64, as_i64),
        Kind::Uint32 => packed!(uint32, as_u32),
        Kind::Fixed32 => packed!(fixed32, as_u32),
        Kind::Uint64 => packed!(uint64, as_u64),
        Kind::Fixed64 => packed!(fixed64, as_u64),
        Kind::Float => packed!(float, as_f32),
        Kind::Double => packed!(double, as_f64),
        Kind::Enum(_) => packed!(int32, as_enum_number),
        _ => {
            for item in items {
                encode_value(tag, kind, item, out);
            }
        }
    }
}

/// The inline fields of a message, with the JSON names each takes.
fn inline_fields(desc: &MessageDescriptor) -> Vec<(FieldDescriptor, MessageDescriptor)> {
    if !INLINE_PARENTS.contains(desc.full_name()) {
        return Vec::new();
    }
    desc.fields()
        .filter(is_inline)
        .filter_map(|f| match f.kind() {
            Kind::Message(m) => Some((f, m)),
            _ => None,
        })
        .collect()
}

/// Whether a JSON name belongs to a message, directly or through its inline fields.
fn owns_name(desc: &MessageDescriptor, name: &str) -> bool {
    desc.get_field_by_name(name).is_some()
        || inline_fields(desc)
            .iter()
            .any(|(_, inner)| owns_name(inner, name))
}

/// Where a value is in the object being encoded, rendered only for an error
/// (`spec.containers[0].image`): encoding a list of 1,000 pods made a string per field.
#[derive(Clone, Copy)]
enum At<'a> {
    Root,
    Field(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
    Key(&'a At<'a>, &'a str),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Root => Ok(()),
            At::Field(At::Root, name) => write!(f, "{name}"),
            At::Field(parent, name) => write!(f, "{parent}.{name}"),
            At::Index(parent, i) => write!(f, "{parent}[{i}]"),
            At::Key(parent, key) => write!(f, "{parent}[{key}]"),
        }
    }
}

/// Writes the JSON object `value` as the message `desc` in the protobuf wire format, in one
/// pass: each nested message is written once, into a buffer of its own, then copied after its
/// length (no intermediate `DynamicMessage`, which cost a 1,000-pod list 219 ms where its JSON
/// text takes 10: an allocation per field, and prost's length of each nested message asked
/// again at every level above it). Fields are written in the object's order, which decoders
/// accept; values through `prost::encoding`.
fn write_message(
    desc: &MessageDescriptor,
    value: &Value,
    path: &At<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ProtoError> {
    let Value::Object(map) = value else {
        return Err(field_error(&path.to_string(), "expected an object"));
    };
    let inline = inline_fields(desc);
    let mut inline_parts: Vec<Map<String, Value>> = vec![Map::new(); inline.len()];
    for (name, v) in map {
        if v.is_null() {
            continue;
        }
        if let Some(field) = desc.get_field_by_name(name)
            && (inline.is_empty() || !is_inline(&field))
        {
            write_field(&field, v, &At::Field(path, name), out)?;
        } else if let Some(i) = inline.iter().position(|(_, inner)| owns_name(inner, name)) {
            inline_parts[i].insert(name.clone(), v.clone());
        }
        // Anything else (apiVersion and kind, which the envelope carries, or a field this
        // schema lacks) is not written, as a Go client would drop it.
    }
    for ((field, inner), part) in inline.iter().zip(inline_parts) {
        if !part.is_empty() {
            let mut body = Vec::new();
            write_message(inner, &Value::Object(part), path, &mut body)?;
            length_delimited(field.number(), &body, out);
        }
    }
    Ok(())
}

fn write_field(
    field: &FieldDescriptor,
    v: &Value,
    path: &At<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ProtoError> {
    let tag = field.number();
    if field.is_map() {
        let Value::Object(entries) = v else {
            return Err(field_error(&path.to_string(), "expected an object"));
        };
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
        let value_kind = value_field.kind();
        for (key, item) in entries {
            let mut body = Vec::new();
            let key_value = json_to_value(&key_field.kind(), &Value::String(key.clone()), path)?;
            encode_value(key_field.number(), &key_field.kind(), &key_value, &mut body);
            write_value(
                value_field.number(),
                &value_kind,
                item,
                &At::Key(path, key),
                &mut body,
            )?;
            length_delimited(tag, &body, out);
        }
        return Ok(());
    }
    if field.is_list() {
        let Value::Array(items) = v else {
            return Err(field_error(&path.to_string(), "expected a list"));
        };
        let kind = field.kind();
        if field.is_packed() {
            let values = items
                .iter()
                .enumerate()
                .map(|(i, item)| json_to_value(&kind, item, &At::Index(path, i)))
                .collect::<Result<Vec<_>, _>>()?;
            encode_packed(tag, &kind, &values, out);
        } else {
            for (i, item) in items.iter().enumerate() {
                write_value(tag, &kind, item, &At::Index(path, i), out)?;
            }
        }
        return Ok(());
    }
    write_value(tag, &field.kind(), v, path, out)
}

fn write_value(
    tag: u32,
    kind: &Kind,
    v: &Value,
    path: &At<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ProtoError> {
    match kind {
        Kind::Message(desc) => {
            let mut body = Vec::new();
            match special(desc) {
                Some(s) => encode_linear(&special_from_json(s, desc, v, path)?, &mut body),
                None => write_message(desc, v, path, &mut body)?,
            }
            length_delimited(tag, &body, out);
        }
        scalar => encode_value(tag, scalar, &json_to_value(scalar, v, path)?, out),
    }
    Ok(())
}

fn json_to_value(kind: &Kind, v: &Value, path: &At<'_>) -> Result<PValue, ProtoError> {
    let int = |min: i64, max: i64| -> Result<i64, ProtoError> {
        v.as_i64()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| {
                field_error(
                    &path.to_string(),
                    format!("expected an integer in {min}..={max}"),
                )
            })
    };
    Ok(match kind {
        Kind::Bool => PValue::Bool(
            v.as_bool()
                .ok_or_else(|| field_error(&path.to_string(), "expected a boolean"))?,
        ),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            PValue::I32(int(i32::MIN.into(), i32::MAX.into())? as i32)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => PValue::I64(int(i64::MIN, i64::MAX)?),
        Kind::Uint32 | Kind::Fixed32 => PValue::U32(int(0, u32::MAX.into())? as u32),
        Kind::Uint64 | Kind::Fixed64 => PValue::U64(
            v.as_u64()
                .ok_or_else(|| field_error(&path.to_string(), "expected a non-negative integer"))?,
        ),
        Kind::Double => PValue::F64(
            v.as_f64()
                .ok_or_else(|| field_error(&path.to_string(), "expected a number"))?,
        ),
        Kind::Float => PValue::F32(
            v.as_f64()
                .ok_or_else(|| field_error(&path.to_string(), "expected a number"))?
                as f32,
        ),
        Kind::String => PValue::String(
            v.as_str()
                .ok_or_else(|| field_error(&path.to_string(), "expected a string"))?
                .to_owned(),
        ),
        Kind::Bytes => {
            let text = v
                .as_str()
                .ok_or_else(|| field_error(&path.to_string(), "expected a base64 string"))?;
            PValue::Bytes(
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| field_error(&path.to_string(), format!("not base64: {e}")))?
                    .into(),
            )
        }
        Kind::Enum(_) => PValue::EnumNumber(int(i32::MIN.into(), i32::MAX.into())? as i32),
        // Messages are written by `write_value`.
        Kind::Message(_) => return Err(field_error(&path.to_string(), "expected a scalar")),
    })
}

fn special_from_json(
    kind: Special,
    desc: &MessageDescriptor,
    v: &Value,
    path: &At<'_>,
) -> Result<DynamicMessage, ProtoError> {
    let mut m = DynamicMessage::new(desc.clone());
    let since_epoch = |text: &str| -> Result<Duration, ProtoError> {
        humantime::parse_rfc3339(text)
            .map_err(|e| {
                field_error(
                    &path.to_string(),
                    format!("{text:?} is not an RFC 3339 UTC time: {e}"),
                )
            })?
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|_| field_error(&path.to_string(), "a time before 1970"))
    };
    let text = || {
        v.as_str()
            .ok_or_else(|| field_error(&path.to_string(), "expected a string"))
    };
    match kind {
        Special::Time => {
            let d = since_epoch(text()?)?;
            m.set_field_by_name("seconds", PValue::I64(d.as_secs() as i64));
        }
        Special::MicroTime => {
            let d = since_epoch(text()?)?;
            m.set_field_by_name("seconds", PValue::I64(d.as_secs() as i64));
            m.set_field_by_name("nanos", PValue::I32(d.subsec_nanos() as i32));
        }
        Special::Duration => {
            let d = humantime::parse_duration(text()?)
                .map_err(|e| field_error(&path.to_string(), format!("not a duration: {e}")))?;
            let nanos = i64::try_from(d.as_nanos())
                .map_err(|_| field_error(&path.to_string(), "duration out of range"))?;
            m.set_field_by_name("duration", PValue::I64(nanos));
        }
        Special::Quantity => {
            let q = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(field_error(&path.to_string(), "expected a quantity")),
            };
            m.set_field_by_name("string", PValue::String(q));
        }
        Special::IntOrString => match v {
            Value::String(s) => {
                m.set_field_by_name("type", PValue::I64(1));
                m.set_field_by_name("strVal", PValue::String(s.clone()));
            }
            Value::Number(_) => {
                let n = v
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| field_error(&path.to_string(), "expected a 32-bit integer"))?;
                m.set_field_by_name("type", PValue::I64(0));
                m.set_field_by_name("intVal", PValue::I32(n));
            }
            _ => {
                return Err(field_error(
                    &path.to_string(),
                    "expected an integer or a string",
                ));
            }
        },
        Special::RawExtension | Special::FieldsV1 => {
            m.set_field_by_name(
                raw_name(kind),
                PValue::Bytes(v.to_string().into_bytes().into()),
            );
        }
        Special::Verbs => {
            let Value::Array(items) = v else {
                return Err(field_error(&path.to_string(), "expected a list of strings"));
            };
            let verbs = items
                .iter()
                .map(|i| {
                    i.as_str()
                        .map(|s| PValue::String(s.to_owned()))
                        .ok_or_else(|| field_error(&path.to_string(), "expected a list of strings"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            m.set_field_by_name("items", PValue::List(verbs));
        }
    }
    Ok(m)
}

// ---- the schema: which fields a kind has ----

/// The fields of `object` that its kind's schema (Kubernetes' own 1.35 descriptors) does not
/// have, as paths (`spec.containers[0].imagee`), removed from `object` when `prune` (as the
/// apiserver drops what it cannot decode); `None` when the server has no schema for the kind.
/// `status` is not looked at: it is observed, never what a write sets.
pub fn unknown_fields(object: &mut Value, prune: bool) -> Option<Vec<String>> {
    let text = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or("");
    let desc = message_for(text("apiVersion"), text("kind"))?;
    let mut unknown = Vec::new();
    let Value::Object(map) = object else {
        return Some(unknown);
    };
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        if matches!(key.as_str(), "apiVersion" | "kind" | "status") {
            continue;
        }
        walk_field(&desc, map, &key, "", prune, &mut unknown);
    }
    Some(unknown)
}

/// The field `name` of `desc`, through its inline fields (the Go structs inlined in JSON).
fn resolve(desc: &MessageDescriptor, name: &str) -> Option<FieldDescriptor> {
    if let Some(field) = desc.get_field_by_name(name).filter(|f| !is_inline(f)) {
        return Some(field);
    }
    inline_fields(desc)
        .iter()
        .find_map(|(_, inner)| resolve(inner, name))
}

fn walk_field(
    desc: &MessageDescriptor,
    map: &mut Map<String, Value>,
    key: &str,
    path: &str,
    prune: bool,
    unknown: &mut Vec<String>,
) {
    let here = join(path, key);
    let Some(field) = resolve(desc, key) else {
        if map.get(key).is_some_and(|v| !v.is_null()) {
            unknown.push(here);
            if prune {
                map.remove(key);
            }
        }
        return;
    };
    let Some(value) = map.get_mut(key) else {
        return;
    };
    let message = |kind: Kind| match kind {
        Kind::Message(m) if special(&m).is_none() => Some(m),
        _ => None,
    };
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return;
        };
        if let (Some(inner), Value::Object(entries)) =
            (message(entry.map_entry_value_field().kind()), value)
        {
            for (k, v) in entries.iter_mut() {
                walk(&inner, v, &format!("{here}[{k}]"), prune, unknown);
            }
        }
    } else if field.is_list() {
        if let (Some(inner), Value::Array(items)) = (message(field.kind()), value) {
            for (i, v) in items.iter_mut().enumerate() {
                walk(&inner, v, &format!("{here}[{i}]"), prune, unknown);
            }
        }
    } else if let Some(inner) = message(field.kind()) {
        walk(&inner, value, &here, prune, unknown);
    }
}

fn walk(
    desc: &MessageDescriptor,
    value: &mut Value,
    path: &str,
    prune: bool,
    unknown: &mut Vec<String>,
) {
    let Value::Object(map) = value else {
        return;
    };
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        walk_field(desc, map, &key, path, prune, unknown);
    }
}

/// Whether a client asks for protobuf first (client-go's typed clients send
/// `application/vnd.kubernetes.protobuf, */*`; a JSON-first client gets JSON).
pub fn prefers_protobuf(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .map(|first| first.split(';').next().unwrap_or("").trim())
        .is_some_and(|t| t == MEDIA_TYPE)
}

#[cfg(test)]
mod tests;
