//! The pod worker: a pure state machine deciding what to do with one pod on this node, from
//! the pod's spec ([`PodPlan`], or none when the pod must not run here any more), what the
//! runtime observes, and the time. It returns actions for the shell to carry out and the pod's
//! status to publish. No I/O, no clock: tests replay any sequence.
//!
//! Lifecycle rules (Kubernetes'): init containers run one at a time, in order, each to
//! success; then every container starts. An exited container restarts by `restartPolicy`
//! (`Always`; `OnFailure` if it failed; init containers restart on failure unless `Never`),
//! after an exponential back-off (base × 2^attempt, capped: CrashLoopBackOff). A startup probe
//! holds the other probes back until it succeeds; liveness (or startup) failures past the
//! threshold stop the container, which then restarts by policy; readiness drives `Ready`.
//! Stopping sends SIGTERM, then SIGKILL after the grace period.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::observed::{ObservedContainer, ObservedState};
use super::plan::{ContainerPlan, Handler, PodPlan, Probe};

/// Back-off and timing knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerConfig {
    /// First restart delay (Kubernetes: 10 s).
    pub backoff_base_ms: u64,
    /// Longest restart delay (Kubernetes: 300 s).
    pub backoff_max_ms: u64,
    /// Grace period when the pod spec is gone (Kubernetes' default: 30 s).
    pub default_grace_ms: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            backoff_base_ms: 10_000,
            backoff_max_ms: 300_000,
            default_grace_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Term,
    Kill,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    EnsureSandbox,
    Start {
        name: String,
        attempt: u32,
        init: bool,
    },
    Signal {
        name: String,
        attempt: u32,
        signal: StopSignal,
    },
    Probe {
        name: String,
        attempt: u32,
        kind: ProbeKind,
        probe: Probe,
    },
    /// Run the container's preStop hook (SIGTERM follows when it ends).
    PreStop {
        name: String,
        attempt: u32,
        handler: Handler,
    },
    /// Run the container's postStart hook; [`PodWorker::post_start_done`] reports how it ended.
    PostStart {
        name: String,
        attempt: u32,
        handler: Handler,
    },
    Remove {
        name: String,
        attempt: u32,
    },
    RemoveSandbox,
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub actions: Vec<Action>,
    /// The pod's status (Kubernetes `PodStatus` JSON) while it has a spec here.
    pub status: Option<Value>,
    /// Everything of the pod is gone from this node: the worker can be dropped.
    pub finished: bool,
}

#[derive(Debug, Clone, Copy)]
struct Stopping {
    /// When the stop began (the preStop hook, or SIGTERM when there is none).
    term_at_ms: u64,
    /// SIGTERM was sent (it waits for the preStop hook to finish, within the grace period).
    term_sent: bool,
    hook_running: bool,
    kill_at_ms: Option<u64>,
    reason: StopReason,
}

/// Where an attempt's postStart hook is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PostStart {
    Running,
    Done,
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    PodGone,
    Unhealthy(ProbeKind),
    Removed,
    Evicted,
    PostStartFailed,
}

#[derive(Debug, Clone)]
struct StartError {
    reason: String,
    message: String,
    at_ms: u64,
    failures: u32,
    /// The failure's own reason was shown in a status (an image pull's failure is shown as
    /// `ErrImagePull` once, then as `ImagePullBackOff` while the back-off lasts).
    shown: bool,
    /// Its BackOff event was recorded.
    backoff_reported: bool,
}

/// A start that failed because the image could not be pulled (the kubelet's reason).
pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
/// What an image pull's failure is shown as while its back-off lasts.
pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";

#[derive(Debug, Clone, Default)]
struct ProbeState {
    successes: u32,
    failures: u32,
    last_run_ms: Option<u64>,
    in_flight: bool,
    /// Latest verdict after thresholds: Some(true) passing, Some(false) failing.
    passing: Option<bool>,
    last_message: String,
}

/// Something the worker decided that users see as an Event about the pod (the shell records
/// it; the outcomes of its own I/O, such as a container created, it records itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEvent {
    pub container: String,
    pub init: bool,
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// One pod's worker.
#[derive(Debug, Default)]
pub struct PodWorker {
    config: WorkerConfig,
    grace_ms: Option<u64>,
    first_seen_ms: Option<u64>,
    /// Each condition's status and when it last changed (its `lastTransitionTime`; the
    /// autoscaler reads when a pod became ready from it).
    transitions: HashMap<&'static str, (bool, u64)>,
    stopping: HashMap<(String, u32), Stopping>,
    start_errors: HashMap<String, StartError>,
    probes: HashMap<(String, u32, ProbeKind), ProbeState>,
    /// preStop hooks by container name, from the latest spec.
    pre_stop: HashMap<String, Handler>,
    /// Each attempt's postStart hook: running, done, or failed (and why).
    post_start: HashMap<(String, u32), PostStart>,
    /// Init container names, from the latest spec (an event's field path names the list).
    init_names: std::collections::HashSet<String>,
    /// Sidecar names (init containers with `restartPolicy: Always`), from the latest spec:
    /// a pod that goes stops them after its other containers.
    sidecar_names: std::collections::HashSet<String>,
    /// The pod's namespace and name, from the latest spec (its events name it after it is gone).
    pod: Option<(String, String)>,
    /// Attempts whose back-off was reported (once each).
    backoff_reported: std::collections::HashSet<(String, u32)>,
    /// Attempts whose OOM kill was reported (once each).
    oom_reported: std::collections::HashSet<(String, u32)>,
    events: Vec<WorkerEvent>,
    /// Evicted by its node: why, and when ([`PodWorker::evict`]).
    evicted: Option<(String, u64)>,
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// The per-container view the worker computes.
struct ContainerView<'a> {
    plan: &'a ContainerPlan,
    init: bool,
    latest: Option<&'a ObservedContainer>,
    previous: Option<&'a ObservedContainer>,
    waiting: Option<(String, String)>,
    ready: bool,
    /// Will not run again (exited and the policy does not restart it).
    done: bool,
}

impl<'a> ContainerView<'a> {
    /// A container of the spec with its latest and previous attempts (`by_name`: attempts in
    /// order).
    fn new(
        plan: &'a ContainerPlan,
        init: bool,
        by_name: &BTreeMap<&str, Vec<&'a ObservedContainer>>,
    ) -> Self {
        let list = by_name.get(plan.name.as_str());
        Self {
            plan,
            init,
            latest: list.and_then(|l| l.last().copied()),
            previous: list.and_then(|l| l.len().checked_sub(2).map(|i| l[i])),
            waiting: None,
            ready: false,
            done: false,
        }
    }
}

