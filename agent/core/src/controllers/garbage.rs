//! Garbage collection through `ownerReferences`, and finalizers, as Kubernetes' garbage
//! collector does them — level-triggered and pure: from what the store holds of each owner
//! (live, being deleted, a tombstone, another incarnation, nothing), whether a dependent stays,
//! loses some references, or goes ([`judge`]); and whether an object being deleted may go
//! ([`finish`]). The shell (`controllers::Controllers::collect_garbage`) runs it on the owner
//! node of each dependent's first owner, and again every round until nothing is left to do,
//! so a collection interrupted by a crash or a partition is simply continued.
//!
//! How an owner was deleted travels with its tombstone: a DELETE with
//! `propagationPolicy: Orphan` first writes [`POLICY_ANNOTATION`] on the object, so any node
//! that sees the tombstone — whatever else it has seen — drops the references instead of
//! deleting the dependents. An object with finalizers, or deleted with `Foreground`
//! (the `foregroundDeletion` finalizer), is not deleted at once: it gets
//! [`DELETION_ANNOTATION`] (served as `metadata.deletionTimestamp`, the store keeps no server
//! fields) and stays until its finalizers are gone.
//!
//! The store is eventually consistent, so an owner *absent* here may be a write not yet
//! replicated: an unknown owner is taken for gone only after [`UNKNOWN_GRACE_MS`] of the
//! dependent's life, and a replaced incarnation only [`REPLACED_GRACE_MS`] after the new one was
//! created (until then its controller may adopt the dependent).

use std::collections::HashMap;

use serde_json::{Value, json};
use shoal_state::{ObjectKey, kind};

pub use super::namespace::DELETION_ANNOTATION;

/// How the object was deleted (`Orphan`, `Foreground`, `Background`), kept on its tombstone.
pub const POLICY_ANNOTATION: &str = "shoal.io/propagation-policy";

/// The grace period a pod's deletion gave it (seconds), served as `deletionGracePeriodSeconds`.
pub const GRACE_ANNOTATION: &str = "shoal.io/deletion-grace-seconds";

/// Kubernetes' finalizer of a foreground deletion: the owner waits for its blocking dependents.
pub const FOREGROUND: &str = "foregroundDeletion";

/// How long a dependent may name an owner this store knows nothing of before it is collected.
pub const UNKNOWN_GRACE_MS: u64 = 300_000;

/// How long after a new incarnation of its owner's name a dependent of the old one is
/// collected (unless the new one adopted it).
pub const REPLACED_GRACE_MS: u64 = 30_000;

/// What the store holds of one owner reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The referenced incarnation, not being deleted.
    Live,
    /// The referenced incarnation, being deleted (finalizers pending); `foreground`: it waits
    /// for its dependents to go.
    Deleting { foreground: bool },
    /// Its tombstone; `orphan`: deleted with `propagationPolicy: Orphan`.
    Deleted { orphan: bool },
    /// Another incarnation of the same name, created at `since_ms`.
    Replaced { since_ms: u64 },
    /// Nothing of that name.
    Unknown,
}

impl Owner {
    /// The owner `uid` from the live object and the tombstone stored under its key.
    pub fn of(uid: &str, live: Option<&Value>, deleted: Option<&Value>) -> Self {
        if let Some(live) = live {
            if live["metadata"]["uid"] == uid {
                if deletion_requested(live) {
                    return Owner::Deleting {
                        foreground: has_finalizer(live, FOREGROUND),
                    };
                }
                return Owner::Live;
            }
            return Owner::Replaced {
                since_ms: created_ms(live),
            };
        }
        match deleted {
            Some(gone) if gone["metadata"]["uid"] == uid => Owner::Deleted {
                orphan: gone["metadata"]["annotations"][POLICY_ANNOTATION] == "Orphan",
            },
            _ => Owner::Unknown,
        }
    }
}

