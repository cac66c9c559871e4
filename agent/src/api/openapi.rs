//! The models of the OpenAPI v3 documents (`/openapi/v3/...`): what `kubectl explain` reads.
//!
//! They are generated from the protobuf descriptors that also convert the bodies
//! ([`super::protobuf`]). Those are Kubernetes' own `.proto` files with their comments, so the
//! models have the field descriptions of Kubernetes' documents, and the markers in the comments
//! (`+patchMergeKey=name`, `+listType=map`, ...) become the `x-kubernetes-*` extensions that the
//! apiserver publishes from the same markers. Only what the descriptors say is published: no
//! `required` lists, and no `default`s (the API fills those in, `validation::default`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::LazyLock;

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use super::protobuf::{self, Special};

/// The component name of a message: Kubernetes' (`io.k8s.api.core.v1.Pod`) from the package
/// name the descriptors use (`api.core.v1.Pod`).
pub fn schema_name(message: &MessageDescriptor) -> String {
    format!("io.k8s.{}", message.full_name())
}

/// A comment's text without its `+marker` lines, and the markers (`name` → value).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Comment {
    text: String,
    markers: BTreeMap<String, String>,
}

fn parse_comment(raw: &str) -> Comment {
    let mut comment = Comment::default();
    let mut lines = Vec::new();
    for line in raw.lines() {
        let line = line.trim();
        if let Some(marker) = line.strip_prefix('+') {
            let (name, value) = marker.split_once('=').unwrap_or((marker, ""));
            comment
                .markers
                .insert(name.trim().to_owned(), value.trim().to_owned());
        } else {
            lines.push(line);
        }
    }
    comment.text = lines.join("\n").trim().to_owned();
    comment
}

/// Every commented element of every file of the descriptor set: (file, path) → its comment.
static COMMENTS: LazyLock<HashMap<(String, Vec<i32>), Comment>> = LazyLock::new(|| {
    let mut all = HashMap::new();
    for file in protobuf::pool().files() {
        let proto = file.file_descriptor_proto();
        for location in proto
            .source_code_info
            .iter()
            .flat_map(|info| &info.location)
        {
            if let Some(raw) = location.leading_comments.as_deref() {
                all.insert(
                    (file.name().to_owned(), location.path.clone()),
                    parse_comment(raw),
                );
            }
        }
    }
    all
});

fn message_comment(message: &MessageDescriptor) -> Option<&'static Comment> {
    COMMENTS.get(&(
        message.parent_file().name().to_owned(),
        message.path().to_vec(),
    ))
}

fn field_comment(field: &FieldDescriptor) -> Option<&'static Comment> {
    COMMENTS.get(&(field.parent_file().name().to_owned(), field.path().to_vec()))
}

/// The schema of a type whose JSON form is not its message's.
fn special_schema(special: Special) -> Value {
    match special {
        Special::Time | Special::MicroTime => json!({"type": "string", "format": "date-time"}),
        Special::Duration | Special::Quantity => json!({"type": "string"}),
        Special::IntOrString => json!({"type": "string", "format": "int-or-string"}),
        Special::RawExtension | Special::FieldsV1 => json!({"type": "object"}),
        Special::Verbs => json!({"type": "array", "items": {"type": "string"}}),
    }
}

