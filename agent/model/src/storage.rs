//! Storage objects (issue #39): core/v1 PersistentVolumeClaim and PersistentVolume,
//! storage.k8s.io/v1 StorageClass — their checks and defaults as the apiserver's, and the
//! pure readings the scheduler, the node's volume binder and the API share: what a claim is
//! bound to, where a volume lives, what status each shows.
//!
//! Volumes here are node-local: a directory the built-in provisioner made under a node's data
//! dir (`shoal.io/local-path`), or a static `hostPath` or `local` volume an administrator
//! created. Either is pinned to one node by `spec.nodeAffinity` (required for `local`, written
//! by the provisioner), so a pod whose claim is bound to one can only run there.

use serde_json::{Value, json};

use crate::FieldError;

/// The built-in provisioner's name, and the StorageClass every cluster starts with.
pub const LOCAL_PATH: &str = "shoal.io/local-path";
pub const DEFAULT_CLASS: &str = "local-path";
/// The annotation naming the default StorageClass (claims without `storageClassName` get it).
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The claim annotation naming the node its WaitForFirstConsumer volume is made on (upstream's
/// `volume.kubernetes.io/selected-node`).
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The label key of a node's name (what a volume's node affinity names).
pub const HOSTNAME: &str = "kubernetes.io/hostname";

const ACCESS_MODES: &[&str] = &[
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

use crate::validation::{default_field, one_of};

fn err(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
    FieldError::new(field, detail)
}

fn access_modes(value: &Value, path: &str) -> Result<(), FieldError> {
    let modes = value
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| err(path, "Required value: at least 1 access mode is required"))?;
    for (i, mode) in modes.iter().enumerate() {
        one_of(&format!("{path}[{i}]"), mode, ACCESS_MODES)?;
        if mode.is_null() {
            return Err(err(format!("{path}[{i}]"), "Required value"));
        }
    }
    if modes.len() > 1 && modes.iter().any(|m| m == "ReadWriteOncePod") {
        return Err(err(
            path,
            "Forbidden: may not use ReadWriteOncePod with other access modes",
        ));
    }
    Ok(())
}

/// A storage quantity at `path` (bytes).
fn storage(value: &Value, path: &str) -> Result<u64, FieldError> {
    let text = value
        .as_str()
        .map(str::to_owned)
        .or_else(|| value.as_u64().map(|n| n.to_string()))
        .ok_or_else(|| err(path, "Required value"))?;
    crate::quantity::bytes(&text).map_err(|e| err(path, format!("Invalid value: {text:?}: {e}")))
}

/// The bytes a claim asks for (`spec.resources.requests.storage`; 0 if unreadable).
pub fn requested_bytes(claim: &Value) -> u64 {
    storage(
        &claim["spec"]["resources"]["requests"]["storage"],
        "storage",
    )
    .unwrap_or(0)
}

/// The bytes a volume offers (`spec.capacity.storage`; 0 if unreadable).
pub fn capacity_bytes(volume: &Value) -> u64 {
    storage(&volume["spec"]["capacity"]["storage"], "storage").unwrap_or(0)
}

pub fn validate_claim(claim: &Value) -> Result<(), FieldError> {
    let spec = &claim["spec"];
    if !spec.is_object() {
        return Err(err("spec", "Required value"));
    }
    access_modes(&spec["accessModes"], "spec.accessModes")?;
    storage(
        &spec["resources"]["requests"]["storage"],
        "spec.resources.requests[storage]",
    )?;
    one_of("spec.volumeMode", &spec["volumeMode"], &["Filesystem"])?;
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        shoal_state::labels::check_dns_subdomain(class).map_err(|r| {
            err(
                "spec.storageClassName",
                format!("Invalid value: {class:?}: {r}"),
            )
        })?;
    }
    Ok(())
}

