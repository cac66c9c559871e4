//! One pass of the kubelet: the pods bound here and what the runtime runs, reconciled —
//! admission of new pods, each pod's worker driven with the time and what was observed, stale
//! sandboxes renumbered, stopped pods deleted, statuses published.

use super::*;

impl Kubelet {
    pub(super) fn sync(
        &self,
        handle: &tokio::runtime::Handle,
        workers: &mut HashMap<String, PodWorker>,
        published: &mut HashMap<String, String>,
        admission: &mut admission::Admission,
        probe_tx: &mpsc::Sender<ProbeResult>,
        hook_tx: &mpsc::Sender<HookDone>,
    ) -> bool {
        let bound = self
            .bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let fenced_stop = self.scheduling.must_stop_fenced();
        let mut observed: HashMap<String, ObservedPod> = self
            .runtime
            .list()
            .into_iter()
            .map(|p| (p.sandbox.uid.clone(), p))
            .collect();
        // Pods numbered from a block this node no longer holds (it lost the block to another
        // node after a partition healed) start over in a new sandbox with a new address: two
        // live pods must never share an IP.
        let stale: Vec<String> = observed
            .values()
            .filter(|p| {
                p.network
                    .is_some_and(|n| !self.runtime.network_is_current(&n))
            })
            .map(|p| p.sandbox.uid.clone())
            .collect();
        for uid in stale {
            info!(pod = %uid, "renumbering the pod: its address is outside this node's pod CIDR");
            match self.runtime.remove_sandbox(&uid) {
                Ok(()) => {
                    observed.remove(&uid);
                    workers.remove(&uid);
                }
                Err(error) => warn!(pod = %uid, %error, "removing the pod's old sandbox"),
            }
        }
        let refused = self.admit(handle, admission, &bound, &observed, workers);
        let uids: HashSet<String> = bound
            .keys()
            .chain(observed.keys())
            .chain(workers.keys())
            .filter(|uid| !refused.contains_key(*uid))
            .cloned()
            .collect();
        let mut statuses: HashMap<String, Option<String>> = HashMap::new();
        for (uid, refusal) in &refused {
            if let Some(pod) = bound.get(uid) {
                let status = json!({"phase": "Pending", "reason": refusal.reason, "message": refusal.message});
                statuses.insert(uid.clone(), Some(report(&pod.object, status)));
            }
        }
        let mut busy = observed.values().any(|p| {
            p.containers
                .iter()
                .any(|c| matches!(c.state, crate::runtime::ObservedState::Creating))
        });
        // Fenced pods this pass may run: their fence leases are renewed after it.
        let mut fence_held: Vec<(String, u64)> = Vec::new();
        // Pods the volume measurements found over their limits (`volume_usage`).
        let mut evictions: HashMap<String, String> = std::mem::take(
            &mut *self
                .evictions
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .into_iter()
        .collect();
        for uid in uids {
            let now = now_ms();
            let pod = bound.get(&uid);
            let mut fenced = false;
            // When the node's run lease on this fenced pod ends: its containers start only
            // before it, and their shims hold them to it.
            let mut fence_deadline_ms = None;
            // A pod being deleted is stopped (gracefully), then its object deleted.
            let deleting = pod
                .is_some_and(|p| shoal_core::controllers::garbage::deletion_requested(&p.object));
            let plan: Option<&pod::PodPlan> = match pod.map(|p| &p.plan) {
                Some(Ok(plan)) => {
                    let policy = Policy::parse(
                        plan.annotations
                            .get(partition::ANNOTATION)
                            .map(String::as_str),
                    );
                    // A fenced pod runs only while this node holds its run lease; its shims
                    // kill it when that lease would lapse, whatever this loop does by then.
                    let left = (policy == Policy::Fenced && !fenced_stop)
                        .then(|| self.scheduling.fenced_run_left(&uid))
                        .flatten();
                    fenced = policy == Policy::Fenced && left.is_none();
                    if let Some(left) = left
                        && !deleting
                    {
                        let deadline_ms = crate::runtime::lease::monotonic_ms()
                            .saturating_add(left.as_millis() as u64);
                        fence_held.push((uid.clone(), deadline_ms));
                        fence_deadline_ms = Some(deadline_ms);
                    }
                    (!fenced && !deleting).then_some(plan)
                }
                Some(Err(error)) => {
                    // Not runnable as written (the API validates, but a newer peer may not):
                    // say why and leave whatever runs alone.
                    let status = json!({"phase": "Pending", "reason": "InvalidPodSpec", "message": error.to_string()});
                    let object = &pod.expect("parsed").object;
                    statuses.insert(uid.clone(), Some(report(object, status)));
                    continue;
                }
                None => None,
            };
            let empty = Vec::new();
            let seen = observed.get(&uid);
            let containers = seen.map_or(&empty, |p| &p.containers);
            let worker = workers
                .entry(uid.clone())
                .or_insert_with(|| PodWorker::new(self.config.worker));
            // A fenced pod running here but bound elsewhere now (the majority moved it while
            // this node was away) stops at once too: its grace period would be a time it runs
            // twice.
            let moved_fenced = plan.is_none()
                && seen.is_some_and(|p| {
                    self.is_fenced_object(&p.sandbox.namespace, &p.sandbox.name, &uid)
                });
            if fenced || moved_fenced {
                worker.stop_now();
            }
            if deleting
                && let Some(ms) =
                    pod.and_then(|p| shoal_core::controllers::garbage::deletion_grace_ms(&p.object))
            {
                worker.limit_grace(ms);
            }
            if let (Some(message), Some(plan)) = (evictions.remove(&uid), plan)
                && worker.evict(message.clone(), now)
            {
                warn!(pod = %format!("{}/{}", plan.namespace, plan.name), %message, "evicting the pod");
                self.events.record(NewEvent::new(
                    ObjectRef::pod(&plan.namespace, &plan.name, &uid),
                    EventType::Warning,
                    "Evicted",
                    message,
                    events::KUBELET,
                ));
            }
            let decision = worker.decide(now, plan, seen.is_some(), containers);
            busy |= decision
                .actions
                .iter()
                .any(|a| matches!(a, Action::Start { .. }));
            for action in decision.actions {
                let pod = Acting {
                    uid: &uid,
                    plan,
                    fence_deadline_ms,
                };
                if let Err(error) = self.act(&pod, containers, worker, action, probe_tx, hook_tx) {
                    warn!(pod = %uid, %error, "kubelet action failed");
                    break;
                }
            }
            let decided = worker.take_events();
            if let Some((namespace, name)) = worker.pod() {
                for e in decided {
                    self.events.record(NewEvent::new(
                        ObjectRef::pod(namespace, name, &uid).container(&e.container, e.init),
                        if e.warning {
                            EventType::Warning
                        } else {
                            EventType::Normal
                        },
                        e.reason,
                        e.message,
                        events::KUBELET,
                    ));
                }
            }
            match decision.status {
                Some(mut status) => {
                    status["hostIP"] = json!(self.host_ip);
                    status["hostIPs"] = json!([{"ip": self.host_ip}]);
                    let pod_ip = if plan.is_some_and(|p| p.host_network) {
                        Some(self.host_ip.clone())
                    } else {
                        seen.and_then(|p| p.network).map(|n| n.ip.to_string())
                    };
                    if let Some(ip) = pod_ip {
                        status["podIP"] = json!(ip);
                        status["podIPs"] = json!([{ "ip": ip }]);
                    }
                    let object = &pod.expect("a status comes with a spec").object;
                    statuses.insert(uid.clone(), Some(report(object, status)));
                }
                // A pod being deleted keeps showing what it last was while it stops.
                None if deleting => {
                    let key = format!("{}{uid}", crate::observed::pod_status::KEY_PREFIX);
                    statuses.insert(uid.clone(), published.get(&key).cloned());
                }
                None => {
                    statuses.insert(uid.clone(), None);
                }
            }
            if decision.finished {
                workers.remove(&uid);
                if deleting && let Some(pod) = pod {
                    self.delete_stopped(handle, &pod.object);
                }
            }
        }
        self.renew_fence_leases(&fence_held);
        // Publish what changed; withdraw statuses of pods no longer here.
        for key in published.keys().cloned().collect::<Vec<_>>() {
            let uid = key.trim_start_matches(crate::observed::pod_status::KEY_PREFIX);
            if !statuses.contains_key(uid) {
                statuses.insert(uid.to_owned(), None);
            }
        }
        for (uid, status) in statuses {
            let key = format!("{}{uid}", crate::observed::pod_status::KEY_PREFIX);
            if published.get(&key) == status.as_ref() {
                continue;
            }
            handle.block_on(self.membership.set_dynamic(&key, status.clone()));
            let report = status.as_deref().and_then(|s| {
                serde_json::from_str::<crate::observed::pod_status::PodReport>(s).ok()
            });
            self.statuses.set_local(&uid, &self.node_name, report);
            match status {
                Some(status) => published.insert(key, status),
                None => published.remove(&key),
            };
        }
        self.refresh_file_volumes(&bound, &observed);
        busy
    }

    /// [`start::refresh_files`] for each pod with a running container, at most every
    /// [`FILES_REFRESH`]: a label added, a ConfigMap edited, reach the files.
    fn refresh_file_volumes(
        &self,
        bound: &HashMap<String, Arc<BoundPod>>,
        observed: &HashMap<String, ObservedPod>,
    ) {
        let mut state = self
            .files_written
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if state.0.is_some_and(|at| at.elapsed() < FILES_REFRESH) {
            return;
        }
        state.0 = Some(std::time::Instant::now());
        state.1.retain(|uid, _| observed.contains_key(uid));
        self.pod_tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(uid, _), _| observed.contains_key(uid));
        for (uid, pod) in bound {
            let Ok(plan) = &pod.plan else { continue };
            let has_files = plan.volumes.iter().any(|v| {
                matches!(
                    v.source,
                    pod::VolumeSource::Projected { .. } | pod::VolumeSource::Files { .. }
                )
            });
            let running = observed.get(uid).is_some_and(|p| {
                p.containers
                    .iter()
                    .any(|c| matches!(c.state, crate::runtime::ObservedState::Running(_)))
            });
            if !has_files || !running {
                continue;
            }
            let lookup = |kind: &str, name: &str| self.lookup(&plan.namespace, kind, name);
            let written = state.1.entry(uid.clone()).or_default();
            let token = |plan: &pod::PodPlan, file: &pod::TokenFile| self.pod_token(plan, file);
            start::refresh_files(self.runtime.as_ref(), plan, &lookup, &token, written);
        }
    }

