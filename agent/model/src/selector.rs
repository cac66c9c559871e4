//! Label selectors (`app=web,tier!=db,env in (a,b),!legacy`) and field selectors
//! (`spec.nodeName=n1,status.phase!=Succeeded`) over the fields each kind offers, as the
//! apiserver's.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Why a selector was refused, in the apiserver's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector's requirement that does not parse.
    #[error("unable to parse requirement {requirement:?}: {reason}")]
    Requirement { requirement: String, reason: String },
    /// A field selector's part without `=`, `==` or `!=`.
    #[error("invalid selector: {0:?}; expected field=value")]
    NotFieldValue(String),
    /// A field the kind cannot be selected by.
    #[error("field label not supported: {field} (the fields of {kind} are {known})")]
    UnknownField {
        field: String,
        kind: String,
        known: String,
    },
}

fn requirement(part: &str, reason: impl std::fmt::Display) -> SelectorError {
    SelectorError::Requirement {
        requirement: part.to_owned(),
        reason: reason.to_string(),
    }
}

fn check_key(key: &str, whole: &str) -> Result<String, SelectorError> {
    shoal_state::labels::validate_key(key)
        .map(|()| key.to_owned())
        .map_err(|e| requirement(whole, e))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s)
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let set = |rest: &str| -> Result<Vec<String>, SelectorError> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| requirement(part, "expected (values)"))?;
                Ok(inner
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .collect())
            };
            let req = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(check_key(k.trim(), part)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                let v = v.trim();
                shoal_state::labels::validate_value(k.trim(), v)
                    .map_err(|e| requirement(part, e))?;
                Requirement::Equals(check_key(k.trim(), part)?, v.to_owned())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(check_key(k.trim(), part)?, set(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(check_key(k.trim(), part)?, set(rest)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::DoesNotExist(check_key(k.trim(), part)?)
            } else {
                Requirement::Exists(check_key(part, part)?)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// The fields a kind can be selected by, as the apiserver offers them (every kind has
/// `metadata.name` and `metadata.namespace`), each with the value an absent field reads as.
fn selectable(kind: &str) -> &'static [(&'static str, &'static str)] {
    match kind {
        "Pod" => &[
            ("spec.nodeName", ""),
            ("spec.restartPolicy", ""),
            ("spec.schedulerName", ""),
            ("spec.serviceAccountName", ""),
            ("spec.hostNetwork", "false"),
            ("status.phase", ""),
            ("status.podIP", ""),
            ("status.nominatedNodeName", ""),
        ],
        "Event" => &[
            ("involvedObject.kind", ""),
            ("involvedObject.namespace", ""),
            ("involvedObject.name", ""),
            ("involvedObject.uid", ""),
            ("involvedObject.apiVersion", ""),
            ("involvedObject.resourceVersion", ""),
            ("involvedObject.fieldPath", ""),
            ("reason", ""),
            ("reportingComponent", ""),
            ("source", ""),
            ("type", ""),
        ],
        "Node" => &[("spec.unschedulable", "false")],
        "Secret" => &[("type", "")],
        "Namespace" => &[("status.phase", "")],
        "ReplicaSet" => &[("status.replicas", "0")],
        "Job" => &[("status.successful", "0")],
        "Service" => &[("spec.clusterIP", ""), ("spec.type", "")],
        _ => &[],
    }
}

/// One requirement of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    equal: bool,
    value: String,
    /// What the field reads as when the object lacks it.
    absent: &'static str,
}

/// A field selector (`spec.nodeName=n1,status.phase!=Succeeded`) over the fields the kind
/// offers; any other field is refused, naming the ones that are.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    pub fn parse(s: &str, kind: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(SelectorError::NotFieldValue(part.to_owned()));
            };
            let field = field.trim();
            let absent = match field {
                "metadata.name" | "metadata.namespace" => "",
                other => selectable(kind)
                    .iter()
                    .find(|(f, _)| *f == other)
                    .map(|(_, absent)| *absent)
                    .ok_or_else(|| {
                        let known: Vec<&str> = ["metadata.name", "metadata.namespace"]
                            .into_iter()
                            .chain(selectable(kind).iter().map(|(f, _)| *f))
                            .collect();
                        SelectorError::UnknownField {
                            field: other.to_owned(),
                            kind: kind.to_owned(),
                            known: known.join(", "),
                        }
                    })?,
            };
            reqs.push(FieldRequirement {
                field: field.to_owned(),
                equal,
                value: value.trim().to_owned(),
                absent,
            });
        }
        Ok(Self(reqs))
    }

    /// Whether a requirement reads the object's status (observed state, not the stored object).
    pub fn reads_status(&self) -> bool {
        self.0.iter().any(|r| r.field.starts_with("status."))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            // An Event's `source` is its source's component, as the apiserver reads it.
            let path = if r.field == "source" {
                "source.component"
            } else {
                r.field.as_str()
            };
            let found = path.split('.').try_fold(object, |v, k| v.get(k));
            let actual = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => r.absent.to_owned(),
            };
            (actual == r.value) == r.equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors() {
        let labels = json!({"app": "web", "tier": "front"});
        let ok = |s: &str| LabelSelector::parse(s).unwrap().matches(&labels);
        assert!(ok(""));
        assert!(ok("app=web"));
        assert!(ok("app==web,tier!=db"));
        assert!(ok("tier in (front, back)"));
        assert!(!ok("tier notin (front)"));
        assert!(ok("app,!legacy"));
        assert!(!ok("legacy"));
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("x in a,b").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}});
        let ok = |s: &str, kind: &str, o: &Value| FieldSelector::parse(s, kind).unwrap().matches(o);
        assert!(ok("metadata.name=a", "ConfigMap", &o));
        assert!(!ok("metadata.namespace!=ns", "ConfigMap", &o));
        let err = FieldSelector::parse("spec.nodeName=x", "ConfigMap").unwrap_err();
        assert_eq!(
            err.to_string(),
            "field label not supported: spec.nodeName (the fields of ConfigMap are metadata.name, metadata.namespace)"
        );
        let pod = json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "n1", "restartPolicy": "Always"},
            "status": {"phase": "Running", "podIP": "10.88.1.5"},
        });
        assert!(ok("spec.nodeName=n1", "Pod", &pod));
        assert!(ok(
            "spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed",
            "Pod",
            &pod
        ));
        assert!(!ok("spec.nodeName==n2", "Pod", &pod));
        assert!(
            ok("spec.hostNetwork=false", "Pod", &pod),
            "absent reads as false"
        );
        assert!(
            ok("status.nominatedNodeName=", "Pod", &pod),
            "absent reads as empty"
        );
        assert!(ok("status.podIP=10.88.1.5", "Pod", &pod));
        assert!(
            FieldSelector::parse("status.phase=Running", "Pod")
                .unwrap()
                .reads_status()
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=n1", "Pod")
                .unwrap()
                .reads_status()
        );
        let node = json!({"metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
        assert!(ok("spec.unschedulable=true", "Node", &node));
        assert!(ok(
            "spec.unschedulable=false",
            "Node",
            &json!({"metadata": {"name": "n2"}})
        ));
        let event = json!({
            "metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "Scheduled", "type": "Normal", "source": {"component": "shoal-scheduler"},
        });
        assert!(ok(
            "involvedObject.name=p,involvedObject.kind=Pod,type=Normal",
            "Event",
            &event
        ));
        assert!(ok(
            "source=shoal-scheduler,reason=Scheduled",
            "Event",
            &event
        ));
        assert!(ok("type=Opaque", "Secret", &json!({"type": "Opaque"})));
        assert!(ok(
            "status.replicas=0",
            "ReplicaSet",
            &json!({"status": {}})
        ));
        assert!(
            FieldSelector::parse("spec.nodeName", "Pod")
                .unwrap_err()
                .to_string()
                .contains("expected field=value")
        );
    }
}
