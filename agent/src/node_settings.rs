//! What users change on a Node through the API — labels, annotations, taints and
//! `spec.unschedulable` (`kubectl label|annotate|taint|cordon|uncordon|drain`) — kept as desired
//! state: one `NodeSettings` object (group `node.shoal.io`) per node name, replicated like any
//! other object, so a cordon made through any agent holds on every node and survives restarts.
//!
//! A Node itself stays observed (membership: addresses, capacity, conditions); its labels and
//! taints start as the agent's `--labels`/`--taints`, and once edited through the API they are
//! the API's (the agent's flags are their initial values, as a kubelet's `--node-labels` are at
//! registration). The labels the agent derives from the host (`kubernetes.io/hostname`,
//! `kubernetes.io/arch`, `kubernetes.io/os`) stay the agent's. A cordoned node carries the
//! `node.kubernetes.io/unschedulable:NoSchedule` taint, as Kubernetes' node controller adds it,
//! so the scheduler needs no second rule for it.
//!
//! Pure: the API's Node view and the scheduler's node view are both [`effective`] of the same
//! inputs.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use shoal_gossip::NodeTaint;

/// The kind the settings are stored as.
pub const GROUP: &str = "node.shoal.io";
pub const KIND: &str = "NodeSettings";
/// The taint of a cordoned node.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// Labels the agent derives from its host.
pub const AGENT_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
];
/// Annotations the API shows from membership (not stored).
const OBSERVED_ANNOTATIONS: &[&str] = &["shoal.io/node-id", "shoal.io/generation"];

/// One node's settings as stored. `None` means "the agent's own".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: BTreeMap<String, String>,
    pub taints: Option<Vec<NodeTaint>>,
    pub unschedulable: bool,
}

fn string_map(v: &Value) -> Option<BTreeMap<String, String>> {
    v.is_object().then(|| shoal_model::placement::string_map(v))
}

fn taint_of(v: &Value) -> Option<NodeTaint> {
    Some(NodeTaint {
        key: v["key"].as_str()?.to_owned(),
        value: v["value"].as_str().unwrap_or("").to_owned(),
        effect: v["effect"].as_str()?.to_owned(),
    })
}

fn taint_json(t: &NodeTaint) -> Value {
    let mut v = json!({"key": t.key, "effect": t.effect});
    if !t.value.is_empty() {
        v["value"] = json!(t.value);
    }
    v
}

impl Settings {
    /// Reads a stored `NodeSettings` object (written by [`Settings::to_object`], validated then;
    /// anything unreadable reads as the agent's own).
    pub fn parse(object: &Value) -> Self {
        let spec = &object["spec"];
        Self {
            labels: string_map(&spec["labels"]),
            annotations: string_map(&spec["annotations"]).unwrap_or_default(),
            taints: spec["taints"]
                .as_array()
                .map(|list| list.iter().filter_map(taint_of).collect()),
            unschedulable: spec["unschedulable"] == true,
        }
    }

    pub fn to_object(&self, node: &str) -> Value {
        let mut spec = Map::new();
        if let Some(labels) = &self.labels {
            spec.insert("labels".into(), json!(labels));
        }
        if !self.annotations.is_empty() {
            spec.insert("annotations".into(), json!(self.annotations));
        }
        if let Some(taints) = &self.taints {
            spec.insert(
                "taints".into(),
                Value::Array(taints.iter().map(taint_json).collect()),
            );
        }
        spec.insert("unschedulable".into(), json!(self.unschedulable));
        json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": KIND,
            "metadata": {"name": node},
            "spec": spec,
        })
    }
}

/// The stored settings, by node name.
pub fn stored(store: &shoal_state::Store) -> std::collections::HashMap<String, Settings> {
    store
        .list(GROUP, KIND, None)
        .iter()
        .filter_map(|o| {
            Some((
                o["metadata"]["name"].as_str()?.to_owned(),
                Settings::parse(o),
            ))
        })
        .collect()
}

/// A node's labels and taints as the API shows them and the scheduler uses them.
pub fn effective(
    agent_labels: &BTreeMap<String, String>,
    agent_taints: &[NodeTaint],
    settings: Option<&Settings>,
) -> (BTreeMap<String, String>, Vec<NodeTaint>) {
    let Some(s) = settings else {
        return (agent_labels.clone(), agent_taints.to_vec());
    };
    let mut labels = s.labels.clone().unwrap_or_else(|| agent_labels.clone());
    for key in AGENT_LABELS {
        match agent_labels.get(*key) {
            Some(v) => labels.insert((*key).to_owned(), v.clone()),
            None => labels.remove(*key),
        };
    }
    let mut taints = s.taints.clone().unwrap_or_else(|| agent_taints.to_vec());
    taints.retain(|t| t.key != UNSCHEDULABLE_TAINT);
    if s.unschedulable {
        taints.push(NodeTaint {
            key: UNSCHEDULABLE_TAINT.into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        });
    }
    (labels, taints)
}

