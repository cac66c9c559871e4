//! Pod sandboxes: a pod's directory, cgroup, network namespace and address, and its `/etc`
//! files; made once per pod and removed with everything in them.

use super::*;

impl Runtime {
    /// The pod's generated `/etc` files.
    pub fn etc_dir(&self, uid: &str) -> PathBuf {
        self.pod_dir(uid).join("etc")
    }

    /// The network namespace name of a pod.
    pub fn netns_name(&self, uid: &str) -> String {
        format!("shoal-{}-{uid}", self.scope)
    }

    /// The network a pod's sandbox was given.
    pub fn pod_network(&self, uid: &str) -> Option<shoal_net::PodNetwork> {
        if !is_safe_id(uid) {
            return None;
        }
        read_json::<Option<shoal_net::PodNetwork>>(&self.pod_dir(uid).join("network.json"))
            .flatten()
    }

    /// Path of the pod's network namespace.
    pub fn netns_path(&self, uid: &str) -> PathBuf {
        Path::new("/run/netns").join(self.netns_name(uid))
    }

    /// The pod's cgroup (below each hierarchy's root); its containers' cgroups are children.
    pub fn pod_cgroup(&self, uid: &str) -> String {
        cgroup::pod_path(&self.scope, uid)
    }

    /// Creates the pod sandbox if missing: directories, network namespace (loopback up) with
    /// the pod's interface and address from the network plugin (recorded in `network.json`),
    /// /etc files, the pod cgroup with its memory cap. Idempotent.
    pub fn ensure_sandbox(&self, sandbox: &SandboxSpec) -> Result<(), RuntimeError> {
        check_id("pod uid", &sandbox.uid)?;
        let dir = self.pod_dir(&sandbox.uid);
        let record = dir.join("sandbox.json");
        let network_record = dir.join("network.json");
        if record.exists()
            && (sandbox.host_network
                || (self.netns_path(&sandbox.uid).exists() && network_record.exists()))
        {
            return Ok(());
        }
        for sub in ["containers", "logs", "volumes", "etc"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io_at(&dir))?;
        }
        // Written first, so a crash from here on still leaves a record that cleanup finds.
        shim::write_state(&dir, "sandbox.json", sandbox).map_err(io_at(&record))?;
        let network = if sandbox.host_network {
            None
        } else {
            let netns = shoal_net::netns::create(&self.netns_name(&sandbox.uid))?;
            let network = self.network.setup(&shoal_net::PodRef {
                uid: sandbox.uid.clone(),
                netns,
            })?;
            shim::write_state(&dir, "network.json", &network).map_err(io_at(&network_record))?;
            network
        };
        let etc = self.etc_dir(&sandbox.uid);
        let write = |name: &str, text: String| {
            std::fs::write(etc.join(name), text).map_err(io_at(&etc.join(name)))
        };
        // Like the kubelet's: localhost, then the pod's own address under its hostname.
        let own = match network {
            Some(network) => format!("{}\t{}\n", network.ip, sandbox.hostname),
            None => format!("127.0.1.1\t{}\n", sandbox.hostname),
        };
        write(
            "hosts",
            format!(
                "# Kubernetes-managed hosts file (written by shoal).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}"
            ),
        )?;
        write("hostname", format!("{}\n", sandbox.hostname))?;
        // The node's DNS server listens on the bridge: the pod's gateway (the node's own
        // gateway for a pod in the node's network namespace).
        write(
            "resolv.conf",
            shoal_net::dns::resolv_conf(
                &sandbox.dns,
                &sandbox.namespace,
                &self.cluster_domain,
                network
                    .map(|n| n.gateway)
                    .or_else(|| self.network.node_dns()),
                sandbox.host_network,
                &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
            ),
        )?;
        if let Some(bytes) = sandbox.memory_limit_bytes {
            cgroup::set_pod_memory_limit(self.layout, &self.pod_cgroup(&sandbox.uid), bytes)
                .map_err(io_at(Path::new("/sys/fs/cgroup")))?;
        }
        if let Some(pids) = sandbox.pids_limit {
            cgroup::set_pod_pids_limit(self.layout, &self.pod_cgroup(&sandbox.uid), pids)
                .map_err(io_at(Path::new("/sys/fs/cgroup")))?;
        }
        Ok(())
    }

    /// Removes a pod sandbox and everything in it (containers must have exited or are
    /// killed): network namespace, cgroups, volumes, logs.
    pub fn remove_sandbox(&self, pod_uid: &str) -> Result<(), RuntimeError> {
        check_id("pod uid", pod_uid)?;
        let dir = self.pod_dir(pod_uid);
        let containers = dir.join("containers");
        let mut first_error = None;
        if let Ok(entries) = std::fs::read_dir(&containers) {
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some((name, attempt)) = name.rsplit_once('.')
                    && let Ok(attempt) = attempt.parse()
                    && let Err(err) = self.remove_container(pod_uid, name, attempt)
                {
                    first_error.get_or_insert(err);
                }
            }
        }
        // Even with records lost: every process of the pod's cgroup, every mount below its
        // directory.
        cgroup::kill_all(
            self.layout,
            &self.pod_cgroup(pod_uid),
            Duration::from_secs(2),
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", dir.display());
        let mut below: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        below.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in below {
            if let Err(err) = unmount(Path::new(mount)) {
                first_error.get_or_insert(err);
            }
        }
        if let Some(err) = first_error {
            tracing::warn!(pod = %pod_uid, error = %err, "removing the pod's containers; cleaning up by cgroup and mounts");
        }
        if let Err(err) = self.network.teardown(&shoal_net::PodRef {
            uid: pod_uid.to_owned(),
            netns: self.netns_path(pod_uid),
        }) {
            tracing::warn!(pod = %pod_uid, error = %err, "removing the pod's network");
        }
        shoal_net::netns::delete(&self.netns_name(pod_uid))?;
        cgroup::remove(self.layout, &self.pod_cgroup(pod_uid))
            .map_err(io_at(Path::new(&self.pod_cgroup(pod_uid))))?;
        // This runtime's and the node-wide parents, once they hold no other pod.
        let _ = cgroup::remove_if_empty(self.layout, &format!("/shoal/{}", self.scope));
        let _ = cgroup::remove_if_empty(self.layout, "/shoal");
        match std::fs::remove_dir_all(&dir) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_at(&dir)(err)),
            _ => Ok(()),
        }
    }
}