/// What an update of a claim may change, as the apiserver rules (`old` as stored, `new` as
/// asked, `expandable`: whether the claim's class has `allowVolumeExpansion`): its spec is
/// immutable but for the storage it asks, which may only grow, and only for a bound claim of
/// an expandable class (upstream's validation and its PersistentVolumeClaimResize
/// admission). The binder's own writes (`volumeName`, a class set where none was) are not
/// users' changes and pass.
pub fn validate_claim_update(old: &Value, new: &Value, expandable: bool) -> Result<(), FieldError> {
    let (was, asked) = (requested_bytes(old), requested_bytes(new));
    let field = "spec.resources.requests[storage]";
    if asked < was {
        return Err(err(
            field,
            "Forbidden: field can not be less than previous value",
        ));
    }
    let mut before = old["spec"].clone();
    let mut after = new["spec"].clone();
    for spec in [&mut before, &mut after] {
        if let Some(s) = spec.as_object_mut() {
            s.remove("resources");
            s.remove("volumeAttributesClassName");
        }
    }
    // What the binder and the DefaultStorageClass admission fill in where nothing was.
    for k in ["volumeName", "storageClassName"] {
        if before[k].as_str().is_none_or(str::is_empty) {
            if let Some(s) = before.as_object_mut() {
                s.remove(k);
            }
            if let Some(s) = after.as_object_mut() {
                s.remove(k);
            }
        }
    }
    let bound = old["spec"]["volumeName"]
        .as_str()
        .is_some_and(|v| !v.is_empty());
    if before != after || (asked > was && !bound) {
        return Err(err(
            "spec",
            "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    if asked > was && !expandable {
        return Err(err(
            field,
            "Forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
        ));
    }
    Ok(())
}

pub fn validate_volume(volume: &Value) -> Result<(), FieldError> {
    let spec = &volume["spec"];
    if !spec.is_object() {
        return Err(err("spec", "Required value"));
    }
    access_modes(&spec["accessModes"], "spec.accessModes")?;
    storage(&spec["capacity"]["storage"], "spec.capacity[storage]")?;
    one_of(
        "spec.persistentVolumeReclaimPolicy",
        &spec["persistentVolumeReclaimPolicy"],
        &["Retain", "Delete"],
    )?;
    one_of("spec.volumeMode", &spec["volumeMode"], &["Filesystem"])?;
    let sources: Vec<&str> = ["hostPath", "local"]
        .into_iter()
        .filter(|s| !spec[*s].is_null())
        .collect();
    match sources.as_slice() {
        [] => {
            return Err(err(
                "spec",
                "Required value: must specify a volume type (hostPath or local: the volumes this node-local cluster serves)",
            ));
        }
        [_] => {}
        _ => {
            return Err(err(
                "spec",
                "Forbidden: may not specify more than 1 volume type",
            ));
        }
    }
    let source = sources[0];
    let path = spec[source]["path"].as_str().unwrap_or_default();
    if !path.starts_with('/') || path.split('/').any(|p| p == "..") {
        return Err(err(
            format!("spec.{source}.path"),
            format!("Invalid value: {path:?}: must be an absolute path without '..'"),
        ));
    }
    if source == "local" && node_of(volume).is_none() {
        return Err(err(
            "spec.nodeAffinity",
            "Required value: Local volume requires node affinity",
        ));
    }
    Ok(())
}

pub fn validate_class(class: &Value) -> Result<(), FieldError> {
    if class["provisioner"].as_str().is_none_or(str::is_empty) {
        return Err(err("provisioner", "Required value"));
    }
    one_of(
        "reclaimPolicy",
        &class["reclaimPolicy"],
        &["Retain", "Delete"],
    )?;
    one_of(
        "volumeBindingMode",
        &class["volumeBindingMode"],
        &["Immediate", "WaitForFirstConsumer"],
    )
}

/// The apiserver's defaults for the storage kinds (a claim's class is the admission's, which
/// needs the store: [`default_class_for`]).
pub fn default(kind: &str, object: &mut Value) {
    match kind {
        "PersistentVolumeClaim" => {
            default_field(&mut object["spec"], "volumeMode", json!("Filesystem"))
        }
        "PersistentVolume" => {
            default_field(
                &mut object["spec"],
                "persistentVolumeReclaimPolicy",
                json!("Retain"),
            );
            default_field(&mut object["spec"], "volumeMode", json!("Filesystem"));
        }
        "StorageClass" => {
            default_field(object, "reclaimPolicy", json!("Delete"));
            default_field(object, "volumeBindingMode", json!("Immediate"));
        }
        _ => {}
    }
}

/// The DefaultStorageClass admission: a claim that names no class gets the default one among
/// `classes`, if there is one (the newest of several, as upstream).
pub fn default_class_for(claim: &mut Value, classes: &[Value]) {
    if !claim["spec"]["storageClassName"].is_null() || !claim["spec"].is_object() {
        return;
    }
    let default = classes
        .iter()
        .filter(|c| c["metadata"]["annotations"][DEFAULT_CLASS_ANNOTATION] == "true")
        .max_by(|a, b| {
            a["metadata"]["creationTimestamp"]
                .as_str()
                .cmp(&b["metadata"]["creationTimestamp"].as_str())
        });
    if let Some(name) = default.and_then(|c| c["metadata"]["name"].as_str()) {
        claim["spec"]["storageClassName"] = json!(name);
    }
}

/// The StorageClass a cluster starts with: volumes made by the built-in provisioner on the node
/// the first pod that uses the claim is placed on, deleted with their claim.
pub fn built_in_class() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": DEFAULT_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": LOCAL_PATH,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": true,
    })
}