/// Applies the settings to an observed Node object (labels, annotations, taints,
/// `spec.unschedulable`).
pub fn apply_to_node(node: &mut Value, agent_taints: &[NodeTaint], settings: Option<&Settings>) {
    let agent_labels = string_map(&node["metadata"]["labels"]).unwrap_or_default();
    let (labels, taints) = effective(&agent_labels, agent_taints, settings);
    node["metadata"]["labels"] = json!(labels);
    if let Some(s) = settings {
        for (k, v) in &s.annotations {
            node["metadata"]["annotations"][k] = json!(v);
        }
        if s.unschedulable {
            node["spec"]["unschedulable"] = json!(true);
        }
    }
    if let Some(spec) = node["spec"].as_object_mut() {
        if taints.is_empty() {
            spec.remove("taints");
        } else {
            spec.insert(
                "taints".into(),
                Value::Array(taints.iter().map(taint_json).collect()),
            );
        }
    }
}

/// Why an edit of a Node is refused: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditError {
    pub field: String,
    pub detail: String,
}

fn refuse(field: impl Into<String>, detail: impl Into<String>) -> EditError {
    EditError {
        field: field.into(),
        detail: detail.into(),
    }
}

/// The first path where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                first_difference(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &here,
                )
            })
        }
        _ if a == b => None,
        _ => Some(path.to_owned()),
    }
}

/// What may change, removed; and what the server fills in, removed.
fn fixed_part(node: &Value) -> Value {
    let mut v = node.clone();
    if let Some(meta) = v["metadata"].as_object_mut() {
        for k in [
            "labels",
            "annotations",
            "resourceVersion",
            "managedFields",
            "creationTimestamp",
            "generation",
        ] {
            meta.remove(k);
        }
    }
    if let Some(spec) = v["spec"].as_object_mut() {
        spec.remove("unschedulable");
        spec.remove("taints");
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
        o.remove("apiVersion");
        o.remove("kind");
    }
    v
}