/// What becomes of a dependent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Its references to these owner uids go (the owners were orphaning it, are gone while
    /// another owner lives, or wait for it while another owner lives).
    DropReferences(Vec<String>),
    /// It goes; `foreground`: an owner waits for it, so it waits for its own dependents.
    Delete {
        foreground: bool,
    },
}

/// Kubernetes' classification of a dependent's owners (`attemptToDeleteItem`): with a solid
/// owner left the dependent stays and loses only its references to the others; with none, it
/// is deleted if an owner is gone or waits for it, and only loses its references if every
/// owner orphaned it.
///
/// `synced_ms`: when this store last completed a sync with a peer. An unknown owner counts as
/// gone only if that happened after the grace too (a node that just joined, or came back with
/// an empty data dir, may hold the dependents before their owners arrive).
pub fn judge(
    owners: &[(String, Owner)],
    dependent_created_ms: u64,
    synced_ms: u64,
    now_ms: u64,
) -> Verdict {
    let (mut solid, mut dangling, mut waiting, mut orphaned) = (0, Vec::new(), 0, Vec::new());
    for (uid, owner) in owners {
        match owner {
            Owner::Live | Owner::Deleting { foreground: false } => solid += 1,
            Owner::Deleting { foreground: true } => {
                waiting += 1;
                dangling.push(uid.clone());
            }
            Owner::Deleted { orphan: true } => orphaned.push(uid.clone()),
            Owner::Deleted { orphan: false } => dangling.push(uid.clone()),
            Owner::Replaced { since_ms } => {
                if now_ms.saturating_sub(*since_ms) >= REPLACED_GRACE_MS {
                    dangling.push(uid.clone());
                } else {
                    solid += 1;
                }
            }
            Owner::Unknown => {
                let after_grace = dependent_created_ms.saturating_add(UNKNOWN_GRACE_MS);
                if now_ms >= after_grace && synced_ms >= after_grace {
                    dangling.push(uid.clone());
                } else {
                    solid += 1;
                }
            }
        }
    }
    if solid > 0 {
        let mut drop = dangling;
        drop.extend(orphaned);
        if drop.is_empty() {
            return Verdict::Keep;
        }
        drop.sort();
        return Verdict::DropReferences(drop);
    }
    if dangling.is_empty() {
        if orphaned.is_empty() {
            return Verdict::Keep;
        }
        orphaned.sort();
        return Verdict::DropReferences(orphaned);
    }
    Verdict::Delete {
        foreground: waiting > 0,
    }
}

/// What becomes of an object being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Nothing,
    /// Its `foregroundDeletion` finalizer goes: no blocking dependent is left.
    RemoveForeground,
    /// No finalizer is left: it goes.
    Delete,
    /// A storage protection finalizer goes: no pod names the claim, no claim is bound to the
    /// volume (then it goes, if no other finalizer is left).
    Unprotect(&'static str),
}

/// Whether a claim or volume being deleted may lose its protection finalizer: which one, if
/// so. `claims_in_use`: "namespace/claim" of every pod that names one; `bound`: the volumes
/// that a claim names and that name that claim back.
fn unprotect(
    key: &ObjectKey,
    object: &Value,
    claims_in_use: &std::collections::HashSet<String>,
    bound: &std::collections::HashSet<&str>,
) -> Option<&'static str> {
    use shoal_model::storage::{PV_PROTECTION, PVC_PROTECTION};
    if !key.group.is_empty() {
        return None;
    }
    match key.kind.as_str() {
        "PersistentVolumeClaim" if has_finalizer(object, PVC_PROTECTION) => {
            let claim = format!("{}/{}", key.namespace, key.name);
            (!claims_in_use.contains(&claim)).then_some(PVC_PROTECTION)
        }
        "PersistentVolume" if has_finalizer(object, PV_PROTECTION) => {
            (!bound.contains(key.name.as_str())).then_some(PV_PROTECTION)
        }
        _ => None,
    }
}

