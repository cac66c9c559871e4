//! The Events the workload controllers' writes tell, about the owner that made them, with
//! Kubernetes' reasons and messages (what `kubectl describe deployment|rs|job|cronjob` shows):
//! `SuccessfulCreate` / `SuccessfulDelete` of pods and Jobs, and a Deployment's
//! `ScalingReplicaSet`. Pure: the shell records them once the write is acknowledged.

use serde_json::Value;

use shoal_model::event::{EventType, NewEvent, ObjectRef};

/// The object's controlling owner, as an event's subject.
fn owner(object: &Value) -> Option<ObjectRef> {
    let reference = object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?;
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    Some(ObjectRef {
        api_version: text(&reference["apiVersion"]),
        kind: text(&reference["kind"]),
        namespace: text(&object["metadata"]["namespace"]),
        name: text(&reference["name"]),
        uid: text(&reference["uid"]),
        field_path: String::new(),
    })
}

/// The component Kubernetes names as the event's source for an owner of `kind`.
fn component(kind: &str) -> &'static str {
    match kind {
        "Deployment" => "deployment-controller",
        "ReplicaSet" => "replicaset-controller",
        "DaemonSet" => "daemonset-controller",
        "StatefulSet" => "statefulset-controller",
        "Job" => "job-controller",
        "CronJob" => "cronjob-controller",
        _ => "shoal-controller",
    }
}

/// A reconcile of `object` failed and quarantined it ([`super::quarantine`]).
pub fn reconcile_failed(object: shoal_model::event::ObjectRef, message: &str) -> NewEvent {
    let source = component(&object.kind);
    NewEvent::new(
        object,
        EventType::Warning,
        "ReconcileFailed",
        message,
        source,
    )
}

fn replicas(object: &Value) -> i64 {
    object["spec"]["replicas"].as_i64().unwrap_or(1)
}

/// A controller created `object` (as written: its name is known).
pub fn created(object: &Value) -> Option<NewEvent> {
    let owner = owner(object)?;
    let name = object["metadata"]["name"].as_str()?;
    let message = match (owner.kind.as_str(), object["kind"].as_str()?) {
        ("Deployment", "ReplicaSet") => {
            return Some(NewEvent::new(
                owner,
                EventType::Normal,
                "ScalingReplicaSet",
                format!(
                    "Scaled up replica set {name} from 0 to {}",
                    replicas(object)
                ),
                "deployment-controller",
            ));
        }
        ("StatefulSet", "Pod") => {
            format!("create Pod {name} in StatefulSet {} successful", owner.name)
        }
        (_, "Pod") => format!("Created pod: {name}"),
        ("CronJob", "Job") => format!("Created job {name}"),
        _ => return None,
    };
    let source = component(&owner.kind);
    Some(NewEvent::new(
        owner,
        EventType::Normal,
        "SuccessfulCreate",
        message,
        source,
    ))
}

/// A Deployment changed a ReplicaSet's replicas from `from` to the ones `rs` now has.
pub fn scaled(rs: &Value, from: i64) -> Option<NewEvent> {
    let owner = owner(rs).filter(|o| o.kind == "Deployment")?;
    let to = replicas(rs);
    let name = rs["metadata"]["name"].as_str()?;
    let direction = match to.cmp(&from) {
        std::cmp::Ordering::Greater => "up",
        std::cmp::Ordering::Less => "down",
        std::cmp::Ordering::Equal => return None,
    };
    Some(NewEvent::new(
        owner,
        EventType::Normal,
        "ScalingReplicaSet",
        format!("Scaled {direction} replica set {name} from {from} to {to}"),
        "deployment-controller",
    ))
}

/// A controller deleted `object` (as it was stored).
pub fn deleted(object: &Value) -> Option<NewEvent> {
    let owner = owner(object)?;
    let name = object["metadata"]["name"].as_str()?;
    let message = match object["kind"].as_str()? {
        "Pod" if owner.kind == "StatefulSet" => {
            format!("delete Pod {name} in StatefulSet {} successful", owner.name)
        }
        "Pod" => format!("Deleted pod: {name}"),
        "Job" => format!("Deleted job {name}"),
        _ => return None,
    };
    let source = component(&owner.kind);
    Some(NewEvent::new(
        owner,
        EventType::Normal,
        "SuccessfulDelete",
        message,
        source,
    ))
}

/// An autoscaler changed its target's replicas (Kubernetes' `SuccessfulRescale`, on the HPA).
pub fn rescaled(namespace: &str, name: &str, uid: &str, message: &str) -> NewEvent {
    NewEvent::new(
        ObjectRef {
            api_version: "autoscaling/v2".into(),
            kind: "HorizontalPodAutoscaler".into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            field_path: String::new(),
        },
        EventType::Normal,
        "SuccessfulRescale",
        message,
        "horizontal-pod-autoscaler",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn owned(kind: &str, name: &str, owner_kind: &str, owner: &str) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "team",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "u0"},
                {"apiVersion": "apps/v1", "kind": owner_kind, "name": owner, "uid": "u1", "controller": true}]},
            "spec": {"replicas": 3}})
    }

    #[test]
    fn events_name_the_controlling_owner_with_kubernetes_reasons() {
        let pod = created(&owned("Pod", "web-abc12", "ReplicaSet", "web")).unwrap();
        assert_eq!(
            (pod.regarding.kind.as_str(), pod.regarding.name.as_str()),
            ("ReplicaSet", "web")
        );
        assert_eq!(pod.regarding.uid, "u1");
        assert_eq!(pod.regarding.namespace, "team");
        assert_eq!(
            (pod.reason.as_str(), pod.message.as_str()),
            ("SuccessfulCreate", "Created pod: web-abc12")
        );
        assert_eq!(pod.component, "replicaset-controller");
        let rs = created(&owned("ReplicaSet", "web-7d9", "Deployment", "web")).unwrap();
        assert_eq!(rs.reason, "ScalingReplicaSet");
        assert_eq!(rs.message, "Scaled up replica set web-7d9 from 0 to 3");
        let job = created(&owned("Job", "nightly-29000", "CronJob", "nightly")).unwrap();
        assert_eq!(job.message, "Created job nightly-29000");
        let gone = deleted(&owned("Pod", "web-abc12", "Job", "batch")).unwrap();
        assert_eq!(
            (gone.reason.as_str(), gone.message.as_str()),
            ("SuccessfulDelete", "Deleted pod: web-abc12")
        );
        assert_eq!(gone.component, "job-controller");
    }

    #[test]
    fn scaling_says_which_way_and_unowned_objects_say_nothing() {
        let rs = owned("ReplicaSet", "web-7d9", "Deployment", "web");
        assert_eq!(
            scaled(&rs, 5).unwrap().message,
            "Scaled down replica set web-7d9 from 5 to 3"
        );
        assert_eq!(
            scaled(&rs, 1).unwrap().message,
            "Scaled up replica set web-7d9 from 1 to 3"
        );
        assert!(scaled(&rs, 3).is_none());
        let bare = json!({"kind": "Pod", "metadata": {"name": "p"}});
        assert!(created(&bare).is_none() && deleted(&bare).is_none());
        assert!(scaled(&owned("ReplicaSet", "r", "Other", "o"), 1).is_none());
    }
}