/// The settings an edit of the Node view `before` into `after` stands for; the agent's labels
/// and every observed field must stay as they are.
pub fn from_edit(before: &Value, after: &Value) -> Result<Settings, EditError> {
    if let Some(path) = first_difference(&fixed_part(before), &fixed_part(after), "") {
        return Err(refuse(
            path,
            "Forbidden: only metadata.labels, metadata.annotations, spec.unschedulable and spec.taints of a Node can be changed (the rest is observed)",
        ));
    }
    let before_labels = string_map(&before["metadata"]["labels"]).unwrap_or_default();
    let labels = match &after["metadata"]["labels"] {
        Value::Null => BTreeMap::new(),
        v => string_map(v)
            .filter(|m| m.len() == v.as_object().map_or(0, Map::len))
            .ok_or_else(|| refuse("metadata.labels", "Invalid value: must map keys to strings"))?,
    };
    shoal_state::labels::validate(&labels)
        .map_err(|e| refuse("metadata.labels", format!("Invalid value: {e}")))?;
    for key in AGENT_LABELS {
        if labels.get(*key) != before_labels.get(*key) {
            return Err(refuse(
                format!("metadata.labels[{key}]"),
                "Forbidden: the agent sets this label from its host",
            ));
        }
    }
    let mut annotations = match &after["metadata"]["annotations"] {
        Value::Null => BTreeMap::new(),
        v => string_map(v)
            .filter(|m| m.len() == v.as_object().map_or(0, Map::len))
            .ok_or_else(|| {
                refuse(
                    "metadata.annotations",
                    "Invalid value: must map keys to strings",
                )
            })?,
    };
    for key in OBSERVED_ANNOTATIONS {
        annotations.remove(*key);
    }
    let unschedulable = match &after["spec"]["unschedulable"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => {
            return Err(refuse(
                "spec.unschedulable",
                "Invalid value: must be a boolean",
            ));
        }
    };
    let mut taints = Vec::new();
    match &after["spec"]["taints"] {
        Value::Null => {}
        Value::Array(list) => {
            for (i, t) in list.iter().enumerate() {
                let field = format!("spec.taints[{i}]");
                let taint = taint_of(t).ok_or_else(|| {
                    refuse(&field, "Invalid value: a taint has a key and an effect")
                })?;
                shoal_state::labels::validate_key(&taint.key)
                    .map_err(|e| refuse(format!("{field}.key"), format!("Invalid value: {e}")))?;
                if !matches!(
                    taint.effect.as_str(),
                    "NoSchedule" | "PreferNoSchedule" | "NoExecute"
                ) {
                    return Err(refuse(
                        format!("{field}.effect"),
                        format!(
                            "Unsupported value: {:?}: supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
                            taint.effect
                        ),
                    ));
                }
                if taint.key == UNSCHEDULABLE_TAINT {
                    // Follows spec.unschedulable.
                    continue;
                }
                if taints
                    .iter()
                    .any(|o: &NodeTaint| o.key == taint.key && o.effect == taint.effect)
                {
                    return Err(refuse(
                        &field,
                        format!("Duplicate value: {}:{}", taint.key, taint.effect),
                    ));
                }
                taints.push(taint);
            }
        }
        _ => return Err(refuse("spec.taints", "Invalid value: must be a list")),
    }
    let mut user_labels = labels;
    for key in AGENT_LABELS {
        user_labels.remove(*key);
    }
    Ok(Settings {
        labels: Some(user_labels),
        annotations,
        taints: Some(taints),
        unschedulable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n1", "uid": "u", "resourceVersion": "3",
                "labels": {"kubernetes.io/hostname": "n1", "kubernetes.io/os": "linux", "zone": "a"},
                "annotations": {"shoal.io/node-id": "abc", "shoal.io/generation": "3"},
            },
            "spec": {"podCIDR": "10.88.1.0/24", "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "2"}},
        })
    }

    fn agent() -> (BTreeMap<String, String>, Vec<NodeTaint>) {
        let labels = string_map(&node()["metadata"]["labels"]).unwrap();
        let taints = vec![NodeTaint {
            key: "gpu".into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        }];
        (labels, taints)
    }

    #[test]
    fn a_cordon_is_a_taint_the_scheduler_already_honours() {
        let mut after = node();
        after["spec"]["unschedulable"] = json!(true);
        let settings = from_edit(&node(), &after).unwrap();
        assert!(settings.unschedulable);
        let (labels, taints) = effective(&agent().0, &agent().1, Some(&settings));
        assert_eq!(labels, agent().0);
        assert_eq!(
            taints
                .iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect::<Vec<_>>(),
            [
                "gpu:NoSchedule",
                "node.kubernetes.io/unschedulable:NoSchedule"
            ]
        );
        // The view shows it as kubectl expects; uncordoning takes the taint away again.
        let mut view = node();
        apply_to_node(&mut view, &agent().1, Some(&settings));
        assert_eq!(view["spec"]["unschedulable"], true);
        assert_eq!(view["spec"]["taints"].as_array().unwrap().len(), 2);
        let mut uncordoned = view.clone();
        uncordoned["spec"]["unschedulable"] = json!(false);
        let settings = from_edit(&view, &uncordoned).unwrap();
        let (_, taints) = effective(&agent().0, &agent().1, Some(&settings));
        assert_eq!(taints.len(), 1);
        // Stored and read back, the same settings.
        assert_eq!(Settings::parse(&settings.to_object("n1")), settings);
    }

    #[test]
    fn labels_and_taints_edited_through_the_api_replace_the_agents_own() {
        let mut after = node();
        after["metadata"]["labels"]["disk"] = json!("ssd");
        after["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("zone");
        after["spec"]["taints"] =
            json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}]);
        after["metadata"]["annotations"]["team"] = json!("infra");
        let s = from_edit(&node(), &after).unwrap();
        let (labels, taints) = effective(&agent().0, &agent().1, Some(&s));
        assert_eq!(labels.get("disk").map(String::as_str), Some("ssd"));
        assert!(!labels.contains_key("zone"));
        assert_eq!(
            labels.get("kubernetes.io/hostname").map(String::as_str),
            Some("n1")
        );
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].value, "db");
        assert_eq!(
            s.annotations.len(),
            1,
            "observed annotations are not stored"
        );
        // Without settings, the agent's own.
        assert_eq!(effective(&agent().0, &agent().1, None), agent());
    }

    #[test]
    fn observed_fields_and_the_agents_labels_cannot_be_edited() {
        type Edit = fn(&mut Value);
        let cases: Vec<(Edit, &str)> = vec![
            (
                |n| n["spec"]["podCIDR"] = json!("10.0.0.0/24"),
                "spec.podCIDR",
            ),
            (|n| n["metadata"]["uid"] = json!("x"), "metadata.uid"),
            (
                |n| n["metadata"]["labels"]["kubernetes.io/hostname"] = json!("other"),
                "metadata.labels[kubernetes.io/hostname]",
            ),
            (
                |n| n["metadata"]["labels"]["bad key!"] = json!("x"),
                "metadata.labels",
            ),
            (
                |n| n["spec"]["taints"] = json!([{"key": "k", "effect": "Sometimes"}]),
                "spec.taints[0].effect",
            ),
            (
                |n| n["spec"]["taints"] = json!([{"effect": "NoSchedule"}]),
                "spec.taints[0]",
            ),
            (
                |n| n["spec"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}, {"key": "k", "value": "2", "effect": "NoSchedule"}]),
                "spec.taints[1]",
            ),
            (
                |n| n["spec"]["unschedulable"] = json!("yes"),
                "spec.unschedulable",
            ),
        ];
        for (edit, field) in cases {
            let mut after = node();
            edit(&mut after);
            assert_eq!(from_edit(&node(), &after).unwrap_err().field, field);
        }
        // The status is observed: a client sending it back unchanged or changed is not editing.
        let mut after = node();
        after["status"] = json!({"capacity": {"cpu": "64"}});
        assert!(from_edit(&node(), &after).is_ok());
    }
}
