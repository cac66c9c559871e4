//! The HorizontalPodAutoscaler (autoscaling/v2), pure: from the target's pods, their requests
//! and the usage their nodes sample (what `kubectl top` shows), the replica count the target
//! should have — Kubernetes' algorithm (`pkg/controller/podautoscaler`): the usage ratio with a
//! 10% tolerance, pods without metrics and unready pods filled in on the side that dampens the
//! change (for CPU, a pod's sample counts once it ran ready for a sample window within its
//! first 5 minutes, [`cpu_unready`]), the largest proposal over the metrics, the scale-down stabilisation window, the
//! scale-up/-down rate policies of `spec.behavior` (or, without one, the legacy limit of
//! max(2 × current, 4)), and `minReplicas`/`maxReplicas`. Only the target's `spec.replicas`
//! changes ([`Action::Scale`], the `/scale` subresource's field).
//!
//! What Kubernetes' controller keeps in memory (recent recommendations and scale events) the
//! owner keeps in a [`Memory`]. An owner that has none (just chosen, or restarted) seeds it with
//! the current count, so it does not scale down before it has watched a whole window — a new
//! owner continues instead of undoing its predecessor's stabilisation. The status the owner
//! computes is stored as the annotation [`STATUS_ANNOTATION`] (the store keeps no `status`) and
//! served as the HPA's `status` by every agent.

use std::collections::HashMap;

use serde_json::{Value, json};

use shoal_model::hpa::{MAX_REPLICAS, Metric, PolicyKind, Resource, Rules, Select, Spec, Target};

use super::workload::{Action, PodView};
use shoal_model::placement::{label_selector, term_matches};

/// Where the owner stores the status it computed (JSON of `status`).
pub const STATUS_ANNOTATION: &str = "autoscaling.shoal.io/status";

/// Kubernetes' `--horizontal-pod-autoscaler-tolerance`.
pub const TOLERANCE: f64 = 0.1;

/// Kubernetes' `--horizontal-pod-autoscaler-downscale-stabilization` (without `behavior`).
const LEGACY_DOWN_WINDOW_MS: u64 = 300_000;

/// A pod's usage as its node sampled it (summed over its containers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_nanocores: u64,
    pub memory_bytes: u64,
}

impl Usage {
    fn of(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Cpu => self.cpu_nanocores / 1_000_000,
            Resource::Memory => self.memory_bytes,
        }
    }
}

/// What the owner remembers of one HPA between syncs (Kubernetes' controller keeps the same
/// in memory).
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// (when, recommended replicas) of recent syncs.
    recommendations: Vec<(u64, i64)>,
    /// (when, replicas added) and (when, replicas removed) by this owner's rescales.
    up_events: Vec<(u64, i64)>,
    down_events: Vec<(u64, i64)>,
    last_sync_ms: Option<u64>,
}

impl Memory {
    /// Whether a sync is due at `now_ms` (`sync_ms` after the last, or never synced).
    pub fn due(&self, now_ms: u64, sync_ms: u64) -> bool {
        self.last_sync_ms
            .is_none_or(|t| now_ms >= t.saturating_add(sync_ms))
    }

    fn changed_within(events: &[(u64, i64)], period_ms: u64, now_ms: u64) -> i64 {
        events
            .iter()
            .filter(|(at, _)| at.saturating_add(period_ms) > now_ms)
            .fold(0i64, |sum, (_, n)| sum.saturating_add(*n))
    }

    /// The count at the start of a policy's period: `current` less what this owner added in
    /// it, plus what it removed.
    fn period_start(&self, current: i64, period_ms: u64, now_ms: u64) -> i64 {
        current
            .saturating_sub(Self::changed_within(&self.up_events, period_ms, now_ms))
            .saturating_add(Self::changed_within(&self.down_events, period_ms, now_ms))
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        self.recommendations.retain(|(at, _)| *at >= cutoff_ms);
        self.up_events.retain(|(at, _)| *at >= cutoff_ms);
        self.down_events.retain(|(at, _)| *at >= cutoff_ms);
    }
}

/// A condition of the status: (type, status, reason, message).
type Condition = (&'static str, bool, &'static str, String);

/// Kubernetes' `--horizontal-pod-autoscaler-cpu-initialization-period`: for this long after a
/// pod starts its CPU sample counts only once it has been ready for a whole sample window.
pub const CPU_INITIALIZATION_PERIOD_MS: u64 = 300_000;

/// Kubernetes' `--horizontal-pod-autoscaler-initial-readiness-delay`: after the initialization
/// period, an unready pod's sample is ignored only if it has not been ready since this long
/// after its start (it never became ready); one that became unready later counts.
pub const INITIAL_READINESS_DELAY_MS: u64 = 30_000;

/// The window of a usage sample: each node samples its pods' CPU every second
/// (`kubelet::metrics`), a rate over the second before.
pub const SAMPLE_WINDOW_MS: u64 = 1_000;

/// Whether `pod`'s CPU sample at `now_ms` may not be the usage of a running, ready pod (start-up
/// CPU is not load): Kubernetes' rule. Without a start time or a Ready condition it is unready.
pub fn cpu_unready(pod: &PodView, now_ms: u64) -> bool {
    let (Some(started), Some(changed)) = (pod.started_ms, pod.ready_changed_ms) else {
        return true;
    };
    if now_ms < started.saturating_add(CPU_INITIALIZATION_PERIOD_MS) {
        !pod.ready || now_ms < changed.saturating_add(SAMPLE_WINDOW_MS)
    } else {
        !pod.ready && started.saturating_add(INITIAL_READINESS_DELAY_MS) > changed
    }
}

