//! The parts of a pod spec that reach a node's filesystem and arithmetic, checked the way the
//! apiserver checks them (DESIGN.md §8: names are validated at the API *and* again at the
//! node). The API calls [`check`] for pods and pod templates; the kubelet calls it again in
//! `PodPlan::parse` (`agent/core/src/pod/plan.rs`), since a stored pod may come from a peer that did not.
//!
//! What is checked: container and volume names are DNS-1123 labels (one safe path
//! component each), ConfigMap/Secret item keys and paths stay beneath their volume, volume
//! mounts name a volume and an absolute mount path, subPaths descend, resource quantities fit
//! an `i64` in their unit, and durations fit in milliseconds.
//! Pure.

use serde_json::Value;
use shoal_state::labels;

use crate::FieldError;
use crate::environment::Environment;
use crate::quantity;

fn problem(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
    FieldError::new(field, detail)
}

fn invalid(field: String, value: &str, reason: impl std::fmt::Display) -> FieldError {
    problem(field, format!("Invalid value: {value:?}: {reason}"))
}

/// `hostPath.type`: what must be at the path (and what the kubelet creates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unchecked,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl HostPathType {
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "" => Self::Unchecked,
            "DirectoryOrCreate" => Self::DirectoryOrCreate,
            "Directory" => Self::Directory,
            "FileOrCreate" => Self::FileOrCreate,
            "File" => Self::File,
            "Socket" => Self::Socket,
            "CharDevice" => Self::CharDevice,
            "BlockDevice" => Self::BlockDevice,
            _ => return None,
        })
    }
}

/// Seconds the node multiplies into milliseconds and adds to clocks: non-negative and small
/// enough that the product fits (about 292 million years).
pub const MAX_SECONDS: i64 = i64::MAX / 1000;

fn seconds(value: &Value, field: String, min: i64) -> Result<(), FieldError> {
    if value.is_null() {
        return Ok(());
    }
    match value.as_i64() {
        Some(n) if (min..=MAX_SECONDS).contains(&n) => Ok(()),
        _ if value.is_i64() || value.is_u64() => Err(problem(
            field,
            format!("Invalid value: {value}: must be between {min} and {MAX_SECONDS}, inclusive"),
        )),
        _ => Err(problem(
            field,
            format!("Invalid value: {value}: must be an integer"),
        )),
    }
}

fn quantities(resources: &Value, at: &str) -> Result<(), FieldError> {
    for section in ["requests", "limits"] {
        for (name, q) in resources[section].as_object().into_iter().flatten() {
            let field = format!("{at}.resources.{section}.{name}");
            let text = match q {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(problem(
                        field,
                        format!("Invalid value: {other}: must be a quantity"),
                    ));
                }
            };
            let parsed = match name.as_str() {
                "cpu" => quantity::cpu_millis(&text),
                // Other resources (memory, ephemeral-storage, hugepages, extended ones) count
                // in units.
                _ => quantity::bytes(&text),
            };
            parsed.map_err(|reason| invalid(field, &text, reason))?;
        }
    }
    Ok(())
}

fn probe(value: &Value, at: String) -> Result<(), FieldError> {
    if value.is_null() {
        return Ok(());
    }
    for name in ["initialDelaySeconds", "periodSeconds", "timeoutSeconds"] {
        seconds(&value[name], format!("{at}.{name}"), 0)?;
    }
    for name in ["successThreshold", "failureThreshold"] {
        let v = &value[name];
        if !v.is_null()
            && !v
                .as_i64()
                .is_some_and(|n| (0..=i64::from(i32::MAX)).contains(&n))
        {
            return Err(problem(
                format!("{at}.{name}"),
                format!("Invalid value: {v}: must be between 0 and {}", i32::MAX),
            ));
        }
    }
    Ok(())
}

