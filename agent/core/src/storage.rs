//! A node's volume binder (pure; issue #39): what a node does for the claims of the pods bound
//! to it, and for the volumes pinned to it. The auction places a pod whose claims wait for
//! their first consumer (`WaitForFirstConsumer`) anywhere it fits; the node that won it then
//! binds each claim — to a static volume of its own that satisfies it, else to a volume the
//! built-in provisioner makes in its data dir — and from then on the pod (and any later pod of
//! the claim) can only run there (`shoal_model::storage::placement`). A claim is bound only by
//! the node its pod runs on, so no claim is bound to a node that lost the pod's auction; two
//! nodes that both thought they won (a binding conflict the merge resolves) both write the
//! claim, the merge keeps one binding, and the loser's volume, bound to nothing, is reclaimed.
//!
//! A claim of an `Immediate` class (or of no class) is bound without waiting for a pod, to the
//! smallest static volume that satisfies it, claims taken in name order: every node computes
//! the same assignment from the same store, and the node the volume is pinned to writes it
//! (volumes without node affinity are left to claims whose pods place them).
//!
//! The node also reclaims: a volume its provisioner made whose claim is gone (or bound to
//! another volume), with `reclaimPolicy: Delete`, has its directory removed and is deleted —
//! never while a pod of this node still names its claim (upstream's `pvc-protection`, seen
//! from the one node that can be using a local volume).

use std::collections::BTreeSet;

use serde_json::Value;
use shoal_model::storage::{
    self, LOCAL_PATH, PROVISIONED_BY, claims_of, node_of, provisioned_volume, satisfies,
};

/// One thing the node does.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Make the volume's directory and store it (the built-in provisioner).
    Provision { volume: Value },
    /// Claim the static volume `volume` for the claim: its `claimRef` set.
    Take {
        volume: String,
        volume_uid: String,
        claim_ref: Value,
    },
    /// Bind the claim to `volume` (`spec.volumeName`, selected on this node).
    Bind {
        namespace: String,
        claim: String,
        claim_uid: String,
        volume: String,
    },
    /// Remove the directory of the provisioned volume and delete it.
    Reclaim { volume: String, uid: String },
    /// Grow the provisioned volume to what its claim now asks (`allowVolumeExpansion`): its
    /// `capacity.storage` set to `storage`.
    Expand {
        volume: String,
        uid: String,
        storage: Value,
    },
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn claim_ref(claim: &Value) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"],
        "uid": claim["metadata"]["uid"],
    })
}

