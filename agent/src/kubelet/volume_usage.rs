//! What the volumes of this node's pods hold (issue #39): every [`PERIOD`], each `emptyDir`
//! with a `sizeLimit` on the node's disk and each claim whose volume the built-in provisioner
//! made here is measured (beneath its directory, symlinks not followed, at most
//! [`MAX_ENTRIES`] entries looked at). The pure [`Overuse`] says which pods to evict; the
//! kubelet's loop carries that out through their workers. The claims' figures are served on
//! `/metrics` under the kubelet's names (`kubelet_volume_stats_used_bytes`, `…_capacity_bytes`).
//!
//! No quota enforces a limit here (this kernel has no `CONFIG_QUOTA`): a pod can write past
//! its limit until the next measurements see it, and is then evicted. A `Memory` emptyDir is
//! a tmpfs of its size, which the kernel enforces.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use shoal_core::pod::overuse::{Measured, Overuse, Sample};
use shoal_core::pod::plan::VolumeSource;

use super::Kubelet;

/// How often the volumes are measured.
pub const PERIOD: Duration = Duration::from_secs(5);
/// How long a volume must stay over its limit before its pod is evicted (two measurements at
/// least).
pub const SUSTAIN_MS: u64 = 10_000;
/// The most directory entries one measurement of one volume looks at.
pub const MAX_ENTRIES: usize = 100_000;

/// One claim's volume on this node, as last measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimStat {
    pub namespace: String,
    pub claim: String,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
}

impl Kubelet {
    /// The loop: measure, decide, hand the evictions to the kubelet's loop.
    pub(super) async fn measure_volumes(self: Arc<Self>) {
        let mut overuse = Overuse::default();
        loop {
            tokio::time::sleep(PERIOD).await;
            let me = self.clone();
            let Ok((samples, stats)) =
                tokio::task::spawn_blocking(move || me.volume_samples()).await
            else {
                continue;
            };
            let evict = overuse.round(super::now_ms(), &samples, SUSTAIN_MS);
            *self
                .claim_stats
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = stats;
            if !evict.is_empty() {
                self.evictions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(evict);
                self.wake();
            }
        }
    }

    /// The claims' volumes of this node as last measured.
    pub fn claim_stats(&self) -> Vec<ClaimStat> {
        self.claim_stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// One round of measurements of the volumes with limits of the pods bound here.
    fn volume_samples(&self) -> (Vec<Sample>, Vec<ClaimStat>) {
        let bound: Vec<_> = self
            .bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut samples = Vec::new();
        let mut stats = Vec::new();
        for pod in bound {
            let Ok(plan) = &pod.plan else { continue };
            for volume in &plan.volumes {
                let sample = |used_bytes, limit_bytes, kind| Sample {
                    pod_uid: plan.uid.clone(),
                    volume: volume.name.clone(),
                    kind,
                    used_bytes,
                    limit_bytes,
                };
                match &volume.source {
                    VolumeSource::EmptyDir {
                        memory: false,
                        size_limit: Some(limit),
                    } => {
                        if let Some(used) =
                            self.runtime
                                .volume_usage(&plan.uid, &volume.name, MAX_ENTRIES)
                        {
                            samples.push(sample(used, *limit, Measured::EmptyDir));
                        }
                    }
                    VolumeSource::Claim { claim, .. } => {
                        let Some(pv) = self
                            .lookup(&plan.namespace, "PersistentVolumeClaim", claim)
                            .and_then(|c| c["spec"]["volumeName"].as_str().map(str::to_owned))
                            .filter(|v| !v.is_empty())
                            .and_then(|v| self.lookup("", "PersistentVolume", &v))
                        else {
                            continue;
                        };
                        let Some((node, capacity)) = shoal_model::storage::given_by(&pv) else {
                            continue;
                        };
                        let name = pv["metadata"]["name"].as_str().unwrap_or_default();
                        if node != self.node_name {
                            continue;
                        }
                        let Some(used) = self.runtime.persistent_volume_usage(name, MAX_ENTRIES)
                        else {
                            continue;
                        };
                        if !stats
                            .iter()
                            .any(|s: &ClaimStat| s.namespace == plan.namespace && s.claim == *claim)
                        {
                            stats.push(ClaimStat {
                                namespace: plan.namespace.clone(),
                                claim: claim.clone(),
                                used_bytes: used,
                                capacity_bytes: capacity,
                            });
                        }
                        samples.push(sample(used, capacity, Measured::Claim(claim.clone())));
                    }
                    _ => {}
                }
            }
        }
        (samples, stats)
    }
}
