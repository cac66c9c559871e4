//! The one path by which objects enter the store. The Kubernetes API's writes and the control
//! socket's (`shoal apply`) both go through [`prepare`] (the body against the URL, unknown
//! fields, validation and defaulting), [`Admission::check_namespace`] and [`Admission::write`]
//! (ClusterIP and NodePort allocation, a deletion in progress kept, the home node's serialized
//! writes, the delete after an object's last finalizer): what `kubectl apply` is refused,
//! `shoal apply` is refused too.

use axum::http::StatusCode;
use serde_json::{Value, json};
use shoal_state::{ObjectKey, WriteMode};

use super::handlers::{Query, object_error, warn, write_error};
use super::resources::ApiResource;
use super::status::ApiError;
use crate::replication::Replication;
use shoal_model::validation::{self, FieldError};

/// What admission reads beside the object: the store, and where ClusterIPs come from.
#[derive(Clone, Copy)]
pub struct Admission<'a> {
    pub replication: &'a Replication,
    pub service_cidr: ipnet::Ipv4Net,
}

/// Checks the body against the URL, validates, defaults; returns the object to store.
pub fn prepare(
    resource: &ApiResource,
    namespace: Option<&str>,
    name: Option<&str>,
    mut object: Value,
    query: &Query,
) -> Result<shoal_state::ValidObject, ApiError> {
    let Some(info) = resource.kind_info() else {
        return Err(ApiError::method_not_allowed(format!(
            "{} are observed, not written",
            resource.plural
        )));
    };
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    map.entry("apiVersion")
        .or_insert(json!(resource.api_version()));
    map.entry("kind").or_insert(json!(resource.kind));
    let obj_name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
    if object["kind"] != resource.kind || object["apiVersion"] != resource.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({}) or kind ({} vs {})",
            object["apiVersion"],
            resource.api_version(),
            object["kind"],
            resource.kind
        )));
    }
    if let Some(name) = name
        && !obj_name.is_empty()
        && obj_name != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({obj_name}) does not match the name on the URL ({name})"
        )));
    }
    if let Some(name) = name
        && obj_name.is_empty()
        && let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("name".into(), json!(name));
    }
    if let (Some(ns), Some(body_ns)) = (namespace, object["metadata"]["namespace"].as_str())
        && resource.namespaced
        && !body_ns.is_empty()
        && body_ns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    // Unknown fields, at any depth, by the kind's schema (the protobuf descriptors): Strict
    // refuses them, Warn (the default) drops them with a `Warning` header each, Ignore drops
    // them quietly — what the apiserver's decoder does.
    let mode = query
        .get("fieldValidation")
        .map_or("Warn", String::as_str)
        .to_owned();
    if !matches!(mode.as_str(), "Strict" | "Warn" | "Ignore") {
        return Err(ApiError::bad_request(format!(
            "fieldValidation: unsupported value {mode:?} (Strict, Warn or Ignore)"
        )));
    }
    let unknown = super::protobuf::unknown_fields(&mut object, mode != "Strict")
        .unwrap_or_else(|| validation::unknown_fields(resource.kind, &object));
    if !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
        match mode.as_str() {
            "Strict" => {
                return Err(ApiError::bad_request(format!(
                    "strict decoding error: {}",
                    list.join(", ")
                )));
            }
            "Warn" => list.into_iter().for_each(warn),
            _ => {}
        }
    }
    let display_name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let mut valid = shoal_state::validate(object, namespace.unwrap_or("default"))
        .map_err(|e| object_error(resource.kind, &display_name, e))?;
    pod_cidr_block(info.kind, &valid.body)
        .and_then(|()| validation::admit(info.kind, &mut valid.body))
        .map_err(|e| ApiError::invalid(resource.kind, &display_name, &e.field, &e.detail))?;
    Ok(valid)
}

/// A `PodCIDRBlock` lease's name, cidr and node agree, in the network plugin's naming (the
/// one kind whose check belongs to `netplugin`, not to the object model).
fn pod_cidr_block(kind: &str, object: &Value) -> Result<(), FieldError> {
    if kind != "PodCIDRBlock" {
        return Ok(());
    }
    let err = |field: &str, detail: String| FieldError {
        field: field.into(),
        detail,
    };
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let Some((block, holder)) = shoal_net::lease::parse_lease_name(name) else {
        return Err(err(
            "metadata.name",
            format!(
                "Invalid value: {name:?}: must be <block>.<node id>, like 10-88-3-0-24.1f2e3d4c5b6a7980"
            ),
        ));
    };
    if object["spec"]["cidr"].as_str() != Some(block.to_string().as_str()) {
        return Err(err(
            "spec.cidr",
            format!("Invalid value: must be {block}, the block the name stands for"),
        ));
    }
    if object["spec"]["nodeID"].as_str() != Some(holder) {
        return Err(err(
            "spec.nodeID",
            format!("Invalid value: must be {holder:?}, the node the name stands for"),
        ));
    }
    Ok(())
}

