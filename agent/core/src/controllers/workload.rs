//! What the workload controllers decide with and what they decide (pure): a view of each pod
//! as stored and as its node reports it, and the writes a reconcile asks for.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use shoal_model::placement::{Term, label_selector, term_matches};

/// A pod's phase as its node reports it (`Pending` until a node does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// One pod as a controller sees it.
#[derive(Debug, Clone)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// The uid of the owner reference with `controller: true`, if any.
    pub controller_uid: Option<String>,
    /// Bound node (`spec.nodeName`), if the auction placed it.
    pub node: Option<String>,
    pub phase: Phase,
    pub ready: bool,
    /// `metadata.creationTimestamp`, ms since the epoch (0 if absent).
    pub created_ms: u64,
    /// Being deleted (`deletionTimestamp`: its node is stopping it).
    pub deleting: bool,
    /// Containers that ended, as its node reports them: (name, exit code, init container).
    pub terminated: Vec<(String, i64, bool)>,
    /// The pod's conditions as its node reports them: (type, status).
    pub conditions: Vec<(String, String)>,
    /// When its node started it (`status.startTime`, ms since the epoch).
    pub started_ms: Option<u64>,
    /// Restarts of its containers and init containers in all (`restartCount`s).
    pub restarts: u64,
    /// When its Ready condition last changed (`lastTransitionTime`, ms since the epoch).
    pub ready_changed_ms: Option<u64>,
    /// The stored object (for adoption and release, which rewrite its owner references).
    pub object: Value,
}

impl PodView {
    /// A pod from its stored object and the status its node gossips (if any).
    pub fn new(object: &Value, status: Option<&Value>) -> Self {
        Self::from_object(object.clone(), status)
    }

    /// Like [`PodView::new`], keeping `object` (no copy of it).
    pub fn from_object(object: Value, status: Option<&Value>) -> Self {
        let meta = &object["metadata"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let phase = match status.and_then(|s| s["phase"].as_str()) {
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Pending,
        };
        let ready = status
            .and_then(|s| s["conditions"].as_array())
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let ready_changed_ms = status
            .and_then(|s| s["conditions"].as_array())
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| time_ms(&c["lastTransitionTime"]));
        let restarts = ["containerStatuses", "initContainerStatuses"]
            .into_iter()
            .flat_map(|field| {
                status
                    .and_then(|s| s[field].as_array())
                    .into_iter()
                    .flatten()
            })
            .filter_map(|c| c["restartCount"].as_u64())
            .fold(0u64, u64::saturating_add);
        Self {
            started_ms: status.and_then(|s| time_ms(&s["startTime"])),
            restarts,
            ready_changed_ms,
            namespace: meta["namespace"].as_str().unwrap_or("default").to_owned(),
            name: text(&meta["name"]),
            uid: text(&meta["uid"]),
            labels: string_map(&meta["labels"]),
            controller_uid: controller_of(&object),
            node: object["spec"]["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            phase,
            ready,
            created_ms: created_ms(&object),
            deleting: !meta["deletionTimestamp"].is_null(),
            terminated: status.map(terminated_containers).unwrap_or_default(),
            conditions: status
                .and_then(|s| s["conditions"].as_array())
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    Some((
                        c["type"].as_str()?.to_owned(),
                        c["status"].as_str()?.to_owned(),
                    ))
                })
                .collect(),
            object,
        }
    }

    /// When this ready pod becomes available: `min_ready_ms` after it last turned ready
    /// (Kubernetes' `minReadySeconds`); None if it is not ready. A ready pod whose node reports
    /// no transition time is available at once when `min_ready_ms` is 0, and at
    /// `u64::MAX` (never, until it reports one) otherwise.
    pub fn available_at(&self, min_ready_ms: u64) -> Option<u64> {
        if !self.ready {
            return None;
        }
        if min_ready_ms == 0 {
            return Some(0);
        }
        Some(
            self.ready_changed_ms
                .map_or(u64::MAX, |t| t.saturating_add(min_ready_ms)),
        )
    }

    /// Ready for at least `min_ready_ms` at `now_ms` (an available replica).
    pub fn is_available(&self, min_ready_ms: u64, now_ms: u64) -> bool {
        self.available_at(min_ready_ms)
            .is_some_and(|at| at <= now_ms)
    }

    /// Not yet ended nor being deleted (Succeeded, Failed and terminating pods do not count
    /// toward replicas, as in Kubernetes: a replacement starts while one terminates).
    pub fn is_active(&self) -> bool {
        !self.deleting && !matches!(self.phase, Phase::Succeeded | Phase::Failed)
    }
}

