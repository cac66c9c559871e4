//! Carrying out the pod worker's actions through the container runtime: sandboxes, container
//! starts (through [`super::start`]), signals, probes and hooks on their own threads, removal.

use super::*;

impl Kubelet {
    fn sandbox_spec(&self, plan: &pod::PodPlan) -> SandboxSpec {
        SandboxSpec {
            uid: plan.uid.clone(),
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            hostname: plan.hostname.clone(),
            memory_limit_bytes: plan.memory_limit_bytes(),
            pids_limit: self.config.pod_pids_limit,
            host_network: plan.host_network,
            dns: shoal_net::dns::PodDns {
                policy: plan.dns.policy.clone(),
                nameservers: plan.dns.nameservers.clone(),
                searches: plan.dns.searches.clone(),
                options: plan.dns.options.clone(),
            },
            cpu_request_millis: plan.requests.cpu_millis,
            memory_request_bytes: plan.requests.memory_bytes,
        }
    }

    pub(super) fn act(
        &self,
        pod: &Acting<'_>,
        containers: &[crate::runtime::ObservedContainer],
        worker: &mut PodWorker,
        action: Action,
        probe_tx: &mpsc::Sender<ProbeResult>,
        hook_tx: &mpsc::Sender<HookDone>,
    ) -> Result<(), String> {
        let (uid, plan) = (pod.uid, pod.plan);
        let find = |name: &str, attempt: u32| {
            containers
                .iter()
                .find(|c| c.meta.name == name && c.meta.attempt == attempt)
                .map(|c| c.meta.clone())
        };
        match action {
            Action::EnsureSandbox => {
                let plan = plan.ok_or("no pod spec")?;
                self.runtime
                    .ensure_sandbox(&self.sandbox_spec(plan))
                    .map_err(|e| e.to_string())?;
            }
            Action::Start {
                name,
                attempt,
                init,
            } => {
                let plan = plan.ok_or("no pod spec")?;
                match self.start_container(plan, &name, attempt, init, pod.fence_deadline_ms) {
                    Ok(()) => {
                        let pulled = worker.start_succeeded(&name);
                        debug!(pod = %plan.name, container = %name, attempt, "container started");
                        let image = plan
                            .containers
                            .iter()
                            .chain(&plan.init_containers)
                            .find(|c| c.name == name)
                            .map_or("", |c| c.image.as_str());
                        let about = ObjectRef::pod(&plan.namespace, &plan.name, &plan.uid)
                            .container(&name, init);
                        let pulled = if pulled {
                            format!("Successfully pulled image {image:?}")
                        } else {
                            format!("Container image {image:?} already present on machine")
                        };
                        for (reason, message) in [
                            ("Pulled", pulled),
                            ("Created", format!("Created container: {name}")),
                            ("Started", format!("Started container {name}")),
                        ] {
                            self.events.record(NewEvent::new(
                                about.clone(),
                                EventType::Normal,
                                reason,
                                message,
                                events::KUBELET,
                            ));
                        }
                    }
                    Err(error) if error.reason == PULLING => {
                        worker.start_pending(&name, "Pulling", "ContainerCreating", &error.message);
                    }
                    Err(error) if error.reason == start::RUN_LEASE_ENDED => {
                        // Tried again once the node holds the lease again, with no back-off.
                        worker.start_pending(
                            &name,
                            start::RUN_LEASE_ENDED,
                            "ContainerCreating",
                            &error.message,
                        );
                    }
                    Err(error) => {
                        warn!(pod = %plan.name, container = %name, reason = error.reason, message = %error.message, "container not started");
                        worker.start_failed(&name, error.reason, &error.message, now_ms());
                    }
                }
            }
            Action::Signal {
                name,
                attempt,
                signal,
            } => {
                if let Some(meta) = find(&name, attempt) {
                    info!(pod = %uid, container = %name, attempt, ?signal, bound_here = plan.is_some(), "stopping container");
                    let signal = match signal {
                        StopSignal::Term => "TERM",
                        StopSignal::Kill => "KILL",
                    };
                    // The process may have just exited: not an error worth more than a debug line.
                    if let Err(error) = self.runtime.signal(&meta, signal) {
                        debug!(pod = %uid, container = %name, %error, "signal");
                    }
                }
            }
            Action::Probe {
                name,
                attempt,
                kind,
                probe,
            } => {
                let Some(meta) = find(&name, attempt) else {
                    return Ok(());
                };
                let runtime = self.runtime.clone();
                let netns =
                    (!plan.is_some_and(|p| p.host_network)).then(|| self.runtime.netns_path(uid));
                let tx = probe_tx.clone();
                let uid = uid.to_owned();
                // A fresh thread per probe: network probes move their thread into the pod's
                // network namespace, so it must not be reused.
                std::thread::Builder::new()
                    .name("probe".into())
                    .spawn(move || {
                        let (success, message) =
                            probe::run(&probe, netns.as_deref(), |command, timeout| {
                                runtime.exec_sync(&meta, command, timeout)
                            });
                        let _ = tx.send(ProbeResult {
                            uid,
                            name,
                            attempt,
                            kind,
                            probe,
                            success,
                            message,
                        });
                    })
                    .map_err(|e| e.to_string())?;
            }
            Action::PreStop {
                name,
                attempt,
                command,
            } => {
                let Some(meta) = find(&name, attempt) else {
                    return Ok(());
                };
                let grace = Duration::from_millis(
                    plan.map_or(30_000, |p| p.termination_grace_ms).max(1_000),
                );
                let runtime = self.runtime.clone();
                let tx = hook_tx.clone();
                let uid = uid.to_owned();
                std::thread::Builder::new()
                    .name("pre-stop".into())
                    .spawn(move || {
                        if let Err(error) = runtime.exec_sync(&meta, &command, grace) {
                            debug!(pod = %uid, container = %name, %error, "preStop hook failed");
                        }
                        let _ = tx.send((uid, name, attempt));
                    })
                    .map_err(|e| e.to_string())?;
            }
            Action::Remove { name, attempt } => {
                self.runtime
                    .remove_container(uid, &name, attempt)
                    .map_err(|e| e.to_string())?;
            }
            Action::RemoveSandbox => {
                self.runtime
                    .remove_sandbox(uid)
                    .map_err(|e| e.to_string())?;
                info!(pod = %uid, "pod sandbox removed");
            }
        }
        Ok(())
    }