/// What node `node` does, given the pods bound to it (`pods`, those being deleted too), every
/// claim, volume and class, and where its provisioner makes volumes (`root`, the directory
/// each volume's name is joined to).
pub fn plan(
    node: &str,
    pods: &[Value],
    claims: &[Value],
    volumes: &[Value],
    classes: &[Value],
    root: &str,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let claim = |ns: &str, name: &str| {
        claims.iter().find(|c| {
            text(&c["metadata"]["namespace"]) == ns && text(&c["metadata"]["name"]) == name
        })
    };
    let class = |name: &str| {
        classes
            .iter()
            .find(|c| text(&c["metadata"]["name"]) == name)
    };
    // The claims this node's pods name: (namespace, claim name).
    let mut used: BTreeSet<(String, String)> = BTreeSet::new();
    let mut handled: BTreeSet<String> = BTreeSet::new();
    let mut taken: BTreeSet<String> = BTreeSet::new();
    for pod in pods {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let deleting = !pod["metadata"]["annotations"]["shoal.io/deletion-requested"].is_null();
        for (_, name) in claims_of(pod) {
            used.insert((ns.to_owned(), name.clone()));
            if deleting {
                continue;
            }
            let Some(c) = claim(ns, &name) else { continue };
            let uid = text(&c["metadata"]["uid"]).to_owned();
            if !c["metadata"]["annotations"]["shoal.io/deletion-requested"].is_null()
                || !handled.insert(uid.clone())
            {
                continue;
            }
            let bound_to = text(&c["spec"]["volumeName"]);
            if !bound_to.is_empty() {
                // Bound here to a volume this node's provisioner was making, whose write did
                // not land (the claim's and the volume's writes go together): made again.
                let provisioner = class(text(&c["spec"]["storageClassName"]))
                    .is_some_and(|k| k["provisioner"] == LOCAL_PATH);
                let missing = !volumes
                    .iter()
                    .any(|v| text(&v["metadata"]["name"]) == bound_to);
                if provisioner
                    && missing
                    && bound_to == format!("pvc-{uid}")
                    && c["metadata"]["annotations"][storage::SELECTED_NODE] == node
                    && let Some(k) = class(text(&c["spec"]["storageClassName"]))
                {
                    let volume = provisioned_volume(c, k, node, &format!("{root}/{bound_to}"));
                    steps.push(Step::Provision { volume });
                }
                continue;
            }
            let bind = |volume: &str| Step::Bind {
                namespace: ns.to_owned(),
                claim: name.clone(),
                claim_uid: uid.clone(),
                volume: volume.to_owned(),
            };
            // A volume already made or taken for it (the bind did not happen yet).
            if let Some(v) = volumes
                .iter()
                .find(|v| text(&v["spec"]["claimRef"]["uid"]) == uid)
            {
                if node_of(v).is_none_or(|n| n == node) {
                    steps.push(bind(text(&v["metadata"]["name"])));
                }
                continue;
            }
            // A static volume of this node that satisfies it, the smallest.
            let fitting = volumes
                .iter()
                .filter(|v| v["spec"]["claimRef"].is_null())
                .filter(|v| v["metadata"]["annotations"][PROVISIONED_BY].is_null())
                .filter(|v| node_of(v).is_none_or(|n| n == node))
                .filter(|v| !taken.contains(text(&v["metadata"]["name"])))
                .filter(|v| satisfies(v, c))
                .min_by_key(|v| {
                    (
                        storage::capacity_bytes(v),
                        text(&v["metadata"]["name"]).to_owned(),
                    )
                });
            if let Some(v) = fitting {
                let name = text(&v["metadata"]["name"]).to_owned();
                taken.insert(name.clone());
                steps.push(Step::Take {
                    volume: name.clone(),
                    volume_uid: text(&v["metadata"]["uid"]).to_owned(),
                    claim_ref: claim_ref(c),
                });
                steps.push(bind(&name));
                continue;
            }
            // Else the built-in provisioner, if the claim's class is its.
            if let Some(k) = class(text(&c["spec"]["storageClassName"]))
                .filter(|k| k["provisioner"] == LOCAL_PATH)
            {
                let name = format!("pvc-{uid}");
                let volume = provisioned_volume(c, k, node, &format!("{root}/{name}"));
                steps.push(Step::Provision { volume });
                steps.push(bind(&name));
            }
        }
    }
    // Immediate claims: the same assignment on every node; the volume's node writes it.
    let mut waiting: Vec<&Value> = claims
        .iter()
        .filter(|c| text(&c["spec"]["volumeName"]).is_empty())
        .filter(|c| c["metadata"]["annotations"]["shoal.io/deletion-requested"].is_null())
        .filter(|c| {
            let name = text(&c["spec"]["storageClassName"]);
            match class(name) {
                Some(k) => k["volumeBindingMode"] != "WaitForFirstConsumer",
                None => name.is_empty(),
            }
        })
        .collect();
    waiting.sort_by_key(|c| {
        (
            text(&c["metadata"]["namespace"]).to_owned(),
            text(&c["metadata"]["name"]).to_owned(),
        )
    });
    let mut assigned: BTreeSet<String> = volumes
        .iter()
        .filter(|v| !v["spec"]["claimRef"].is_null())
        .map(|v| text(&v["metadata"]["name"]).to_owned())
        .collect();
    for c in waiting {
        let uid = text(&c["metadata"]["uid"]);
        // Taken already (the bind not done yet).
        if let Some(v) = volumes
            .iter()
            .find(|v| text(&v["spec"]["claimRef"]["uid"]) == uid)
        {
            if node_of(v).as_deref() == Some(node) {
                steps.push(Step::Bind {
                    namespace: text(&c["metadata"]["namespace"]).to_owned(),
                    claim: text(&c["metadata"]["name"]).to_owned(),
                    claim_uid: uid.to_owned(),
                    volume: text(&v["metadata"]["name"]).to_owned(),
                });
            }
            continue;
        }
        let fitting = volumes
            .iter()
            .filter(|v| v["metadata"]["annotations"][PROVISIONED_BY].is_null())
            .filter(|v| node_of(v).is_some())
            .filter(|v| !assigned.contains(text(&v["metadata"]["name"])))
            .filter(|v| satisfies(v, c))
            .min_by_key(|v| {
                (
                    storage::capacity_bytes(v),
                    text(&v["metadata"]["name"]).to_owned(),
                )
            });
        let Some(v) = fitting else { continue };
        let name = text(&v["metadata"]["name"]).to_owned();
        assigned.insert(name.clone());
        if node_of(v).as_deref() == Some(node) && handled.insert(uid.to_owned()) {
            steps.push(Step::Take {
                volume: name.clone(),
                volume_uid: text(&v["metadata"]["uid"]).to_owned(),
                claim_ref: claim_ref(c),
            });
            steps.push(Step::Bind {
                namespace: text(&c["metadata"]["namespace"]).to_owned(),
                claim: text(&c["metadata"]["name"]).to_owned(),
                claim_uid: uid.to_owned(),
                volume: name,
            });
        }
    }
    // Reclaim what this node's provisioner made and nothing uses any more.
    for v in volumes {
        if v["metadata"]["annotations"][PROVISIONED_BY] != LOCAL_PATH
            || node_of(v).as_deref() != Some(node)
            || v["spec"]["persistentVolumeReclaimPolicy"] != "Delete"
        {
            continue;
        }
        let reference = &v["spec"]["claimRef"];
        let (ns, name) = (text(&reference["namespace"]), text(&reference["name"]));
        if used.contains(&(ns.to_owned(), name.to_owned())) {
            continue;
        }
        let volume = text(&v["metadata"]["name"]);
        let current = claim(ns, name).filter(|c| c["metadata"]["uid"] == reference["uid"]);
        let orphaned = match current {
            None => true,
            // Bound to another volume (the merge kept another node's binding).
            Some(c) => {
                let bound_to = text(&c["spec"]["volumeName"]);
                !bound_to.is_empty() && bound_to != volume
            }
        };
        if orphaned {
            steps.push(Step::Reclaim {
                volume: volume.to_owned(),
                uid: text(&v["metadata"]["uid"]).to_owned(),
            });
        }
    }
    // Grow what this node's provisioner made whose claim asks for more now (the API let it
    // grow: its class expands).
    for v in volumes {
        if v["metadata"]["annotations"][PROVISIONED_BY] != LOCAL_PATH
            || node_of(v).as_deref() != Some(node)
        {
            continue;
        }
        let reference = &v["spec"]["claimRef"];
        let volume = text(&v["metadata"]["name"]);
        if let Some(c) = claim(text(&reference["namespace"]), text(&reference["name"]))
            .filter(|c| c["metadata"]["uid"] == reference["uid"])
            .filter(|c| text(&c["spec"]["volumeName"]) == volume)
            && storage::requested_bytes(c) > storage::capacity_bytes(v)
        {
            steps.push(Step::Expand {
                volume: volume.to_owned(),
                uid: text(&v["metadata"]["uid"]).to_owned(),
                storage: c["spec"]["resources"]["requests"]["storage"].clone(),
            });
        }
    }
    steps
}