/// The ended containers of a pod status: (name, exit code, init container).
fn terminated_containers(status: &Value) -> Vec<(String, i64, bool)> {
    [
        ("containerStatuses", false),
        ("initContainerStatuses", true),
    ]
    .into_iter()
    .flat_map(|(field, init)| {
        status[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(move |c| {
                let code = c["state"]["terminated"]["exitCode"].as_i64()?;
                Some((c["name"].as_str()?.to_owned(), code, init))
            })
    })
    .collect()
}

/// What a reconcile asks the shell to write (through the same store API users write with).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A new object (a pod, a ReplicaSet).
    Create(Value),
    /// A changed object, written whole.
    Update(Value),
    Delete {
        kind: &'static str,
        namespace: String,
        name: String,
        uid: String,
    },
    /// The object's reconcile failed (it panicked): nothing is written for it this pass; the
    /// shell records a Warning event `ReconcileFailed` with `message` ([`super::quarantine`]).
    Failed {
        object: shoal_model::event::ObjectRef,
        message: String,
    },
    /// Nothing to write: reconcile again at `at_ms` (ms since the epoch) even if nothing
    /// changes by then — a decision that only time changes (a pod ready for
    /// `minReadySeconds`, a deadline) is due then (kube-runtime's `Action::requeue`). The
    /// shell's loop wakes at the earliest one asked for; changes wake it sooner anyway.
    Requeue { at_ms: u64 },
    /// Annotations added to an object as stored now (existing keys are kept: each is a
    /// register of its own, so nothing another writer added is lost).
    Annotate {
        kind: &'static str,
        namespace: String,
        name: String,
        uid: String,
        annotations: BTreeMap<String, String>,
    },
    /// A ControllerRevision's `revision` number set (a StatefulSet's template went back to an
    /// older revision, which becomes the newest, as upstream renumbers it).
    Renumber {
        namespace: String,
        name: String,
        uid: String,
        revision: i64,
    },
    /// The target's `spec.replicas` set (what the `/scale` subresource changes), by the
    /// HorizontalPodAutoscaler `autoscaler`, for the reason `message`.
    Scale {
        kind: &'static str,
        namespace: String,
        name: String,
        uid: String,
        replicas: i64,
        autoscaler: String,
        autoscaler_uid: String,
        message: String,
    },
}

/// `spec.minReadySeconds` of a workload, in ms (0 if absent).
pub fn min_ready_ms(object: &Value) -> u64 {
    object["spec"]["minReadySeconds"]
        .as_u64()
        .unwrap_or(0)
        .saturating_mul(1000)
}

/// A [`Action::Requeue`] at the earliest time one of `pods` that is ready but not yet
/// available becomes available (none if there is no such pod).
pub fn requeue_for_availability<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    min_ready_ms: u64,
    now_ms: u64,
) -> Option<Action> {
    pods.into_iter()
        .filter_map(|p| p.available_at(min_ready_ms))
        .filter(|at| *at > now_ms && *at != u64::MAX)
        .min()
        .map(|at_ms| Action::Requeue { at_ms })
}

impl Action {
    /// Deletes `pod` (its uid as a precondition: a new pod of the same name is not touched).
    pub fn delete_pod(pod: &PodView) -> Self {
        Action::Delete {
            kind: "Pod",
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        }
    }
}

/// The pods of `owner`'s namespace it controls, as upstream's controller ref manager claims
/// them: an owned pod whose labels still match its selector is kept; one whose labels stopped
/// matching is released (an update is pushed to `actions`; the owner makes a replacement); an
/// active orphan that matches and that `adoptable` accepts is adopted. Shared by the
/// ReplicaSet and StatefulSet controllers.
pub fn claim_pods<'a>(
    owner: &Value,
    pods: impl IntoIterator<Item = &'a PodView>,
    adoptable: &dyn Fn(&PodView) -> bool,
    actions: &mut Vec<Action>,
) -> Vec<&'a PodView> {
    let selector = selector(owner);
    let uid = owner["metadata"]["uid"].as_str().unwrap_or_default();
    let namespace = owner["metadata"]["namespace"].as_str().unwrap_or("default");
    let mut mine: Vec<&PodView> = Vec::new();
    for pod in pods.into_iter().filter(|p| p.namespace == namespace) {
        let matching = selects(&selector, &pod.labels);
        match pod.controller_uid.as_deref() {
            Some(controller) if controller == uid => {
                if matching {
                    mine.push(pod);
                } else {
                    actions.push(Action::Update(super::replica_set::with_owner(
                        &pod.object,
                        None,
                    )));
                }
            }
            None if matching && pod.is_active() && adoptable(pod) => {
                actions.push(Action::Update(super::replica_set::with_owner(
                    &pod.object,
                    Some(owner),
                )));
                mine.push(pod);
            }
            _ => {}
        }
    }
    mine
}

pub use shoal_model::placement::string_map;

/// The uid of `object`'s controlling owner.
pub fn controller_of(object: &Value) -> Option<String> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
        .map(str::to_owned)
}