/// Why a metric gave no proposal: the message of the HPA's `ScalingActive` condition, as
/// Kubernetes words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum MetricError {
    #[error(
        "failed to get {resource} utilization: missing request for {resource} in container {container} of Pod {pod}"
    )]
    MissingRequest {
        resource: &'static str,
        container: String,
        pod: String,
    },
    #[error(
        "failed to get {resource} utilization: unable to get metrics for resource {resource}: no metrics returned from resource metrics API"
    )]
    NoMetrics { resource: &'static str },
    #[error("failed to get {resource} utilization: no metrics returned matched known pods")]
    NoMatchedPods { resource: &'static str },
}

/// One metric's proposal: replicas, and its `currentMetrics` entry.
fn propose(
    metric: &Metric,
    current: i64,
    pods: &[&PodView],
    usage: &HashMap<String, Usage>,
    now_ms: u64,
) -> Result<(i64, Value), MetricError> {
    let resource = metric.resource;
    // Requests summed over containers; Kubernetes refuses a container without one.
    let mut requests: HashMap<&str, u64> = HashMap::new();
    for pod in pods {
        let mut total = 0u64;
        for c in pod.object["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let request = &c["resources"]["requests"][resource.name()];
            let request = if request.is_null() {
                // As the apiserver defaults it: a limit without a request requests the limit.
                &c["resources"]["limits"][resource.name()]
            } else {
                request
            };
            match request.as_str().map(|q| resource.parse(q)) {
                Some(Ok(v)) => total = total.saturating_add(v),
                _ if matches!(metric.target, Target::AverageValue(_)) => {}
                _ => {
                    return Err(MetricError::MissingRequest {
                        resource: resource.name(),
                        container: c["name"].as_str().unwrap_or("").to_owned(),
                        pod: pod.name.clone(),
                    });
                }
            }
        }
        requests.insert(&pod.uid, total);
    }
    // Kubernetes' groupPods: deleted and ended pods are ignored, pending pods are unready,
    // pods without a sample are missing, and for CPU pods whose sample may not show them
    // running ready are unready ([`cpu_unready`]).
    let mut samples: HashMap<&str, u64> = HashMap::new();
    let mut ready_count = 0i64;
    let mut unready = Vec::new();
    let mut missing = Vec::new();
    for pod in pods {
        if !pod.object["metadata"]["deletionTimestamp"].is_null()
            || matches!(
                pod.phase,
                super::workload::Phase::Failed | super::workload::Phase::Succeeded
            )
        {
            continue;
        }
        if pod.phase == super::workload::Phase::Pending {
            unready.push(pod.uid.as_str());
            continue;
        }
        let Some(u) = usage.get(&pod.uid) else {
            missing.push(pod.uid.as_str());
            continue;
        };
        if resource == Resource::Cpu && cpu_unready(pod, now_ms) {
            unready.push(pod.uid.as_str());
            continue;
        }
        samples.insert(&pod.uid, u.of(resource));
        ready_count += 1;
    }
    if samples.is_empty() {
        return Err(MetricError::NoMetrics {
            resource: resource.name(),
        });
    }
    // The usage ratio over `samples`, and what `currentMetrics` shows (from the real samples).
    let ratio_of = |samples: &HashMap<&str, u64>| -> Result<(f64, u64, u64), MetricError> {
        let (mut used, mut requested, mut n) = (0u64, 0u64, 0u64);
        for (uid, v) in samples {
            used = used.saturating_add(*v);
            requested = requested.saturating_add(requests.get(uid).copied().unwrap_or(0));
            n += 1;
        }
        let average = used / n.max(1);
        match metric.target {
            Target::Utilization(target) => {
                if requested == 0 {
                    return Err(MetricError::NoMatchedPods {
                        resource: resource.name(),
                    });
                }
                let utilization = used.saturating_mul(100) / requested;
                Ok((utilization as f64 / target as f64, utilization, average))
            }
            Target::AverageValue(target) => Ok((average as f64 / target as f64, 0, average)),
        }
    };
    let (ratio, utilization, average) = ratio_of(&samples)?;
    let mut current_metric = json!({"type": "Resource", "resource": {"name": resource.name(),
        "current": {"averageValue": resource.format(average)}}});
    if matches!(metric.target, Target::Utilization(_)) {
        current_metric["resource"]["current"]["averageUtilization"] = json!(utilization);
    }
    let ceil = |x: f64| -> i64 { x.ceil().clamp(0.0, MAX_REPLICAS as f64) as i64 };
    let scale_up_with_unready = !unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && missing.is_empty() {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok((current, current_metric));
        }
        return Ok((ceil(ratio * ready_count as f64), current_metric));
    }
    // Fill in the pods the ratio did not see, on the side that dampens the change.
    let mut filled = samples.clone();
    if !missing.is_empty() {
        for uid in &missing {
            let fill = if ratio < 1.0 {
                match metric.target {
                    Target::Utilization(target) => {
                        requests
                            .get(uid)
                            .copied()
                            .unwrap_or(0)
                            .saturating_mul(target.max(100))
                            / 100
                    }
                    Target::AverageValue(target) => target,
                }
            } else {
                0
            };
            filled.insert(uid, fill);
        }
    }
    if scale_up_with_unready {
        for uid in &unready {
            filled.insert(uid, 0);
        }
    }
    let (new_ratio, _, _) = ratio_of(&filled)?;
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok((current, current_metric));
    }
    let proposed = ceil(new_ratio * filled.len() as f64);
    if (new_ratio < 1.0 && proposed > current) || (new_ratio > 1.0 && proposed < current) {
        return Ok((current, current_metric));
    }
    Ok((proposed, current_metric))
}