/// The one node a volume's `spec.nodeAffinity` admits (`kubernetes.io/hostname In [node]`), if
/// it names exactly one.
pub fn node_of(volume: &Value) -> Option<String> {
    let terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].as_array()?;
    let mut nodes = terms.iter().flat_map(|t| {
        t["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["key"] == HOSTNAME && e["operator"] == "In")
            .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
    });
    let first = nodes.next()?.as_str()?.to_owned();
    nodes.next().is_none().then_some(first)
}

/// The claims a pod's volumes name, with each volume's name: its `persistentVolumeClaim`s,
/// and its generic ephemeral volumes' claims ([`ephemeral_claim_name`]).
pub fn claims_of(pod: &Value) -> Vec<(String, String)> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let volume = v["name"].as_str()?;
            let claim = match v["persistentVolumeClaim"]["claimName"].as_str() {
                Some(claim) => claim.to_owned(),
                None if v.get("ephemeral").is_some() => ephemeral_claim_name(pod_name, volume),
                None => return None,
            };
            Some((volume.to_owned(), claim))
        })
        .collect()
}

/// The claim of a pod's generic ephemeral volume: `<pod>-<volume>`, as upstream names it.
pub fn ephemeral_claim_name(pod: &str, volume: &str) -> String {
    format!("{pod}-{volume}")
}

/// The claims `pod`'s generic ephemeral volumes need (`ephemeral.volumeClaimTemplate`): each
/// named after the pod and the volume, in the pod's namespace, controlled by the pod (the
/// garbage collector deletes it with the pod).
pub fn ephemeral_claims(pod: &Value) -> Vec<Value> {
    let meta = &pod["metadata"];
    let (Some(name), Some(uid)) = (meta["name"].as_str(), meta["uid"].as_str()) else {
        return Vec::new();
    };
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let template = &v.get("ephemeral")?["volumeClaimTemplate"];
            let volume = v["name"].as_str()?;
            let metadata = json!({
                "name": ephemeral_claim_name(name, volume),
                "namespace": meta["namespace"].as_str().unwrap_or("default"),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true}],
            });
            Some(claim_from_template(template, metadata, &json!({})))
        })
        .collect()
}

/// A claim made from a claim template (a StatefulSet's `volumeClaimTemplates` entry, an
/// ephemeral volume's `volumeClaimTemplate`): `metadata` (name, namespace, owners) with the
/// template's labels and annotations, then `labels` over them (as upstream's StatefulSet
/// controller puts its selector's labels over the template's), and the template's spec.
pub fn claim_from_template(template: &Value, mut metadata: Value, labels: &Value) -> Value {
    for field in ["labels", "annotations"] {
        if template["metadata"][field].is_object() {
            metadata[field] = template["metadata"][field].clone();
        }
    }
    if let Some(extra) = labels.as_object().filter(|l| !l.is_empty()) {
        if !metadata["labels"].is_object() {
            metadata["labels"] = json!({});
        }
        if let Some(l) = metadata["labels"].as_object_mut() {
            l.extend(extra.clone());
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": template["spec"],
    })
}

/// Whether the claim `claim` (as stored) of `pod`'s ephemeral volume was made for this pod
/// (controlled by its uid): a claim of that name made otherwise is not the pod's to use.
fn made_for(claim: &Value, pod: &Value) -> bool {
    claim["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["controller"] == true && r["uid"] == pod["metadata"]["uid"])
}

/// The node whose built-in provisioner made `volume`, and the bytes it gave out for it (none
/// for a volume it did not make: a static volume is room an administrator declared).
pub fn given_by(volume: &Value) -> Option<(String, u64)> {
    if volume["metadata"]["annotations"][PROVISIONED_BY] != LOCAL_PATH {
        return None;
    }
    Some((node_of(volume)?, capacity_bytes(volume)))
}

/// Where a pod's claims let it run.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// Only this node (a claim is bound to a volume pinned there, or its volume is being made
    /// there).
    pub node: Option<String>,
    /// Nowhere yet, and why (in kube-scheduler's words).
    pub blocked: Option<String>,
    /// The bytes its unbound claims of the built-in provisioner ask for: the node that takes
    /// the pod provisions them, so it must have that much volume capacity free.
    #[serde(default)]
    pub provision_bytes: u64,
}

/// What kube-scheduler says of a pod whose `ReadWriteOncePod` claim another pod uses.
pub const READ_WRITE_ONCE_POD_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";