/// ms since the epoch as an RFC 3339 time to the second, as Kubernetes writes its times.
pub fn rfc3339_seconds(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

pub fn created_ms(object: &Value) -> u64 {
    time_ms(&object["metadata"]["creationTimestamp"]).unwrap_or(0)
}

/// An RFC 3339 time as ms since the epoch (`None`: absent, malformed or before the epoch).
fn time_ms(v: &Value) -> Option<u64> {
    let t = humantime::parse_rfc3339(v.as_str()?).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(d.as_millis()).ok()
}

/// `spec.selector` of a workload; an empty or invalid one selects nothing (the API refuses
/// workloads without a selector).
pub fn selector(object: &Value) -> Option<Term> {
    let term = label_selector(&object["spec"]["selector"]).ok()?;
    (!term.is_empty()).then_some(term)
}

pub fn selects(selector: &Option<Term>, labels: &BTreeMap<String, String>) -> bool {
    selector.as_ref().is_some_and(|t| term_matches(t, labels))
}

/// An owner reference to `owner` that makes it the controller.
pub fn controller_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// `spec.replicas` (Kubernetes' default 1), never negative.
pub fn replicas(object: &Value) -> u64 {
    object["spec"]["replicas"]
        .as_u64()
        .unwrap_or(if object["spec"]["replicas"].is_null() {
            1
        } else {
            0
        })
}

/// The characters Kubernetes uses in generated names (no vowels, no look-alikes).
pub const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `len` characters of the generated-name alphabet from a number.
fn encode(mut n: u64, len: usize) -> String {
    (0..len)
        .map(|_| {
            let c = NAME_ALPHABET[(n % NAME_ALPHABET.len() as u64) as usize];
            n /= NAME_ALPHABET.len() as u64;
            c as char
        })
        .collect()
}

/// A 5-character suffix for a generated name from a random number.
pub fn name_suffix(random: u64) -> String {
    encode(random, 5)
}

/// A stable short hash of a pod template (the `pod-template-hash` label), in the
/// generated-name alphabet. The template is hashed with the apiserver's defaults filled in, so
/// a template stored without them (written before both APIs defaulted alike) and the same
/// template defaulted by a later write are one template, not a rollout.
pub fn template_hash(template: &Value) -> String {
    use sha2::Digest;
    let mut template = template.clone();
    shoal_model::validation::hashed_template(&mut template);
    if let Some(labels) = template["metadata"]["labels"].as_object_mut() {
        labels.remove("pod-template-hash");
    }
    // serde_json maps are sorted: the text is canonical.
    let digest = sha2::Sha256::digest(template.to_string().as_bytes());
    encode(
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")),
        10,
    )
}

/// Reading the actions a reconcile returned, for the controllers' table tests.
#[cfg(test)]
pub mod testing {
    use super::Action;
    use serde_json::Value;

    /// The objects `actions` create.
    pub fn created(actions: &[Action]) -> Vec<&Value> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Create(object) => Some(object),
                _ => None,
            })
            .collect()
    }

    /// The names of the objects `actions` delete (of `only` that kind, if given).
    pub fn deleted<'a>(actions: &'a [Action], only: Option<&str>) -> Vec<&'a str> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { kind, name, .. } if only.is_none_or(|k| k == *kind) => {
                    Some(name.as_str())
                }
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_and_names() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "labels": {"app": "web"}, "creationTimestamp": "2026-01-01T00:00:01Z",
            "ownerReferences": [{"uid": "other"}, {"uid": "rs1", "controller": true}]},
            "spec": {"nodeName": "n1"}});
        let status =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        let v = PodView::new(&pod, Some(&status));
        assert_eq!(v.controller_uid.as_deref(), Some("rs1"));
        assert_eq!(v.node.as_deref(), Some("n1"));
        assert!(v.ready && v.is_active() && v.phase == Phase::Running);
        assert_eq!(v.created_ms, 1_767_225_601_000);
        assert_eq!(name_suffix(0), "bbbbb");
        assert_eq!(name_suffix(u64::MAX).len(), 5);
        let t = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}});
        let mut labelled = t.clone();
        labelled["metadata"]["labels"]["pod-template-hash"] = json!("x");
        assert_eq!(template_hash(&t), template_hash(&labelled));
        assert_eq!(template_hash(&t).len(), 10);
        // The apiserver's defaults do not change the hash (a template stored without them and
        // the same template after a write that defaulted it are one), an edit does.
        let bare = json!({"metadata": {"labels": {"app": "web"}},
                          "spec": {"containers": [{"name": "c", "image": "web:1"}]}});
        let mut defaulted = bare.clone();
        shoal_model::validation::default_pod_template(&mut defaulted);
        assert_ne!(defaulted, bare);
        assert_eq!(template_hash(&defaulted), template_hash(&bare));
        // Templates stored with the null lists an earlier defaulting inserted hash as the
        // same template sent without them.
        let mut with_nulls = bare.clone();
        with_nulls["spec"]["volumes"] = Value::Null;
        with_nulls["spec"]["initContainers"] = Value::Null;
        with_nulls["spec"]["containers"][0]["ports"] = Value::Null;
        with_nulls["spec"]["containers"][0]["env"] = Value::Null;
        assert_eq!(template_hash(&with_nulls), template_hash(&bare));
        let mut edited = bare.clone();
        edited["spec"]["containers"][0]["image"] = json!("web:2");
        assert_ne!(template_hash(&edited), template_hash(&bare));
        assert_eq!(replicas(&json!({"spec": {}})), 1);
        assert_eq!(replicas(&json!({"spec": {"replicas": 0}})), 0);
    }
}