/// `blocking`: how many dependents still name it with `blockOwnerDeletion: true`;
/// `kubelet_pending`: a pod whose node is alive, which stops it and then deletes it.
pub fn finish(object: &Value, blocking: usize, kubelet_pending: bool) -> Finish {
    if !deletion_requested(object) || object["kind"] == "Namespace" {
        return Finish::Nothing;
    }
    if has_finalizer(object, FOREGROUND) {
        return if blocking == 0 {
            Finish::RemoveForeground
        } else {
            Finish::Nothing
        };
    }
    if finalizers(object).next().is_none() && !kubelet_pending {
        Finish::Delete
    } else {
        Finish::Nothing
    }
}

/// Whether the node `node` (alive, by name) must stop `pod` before it goes: a pod being
/// deleted that is bound to a live node.
pub fn kubelet_pending(pod: &Value, alive: &dyn Fn(&str) -> bool) -> bool {
    pod["kind"] == "Pod"
        && pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty() && alive(n))
}

/// How long a pod being deleted may take to stop (s), or `None` if it goes at once — the
/// apiserver's rule, asked by the API's DELETE and by the controllers' deletes alike: a pod on
/// a node is stopped by that node within the grace (`requested`, else the pod's
/// `terminationGracePeriodSeconds`, else 30 s), then its object goes; a grace of 0
/// (`--grace-period=0 --force`) and a pod no node holds go at once.
pub fn pod_grace(pod: &Value, requested: Option<i64>) -> Option<u64> {
    let on_a_node = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    if !on_a_node || requested == Some(0) {
        return None;
    }
    let seconds = requested
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30);
    Some(u64::try_from(seconds).unwrap_or(0))
}

/// The grace period a pod's deletion gave it, if any (ms).
pub fn deletion_grace_ms(object: &Value) -> Option<u64> {
    object["metadata"]["annotations"][GRACE_ANNOTATION]
        .as_str()?
        .parse::<u64>()
        .ok()
        .map(|s| s.saturating_mul(1000))
}