/// What a pod's claims say about where it may run, from the stored claims of its namespace
/// (`claim`), volumes (`volume`) and classes (`class`), and whether another pod placed already
/// uses a claim (`used_elsewhere`: a `ReadWriteOncePod` claim is one pod's).
pub fn placement(
    pod: &Value,
    claim: &dyn Fn(&str) -> Option<Value>,
    volume: &dyn Fn(&str) -> Option<Value>,
    class: &dyn Fn(&str) -> Option<Value>,
    used_elsewhere: &dyn Fn(&str) -> bool,
) -> Placement {
    let mut out = Placement::default();
    let pin = |node: String, out: &mut Placement| match &out.node {
        Some(other) if *other != node => {
            out.blocked = Some(format!(
                "node(s) had volume node affinity conflict ({other} and {node})"
            ));
        }
        _ => out.node = Some(node),
    };
    let ephemeral: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("ephemeral").is_some())
        .filter_map(|v| v["name"].as_str())
        .collect();
    for (pod_volume, name) in claims_of(pod) {
        let Some(c) = claim(&name) else {
            out.blocked = Some(format!("persistentvolumeclaim {name:?} not found"));
            return out;
        };
        if ephemeral.contains(&pod_volume.as_str()) && !made_for(&c, pod) {
            out.blocked = Some(format!(
                "PVC {}/{name} was not created for pod {}/{} (pod is not owner)",
                c["metadata"]["namespace"].as_str().unwrap_or("default"),
                pod["metadata"]["namespace"].as_str().unwrap_or("default"),
                pod["metadata"]["name"].as_str().unwrap_or_default(),
            ));
            return out;
        }
        if !c["metadata"]["annotations"]["shoal.io/deletion-requested"].is_null() {
            out.blocked = Some(format!("persistentvolumeclaim {name:?} is being deleted"));
            return out;
        }
        let one_pod = c["spec"]["accessModes"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"));
        if one_pod && used_elsewhere(&name) {
            out.blocked = Some(READ_WRITE_ONCE_POD_CONFLICT.into());
            return out;
        }
        match c["spec"]["volumeName"].as_str().filter(|v| !v.is_empty()) {
            Some(v) => match volume(v).as_ref().and_then(node_of) {
                Some(node) => pin(node, &mut out),
                None if volume(v).is_none() => {
                    out.blocked = Some(format!(
                        "persistentvolumeclaim {name:?} bound to non-existent persistentvolume {v:?}"
                    ));
                    return out;
                }
                None => {}
            },
            None => {
                if let Some(node) = c["metadata"]["annotations"][SELECTED_NODE].as_str() {
                    pin(node.to_owned(), &mut out);
                    continue;
                }
                let class = c["spec"]["storageClassName"].as_str().and_then(class);
                let waits = class
                    .as_ref()
                    .is_some_and(|k| k["volumeBindingMode"] == "WaitForFirstConsumer");
                if !waits {
                    out.blocked = Some("pod has unbound immediate PersistentVolumeClaims".into());
                    return out;
                }
                if class.is_some_and(|k| k["provisioner"] == LOCAL_PATH) {
                    out.provision_bytes = out.provision_bytes.saturating_add(requested_bytes(&c));
                }
            }
        }
    }
    out
}

/// A claim's observed status: Bound to its volume (with the volume's capacity and modes),
/// Lost if that volume is gone, Pending otherwise.
pub fn claim_status(claim: &Value, volume: Option<&Value>) -> Value {
    match (
        claim["spec"]["volumeName"]
            .as_str()
            .filter(|v| !v.is_empty()),
        volume,
    ) {
        (Some(_), Some(v)) => json!({
            "phase": "Bound",
            "accessModes": v["spec"]["accessModes"],
            "capacity": v["spec"]["capacity"],
        }),
        (Some(_), None) => json!({"phase": "Lost"}),
        (None, _) => json!({"phase": "Pending"}),
    }
}

/// A volume's observed status: Bound to the claim its `claimRef` names while that claim
/// exists (same uid), Released once it is gone, Available without a `claimRef`.
pub fn volume_status(volume: &Value, claim: Option<&Value>) -> Value {
    let reference = &volume["spec"]["claimRef"];
    if reference.is_null() {
        return json!({"phase": "Available"});
    }
    let bound = claim
        .is_some_and(|c| reference["uid"].is_null() || c["metadata"]["uid"] == reference["uid"]);
    json!({"phase": if bound { "Bound" } else { "Released" }})
}

