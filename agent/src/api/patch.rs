//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and Kubernetes'
//! strategic merge patch (lists merged by their merge keys, `$patch` directives).

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("the patch is not valid: {0}")]
    Malformed(String),
    #[error("JSON patch operation {index} ({op} {path}): {reason}")]
    Operation {
        index: usize,
        op: String,
        path: String,
        reason: String,
    },
}

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target_map = target.as_object_mut().expect("made an object");
    for (k, v) in patch_map {
        if v.is_null() {
            target_map.remove(k);
        } else {
            merge_patch(target_map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The merge key of a list at `field` (its last path segment), as Kubernetes' schemas declare.
fn merge_key(path: &[String], field: &str) -> Option<&'static str> {
    let parent = path.last().map(String::as_str).unwrap_or("");
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "conditions" => Some(if field == "conditions" {
            "type"
        } else {
            "name"
        }),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" if parent == "spec" => Some("port"), // Service ports
        "ports" => Some("containerPort"),
        "tolerations" | "topologySpreadConstraints" => None,
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        _ => None,
    }
}

/// Strategic merge patch: like a merge patch, but lists with a merge key are merged element by
/// element, `$patch: delete` removes an element, `$patch: replace` replaces a map or list, and
/// `$setElementOrder`/`$retainKeys` directives are accepted (order hints are not applied).
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    smp(target, patch, &mut Vec::new())
}

fn smp(target: &mut Value, patch: &Value, path: &mut Vec<String>) -> Result<(), PatchError> {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replacement = patch_map.clone();
        replacement.remove("$patch");
        *target = Value::Object(replacement);
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let retain: Option<Vec<String>> =
        patch_map
            .get("$retainKeys")
            .and_then(Value::as_array)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect()
            });
    let target_map = target.as_object_mut().expect("made an object");
    for (k, v) in patch_map {
        if k.starts_with('$') {
            continue;
        }
        if let Some(list_field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(gone)) =
                (target_map.get_mut(list_field), v)
            {
                items.retain(|i| !gone.contains(i));
            }
            continue;
        }
        if v.is_null() {
            target_map.remove(k);
            continue;
        }
        path.push(k.clone());
        match (
            target_map.get_mut(k),
            v,
            merge_key(&path[..path.len() - 1], k),
        ) {
            (Some(Value::Array(current)), Value::Array(items), Some(key)) => {
                merge_list(current, items, key, path)?;
            }
            (Some(existing), Value::Object(_), _) => smp(existing, v, path)?,
            (_, Value::Array(items), Some(key)) => {
                let mut list = Vec::new();
                merge_list(&mut list, items, key, path)?;
                target_map.insert(k.clone(), Value::Array(list));
            }
            _ => {
                let mut fresh = Value::Null;
                smp(&mut fresh, v, path)?;
                target_map.insert(k.clone(), strip_directives(fresh));
            }
        }
        path.pop();
    }
    if let Some(keep) = retain {
        target_map.retain(|k, _| keep.contains(k));
    }
    Ok(())
}

fn strip_directives(mut v: Value) -> Value {
    if let Value::Object(map) = &mut v {
        map.retain(|k, _| !k.starts_with('$'));
        for child in map.values_mut() {
            *child = strip_directives(child.take());
        }
    }
    v
}

fn merge_list(
    current: &mut Vec<Value>,
    patch: &[Value],
    key: &str,
    path: &mut Vec<String>,
) -> Result<(), PatchError> {
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *current = patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .cloned()
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    for item in patch {
        let Some(id) = item.get(key) else {
            return Err(PatchError::Malformed(format!(
                "{}: element without its merge key {key:?}",
                path.join(".")
            )));
        };
        let position = current.iter().position(|c| c.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                current.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => smp(&mut current[i], item, path)?,
            (None, false) => current.push(strip_directives(item.clone())),
        }
    }
    Ok(())
}

/// Bytes `v` takes as JSON (counted, not written).
fn json_size(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

/// The most a JSON patch may grow a document to while it applies: twice the largest object,
/// so `copy` and `add` cannot double a document into memory exhaustion before the size check
/// of the result would refuse it.
pub const MAX_PATCHED_BYTES: usize = 2 * shoal_state::object::MAX_OBJECT_BYTES;

/// RFC 6902 JSON patch.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let Value::Array(ops) = ops else {
        return Err(PatchError::Malformed(
            "a JSON patch is an array of operations".into(),
        ));
    };
    // An upper bound of the document's size as it grows (removals not subtracted).
    let mut size = json_size(target);
    let mut grow = |index: usize, by: &Value| {
        size = size.saturating_add(json_size(by));
        if size > MAX_PATCHED_BYTES {
            return Err(PatchError::Malformed(format!(
                "operation {index} would grow the object beyond {MAX_PATCHED_BYTES} bytes"
            )));
        }
        Ok(())
    };
    for (index, op) in ops.iter().enumerate() {
        let name = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op.get("path").and_then(Value::as_str).unwrap_or("");
        let fail = |reason: &str| PatchError::Operation {
            index,
            op: name.to_owned(),
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let pointer = parse_pointer(path).map_err(|r| fail(&r))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| fail("missing \"value\""))
        };
        match name {
            "add" => {
                let v = value()?;
                grow(index, &v)?;
                add(target, &pointer, v).map_err(|r| fail(&r))?
            }
            "remove" => {
                remove(target, &pointer).map_err(|r| fail(&r))?;
            }
            "replace" => {
                remove(target, &pointer).map_err(|r| fail(&r))?;
                let v = value()?;
                grow(index, &v)?;
                add(target, &pointer, v).map_err(|r| fail(&r))?;
            }
            "move" | "copy" => {
                let from = op
                    .get("from")
                    .and_then(Value::as_str)
                    .ok_or_else(|| fail("missing \"from\""))?;
                let from = parse_pointer(from).map_err(|r| fail(&r))?;
                let v = if name == "move" {
                    remove(target, &from).map_err(|r| fail(&r))?
                } else {
                    let source =
                        get(target, &from).ok_or_else(|| fail("\"from\" does not exist"))?;
                    // Counted before it is cloned: a copy of a copy of … is refused early.
                    grow(index, source)?;
                    source.clone()
                };
                add(target, &pointer, v).map_err(|r| fail(&r))?;
            }
            "test" => {
                if get(target, &pointer) != Some(&value()?) {
                    return Err(fail("test failed"));
                }
            }
            other => return Err(fail(&format!("unknown operation {other:?}"))),
        }
    }
    Ok(())
}

fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p.strip_prefix('/').ok_or("a path must start with '/'")?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn get<'a>(v: &'a Value, p: &[String]) -> Option<&'a Value> {
    p.iter().try_fold(v, |node, seg| match node {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn parent_of<'a>(v: &'a mut Value, p: &[String]) -> Result<&'a mut Value, String> {
    let mut node = v;
    for seg in p {
        node = match node {
            Value::Object(m) => m
                .get_mut(seg)
                .ok_or_else(|| format!("{seg:?} does not exist"))?,
            Value::Array(a) => {
                let i: usize = seg
                    .parse()
                    .map_err(|_| format!("{seg:?} is not an index"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("index {i} is out of range"))?
            }
            _ => return Err(format!("{seg:?} is inside a scalar")),
        };
    }
    Ok(node)
}

fn add(v: &mut Value, p: &[String], value: Value) -> Result<(), String> {
    let Some((last, parents)) = p.split_last() else {
        *v = value;
        return Ok(());
    };
    match parent_of(v, parents)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse()
                    .map_err(|_| format!("{last:?} is not an index"))?
            };
            if i > a.len() {
                return Err(format!("index {i} is out of range"));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err("the parent is a scalar".into()),
    }
}

fn remove(v: &mut Value, p: &[String]) -> Result<Value, String> {
    let (last, parents) = p.split_last().ok_or("cannot remove the whole document")?;
    match parent_of(v, parents)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("{last:?} does not exist")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("{last:?} is not an index"))?;
            if i >= a.len() {
                return Err(format!("index {i} is out of range"));
            }
            Ok(a.remove(i))
        }
        _ => Err("the parent is a scalar".into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn strategic_merge_merges_containers_by_name_and_ports_by_key() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "x:1", "ports": [{"containerPort": 80, "name": "http"}]},
            {"name": "b", "image": "y:1"}]}});
        strategic_merge_patch(
            &mut pod,
            &json!({"spec": {"containers": [
            {"name": "a", "image": "x:2", "ports": [{"containerPort": 443}]},
            {"name": "b", "$patch": "delete"},
            {"name": "c", "image": "z:1"}]}}),
        )
        .unwrap();
        assert_eq!(
            pod,
            json!({"spec": {"containers": [
            {"name": "a", "image": "x:2", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}]},
            {"name": "c", "image": "z:1"}]}})
        );
        let mut svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
        strategic_merge_patch(&mut svc, &json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}], "$setElementOrder/ports": [{"port": 80}]}})).unwrap();
        assert_eq!(
            svc,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}})
        );
        let mut labels = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        strategic_merge_patch(
            &mut labels,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(
            labels,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}})
        );
        assert!(
            strategic_merge_patch(&mut pod, &json!({"spec": {"containers": [{"image": "x"}]}}))
                .is_err()
        );
    }

    #[test]
    fn json_patch_operations() {
        let mut doc = json!({"spec": {"replicas": 1, "list": [1, 2]}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "add", "path": "/spec/list/-", "value": 3},
                {"op": "remove", "path": "/spec/list/0"},
                {"op": "add", "path": "/metadata", "value": {"labels": {"a~b/c": "x"}}},
                {"op": "test", "path": "/metadata/labels/a~0b~1c", "value": "x"},
                {"op": "copy", "from": "/spec/replicas", "path": "/spec/copy"},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"spec": {"replicas": 3, "list": [2, 3], "copy": 3}, "metadata": {"labels": {"a~b/c": "x"}}})
        );
        let err = json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).unwrap_err();
        assert!(err.to_string().contains("operation 0"), "{err}");
        assert!(json_patch(&mut doc, &json!({"op": "add"})).is_err());
    }

    #[test]
    fn json_patch_copies_cannot_amplify_a_document() {
        // Each copy doubles the document: 40 of them would need 2^40 times its size.
        let mut doc = json!({"spec": {"a": "x".repeat(1024)}});
        let mut ops = Vec::new();
        for i in 0..40 {
            ops.push(json!({"op": "copy", "from": "/spec", "path": format!("/spec/c{i}")}));
        }
        let err = json_patch(&mut doc, &Value::Array(ops))
            .unwrap_err()
            .to_string();
        assert!(err.contains("would grow the object"), "{err}");
        assert!(json_size(&doc) <= 2 * MAX_PATCHED_BYTES);
    }
}
