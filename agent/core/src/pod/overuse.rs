//! When a node evicts a pod for what its volumes hold (issue #39). This kernel has no quota
//! support, so nothing stops a container from writing past an `emptyDir.sizeLimit` or past its
//! claim's capacity; the node measures each such volume now and then and, as the kubelet's
//! local-storage eviction does, evicts the pod once a volume has held more than its limit for
//! a while (`sustain_ms`: one burst measured once is not enough). Pure: the shell measures
//! (`agent/src/kubelet/volume_usage.rs`) and carries the eviction out ([`super::worker`]).

use std::collections::HashMap;

/// Which kind of volume a measurement is of (the eviction's message names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measured {
    /// An `emptyDir` with a `sizeLimit`.
    EmptyDir,
    /// A claim's provisioned volume, by the claim's name (its limit is the capacity).
    Claim(String),
}

/// One volume of one pod, as measured in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub pod_uid: String,
    /// The volume's name in the pod's spec.
    pub volume: String,
    pub kind: Measured,
    pub used_bytes: u64,
    pub limit_bytes: u64,
}

/// The volumes found over their limits, and since when.
#[derive(Debug, Default)]
pub struct Overuse {
    since: HashMap<(String, String), u64>,
}

impl Overuse {
    /// Takes one round of measurements (every measured volume of the node's pods) at
    /// `now_ms`; returns the pods to evict now, each with the kubelet's message. A volume not
    /// measured in this round, or back within its limit, starts over.
    pub fn round(
        &mut self,
        now_ms: u64,
        samples: &[Sample],
        sustain_ms: u64,
    ) -> Vec<(String, String)> {
        let mut over = HashMap::new();
        let mut evict: Vec<(String, String)> = Vec::new();
        for s in samples {
            if s.used_bytes <= s.limit_bytes {
                continue;
            }
            let key = (s.pod_uid.clone(), s.volume.clone());
            let since = self.since.get(&key).copied().unwrap_or(now_ms);
            over.insert(key, since);
            if now_ms.saturating_sub(since) >= sustain_ms
                && !evict.iter().any(|(uid, _)| *uid == s.pod_uid)
            {
                evict.push((s.pod_uid.clone(), message(s)));
            }
        }
        self.since = over;
        evict
    }
}

/// The kubelet's words (`Usage of EmptyDir volume "x" exceeds the limit "1Mi".`), and for a
/// claim, the same about its capacity.
fn message(s: &Sample) -> String {
    let limit = shoal_model::quantity::format_bytes(s.limit_bytes);
    match &s.kind {
        Measured::EmptyDir => {
            format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {limit:?}.",
                s.volume
            )
        }
        Measured::Claim(claim) => format!(
            "Usage of PersistentVolumeClaim {claim:?} (volume {:?}) exceeds its capacity {limit:?}: {} bytes used.",
            s.volume, s.used_bytes
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pod: &str, volume: &str, used: u64, limit: u64) -> Sample {
        Sample {
            pod_uid: pod.into(),
            volume: volume.into(),
            kind: Measured::EmptyDir,
            used_bytes: used,
            limit_bytes: limit,
        }
    }

    #[test]
    fn a_volume_over_its_limit_for_the_sustain_time_evicts_its_pod_once_per_round() {
        let mut o = Overuse::default();
        let mib = 1 << 20;
        // Within the limit: nothing.
        assert!(o.round(0, &[sample("p", "v", mib, mib)], 10_000).is_empty());
        // Over, first seen: not yet.
        assert!(
            o.round(5_000, &[sample("p", "v", 2 * mib, mib)], 10_000)
                .is_empty()
        );
        // Back within it: the clock starts over.
        assert!(
            o.round(10_000, &[sample("p", "v", 0, mib)], 10_000)
                .is_empty()
        );
        assert!(
            o.round(15_000, &[sample("p", "v", 2 * mib, mib)], 10_000)
                .is_empty()
        );
        assert!(
            o.round(20_000, &[sample("p", "v", 2 * mib, mib)], 10_000)
                .is_empty()
        );
        // Over for the sustain time: evicted, once although two of its volumes are over.
        let out = o.round(
            25_000,
            &[
                sample("p", "v", 2 * mib, mib),
                sample("p", "w", 3 * mib, mib),
                sample("q", "v", 0, mib),
            ],
            10_000,
        );
        assert_eq!(
            out,
            [(
                "p".to_owned(),
                "Usage of EmptyDir volume \"v\" exceeds the limit \"1Mi\".".to_owned()
            )]
        );
        // A volume no longer measured (its pod gone) is forgotten.
        assert!(o.round(30_000, &[], 10_000).is_empty());
        assert!(
            o.round(35_000, &[sample("p", "v", 2 * mib, mib)], 10_000)
                .is_empty()
        );
        let claim = Sample {
            kind: Measured::Claim("data-db-0".into()),
            ..sample("p", "data", 20 * mib, 16 * mib)
        };
        assert_eq!(
            message(&claim),
            "Usage of PersistentVolumeClaim \"data-db-0\" (volume \"data\") exceeds its capacity \"16Mi\": 20971520 bytes used."
        );
    }
}