/// Whether `volume` (unclaimed) satisfies `claim`: same class, enough capacity, every mode the
/// claim asks, and the claim's selector, as upstream's binder matches them.
pub fn satisfies(volume: &Value, claim: &Value) -> bool {
    let class = |o: &Value, field: &str| o["spec"][field].as_str().unwrap_or("").to_owned();
    if class(volume, "storageClassName") != class(claim, "storageClassName") {
        return false;
    }
    if capacity_bytes(volume) < requested_bytes(claim) {
        return false;
    }
    let modes = volume["spec"]["accessModes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let wanted = claim["spec"]["accessModes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !wanted.iter().all(|m| modes.contains(m)) {
        return false;
    }
    crate::placement::selector_matches(&claim["spec"]["selector"], &volume["metadata"]["labels"])
}

/// The finalizer that keeps a claim while a pod names it (upstream's
/// StorageObjectInUseProtection admission adds it to every new claim).
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer that keeps a volume while a claim is bound to it.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Adds the protection finalizer of a new claim or volume (`kind`), as the apiserver's
/// admission does.
pub fn protect(kind: &str, object: &mut Value) {
    let finalizer = match kind {
        "PersistentVolumeClaim" => PVC_PROTECTION,
        "PersistentVolume" => PV_PROTECTION,
        _ => return,
    };
    let meta = &mut object["metadata"];
    if !meta["finalizers"].is_array() {
        meta["finalizers"] = json!([]);
    }
    if let Some(list) = meta["finalizers"].as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
}

/// The annotation the built-in provisioner writes on the volumes it makes.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// How a node mounts one of a pod's claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimMount {
    /// A volume the built-in provisioner made on this node (its directory under the node's
    /// data dir, named after the volume).
    Provisioned(String),
    /// A static volume: a path of this node (`hostPath` or `local`), under the node's
    /// `hostPath` policy.
    HostPath(String),
    /// Not mountable yet, and why (the claim not bound yet, its volume not made yet).
    Pending(String),
}

/// How node `node` mounts claim `name` (`claim`, and the volume it is bound to, as stored).
pub fn claim_mount(
    name: &str,
    claim: Option<&Value>,
    volume: Option<&Value>,
    node: &str,
) -> ClaimMount {
    let Some(claim) = claim else {
        return ClaimMount::Pending(format!("persistentvolumeclaim {name:?} not found"));
    };
    let Some(volume_name) = claim["spec"]["volumeName"]
        .as_str()
        .filter(|v| !v.is_empty())
    else {
        return ClaimMount::Pending(format!("persistentvolumeclaim {name:?} is not bound yet"));
    };
    let Some(volume) = volume else {
        return ClaimMount::Pending(format!(
            "persistentvolume {volume_name:?} of claim {name:?} does not exist"
        ));
    };
    let reference = &volume["spec"]["claimRef"];
    if !reference["uid"].is_null() && reference["uid"] != claim["metadata"]["uid"] {
        return ClaimMount::Pending(format!(
            "persistentvolume {volume_name:?} is bound to another claim"
        ));
    }
    if let Some(other) = node_of(volume).filter(|n| n != node) {
        return ClaimMount::Pending(format!(
            "persistentvolume {volume_name:?} is on node {other:?}, not {node:?}"
        ));
    }
    if volume["metadata"]["annotations"][PROVISIONED_BY] == LOCAL_PATH {
        return ClaimMount::Provisioned(volume_name.to_owned());
    }
    let path = volume["spec"]["hostPath"]["path"]
        .as_str()
        .or_else(|| volume["spec"]["local"]["path"].as_str())
        .unwrap_or_default();
    ClaimMount::HostPath(path.to_owned())
}

