//! Carrying out the pod worker's actions through the container runtime: sandboxes, container
//! starts (through [`super::start`]), signals, probes and hooks on their own threads, removal.

use super::*;

/// The longest a postStart hook may run (the kubelet waits on it without a bound; here a
/// hung hook counts as failed after this).
const POST_START_TIMEOUT: Duration = Duration::from_secs(300);

/// A lifecycle hook to run for container attempt `attempt`.
struct Hook {
    meta: shoal_core::pod::observed::ContainerMeta,
    attempt: u32,
    handler: pod::Handler,
    timeout: Duration,
    post_start: bool,
}

impl Kubelet {
    /// Runs a lifecycle hook on a fresh thread (an httpGet hook moves its thread into the
    /// pod's network namespace, so the thread is not reused) and reports it done on `hook_tx`:
    /// a postStart hook with its result (a failure kills the attempt), a preStop hook without
    /// (its failure only delays nothing: the container is stopped either way).
    fn spawn_hook(
        &self,
        uid: &str,
        plan: Option<&pod::PodPlan>,
        name: String,
        hook: Hook,
        hook_tx: &mpsc::Sender<HookDone>,
    ) -> Result<(), String> {
        let runtime = self.runtime.clone();
        let netns = (!plan.is_some_and(|p| p.host_network)).then(|| self.runtime.netns_path(uid));
        let tx = hook_tx.clone();
        let uid = uid.to_owned();
        let Hook {
            meta,
            attempt,
            handler,
            timeout,
            post_start,
        } = hook;
        std::thread::Builder::new()
            .name(if post_start { "post-start" } else { "pre-stop" }.into())
            .spawn(move || {
                let ran = probe::run_handler(&handler, netns.as_deref(), timeout, |c, t| {
                    runtime.exec_sync(&meta, c, t)
                });
                if let Err(error) = &ran {
                    let hook = if post_start { "postStart" } else { "preStop" };
                    info!(pod = %uid, container = %name, %error, hook, "lifecycle hook failed");
                }
                let _ = tx.send((uid, name, attempt, post_start.then_some(ran)));
            })
            .map_err(|e| e.to_string())?;
        Ok(())
    }

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
                    Ok(done) => {
                        worker.start_succeeded(&name);
                        debug!(pod = %plan.name, container = %name, attempt, "container started");
                        let image = plan
                            .containers
                            .iter()
                            .chain(&plan.init_containers)
                            .find(|c| c.name == name)
                            .map_or("", |c| c.image.as_str());
                        let about = ObjectRef::pod(&plan.namespace, &plan.name, &plan.uid)
                            .container(&name, init);
                        // As the kubelet writes them.
                        let pulled = match done {
                            Some(done) => format!(
                                "Successfully pulled image {image:?} from {} in {:.3}s. \
                                 Image size: {} bytes.",
                                done.from,
                                done.took.as_secs_f64(),
                                done.bytes
                            ),
                            None => {
                                format!("Container image {image:?} already present on machine")
                            }
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
                    Err(error) if error.reason == VOLUMES_PENDING => {
                        worker.start_pending(
                            &name,
                            "FailedMount",
                            "ContainerCreating",
                            &error.message,
                        );
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
                handler,
            } => {
                let Some(meta) = find(&name, attempt) else {
                    return Ok(());
                };
                let grace = Duration::from_millis(
                    plan.map_or(30_000, |p| p.termination_grace_ms).max(1_000),
                );
                let hook = Hook {
                    meta,
                    attempt,
                    handler,
                    timeout: grace,
                    post_start: false,
                };
                self.spawn_hook(uid, plan, name, hook, hook_tx)?;
            }
            Action::PostStart {
                name,
                attempt,
                handler,
            } => {
                let Some(meta) = find(&name, attempt) else {
                    return Ok(());
                };
                let hook = Hook {
                    meta,
                    attempt,
                    handler,
                    timeout: POST_START_TIMEOUT,
                    post_start: true,
                };
                self.spawn_hook(uid, plan, name, hook, hook_tx)?;
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
                // Its images may be unused now.
                self.image_gc.wake();
                info!(pod = %uid, "pod sandbox removed");
            }
        }
        Ok(())
    }