/// A lifecycle hook: one handler of those a node runs (`exec`, `httpGet` with a port number,
/// `sleep` of at most a day).
fn hook(value: &Value, at: String) -> Result<(), FieldError> {
    if value.is_null() {
        return Ok(());
    }
    if let Some(http) = value.get("httpGet") {
        let port = &http["port"];
        if !port.as_u64().is_some_and(|p| (1..=65535).contains(&p)) {
            return Err(problem(
                format!("{at}.httpGet.port"),
                format!("Invalid value: {port}: must be a port number from 1 to 65535"),
            ));
        }
    } else if let Some(sleep) = value.get("sleep") {
        seconds(&sleep["seconds"], format!("{at}.sleep.seconds"), 0)?;
        if sleep["seconds"].as_u64().is_none_or(|s| s > 86_400) {
            return Err(problem(
                format!("{at}.sleep.seconds"),
                "Invalid value: must be a number of seconds from 0 to 86400",
            ));
        }
    } else if value.get("exec").is_none() {
        return Err(problem(at, "Required value: must specify a handler type"));
    }
    Ok(())
}

fn items(source: &Value, at: &str) -> Result<(), FieldError> {
    for (j, item) in source["items"].as_array().into_iter().flatten().enumerate() {
        let key = item["key"].as_str().unwrap_or_default();
        if key.is_empty() {
            return Err(problem(format!("{at}.items[{j}].key"), "Required value"));
        }
        let path = item["path"].as_str().unwrap_or_default();
        if path.is_empty() {
            return Err(problem(format!("{at}.items[{j}].path"), "Required value"));
        }
        labels::check_descending_path(path, true)
            .map_err(|r| invalid(format!("{at}.items[{j}].path"), path, r))?;
    }
    Ok(())
}

/// The most items one downwardAPI source may list, and the most sources a projected volume.
pub const MAX_VOLUME_ITEMS: usize = 256;

/// A `downwardAPI` source's items: each a path that descends and one value.
fn downward(source: &Value, at: &str) -> Result<(), FieldError> {
    let list = source["items"].as_array().map_or(&[][..], Vec::as_slice);
    if list.len() > MAX_VOLUME_ITEMS {
        return Err(problem(
            format!("{at}.items"),
            format!(
                "Too many: {}: must have at most {MAX_VOLUME_ITEMS} items",
                list.len()
            ),
        ));
    }
    for (j, item) in list.iter().enumerate() {
        let path = item["path"].as_str().unwrap_or_default();
        if path.is_empty() {
            return Err(problem(format!("{at}.items[{j}].path"), "Required value"));
        }
        labels::check_descending_path(path, true)
            .map_err(|r| invalid(format!("{at}.items[{j}].path"), path, r))?;
        if item["fieldRef"].is_null() == item["resourceFieldRef"].is_null() {
            return Err(problem(
                format!("{at}.items[{j}]"),
                "Invalid value: exactly one of fieldRef and resourceFieldRef",
            ));
        }
    }
    Ok(())
}

/// Checks what of pod spec `spec` (at field path `path`, e.g. `spec.template.spec`) reaches
/// the node.
/// The `$(VAR)` expansion of container `c` (at `at`) as far as the spec alone decides it:
/// literal `env[].value`s against each other, then `command` and `args`, with the kubelet's
/// bounds ([`crate::environment`]). Variables from the image, ConfigMaps, Secrets and the
/// downward API are not known here: the kubelet checks again with them.
fn expansion(c: &Value, at: &str) -> Result<(), FieldError> {
    let mut env = Environment::new();
    for (j, e) in c["env"].as_array().into_iter().flatten().enumerate() {
        let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) else {
            continue;
        };
        let field = || format!("{at}.env[{j}].value");
        let expanded = env
            .expand(value)
            .map_err(|r| problem(field(), format!("Invalid value: $({name}) {}", r.reason())))?;
        env.set(name.to_owned(), expanded)
            .map_err(|r| problem(field(), format!("Invalid value: $({name}) {}", r.reason())))?;
    }
    for list in ["command", "args"] {
        for (k, a) in c[list].as_array().into_iter().flatten().enumerate() {
            let Some(a) = a.as_str() else { continue };
            let field = || format!("{at}.{list}[{k}]");
            let arg = env
                .expand(a)
                .map_err(|r| problem(field(), format!("Invalid value: {}", r.reason())))?;
            env.count_argument(arg.len())
                .map_err(|r| problem(field(), format!("Invalid value: {}", r.reason())))?;
        }
    }
    Ok(())
}