    pub(super) fn lookup(&self, namespace: &str, kind_name: &str, name: &str) -> Option<Value> {
        let info = kind::lookup("v1", kind_name)?;
        self.replication
            .read(|s| s.get(&ObjectKey::new(info, namespace, name)))
    }

    fn start_container(
        &self,
        plan: &pod::PodPlan,
        name: &str,
        attempt: u32,
        init: bool,
        fence_deadline_ms: Option<u64>,
    ) -> Result<(), container::ConfigError> {
        let c = plan
            .containers
            .iter()
            .chain(&plan.init_containers)
            .find(|c| c.name == name)
            .expect("the worker starts containers of the plan");
        let image = self.images.resolve(&c.image).map_err(|error| match error {
            ImageError::NotFound { .. } => {
                let handle = self.handle.get().expect("set when the kubelet starts");
                match self.puller.pull(&c.image, handle) {
                    Some(image_puller::PullState::Pulling { from }) => container::ConfigError {
                        reason: PULLING,
                        message: format!("pulling image {:?} from {from}", c.image),
                    },
                    Some(image_puller::PullState::Failed { message }) => container::ConfigError {
                        reason: "ErrImagePull",
                        message: format!("pulling image {:?}: {message}", c.image),
                    },
                    None => container::ConfigError {
                        reason: "ErrImageNeverPull",
                        message: format!(
                            "{error} on node {}, nor on any live peer, and not pulled from \
                             a registry ({}/ images never are; see --registry-pulls)",
                            self.node_name,
                            crate::images::reference::LOCAL_DOMAIN
                        ),
                    },
                }
            }
            ImageError::Reference { .. } => container::ConfigError {
                reason: "InvalidImageName",
                message: error.to_string(),
            },
            other => container::ConfigError {
                reason: "CreateContainerError",
                message: other.to_string(),
            },
        })?;
        let lookup = |kind: &str, object: &str| self.lookup(&plan.namespace, kind, object);
        start::start(
            self.runtime.as_ref(),
            &start::Start {
                plan,
                container: c,
                attempt,
                init,
                image: &image,
                sandbox: self.sandbox_spec(plan),
                node_name: &self.node_name,
                host_ip: &self.host_ip,
                allow_privileged: self.config.allow_privileged,
                lookup: &lookup,
                fence_deadline_ms,
                monotonic_ms: &crate::runtime::lease::monotonic_ms,
            },
        )
    }
}
