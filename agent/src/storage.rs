//! The node's volume binder (issue #39): the shell of `shoal_core::storage::plan`. On every
//! change of a pod, claim, volume or class (and every few seconds), it reads the store, asks
//! the pure plan what this node does, and does it: makes a provisioned volume's directory
//! (`runtime::persistent`) and stores the volume, takes a static volume for a claim, binds the
//! claim, and reclaims what nothing uses any more. Each write goes through the store API users
//! write with, laid over the object as stored now; what a round leaves undone the next does.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use shoal_state::{ObjectKey, WriteMode, kind};
use tracing::{debug, info, warn};

use shoal_core::storage::Step;

use crate::observed::events::{EventType, NewEvent, ObjectRef, Recorder};
use crate::replication::Replication;

/// The longest pause between two rounds (changes wake it sooner).
const RESYNC: Duration = Duration::from_secs(5);

pub struct Binder {
    node: String,
    data_dir: std::path::PathBuf,
    replication: Arc<Replication>,
    events: Arc<Recorder>,
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

impl Binder {
    pub fn new(
        node: String,
        data_dir: std::path::PathBuf,
        replication: Arc<Replication>,
        events: Arc<Recorder>,
    ) -> Arc<Self> {
        Arc::new(Self {
            node,
            data_dir,
            replication,
            events,
        })
    }

    /// Starts the binder's loop, supervised.
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        crate::supervise::spawn("volume binder", move || me.clone().run());
    }