/// The largest allowed count after a scale-up by `rules` (Kubernetes'
/// `calculateScaleUpLimitWithScalingRules`).
fn scale_up_limit(current: i64, memory: &Memory, rules: &Rules, now_ms: u64) -> i64 {
    if rules.select == Select::Disabled {
        return current;
    }
    let proposals = rules.policies.iter().map(|p| {
        let start = memory.period_start(current, p.period_ms, now_ms);
        match p.kind {
            PolicyKind::Pods => start.saturating_add(p.value),
            PolicyKind::Percent => (start as f64 * (1.0 + p.value as f64 / 100.0)).ceil() as i64,
        }
    });
    match rules.select {
        Select::Min => proposals.min(),
        _ => proposals.max(),
    }
    .unwrap_or(current)
}

/// The smallest allowed count after a scale-down by `rules`.
fn scale_down_limit(current: i64, memory: &Memory, rules: &Rules, now_ms: u64) -> i64 {
    if rules.select == Select::Disabled {
        return current;
    }
    let proposals = rules.policies.iter().map(|p| {
        let start = memory.period_start(current, p.period_ms, now_ms);
        match p.kind {
            PolicyKind::Pods => start.saturating_sub(p.value),
            PolicyKind::Percent => (start as f64 * (1.0 - p.value as f64 / 100.0)) as i64,
        }
    });
    // "Max" selects the policy that allows the largest change: the smallest count.
    match rules.select {
        Select::Min => proposals.max(),
        _ => proposals.min(),
    }
    .unwrap_or(current)
}

/// Stabilises `desired` over the remembered recommendations and limits its rate; returns the
/// count and the AbleToScale and ScalingLimited conditions.
fn normalize(
    spec: &Spec,
    current: i64,
    desired: i64,
    memory: &mut Memory,
    now_ms: u64,
) -> (i64, Condition, Condition) {
    let (up_window, down_window) = match &spec.behavior {
        Some(b) => (b.up.window_ms, b.down.window_ms),
        None => (0, LEGACY_DOWN_WINDOW_MS),
    };
    let mut up = desired;
    let mut down = desired;
    for (at, recommended) in &memory.recommendations {
        if at.saturating_add(up_window) > now_ms {
            up = up.min(*recommended);
        }
        if at.saturating_add(down_window) > now_ms {
            down = down.max(*recommended);
        }
    }
    memory.recommendations.push((now_ms, desired));
    let stabilized = current.max(up).min(down);
    let able = if stabilized == desired {
        (
            "AbleToScale",
            true,
            "ReadyForNewScale",
            "recommended size matches current size".to_owned(),
        )
    } else if stabilized > desired {
        (
            "AbleToScale",
            true,
            "ScaleDownStabilized",
            "recent recommendations were higher than current one, applying the highest recent recommendation".to_owned(),
        )
    } else {
        (
            "AbleToScale",
            true,
            "ScaleUpStabilized",
            "recent recommendations were lower than current one, applying the lowest recent recommendation".to_owned(),
        )
    };
    let (up_limit, down_limit) = match &spec.behavior {
        Some(b) => (
            scale_up_limit(current, memory, &b.up, now_ms).max(current),
            scale_down_limit(current, memory, &b.down, now_ms).min(current),
        ),
        None => (current.saturating_mul(2).max(4), i64::MIN),
    };
    let (max_allowed, max_reason, max_message) = if spec.max > up_limit {
        (
            up_limit,
            "ScaleUpLimit",
            "the desired replica count is increasing faster than the maximum scale rate",
        )
    } else {
        (
            spec.max,
            "TooManyReplicas",
            "the desired replica count is more than the maximum replica count",
        )
    };
    let (min_allowed, min_reason, min_message) = if spec.min < down_limit {
        (
            down_limit,
            "ScaleDownLimit",
            "the desired replica count is decreasing faster than the maximum scale rate",
        )
    } else {
        (
            spec.min,
            "TooFewReplicas",
            "the desired replica count is less than the minimum replica count",
        )
    };
    let (normalized, reason, message) = if stabilized > max_allowed {
        (max_allowed, max_reason, max_message)
    } else if stabilized < min_allowed {
        (min_allowed, min_reason, min_message)
    } else {
        (
            stabilized,
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
        )
    };
    let limited = (
        "ScalingLimited",
        normalized != stabilized,
        reason,
        message.to_owned(),
    );
    (normalized, able, limited)
}

/// The target's kind as the store knows it.
pub fn target_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" => Some("Deployment"),
        "ReplicaSet" => Some("ReplicaSet"),
        "StatefulSet" => Some("StatefulSet"),
        _ => None,
    }
}

use super::workload::rfc3339_seconds as rfc3339;

/// The status stored on `hpa` now (what the last sync computed), if any.
pub fn stored_status(hpa: &Value) -> Option<Value> {
    hpa["metadata"]["annotations"][STATUS_ANNOTATION]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
}

/// The status an HPA shows: the last one its owner computed, or Kubernetes' empty one.
pub fn status(hpa: &Value) -> Value {
    stored_status(hpa).unwrap_or_else(|| json!({"currentReplicas": 0, "desiredReplicas": 0}))
}