    /// Deletes the object of a pod being deleted once it stopped here, unless finalizers
    /// still hold it (then it stays, stopped, until they are removed).
    fn delete_stopped(&self, handle: &tokio::runtime::Handle, object: &Value) {
        use shoal_core::controllers::garbage;
        if garbage::finish(object, 0, false) != garbage::Finish::Delete {
            return;
        }
        let meta = &object["metadata"];
        let key = shoal_state::ObjectKey::new(
            shoal_state::kind::lookup("v1", "Pod").expect("Pod is a known kind"),
            meta["namespace"].as_str().unwrap_or("default"),
            meta["name"].as_str().unwrap_or(""),
        );
        let uid = meta["uid"].as_str();
        match handle.block_on(self.replication.delete(&key, uid)) {
            Ok(_) => info!(pod = %key, "stopped and deleted"),
            Err(error) => warn!(pod = %key, %error, "stopped; deleting it again next round"),
        }
    }

    /// Node admission ([`admission`]): pods running here (or with a worker) keep their place;
    /// bound pods new to this node are admitted oldest first while they fit. A refused pod is
    /// not started and, unless a DaemonSet owns it (it belongs to this node), is handed back to
    /// the auction (its binding cleared, epoch + 1). Returns the refused pods.
    fn admit(
        &self,
        handle: &tokio::runtime::Handle,
        admission: &mut admission::Admission,
        bound: &HashMap<String, Arc<BoundPod>>,
        observed: &HashMap<String, ObservedPod>,
        workers: &HashMap<String, PodWorker>,
    ) -> HashMap<String, admission::Refusal> {
        use shoal_model::placement::Resources;
        let sandbox_requests = |uid: &str| {
            observed.get(uid).map(|pod| {
                let sandbox = &pod.sandbox;
                Resources::new(sandbox.cpu_request_millis, sandbox.memory_request_bytes, 1)
            })
        };
        let mut pods: Vec<admission::Candidate<'_>> = bound
            .iter()
            .map(|(uid, pod)| admission::Candidate {
                uid,
                bound: Some(admission::BoundHere {
                    created: pod.object["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or_default(),
                    requests: pod.plan.as_ref().ok().map(|plan| plan.requests),
                }),
                sandbox: sandbox_requests(uid),
                worker: workers.contains_key(uid),
                daemon: pod.object["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "DaemonSet")),
                auctioned: shoal_state::crdt::binding_epoch(&pod.object) > 0,
                placement: pod.placement.as_ref(),
            })
            .collect();
        pods.extend(
            observed
                .keys()
                .filter(|uid| !bound.contains_key(*uid))
                .map(|uid| admission::Candidate {
                    uid,
                    bound: None,
                    sandbox: sandbox_requests(uid),
                    worker: workers.contains_key(uid),
                    daemon: false,
                    auctioned: false,
                    placement: None,
                }),
        );
        let cordoned = self
            .replication
            .read(crate::node_settings::stored)
            .get(&self.node_name)
            .is_some_and(|s| s.unschedulable);
        let namespace_labels = |ns: &str| {
            self.lookup("", "Namespace", ns)
                .map(|o| shoal_model::placement::namespace_labels(&o))
        };
        let verdicts =
            admission.decide(self.config.allocatable, cordoned, &pods, &namespace_labels);
        let mut refused = HashMap::new();
        for (uid, verdict) in verdicts {
            let refusal = verdict.refusal;
            if verdict.report {
                warn!(pod = %uid, reason = refusal.reason, message = %refusal.message,
                      "pod refused at admission{}", if verdict.hand_back { "; auctioned again" } else { "" });
            }
            // Until the cleared binding is written (the scheduler may not know the pod yet).
            if verdict.hand_back && handle.block_on(self.scheduling.unbind(&uid, None)) {
                admission.handed_back(&uid);
            }
            refused.insert(uid, refusal);
        }
        refused
    }
}