/// The volume the built-in provisioner makes on `node` for `claim` (of `class`): named after
/// the claim's uid, its capacity what the claim asks, pinned to the node, bound to the claim.
pub fn provisioned_volume(claim: &Value, class: &Value, node: &str, path: &str) -> Value {
    let uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{uid}"),
            "annotations": {PROVISIONED_BY: LOCAL_PATH},
            "finalizers": [PV_PROTECTION],
        },
        "spec": {
            "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            "accessModes": claim["spec"]["accessModes"],
            "storageClassName": claim["spec"]["storageClassName"],
            "persistentVolumeReclaimPolicy": class["reclaimPolicy"].as_str().unwrap_or("Delete"),
            "volumeMode": "Filesystem",
            "local": {"path": path},
            "claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"],
                "uid": uid,
            },
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME, "operator": "In", "values": [node]}]}]}},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, class: &str, extra: Value) -> Value {
        let mut c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}")},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                "resources": {"requests": {"storage": "1Gi"}}}});
        if let (Some(spec), Value::Object(more)) = (c["spec"].as_object_mut(), extra) {
            spec.extend(more);
        }
        c
    }

    fn volume(name: &str, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local-path", "local": {"path": "/mnt/v"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": HOSTNAME, "operator": "In", "values": [node]}]}]}}}})
    }

    fn pod(claims: &[&str]) -> Value {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        json!({"spec": {"volumes": volumes}})
    }

    #[test]
    fn claims_volumes_and_classes_are_checked_naming_the_field() {
        assert_eq!(validate_claim(&claim("a", "x", json!({}))), Ok(()));
        let bad = claim("a", "x", json!({"accessModes": []}));
        assert_eq!(validate_claim(&bad).unwrap_err().field, "spec.accessModes");
        let bad = claim(
            "a",
            "x",
            json!({"resources": {"requests": {"storage": "lots"}}}),
        );
        assert_eq!(
            validate_claim(&bad).unwrap_err().field,
            "spec.resources.requests[storage]"
        );
        let bad = claim(
            "a",
            "x",
            json!({"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"]}),
        );
        assert!(
            validate_claim(&bad)
                .unwrap_err()
                .detail
                .contains("ReadWriteOncePod")
        );
        assert_eq!(validate_volume(&volume("v", "n1")), Ok(()));
        let mut unpinned = volume("v", "n1");
        unpinned["spec"]["nodeAffinity"] = Value::Null;
        assert_eq!(
            validate_volume(&unpinned).unwrap_err().field,
            "spec.nodeAffinity"
        );
        let mut nfs = volume("v", "n1");
        nfs["spec"]["local"] = Value::Null;
        nfs["spec"]["nfs"] = json!({"server": "x", "path": "/"});
        assert!(
            validate_volume(&nfs)
                .unwrap_err()
                .detail
                .contains("hostPath or local")
        );
        let mut up = volume("v", "n1");
        up["spec"]["local"]["path"] = json!("/mnt/../etc");
        assert_eq!(validate_volume(&up).unwrap_err().field, "spec.local.path");
        assert_eq!(validate_class(&built_in_class()), Ok(()));
        assert_eq!(
            validate_class(&json!({"provisioner": "p", "volumeBindingMode": "Later"}))
                .unwrap_err()
                .field,
            "volumeBindingMode"
        );
    }

    #[test]
    fn a_claim_without_a_class_gets_the_default_one() {
        let mut c = claim("a", "", json!({}));
        c["spec"]
            .as_object_mut()
            .unwrap()
            .remove("storageClassName");
        let other = json!({"metadata": {"name": "slow"}, "provisioner": "p"});
        default_class_for(&mut c, &[other.clone(), built_in_class()]);
        assert_eq!(c["spec"]["storageClassName"], DEFAULT_CLASS);
        // An explicit "" means no class, as upstream.
        let mut none = claim("a", "", json!({}));
        default_class_for(&mut none, &[built_in_class()]);
        assert_eq!(none["spec"]["storageClassName"], "");
    }

    #[test]
    fn a_pods_claims_pin_it_block_it_or_let_it_go_anywhere() {
        let classes = |name: &str| (name == DEFAULT_CLASS).then(built_in_class);
        let immediate = |name: &str| {
            (name == "fast").then(|| json!({"provisioner": "p", "volumeBindingMode": "Immediate"}))
        };
        let both = |name: &str| classes(name).or_else(|| immediate(name));
        let claims = |name: &str| match name {
            "bound" => Some(claim("bound", DEFAULT_CLASS, json!({"volumeName": "v1"}))),
            "bound-n2" => Some(claim(
                "bound-n2",
                DEFAULT_CLASS,
                json!({"volumeName": "v2"}),
            )),
            "waiting" => Some(claim("waiting", DEFAULT_CLASS, json!({}))),
            "immediate" => Some(claim("immediate", "fast", json!({}))),
            "dangling" => Some(claim(
                "dangling",
                DEFAULT_CLASS,
                json!({"volumeName": "gone"}),
            )),
            _ => None,
        };
        let volumes = |name: &str| match name {
            "v1" => Some(volume("v1", "n1")),
            "v2" => Some(volume("v2", "n2")),
            _ => None,
        };
        let at = |p: &Value| placement(p, &claims, &volumes, &both, &|_| false);
        assert_eq!(at(&pod(&[])), Placement::default());
        // An unbound claim of the built-in provisioner: anywhere with 1Gi of volume room.
        assert_eq!(
            at(&pod(&["waiting"])),
            Placement {
                provision_bytes: 1 << 30,
                ..Default::default()
            }
        );
        let pinned = at(&pod(&["bound", "waiting"]));
        assert_eq!(pinned.node.as_deref(), Some("n1"));
        assert_eq!(
            pinned.provision_bytes,
            1 << 30,
            "a bound claim asks for no more"
        );
        assert!(
            at(&pod(&["bound", "bound-n2"]))
                .blocked
                .unwrap()
                .contains("conflict")
        );
        assert_eq!(
            at(&pod(&["missing"])).blocked.as_deref(),
            Some("persistentvolumeclaim \"missing\" not found")
        );
        assert_eq!(
            at(&pod(&["immediate"])).blocked.as_deref(),
            Some("pod has unbound immediate PersistentVolumeClaims")
        );
        assert!(
            at(&pod(&["dangling"]))
                .blocked
                .unwrap()
                .contains("non-existent")
        );
        // A volume being made on a node pins the pod there already.
        let mut selected = claim("waiting", DEFAULT_CLASS, json!({}));
        selected["metadata"]["annotations"] = json!({SELECTED_NODE: "n3"});
        let claims2 = |name: &str| (name == "waiting").then(|| selected.clone());
        assert_eq!(
            placement(&pod(&["waiting"]), &claims2, &volumes, &both, &|_| false)
                .node
                .as_deref(),
            Some("n3")
        );
        // A ReadWriteOncePod claim another placed pod uses: nowhere; unused: as any claim.
        let mut only = claim(
            "waiting",
            DEFAULT_CLASS,
            json!({"accessModes": ["ReadWriteOncePod"]}),
        );
        only["metadata"]["annotations"] = json!({SELECTED_NODE: "n3"});
        let claims3 = |name: &str| (name == "waiting").then(|| only.clone());
        let used = |name: &str| name == "waiting";
        assert_eq!(
            placement(&pod(&["waiting"]), &claims3, &volumes, &both, &used)
                .blocked
                .as_deref(),
            Some(READ_WRITE_ONCE_POD_CONFLICT)
        );
        assert_eq!(
            placement(&pod(&["waiting"]), &claims3, &volumes, &both, &|_| false)
                .node
                .as_deref(),
            Some("n3")
        );
    }

    #[test]
    fn an_ephemeral_volume_is_a_claim_made_for_its_pod_alone() {
        let pod = json!({"metadata": {"name": "web", "namespace": "ns", "uid": "u-web"},
            "spec": {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                "metadata": {"labels": {"type": "scratch"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}},
                {"name": "cache", "emptyDir": {}}]}});
        assert_eq!(
            claims_of(&pod),
            [("scratch".to_owned(), "web-scratch".to_owned())]
        );
        let made = ephemeral_claims(&pod);
        assert_eq!(made.len(), 1);
        assert_eq!(made[0]["metadata"]["name"], "web-scratch");
        assert_eq!(made[0]["metadata"]["namespace"], "ns");
        assert_eq!(made[0]["metadata"]["labels"]["type"], "scratch");
        assert_eq!(made[0]["metadata"]["ownerReferences"][0]["uid"], "u-web");
        assert_eq!(made[0]["spec"]["resources"]["requests"]["storage"], "1Gi");
        let classes = |name: &str| (name == DEFAULT_CLASS).then(built_in_class);
        let mut claim = made[0].clone();
        claim["spec"]["storageClassName"] = json!(DEFAULT_CLASS);
        let mine = claim.clone();
        let at = |c: &Value| {
            let c = c.clone();
            placement(
                &pod,
                &move |_| Some(c.clone()),
                &|_| None,
                &classes,
                &|_| false,
            )
        };
        assert_eq!(at(&mine).blocked, None);
        // A claim of that name that some other pod (or a user) made: not this pod's.
        claim["metadata"]["ownerReferences"][0]["uid"] = json!("u-other");
        assert_eq!(
            at(&claim).blocked.as_deref(),
            Some("PVC ns/web-scratch was not created for pod ns/web (pod is not owner)")
        );
    }

    #[test]
    fn a_claim_may_only_grow_when_bound_and_its_class_expands() {
        let bound = claim("data", DEFAULT_CLASS, json!({"volumeName": "v1"}));
        let sized = |c: &Value, size: &str| {
            let mut c = c.clone();
            c["spec"]["resources"]["requests"]["storage"] = json!(size);
            c
        };
        assert_eq!(
            validate_claim_update(&bound, &sized(&bound, "2Gi"), true),
            Ok(())
        );
        assert_eq!(validate_claim_update(&bound, &bound, false), Ok(()));
        let field = |r: Result<(), FieldError>| r.unwrap_err().field;
        assert_eq!(
            field(validate_claim_update(&bound, &sized(&bound, "512Mi"), true)),
            "spec.resources.requests[storage]"
        );
        let refused = validate_claim_update(&bound, &sized(&bound, "2Gi"), false).unwrap_err();
        assert!(
            refused.detail.contains("must support resize"),
            "{refused:?}"
        );
        let pending = claim("data", DEFAULT_CLASS, json!({}));
        assert_eq!(
            field(validate_claim_update(
                &pending,
                &sized(&pending, "2Gi"),
                true
            )),
            "spec"
        );
        let mut modes = bound.clone();
        modes["spec"]["accessModes"] = json!(["ReadWriteOncePod"]);
        assert_eq!(field(validate_claim_update(&bound, &modes, true)), "spec");
        // The binder's writes: a volume name where none was.
        assert_eq!(validate_claim_update(&pending, &bound, false), Ok(()));
    }

    #[test]
    fn a_node_mounts_a_bound_claim_of_its_own_only() {
        let class = built_in_class();
        let c = claim("www", DEFAULT_CLASS, json!({}));
        assert!(
            matches!(claim_mount("www", None, None, "n1"), ClaimMount::Pending(m) if m.contains("not found"))
        );
        assert!(
            matches!(claim_mount("www", Some(&c), None, "n1"), ClaimMount::Pending(m) if m.contains("not bound"))
        );
        let v = provisioned_volume(&c, &class, "n1", "/data/volumes/pvc-u-www");
        assert_eq!(validate_volume(&v), Ok(()));
        assert_eq!(v["metadata"]["name"], "pvc-u-www");
        assert_eq!(node_of(&v).as_deref(), Some("n1"));
        let mut bound = c.clone();
        bound["spec"]["volumeName"] = json!("pvc-u-www");
        assert_eq!(
            claim_mount("www", Some(&bound), Some(&v), "n1"),
            ClaimMount::Provisioned("pvc-u-www".into())
        );
        assert!(
            matches!(claim_mount("www", Some(&bound), Some(&v), "n2"), ClaimMount::Pending(m) if m.contains("on node"))
        );
        assert!(
            matches!(claim_mount("www", Some(&bound), None, "n1"), ClaimMount::Pending(m) if m.contains("does not exist"))
        );
        let mut other = bound.clone();
        other["metadata"]["uid"] = json!("u-again");
        assert!(
            matches!(claim_mount("www", Some(&other), Some(&v), "n1"), ClaimMount::Pending(m) if m.contains("another claim"))
        );
        // A static volume: its path, under the node's hostPath policy.
        let mut static_bound = c.clone();
        static_bound["spec"]["volumeName"] = json!("v1");
        assert_eq!(
            claim_mount("www", Some(&static_bound), Some(&volume("v1", "n1")), "n1"),
            ClaimMount::HostPath("/mnt/v".into())
        );
    }

    #[test]
    fn statuses_follow_the_binding() {
        let bound = claim("a", DEFAULT_CLASS, json!({"volumeName": "v1"}));
        let mut v = volume("v1", "n1");
        assert_eq!(claim_status(&bound, Some(&v))["phase"], "Bound");
        assert_eq!(claim_status(&bound, Some(&v))["capacity"]["storage"], "2Gi");
        assert_eq!(claim_status(&bound, None)["phase"], "Lost");
        assert_eq!(
            claim_status(&claim("b", "", json!({})), None)["phase"],
            "Pending"
        );
        assert_eq!(volume_status(&v, None)["phase"], "Available");
        v["spec"]["claimRef"] = json!({"namespace": "default", "name": "a", "uid": "u-a"});
        assert_eq!(volume_status(&v, Some(&bound))["phase"], "Bound");
        assert_eq!(volume_status(&v, None)["phase"], "Released");
        // Another incarnation of the claim's name: released.
        let mut again = bound.clone();
        again["metadata"]["uid"] = json!("u-other");
        assert_eq!(volume_status(&v, Some(&again))["phase"], "Released");
    }

    #[test]
    fn a_static_volume_satisfies_a_claim_as_upstream_matches_them() {
        let v = volume("v1", "n1");
        assert!(satisfies(&v, &claim("a", DEFAULT_CLASS, json!({}))));
        assert!(!satisfies(&v, &claim("a", "other", json!({}))));
        assert!(!satisfies(
            &v,
            &claim(
                "a",
                DEFAULT_CLASS,
                json!({"resources": {"requests": {"storage": "3Gi"}}})
            )
        ));
        assert!(!satisfies(
            &v,
            &claim(
                "a",
                DEFAULT_CLASS,
                json!({"accessModes": ["ReadWriteMany"]})
            )
        ));
        let mut labelled = v.clone();
        labelled["metadata"]["labels"] = json!({"tier": "ssd"});
        let picky = claim(
            "a",
            DEFAULT_CLASS,
            json!({"selector": {"matchLabels": {"tier": "ssd"}}}),
        );
        assert!(satisfies(&labelled, &picky));
        assert!(!satisfies(&v, &picky));
    }
}