/// What admission does to a new pod with the store's help, whoever creates it (a client
/// here, a controller in `controllers.rs`): its ServiceAccount's `imagePullSecrets`.
pub fn admit_new_pod(replication: &Replication, pod: &mut Value) {
    let Some(info) = shoal_state::kind::lookup("v1", "ServiceAccount") else {
        return;
    };
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let account = replication.read(|s| s.get(&ObjectKey::new(info, namespace, name)));
    // Upstream's alphabet for generated suffixes (no vowels, no look-alikes).
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect();
    validation::admit_service_account(pod, account.as_ref(), &suffix);
}

/// The DefaultStorageClass and StorageObjectInUseProtection admissions, whoever creates the
/// claim (a client, the StatefulSet controller): a claim naming no class gets the default one,
/// and every claim the `kubernetes.io/pvc-protection` finalizer.
pub fn admit_new_claim(replication: &Replication, claim: &mut Value) {
    let classes = replication.read(|s| s.list("storage.k8s.io", "StorageClass", None));
    shoal_model::storage::default_class_for(claim, &classes);
    shoal_model::storage::protect("PersistentVolumeClaim", claim);
}

impl Admission<'_> {
    /// Pod Security admission (`shoal_model::pod_security`) for a new pod: its namespace's
    /// `enforce` level refuses it with upstream's 403, its `warn` level adds upstream's
    /// warning. The cluster's default level is `privileged`, as upstream's.
    fn pod_security(&self, name: &str, valid: &shoal_state::ValidObject) -> Result<(), ApiError> {
        use shoal_model::pod_security::{self, Level};
        let labels = shoal_state::kind::lookup("v1", "Namespace")
            .and_then(|info| {
                self.replication
                    .read(|s| s.get(&ObjectKey::new(info, "", &valid.key.namespace)))
            })
            .map(|ns| ns["metadata"]["labels"].clone())
            .unwrap_or(Value::Null);
        let enforce = pod_security::policy(&labels, "enforce", Level::Privileged);
        let warned = pod_security::policy(&labels, "warn", Level::Privileged);
        let template = match valid.info.kind {
            "Pod" => {
                if let Some(violation) = pod_security::check(&valid.body, &enforce) {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        format!("pods {name:?} is forbidden: violates {violation}"),
                    ));
                }
                &valid.body
            }
            "CronJob" => &valid.body["spec"]["jobTemplate"]["spec"]["template"],
            // A workload's pods would be refused: its writer is warned now (as upstream).
            _ => &valid.body["spec"]["template"],
        };
        let mut said = Vec::new();
        for policy in [&enforce, &warned] {
            if let Some(violation) = pod_security::check(template, policy)
                && !said.contains(&violation)
            {
                warn(format!("would violate {violation}"));
                said.push(violation);
            }
        }
        Ok(())
    }

    /// Stores a prepared object (waiting for the write quorum); returns it as stored and
    /// whether this write created it.
    ///
    /// An `ordered` write — a create, or a write with the client's own resourceVersion
    /// precondition — is decided by the object's home node ([`Replication::write_serialized`]),
    /// so no two agents acknowledge writes made from one version. The API's own
    /// read-modify-writes (a patch without the client's precondition) are checked here only:
    /// what they change is field-level and merges with the other agents' writes, as any write.
    pub async fn write(
        &self,
        kind: &str,
        name: &str,
        mut valid: shoal_state::ValidObject,
        mode: WriteMode,
        ordered: bool,
    ) -> Result<(Value, bool), ApiError> {
        if valid.info.kind == "Service" && valid.info.group.is_empty() {
            assign_cluster_ip(self, &mut valid, mode)?;
            assign_node_ports(self, &mut valid, mode)?;
        }
        use shoal_core::controllers::garbage;
        // Being deleted is not undone by an update (the apiserver keeps deletionTimestamp).
        let stored = self.replication.read(|s| s.get(&valid.key));
        if stored.is_none() && valid.info.kind == "Pod" && valid.info.group.is_empty() {
            admit_new_pod(self.replication, &mut valid.body);
        }
        let workload = matches!(
            (valid.info.group, valid.info.kind),
            ("", "Pod")
                | (
                    "apps",
                    "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet"
                )
                | ("batch", "Job" | "CronJob")
        );
        // A new pod, or a workload whose pod template is new or changed (a scale is not
        // checked again).
        let changed = match &stored {
            None => true,
            Some(_) if valid.info.kind == "Pod" => false,
            Some(old) => {
                let template = |o: &Value| {
                    if valid.info.kind == "CronJob" {
                        o["spec"]["jobTemplate"]["spec"]["template"].clone()
                    } else {
                        o["spec"]["template"].clone()
                    }
                };
                template(old) != template(&valid.body)
            }
        };
        if workload && changed {
            self.pod_security(name, &valid)?;
        }
        if stored.is_none() && valid.info.kind == "PersistentVolumeClaim" {
            admit_new_claim(self.replication, &mut valid.body);
        }
        if stored.is_none() && valid.info.kind == "PersistentVolume" {
            shoal_model::storage::protect("PersistentVolume", &mut valid.body);
        }
        if valid.info.group == shoal_model::rbac::GROUP
            && let Some(user) = super::authz::requester()
            && !user.is_master()
        {
            let mut object = valid.body.clone();
            object["kind"] = json!(valid.info.kind);
            if let Err(reason) = super::authz::policy_of(self.replication).may_write(&user, &object)
            {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!(
                        "{}.{} {name:?} is forbidden: {reason}",
                        valid.info.plural, valid.info.group
                    ),
                ));
            }
        }
        if let Some(old) = stored
            .as_ref()
            .filter(|_| matches!(valid.info.kind, "RoleBinding" | "ClusterRoleBinding"))
        {
            shoal_model::rbac::validate_binding_update(old, &valid.body)
                .map_err(|e| ApiError::invalid(kind, name, &e.field, &e.detail))?;
        }
        if let Some(old) = stored
            .as_ref()
            .filter(|_| valid.info.kind == "PersistentVolumeClaim")
        {
            let class = old["spec"]["storageClassName"].as_str().and_then(|c| {
                let info = shoal_state::kind::lookup("storage.k8s.io/v1", "StorageClass")?;
                self.replication
                    .read(|s| s.get(&ObjectKey::new(info, "", c)))
            });
            let expandable = class.is_some_and(|k| k["allowVolumeExpansion"] == true);
            shoal_model::storage::validate_claim_update(old, &valid.body, expandable)
                .map_err(|e| ApiError::invalid(kind, name, &e.field, &e.detail))?;
        }
        if let Some(stored) = stored.filter(garbage::deletion_requested)
            && valid.body["metadata"].is_object()
        {
            let meta = &mut valid.body["metadata"];
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            for a in [
                garbage::DELETION_ANNOTATION,
                garbage::POLICY_ANNOTATION,
                garbage::GRACE_ANNOTATION,
            ] {
                if let Some(v) = stored["metadata"]["annotations"][a].as_str() {
                    meta["annotations"][a] = json!(v);
                }
            }
        }
        let key = valid.key.clone();
        let written = if ordered {
            self.replication.write_serialized(valid, mode).await
        } else {
            self.replication.write(valid, mode).await
        };
        let (object, created) = written.map_err(|e| write_error(kind, name, e))?;
        // The last finalizer of an object being deleted removed: it goes now.
        if garbage::finish(&object, 0, garbage::kubelet_pending(&object, &|_| true))
            == garbage::Finish::Delete
        {
            let uid = object["metadata"]["uid"].as_str().map(str::to_owned);
            self.replication
                .delete(&key, uid.as_deref())
                .await
                .map_err(|e| write_error(kind, name, e))?;
        }
        Ok((object, created))
    }

    /// A namespaced object may be created only in a namespace that exists and is not being
    /// deleted (the built-in namespaces exist from the cluster's start).
    pub fn check_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        let info =
            shoal_state::kind::lookup("v1", "Namespace").expect("Namespace is a stored kind");
        let stored = self
            .replication
            .read(|s| s.get(&ObjectKey::new(info, "", namespace)));
        match stored {
            Some(ns) if shoal_core::controllers::namespace::terminating(&ns) => {
                let mut e = ApiError::new(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!(
                        "unable to create new content in namespace {namespace} because it is being terminated"
                    ),
                );
                e.details = Some(
                    json!({"name": namespace, "kind": "namespaces", "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {namespace} is being terminated"), "field": "metadata.namespace"}]}),
                );
                Err(e)
            }
            Some(_) => Ok(()),
            None if shoal_core::controllers::namespace::BUILT_IN.contains(&namespace) => Ok(()),
            None => Err(ApiError::not_found("namespaces", namespace)),
        }
    }
}

