//! Validation and normalisation of incoming objects, like the apiserver's: errors name the field
//! (`metadata.name: Required value`), and server-owned fields are stripped before storage.

use serde_json::{Map, Value};

use crate::kind::{self, KindInfo, ObjectKey};
use crate::labels;

/// Largest object accepted, in bytes of JSON (Kubernetes' default request limit is 1.5 MiB).
pub const MAX_OBJECT_BYTES: usize = 3 * 512 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("no kind {kind:?} is registered for version {api_version:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("object is {size} bytes; the limit is {max} bytes")]
    TooLarge { size: usize, max: usize },
}

impl ObjectError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The field the error is about, when it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::UnknownKind { .. } => Some("kind"),
            Self::TooLarge { .. } => None,
        }
    }
}

/// An object that passed validation, ready to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidObject {
    pub info: &'static KindInfo,
    pub key: ObjectKey,
    /// The object without server-owned fields (status, uid, resourceVersion, …).
    pub body: Value,
    /// `metadata.uid` the client sent: a write precondition.
    pub uid: Option<String>,
    /// `metadata.resourceVersion` the client sent: an optimistic-concurrency precondition.
    pub resource_version: Option<String>,
}

/// Fields the server owns: never stored from a client's object.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
];

fn str_field<'a>(
    obj: &'a Map<String, Value>,
    field: &str,
    path: &str,
) -> Result<Option<&'a str>, ObjectError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ObjectError::invalid(
            path,
            format!("Invalid value: expected a string, got {}", type_name(other)),
        )),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string_map(
    meta: &Map<String, Value>,
    field: &str,
) -> Result<Vec<(String, String)>, ObjectError> {
    let path = format!("metadata.{field}");
    match meta.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(ObjectError::invalid(
                    format!("{path}.{k}"),
                    format!("Invalid value: expected a string, got {}", type_name(other)),
                )),
            })
            .collect(),
        Some(other) => Err(ObjectError::invalid(
            path,
            format!(
                "Invalid value: expected an object, got {}",
                type_name(other)
            ),
        )),
    }
}

/// Validates `object`, defaults its namespace to `default_namespace` for namespaced kinds, and
/// strips server-owned fields.
pub fn validate(mut object: Value, default_namespace: &str) -> Result<ValidObject, ObjectError> {
    let size = serde_json::to_vec(&object)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_OBJECT_BYTES {
        return Err(ObjectError::TooLarge {
            size,
            max: MAX_OBJECT_BYTES,
        });
    }
    let Value::Object(top) = &mut object else {
        return Err(ObjectError::invalid(
            "<root>",
            "Invalid value: expected a JSON object",
        ));
    };
    let api_version = str_field(top, "apiVersion", "apiVersion")?
        .ok_or_else(|| ObjectError::invalid("apiVersion", "Required value"))?
        .to_owned();
    let kind_name = str_field(top, "kind", "kind")?
        .ok_or_else(|| ObjectError::invalid("kind", "Required value"))?
        .to_owned();
    let info = kind::lookup(&api_version, &kind_name).ok_or(ObjectError::UnknownKind {
        api_version,
        kind: kind_name,
    })?;
    top.remove("status");
    let meta = match top.get_mut("metadata") {
        Some(Value::Object(meta)) => meta,
        None | Some(Value::Null) => {
            return Err(ObjectError::invalid("metadata.name", "Required value"));
        }
        Some(other) => {
            return Err(ObjectError::invalid(
                "metadata",
                format!(
                    "Invalid value: expected an object, got {}",
                    type_name(other)
                ),
            ));
        }
    };
    let name = str_field(meta, "name", "metadata.name")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ObjectError::invalid("metadata.name", "Required value"))?
        .to_owned();
    labels::check_object_name(info.group, &name).map_err(|r| {
        ObjectError::invalid("metadata.name", format!("Invalid value: {name:?}: {r}"))
    })?;
    let namespace = if info.namespaced {
        let ns = str_field(meta, "namespace", "metadata.namespace")?
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace)
            .to_owned();
        labels::check_dns_label(&ns).map_err(|r| {
            ObjectError::invalid("metadata.namespace", format!("Invalid value: {ns:?}: {r}"))
        })?;
        meta.insert("namespace".into(), Value::String(ns.clone()));
        ns
    } else {
        meta.remove("namespace");
        String::new()
    };
    for (k, v) in string_map(meta, "labels")? {
        labels::validate_key(&k)
            .map_err(|e| ObjectError::invalid(format!("metadata.labels.{k}"), e.to_string()))?;
        labels::validate_value(&k, &v)
            .map_err(|e| ObjectError::invalid(format!("metadata.labels.{k}"), e.to_string()))?;
    }
    for (k, _) in string_map(meta, "annotations")? {
        labels::validate_key(&k).map_err(|e| {
            ObjectError::invalid(format!("metadata.annotations.{k}"), e.to_string())
        })?;
    }
    let uid = str_field(meta, "uid", "metadata.uid")?.map(str::to_owned);
    let resource_version =
        str_field(meta, "resourceVersion", "metadata.resourceVersion")?.map(str::to_owned);
    for field in SERVER_METADATA {
        meta.remove(*field);
    }
    Ok(ValidObject {
        info,
        key: ObjectKey::new(info, &namespace, &name),
        body: object,
        uid,
        resource_version,
    })
}

/// Formats up to 16 bytes as a UUID string (`8-4-4-4-12` hex digits), left-padding with zeros.
pub fn uuid_string(bytes: &[u8]) -> String {
    let h = format!("{:0>32}", hex::encode(&bytes[..bytes.len().min(16)]));
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn accepts_and_normalises() {
        let v = validate(
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "uid": "x", "resourceVersion": "7", "labels": {"app": "web"}},
                   "spec": {"replicas": 2}, "status": {"replicas": 1}}),
            "default",
        )
        .unwrap();
        assert_eq!(v.key.to_string(), "Deployment.apps default/web");
        assert_eq!(v.uid.as_deref(), Some("x"));
        assert_eq!(v.resource_version.as_deref(), Some("7"));
        assert_eq!(v.body["metadata"]["namespace"], "default");
        assert!(v.body.get("status").is_none());
        assert!(v.body["metadata"].get("uid").is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!([1]), "<root>"),
            (
                json!({"kind": "Pod", "metadata": {"name": "a"}}),
                "apiVersion: Required value",
            ),
            (
                json!({"apiVersion": "v1", "metadata": {"name": "a"}}),
                "kind: Required value",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "a"}}),
                "no kind \"Widget\"",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod"}),
                "metadata.name: Required value",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": 3}}),
                "metadata.name: Invalid value",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Bad_Name"}}),
                "metadata.name: Invalid value",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "a.b"}}),
                "metadata.namespace",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "labels": {"app": 1}}}),
                "metadata.labels.app",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "labels": {"app": "a b"}}}),
                "metadata.labels.app",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "annotations": {"-x": "1"}}}),
                "metadata.annotations.-x",
            ),
        ];
        for (input, expected) in cases {
            let err = validate(input.clone(), "default").unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{input}: expected {expected:?} in {err:?}"
            );
        }
    }

    #[test]
    fn rejects_oversized_objects() {
        let big = "x".repeat(MAX_OBJECT_BYTES);
        let err = validate(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": big}}),
            "default",
        )
        .unwrap_err();
        assert!(matches!(err, ObjectError::TooLarge { .. }), "{err}");
    }
}