/// Records `seconds` as the deletion's grace period unless a shorter one was given (a second
/// DELETE may shorten it, never lengthen it). Returns whether it changed.
pub fn set_grace(object: &mut Value, seconds: u64) -> bool {
    if deletion_grace_ms(object).is_some_and(|ms| ms <= seconds.saturating_mul(1000)) {
        return false;
    }
    let meta = &mut object["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    meta["annotations"][GRACE_ANNOTATION] = json!(seconds.to_string());
    true
}

pub fn deletion_requested(object: &Value) -> bool {
    object["metadata"]["annotations"][DELETION_ANNOTATION].is_string()
}

fn finalizers(object: &Value) -> impl Iterator<Item = &str> {
    object["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

pub fn has_finalizer(object: &Value, name: &str) -> bool {
    finalizers(object).any(|f| f == name)
}

fn created_ms(object: &Value) -> u64 {
    object["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// The dependent's creation time (ms since the epoch).
pub fn dependent_created_ms(object: &Value) -> u64 {
    created_ms(object)
}

/// Marks `object` as being deleted with `policy` (a DELETE of an object that may not go at
/// once): the request time, the policy, and for `Foreground` its finalizer. Returns whether
/// anything changed.
pub fn mark_deleting(object: &mut Value, policy: &str, now: &str) -> bool {
    let mut changed = false;
    let meta = &mut object["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    if !meta["annotations"][DELETION_ANNOTATION].is_string() {
        meta["annotations"][DELETION_ANNOTATION] = json!(now);
        changed = true;
    }
    if meta["annotations"][POLICY_ANNOTATION] != policy {
        meta["annotations"][POLICY_ANNOTATION] = json!(policy);
        changed = true;
    }
    if policy == "Foreground" && !has_finalizer(object, FOREGROUND) {
        let meta = &mut object["metadata"];
        if !meta["finalizers"].is_array() {
            meta["finalizers"] = json!([]);
        }
        if let Some(list) = meta["finalizers"].as_array_mut() {
            list.push(json!(FOREGROUND));
        }
        changed = true;
    }
    changed
}

/// Shows a stored object being deleted as the apiserver does: `deletionTimestamp` (from
/// [`DELETION_ANNOTATION`]) and `deletionGracePeriodSeconds` (a pod's grace, else 0).
pub fn render_deletion(object: &mut Value) {
    let Some(since) = object["metadata"]["annotations"][DELETION_ANNOTATION]
        .as_str()
        .map(str::to_owned)
    else {
        return;
    };
    if object["metadata"]["deletionTimestamp"].is_null() {
        let grace = deletion_grace_ms(object).map_or(0, |ms| ms / 1000);
        object["metadata"]["deletionTimestamp"] = json!(since);
        object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    }
}

/// The uids `object` names as owners, with whether each blocks its owner's deletion.
pub fn owner_references(object: &Value) -> Vec<(&Value, bool)> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r, r["blockOwnerDeletion"] == true))
        .collect()
}

/// The store key of the owner `reference` of the dependent stored under `dependent` (`None`
/// for a kind this agent does not store).
pub fn owner_key(reference: &Value, dependent: &ObjectKey) -> Option<ObjectKey> {
    let info = kind::lookup(
        reference["apiVersion"].as_str()?,
        reference["kind"].as_str().unwrap_or(""),
    )?;
    Some(ObjectKey::new(
        info,
        if info.namespaced {
            &dependent.namespace
        } else {
            ""
        },
        reference["name"].as_str().unwrap_or(""),
    ))
}

/// The live object (as stored) and the tombstone under a key.
pub type Stored<'a> = &'a dyn Fn(&ObjectKey) -> (Option<Value>, Option<Value>);

/// What one round reads besides the objects.
pub struct Round<'a> {
    /// The live object (as stored) and the tombstone under a key.
    pub stored: Stored<'a>,
    /// Whether this node owns the object of this uid (rendezvous over the live nodes).
    pub mine: &'a dyn Fn(&str) -> bool,
    /// Whether the node of this name is alive.
    pub alive: &'a dyn Fn(&str) -> bool,
    /// When this store last completed a sync with a peer ([`judge`]).
    pub synced_ms: u64,
    pub now_ms: u64,
}

/// A dependent this round acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub key: ObjectKey,
    pub uid: String,
    pub verdict: Verdict,
    /// Dependents of its own block it (`blockOwnerDeletion`): deleted in the foreground, it
    /// waits for them.
    pub blocked_by_own: bool,
}

/// What one round does: dependents judged ([`judge`]) and objects being deleted finished
/// ([`finish`]), of those this node owns.
#[derive(Debug, Default)]
pub struct Plan {
    pub dependents: Vec<Step>,
    pub finishing: Vec<(ObjectKey, String, Finish)>,
}