    /// The token `file` asks for `plan`'s pod: the one given before while it is fresh
    /// ([`crate::tokens::needs_refresh`]), else a new one from this node's signer, bound to the
    /// pod and its ServiceAccount as they are stored.
    pub(super) fn pod_token(
        &self,
        plan: &pod::PodPlan,
        file: &pod::TokenFile,
    ) -> Result<String, String> {
        let tokens = self
            .config
            .tokens
            .as_ref()
            .ok_or("this node issues no service-account tokens")?;
        let now = crate::api::unix_seconds();
        let key = (plan.uid.clone(), file.clone());
        let mut given = self
            .pod_tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((token, iat, exp)) = given.get(&key)
            && !crate::tokens::needs_refresh(*iat, *exp, now)
        {
            return Ok(token.clone());
        }
        let account = self
            .lookup(&plan.namespace, "ServiceAccount", &plan.service_account)
            .and_then(|a| a["metadata"]["uid"].as_str().map(str::to_owned))
            .ok_or_else(|| format!("serviceaccount {:?} not found", plan.service_account))?;
        let request = crate::tokens::Request {
            namespace: plan.namespace.clone(),
            account: crate::tokens::Ref {
                name: plan.service_account.clone(),
                uid: account,
            },
            audiences: file.audience.iter().cloned().collect(),
            seconds: file.seconds,
            pod: Some(crate::tokens::Ref {
                name: plan.name.clone(),
                uid: plan.uid.clone(),
            }),
            node: Some(crate::tokens::Ref {
                name: self.node_name.clone(),
                uid: String::new(),
            }),
        };
        let (token, claims) = tokens
            .signer
            .issue(&request, now)
            .map_err(|e| e.to_string())?;
        given.insert(key, (token.clone(), claims.iat, claims.exp));
        Ok(token)
    }

    /// The link variables of the Services `plan`'s containers see: its namespace's (with
    /// `enableServiceLinks`) and the `kubernetes` Service's, as the kubelet gives them.
    fn service_links(&self, plan: &pod::PodPlan) -> Vec<(String, String)> {
        let (ns, name) = crate::endpoints::API_SERVICE;
        let services = self.replication.read(|s| {
            let mut services = if plan.service_links {
                s.list("", "Service", Some(&plan.namespace))
            } else {
                Vec::new()
            };
            let has_api = services.iter().any(|v| v["metadata"]["name"] == name);
            if !has_api
                && let Some(api) = kind::lookup("v1", "Service")
                    .and_then(|info| s.get(&ObjectKey::new(info, ns, name)))
            {
                services.push(api);
            }
            services
        });
        pod::service_links(&services.iter().collect::<Vec<_>>())
    }

    pub(super) fn lookup(&self, namespace: &str, kind_name: &str, name: &str) -> Option<Value> {
        let info = kind::lookup("v1", kind_name)?;
        self.replication
            .read(|s| s.get(&ObjectKey::new(info, namespace, name)))
    }

    /// `plan` with each claim resolved to the volume this node mounts for it
    /// (`shoal_model::storage::claim_mount`); a claim not mountable yet (not bound, its volume
    /// not made) is a start that waits.
    fn resolve_claims(&self, plan: &pod::PodPlan) -> Result<pod::PodPlan, container::ConfigError> {
        use shoal_model::storage::{ClaimMount, claim_mount};
        let mut plan = plan.clone();
        for volume in &mut plan.volumes {
            let pod::VolumeSource::Claim { claim, read_only } = &volume.source else {
                continue;
            };
            let stored = self.lookup(&plan.namespace, "PersistentVolumeClaim", claim);
            let bound = stored
                .as_ref()
                .and_then(|c| c["spec"]["volumeName"].as_str())
                .filter(|v| !v.is_empty())
                .and_then(|v| self.lookup("", "PersistentVolume", v));
            volume.source =
                match claim_mount(claim, stored.as_ref(), bound.as_ref(), &self.node_name) {
                    ClaimMount::Provisioned(name) => pod::VolumeSource::Persistent {
                        volume: name,
                        read_only: *read_only,
                    },
                    ClaimMount::HostPath(path) => pod::VolumeSource::HostPath {
                        path,
                        kind: pod::HostPathType::Unchecked,
                        read_only: *read_only,
                    },
                    ClaimMount::Pending(why) => {
                        return Err(container::ConfigError {
                            reason: VOLUMES_PENDING,
                            message: format!(
                                "Unable to attach or mount volumes: unmounted volumes=[{}]: {why}",
                                volume.name
                            ),
                        });
                    }
                };
        }
        Ok(plan)
    }