impl PodWorker {
    pub fn new(config: WorkerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The pod's namespace and name, once a spec was seen.
    pub fn pod(&self) -> Option<(&str, &str)> {
        self.pod.as_ref().map(|(ns, n)| (ns.as_str(), n.as_str()))
    }

    /// The events decided since the last call.
    pub fn take_events(&mut self) -> Vec<WorkerEvent> {
        std::mem::take(&mut self.events)
    }

    fn event(&mut self, container: &str, warning: bool, reason: &'static str, message: String) {
        self.events.push(WorkerEvent {
            container: container.to_owned(),
            init: self.init_names.contains(container),
            warning,
            reason,
            message,
        });
    }

    fn backoff_ms(&self, attempt: u32) -> u64 {
        let factor = 1u64.checked_shl(attempt.min(20)).unwrap_or(u64::MAX);
        self.config
            .backoff_base_ms
            .saturating_mul(factor)
            .min(self.config.backoff_max_ms)
    }

    /// The pod must stop at once, whatever its grace period (a fenced pod on a node that lost
    /// the majority: the fence timing leaves no room for a grace period).
    pub fn stop_now(&mut self) {
        self.grace_ms = Some(0);
    }

    /// The node evicts the pod (a volume used beyond its limit), as the kubelet's eviction
    /// manager does: its containers are killed at once (no grace, no preStop hook) and never
    /// started again, and the pod ends `Failed` with reason `Evicted` and `message`. Returns
    /// whether this is news (the first eviction; the shell records the event once).
    pub fn evict(&mut self, message: String, now_ms: u64) -> bool {
        if self.evicted.is_some() {
            return false;
        }
        self.evicted = Some((message, now_ms));
        true
    }

    /// The shell could not start a container (image missing, bad config, …).
    pub fn start_failed(&mut self, name: &str, reason: &str, message: &str, now_ms: u64) {
        if reason == ERR_IMAGE_PULL {
            // As the kubelet writes them: the pull's error, then the reason.
            self.event(name, true, "Failed", message.to_owned());
            self.event(name, true, "Failed", format!("Error: {ERR_IMAGE_PULL}"));
        } else {
            self.event(name, true, "Failed", format!("Error: {message}"));
        }
        let failures = self.start_errors.get(name).map_or(0, |e| e.failures) + 1;
        self.start_errors.insert(
            name.to_owned(),
            StartError {
                reason: reason.to_owned(),
                message: message.to_owned(),
                at_ms: now_ms,
                failures,
                shown: false,
                backoff_reported: false,
            },
        );
    }

    /// The container cannot start yet but needs no back-off (its image is being pulled, or its
    /// fenced pod's run lease ended before it could start): an event `event` (once per
    /// message), shown waiting with `reason`, tried again at the next decision.
    pub fn start_pending(&mut self, name: &str, event: &'static str, reason: &str, message: &str) {
        let already = self
            .start_errors
            .get(name)
            .is_some_and(|e| e.failures == 0 && e.message == message);
        if !already {
            self.event(name, false, event, message.to_owned());
        }
        self.start_errors.insert(
            name.to_owned(),
            StartError {
                reason: reason.to_owned(),
                message: message.to_owned(),
                at_ms: 0,
                failures: 0,
                shown: false,
                backoff_reported: false,
            },
        );
    }

    /// The container started; returns whether it had waited for its image (pulled).
    pub fn start_succeeded(&mut self, name: &str) -> bool {
        self.start_errors
            .remove(name)
            .is_some_and(|e| e.failures == 0)
    }

    /// A probe the shell ran has finished.
    pub fn probe_done(
        &mut self,
        name: &str,
        attempt: u32,
        kind: ProbeKind,
        probe: &Probe,
        success: bool,
        message: &str,
    ) {
        let state = self
            .probes
            .entry((name.to_owned(), attempt, kind))
            .or_default();
        state.in_flight = false;
        state.last_message = message.to_owned();
        if success {
            state.successes += 1;
            state.failures = 0;
            if state.successes >= probe.success_threshold {
                state.passing = Some(true);
            }
        } else {
            state.failures += 1;
            state.successes = 0;
            if state.failures >= probe.failure_threshold {
                state.passing = Some(false);
            }
            let kind = match kind {
                ProbeKind::Startup => "Startup",
                ProbeKind::Liveness => "Liveness",
                ProbeKind::Readiness => "Readiness",
            };
            self.event(
                name,
                true,
                "Unhealthy",
                format!("{kind} probe failed: {message}"),
            );
        }
    }

    /// The postStart hook of a container attempt ended: `Err` with why it failed (the
    /// attempt is then killed, and restarted as its policy says).
    pub fn post_start_done(&mut self, name: &str, attempt: u32, result: Result<(), String>) {
        let key = (name.to_owned(), attempt);
        if let Some(state) = self.post_start.get_mut(&key) {
            match result {
                Ok(()) => *state = PostStart::Done,
                Err(message) => {
                    *state = PostStart::Failed(message.clone());
                    self.event(
                        name,
                        true,
                        "FailedPostStartHook",
                        format!("PostStartHook failed: {message}"),
                    );
                }
            }
        }
    }

    /// The preStop hook of a container attempt finished (or failed: SIGTERM follows anyway).
    pub fn pre_stop_done(&mut self, name: &str, attempt: u32) {
        if let Some(stopping) = self.stopping.get_mut(&(name.to_owned(), attempt)) {
            stopping.hook_running = false;
        }
    }

    fn stop(
        &mut self,
        actions: &mut Vec<Action>,
        c: &ObservedContainer,
        now_ms: u64,
        reason: StopReason,
    ) {
        let key = (c.meta.name.clone(), c.meta.attempt);
        let grace = self.grace_ms.unwrap_or(self.config.default_grace_ms);
        let (name, attempt) = key.clone();
        match self.stopping.get_mut(&key) {
            None => {
                let message = match reason {
                    StopReason::Unhealthy(kind) => format!(
                        "Container {name} failed {} probe, will be restarted",
                        if kind == ProbeKind::Startup {
                            "startup"
                        } else {
                            "liveness"
                        }
                    ),
                    StopReason::PodGone | StopReason::Removed | StopReason::Evicted => {
                        format!("Stopping container {name}")
                    }
                    StopReason::PostStartFailed => {
                        format!("FailedPostStartHook: stopping container {name}")
                    }
                };
                self.event(&name, false, "Killing", message);
                let hook = self.pre_stop.get(&name).filter(|_| grace > 0).cloned();
                // No grace (a fenced pod that must stop, a forced delete): SIGKILL in this
                // decision, not a SIGTERM now and the kill a pass later.
                let kill_now = grace == 0;
                self.stopping.insert(
                    key,
                    Stopping {
                        term_at_ms: now_ms,
                        term_sent: hook.is_none(),
                        hook_running: hook.is_some(),
                        kill_at_ms: kill_now.then_some(now_ms),
                        reason,
                    },
                );
                actions.push(match hook {
                    Some(handler) => Action::PreStop {
                        name,
                        attempt,
                        handler,
                    },
                    None => Action::Signal {
                        name,
                        attempt,
                        signal: if kill_now {
                            StopSignal::Kill
                        } else {
                            StopSignal::Term
                        },
                    },
                });
            }
            Some(stopping) => {
                if !stopping.term_sent && !stopping.hook_running {
                    stopping.term_sent = true;
                    actions.push(Action::Signal {
                        name: name.clone(),
                        attempt,
                        signal: StopSignal::Term,
                    });
                }
                let due = match stopping.kill_at_ms {
                    None => now_ms >= stopping.term_at_ms.saturating_add(grace),
                    // Repeat the kill now and then in case it raced with the start.
                    Some(at) => now_ms >= at + 2_000,
                };
                if due {
                    stopping.kill_at_ms = Some(now_ms);
                    actions.push(Action::Signal {
                        name,
                        attempt,
                        signal: StopSignal::Kill,
                    });
                }
            }
        }
    }

    /// Decides what to do now.
    /// Stops within `ms` at most from now on (a deletion's grace period, shorter than the
    /// pod's own).
    pub fn limit_grace(&mut self, ms: u64) {
        self.grace_ms = Some(self.grace_ms.map_or(ms, |g| g.min(ms)));
    }

    pub fn decide(
        &mut self,
        now_ms: u64,
        plan: Option<&PodPlan>,
        sandbox_exists: bool,
        observed: &[ObservedContainer],
    ) -> Decision {
        let mut actions = Vec::new();
        let Some(plan) = plan else {
            // The pod must not run here: stop everything (its sidecars once the others have
            // stopped, as the kubelet does), then remove everything.
            let mut running = false;
            let others_running = observed.iter().any(|c| {
                !matches!(c.state, ObservedState::Exited { .. })
                    && !self.sidecar_names.contains(&c.meta.name)
            });
            for c in observed {
                if !matches!(c.state, ObservedState::Exited { .. }) {
                    running = true;
                    if others_running && self.sidecar_names.contains(&c.meta.name) {
                        continue;
                    }
                    self.stop(&mut actions, c, now_ms, StopReason::PodGone);
                }
            }
            if running {
                return Decision {
                    actions,
                    status: None,
                    finished: false,
                };
            }
            for c in observed {
                actions.push(Action::Remove {
                    name: c.meta.name.clone(),
                    attempt: c.meta.attempt,
                });
            }
            if sandbox_exists {
                actions.push(Action::RemoveSandbox);
            }
            return Decision {
                actions,
                status: None,
                finished: true,
            };
        };
        self.grace_ms = Some(if self.evicted.is_some() {
            0
        } else {
            plan.termination_grace_ms
        });
        self.init_names = plan
            .init_containers
            .iter()
            .map(|c| c.name.clone())
            .collect();
        self.sidecar_names = plan
            .init_containers
            .iter()
            .filter(|c| c.sidecar)
            .map(|c| c.name.clone())
            .collect();
        self.pod = Some((plan.namespace.clone(), plan.name.clone()));
        self.pre_stop = plan
            .containers
            .iter()
            .chain(&plan.init_containers)
            .filter_map(|c| Some((c.name.clone(), c.pre_stop.clone()?)))
            .collect();
        let first_seen = *self.first_seen_ms.get_or_insert(now_ms);
        if !sandbox_exists {
            actions.push(Action::EnsureSandbox);
        }

        let mut by_name: BTreeMap<&str, Vec<&ObservedContainer>> = BTreeMap::new();
        for c in observed {
            by_name.entry(c.meta.name.as_str()).or_default().push(c);
        }
        for list in by_name.values_mut() {
            list.sort_by_key(|c| c.meta.attempt);
        }
        // Containers no longer in the spec, and attempts older than the previous one.
        let known = |name: &str| {
            plan.containers
                .iter()
                .chain(&plan.init_containers)
                .any(|c| c.name == name)
        };
        for (name, list) in &by_name {
            for (i, c) in list.iter().enumerate() {
                let stale = !known(name) || i + 2 < list.len();
                if !stale {
                    continue;
                }
                if matches!(c.state, ObservedState::Exited { .. }) {
                    actions.push(Action::Remove {
                        name: c.meta.name.clone(),
                        attempt: c.meta.attempt,
                    });
                } else {
                    self.stop(&mut actions, c, now_ms, StopReason::Removed);
                }
            }
        }
        // Forget probe and stop state of attempts that no longer exist.
        let exists = |name: &str, attempt: u32| {
            observed
                .iter()
                .any(|c| c.meta.name == name && c.meta.attempt == attempt)
        };
        self.probes.retain(|(n, a, _), _| exists(n, *a));
        self.stopping.retain(|(n, a), _| exists(n, *a));
        self.backoff_reported.retain(|(n, a)| exists(n, *a));
        self.oom_reported.retain(|(n, a)| exists(n, *a));
        self.post_start.retain(|(n, a), _| exists(n, *a));

        let main_started = plan
            .containers
            .iter()
            .any(|c| by_name.contains_key(c.name.as_str()));
        // Every main container ended for good (the pod completes): its sidecars stop.
        let completed = main_started
            && plan.containers.iter().all(|c| {
                match by_name
                    .get(c.name.as_str())
                    .and_then(|l| l.last())
                    .map(|l| &l.state)
                {
                    Some(ObservedState::Exited { exited, .. }) => {
                        !plan.restart_policy.restarts(exited.exit_code)
                    }
                    _ => false,
                }
            });
        let mut views: Vec<ContainerView> = Vec::new();
        let mut init_complete = true;
        let mut init_failed = false;
        for c in &plan.init_containers {
            let mut view = ContainerView::new(c, true, &by_name);
            if c.sidecar && completed {
                if let Some(latest) = view.latest
                    && !matches!(latest.state, ObservedState::Exited { .. })
                {
                    self.stop(&mut actions, latest, now_ms, StopReason::Removed);
                }
                view.done = true;
                views.push(view);
                continue;
            }
            if c.sidecar && (main_started || (init_complete && !init_failed)) {
                // A sidecar: started in its turn, then kept running; the next init container
                // waits only for it to have started (its startup probe passed, if any).
                self.drive(&mut actions, &mut view, plan, now_ms, true);
                let started = view.latest.is_some_and(|l| {
                    matches!(l.state, ObservedState::Running(_))
                        && (c.post_start.is_none()
                            || self.post_start.get(&(c.name.clone(), l.meta.attempt))
                                == Some(&PostStart::Done))
                        && (c.startup.is_none()
                            || self.probe_passing(&c.name, l.meta.attempt, ProbeKind::Startup)
                                == Some(true))
                });
                if !started && !main_started {
                    init_complete = false;
                }
                views.push(view);
                continue;
            }
            if main_started {
                view.done = true;
                views.push(view);
                continue;
            }
            if !init_complete || init_failed {
                view.waiting = Some(("PodInitializing".into(), String::new()));
                views.push(view);
                continue;
            }
            match view.latest.map(|l| &l.state) {
                Some(ObservedState::Exited { exited, .. })
                    if exited.exit_code == 0 && exited.start_error.is_none() =>
                {
                    view.done = true;
                }
                Some(ObservedState::Exited { .. })
                    if plan.restart_policy == super::plan::RestartPolicy::Never =>
                {
                    view.done = true;
                    init_failed = true;
                }
                _ => {
                    init_complete = false;
                    self.drive(&mut actions, &mut view, plan, now_ms, true);
                }
            }
            views.push(view);
        }
        let init_complete = init_complete && !init_failed;
        for c in &plan.containers {
            let mut view = ContainerView::new(c, false, &by_name);
            if !init_complete {
                view.waiting = Some(("PodInitializing".into(), String::new()));
            } else {
                self.drive(&mut actions, &mut view, plan, now_ms, false);
            }
            views.push(view);
        }
        let mut status = self.status(plan, &views, init_complete, init_failed, first_seen, now_ms);
        if let Some((message, at_ms)) = self.evicted.clone() {
            // Nothing starts, restarts or is probed again; what runs is killed.
            actions.retain(|a| {
                matches!(
                    a,
                    Action::Signal { .. } | Action::Remove { .. } | Action::EnsureSandbox
                )
            });
            for c in observed {
                if !matches!(c.state, ObservedState::Exited { .. }) {
                    self.stop(&mut actions, c, now_ms, StopReason::Evicted);
                }
            }
            status["phase"] = json!("Failed");
            status["reason"] = json!("Evicted");
            status["message"] = json!(message);
            if let Some(conditions) = status["conditions"].as_array_mut() {
                conditions.push(json!({"type": "DisruptionTarget", "status": "True",
                    "reason": "TerminationByKubelet", "message": message,
                    "lastProbeTime": null, "lastTransitionTime": rfc3339(at_ms)}));
            }
        }
        Decision {
            actions,
            status: Some(status),
            finished: false,
        }
    }

    /// Starts, restarts, probes or stops one container.
    fn drive(
        &mut self,
        actions: &mut Vec<Action>,
        view: &mut ContainerView,
        plan: &PodPlan,
        now_ms: u64,
        init: bool,
    ) {
        let name = view.plan.name.clone();
        match view.latest.map(|c| (c, &c.state)) {
            None => {
                let backoff = self
                    .start_errors
                    .get(&name)
                    .map_or(0, |e| self.backoff_ms(e.failures.saturating_sub(1)));
                if let Some(error) = self.start_errors.get_mut(&name)
                    && error.failures > 0
                    && now_ms < error.at_ms.saturating_add(backoff)
                {
                    // A failed pull is shown once as ErrImagePull, then as ImagePullBackOff
                    // (with one BackOff event per failure) until the back-off ends.
                    let mut event = None;
                    if error.reason == ERR_IMAGE_PULL && error.shown {
                        let message = format!(
                            "Back-off pulling image {:?}: {}",
                            view.plan.image, error.message
                        );
                        view.waiting = Some((IMAGE_PULL_BACK_OFF.into(), message));
                        if !error.backoff_reported {
                            error.backoff_reported = true;
                            event = Some(format!("Back-off pulling image {:?}", view.plan.image));
                        }
                    } else {
                        error.shown = true;
                        view.waiting = Some((error.reason.clone(), error.message.clone()));
                    }
                    if let Some(message) = event {
                        self.event(&name, false, "BackOff", message);
                    }
                    return;
                }
                // A pending start (pulling) keeps its reason while it is tried again.
                let waiting = self
                    .start_errors
                    .get(&name)
                    .filter(|e| e.failures == 0)
                    .map(|e| (e.reason.clone(), e.message.clone()));
                view.waiting = Some(waiting.unwrap_or(("ContainerCreating".into(), String::new())));
                actions.push(Action::Start {
                    name,
                    attempt: 0,
                    init,
                });
            }
            Some((_, ObservedState::Creating)) => {
                view.waiting = Some(("ContainerCreating".into(), String::new()));
            }
            Some((c, ObservedState::Running(started))) => {
                if let Some(stopping) = self.stopping.get(&(name.clone(), c.meta.attempt)).copied()
                {
                    // Being stopped (a failed probe): keep at it.
                    self.stop(actions, c, now_ms, stopping.reason);
                    return;
                }
                let attempt = c.meta.attempt;
                // The postStart hook first: until it succeeds the container is not started (no
                // probe, not ready); a failure kills it. An attempt that ran before this worker
                // first saw the pod (an agent restart) had its hook run already.
                if let Some(hook) = &view.plan.post_start {
                    let key = (name.clone(), attempt);
                    let adopted = self
                        .first_seen_ms
                        .is_some_and(|first| started.started_unix_ms < first);
                    let state = self.post_start.entry(key).or_insert_with(|| {
                        if adopted {
                            PostStart::Done
                        } else {
                            actions.push(Action::PostStart {
                                name: name.clone(),
                                attempt,
                                handler: hook.clone(),
                            });
                            PostStart::Running
                        }
                    });
                    match state {
                        PostStart::Done => {}
                        PostStart::Running => {
                            view.waiting = Some(("ContainerCreating".into(), String::new()));
                            return;
                        }
                        PostStart::Failed(_) => {
                            self.stop(actions, c, now_ms, StopReason::PostStartFailed);
                            return;
                        }
                    }
                }
                let startup_passed = view.plan.startup.is_none()
                    || self.probe_passing(&name, attempt, ProbeKind::Startup) == Some(true);
                let mut probes: Vec<(ProbeKind, &Probe)> = Vec::new();
                if let Some(p) = &view.plan.startup
                    && !startup_passed
                {
                    probes.push((ProbeKind::Startup, p));
                }
                if startup_passed {
                    if let Some(p) = &view.plan.liveness {
                        probes.push((ProbeKind::Liveness, p));
                    }
                    if let Some(p) = &view.plan.readiness {
                        probes.push((ProbeKind::Readiness, p));
                    }
                }
                for (kind, probe) in probes {
                    let state = self
                        .probes
                        .entry((name.clone(), attempt, kind))
                        .or_default();
                    if kind != ProbeKind::Readiness && state.passing == Some(false) {
                        let failing = kind;
                        self.stop(actions, c, now_ms, StopReason::Unhealthy(failing));
                        return;
                    }
                    let due_from = match state.last_run_ms {
                        Some(last) => last.saturating_add(probe.period_ms),
                        None => started
                            .started_unix_ms
                            .saturating_add(probe.initial_delay_ms),
                    };
                    if !state.in_flight && now_ms >= due_from {
                        state.in_flight = true;
                        state.last_run_ms = Some(now_ms);
                        actions.push(Action::Probe {
                            name: name.clone(),
                            attempt,
                            kind,
                            probe: probe.clone(),
                        });
                    }
                }
                view.ready = (!init || view.plan.sidecar)
                    && startup_passed
                    && (view.plan.readiness.is_none()
                        || self.probe_passing(&name, attempt, ProbeKind::Readiness) == Some(true));
            }
            Some((
                c,
                ObservedState::Exited {
                    exited, oom_killed, ..
                },
            )) => {
                if *oom_killed && self.oom_reported.insert((name.clone(), c.meta.attempt)) {
                    self.event(
                        &name,
                        true,
                        "OOMKilling",
                        format!(
                            "Memory cgroup out of memory: killed container {name} of pod {}_{}({}) (attempt {})",
                            plan.name, plan.namespace, plan.uid, c.meta.attempt
                        ),
                    );
                }
                let restarts = if view.plan.sidecar {
                    true
                } else if init {
                    plan.restart_policy != super::plan::RestartPolicy::Never
                } else {
                    let unhealthy = matches!(
                        self.stopping
                            .get(&(name.clone(), c.meta.attempt))
                            .map(|s| s.reason),
                        Some(StopReason::Unhealthy(_))
                    );
                    // Killed for failing liveness: restarted unless the policy is Never (then
                    // it stays terminated, as in Kubernetes).
                    (unhealthy && plan.restart_policy != super::plan::RestartPolicy::Never)
                        || plan.restart_policy.restarts(exited.exit_code)
                };
                if !restarts {
                    view.done = true;
                    return;
                }
                let due = exited
                    .finished_unix_ms
                    .saturating_add(self.backoff_ms(c.meta.attempt));
                if now_ms >= due {
                    view.waiting = Some(("ContainerCreating".into(), String::new()));
                    actions.push(Action::Start {
                        name,
                        attempt: c.meta.attempt + 1,
                        init,
                    });
                } else {
                    if self.backoff_reported.insert((name.clone(), c.meta.attempt)) {
                        self.event(
                            &name,
                            true,
                            "BackOff",
                            format!(
                                "Back-off restarting failed container {name} in pod {}_{}({})",
                                plan.name, plan.namespace, plan.uid
                            ),
                        );
                    }
                    let seconds = self.backoff_ms(c.meta.attempt) / 1000;
                    view.waiting = Some((
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {seconds}s restarting failed container={name} pod={}_{}({})",
                            plan.name, plan.namespace, plan.uid
                        ),
                    ));
                }
            }
        }
    }