/// `kubectl get hpa`'s TARGETS column (kubectl's format: `cpu: 45%/50%`, at most two shown).
pub fn targets_column(hpa: &Value) -> String {
    let Ok(spec) = Spec::parse(hpa) else {
        return "<unknown>".to_owned();
    };
    let status = status(hpa);
    let current = status["currentMetrics"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut shown: Vec<String> = spec
        .metrics
        .iter()
        .map(|m| {
            let now = current
                .iter()
                .find(|c| c["resource"]["name"] == m.resource.name())
                .map(|c| &c["resource"]["current"]);
            match m.target {
                Target::Utilization(t) => format!(
                    "{}: {}/{t}%",
                    m.resource.name(),
                    now.and_then(|c| c["averageUtilization"].as_u64())
                        .map_or("<unknown>".to_owned(), |u| format!("{u}%"))
                ),
                Target::AverageValue(t) => format!(
                    "{}: {}/{}",
                    m.resource.name(),
                    now.and_then(|c| c["averageValue"].as_str())
                        .unwrap_or("<unknown>"),
                    m.resource.format(t)
                ),
            }
        })
        .collect();
    if shown.len() > 2 {
        let more = shown.len() - 2;
        shown.truncate(2);
        shown.push(format!("+ {more} more..."));
    }
    shown.join(", ")
}

/// One sync of `hpa` if it is due (`sync_ms` after the last): the scale of its `target` (the
/// stored Deployment or ReplicaSet, `None` if there is none) and the status to store.
#[allow(clippy::too_many_arguments)]
pub fn reconcile(
    hpa: &Value,
    target: Option<&Value>,
    pods: &[&PodView],
    usage: &HashMap<String, Usage>,
    memory: &mut Memory,
    now_ms: u64,
    sync_ms: u64,
) -> Vec<Action> {
    if !memory.due(now_ms, sync_ms) {
        return Vec::new();
    }
    let first_sync = memory.last_sync_ms.is_none();
    memory.last_sync_ms = Some(now_ms);
    let meta = &hpa["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or("default");
    let previous = stored_status(hpa).unwrap_or(Value::Null);
    let mut status = json!({});
    if let Some(generation) = meta["generation"].as_i64() {
        status["observedGeneration"] = json!(generation);
    }
    if !previous["lastScaleTime"].is_null() {
        status["lastScaleTime"] = previous["lastScaleTime"].clone();
    }
    let mut conditions: Vec<Condition> = Vec::new();
    let mut actions = Vec::new();
    let spec = match Spec::parse(hpa) {
        Ok(spec) => spec,
        Err(shoal_model::FieldError {
            field,
            detail: message,
        }) => {
            conditions.push((
                "ScalingActive",
                false,
                "InvalidMetricSourceType",
                format!("{field}: {message}"),
            ));
            return finish(hpa, status, conditions, &previous, now_ms, actions);
        }
    };
    let Some(target) = target else {
        conditions.push((
            "AbleToScale",
            false,
            "FailedGetScale",
            format!(
                "the HPA controller was unable to get the target's current scale: {} {:?} not found",
                spec.target_kind.to_lowercase(),
                spec.target_name
            ),
        ));
        return finish(hpa, status, conditions, &previous, now_ms, actions);
    };
    let current = target["spec"]["replicas"].as_i64().unwrap_or(1);
    status["currentReplicas"] = json!(current);
    if first_sync {
        // A new owner does not scale down before it has watched a whole window.
        memory.recommendations.push((now_ms, current));
    }
    let window = match &spec.behavior {
        Some(b) => {
            b.up.window_ms
                .max(b.down.window_ms)
                .max(b.up.policies.iter().map(|p| p.period_ms).max().unwrap_or(0))
                .max(
                    b.down
                        .policies
                        .iter()
                        .map(|p| p.period_ms)
                        .max()
                        .unwrap_or(0),
                )
        }
        None => LEGACY_DOWN_WINDOW_MS,
    };
    memory.forget_before(now_ms.saturating_sub(window));

    let (desired, rescale_reason) = if current == 0 && spec.min != 0 {
        status["desiredReplicas"] = json!(0);
        conditions.push((
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero".to_owned(),
        ));
        return finish(hpa, status, conditions, &previous, now_ms, actions);
    } else if current > spec.max {
        (
            spec.max,
            "Current number of replicas above Spec.MaxReplicas".to_owned(),
        )
    } else if current < spec.min {
        (
            spec.min,
            "Current number of replicas below Spec.MinReplicas".to_owned(),
        )
    } else {
        let selector = match label_selector(&target["spec"]["selector"]) {
            Ok(selector) => selector,
            Err(e) => {
                conditions.push((
                    "ScalingActive",
                    false,
                    "InvalidSelector",
                    format!("the HPA target's selector is invalid: {e}"),
                ));
                return finish(hpa, status, conditions, &previous, now_ms, actions);
            }
        };
        let selected: Vec<&PodView> = pods
            .iter()
            .copied()
            .filter(|p| p.namespace == namespace && term_matches(&selector, &p.labels))
            .collect();
        let mut best: Option<(i64, String)> = None;
        let mut metrics = Vec::new();
        let mut failures = Vec::new();
        for metric in &spec.metrics {
            match propose(metric, current, &selected, usage, now_ms) {
                Ok((replicas, shown)) => {
                    metrics.push(shown);
                    if best.as_ref().is_none_or(|(b, _)| replicas > *b) {
                        best = Some((replicas, metric.describe()));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
        status["currentMetrics"] = json!(metrics);
        // As Kubernetes: no scaling when every metric failed, nor a scale-down when one did.
        let Some((proposed, name)) =
            best.filter(|(replicas, _)| failures.is_empty() || *replicas >= current)
        else {
            conditions.push((
                "ScalingActive",
                false,
                "FailedGetResourceMetric",
                format!(
                    "the HPA was unable to compute the replica count: {}",
                    failures
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            ));
            status["desiredReplicas"] = previous["desiredReplicas"].clone();
            return finish(hpa, status, conditions, &previous, now_ms, actions);
        };
        conditions.push((
            "ScalingActive",
            true,
            "ValidMetricFound",
            format!("the HPA was able to successfully calculate a replica count from {name}"),
        ));
        let reason = if proposed < current {
            "All metrics below target".to_owned()
        } else {
            format!("{name} above target")
        };
        let (normalized, able, limited) = normalize(&spec, current, proposed, memory, now_ms);
        conditions.push(able);
        conditions.push(limited);
        (normalized, reason)
    };
    status["desiredReplicas"] = json!(desired);
    if desired != current {
        let delta = desired - current;
        if delta > 0 {
            memory.up_events.push((now_ms, delta));
        } else {
            memory.down_events.push((now_ms, -delta));
        }
        status["lastScaleTime"] = json!(rfc3339(now_ms));
        conditions.retain(|c| c.0 != "AbleToScale");
        conditions.insert(
            0,
            (
                "AbleToScale",
                true,
                "SucceededRescale",
                format!("the HPA controller was able to update the target scale to {desired}"),
            ),
        );
        actions.push(Action::Scale {
            kind: target_kind(&spec.target_kind).unwrap_or("Deployment"),
            namespace: namespace.to_owned(),
            name: spec.target_name.clone(),
            uid: target["metadata"]["uid"].as_str().unwrap_or("").to_owned(),
            replicas: desired,
            autoscaler: meta["name"].as_str().unwrap_or("").to_owned(),
            autoscaler_uid: meta["uid"].as_str().unwrap_or("").to_owned(),
            message: format!("New size: {desired}; reason: {rescale_reason}"),
        });
    }
    finish(hpa, status, conditions, &previous, now_ms, actions)
}

/// Adds the conditions (a condition whose status did not change keeps its transition time)
/// and, if the status changed, the write that stores it.
fn finish(
    hpa: &Value,
    mut status: Value,
    conditions: Vec<Condition>,
    previous: &Value,
    now_ms: u64,
    mut actions: Vec<Action>,
) -> Vec<Action> {
    let status_text = |b: bool| if b { "True" } else { "False" };
    status["conditions"] = conditions
        .into_iter()
        .map(|(kind, ok, reason, message)| {
            let since = previous["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == kind && c["status"] == status_text(ok))
                .and_then(|c| c["lastTransitionTime"].as_str())
                .map_or_else(|| rfc3339(now_ms), str::to_owned);
            json!({"type": kind, "status": status_text(ok), "reason": reason,
                "message": message, "lastTransitionTime": since})
        })
        .collect();
    if status["currentReplicas"].is_null() {
        status["currentReplicas"] = previous["currentReplicas"].clone();
    }
    if status["desiredReplicas"].is_null() {
        status["desiredReplicas"] = previous["desiredReplicas"].clone();
    }
    for field in ["currentReplicas", "desiredReplicas"] {
        if status[field].is_null() {
            status[field] = json!(0);
        }
    }
    if &status != previous {
        let meta = &hpa["metadata"];
        actions.push(Action::Annotate {
            kind: "HorizontalPodAutoscaler",
            namespace: meta["namespace"].as_str().unwrap_or("default").to_owned(),
            name: meta["name"].as_str().unwrap_or("").to_owned(),
            uid: meta["uid"].as_str().unwrap_or("").to_owned(),
            annotations: [(STATUS_ANNOTATION.to_owned(), status.to_string())].into(),
        });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::hpa::default;

    fn hpa(min: i64, max: i64, target: u64, behavior: Value) -> Value {
        let mut h = json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default", "uid": "hpa-1", "generation": 1},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": min, "maxReplicas": max,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": target}}}]},
        });
        if !behavior.is_null() {
            h["spec"]["behavior"] = behavior;
        }
        h
    }

    fn deployment(replicas: i64) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default", "uid": "d-1"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}}})
    }

    /// A pod requesting 100m CPU (None: no request), Running and Ready unless said.
    fn pod(i: usize, request: Option<&str>, phase: &str, ready: bool) -> PodView {
        let resources = match request {
            Some(r) => json!({"requests": {"cpu": r}}),
            None => json!({}),
        };
        PodView::new(
            &json!({"metadata": {"name": format!("web-{i}"), "namespace": "default",
                    "uid": format!("pod-{i}"), "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "resources": resources}]}}),
            // Started at the epoch, its readiness settled 5 s later: the tests' syncs (at
            // 1,000 s) are past the CPU initialization period.
            Some(
                &json!({"phase": phase, "startTime": "1970-01-01T00:00:00Z", "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" },
                    "lastTransitionTime": "1970-01-01T00:00:05Z"}]}),
            ),
        )
    }

    fn ready_pods(n: usize) -> Vec<PodView> {
        (0..n)
            .map(|i| pod(i, Some("100m"), "Running", true))
            .collect()
    }

    /// Usage of `millis` CPU for the pods numbered in `which`.
    fn usage(which: &[usize], millis: u64) -> HashMap<String, Usage> {
        which
            .iter()
            .map(|i| {
                (
                    format!("pod-{i}"),
                    Usage {
                        cpu_nanocores: millis * 1_000_000,
                        memory_bytes: 1 << 20,
                    },
                )
            })
            .collect()
    }

    fn scaled_to(actions: &[Action]) -> Option<i64> {
        actions.iter().find_map(|a| match a {
            Action::Scale { replicas, .. } => Some(*replicas),
            _ => None,
        })
    }

    fn status_of(actions: &[Action]) -> Value {
        actions
            .iter()
            .find_map(|a| match a {
                Action::Annotate { annotations, .. } => {
                    serde_json::from_str(&annotations[STATUS_ANNOTATION]).ok()
                }
                _ => None,
            })
            .unwrap_or(Value::Null)
    }

    fn condition<'a>(status: &'a Value, kind: &str) -> (&'a str, &'a str) {
        let c = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {status}"));
        (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
    }

    /// One sync from a new owner's memory.
    fn sync(
        h: &Value,
        replicas: i64,
        pods: &[PodView],
        usage: &HashMap<String, Usage>,
    ) -> Vec<Action> {
        let pods: Vec<&PodView> = pods.iter().collect();
        reconcile(
            h,
            Some(&deployment(replicas)),
            &pods,
            usage,
            &mut Memory::default(),
            1_000_000,
            15_000,
        )
    }

    #[test]
    fn the_usage_ratio_proposes_replicas_within_the_tolerance_and_the_bounds() {
        // (pods, usage per pod in millicores of 100m requested, target %, min, max, expected)
        let cases = [
            // 85% of a 80% target: within the 10% tolerance.
            (3, 85, 80, 1, 10, 3),
            // 200% of 50%: 4 × 3 = 12, capped by the legacy rate max(2 × 3, 4) = 6.
            (3, 200, 50, 1, 10, 6),
            // ...and by maxReplicas when that is lower.
            (3, 200, 50, 1, 5, 5),
            // 120% of 100%: ceil(1.2 × 4) = 5.
            (4, 120, 100, 1, 10, 5),
        ];
        for (n, millis, target, min, max, expected) in cases {
            let h = hpa(min, max, target, Value::Null);
            let all: Vec<usize> = (0..n).collect();
            let actions = sync(&h, n as i64, &ready_pods(n), &usage(&all, millis));
            let status = status_of(&actions);
            assert_eq!(
                scaled_to(&actions).unwrap_or(n as i64),
                expected,
                "{n} pods at {millis}% for {target}%: {status}"
            );
            assert_eq!(status["desiredReplicas"], expected);
            assert_eq!(status["currentReplicas"], n as i64);
            assert_eq!(
                status["currentMetrics"][0]["resource"]["current"]["averageUtilization"],
                millis
            );
            assert_eq!(
                condition(&status, "ScalingActive"),
                ("True", "ValidMetricFound")
            );
        }
        // The limits say so.
        let h = hpa(1, 10, 50, Value::Null);
        let status = status_of(&sync(&h, 3, &ready_pods(3), &usage(&[0, 1, 2], 200)));
        assert_eq!(
            condition(&status, "ScalingLimited"),
            ("True", "ScaleUpLimit")
        );
        assert_eq!(
            condition(&status, "AbleToScale"),
            ("True", "SucceededRescale")
        );
        let h = hpa(1, 5, 50, Value::Null);
        let status = status_of(&sync(&h, 3, &ready_pods(3), &usage(&[0, 1, 2], 200)));
        assert_eq!(
            condition(&status, "ScalingLimited"),
            ("True", "TooManyReplicas")
        );
        // Out of bounds is brought back at once.
        assert_eq!(
            scaled_to(&sync(
                &hpa(2, 4, 50, Value::Null),
                7,
                &ready_pods(7),
                &usage(&[0], 50)
            )),
            Some(4)
        );
        assert_eq!(
            scaled_to(&sync(
                &hpa(2, 4, 50, Value::Null),
                1,
                &ready_pods(1),
                &usage(&[0], 50)
            )),
            Some(2)
        );
    }

    #[test]
    fn cpu_samples_count_once_a_pod_runs_ready_as_kubernetes_counts_them() {
        let at = |ms: u64| rfc3339(ms);
        let view = |started: Option<u64>, ready: bool, changed: Option<u64>| {
            let mut status = json!({"phase": "Running", "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]});
            if let Some(s) = started {
                status["startTime"] = json!(at(s));
            }
            if let Some(c) = changed {
                status["conditions"][0]["lastTransitionTime"] = json!(at(c));
            }
            PodView::new(
                &json!({"metadata": {"name": "p", "uid": "p"}}),
                Some(&status),
            )
        };
        let t0 = 1_800_000_000_000;
        let init = CPU_INITIALIZATION_PERIOD_MS;
        // (started, ready, Ready changed, now, unready)
        let cases = [
            // No start time or no transition time: unready.
            (None, true, Some(t0), t0 + init * 2, true),
            (Some(t0), true, None, t0 + init * 2, true),
            // Within the initialization period: ready for a whole sample window counts.
            (Some(t0), true, Some(t0 + 2_000), t0 + 2_500, true),
            (Some(t0), true, Some(t0 + 2_000), t0 + 3_000, false),
            (Some(t0), false, Some(t0 + 2_000), t0 + 60_000, true),
            // After it: unready counts only if it never became ready (unready since start-up).
            (Some(t0), false, Some(t0 + 5_000), t0 + init + 1, true),
            (Some(t0), false, Some(t0 + 120_000), t0 + init + 1, false),
            (Some(t0), true, Some(t0 + 5_000), t0 + init + 1, false),
        ];
        for (i, (started, ready, changed, now, unready)) in cases.into_iter().enumerate() {
            assert_eq!(
                cpu_unready(&view(started, ready, changed), now),
                unready,
                "case {i}"
            );
        }
    }

    #[test]
    fn pods_without_metrics_and_unready_pods_dampen_the_change() {
        let h = hpa(1, 10, 50, Value::Null);
        // Scale-down: two of four pods have no sample; they count as 100% of their request:
        // (10 + 10 + 100 + 100) / 4 = 55% > 50%: the direction flips, no change.
        let actions = sync(&h, 4, &ready_pods(4), &usage(&[0, 1], 10));
        assert_eq!(scaled_to(&actions), None);
        assert_eq!(status_of(&actions)["desiredReplicas"], 4);
        // Scale-up with two unready pods counted as 0: (100 + 100 + 0 + 0) / 4 = 50%: no change.
        let mut pods = ready_pods(2);
        pods.push(pod(2, Some("100m"), "Running", false));
        pods.push(pod(3, Some("100m"), "Pending", false));
        let actions = sync(&h, 4, &pods, &usage(&[0, 1, 2, 3], 100));
        assert_eq!(scaled_to(&actions), None);
        // Without them the two ready pods alone would ask for 4 (2 × 2).
        let actions = sync(
            &hpa(1, 10, 50, Value::Null),
            2,
            &ready_pods(2),
            &usage(&[0, 1], 100),
        );
        assert_eq!(scaled_to(&actions), Some(4));
        // Scale-up with missing pods: missing count as 0: (300 + 0) / 2 = 150% → ceil(3 × 2) = 6,
        // capped by max(2 × 2, 4) = 4.
        let actions = sync(&h, 2, &ready_pods(2), &usage(&[0], 300));
        assert_eq!(scaled_to(&actions), Some(4));
        // Deleted and failed pods are not counted at all: one pod at 150% asks for 3 (counted
        // at 0% the other two would make it 50%, no change).
        let mut pods = ready_pods(2);
        pods[1].object["metadata"]["deletionTimestamp"] = json!("2026-12-02T00:00:00Z");
        pods.push(pod(2, Some("100m"), "Failed", false));
        let mut load = usage(&[0], 150);
        load.extend(usage(&[1, 2], 0));
        let actions = sync(&h, 2, &pods, &load);
        assert_eq!(scaled_to(&actions), Some(3), "{:?}", status_of(&actions));
    }

    #[test]
    fn a_container_without_a_request_or_no_metrics_at_all_stops_scaling_with_a_reason() {
        let h = hpa(1, 10, 50, Value::Null);
        let pods = vec![
            pod(0, Some("100m"), "Running", true),
            pod(1, None, "Running", true),
        ];
        let actions = sync(&h, 2, &pods, &usage(&[0, 1], 500));
        assert_eq!(scaled_to(&actions), None);
        let status = status_of(&actions);
        assert_eq!(
            condition(&status, "ScalingActive"),
            ("False", "FailedGetResourceMetric")
        );
        let message = status["conditions"][0]["message"].as_str().unwrap();
        assert!(
            message.contains("missing request for cpu in container web of Pod web-1"),
            "{message}"
        );
        let actions = sync(&h, 2, &ready_pods(2), &HashMap::new());
        assert_eq!(scaled_to(&actions), None);
        assert_eq!(
            condition(&status_of(&actions), "ScalingActive"),
            ("False", "FailedGetResourceMetric")
        );
        // A target at zero replicas is not scaled; a missing target is said.
        let status = status_of(&sync(&h, 0, &[], &HashMap::new()));
        assert_eq!(
            condition(&status, "ScalingActive"),
            ("False", "ScalingDisabled")
        );
        let mut memory = Memory::default();
        let actions = reconcile(&h, None, &[], &HashMap::new(), &mut memory, 0, 15_000);
        let status = status_of(&actions);
        assert_eq!(
            condition(&status, "AbleToScale"),
            ("False", "FailedGetScale")
        );
        assert!(
            status["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("deployment \"web\" not found")
        );
    }

    #[test]
    fn scale_down_waits_for_the_stabilization_window_and_scale_up_for_its_rate() {
        let behavior = json!({
            "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
            "scaleDown": {"stabilizationWindowSeconds": 60},
        });
        let h = hpa(1, 10, 50, behavior);
        let pods = ready_pods(10);
        let all: Vec<usize> = (0..10).collect();
        let mut memory = Memory::default();
        let mut replicas = 2;
        let step = |replicas: &mut i64, at_s: u64, millis: u64, memory: &mut Memory| {
            let views: Vec<&PodView> = pods.iter().take(*replicas as usize).collect();
            let actions = reconcile(
                &h,
                Some(&deployment(*replicas)),
                &views,
                &usage(&all, millis),
                memory,
                at_s * 1000,
                15_000,
            );
            if let Some(to) = scaled_to(&actions) {
                *replicas = to;
            }
            status_of(&actions)
        };
        // 250% of 50% asks for 10; one pod per 60 s may be added.
        let status = step(&mut replicas, 1000, 250, &mut memory);
        assert_eq!(replicas, 3);
        assert_eq!(
            condition(&status, "ScalingLimited"),
            ("True", "ScaleUpLimit")
        );
        // Within the same minute: nothing more, and before the sync period nothing at all.
        assert!(step(&mut replicas, 1010, 250, &mut memory).is_null());
        step(&mut replicas, 1030, 250, &mut memory);
        assert_eq!(replicas, 3);
        step(&mut replicas, 1061, 250, &mut memory);
        assert_eq!(replicas, 4);
        // Load gone: the last minute's recommendations (10) hold the count...
        let status = step(&mut replicas, 1080, 5, &mut memory);
        assert_eq!(replicas, 4);
        assert_eq!(
            condition(&status, "AbleToScale"),
            ("True", "ScaleDownStabilized")
        );
        step(&mut replicas, 1110, 5, &mut memory);
        assert_eq!(replicas, 4);
        // ...until a whole window of low recommendations: down to minReplicas at once (the
        // default scale-down policy allows 100% per 15 s).
        step(&mut replicas, 1141, 5, &mut memory);
        assert_eq!(replicas, 1);
    }

    #[test]
    fn a_new_owner_does_not_scale_down_before_it_watched_a_window() {
        // Default behavior (5 min window): low usage seen by an owner with no memory.
        let h = hpa(1, 10, 50, Value::Null);
        let pods = ready_pods(4);
        let views: Vec<&PodView> = pods.iter().collect();
        let all = usage(&[0, 1, 2, 3], 5);
        let mut memory = Memory::default();
        for at in [0u64, 15, 150, 299] {
            let actions = reconcile(
                &h,
                Some(&deployment(4)),
                &views,
                &all,
                &mut memory,
                at * 1000,
                15_000,
            );
            assert_eq!(scaled_to(&actions), None, "at {at} s");
        }
        let actions = reconcile(
            &h,
            Some(&deployment(4)),
            &views,
            &all,
            &mut memory,
            315_000,
            15_000,
        );
        assert_eq!(scaled_to(&actions), Some(1));
    }

    #[test]
    fn the_status_is_stored_only_when_it_changes_and_keeps_its_transition_times() {
        let mut h = hpa(1, 10, 80, Value::Null);
        let pods = ready_pods(3);
        let views: Vec<&PodView> = pods.iter().collect();
        let load = usage(&[0, 1, 2], 80);
        let mut memory = Memory::default();
        let first = reconcile(
            &h,
            Some(&deployment(3)),
            &views,
            &load,
            &mut memory,
            10_000,
            15_000,
        );
        let status = status_of(&first);
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            rfc3339(10_000)
        );
        h["metadata"]["annotations"] = json!({STATUS_ANNOTATION: status.to_string()});
        let again = reconcile(
            &h,
            Some(&deployment(3)),
            &views,
            &load,
            &mut memory,
            30_000,
            15_000,
        );
        assert!(again.is_empty(), "{again:?}");
        // Served as the status, and as kubectl's TARGETS column.
        assert_eq!(super::status(&h)["desiredReplicas"], 3);
        assert_eq!(targets_column(&h), "cpu: 80%/80%");
        assert_eq!(
            targets_column(&hpa(1, 2, 50, Value::Null)),
            "cpu: <unknown>/50%"
        );
    }

    #[test]
    fn specs_are_checked_naming_the_field_and_defaulted_like_the_apiserver() {
        let refused = |change: &dyn Fn(&mut Value)| {
            let mut h = hpa(1, 3, 50, Value::Null);
            change(&mut h["spec"]);
            Spec::parse(&h).unwrap_err()
        };
        assert_eq!(
            refused(&|s| s["maxReplicas"] = json!(0)).field,
            "spec.maxReplicas"
        );
        let shoal_model::FieldError {
            field,
            detail: message,
        } = refused(&|s| s["minReplicas"] = json!(5));
        assert_eq!(field, "spec.minReplicas");
        assert!(message.contains("less than or equal to maxReplicas"));
        assert_eq!(
            refused(&|s| s["scaleTargetRef"]["name"] = Value::Null).field,
            "spec.scaleTargetRef.name"
        );
        assert_eq!(
            refused(&|s| s["metrics"] = json!([{"type": "Pods"}])).field,
            "spec.metrics[0].type"
        );
        assert_eq!(
            refused(&|s| s["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}])).field,
            "spec.metrics[0].resource.target.averageUtilization"
        );
        assert_eq!(
            refused(&|s| s["behavior"] = json!({"scaleDown": {"selectPolicy": "Most"}})).field,
            "spec.behavior.scaleDown.selectPolicy"
        );
        let mut bare = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"},
            "maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}});
        default(&mut bare);
        assert_eq!(bare["spec"]["minReplicas"], 1);
        assert_eq!(
            bare["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert_eq!(
            bare["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            30
        );
        assert_eq!(
            bare["spec"]["behavior"]["scaleDown"]["policies"][0]["type"],
            "Percent"
        );
        assert_eq!(
            bare["spec"]["behavior"]["scaleUp"]["policies"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let spec = Spec::parse(&bare).unwrap();
        assert_eq!(spec.behavior.unwrap().down.window_ms, 30_000);
        // AverageValue targets in the resource's unit.
        let mut h = hpa(1, 3, 50, Value::Null);
        h["spec"]["metrics"] = json!([{"type": "Resource", "resource": {"name": "memory",
            "target": {"type": "AverageValue", "averageValue": "64Mi"}}}]);
        assert_eq!(
            Spec::parse(&h).unwrap().metrics[0].target,
            Target::AverageValue(64 << 20)
        );
    }

    #[test]
    fn an_average_value_target_scales_on_the_per_pod_usage() {
        let mut h = hpa(1, 10, 50, Value::Null);
        h["spec"]["metrics"] = json!([{"type": "Resource", "resource": {"name": "memory",
            "target": {"type": "AverageValue", "averageValue": "1Mi"}}}]);
        let pods = ready_pods(2);
        let mut load = usage(&[0, 1], 10);
        for u in load.values_mut() {
            u.memory_bytes = 3 << 20;
        }
        let actions = sync(&h, 2, &pods, &load);
        assert_eq!(scaled_to(&actions), Some(4), "{}", status_of(&actions));
        assert_eq!(
            status_of(&actions)["currentMetrics"][0]["resource"]["current"]["averageValue"],
            (3 << 20).to_string()
        );
    }
}