/// One round over every stored object (`objects`): the dependents whose first owner this
/// node owns are judged, the objects being deleted that it owns finished. Each owner is read
/// once however many dependents name it.
pub fn plan(objects: &[(ObjectKey, Value)], round: &Round) -> Plan {
    let mut blocking: HashMap<&str, usize> = HashMap::new();
    for (_, o) in objects {
        for (r, blocks) in owner_references(o) {
            if blocks && let Some(uid) = r["uid"].as_str() {
                *blocking.entry(uid).or_default() += 1;
            }
        }
    }
    // What the storage protection finalizers wait for: pods naming claims, claims bound to
    // volumes that name them back.
    let mut claims_in_use = std::collections::HashSet::new();
    let mut bound = std::collections::HashSet::new();
    for (key, o) in objects {
        match (key.kind.as_str(), key.group.is_empty()) {
            ("Pod", true) => {
                for (_, claim) in shoal_model::storage::claims_of(o) {
                    claims_in_use.insert(format!("{}/{claim}", key.namespace));
                }
            }
            ("PersistentVolumeClaim", true) => {
                if let Some(volume) = o["spec"]["volumeName"].as_str().filter(|v| !v.is_empty()) {
                    bound.insert((volume, key.namespace.as_str(), key.name.as_str()));
                }
            }
            _ => {}
        }
    }
    let bound: std::collections::HashSet<&str> = objects
        .iter()
        .filter(|(key, _)| key.kind == "PersistentVolume")
        .filter(|(key, o)| {
            let r = &o["spec"]["claimRef"];
            bound.contains(&(
                key.name.as_str(),
                r["namespace"].as_str().unwrap_or_default(),
                r["name"].as_str().unwrap_or_default(),
            ))
        })
        .map(|(key, _)| key.name.as_str())
        .collect();
    let mut owners: HashMap<ObjectKey, (Option<Value>, Option<Value>)> = HashMap::new();
    let mut plan = Plan::default();
    for (key, o) in objects {
        let uid = o["metadata"]["uid"].as_str().unwrap_or("");
        let blocked = blocking.get(uid).copied().unwrap_or(0);
        if deletion_requested(o)
            && (round.mine)(uid)
            && let Some(finalizer) = unprotect(key, o, &claims_in_use, &bound)
        {
            plan.finishing
                .push((key.clone(), uid.to_owned(), Finish::Unprotect(finalizer)));
        } else if deletion_requested(o) && (round.mine)(uid) {
            match finish(o, blocked, kubelet_pending(o, round.alive)) {
                Finish::Nothing => {}
                step => plan.finishing.push((key.clone(), uid.to_owned(), step)),
            }
        }
        let refs = owner_references(o);
        let Some(first) = refs.first().and_then(|(r, _)| r["uid"].as_str()) else {
            continue;
        };
        if !(round.mine)(first) {
            continue;
        }
        let judged: Vec<(String, Owner)> = refs
            .iter()
            .map(|(r, _)| {
                let owner_uid = r["uid"].as_str().unwrap_or("").to_owned();
                let owner = match owner_key(r, key) {
                    Some(owner_key) => {
                        let (live, gone) = owners.entry(owner_key.clone()).or_insert_with(|| {
                            let (mut live, gone) = (round.stored)(&owner_key);
                            if let Some(o) = live.as_mut() {
                                render_deletion(o);
                            }
                            (live, gone)
                        });
                        Owner::of(&owner_uid, live.as_ref(), gone.as_ref())
                    }
                    // A kind this agent does not store cannot be judged: kept.
                    None => Owner::Live,
                };
                (owner_uid, owner)
            })
            .collect();
        let verdict = judge(
            &judged,
            dependent_created_ms(o),
            round.synced_ms,
            round.now_ms,
        );
        if verdict != Verdict::Keep {
            plan.dependents.push(Step {
                key: key.clone(),
                uid: uid.to_owned(),
                verdict,
                blocked_by_own: blocked > 0,
            });
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(list: &[(&str, Owner)]) -> Vec<(String, Owner)> {
        list.iter()
            .map(|(u, o)| ((*u).to_owned(), o.clone()))
            .collect()
    }

    #[test]
    fn a_dependent_goes_with_its_last_owner_and_keeps_a_live_one() {
        let now = 1_000_000;
        let cases = [
            (vec![("a", Owner::Live)], Verdict::Keep),
            (
                vec![("a", Owner::Deleted { orphan: false })],
                Verdict::Delete { foreground: false },
            ),
            // Orphaned: the references go, the dependent stays.
            (
                vec![("a", Owner::Deleted { orphan: true })],
                Verdict::DropReferences(vec!["a".into()]),
            ),
            // One owner left: only the gone one's reference goes.
            (
                vec![("a", Owner::Live), ("b", Owner::Deleted { orphan: false })],
                Verdict::DropReferences(vec!["b".into()]),
            ),
            // An owner deleting in the foreground waits for it: deleted in the foreground too.
            (
                vec![("a", Owner::Deleting { foreground: true })],
                Verdict::Delete { foreground: true },
            ),
            // ...unless another owner holds it: then it only lets the deleting one go.
            (
                vec![
                    ("a", Owner::Deleting { foreground: true }),
                    ("b", Owner::Live),
                ],
                Verdict::DropReferences(vec!["a".into()]),
            ),
            // An owner with finalizers pending in the background still holds it.
            (
                vec![("a", Owner::Deleting { foreground: false })],
                Verdict::Keep,
            ),
            // Orphaned by one, the other gone: it goes.
            (
                vec![
                    ("a", Owner::Deleted { orphan: true }),
                    ("b", Owner::Deleted { orphan: false }),
                ],
                Verdict::Delete { foreground: false },
            ),
            (vec![], Verdict::Keep),
        ];
        for (list, want) in cases {
            assert_eq!(judge(&owners(&list), 0, now, now), want, "{list:?}");
        }
    }

    #[test]
    fn an_owner_not_seen_here_is_waited_for_before_its_dependents_go() {
        // Unknown: perhaps not replicated yet; gone once the dependent is 5 minutes old.
        let unknown = owners(&[("a", Owner::Unknown)]);
        let later = 1_000 + UNKNOWN_GRACE_MS;
        assert_eq!(judge(&unknown, 1_000, 61_000, 61_000), Verdict::Keep);
        assert_eq!(
            judge(&unknown, 1_000, later, later),
            Verdict::Delete { foreground: false }
        );
        // ...and only once this store has synced with a peer since: a store that has not may
        // simply not hold the owner yet.
        assert_eq!(
            judge(&unknown, 1_000, later - 1, later + 60_000),
            Verdict::Keep
        );
        // Replaced by a newer incarnation of the name: its controller may adopt the dependent
        // first (ReplicaSets and Jobs do); collected 30 s after the new one appeared.
        let replaced = owners(&[("a", Owner::Replaced { since_ms: 50_000 })]);
        assert_eq!(judge(&replaced, 0, 0, 60_000), Verdict::Keep);
        assert_eq!(
            judge(&replaced, 0, 0, 50_000 + REPLACED_GRACE_MS),
            Verdict::Delete { foreground: false }
        );
    }

    #[test]
    fn the_store_tells_which_owner_it_is() {
        let live = json!({"metadata": {"uid": "u1", "creationTimestamp": "2026-12-02T00:00:10Z"}});
        assert_eq!(Owner::of("u1", Some(&live), None), Owner::Live);
        assert_eq!(
            Owner::of("u0", Some(&live), None),
            Owner::Replaced {
                since_ms: 1_796_169_610_000
            }
        );
        let mut deleting = live.clone();
        mark_deleting(&mut deleting, "Foreground", "2026-12-02T00:01:00Z");
        assert_eq!(
            Owner::of("u1", Some(&deleting), None),
            Owner::Deleting { foreground: true }
        );
        let mut gone = json!({"metadata": {"uid": "u1"}});
        assert_eq!(
            Owner::of("u1", None, Some(&gone)),
            Owner::Deleted { orphan: false }
        );
        gone["metadata"]["annotations"] = json!({POLICY_ANNOTATION: "Orphan"});
        assert_eq!(
            Owner::of("u1", None, Some(&gone)),
            Owner::Deleted { orphan: true }
        );
        // A tombstone of another incarnation says nothing of this one.
        assert_eq!(Owner::of("u9", None, Some(&gone)), Owner::Unknown);
        assert_eq!(Owner::of("u1", None, None), Owner::Unknown);
    }

    #[test]
    fn an_object_being_deleted_goes_once_its_finalizers_are_gone() {
        let mut object = json!({"kind": "ConfigMap", "metadata": {"name": "x", "finalizers": ["example.com/keep"]}});
        assert_eq!(
            finish(&object, 0, false),
            Finish::Nothing,
            "not being deleted"
        );
        assert!(mark_deleting(
            &mut object,
            "Background",
            "2026-12-02T00:00:00Z"
        ));
        assert!(!mark_deleting(
            &mut object,
            "Background",
            "2026-12-02T00:09:00Z"
        ));
        assert_eq!(
            finish(&object, 0, false),
            Finish::Nothing,
            "a user's finalizer"
        );
        object["metadata"]["finalizers"] = json!([]);
        assert_eq!(finish(&object, 0, false), Finish::Delete);
        // Foreground: waits for the blocking dependents, then its finalizer goes.
        let mut owner = json!({"kind": "Deployment", "metadata": {"name": "web"}});
        mark_deleting(&mut owner, "Foreground", "2026-12-02T00:00:00Z");
        assert_eq!(owner["metadata"]["finalizers"], json!([FOREGROUND]));
        assert_eq!(finish(&owner, 2, false), Finish::Nothing);
        assert_eq!(finish(&owner, 0, false), Finish::RemoveForeground);
        // Shown as the apiserver shows it; the first request's time is kept.
        render_deletion(&mut owner);
        assert_eq!(
            owner["metadata"]["deletionTimestamp"],
            "2026-12-02T00:00:00Z"
        );
        assert_eq!(owner["metadata"]["deletionGracePeriodSeconds"], 0);
        // Namespaces are the namespace controller's.
        let mut ns = json!({"kind": "Namespace", "metadata": {"name": "team"}});
        mark_deleting(&mut ns, "Background", "2026-12-02T00:00:00Z");
        assert_eq!(finish(&ns, 0, false), Finish::Nothing);
    }

    #[test]
    fn a_round_reads_each_owner_once_and_acts_only_on_what_this_node_owns() {
        let rs_kind = kind::lookup("apps/v1", "ReplicaSet").unwrap();
        let pod_kind = kind::lookup("v1", "Pod").unwrap();
        let pod = |name: &str, owner_uid: &str| {
            (
                ObjectKey::new(pod_kind, "default", name),
                json!({"kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                        "uid": owner_uid, "controller": true, "blockOwnerDeletion": true}]}}),
            )
        };
        // The ReplicaSet `web` was deleted (uid rs-1) and re-created (rs-2, long ago).
        let objects = vec![
            pod("a", "rs-1"),
            pod("b", "rs-1"),
            pod("c", "rs-2"),
            pod("d", "rs-9"),
        ];
        let reads = std::cell::Cell::new(0);
        let stored = |key: &ObjectKey| {
            reads.set(reads.get() + 1);
            assert_eq!(key.kind, rs_kind.kind);
            (
                Some(
                    json!({"metadata": {"uid": "rs-2", "creationTimestamp": "2026-01-01T00:00:00Z"}}),
                ),
                None,
            )
        };
        let mine = |uid: &str| uid != "rs-9";
        let plan = plan(
            &objects,
            &Round {
                stored: &stored,
                mine: &mine,
                alive: &|_| true,
                synced_ms: 0,
                now_ms: 1_800_000_000_000,
            },
        );
        assert_eq!(reads.get(), 1, "one read of web for every pod naming it");
        // a and b belong to the replaced incarnation (long replaced): collected; c to the
        // live one: kept; d's owner is another node's to judge.
        let gone: Vec<&str> = plan
            .dependents
            .iter()
            .map(|d| d.key.name.as_str())
            .collect();
        assert_eq!(gone, ["a", "b"]);
        assert!(
            plan.dependents
                .iter()
                .all(|d| d.verdict == Verdict::Delete { foreground: false })
        );
        assert!(plan.finishing.is_empty());
    }

    /// The storage protection finalizers: a claim being deleted keeps its finalizer while a
    /// pod names it, a volume being deleted while a claim is bound to it (both ways); then the
    /// finalizer goes and, none other left, so does the object.
    #[test]
    fn protection_finalizers_hold_claims_in_use_and_bound_volumes() {
        use shoal_model::storage::{PV_PROTECTION, PVC_PROTECTION};
        let k = |kind_name: &str| kind::lookup("v1", kind_name).unwrap();
        let deleting = |mut o: Value, finalizer: &str| {
            o["metadata"]["finalizers"] = json!([finalizer]);
            mark_deleting(&mut o, "Background", "2026-12-07T00:00:00Z");
            o
        };
        let claim = |name: &str, volume: &str| {
            (
                ObjectKey::new(k("PersistentVolumeClaim"), "default", name),
                deleting(
                    json!({"metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}")},
                        "spec": {"volumeName": volume}}),
                    PVC_PROTECTION,
                ),
            )
        };
        let volume = |name: &str, claim: &str| {
            (
                ObjectKey::new(k("PersistentVolume"), "", name),
                deleting(
                    json!({"metadata": {"name": name, "uid": format!("u-{name}")},
                        "spec": {"claimRef": {"namespace": "default", "name": claim}}}),
                    PV_PROTECTION,
                ),
            )
        };
        let pod = (
            ObjectKey::new(k("Pod"), "default", "app"),
            json!({"metadata": {"name": "app", "namespace": "default", "uid": "u-app"},
                "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "used"}}]}}),
        );
        let objects = vec![
            pod,
            claim("used", "pv-used"),
            claim("free", "pv-free"),
            volume("pv-used", "used"),
            // Bound by a claim that names it, but it names another claim: not bound.
            volume("pv-free", "someone-else"),
            volume("pv-orphan", "gone"),
        ];
        let plan = plan(
            &objects,
            &Round {
                stored: &|_| (None, None),
                mine: &|_| true,
                alive: &|_| true,
                synced_ms: 0,
                now_ms: 1_800_000_000_000,
            },
        );
        let unprotected: Vec<(&str, &Finish)> = plan
            .finishing
            .iter()
            .map(|(key, _, f)| (key.name.as_str(), f))
            .collect();
        assert_eq!(
            unprotected,
            [
                ("free", &Finish::Unprotect(PVC_PROTECTION)),
                ("pv-free", &Finish::Unprotect(PV_PROTECTION)),
                ("pv-orphan", &Finish::Unprotect(PV_PROTECTION)),
            ]
        );
    }

    #[test]
    fn a_pod_on_a_node_is_deleted_within_its_grace_and_any_other_at_once() {
        let bound = json!({"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5}});
        assert_eq!(pod_grace(&bound, None), Some(5), "the pod's own grace");
        assert_eq!(pod_grace(&bound, Some(2)), Some(2), "the DELETE's");
        assert_eq!(pod_grace(&bound, Some(0)), None, "--grace-period=0 --force");
        assert_eq!(pod_grace(&bound, Some(-3)), Some(0));
        let default = json!({"spec": {"nodeName": "n1"}});
        assert_eq!(pod_grace(&default, None), Some(30));
        for unbound in [json!({"spec": {}}), json!({"spec": {"nodeName": ""}})] {
            assert_eq!(pod_grace(&unbound, None), None);
        }
    }

    #[test]
    fn a_pod_being_deleted_waits_for_its_live_node_with_the_shortest_grace_given() {
        let mut pod = json!({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        mark_deleting(&mut pod, "Background", "2026-12-02T00:00:00Z");
        assert!(set_grace(&mut pod, 30));
        assert!(set_grace(&mut pod, 5), "a second delete may shorten it");
        assert!(!set_grace(&mut pod, 20), "...never lengthen it");
        assert_eq!(deletion_grace_ms(&pod), Some(5_000));
        let alive = |n: &str| n == "n1";
        let dead = |_: &str| false;
        assert!(kubelet_pending(&pod, &alive));
        assert!(
            !kubelet_pending(&pod, &dead),
            "a dead node's pod goes at once"
        );
        render_deletion(&mut pod);
        assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 5);
        let unbound = json!({"kind": "Pod", "metadata": {"name": "q"}, "spec": {}});
        assert!(!kubelet_pending(&unbound, &alive));
    }
}