    fn probe_passing(&self, name: &str, attempt: u32, kind: ProbeKind) -> Option<bool> {
        self.probes
            .get(&(name.to_owned(), attempt, kind))
            .and_then(|s| s.passing)
    }

    fn state_json(&self, c: &ObservedContainer) -> Value {
        match &c.state {
            ObservedState::Creating => json!({"waiting": {"reason": "ContainerCreating"}}),
            ObservedState::Running(started) => {
                json!({"running": {"startedAt": rfc3339(started.started_unix_ms)}})
            }
            ObservedState::Exited {
                started,
                exited,
                oom_killed,
            } => {
                let reason = if *oom_killed {
                    "OOMKilled"
                } else if exited.start_error.is_some() {
                    "StartError"
                } else if exited.fence_lapsed {
                    "FenceLeaseLapsed"
                } else if exited.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                };
                let mut terminated = json!({
                    "exitCode": exited.exit_code,
                    "reason": reason,
                    "finishedAt": rfc3339(exited.finished_unix_ms),
                    "startedAt": started.as_ref().map(|s| rfc3339(s.started_unix_ms)),
                    "containerID": format!("shoal://{}", c.meta.runtime_id),
                });
                if let Some(signal) = exited.signal {
                    terminated["signal"] = json!(signal);
                }
                if let Some(message) = &exited.message {
                    terminated["message"] = json!(message);
                }
                if let Some(message) = &exited.start_error {
                    terminated["message"] = json!(message);
                }
                if exited.fence_lapsed {
                    terminated["message"] = json!(
                        "killed by its shim: the agent stopped renewing the fence lease (a fenced pod must not outlive its node's view of a majority)"
                    );
                }
                if let Some(stopping) = self.stopping.get(&(c.meta.name.clone(), c.meta.attempt))
                    && let StopReason::Unhealthy(kind) = stopping.reason
                {
                    terminated["message"] = json!(format!("{kind:?} probe failed"));
                }
                json!({"terminated": terminated})
            }
        }
    }

    fn status(
        &mut self,
        plan: &PodPlan,
        views: &[ContainerView],
        init_complete: bool,
        init_failed: bool,
        first_seen_ms: u64,
        now_ms: u64,
    ) -> Value {
        let mut init_statuses = Vec::new();
        let mut statuses = Vec::new();
        for view in views {
            let state = match (&view.waiting, view.latest) {
                (Some((reason, message)), _) => {
                    let mut waiting = json!({"reason": reason});
                    if !message.is_empty() {
                        waiting["message"] = json!(message);
                    }
                    json!({"waiting": waiting})
                }
                (None, Some(c)) => self.state_json(c),
                (None, None) => json!({"waiting": {"reason": "PodInitializing"}}),
            };
            // The previous attempt, or the latest one while a new attempt is pending.
            let last = match (&view.waiting, view.latest) {
                (Some(_), Some(c)) if matches!(c.state, ObservedState::Exited { .. }) => Some(c),
                _ => view.previous,
            };
            let mut status = json!({
                "name": view.plan.name,
                "image": view.plan.image,
                "imageID": view.latest.map(|c| c.meta.image_digest.clone()).unwrap_or_default(),
                "ready": view.ready,
                "restartCount": view.latest.map_or(0, |c| c.meta.attempt),
                "started": matches!(view.latest.map(|c| &c.state), Some(ObservedState::Running(_))),
                "state": state,
                "lastState": last.map_or(json!({}), |c| self.state_json(c)),
            });
            if let Some(c) = view.latest {
                status["containerID"] = json!(format!("shoal://{}", c.meta.runtime_id));
            }
            if view.init {
                init_statuses.push(status);
            } else {
                statuses.push(status);
            }
        }
        let main: Vec<&ContainerView> = views.iter().filter(|v| !v.init).collect();
        let exit_code = |v: &ContainerView| match v.latest.map(|c| &c.state) {
            Some(ObservedState::Exited { exited, .. }) => Some(exited.exit_code),
            _ => None,
        };
        let phase = if init_failed {
            "Failed"
        } else if !init_complete {
            "Pending"
        } else if main.iter().all(|v| v.done) {
            if main.iter().all(|v| exit_code(v) == Some(0)) {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if main.iter().all(|v| v.latest.is_some())
            && main.iter().any(|v| {
                // Running, or restarting after having run (not a container that never started).
                match v.latest.map(|c| &c.state) {
                    Some(ObservedState::Running(_)) => true,
                    Some(ObservedState::Exited { started, .. }) => {
                        started.is_some() || v.previous.is_some()
                    }
                    _ => false,
                }
            })
        {
            "Running"
        } else {
            "Pending"
        };
        // Sidecars' readiness counts toward the pod's, as upstream's.
        let serving: Vec<&ContainerView> =
            views.iter().filter(|v| !v.init || v.plan.sidecar).collect();
        let all_ready = serving.iter().all(|v| v.ready);
        let since = rfc3339(first_seen_ms);
        // When the pod's last main container started, if all run: a pod found ready when first
        // seen (re-adopted after an agent restart) has been ready since then at most, not since
        // the restart — which would make it unavailable again for `minReadySeconds`.
        let running_since = main
            .iter()
            .map(|v| match v.latest.map(|c| &c.state) {
                Some(ObservedState::Running(started)) => Some(started.started_unix_ms),
                _ => None,
            })
            .try_fold(0u64, |latest, started| Some(latest.max(started?)))
            .filter(|at| *at > 0 && *at <= first_seen_ms);
        // A condition's time is when its status last changed (the first one: when the pod
        // was first seen, or for readiness found at once, when its containers started).
        let mut changed = HashMap::new();
        for (kind, ok) in [
            ("Initialized", init_complete),
            ("Ready", all_ready),
            ("ContainersReady", all_ready),
        ] {
            let first = match (kind, ok, running_since) {
                ("Ready" | "ContainersReady", true, Some(at)) => at,
                _ => first_seen_ms,
            };
            let entry = self.transitions.entry(kind).or_insert((ok, first));
            if entry.0 != ok {
                *entry = (ok, now_ms);
            }
            changed.insert(kind, rfc3339(entry.1));
        }
        let condition = |kind: &str, ok: bool, reason: &str| {
            let at = changed.get(kind).cloned().unwrap_or_else(|| since.clone());
            let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": at});
            if !ok && !reason.is_empty() {
                c["reason"] = json!(reason);
            }
            c
        };
        let not_ready: Vec<&str> = serving
            .iter()
            .filter(|v| !v.ready)
            .map(|v| v.plan.name.as_str())
            .collect();
        let not_ready_reason = if phase == "Succeeded" || phase == "Failed" {
            "PodCompleted"
        } else {
            "ContainersNotReady"
        };
        let mut ready_condition = condition("Ready", all_ready, not_ready_reason);
        let mut containers_ready = condition("ContainersReady", all_ready, not_ready_reason);
        if !all_ready {
            let message = format!("containers with unready status: [{}]", not_ready.join(" "));
            ready_condition["message"] = json!(message);
            containers_ready["message"] = json!(message);
        }
        let mut status = json!({
            "phase": phase,
            "conditions": [
                condition("Initialized", init_complete, "ContainersNotInitialized"),
                ready_condition,
                containers_ready,
            ],
            "startTime": since,
            "qosClass": plan.qos_class(),
            "containerStatuses": statuses,
        });
        if !init_statuses.is_empty() {
            status["initContainerStatuses"] = json!(init_statuses);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::pod::observed::{ContainerMeta, Exited, Started};

    const BASE: u64 = 1_000;

    fn worker() -> PodWorker {
        PodWorker::new(WorkerConfig {
            backoff_base_ms: BASE,
            backoff_max_ms: 8 * BASE,
            default_grace_ms: 30_000,
        })
    }

    fn plan(spec: Value) -> PodPlan {
        let mut pod =
            json!({"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": spec});
        pod["spec"]["terminationGracePeriodSeconds"] = json!(2);
        PodPlan::parse(&pod).unwrap()
    }

    fn meta(name: &str, attempt: u32) -> ContainerMeta {
        ContainerMeta {
            name: name.into(),
            attempt,
            init: false,
            image: "busybox".into(),
            image_digest: "sha256:x".into(),
            runtime_id: format!("u-{name}-{attempt}"),
            cgroup_path: String::new(),
        }
    }

    fn running(name: &str, attempt: u32, at: u64) -> ObservedContainer {
        ObservedContainer {
            meta: meta(name, attempt),
            state: ObservedState::Running(Started {
                pid: 1,
                started_unix_ms: at,
            }),
            log_path: "/dev/null".into(),
        }
    }

    fn exited(name: &str, attempt: u32, code: i32, at: u64) -> ObservedContainer {
        ObservedContainer {
            meta: meta(name, attempt),
            state: ObservedState::Exited {
                started: Some(Started {
                    pid: 1,
                    started_unix_ms: at.saturating_sub(10),
                }),
                exited: Exited {
                    exit_code: code,
                    signal: None,
                    finished_unix_ms: at,
                    start_error: None,
                    fence_lapsed: false,
                    message: None,
                },
                oom_killed: false,
            },
            log_path: "/dev/null".into(),
        }
    }

    #[test]
    fn an_oom_kill_is_reported_once_per_attempt() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b"}]}));
        let mut w = PodWorker::default();
        let mut killed = exited("a", 0, 137, 1_000);
        if let ObservedState::Exited { oom_killed, .. } = &mut killed.state {
            *oom_killed = true;
        }
        w.decide(1_100, Some(&p), true, std::slice::from_ref(&killed));
        w.decide(1_200, Some(&p), true, std::slice::from_ref(&killed));
        let oom: Vec<WorkerEvent> = w
            .take_events()
            .into_iter()
            .filter(|e| e.reason == "OOMKilling")
            .collect();
        assert_eq!(oom.len(), 1, "{oom:?}");
        assert!(oom[0].warning);
        assert!(
            oom[0]
                .message
                .starts_with("Memory cgroup out of memory: killed container a"),
            "{}",
            oom[0].message
        );
        // A plain failure is no OOM.
        let mut w = PodWorker::default();
        w.decide(1_100, Some(&p), true, &[exited("a", 0, 1, 1_000)]);
        assert!(w.take_events().iter().all(|e| e.reason != "OOMKilling"));
    }

    fn starts(d: &Decision) -> Vec<(String, u32)> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { name, attempt, .. } => Some((name.clone(), *attempt)),
                _ => None,
            })
            .collect()
    }

    fn phase(d: &Decision) -> String {
        d.status.as_ref().unwrap()["phase"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn terms(d: &Decision) -> Vec<String> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Signal {
                    name,
                    signal: StopSignal::Term,
                    ..
                } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    /// Native sidecars (issue #39): started in their turn, not waited on to complete, kept
    /// running (and restarted) while the main container restarts, ready-counted, and stopped
    /// after the main containers — when the pod completes, and when it goes.
    #[test]
    fn a_sidecar_starts_in_turn_keeps_running_and_stops_after_the_others() {
        let p = plan(json!({
            "restartPolicy": "Never",
            "initContainers": [{"name": "proxy", "image": "b", "restartPolicy": "Always"},
                               {"name": "setup", "image": "b"}],
            "containers": [{"name": "app", "image": "b"}],
        }));
        assert!(p.init_containers[0].sidecar && !p.init_containers[1].sidecar);
        let mut w = worker();
        let d = w.decide(0, Some(&p), false, &[]);
        assert_eq!(starts(&d), [("proxy".to_owned(), 0)]);
        // Running: the next init container starts; the sidecar is not waited on to complete.
        let d = w.decide(10, Some(&p), true, &[running("proxy", 0, 5)]);
        assert_eq!(starts(&d), [("setup".to_owned(), 0)]);
        let d = w.decide(
            20,
            Some(&p),
            true,
            &[running("proxy", 0, 5), exited("setup", 0, 0, 15)],
        );
        assert_eq!(starts(&d), [("app".to_owned(), 0)]);
        // The sidecar crashes while the app runs: restarted (after its back-off), whatever
        // the pod's restartPolicy.
        let crashed = [
            exited("proxy", 0, 1, 25),
            exited("setup", 0, 0, 15),
            running("app", 0, 22),
        ];
        let d = w.decide(30 + BASE, Some(&p), true, &crashed);
        assert_eq!(starts(&d), [("proxy".to_owned(), 1)]);
        assert_eq!(phase(&d), "Running");
        // Both running: the pod is ready only with the sidecar ready too (it is).
        let up = [
            running("proxy", 1, 40 + BASE),
            exited("setup", 0, 0, 15),
            running("app", 0, 22),
        ];
        let d = w.decide(50 + BASE, Some(&p), true, &up);
        let status = d.status.unwrap();
        assert_eq!(status["conditions"][1]["status"], "True", "{status}");
        assert_eq!(status["initContainerStatuses"][0]["ready"], true);
        // The app ends (Never): the pod completes and its sidecar is stopped.
        let done = [
            running("proxy", 1, 40 + BASE),
            exited("setup", 0, 0, 15),
            exited("app", 0, 0, 60 + BASE),
        ];
        let d = w.decide(70 + BASE, Some(&p), true, &done);
        assert_eq!(terms(&d), ["proxy"]);
        assert!(starts(&d).is_empty());
        assert_eq!(phase(&d), "Succeeded");
        // The pod goes while both run: the app first, the sidecar once the app has stopped.
        let mut w2 = worker();
        w2.decide(0, Some(&p), true, &up);
        let d = w2.decide(100, None, true, &up);
        assert_eq!(terms(&d), ["app"]);
        let app_gone = [running("proxy", 1, 40 + BASE), exited("app", 0, 143, 110)];
        let d = w2.decide(120, None, true, &app_gone);
        assert_eq!(terms(&d), ["proxy"]);
        // A main container may not have a restartPolicy of its own.
        let bad = json!({"metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "b", "restartPolicy": "Always"}]}});
        assert_eq!(
            PodPlan::parse(&bad).unwrap_err().field,
            "spec.containers[0].restartPolicy"
        );
    }

    #[test]
    fn init_containers_run_in_order_then_the_containers() {
        let p = plan(json!({
            "initContainers": [{"name": "i1", "image": "b"}, {"name": "i2", "image": "b"}],
            "containers": [{"name": "app", "image": "b"}, {"name": "side", "image": "b"}],
        }));
        let mut w = worker();
        let d = w.decide(0, Some(&p), false, &[]);
        assert_eq!(d.actions[0], Action::EnsureSandbox);
        assert_eq!(starts(&d), [("i1".to_owned(), 0)]);
        assert_eq!(phase(&d), "Pending");
        let d = w.decide(10, Some(&p), true, &[running("i1", 0, 5)]);
        assert!(starts(&d).is_empty());
        let d = w.decide(20, Some(&p), true, &[exited("i1", 0, 0, 15)]);
        assert_eq!(starts(&d), [("i2".to_owned(), 0)]);
        let d = w.decide(
            30,
            Some(&p),
            true,
            &[exited("i1", 0, 0, 15), exited("i2", 0, 0, 25)],
        );
        assert_eq!(starts(&d), [("app".to_owned(), 0), ("side".to_owned(), 0)]);
        let all = [
            exited("i1", 0, 0, 15),
            exited("i2", 0, 0, 25),
            running("app", 0, 35),
            running("side", 0, 35),
        ];
        let d = w.decide(40, Some(&p), true, &all);
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(phase(&d), "Running");
        let status = d.status.unwrap();
        assert_eq!(status["conditions"][1]["status"], "True", "{status}");
        assert_eq!(
            status["initContainerStatuses"][1]["state"]["terminated"]["reason"],
            "Completed"
        );
    }

    #[test]
    fn a_failing_init_container_retries_or_fails_the_pod() {
        let spec = json!({"initContainers": [{"name": "i", "image": "b"}], "containers": [{"name": "a", "image": "b"}]});
        let mut w = worker();
        let d = w.decide(
            100,
            Some(&plan(spec.clone())),
            true,
            &[exited("i", 0, 1, 50)],
        );
        assert!(starts(&d).is_empty(), "backing off");
        let d = w.decide(
            50 + BASE,
            Some(&plan(spec.clone())),
            true,
            &[exited("i", 0, 1, 50)],
        );
        assert_eq!(starts(&d), [("i".to_owned(), 1)]);

        let mut never = spec;
        never["restartPolicy"] = json!("Never");
        let d = worker().decide(100, Some(&plan(never)), true, &[exited("i", 0, 1, 50)]);
        assert!(starts(&d).is_empty());
        assert_eq!(phase(&d), "Failed");
    }

    #[test]
    fn restarts_back_off_exponentially_and_show_crash_loop() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b"}]}));
        let mut w = worker();
        // Attempt 0 failed at t=1000: restart at 1000 + BASE.
        let d = w.decide(1_500, Some(&p), true, &[exited("a", 0, 1, 1_000)]);
        assert!(starts(&d).is_empty());
        let status = d.status.unwrap();
        assert_eq!(
            status["containerStatuses"][0]["state"]["waiting"]["reason"],
            "CrashLoopBackOff"
        );
        assert_eq!(
            status["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
            1
        );
        assert_eq!(status["phase"], "Running");
        // The back-off is one event per attempt, however often the worker decides meanwhile.
        w.decide(1_600, Some(&p), true, &[exited("a", 0, 1, 1_000)]);
        let events = w.take_events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            (
                events[0].reason,
                events[0].warning,
                events[0].message.as_str()
            ),
            (
                "BackOff",
                true,
                "Back-off restarting failed container a in pod p_default(u)"
            )
        );
        let d = w.decide(2_000, Some(&p), true, &[exited("a", 0, 1, 1_000)]);
        assert_eq!(starts(&d), [("a".to_owned(), 1)]);
        // Attempt 2 failed at t=5000: the delay doubles each time, up to the cap.
        let seen = [exited("a", 1, 1, 3_000), exited("a", 2, 1, 5_000)];
        assert!(starts(&w.decide(5_000 + 4 * BASE - 1, Some(&p), true, &seen)).is_empty());
        assert_eq!(
            starts(&w.decide(5_000 + 4 * BASE, Some(&p), true, &seen)),
            [("a".to_owned(), 3)]
        );
        let late = [exited("a", 9, 1, 0)];
        assert_eq!(
            starts(&w.decide(8 * BASE, Some(&p), true, &late)),
            [("a".to_owned(), 10)]
        );
    }

    #[test]
    fn old_attempts_are_removed_keeping_the_previous_one() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b"}]}));
        let seen = [
            exited("a", 0, 1, 10),
            exited("a", 1, 1, 20),
            running("a", 2, 30),
        ];
        let d = worker().decide(40, Some(&p), true, &seen);
        assert_eq!(
            d.actions,
            [Action::Remove {
                name: "a".into(),
                attempt: 0
            }]
        );
        let status = d.status.unwrap();
        assert_eq!(status["containerStatuses"][0]["restartCount"], 2);
        assert_eq!(
            status["containerStatuses"][0]["lastState"]["terminated"]["finishedAt"],
            rfc3339(20)
        );
    }

    /// An evicted pod's containers are killed at once (no preStop hook, no grace) and never
    /// started again; the pod is Failed with reason Evicted, its DisruptionTarget condition's
    /// time stays the eviction's (no status churn).
    #[test]
    fn an_evicted_pod_is_killed_at_once_and_ends_failed() {
        let p = plan(
            json!({"restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "a", "image": "b", "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}},
                {"name": "c", "image": "b"}]}),
        );
        let mut w = worker();
        let run = [running("a", 0, 0), exited("c", 0, 1, 10)];
        assert!(w.evict(
            "Usage of EmptyDir volume \"v\" exceeds the limit \"1Mi\".".into(),
            5_000
        ));
        assert!(!w.evict("again".into(), 6_000), "one eviction");
        let d = w.decide(100_000, Some(&p), true, &run);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Kill
            }]
        );
        assert!(starts(&d).is_empty(), "c is not restarted");
        let status = d.status.unwrap();
        assert_eq!(
            (status["phase"].as_str(), status["reason"].as_str()),
            (Some("Failed"), Some("Evicted"))
        );
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("exceeds the limit")
        );
        let later = w.decide(
            200_000,
            Some(&p),
            true,
            &[exited("a", 0, 137, 100_500), exited("c", 0, 1, 10)],
        );
        assert!(starts(&later).is_empty());
        let disruption = |s: &Value| {
            s["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "DisruptionTarget")
                .cloned()
        };
        assert_eq!(disruption(&later.status.unwrap()), disruption(&status));
        assert_eq!(
            disruption(&status).unwrap()["lastTransitionTime"],
            "1970-01-01T00:00:05Z"
        );
    }

    #[test]
    fn restart_policies_decide_the_final_phase() {
        let cases = [
            ("Never", 0, "Succeeded", false),
            ("Never", 3, "Failed", false),
            ("OnFailure", 0, "Succeeded", false),
            ("OnFailure", 3, "Running", true),
            ("Always", 0, "Running", true),
        ];
        for (policy, code, want, restarts) in cases {
            let p =
                plan(json!({"restartPolicy": policy, "containers": [{"name": "a", "image": "b"}]}));
            let d = worker().decide(100_000, Some(&p), true, &[exited("a", 0, code, 10)]);
            assert_eq!(phase(&d), want, "{policy} exit {code}");
            assert_eq!(!starts(&d).is_empty(), restarts, "{policy} exit {code}");
        }
    }

    #[test]
    fn liveness_failures_stop_the_container_with_grace_then_restart_it() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b",
            "livenessProbe": {"exec": {"command": ["true"]}, "initialDelaySeconds": 1, "periodSeconds": 1, "failureThreshold": 2}}]}));
        let probe = p.containers[0].liveness.clone().unwrap();
        let mut w = worker();
        let run = [running("a", 0, 0)];
        assert!(
            w.decide(500, Some(&p), true, &run).actions.is_empty(),
            "initial delay"
        );
        let d = w.decide(1_000, Some(&p), true, &run);
        assert!(matches!(
            d.actions[..],
            [Action::Probe {
                kind: ProbeKind::Liveness,
                ..
            }]
        ));
        assert!(
            w.decide(1_500, Some(&p), true, &run).actions.is_empty(),
            "in flight"
        );
        w.probe_done("a", 0, ProbeKind::Liveness, &probe, false, "exit 1");
        assert!(
            w.decide(1_600, Some(&p), true, &run).actions.is_empty(),
            "period"
        );
        let d = w.decide(2_000, Some(&p), true, &run);
        assert!(matches!(d.actions[..], [Action::Probe { .. }]));
        w.probe_done("a", 0, ProbeKind::Liveness, &probe, false, "exit 1");
        let d = w.decide(2_100, Some(&p), true, &run);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Term
            }]
        );
        // What users see: each failure, then the kill, once.
        let reasons = |w: &mut PodWorker| {
            w.take_events()
                .into_iter()
                .map(|e| format!("{} {}", e.reason, e.message))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            reasons(&mut w),
            [
                "Unhealthy Liveness probe failed: exit 1",
                "Unhealthy Liveness probe failed: exit 1",
                "Killing Container a failed liveness probe, will be restarted",
            ]
        );
        assert!(
            w.decide(3_000, Some(&p), true, &run).actions.is_empty(),
            "grace (2 s)"
        );
        assert!(reasons(&mut w).is_empty(), "the kill is reported once");
        let d = w.decide(4_100, Some(&p), true, &run);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Kill
            }]
        );
        // It died of the kill; the restart waits for the back-off, then comes.
        let dead = [exited("a", 0, 137, 4_200)];
        let d = w.decide(4_200 + BASE, Some(&p), true, &dead);
        assert_eq!(starts(&d), [("a".to_owned(), 1)]);
        assert_eq!(
            d.status.unwrap()["containerStatuses"][0]["lastState"]["terminated"]["message"],
            "Liveness probe failed"
        );
    }

    #[test]
    fn a_liveness_failure_under_restart_policy_never_kills_without_restarting() {
        let p = plan(
            json!({"restartPolicy": "Never", "containers": [{"name": "a", "image": "b",
            "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1, "failureThreshold": 1}}]}),
        );
        let probe = p.containers[0].liveness.clone().unwrap();
        let mut w = worker();
        let run = [running("a", 0, 0)];
        let d = w.decide(1_000, Some(&p), true, &run);
        assert!(matches!(d.actions[..], [Action::Probe { .. }]));
        w.probe_done("a", 0, ProbeKind::Liveness, &probe, false, "exit 1");
        let d = w.decide(1_100, Some(&p), true, &run);
        assert!(matches!(
            d.actions[..],
            [Action::Signal {
                signal: StopSignal::Term,
                ..
            }]
        ));
        let dead = [exited("a", 0, 137, 1_200)];
        for now in [1_300, 1_300 + 10 * BASE] {
            let d = w.decide(now, Some(&p), true, &dead);
            assert!(starts(&d).is_empty(), "restarted under Never at {now}");
        }
        assert_eq!(phase(&w.decide(2_000, Some(&p), true, &dead)), "Failed");
    }

    /// A pod found running and ready when its worker first sees it (re-adopted after an agent
    /// restart) has been ready since its container started, not since the restart: a
    /// Deployment's `minReadySeconds` does not make it unavailable again. A fresh pod's Ready
    /// time is when it turned ready.
    #[test]
    fn a_readopted_ready_pod_keeps_its_ready_time() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b"}]}));
        let mut w = worker();
        let status = w
            .decide(50_000, Some(&p), true, &[running("a", 0, 10_000)])
            .status
            .unwrap();
        assert_eq!(status["conditions"][1]["status"], "True", "{status}");
        assert_eq!(
            status["conditions"][1]["lastTransitionTime"],
            rfc3339(10_000)
        );
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            rfc3339(50_000)
        );
        let mut fresh = worker();
        fresh.decide(1_000, Some(&p), true, &[]);
        let status = fresh
            .decide(2_000, Some(&p), true, &[running("a", 0, 1_500)])
            .status
            .unwrap();
        assert_eq!(
            status["conditions"][1]["lastTransitionTime"],
            rfc3339(2_000)
        );
    }

    #[test]
    fn readiness_gates_the_ready_condition_and_startup_gates_liveness() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b",
            "startupProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1},
            "livenessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1},
            "readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 1}}]}));
        let c = &p.containers[0];
        let mut w = worker();
        let run = [running("a", 0, 0)];
        let d = w.decide(0, Some(&p), true, &run);
        assert!(
            matches!(
                &d.actions[..],
                [Action::Probe {
                    kind: ProbeKind::Startup,
                    ..
                }]
            ),
            "{:?}",
            d.actions
        );
        assert_eq!(d.status.unwrap()["conditions"][1]["status"], "False");
        w.probe_done(
            "a",
            0,
            ProbeKind::Startup,
            c.startup.as_ref().unwrap(),
            true,
            "",
        );
        let d = w.decide(1_000, Some(&p), true, &run);
        let kinds: Vec<ProbeKind> = d
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Probe { kind, .. } => Some(*kind),
                _ => None,
            })
            .collect();
        assert_eq!(kinds, [ProbeKind::Liveness, ProbeKind::Readiness]);
        w.probe_done(
            "a",
            0,
            ProbeKind::Readiness,
            c.readiness.as_ref().unwrap(),
            true,
            "",
        );
        w.probe_done(
            "a",
            0,
            ProbeKind::Liveness,
            c.liveness.as_ref().unwrap(),
            true,
            "",
        );
        let status = w.decide(1_100, Some(&p), true, &run).status.unwrap();
        assert_eq!(status["conditions"][1]["status"], "True", "{status}");
        assert_eq!(status["containerStatuses"][0]["ready"], true);
        // Each condition carries when it last changed: Ready now, Initialized at the start.
        assert_eq!(
            status["conditions"][1]["lastTransitionTime"],
            rfc3339(1_100)
        );
        assert_eq!(status["conditions"][0]["lastTransitionTime"], rfc3339(0));
        let status = w.decide(1_500, Some(&p), true, &run).status.unwrap();
        assert_eq!(
            status["conditions"][1]["lastTransitionTime"],
            rfc3339(1_100)
        );
        // Readiness failing (3 times) turns Ready off without a restart.
        for t in [2_000, 3_000, 4_000] {
            w.decide(t, Some(&p), true, &run);
            w.probe_done(
                "a",
                0,
                ProbeKind::Readiness,
                c.readiness.as_ref().unwrap(),
                false,
                "503",
            );
        }
        let d = w.decide(4_100, Some(&p), true, &run);
        assert!(!d.actions.iter().any(|a| matches!(a, Action::Signal { .. })));
        let status = d.status.unwrap();
        assert_eq!(status["conditions"][1]["status"], "False");
        assert_eq!(
            status["conditions"][1]["lastTransitionTime"],
            rfc3339(4_100)
        );
    }

    #[test]
    fn a_pod_gone_from_the_node_is_stopped_with_grace_then_removed() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b"}]}));
        let mut w = worker();
        w.decide(0, Some(&p), true, &[running("a", 0, 0)]);
        let d = w.decide(100, None, true, &[running("a", 0, 0)]);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Term
            }]
        );
        assert!(
            w.decide(1_000, None, true, &[running("a", 0, 0)])
                .actions
                .is_empty()
        );
        let d = w.decide(2_100, None, true, &[running("a", 0, 0)]);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Kill
            }]
        );
        let d = w.decide(2_200, None, true, &[exited("a", 0, 137, 2_150)]);
        assert_eq!(
            d.actions,
            [
                Action::Remove {
                    name: "a".into(),
                    attempt: 0
                },
                Action::RemoveSandbox
            ]
        );
        assert!(d.finished);
    }

    /// postStart: run once per attempt when it is seen running; until it succeeds the
    /// container is not ready and not probed; a failure kills the attempt (with an event) and
    /// the policy restarts it; an attempt adopted after a restart does not run it again.
    #[test]
    fn the_post_start_hook_gates_the_start_and_its_failure_kills_the_attempt() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b",
            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
            "lifecycle": {"postStart": {"httpGet": {"port": 8080, "path": "/warm"}}}}]}));
        let hook = Handler::HttpGet {
            port: 8080,
            path: "/warm".into(),
        };
        let mut w = worker();
        let _ = w.decide(1_000, Some(&p), true, &[]);
        let run = [running("a", 0, 1_500)];
        let d = w.decide(2_000, Some(&p), true, &run);
        assert_eq!(
            d.actions,
            [Action::PostStart {
                name: "a".into(),
                attempt: 0,
                handler: hook.clone()
            }]
        );
        let waiting = |d: &Decision| {
            d.status.as_ref().unwrap()["containerStatuses"][0]["state"]["waiting"]["reason"].clone()
        };
        assert_eq!(waiting(&d), "ContainerCreating");
        // Still running: not again, no probe yet.
        assert!(w.decide(3_000, Some(&p), true, &run).actions.is_empty());
        w.post_start_done("a", 0, Ok(()));
        let d = w.decide(4_000, Some(&p), true, &run);
        assert!(
            matches!(d.actions[..], [Action::Probe { .. }]),
            "{:?}",
            d.actions
        );
        // The next attempt's hook fails: killed, an event; then restarted.
        let run1 = [exited("a", 0, 137, 5_000), running("a", 1, 20_000)];
        let d = w.decide(20_500, Some(&p), true, &run1);
        assert!(matches!(
            d.actions[..],
            [Action::PostStart { attempt: 1, .. }]
        ));
        w.post_start_done("a", 1, Err("HTTP 500".into()));
        let d = w.decide(21_000, Some(&p), true, &run1);
        assert!(
            matches!(d.actions[..], [Action::Signal { attempt: 1, .. }]),
            "{:?}",
            d.actions
        );
        assert!(
            w.take_events()
                .iter()
                .any(|e| e.reason == "FailedPostStartHook" && e.message.contains("HTTP 500"))
        );
        // A worker that first sees a running attempt (an agent restart): no hook again.
        let mut fresh = worker();
        let d = fresh.decide(30_000, Some(&p), true, &[running("a", 2, 25_000)]);
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::PostStart { .. })),
            "{:?}",
            d.actions
        );
    }

    #[test]
    fn a_pod_stopped_now_is_killed_in_the_same_decision_without_its_hook() {
        // A fenced pod whose node lost its run lease: no SIGTERM first (its container may
        // ignore it), no preStop hook, no second pass before the SIGKILL.
        let p = plan(json!({"containers": [{"name": "a", "image": "b",
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}]}));
        let mut w = worker();
        w.decide(0, Some(&p), true, &[running("a", 0, 0)]);
        w.stop_now();
        let d = w.decide(100, None, true, &[running("a", 0, 0)]);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Kill
            }]
        );
        // Repeated now and then in case it raced with the start, not at every pass.
        assert!(
            w.decide(200, None, true, &[running("a", 0, 0)])
                .actions
                .is_empty()
        );
        let d = w.decide(2_200, None, true, &[exited("a", 0, 137, 150)]);
        assert!(d.finished);
    }

    #[test]
    fn the_pre_stop_hook_runs_before_sigterm_within_the_grace_period() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b",
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "drain"]}}}}]}));
        let mut w = worker();
        w.decide(0, Some(&p), true, &[running("a", 0, 0)]);
        let d = w.decide(100, None, true, &[running("a", 0, 0)]);
        assert_eq!(
            d.actions,
            [Action::PreStop {
                name: "a".into(),
                attempt: 0,
                handler: Handler::Exec(vec!["sh".into(), "-c".into(), "drain".into()])
            }]
        );
        assert!(
            w.decide(500, None, true, &[running("a", 0, 0)])
                .actions
                .is_empty(),
            "the hook runs"
        );
        w.pre_stop_done("a", 0);
        let d = w.decide(600, None, true, &[running("a", 0, 0)]);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Term
            }]
        );
        // The grace period (2 s) counts from the start of the hook.
        let d = w.decide(2_100, None, true, &[running("a", 0, 0)]);
        assert_eq!(
            d.actions,
            [Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Kill
            }]
        );

        // A hook that hangs: SIGTERM and SIGKILL still come when the grace period ends.
        let mut w = worker();
        w.decide(0, Some(&p), true, &[running("a", 0, 0)]);
        w.decide(100, None, true, &[running("a", 0, 0)]);
        let d = w.decide(2_100, None, true, &[running("a", 0, 0)]);
        assert!(
            d.actions.contains(&Action::Signal {
                name: "a".into(),
                attempt: 0,
                signal: StopSignal::Kill
            }),
            "{:?}",
            d.actions
        );
    }

    #[test]
    fn a_start_failure_waits_with_its_reason_and_retries_after_back_off() {
        let p = plan(json!({"containers": [{"name": "a", "image": "b"}]}));
        let mut w = worker();
        assert_eq!(
            starts(&w.decide(0, Some(&p), true, &[])),
            [("a".to_owned(), 0)]
        );
        w.start_failed("a", "ErrImageNeverPull", "image b is not present", 0);
        let d = w.decide(500, Some(&p), true, &[]);
        assert!(starts(&d).is_empty());
        let status = d.status.unwrap();
        assert_eq!(
            status["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ErrImageNeverPull"
        );
        assert_eq!(status["phase"], "Pending");
        assert_eq!(
            starts(&w.decide(BASE, Some(&p), true, &[])),
            [("a".to_owned(), 0)]
        );
    }

    #[test]
    fn a_failed_pull_is_err_image_pull_then_image_pull_back_off_with_a_doubling_back_off() {
        let p = plan(json!({"containers": [{"name": "a", "image": "reg:5000/app:1"}]}));
        let mut w = worker();
        let waiting = |d: &Decision| {
            let s = d.status.clone().unwrap();
            let w = &s["containerStatuses"][0]["state"]["waiting"];
            (
                w["reason"].as_str().unwrap_or_default().to_owned(),
                w["message"].as_str().unwrap_or_default().to_owned(),
            )
        };
        let mut at = 0;
        for failure in 0..3u32 {
            assert_eq!(
                starts(&w.decide(at, Some(&p), true, &[])),
                [("a".to_owned(), 0)]
            );
            w.take_events();
            w.start_failed("a", ERR_IMAGE_PULL, "Failed to pull image: refused", at);
            let events: Vec<_> = w
                .take_events()
                .into_iter()
                .map(|e| (e.reason, e.message))
                .collect();
            assert_eq!(
                events,
                [
                    ("Failed", "Failed to pull image: refused".to_owned()),
                    ("Failed", "Error: ErrImagePull".to_owned())
                ]
            );
            // Shown once as ErrImagePull, then ImagePullBackOff with one BackOff event.
            assert_eq!(
                waiting(&w.decide(at + 1, Some(&p), true, &[])).0,
                ERR_IMAGE_PULL
            );
            let d = w.decide(at + 2, Some(&p), true, &[]);
            assert_eq!(
                waiting(&d),
                (
                    IMAGE_PULL_BACK_OFF.to_owned(),
                    "Back-off pulling image \"reg:5000/app:1\": Failed to pull image: refused"
                        .to_owned()
                )
            );
            assert!(starts(&d).is_empty());
            w.decide(at + 3, Some(&p), true, &[]);
            let backoffs = w
                .take_events()
                .into_iter()
                .filter(|e| e.reason == "BackOff")
                .count();
            assert_eq!(backoffs, 1);
            // The back-off doubles: base, 2 × base, 4 × base.
            let backoff = BASE << failure;
            assert!(starts(&w.decide(at + backoff - 1, Some(&p), true, &[])).is_empty());
            at += backoff;
        }
        assert_eq!(
            starts(&w.decide(at, Some(&p), true, &[])),
            [("a".to_owned(), 0)]
        );
    }
}
