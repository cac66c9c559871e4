//! Pod statuses as every node publishes them in gossip (`pod.<uid>` keys): observed state,
//! never written to the desired-state store (DESIGN.md §3). The API joins them into pods at
//! read time, and watchers get a MODIFIED event when a pod's status changes.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use shoal_gossip::Membership;

/// The gossip key prefix of pod statuses.
pub const KEY_PREFIX: &str = "pod.";

/// What a node gossips under `pod.<uid>`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PodReport {
    pub namespace: String,
    pub name: String,
    pub status: Value,
}

/// One pod's status as published by the node running it.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedStatus {
    /// Name of the node that published it.
    pub node: String,
    pub report: PodReport,
}

/// A pod whose published status changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// The cluster's pod statuses, refreshed from gossip.
pub struct PodStatusCache {
    /// Pod uid → what each node running it published (two while a moved pod's old node
    /// still stops it).
    statuses: Mutex<HashMap<String, Vec<PublishedStatus>>>,
    changed: tokio::sync::broadcast::Sender<StatusChange>,
    /// Counts the changes (a reader that saw the same value has seen every status since).
    version: std::sync::atomic::AtomicU64,
}

impl Default for PodStatusCache {
    fn default() -> Self {
        Self {
            statuses: Mutex::new(HashMap::new()),
            changed: tokio::sync::broadcast::channel(1024).0,
            version: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl PodStatusCache {
    /// A number that moves whenever any status changes.
    pub fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The status node `node` published for pod `uid`.
    pub fn get(&self, uid: &str, node: &str) -> Option<Value> {
        self.statuses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)?
            .iter()
            .find(|s| s.node == node)
            .map(|s| s.report.status.clone())
    }

    /// The status the node a pod is bound to published for it.
    pub fn status_of(&self, pod: &Value) -> Option<Value> {
        let uid = pod["metadata"]["uid"].as_str()?;
        let node = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())?;
        self.get(uid, node)
    }

    /// Records what this node just published (before gossip brings it back), so local
    /// readers and watchers see it at once.
    pub fn set_local(&self, uid: &str, node: &str, report: Option<PodReport>) {
        let mut statuses = self.statuses.lock().unwrap_or_else(PoisonError::into_inner);
        let list = statuses.entry(uid.to_owned()).or_default();
        let before = list.clone();
        list.retain(|s| s.node != node);
        if let Some(report) = report {
            list.push(PublishedStatus {
                node: node.to_owned(),
                report,
            });
        }
        let change = list.first().or(before.first()).map(|s| StatusChange {
            uid: uid.to_owned(),
            namespace: s.report.namespace.clone(),
            name: s.report.name.clone(),
        });
        let changed = *list != before;
        if list.is_empty() {
            statuses.remove(uid);
        }
        if changed {
            self.version
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        drop(statuses);
        if changed && let Some(change) = change {
            let _ = self.changed.send(change);
        }
    }

    /// Uids of pods whose published status changed.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<StatusChange> {
        self.changed.subscribe()
    }

    /// Replaces the cache with `fresh`, announcing the pods whose status changed.
    pub fn replace(&self, fresh: HashMap<String, Vec<PublishedStatus>>) {
        let mut statuses = self.statuses.lock().unwrap_or_else(PoisonError::into_inner);
        let change = |uid: &str, list: &[PublishedStatus]| {
            list.first().map(|s| StatusChange {
                uid: uid.to_owned(),
                namespace: s.report.namespace.clone(),
                name: s.report.name.clone(),
            })
        };
        let mut changed: Vec<StatusChange> = fresh
            .iter()
            .filter(|(uid, s)| statuses.get(*uid) != Some(s))
            .filter_map(|(uid, s)| change(uid, s))
            .collect();
        changed.extend(
            statuses
                .iter()
                .filter(|(u, _)| !fresh.contains_key(*u))
                .filter_map(|(uid, s)| change(uid, s)),
        );
        *statuses = fresh;
        if !changed.is_empty() {
            self.version
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        drop(statuses);
        for c in changed {
            let _ = self.changed.send(c);
        }
    }

    /// Refreshes from gossip when a peer's status arrives, and every `period` (what gossip
    /// does not notify: a status withdrawn, a node gone), forever.
    pub async fn follow(self: Arc<Self>, membership: Arc<Membership>, period: Duration) {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (arrived, _subscription) = membership.on_change(KEY_PREFIX).await;
        // (node id, key) → the raw value last seen and its parse.
        let mut parsed: HashMap<(String, String), (String, PodReport)> = HashMap::new();
        let mut seen_version = None;
        // A busy cluster's gossip brings statuses all the time: at most one refresh per
        // `MIN_GAP` (a refresh reads every published status).
        const MIN_GAP: Duration = Duration::from_millis(20);
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = arrived.notified() => {}
            }
            tokio::time::sleep_until(last + MIN_GAP).await;
            last = tokio::time::Instant::now();
            // Nothing published, changed or gone since the last round: nothing to read.
            let version = membership.values_version().await;
            if seen_version.as_ref() == Some(&version) {
                continue;
            }
            seen_version = Some(version);
            let names: HashMap<String, String> = membership
                .members()
                .await
                .into_iter()
                .map(|m| (m.node_id.clone(), m.name().to_owned()))
                .collect();
            let mut fresh: HashMap<String, Vec<PublishedStatus>> = HashMap::new();
            let mut seen = HashMap::new();
            for (node_id, key, value) in membership.dynamic_values(KEY_PREFIX).await {
                let Some(uid) = key.strip_prefix(KEY_PREFIX) else {
                    continue;
                };
                // Only what changed since the last round is parsed again.
                let slot = (node_id, key.clone());
                let report = match parsed.remove(&slot) {
                    Some((raw, report)) if raw == value => report,
                    _ => match serde_json::from_str::<PodReport>(&value) {
                        Ok(report) => report,
                        Err(_) => continue,
                    },
                };
                let Some(node) = names.get(&slot.0) else {
                    continue;
                };
                fresh
                    .entry(uid.to_owned())
                    .or_default()
                    .push(PublishedStatus {
                        node: node.clone(),
                        report: report.clone(),
                    });
                seen.insert(slot, (value, report));
            }
            parsed = seen;
            self.replace(fresh);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(phase: &str) -> PodReport {
        PodReport {
            namespace: "default".into(),
            name: "p".into(),
            status: serde_json::json!({"phase": phase}),
        }
    }

    #[test]
    fn the_version_moves_with_every_change_and_only_then() {
        let cache = PodStatusCache::default();
        let mut changes = cache.subscribe();
        let v0 = cache.version();
        cache.set_local("u1", "n0", Some(report("Pending")));
        let v1 = cache.version();
        assert!(v1 > v0);
        assert_eq!(changes.try_recv().unwrap().uid, "u1");
        // The same status again changes nothing.
        cache.set_local("u1", "n0", Some(report("Pending")));
        assert_eq!(cache.version(), v1);
        assert!(changes.try_recv().is_err());
        // A replace with what is there changes nothing; one without the pod does.
        let same: HashMap<String, Vec<PublishedStatus>> = [(
            "u1".to_owned(),
            vec![PublishedStatus {
                node: "n0".into(),
                report: report("Pending"),
            }],
        )]
        .into();
        cache.replace(same);
        assert_eq!(cache.version(), v1);
        cache.replace(HashMap::new());
        assert!(cache.version() > v1);
        assert_eq!(
            cache.status_of(
                &serde_json::json!({"metadata": {"uid": "u1"}, "spec": {"nodeName": "n0"}})
            ),
            None
        );
    }
}