/// An Event about a claim that is not bound, in the persistent-volume controller's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimEvent {
    /// The claim's namespace, name and uid.
    pub claim: (String, String, String),
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Why each claim of `claims` that is not bound waits (`named`: whether a pod names the claim,
/// by namespace and name): a claim of a `WaitForFirstConsumer` class that no pod names waits
/// for one; a claim of a class that does not exist cannot be provisioned; a claim of no class
/// that no static volume satisfies cannot be bound.
pub fn claim_events(
    claims: &[Value],
    volumes: &[Value],
    classes: &[Value],
    named: &dyn Fn(&str, &str) -> bool,
) -> Vec<ClaimEvent> {
    let mut events = Vec::new();
    for c in claims {
        if !text(&c["spec"]["volumeName"]).is_empty()
            || !c["metadata"]["annotations"]["shoal.io/deletion-requested"].is_null()
        {
            continue;
        }
        let (ns, name) = (
            text(&c["metadata"]["namespace"]),
            text(&c["metadata"]["name"]),
        );
        let event = |warning, reason, message: String| ClaimEvent {
            claim: (
                ns.to_owned(),
                name.to_owned(),
                text(&c["metadata"]["uid"]).to_owned(),
            ),
            warning,
            reason,
            message,
        };
        let class_name = text(&c["spec"]["storageClassName"]);
        let class = classes
            .iter()
            .find(|k| text(&k["metadata"]["name"]) == class_name);
        match class {
            Some(k) if k["volumeBindingMode"] == "WaitForFirstConsumer" => {
                if !named(ns, name) {
                    events.push(event(
                        false,
                        "WaitForFirstConsumer",
                        "waiting for first consumer to be created before binding".into(),
                    ));
                }
            }
            Some(_) => {}
            None if class_name.is_empty() => {
                let fits = volumes
                    .iter()
                    .any(|v| v["spec"]["claimRef"].is_null() && satisfies(v, c));
                if !fits {
                    events.push(event(
                        false,
                        "FailedBinding",
                        "no persistent volumes available for this claim and no storage class is set"
                            .into(),
                    ));
                }
            }
            None => events.push(event(
                true,
                "ProvisioningFailed",
                format!("storageclass.storage.k8s.io {class_name:?} not found"),
            )),
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use shoal_model::storage::{DEFAULT_CLASS, built_in_class};

    fn claim(name: &str, extra: Value) -> Value {
        let mut c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}")},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": DEFAULT_CLASS,
                "resources": {"requests": {"storage": "1Gi"}}}});
        if let (Some(spec), Value::Object(more)) = (c["spec"].as_object_mut(), extra) {
            spec.extend(more);
        }
        c
    }

    fn pod(claims: &[&str]) -> Value {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "n1", "volumes": volumes}})
    }

    fn static_volume(name: &str, size: &str, node: Option<&str>) -> Value {
        let mut v = json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "uid": format!("uv-{name}")},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": DEFAULT_CLASS, "hostPath": {"path": "/mnt/x"}}});
        if let Some(node) = node {
            v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}});
        }
        v
    }

    #[test]
    fn unbound_claims_say_why_they_wait() {
        let classes = [built_in_class()];
        let claims = [
            claim("lonely", json!({})),
            claim("wanted", json!({})),
            claim("bound", json!({"volumeName": "v"})),
            claim("no-class", json!({"storageClassName": ""})),
            claim("fits", json!({"storageClassName": ""})),
            claim("typo", json!({"storageClassName": "fsat"})),
        ];
        let mut fitting = static_volume("pv", "2Gi", None);
        fitting["spec"]["storageClassName"] = json!("");
        let volumes = [fitting];
        let named = |_: &str, name: &str| name == "wanted" || name == "fits";
        // "fits" has a volume that satisfies it (not yet taken): no event.
        let volumes_for = |name: &str| {
            if name == "no-class" {
                &[][..]
            } else {
                &volumes[..]
            }
        };
        let events: Vec<(String, &str, bool)> = claims
            .iter()
            .flat_map(|c| {
                claim_events(
                    std::slice::from_ref(c),
                    volumes_for(text(&c["metadata"]["name"])),
                    &classes,
                    &named,
                )
            })
            .map(|e| (e.claim.1, e.reason, e.warning))
            .collect();
        assert_eq!(
            events,
            [
                ("lonely".to_owned(), "WaitForFirstConsumer", false),
                ("no-class".to_owned(), "FailedBinding", false),
                ("typo".to_owned(), "ProvisioningFailed", true),
            ]
        );
    }

    #[test]
    fn a_pods_waiting_claim_is_provisioned_on_its_node_and_bound_once() {
        let classes = [built_in_class()];
        let steps = plan(
            "n1",
            &[pod(&["www"]), pod(&["www"])],
            &[claim("www", json!({}))],
            &[],
            &classes,
            "/d/volumes",
        );
        assert_eq!(steps.len(), 2, "{steps:?}");
        let Step::Provision { volume } = &steps[0] else {
            panic!("{steps:?}")
        };
        assert_eq!(volume["metadata"]["name"], "pvc-u-www");
        assert_eq!(volume["spec"]["local"]["path"], "/d/volumes/pvc-u-www");
        assert_eq!(node_of(volume).as_deref(), Some("n1"));
        assert_eq!(
            steps[1],
            Step::Bind {
                namespace: "default".into(),
                claim: "www".into(),
                claim_uid: "u-www".into(),
                volume: "pvc-u-www".into()
            }
        );
        // Made already, the bind not yet done: bound now, nothing made again.
        let made = volume.clone();
        let steps = plan(
            "n1",
            &[pod(&["www"])],
            &[claim("www", json!({}))],
            std::slice::from_ref(&made),
            &classes,
            "/d/volumes",
        );
        assert!(matches!(steps.as_slice(), [Step::Bind { .. }]), "{steps:?}");
        // Bound: nothing to do. A claim of a class without this provisioner waits.
        let mut bound = claim("www", json!({"volumeName": "pvc-u-www"}));
        bound["metadata"]["annotations"] = json!({storage::SELECTED_NODE: "n1"});
        assert_eq!(
            plan(
                "n1",
                &[pod(&["www"])],
                std::slice::from_ref(&bound),
                &[made],
                &classes,
                "/d"
            ),
            vec![]
        );
        // Bound here, its volume's write lost: made again (not bound again).
        let again = plan("n1", &[pod(&["www"])], &[bound], &[], &classes, "/d");
        assert!(
            matches!(again.as_slice(), [Step::Provision { .. }]),
            "{again:?}"
        );
        let other = claim("www", json!({"storageClassName": "nfs"}));
        assert_eq!(
            plan("n1", &[pod(&["www"])], &[other], &[], &classes, "/d"),
            vec![]
        );
    }

    #[test]
    fn a_fitting_static_volume_of_the_node_is_taken_before_anything_is_made() {
        let classes = [built_in_class()];
        let volumes = [
            static_volume("big", "10Gi", Some("n1")),
            static_volume("small", "2Gi", Some("n1")),
            static_volume("elsewhere", "1Gi", Some("n2")),
            static_volume("tiny", "100Mi", None),
        ];
        let steps = plan(
            "n1",
            &[pod(&["a"])],
            &[claim("a", json!({}))],
            &volumes,
            &classes,
            "/d",
        );
        assert!(
            matches!(&steps[0], Step::Take { volume, .. } if volume == "small"),
            "{steps:?}"
        );
        assert!(matches!(&steps[1], Step::Bind { volume, .. } if volume == "small"));
        // Two claims never take one volume.
        let steps = plan(
            "n1",
            &[pod(&["a", "b"])],
            &[claim("a", json!({})), claim("b", json!({}))],
            &volumes,
            &classes,
            "/d",
        );
        let took: Vec<&str> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Take { volume, .. } => Some(volume.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(took, ["small", "big"]);
    }

    #[test]
    fn immediate_claims_are_bound_by_the_node_of_the_volume_every_node_assigns_them() {
        let classes = [
            built_in_class(),
            json!({"metadata": {"name": "manual"}, "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "Immediate"}),
        ];
        let manual = |name: &str| claim(name, json!({"storageClassName": "manual"}));
        let mut volumes = vec![
            static_volume("on-n1", "1Gi", Some("n1")),
            static_volume("on-n2", "1Gi", Some("n2")),
        ];
        for v in &mut volumes {
            v["spec"]["storageClassName"] = json!("manual");
        }
        let claims = [manual("a"), manual("b"), manual("c")];
        // a gets on-n1, b gets on-n2 (same capacity: by name), c nothing; each node writes
        // its own, with no pod anywhere.
        let n1 = plan("n1", &[], &claims, &volumes, &classes, "/d");
        let n2 = plan("n2", &[], &claims, &volumes, &classes, "/d");
        assert!(
            matches!(&n1[..], [Step::Take { volume, .. }, Step::Bind { claim, .. }] if volume == "on-n1" && claim == "a"),
            "{n1:?}"
        );
        assert!(
            matches!(&n2[..], [Step::Take { volume, .. }, Step::Bind { claim, .. }] if volume == "on-n2" && claim == "b"),
            "{n2:?}"
        );
        // A waiting (WaitForFirstConsumer) claim is not bound without its pod.
        assert_eq!(
            plan(
                "n1",
                &[],
                &[claim("w", json!({}))],
                &volumes,
                &classes,
                "/d"
            ),
            vec![]
        );
    }

    #[test]
    fn a_provisioned_volume_is_reclaimed_once_nothing_uses_its_claim() {
        let classes = [built_in_class()];
        let c = claim("www", json!({}));
        let volume = provisioned_volume(&c, &built_in_class(), "n1", "/d/pvc-u-www");
        let gone = |v: &Value| {
            let mut v = v.clone();
            v["metadata"]["uid"] = json!("pv-1");
            v
        };
        let v = gone(&volume);
        // The claim deleted, but a pod of this node still names it: kept.
        assert_eq!(
            plan(
                "n1",
                &[pod(&["www"])],
                &[],
                std::slice::from_ref(&v),
                &classes,
                "/d"
            ),
            vec![]
        );
        // No pod names it: reclaimed; on another node, not this one's to reclaim.
        assert_eq!(
            plan("n1", &[], &[], std::slice::from_ref(&v), &classes, "/d"),
            vec![Step::Reclaim {
                volume: "pvc-u-www".into(),
                uid: "pv-1".into()
            }]
        );
        assert_eq!(
            plan("n2", &[], &[], std::slice::from_ref(&v), &classes, "/d"),
            vec![]
        );
        // The claim lives and is bound to it: kept.
        let bound = claim("www", json!({"volumeName": "pvc-u-www"}));
        assert_eq!(
            plan(
                "n1",
                &[],
                &[bound],
                std::slice::from_ref(&v),
                &classes,
                "/d"
            ),
            vec![]
        );
        // The claim was bound to another node's volume (the merge kept that one): reclaimed.
        let elsewhere = claim("www", json!({"volumeName": "pvc-other"}));
        assert_eq!(
            plan(
                "n1",
                &[],
                &[elsewhere],
                std::slice::from_ref(&v),
                &classes,
                "/d"
            )
            .len(),
            1
        );
        // Retain: kept, Released.
        let mut retained = v.clone();
        retained["spec"]["persistentVolumeReclaimPolicy"] = json!("Retain");
        assert_eq!(plan("n1", &[], &[], &[retained], &classes, "/d"), vec![]);
        // Its claim grown (bound, in use by a pod here): the volume grows, on its node only.
        let mut grown = claim("www", json!({"volumeName": "pvc-u-www"}));
        grown["spec"]["resources"]["requests"]["storage"] = json!("3Gi");
        let expand = vec![Step::Expand {
            volume: "pvc-u-www".into(),
            uid: "pv-1".into(),
            storage: json!("3Gi"),
        }];
        let at = |node: &str| {
            plan(
                node,
                &[pod(&["www"])],
                std::slice::from_ref(&grown),
                std::slice::from_ref(&v),
                &classes,
                "/d",
            )
        };
        assert_eq!(at("n1"), expand);
        assert_eq!(at("n2"), vec![]);
    }
}