/// A Service's ClusterIP, as the apiserver's allocator gives it: kept across updates
/// (immutable), checked when the user names one, otherwise allocated
/// ([`shoal_model::service_ip::allocate`]; the ClusterIP controller repairs races).
fn assign_cluster_ip(
    state: &Admission<'_>,
    valid: &mut shoal_state::ValidObject,
    mode: WriteMode,
) -> Result<(), ApiError> {
    use shoal_core::controllers::service_ip;
    let cidr = state.service_cidr;
    let name = valid.key.name.clone();
    let invalid = |field: &str, detail: String| ApiError::invalid("Service", &name, field, &detail);
    let key = valid.key.clone();
    let (stored, services) = state
        .replication
        .read(|s| (s.get(&key), s.list("", "Service", None)));
    let spec = &mut valid.body["spec"];
    let asked = spec["clusterIP"].as_str().unwrap_or_default().to_owned();
    let kept = stored
        .as_ref()
        .filter(|_| mode != WriteMode::Create)
        .and_then(|o| o["spec"]["clusterIP"].as_str())
        .unwrap_or_default()
        .to_owned();
    if !kept.is_empty() {
        if asked.is_empty() {
            spec["clusterIP"] = json!(kept);
            spec["clusterIPs"] = json!([kept]);
            return Ok(());
        }
        if asked != kept {
            return Err(invalid(
                "spec.clusterIP",
                format!("Invalid value: {asked:?}: field is immutable"),
            ));
        }
        return Ok(());
    }
    if spec["type"].as_str() == Some("ExternalName") {
        return Ok(());
    }
    if asked == "None" {
        spec["clusterIPs"] = json!(["None"]);
        return Ok(());
    }
    let others: Vec<Value> = services
        .into_iter()
        .filter(|s| {
            s["metadata"]["namespace"].as_str() != Some(key.namespace.as_str())
                || s["metadata"]["name"].as_str() != Some(key.name.as_str())
        })
        .collect();
    let used = service_ip::used(&others, cidr);
    let ip = if asked.is_empty() {
        shoal_model::service_ip::allocate(cidr, &key.namespace, &key.name, &used)
            .map_err(|e| invalid("spec.clusterIP", format!("Internal error: {e}")))?
    } else {
        let ip: std::net::Ipv4Addr = asked.parse().map_err(|_| {
            invalid(
                "spec.clusterIP",
                format!("Invalid value: {asked:?}: must be a valid IPv4 address or None"),
            )
        })?;
        shoal_model::service_ip::check(cidr, ip).map_err(|e| {
            invalid(
                "spec.clusterIPs",
                format!("Invalid value: [{asked:?}]: failed to allocate IP {asked}: {e}"),
            )
        })?;
        if used.contains(&ip) {
            return Err(invalid(
                "spec.clusterIPs",
                format!(
                    "Invalid value: [{asked:?}]: failed to allocate IP {asked}: provided IP is already allocated"
                ),
            ));
        }
        ip
    };
    spec["clusterIP"] = json!(ip.to_string());
    spec["clusterIPs"] = json!([ip.to_string()]);
    Ok(())
}