/// An `emptyDir`: its medium (the node's disk, or `Memory`: a tmpfs) and its `sizeLimit`.
/// What it says, once checked.
pub fn empty_dir(e: &Value, at: &str) -> Result<EmptyDir, FieldError> {
    let memory = match e["medium"].as_str().unwrap_or_default() {
        "" => false,
        "Memory" => true,
        other => {
            return Err(problem(
                format!("{at}.medium"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"\", \"Memory\" (hugepages are not offered by this node)"
                ),
            ));
        }
    };
    let size_limit = match &e["sizeLimit"] {
        Value::Null => None,
        limit => {
            let text = limit
                .as_str()
                .map(str::to_owned)
                .or_else(|| limit.as_u64().map(|n| n.to_string()))
                .unwrap_or_default();
            let bytes = quantity::bytes(&text).map_err(|e| {
                problem(
                    format!("{at}.sizeLimit"),
                    format!("Invalid value: {text:?}: {e}"),
                )
            })?;
            Some(bytes)
        }
    };
    Ok(EmptyDir { memory, size_limit })
}

/// What an `emptyDir` asks for ([`empty_dir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmptyDir {
    /// `medium: Memory`: a tmpfs, its size the limit (or the pod's memory limit).
    pub memory: bool,
    /// `sizeLimit` in bytes.
    pub size_limit: Option<u64>,
}

