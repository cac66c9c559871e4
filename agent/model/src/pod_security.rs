//! Pod Security admission (issue #40): the Pod Security Standards' `baseline` and
//! `restricted` checks, as upstream's PodSecurity admission plugin makes them, with its
//! messages, and the namespace labels that choose a level per mode
//! (`pod-security.kubernetes.io/enforce|audit|warn`, with `-version`). Pure: the API applies
//! the result (a 403 for `enforce`, a `Warning` header for `warn`).
//!
//! Versions: every version is checked as `latest` (the checks of the current release); the
//! label's version is kept in the messages as upstream prints it.

use serde_json::Value;

/// A Pod Security Standards level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "privileged" => Some(Self::Privileged),
            "baseline" => Some(Self::Baseline),
            "restricted" => Some(Self::Restricted),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

/// What a namespace's labels ask of one mode: a level and the version it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub level: Level,
    pub version: String,
}

/// The label prefix.
pub const LABEL: &str = "pod-security.kubernetes.io/";

/// The policy `mode` (`enforce`, `audit`, `warn`) of a namespace labelled `labels`, or
/// `default` when it names none. An unknown level is the strictest (upstream's: a bad label
/// does not open the namespace).
pub fn policy(labels: &Value, mode: &str, default: Level) -> Policy {
    let level = match labels[format!("{LABEL}{mode}")].as_str() {
        None => default,
        Some(l) => Level::parse(l).unwrap_or(Level::Restricted),
    };
    let version = labels[format!("{LABEL}{mode}-version")]
        .as_str()
        .filter(|v| *v == "latest" || v.starts_with('v'))
        .unwrap_or("latest")
        .to_owned();
    Policy { level, version }
}

/// The capabilities `baseline` lets a container add (the container runtime's default set).
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The sysctls `baseline` allows.
const SAFE_SYSCTLS: [&str; 9] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
];

/// The volume types `restricted` allows.
const RESTRICTED_VOLUMES: [&str; 9] = [
    "name",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// `container "a"` or `containers "a", "b"`.
fn containers(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    if names.len() == 1 {
        format!("container {}", quoted[0])
    } else {
        format!("containers {}", quoted.join(", "))
    }
}

/// Every container of the pod spec (init, regular, ephemeral).
fn all_containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|f| spec[f].as_array().into_iter().flatten())
}

/// The names of the containers for which `bad` holds.
fn named(spec: &Value, bad: impl Fn(&Value) -> bool) -> Vec<String> {
    all_containers(spec)
        .filter(|c| bad(c))
        .map(|c| text(&c["name"]).to_owned())
        .collect()
}