/// Node ports of a NodePort/LoadBalancer Service: kept across updates when the body leaves
/// them out, checked when named (range, not another Service's), allocated otherwise.
fn assign_node_ports(
    state: &Admission<'_>,
    valid: &mut shoal_state::ValidObject,
    mode: WriteMode,
) -> Result<(), ApiError> {
    use shoal_core::controllers::service_ip;
    if !service_ip::wants_node_ports(&valid.body) {
        return Ok(());
    }
    let key = valid.key.clone();
    let name = key.name.clone();
    let (stored, services) = state
        .replication
        .read(|s| (s.get(&key), s.list("", "Service", None)));
    let mut used = service_ip::used_node_ports(&services, (&key.namespace, &key.name));
    let old_ports: Vec<Value> = stored
        .filter(|_| mode != WriteMode::Create)
        .and_then(|o| o["spec"]["ports"].as_array().cloned())
        .unwrap_or_default();
    let Some(ports) = valid.body["spec"]["ports"].as_array_mut() else {
        return Ok(());
    };
    for (i, p) in ports.iter_mut().enumerate() {
        if p["nodePort"].is_null()
            && let Some(old) = old_ports
                .iter()
                .find(|o| o["port"] == p["port"] && o["name"] == p["name"])
        {
            p["nodePort"] = old["nodePort"].clone();
        }
        if p["nodePort"].is_null() {
            continue;
        }
        let n = p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok());
        match n {
            Some(n) if shoal_model::service_ip::NODE_PORTS.contains(&n) && !used.contains(&n) => {
                used.insert(n);
            }
            Some(n) if used.contains(&n) => {
                return Err(ApiError::invalid(
                    "Service",
                    &name,
                    &format!("spec.ports[{i}].nodePort"),
                    &format!("Invalid value: {n}: provided port is already allocated"),
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    "Service",
                    &name,
                    &format!("spec.ports[{i}].nodePort"),
                    &format!(
                        "Invalid value: {}: provided port is not in the valid range. The range of valid ports is 30000-32767",
                        p["nodePort"]
                    ),
                ));
            }
        }
    }
    if let Some(ports) = service_ip::fill_node_ports(&valid.body, &mut used, &Default::default()) {
        valid.body["spec"]["ports"] = json!(ports);
    }
    Ok(())
}