pub fn check(spec: &Value, path: &str) -> Result<(), FieldError> {
    let mut volumes = std::collections::BTreeSet::new();
    for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}.volumes[{i}]");
        let name = v["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            return Err(problem(format!("{at}.name"), "Required value"));
        }
        labels::check_dns_label(name).map_err(|r| invalid(format!("{at}.name"), name, r))?;
        if !volumes.insert(name) {
            return Err(problem(
                format!("{at}.name"),
                format!("Duplicate value: {name:?}"),
            ));
        }
        for source in ["configMap", "secret"] {
            items(&v[source], &format!("{at}.{source}"))?;
        }
        if let Some(e) = v.get("emptyDir") {
            empty_dir(e, &format!("{at}.emptyDir"))?;
        }
        if let Some(e) = v.get("ephemeral") {
            let template = &e["volumeClaimTemplate"];
            if !template["spec"].is_object() {
                return Err(problem(
                    format!("{at}.ephemeral.volumeClaimTemplate.spec"),
                    "Required value",
                ));
            }
            // Checked as the claim it becomes (its fields named from the template).
            crate::storage::validate_claim(template).map_err(|e| {
                problem(
                    format!("{at}.ephemeral.volumeClaimTemplate.{}", e.field),
                    e.detail,
                )
            })?;
        }
        if let Some(d) = v.get("downwardAPI") {
            downward(d, &format!("{at}.downwardAPI"))?;
        }
        let sources = v["projected"]["sources"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        if sources.len() > MAX_VOLUME_ITEMS {
            return Err(problem(
                format!("{at}.projected.sources"),
                format!(
                    "Too many: {}: must have at most {MAX_VOLUME_ITEMS} items",
                    sources.len()
                ),
            ));
        }
        for (j, s) in sources.iter().enumerate() {
            let sat = format!("{at}.projected.sources[{j}]");
            for source in ["configMap", "secret"] {
                items(&s[source], &format!("{sat}.{source}"))?;
            }
            if let Some(d) = s.get("downwardAPI") {
                downward(d, &format!("{sat}.downwardAPI"))?;
            }
        }
        if let Some(claim) = v.get("persistentVolumeClaim") {
            let name = claim["claimName"].as_str().unwrap_or_default();
            if name.is_empty() {
                return Err(problem(
                    format!("{at}.persistentVolumeClaim.claimName"),
                    "Required value",
                ));
            }
            labels::check_dns_subdomain(name)
                .map_err(|r| invalid(format!("{at}.persistentVolumeClaim.claimName"), name, r))?;
        }
        if let Some(host) = v.get("hostPath") {
            let path = host["path"].as_str().unwrap_or_default();
            if path.is_empty() {
                return Err(problem(format!("{at}.hostPath.path"), "Required value"));
            }
            if !path.starts_with('/') || path.contains('\0') || path.split('/').any(|p| p == "..") {
                return Err(invalid(
                    format!("{at}.hostPath.path"),
                    path,
                    "must be an absolute path without '..'",
                ));
            }
            let kind = host["type"].as_str().unwrap_or_default();
            if HostPathType::parse(kind).is_none() {
                return Err(problem(
                    format!("{at}.hostPath.type"),
                    format!(
                        "Unsupported value: {kind:?}: supported values: \"\", \"BlockDevice\", \"CharDevice\", \"Directory\", \"DirectoryOrCreate\", \"File\", \"FileOrCreate\", \"Socket\""
                    ),
                ));
            }
        }
    }
    seconds(
        &spec["terminationGracePeriodSeconds"],
        format!("{path}.terminationGracePeriodSeconds"),
        0,
    )?;
    seconds(
        &spec["activeDeadlineSeconds"],
        format!("{path}.activeDeadlineSeconds"),
        1,
    )?;
    // Container names are one name space across init and app containers: bundles, logs and
    // statuses are found by name, so a name used twice would start one spec for the other.
    let mut containers = std::collections::BTreeSet::new();
    for field in ["initContainers", "containers"] {
        for (i, c) in spec[field].as_array().into_iter().flatten().enumerate() {
            let at = format!("{path}.{field}[{i}]");
            if let Some(name) = c["name"].as_str() {
                labels::check_dns_label(name)
                    .map_err(|r| invalid(format!("{at}.name"), name, r))?;
                if !containers.insert(name) {
                    return Err(problem(
                        format!("{at}.name"),
                        format!("Duplicate value: {name:?}"),
                    ));
                }
            }
            // A container's own restartPolicy makes an init container a sidecar; nothing else.
            let policy = &c["restartPolicy"];
            if !policy.is_null() && (field == "containers" || policy != "Always") {
                return Err(problem(
                    format!("{at}.restartPolicy"),
                    if field == "containers" {
                        "Forbidden: may not be set for non-init containers".to_owned()
                    } else {
                        format!("Unsupported value: {policy}: supported values: \"Always\"")
                    },
                ));
            }
            quantities(&c["resources"], &at)?;
            expansion(c, &at)?;
            for p in ["livenessProbe", "readinessProbe", "startupProbe"] {
                probe(&c[p], format!("{at}.{p}"))?;
            }
            for h in ["postStart", "preStop"] {
                hook(&c["lifecycle"][h], format!("{at}.lifecycle.{h}"))?;
            }
            if let Some(path) = c["terminationMessagePath"]
                .as_str()
                .filter(|p| !p.is_empty())
                && (!path.starts_with('/') || path.split('/').any(|p| p == ".."))
            {
                return Err(invalid(
                    format!("{at}.terminationMessagePath"),
                    path,
                    "must be an absolute path without '..'",
                ));
            }
            let policy = c["terminationMessagePolicy"].as_str().unwrap_or("File");
            if !matches!(policy, "File" | "FallbackToLogsOnError") {
                return Err(problem(
                    format!("{at}.terminationMessagePolicy"),
                    format!(
                        "Unsupported value: {policy:?}: supported values: \"File\", \"FallbackToLogsOnError\""
                    ),
                ));
            }
            let mut targets = std::collections::BTreeSet::new();
            for (j, m) in c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let mat = format!("{at}.volumeMounts[{j}]");
                let name = m["name"].as_str().unwrap_or_default();
                if name.is_empty() {
                    return Err(problem(format!("{mat}.name"), "Required value"));
                }
                if !volumes.contains(name) {
                    return Err(problem(
                        format!("{mat}.name"),
                        format!("Not found: {name:?}"),
                    ));
                }
                let target = m["mountPath"].as_str().unwrap_or_default();
                if target.is_empty() {
                    return Err(problem(format!("{mat}.mountPath"), "Required value"));
                }
                if !target.starts_with('/') || target.contains('\0') {
                    return Err(invalid(
                        format!("{mat}.mountPath"),
                        target,
                        "must be an absolute path",
                    ));
                }
                if !targets.insert(target) {
                    return Err(invalid(
                        format!("{mat}.mountPath"),
                        target,
                        "must be unique",
                    ));
                }
                if let Some(sub) = m["subPath"].as_str() {
                    labels::check_descending_path(sub, false)
                        .map_err(|r| invalid(format!("{mat}.subPath"), sub, r))?;
                }
                if let Some(expr) = m.get("subPathExpr") {
                    let text = expr.as_str().unwrap_or_default();
                    if m["subPath"].as_str().is_some_and(|s| !s.is_empty()) && !text.is_empty() {
                        return Err(invalid(
                            format!("{mat}.subPathExpr"),
                            text,
                            "subPathExpr and subPath are mutually exclusive",
                        ));
                    }
                    // What it expands to is checked at the node, as a subPath.
                    if text.starts_with('/') {
                        return Err(invalid(
                            format!("{mat}.subPathExpr"),
                            text,
                            "must be a relative path",
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field_of(spec: Value) -> String {
        check(&spec, "spec").unwrap_err().field
    }

    #[test]
    fn names_and_paths_that_would_leave_the_pod_directory_are_refused() {
        let c = |extra: Value| {
            let mut c = json!({"name": "app", "image": "b"});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            c
        };
        let cases = [
            (
                json!({"volumes": [{"name": "../../../../etc/cron.d", "configMap": {"name": "x"}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].name",
            ),
            (
                json!({"volumes": [{"name": "/", "emptyDir": {}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].name",
            ),
            (
                json!({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}], "containers": [c(json!({}))]}),
                "spec.volumes[1].name",
            ),
            (
                json!({"volumes": [{"name": "v", "configMap": {"name": "x", "items": [{"key": "k", "path": "../k"}]}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].configMap.items[0].path",
            ),
            (
                json!({"volumes": [{"name": "v", "secret": {"secretName": "x", "items": [{"key": "k", "path": "/etc/k"}]}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].secret.items[0].path",
            ),
            (
                json!({"volumes": [{"name": "v", "emptyDir": {}}], "containers": [c(json!({"volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "/etc"}]}))]}),
                "spec.containers[0].volumeMounts[0].subPath",
            ),
            (
                json!({"volumes": [{"name": "v", "emptyDir": {}}], "containers": [c(json!({"volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "a/../../b"}]}))]}),
                "spec.containers[0].volumeMounts[0].subPath",
            ),
            (
                json!({"volumes": [{"name": "v", "emptyDir": {}}], "containers": [c(json!({"volumeMounts": [{"name": "v", "mountPath": "rel"}]}))]}),
                "spec.containers[0].volumeMounts[0].mountPath",
            ),
            (
                json!({"volumes": [{"name": "v", "emptyDir": {"medium": "HugePages"}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].emptyDir.medium",
            ),
            (
                json!({"volumes": [{"name": "v", "emptyDir": {"sizeLimit": "lots"}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].emptyDir.sizeLimit",
            ),
            (
                json!({"containers": [c(json!({"volumeMounts": [{"name": "missing", "mountPath": "/m"}]}))]}),
                "spec.containers[0].volumeMounts[0].name",
            ),
            (
                json!({"containers": [{"name": "../x", "image": "b"}]}),
                "spec.containers[0].name",
            ),
            (
                json!({"volumes": [{"name": "h", "hostPath": {"path": "var/log"}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].hostPath.path",
            ),
            (
                json!({"volumes": [{"name": "h", "hostPath": {"path": "/var/../etc"}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].hostPath.path",
            ),
            (
                json!({"volumes": [{"name": "h", "hostPath": {"path": "/var/log", "type": "Folder"}}], "containers": [c(json!({}))]}),
                "spec.volumes[0].hostPath.type",
            ),
            // $(VAR) chains that multiply: 1 KB, ×1000, ×1000 … (issue #35, item 2).
            (
                json!({"containers": [c(json!({"env": [
                    {"name": "A", "value": "x".repeat(1000)},
                    {"name": "B", "value": "$(A)".repeat(1000)},
                    {"name": "C", "value": "$(B)".repeat(1000)}]}))]}),
                "spec.containers[0].env[1].value",
            ),
            (
                json!({"containers": [c(json!({"env": [{"name": "A", "value": "x".repeat(100_000)}],
                    "args": vec!["$(A)"; 11]}))]}),
                "spec.containers[0].args[9]",
            ),
            // One name in both lists: the init container's bundle and log would be the app
            // container's (issue #35, item 11).
            (
                json!({"initContainers": [{"name": "app", "image": "i"}], "containers": [c(json!({}))]}),
                "spec.containers[0].name",
            ),
            (
                json!({"containers": [c(json!({})), c(json!({}))]}),
                "spec.containers[1].name",
            ),
        ];
        for (spec, field) in cases {
            assert_eq!(field_of(spec.clone()), field, "{spec}");
        }
        let ok = json!({"volumes": [{"name": "cfg", "configMap": {"name": "x", "items": [{"key": "k", "path": "a/b.conf"}]}},
            {"name": "cache", "emptyDir": {}}],
            "containers": [c(json!({"volumeMounts": [{"name": "cache", "mountPath": "/c", "subPath": "logs/app"}, {"name": "cfg", "mountPath": "/etc/x"}]}))]});
        check(&ok, "spec").unwrap();
    }

    #[test]
    fn quantities_and_durations_that_overflow_are_refused() {
        let with = |resources: Value| json!({"containers": [{"name": "a", "image": "b", "resources": resources}]});
        assert_eq!(
            field_of(with(json!({"requests": {"cpu": "1e16"}}))),
            "spec.containers[0].resources.requests.cpu"
        );
        assert_eq!(
            field_of(with(json!({"limits": {"memory": "8Ei"}}))),
            "spec.containers[0].resources.limits.memory"
        );
        assert_eq!(
            field_of(with(json!({"limits": {"memory": -1}}))),
            "spec.containers[0].resources.limits.memory"
        );
        check(&with(json!({"limits": {"memory": "9E", "cpu": 4}})), "spec").unwrap();
        assert_eq!(
            field_of(
                json!({"terminationGracePeriodSeconds": u64::MAX, "containers": [{"name": "a", "image": "b"}]})
            ),
            "spec.terminationGracePeriodSeconds"
        );
        assert_eq!(
            field_of(
                json!({"containers": [{"name": "a", "image": "b", "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": i64::MAX}}]})
            ),
            "spec.containers[0].livenessProbe.periodSeconds"
        );
        assert_eq!(
            field_of(
                json!({"containers": [{"name": "a", "image": "b", "readinessProbe": {"exec": {"command": ["true"]}, "timeoutSeconds": -1}}]})
            ),
            "spec.containers[0].readinessProbe.timeoutSeconds"
        );
    }
}