/// The schema of one value of `kind`; a message is a reference, queued in `wanted`.
fn value_schema(kind: &Kind, wanted: &mut VecDeque<MessageDescriptor>) -> Value {
    match kind {
        Kind::Message(message) => match protobuf::special(message) {
            Some(special) => special_schema(special),
            None => {
                wanted.push_back(message.clone());
                json!({"$ref": format!("#/components/schemas/{}", schema_name(message))})
            }
        },
        Kind::String | Kind::Enum(_) => json!({"type": "string"}),
        Kind::Bytes => json!({"type": "string", "format": "byte"}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 | Kind::Uint32 | Kind::Fixed32 => {
            json!({"type": "integer", "format": "int32"})
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => {
            json!({"type": "integer", "format": "int64"})
        }
        Kind::Double | Kind::Float => json!({"type": "number", "format": "double"}),
    }
}

/// The `x-kubernetes-*` extensions the apiserver publishes for these markers.
fn extensions(markers: &BTreeMap<String, String>, schema: &mut Map<String, Value>) {
    for (marker, extension) in [
        ("patchMergeKey", "x-kubernetes-patch-merge-key"),
        ("patchStrategy", "x-kubernetes-patch-strategy"),
        ("listType", "x-kubernetes-list-type"),
        ("mapType", "x-kubernetes-map-type"),
    ] {
        if let Some(value) = markers.get(marker).filter(|v| !v.is_empty()) {
            schema.insert(extension.to_owned(), json!(value));
        }
    }
    if let Some(keys) = markers.get("listMapKey").filter(|v| !v.is_empty()) {
        schema.insert("x-kubernetes-list-map-keys".to_owned(), json!([keys]));
    }
}

fn field_schema(field: &FieldDescriptor, wanted: &mut VecDeque<MessageDescriptor>) -> Value {
    let mut schema = if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        json!({"type": "object", "additionalProperties": value_schema(&entry.map_entry_value_field().kind(), wanted)})
    } else if field.is_list() {
        json!({"type": "array", "items": value_schema(&field.kind(), wanted)})
    } else {
        value_schema(&field.kind(), wanted)
    };
    let Some(comment) = field_comment(field) else {
        return schema;
    };
    // A described reference is written as Kubernetes writes it: `allOf` around the `$ref`
    // (OpenAPI 3.0 ignores the siblings of a `$ref`).
    if schema.get("$ref").is_some() {
        schema = json!({"allOf": [schema]});
    }
    if let Some(map) = schema.as_object_mut() {
        if !comment.text.is_empty() {
            map.insert("description".into(), json!(comment.text));
        }
        extensions(&comment.markers, map);
    }
    schema
}

/// The properties of `message` as its JSON has them: the fields of an inlined Go struct are its
/// parent's ([`protobuf::is_inline`]).
fn properties(
    message: &MessageDescriptor,
    wanted: &mut VecDeque<MessageDescriptor>,
    out: &mut Map<String, Value>,
) {
    for field in message.fields() {
        if protobuf::is_inline(&field) {
            if let Kind::Message(inner) = field.kind() {
                properties(&inner, wanted, out);
            }
            continue;
        }
        out.insert(field.name().to_owned(), field_schema(&field, wanted));
    }
}

fn message_schema(message: &MessageDescriptor, wanted: &mut VecDeque<MessageDescriptor>) -> Value {
    let mut props = Map::new();
    properties(message, wanted, &mut props);
    let mut schema = Map::new();
    if let Some(comment) = message_comment(message)
        && !comment.text.is_empty()
    {
        schema.insert("description".into(), json!(comment.text));
    }
    schema.insert("type".into(), json!("object"));
    if !props.is_empty() {
        schema.insert("properties".into(), Value::Object(props));
    }
    Value::Object(schema)
}

/// The component schemas of the kinds `roots` (group, version, kind) and of every message
/// they reach. A kind without a message is left out (the caller keeps its open schema).
pub fn schemas(roots: &[(&str, &str, &str)]) -> Map<String, Value> {
    let mut wanted = VecDeque::new();
    let mut kinds: HashMap<String, Vec<Value>> = HashMap::new();
    for (group, version, kind) in roots {
        let api_version = if group.is_empty() {
            (*version).to_owned()
        } else {
            format!("{group}/{version}")
        };
        if let Some(message) = protobuf::message_for(&api_version, kind) {
            kinds
                .entry(schema_name(&message))
                .or_default()
                .push(json!({"group": group, "version": version, "kind": kind}));
            wanted.push_back(message);
        }
    }
    let mut out = Map::new();
    while let Some(message) = wanted.pop_front() {
        let name = schema_name(&message);
        if out.contains_key(&name) {
            continue;
        }
        let mut schema = message_schema(&message, &mut wanted);
        if let Some(gvks) = kinds.remove(&name) {
            schema["x-kubernetes-group-version-kind"] = Value::Array(gvks);
        }
        out.insert(name, schema);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` in `value`.
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn comment_markers_become_extensions_and_leave_the_text() {
        let c = parse_comment(
            " List of containers belonging to the pod.\n Cannot be updated.\n +patchMergeKey=name\n +patchStrategy=merge\n +listType=map\n +listMapKey=name\n",
        );
        assert_eq!(
            c.text,
            "List of containers belonging to the pod.\nCannot be updated."
        );
        let mut schema = Map::new();
        extensions(&c.markers, &mut schema);
        assert_eq!(
            Value::Object(schema),
            json!({"x-kubernetes-patch-merge-key": "name", "x-kubernetes-patch-strategy": "merge",
                   "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
        );
    }

    #[test]
    fn the_models_of_a_kind_are_closed_described_and_marked_as_kubernetes_publishes_them() {
        let all = schemas(&[
            ("", "v1", "Pod"),
            ("apps", "v1", "Deployment"),
            ("", "v1", "Nope"),
        ]);
        let pod = &all["io.k8s.api.core.v1.Pod"];
        assert_eq!(
            pod["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Pod"}])
        );
        assert!(
            pod["description"]
                .as_str()
                .unwrap()
                .contains("Pod is a collection of containers")
        );
        assert_eq!(
            pod["properties"]["spec"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.PodSpec"
        );
        let containers = &all["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["type"], "array");
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        assert!(!containers["description"].as_str().unwrap().contains('+'));
        let container = &all["io.k8s.api.core.v1.Container"]["properties"];
        assert_eq!(container["image"]["type"], "string");
        assert!(
            container["image"]["description"]
                .as_str()
                .unwrap()
                .contains("Container image name")
        );
        // Types whose JSON is not their message's, and a Go struct inlined into its parent.
        let meta = &all["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"];
        assert_eq!(meta["creationTimestamp"]["format"], "date-time");
        assert_eq!(meta["labels"]["additionalProperties"]["type"], "string");
        let probe = &all["io.k8s.api.core.v1.Probe"]["properties"];
        assert!(probe["httpGet"].is_object() && probe["handler"].is_null());
        let port = &all["io.k8s.api.core.v1.HTTPGetAction"]["properties"]["port"];
        assert_eq!(port["format"], "int-or-string");
        let strategy = &all["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["strategy"];
        assert!(strategy["allOf"].is_array());
        // Closed: every reference names a schema of the document.
        let mut found = Vec::new();
        for schema in all.values() {
            refs(schema, &mut found);
        }
        assert!(found.len() > 100, "{}", found.len());
        for r in found {
            let name = r.strip_prefix("#/components/schemas/").unwrap();
            assert!(all.contains_key(name), "{r} is not in the document");
        }
        assert!(!all.keys().any(|k| k.contains("Nope")));
    }
}