    async fn run(self: Arc<Self>) {
        let mut changes = self.replication.subscribe();
        loop {
            self.round().await;
            let resync = tokio::time::sleep(RESYNC);
            tokio::pin!(resync);
            loop {
                tokio::select! {
                    _ = &mut resync => break,
                    change = changes.recv() => match change {
                        Ok(c) if self.wakes(&c) => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
            // A burst of changes (a pod and its claim) is one round.
            tokio::time::sleep(Duration::from_millis(5)).await;
            while changes.try_recv().is_ok() {}
        }
    }

    /// Whether a change is this binder's business: a pod of this node that names a claim,
    /// or any claim, volume or class (other pods' changes, most of the traffic, are not).
    fn wakes(&self, change: &shoal_state::Change) -> bool {
        match change.key.kind.as_str() {
            "Pod" => {
                change.object["spec"]["nodeName"] == self.node.as_str()
                    && !shoal_model::storage::claims_of(&change.object).is_empty()
            }
            "PersistentVolumeClaim" | "PersistentVolume" | "StorageClass" => true,
            _ => false,
        }
    }

    /// One round: the plan for what the store says now, carried out.
    async fn round(&self) {
        let node = self.node.clone();
        let (pods, claims, volumes, classes) = self.replication.read(|s| {
            let claims = s.list("", "PersistentVolumeClaim", None);
            let volumes = s.list("", "PersistentVolume", None);
            // No claim and no volume: no pod to read either.
            let pods: Vec<Value> = if claims.is_empty() && volumes.is_empty() {
                Vec::new()
            } else {
                s.list("", "Pod", None)
                    .into_iter()
                    .filter(|p| p["spec"]["nodeName"] == node.as_str())
                    .filter(|p| !shoal_model::storage::claims_of(p).is_empty())
                    .collect()
            };
            (
                pods,
                claims,
                volumes,
                s.list("storage.k8s.io", "StorageClass", None),
            )
        });
        if pods.is_empty() && volumes.is_empty() && claims.is_empty() {
            return;
        }
        let root = crate::paths::volumes(&self.data_dir);
        let steps = shoal_core::storage::plan(
            &self.node,
            &pods,
            &claims,
            &volumes,
            &classes,
            &root.to_string_lossy(),
        );
        let mut steps = steps.into_iter().peekable();
        while let Some(step) = steps.next() {
            // A volume provisioned is stored and its claim bound at once (the kubelet mounts
            // it once both are there): one write's wait, not two.
            let bind = match (&step, steps.peek()) {
                (Step::Provision { .. }, Some(Step::Bind { .. })) => steps.next(),
                _ => None,
            };
            let done = match &bind {
                Some(bind) => {
                    let (made, bound) = tokio::join!(self.carry_out(&step), self.carry_out(bind));
                    made.and(bound)
                }
                None => self.carry_out(&step).await,
            };
            if let Err(error) = done {
                // The binding waits; the next round tries again.
                debug!(?step, %error, "volume binder step not done");
                break;
            }
        }
    }

    async fn carry_out(&self, step: &Step) -> Result<(), String> {
        let info = |group_version: &str, kind_name: &str| {
            kind::lookup(group_version, kind_name).ok_or_else(|| format!("no kind {kind_name}"))
        };
        match step {
            Step::Provision { volume } => {
                let name = text(&volume["metadata"]["name"]).to_owned();
                let (data_dir, dir_name) = (self.data_dir.clone(), name.clone());
                tokio::task::spawn_blocking(move || {
                    crate::runtime::persistent::make(&data_dir, &dir_name)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
                let mut valid =
                    shoal_state::validate(volume.clone(), "").map_err(|e| e.to_string())?;
                shoal_model::validation::default("PersistentVolume", &mut valid.body);
                self.replication
                    .write(valid, WriteMode::Create)
                    .await
                    .map_err(|e| e.to_string())?;
                info!(volume = %name, node = %self.node, "volume provisioned");
                let reference = &volume["spec"]["claimRef"];
                self.events.record(NewEvent::new(
                    ObjectRef {
                        api_version: "v1".into(),
                        kind: "PersistentVolumeClaim".into(),
                        namespace: text(&reference["namespace"]).to_owned(),
                        name: text(&reference["name"]).to_owned(),
                        uid: text(&reference["uid"]).to_owned(),
                        field_path: String::new(),
                    },
                    EventType::Normal,
                    "ProvisioningSucceeded",
                    format!(
                        "Successfully provisioned volume {name} on node {} using {}",
                        self.node,
                        shoal_model::storage::LOCAL_PATH
                    ),
                    shoal_model::storage::LOCAL_PATH,
                ));
                Ok(())
            }
            Step::Take {
                volume,
                volume_uid,
                claim_ref,
            } => {
                let key = ObjectKey::new(info("v1", "PersistentVolume")?, "", volume);
                let reference = claim_ref.clone();
                self.lay_over(key, volume_uid, move |v| {
                    if !v["spec"]["claimRef"].is_null() {
                        return false;
                    }
                    v["spec"]["claimRef"] = reference.clone();
                    true
                })
                .await
            }
            Step::Bind {
                namespace,
                claim,
                claim_uid,
                volume,
            } => {
                let key = ObjectKey::new(info("v1", "PersistentVolumeClaim")?, namespace, claim);
                let (bound_to, node) = (volume.clone(), self.node.clone());
                self.lay_over(key, claim_uid, move |c| {
                    if !text(&c["spec"]["volumeName"]).is_empty() {
                        return false;
                    }
                    c["spec"]["volumeName"] = json!(bound_to);
                    if !c["metadata"]["annotations"].is_object() {
                        c["metadata"]["annotations"] = json!({});
                    }
                    c["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] = json!("yes");
                    c["metadata"]["annotations"][shoal_model::storage::SELECTED_NODE] = json!(node);
                    true
                })
                .await?;
                info!(claim = %format!("{namespace}/{claim}"), %volume, "claim bound");
                Ok(())
            }
            Step::Expand {
                volume,
                uid,
                storage,
            } => {
                let key = ObjectKey::new(info("v1", "PersistentVolume")?, "", volume);
                let size = storage.clone();
                self.lay_over(key, uid, move |v| {
                    if v["spec"]["capacity"]["storage"] == size {
                        return false;
                    }
                    v["spec"]["capacity"]["storage"] = size.clone();
                    true
                })
                .await?;
                info!(%volume, size = %storage, "volume expanded");
                Ok(())
            }
            Step::Reclaim { volume, uid } => {
                let (data_dir, name) = (self.data_dir.clone(), volume.clone());
                tokio::task::spawn_blocking(move || {
                    crate::runtime::persistent::remove(&data_dir, &name)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
                let key = ObjectKey::new(info("v1", "PersistentVolume")?, "", volume);
                self.replication
                    .delete(&key, Some(uid))
                    .await
                    .map_err(|e| e.to_string())?;
                info!(%volume, node = %self.node, "volume reclaimed (its claim is gone)");
                Ok(())
            }
        }
    }

    /// `change` laid over `key` as stored now, if it is still the incarnation `uid` and
    /// `change` agrees, written from the version read (a conflict: read and laid over again).
    async fn lay_over(
        &self,
        key: ObjectKey,
        uid: &str,
        mut change: impl FnMut(&mut Value) -> bool,
    ) -> Result<(), String> {
        for _ in 0..3 {
            let current = self
                .replication
                .read(|s| s.get(&key))
                .ok_or_else(|| format!("{key} is gone"))?;
            let Some(valid) = shoal_core::controllers::overlay(&key, uid, current, &mut change)
            else {
                return Err(format!("{key} changed meanwhile"));
            };
            let valid = valid.map_err(|e| e.to_string())?;
            match self.replication.write(valid, WriteMode::Update).await {
                Ok(_) => return Ok(()),
                Err(crate::replication::WriteError::Store(shoal_state::StoreError::Conflict {
                    ..
                })) => continue,
                Err(e) => {
                    warn!(object = %key, error = %e, "volume binder write failed");
                    return Err(e.to_string());
                }
            }
        }
        Err(format!("{key}: conflicts"))
    }
}