    fn start_container(
        &self,
        plan: &pod::PodPlan,
        name: &str,
        attempt: u32,
        init: bool,
        fence_deadline_ms: Option<u64>,
    ) -> Result<Option<image_puller::Done>, container::ConfigError> {
        let c = plan
            .containers
            .iter()
            .chain(&plan.init_containers)
            .find(|c| c.name == name)
            .expect("the worker starts containers of the plan");
        let resolved;
        let plan = if plan
            .volumes
            .iter()
            .any(|v| matches!(v.source, pod::VolumeSource::Claim { .. }))
        {
            resolved = self.resolve_claims(plan)?;
            &resolved
        } else {
            plan
        };
        let done = self.ensure_image(plan, c)?;
        let image = self.images.resolve(&c.image).map_err(|error| match error {
            ImageError::NotFound { .. } if c.image_pull_policy == pod::PullPolicy::Never => {
                container::ConfigError {
                    reason: "ErrImageNeverPull",
                    message: format!(
                        "Container image {:?} is not present with pull policy of Never",
                        c.image
                    ),
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
        let token = |plan: &pod::PodPlan, file: &pod::TokenFile| self.pod_token(plan, file);
        let service_links = self.service_links(plan);
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
                token: &token,
                service_links: &service_links,
                fence_deadline_ms,
                monotonic_ms: &crate::runtime::lease::monotonic_ms,
            },
        )?;
        self.image_gc.used(&image.digest, now_ms());
        Ok(done)
    }

    /// Brings the image of `c` into the store as its `imagePullPolicy` asks: Never, nothing;
    /// IfNotPresent, a pull when the node lacks it; Always, a pull from its registry at every
    /// start (as IfNotPresent where this node pulls from no registry for it: `shoal.local/`
    /// images, `--registry-pulls`). `Some`: the pull that just brought it.
    fn ensure_image(
        &self,
        plan: &pod::PodPlan,
        c: &pod::ContainerPlan,
    ) -> Result<Option<image_puller::Done>, container::ConfigError> {
        let refresh = c.image_pull_policy == pod::PullPolicy::Always
            && self.puller.registry_of(&c.image).is_some();
        let secrets_key = format!("{}/{}", plan.namespace, plan.image_pull_secrets.join(","));
        let present = self.images.contains(&c.image);
        if c.image_pull_policy == pod::PullPolicy::Never || (present && !refresh) {
            return Ok(present
                .then(|| self.puller.take_done(&c.image, &secrets_key))
                .flatten());
        }
        let secrets = self.pull_secrets(&plan.namespace, &plan.image_pull_secrets, &plan.name);
        let request = image_puller::PullRequest {
            image: &c.image,
            refresh,
            secrets: &secrets,
            namespace: &plan.namespace,
            secret_names: &plan.image_pull_secrets,
            secrets_key: &secrets_key,
        };
        let handle = self.handle.get().expect("set when the kubelet starts");
        match self.puller.pull(&request, handle) {
            Some(image_puller::PullState::Done(done)) => Ok(Some(done)),
            Some(image_puller::PullState::Pulling { from, progress }) => {
                // The worker records `message` once as the `Pulling` event; its text is
                // revised here with the bytes in so far (the kubelet's ticks while it waits).
                let message = format!("Pulling image {:?} from {from}", c.image);
                let init = plan.init_containers.iter().any(|i| i.name == c.name);
                let event = NewEvent::new(
                    ObjectRef::pod(&plan.namespace, &plan.name, &plan.uid).container(&c.name, init),
                    EventType::Normal,
                    PULLING,
                    message.clone(),
                    events::KUBELET,
                );
                let so_far = crate::images::progress::summary(&progress.snapshot());
                self.events.revise(event, format!("{message}: {so_far}"));
                Err(container::ConfigError {
                    reason: PULLING,
                    message,
                })
            }
            Some(image_puller::PullState::Failed { message }) => Err(container::ConfigError {
                reason: shoal_core::pod::worker::ERR_IMAGE_PULL,
                message: format!("Failed to pull image {:?}: {message}", c.image),
            }),
            None => Err(container::ConfigError {
                reason: "ErrImageNeverPull",
                message: format!(
                    "image {:?} is not on node {}, nor on any live peer, and not pulled from \
                     a registry ({}/ images never are; see --registry-pulls)",
                    c.image,
                    self.node_name,
                    crate::images::reference::LOCAL_DOMAIN
                ),
            }),
        }
    }

    /// The registry credentials of the pull secrets `names` (Secrets of type
    /// `kubernetes.io/dockerconfigjson` or `kubernetes.io/dockercfg` in `namespace`, a pod's
    /// `imagePullSecrets`); one missing or unreadable is skipped with a warning naming `pod`,
    /// as the kubelet does.
    pub(super) fn pull_secrets(
        &self,
        namespace: &str,
        names: &[String],
        pod: &str,
    ) -> Vec<crate::images::auth::Entry> {
        use crate::images::auth::{ConfigFormat, parse_docker_config};
        use base64::Engine as _;
        let mut entries = Vec::new();
        for name in names {
            let Some(secret) = self.lookup(namespace, "Secret", name) else {
                warn!(%pod, secret = %name, "image pull secret not found");
                continue;
            };
            let (field, format) = match secret["type"].as_str() {
                Some("kubernetes.io/dockerconfigjson") => (".dockerconfigjson", ConfigFormat::Json),
                Some("kubernetes.io/dockercfg") => (".dockercfg", ConfigFormat::Cfg),
                other => {
                    warn!(%pod, secret = %name, kind = ?other, "an image pull secret must be of type kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg");
                    continue;
                }
            };
            let parsed = secret["data"][field]
                .as_str()
                .ok_or_else(|| format!("no data[{field:?}]"))
                .and_then(|data| {
                    base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .map_err(|e| format!("data[{field:?}]: {e}"))
                })
                .and_then(|bytes| parse_docker_config(&bytes, format).map_err(|e| e.to_string()));
            match parsed {
                Ok(found) => entries.extend(found),
                Err(error) => {
                    warn!(%pod, secret = %name, %error, "image pull secret not read");
                }
            }
        }
        entries
    }
}