/// The checks `spec` (a pod spec; `metadata` its pod's) fails at `level`, each as upstream
/// words it (`host namespaces (hostNetwork=true)`), in upstream's order.
pub fn violations(metadata: &Value, spec: &Value, level: Level) -> Vec<String> {
    let mut out: Vec<(&str, String)> = Vec::new();
    if level == Level::Privileged {
        return Vec::new();
    }
    let _ = metadata;
    // Baseline.
    let hosts: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|f| spec[**f] == true)
        .map(|f| format!("{f}=true"))
        .collect();
    if !hosts.is_empty() {
        out.push((
            "hostNamespaces",
            format!("host namespaces ({})", hosts.join(", ")),
        ));
    }
    let privileged = named(spec, |c| c["securityContext"]["privileged"] == true);
    if !privileged.is_empty() {
        out.push((
            "privileged",
            format!(
                "privileged ({} must not set securityContext.privileged=true)",
                containers(&privileged)
            ),
        ));
    }
    let mut added: Vec<String> = Vec::new();
    for c in all_containers(spec) {
        for cap in c["securityContext"]["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
        {
            let allowed = if level == Level::Restricted {
                cap == "NET_BIND_SERVICE"
            } else {
                BASELINE_CAPABILITIES.contains(&cap)
            };
            if !allowed {
                added.push(format!(
                    "container {:?} must not include {cap:?} in securityContext.capabilities.add",
                    text(&c["name"])
                ));
            }
        }
    }
    if level == Level::Baseline && !added.is_empty() {
        out.push((
            "capabilities_baseline",
            format!("non-default capabilities ({})", added.join("; ")),
        ));
    }
    let host_paths: Vec<String> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| format!("{:?}", text(&v["name"])))
        .collect();
    if !host_paths.is_empty() {
        let noun = if host_paths.len() == 1 {
            "volume"
        } else {
            "volumes"
        };
        out.push((
            "hostPathVolumes",
            format!("hostPath volumes ({noun} {})", host_paths.join(", ")),
        ));
    }
    let mut ports: Vec<String> = Vec::new();
    let mut port_containers: Vec<String> = Vec::new();
    for c in all_containers(spec) {
        let used: Vec<String> = c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["hostPort"].as_u64().filter(|p| *p != 0))
            .map(|p| p.to_string())
            .collect();
        if !used.is_empty() {
            port_containers.push(text(&c["name"]).to_owned());
            ports.extend(used);
        }
    }
    if !ports.is_empty() {
        out.push((
            "hostPorts",
            format!(
                "hostPort ({} {} {})",
                containers(&port_containers),
                if port_containers.len() == 1 {
                    "uses"
                } else {
                    "use"
                },
                if ports.len() == 1 {
                    format!("hostPort {}", ports[0])
                } else {
                    format!("hostPorts {}", ports.join(", "))
                }
            ),
        ));
    }
    let pod_context = &spec["securityContext"];
    let unconfined_app_armor = |ctx: &Value| ctx["appArmorProfile"]["type"] == "Unconfined";
    if unconfined_app_armor(pod_context)
        || all_containers(spec).any(|c| unconfined_app_armor(&c["securityContext"]))
    {
        out.push((
            "appArmorProfile",
            "forbidden AppArmor profile (appArmorProfile.type \"Unconfined\")".to_owned(),
        ));
    }
    let bad_selinux = |ctx: &Value| {
        let o = &ctx["seLinuxOptions"];
        let kind = text(&o["type"]);
        !(kind.is_empty()
            || matches!(
                kind,
                "container_t" | "container_init_t" | "container_kvm_t" | "container_engine_t"
            ))
            || !text(&o["user"]).is_empty()
            || !text(&o["role"]).is_empty()
    };
    if bad_selinux(pod_context) || all_containers(spec).any(|c| bad_selinux(&c["securityContext"]))
    {
        out.push(("seLinuxOptions", "seLinuxOptions (pod or containers must not set seLinuxOptions.user, seLinuxOptions.role, or a type other than container_t, container_init_t, container_kvm_t, container_engine_t)".to_owned()));
    }
    let proc_mount = named(spec, |c| {
        !matches!(text(&c["securityContext"]["procMount"]), "" | "Default")
    });
    if !proc_mount.is_empty() {
        out.push((
            "procMount",
            format!(
                "procMount ({} must not set securityContext.procMount to \"Unmasked\")",
                containers(&proc_mount)
            ),
        ));
    }
    let unconfined = |ctx: &Value| ctx["seccompProfile"]["type"] == "Unconfined";
    if level == Level::Baseline {
        let mut said = Vec::new();
        if unconfined(pod_context) {
            said.push(
                "pod must not set securityContext.seccompProfile.type to \"Unconfined\"".to_owned(),
            );
        }
        let bad = named(spec, |c| unconfined(&c["securityContext"]));
        if !bad.is_empty() {
            said.push(format!(
                "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
                containers(&bad)
            ));
        }
        if !said.is_empty() {
            out.push((
                "seccompProfile_baseline",
                format!("seccompProfile ({})", said.join("; ")),
            ));
        }
    }
    let sysctls: Vec<&str> = pod_context["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| text(&s["name"]))
        .filter(|n| !SAFE_SYSCTLS.contains(n))
        .collect();
    if !sysctls.is_empty() {
        out.push((
            "sysctls",
            format!("forbidden sysctls ({})", sysctls.join(", ")),
        ));
    }
    if level == Level::Baseline {
        return in_order(out, &[]);
    }
    // Restricted.
    let restricted: Vec<String> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let kind = v
                .as_object()?
                .keys()
                .find(|k| !RESTRICTED_VOLUMES.contains(&k.as_str()))?;
            Some(format!(
                "volume {:?} uses restricted volume type {kind:?}",
                text(&v["name"])
            ))
        })
        .collect();
    if !restricted.is_empty() {
        out.push((
            "restrictedVolumes",
            format!("restricted volume types ({})", restricted.join(", ")),
        ));
    }
    let escalating = named(spec, |c| {
        c["securityContext"]["allowPrivilegeEscalation"] != false
    });
    if !escalating.is_empty() {
        out.push(("allowPrivilegeEscalation", format!(
            "allowPrivilegeEscalation != false ({} must set securityContext.allowPrivilegeEscalation=false)",
            containers(&escalating)
        )));
    }
    let pod_non_root = pod_context["runAsNonRoot"] == true;
    let root_containers = named(spec, |c| {
        let own = &c["securityContext"]["runAsNonRoot"];
        !(own == true || (pod_non_root && own.is_null()))
    });
    if !root_containers.is_empty() {
        let who = if pod_non_root || root_containers.len() < all_containers(spec).count() {
            containers(&root_containers)
        } else {
            format!("pod or {}", containers(&root_containers))
        };
        out.push((
            "runAsNonRoot",
            format!("runAsNonRoot != true ({who} must set securityContext.runAsNonRoot=true)"),
        ));
    }
    let mut root_users = Vec::new();
    if pod_context["runAsUser"] == 0 {
        root_users.push("pod must not set runAsUser=0".to_owned());
    }
    let zero = named(spec, |c| c["securityContext"]["runAsUser"] == 0);
    if !zero.is_empty() {
        root_users.push(format!("{} must not set runAsUser=0", containers(&zero)));
    }
    if !root_users.is_empty() {
        out.push((
            "runAsUser",
            format!("runAsUser=0 ({})", root_users.join("; ")),
        ));
    }
    let confined = |ctx: &Value| {
        matches!(
            text(&ctx["seccompProfile"]["type"]),
            "RuntimeDefault" | "Localhost"
        )
    };
    let pod_confined = confined(pod_context);
    let unset = named(spec, |c| {
        let own = &c["securityContext"]["seccompProfile"]["type"];
        if own.is_null() {
            !pod_confined
        } else {
            !confined(&c["securityContext"])
        }
    });
    if !unset.is_empty() {
        let who = if pod_confined || unset.len() < all_containers(spec).count() {
            containers(&unset)
        } else {
            format!("pod or {}", containers(&unset))
        };
        out.push(("seccompProfile_restricted", format!(
            "seccompProfile ({who} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        )));
    }
    let no_drop = named(spec, |c| {
        !c["securityContext"]["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "ALL"))
    });
    let mut unrestricted = Vec::new();
    if !no_drop.is_empty() {
        unrestricted.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers(&no_drop)
        ));
    }
    unrestricted.extend(added);
    if !unrestricted.is_empty() {
        out.push((
            "capabilities_restricted",
            format!("unrestricted capabilities ({})", unrestricted.join("; ")),
        ));
    }
    // Restricted's checks replace these baseline ones.
    in_order(
        out,
        &[
            "capabilities_baseline",
            "hostPathVolumes",
            "seccompProfile_baseline",
        ],
    )
}

/// The findings in upstream's order (by check id), without those `overridden`.
fn in_order(mut found: Vec<(&str, String)>, overridden: &[&str]) -> Vec<String> {
    found.retain(|(id, _)| !overridden.contains(id));
    found.sort_by(|a, b| a.0.cmp(b.0));
    found.into_iter().map(|(_, m)| m).collect()
}

/// What `pod` fails of `policy`, as upstream words it after `violates` (a refusal) or
/// `would violate` (a warning): `PodSecurity "restricted:latest": …`; `None` when it meets
/// the policy.
pub fn check(pod: &Value, policy: &Policy) -> Option<String> {
    let found = violations(&pod["metadata"], &pod["spec"], policy.level);
    (!found.is_empty()).then(|| {
        format!(
            "PodSecurity \"{}:{}\": {}",
            policy.level.name(),
            policy.version,
            found.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn latest(level: Level) -> Policy {
        Policy {
            level,
            version: "latest".into(),
        }
    }

    #[test]
    fn a_plain_pod_meets_baseline_and_restricted_names_what_it_lacks_in_upstreams_words() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        assert_eq!(check(&pod, &latest(Level::Privileged)), None);
        assert_eq!(check(&pod, &latest(Level::Baseline)), None);
        assert_eq!(
            check(&pod, &latest(Level::Restricted)).unwrap(),
            // Upstream's message for this pod, word for word.
            "PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        // What restricted asks, given: nothing left.
        let hardened = json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "busybox", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "t", "projected": {"sources": []}}]}});
        assert_eq!(check(&hardened, &latest(Level::Restricted)), None);
    }

    #[test]
    fn baseline_refuses_the_host_and_privilege() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {
            "hostNetwork": true, "hostPID": true,
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                "seccompProfile": {"type": "Unconfined"}},
            "containers": [
                {"name": "a", "securityContext": {"privileged": true,
                    "capabilities": {"add": ["NET_ADMIN", "CHOWN"]}},
                 "ports": [{"containerPort": 80, "hostPort": 8080}]},
                {"name": "b", "securityContext": {"procMount": "Unmasked"}}],
            "volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]}});
        let found = violations(&pod["metadata"], &pod["spec"], Level::Baseline);
        assert_eq!(
            found,
            [
                "non-default capabilities (container \"a\" must not include \"NET_ADMIN\" in securityContext.capabilities.add)",
                "host namespaces (hostNetwork=true, hostPID=true)",
                "hostPath volumes (volume \"h\")",
                "hostPort (container \"a\" uses hostPort 8080)",
                "privileged (container \"a\" must not set securityContext.privileged=true)",
                "procMount (container \"b\" must not set securityContext.procMount to \"Unmasked\")",
                "seccompProfile (pod must not set securityContext.seccompProfile.type to \"Unconfined\")",
                "forbidden sysctls (kernel.msgmax)",
            ]
        );
        // Restricted names the hostPath as a restricted volume type instead.
        let restricted = violations(&pod["metadata"], &pod["spec"], Level::Restricted);
        assert!(
            restricted.contains(
                &"restricted volume types (volume \"h\" uses restricted volume type \"hostPath\")"
                    .to_owned()
            ),
            "{restricted:?}"
        );
        assert!(
            !restricted.iter().any(|m| m.starts_with("hostPath volumes")),
            "{restricted:?}"
        );
    }

    #[test]
    fn namespace_labels_choose_the_level_and_a_bad_one_is_the_strictest() {
        let labels = json!({"pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/enforce-version": "v1.30",
            "pod-security.kubernetes.io/warn": "nonsense"});
        assert_eq!(
            policy(&labels, "enforce", Level::Privileged),
            Policy {
                level: Level::Baseline,
                version: "v1.30".into()
            }
        );
        assert_eq!(
            policy(&labels, "warn", Level::Privileged).level,
            Level::Restricted
        );
        assert_eq!(
            policy(&labels, "audit", Level::Privileged),
            latest(Level::Privileged)
        );
    }
}
