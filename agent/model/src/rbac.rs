//! Who may do what (issue #40): Kubernetes' RBAC authorizer, pure. A request's attributes
//! ([`Attributes`], read from its method, path and query as the apiserver's request-info
//! resolver reads them) are checked against the stored Roles, ClusterRoles, RoleBindings and
//! ClusterRoleBindings ([`Policy`]) for a user ([`User`]): allowed when some binding that
//! names the user, one of its groups or its service account grants a rule that covers the
//! request. The group `system:masters` is allowed everything, as upstream's privileged group.
//! ClusterRoles with an `aggregationRule` hold the rules of the ClusterRoles their selectors
//! match. The default roles and bindings a cluster starts with are [`bootstrap`].

use serde_json::{Value, json};

/// The group every request authenticated as a cluster administrator belongs to.
pub const MASTERS: &str = "system:masters";
/// The group every authenticated user belongs to.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of requests with no credentials.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
/// The API group of the RBAC kinds.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        Self {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// A service account's (namespace, name), if the user is one (`system:serviceaccount:NS:NAME`).
    pub fn service_account(&self) -> Option<(&str, &str)> {
        self.name
            .strip_prefix("system:serviceaccount:")?
            .split_once(':')
    }
}

/// What a request asks, as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Attributes {
    pub verb: String,
    /// A request for a resource (else for a path: `nonResourceURLs`).
    pub resource_request: bool,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The URL path (what a non-resource rule matches).
    pub path: String,
}

/// The attributes of a request (`method`, `path`, whether the query asks to `watch`), as the
/// apiserver's request-info resolver reads them: `/api/v1/...` and `/apis/GROUP/VERSION/...`
/// are resource requests (`namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]` or
/// `RESOURCE[/NAME[/SUBRESOURCE]]`, `watch/` in front for a legacy watch); anything else is a
/// path.
pub fn attributes(method: &str, path: &str, watch: bool) -> Attributes {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let non_resource = || Attributes {
        verb: method.to_ascii_lowercase(),
        path: path.to_owned(),
        ..Default::default()
    };
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
        _ => return non_resource(),
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    // As upstream's resolver: `namespaces/NS/...` names the namespace; what follows is a
    // resource of it, unless it is one of the Namespace's own subresources (`status`,
    // `finalize`), when the request is about the Namespace itself (as is `namespaces/NS`).
    let (namespace, rest) = match rest {
        ["namespaces", ns, next, more @ ..] if !matches!(*next, "status" | "finalize") => (
            *ns,
            std::iter::once(*next)
                .chain(more.iter().copied())
                .collect::<Vec<_>>(),
        ),
        ["namespaces", ns, ..] => (*ns, rest.to_vec()),
        _ => ("", rest.to_vec()),
    };
    let (resource, name, subresource) = match rest.as_slice() {
        [resource] => (*resource, "", ""),
        [resource, name] => (*resource, *name, ""),
        [resource, name, sub, ..] => (*resource, *name, *sub),
        _ => return non_resource(),
    };
    let verb = match method {
        "GET" | "HEAD" if legacy_watch || (watch && name.is_empty()) => "watch",
        "GET" | "HEAD" if watch => "watch",
        "GET" | "HEAD" if name.is_empty() => "list",
        "GET" | "HEAD" => "get",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if name.is_empty() => "deletecollection",
        "DELETE" => "delete",
        other => {
            return Attributes {
                verb: other.to_ascii_lowercase(),
                ..non_resource()
            };
        }
    };
    Attributes {
        verb: verb.to_owned(),
        resource_request: true,
        api_group: group.to_owned(),
        resource: resource.to_owned(),
        subresource: subresource.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        path: path.to_owned(),
    }
}

/// The stored RBAC objects an authorization reads.
#[derive(Debug, Default, Clone)]
pub struct Policy {
    pub roles: Vec<Value>,
    pub cluster_roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// Whether `rule` (a PolicyRule) covers `a`.
pub fn covers(rule: &Value, a: &Attributes) -> bool {
    let any = |field: &str, want: &str| strings(&rule[field]).any(|v| v == "*" || v == want);
    if !any("verbs", &a.verb) {
        return false;
    }
    if !a.resource_request {
        return strings(&rule["nonResourceURLs"]).any(|u| {
            u == "*"
                || u == a.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| a.path.starts_with(prefix))
        });
    }
    if !any("apiGroups", &a.api_group) {
        return false;
    }
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resource = strings(&rule["resources"]).any(|r| {
        r == "*"
            || r == combined
            || (!a.subresource.is_empty() && r == format!("*/{}", a.subresource))
    });
    if !resource {
        return false;
    }
    let names: Vec<&str> = strings(&rule["resourceNames"]).collect();
    names.is_empty() || names.contains(&a.name.as_str())
}

/// Whether a binding's subjects name `user`.
fn names(binding: &Value, user: &User) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| match text(&s["kind"]) {
            "User" => text(&s["name"]) == user.name,
            "Group" => user.groups.iter().any(|g| g == text(&s["name"])),
            "ServiceAccount" => user.service_account().is_some_and(|(ns, name)| {
                let subject_ns = match text(&s["namespace"]) {
                    "" => text(&binding["metadata"]["namespace"]),
                    ns => ns,
                };
                subject_ns == ns && text(&s["name"]) == name
            }),
            _ => false,
        })
}

impl Policy {
    fn cluster_role(&self, name: &str) -> Option<&Value> {
        self.cluster_roles
            .iter()
            .find(|r| text(&r["metadata"]["name"]) == name)
    }

    /// The rules of ClusterRole `role`: its own, and with an `aggregationRule`, those of every
    /// ClusterRole one of its selectors matches, theirs aggregated too (as upstream's
    /// controller fills them in; each role counted once, so a cycle ends).
    pub fn cluster_role_rules<'a>(&'a self, role: &'a Value) -> Vec<&'a Value> {
        let mut rules = Vec::new();
        let mut seen: Vec<*const Value> = Vec::new();
        let mut stack = vec![role];
        while let Some(r) = stack.pop() {
            if seen.contains(&(r as *const Value)) {
                continue;
            }
            seen.push(r as *const Value);
            rules.extend(r["rules"].as_array().into_iter().flatten());
            let selectors: Vec<&Value> = r["aggregationRule"]["clusterRoleSelectors"]
                .as_array()
                .into_iter()
                .flatten()
                .collect();
            if selectors.is_empty() {
                continue;
            }
            for other in &self.cluster_roles {
                if selectors
                    .iter()
                    .any(|s| crate::placement::selector_matches(s, &other["metadata"]["labels"]))
                {
                    stack.push(other);
                }
            }
        }
        rules
    }

    /// The rules `binding`'s `roleRef` grants (a Role of its namespace, or a ClusterRole).
    fn granted(&self, binding: &Value) -> Vec<&Value> {
        let role = &binding["roleRef"];
        let name = text(&role["name"]);
        match text(&role["kind"]) {
            "ClusterRole" => self
                .cluster_role(name)
                .map(|r| self.cluster_role_rules(r))
                .unwrap_or_default(),
            "Role" => {
                let ns = text(&binding["metadata"]["namespace"]);
                self.roles
                    .iter()
                    .find(|r| {
                        text(&r["metadata"]["name"]) == name
                            && text(&r["metadata"]["namespace"]) == ns
                    })
                    .map(|r| r["rules"].as_array().into_iter().flatten().collect())
                    .unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// Every rule that applies to `user` in `namespace` ("" for cluster-wide ones only).
    pub fn rules_for(&self, user: &User, namespace: &str) -> Vec<&Value> {
        let mut rules = Vec::new();
        for b in &self.cluster_role_bindings {
            if names(b, user) {
                rules.extend(self.granted(b));
            }
        }
        if !namespace.is_empty() {
            for b in &self.role_bindings {
                if text(&b["metadata"]["namespace"]) == namespace && names(b, user) {
                    rules.extend(self.granted(b));
                }
            }
        }
        rules
    }

    /// Whether `user` may do `a`, and why, in the apiserver's words when not.
    pub fn authorize(&self, user: &User, a: &Attributes) -> Decision {
        if user.is_master() {
            return Decision::Allow;
        }
        // A RoleBinding grants only within its namespace, and only for namespaced requests.
        let namespace = if a.resource_request {
            a.namespace.as_str()
        } else {
            ""
        };
        if self.rules_for(user, namespace).iter().any(|r| covers(r, a)) {
            Decision::Allow
        } else {
            Decision::Deny(forbidden_message(user, a))
        }
    }
}

/// Whether the rules `owner` holds cover every permission `rule` grants, as upstream's
/// escalation check compares them: each (verb, group, resource, name) or (verb, URL) the rule
/// names must be granted by some rule of `owner`, a wildcard only by a wildcard.
pub fn rules_cover(owner: &[&Value], rule: &Value) -> bool {
    let has =
        |r: &Value, field: &str, want: &str| strings(&r[field]).any(|v| v == "*" || v == want);
    let verbs: Vec<&str> = strings(&rule["verbs"]).collect();
    let urls: Vec<&str> = strings(&rule["nonResourceURLs"]).collect();
    if !urls.is_empty() {
        return verbs.iter().all(|v| {
            urls.iter().all(|u| {
                owner.iter().any(|o| {
                    has(o, "verbs", v)
                        && strings(&o["nonResourceURLs"]).any(|ou| {
                            ou == "*"
                                || ou == *u
                                || ou.strip_suffix('*').is_some_and(|p| u.starts_with(p))
                        })
                })
            })
        });
    }
    let groups: Vec<&str> = strings(&rule["apiGroups"]).collect();
    let resources: Vec<&str> = strings(&rule["resources"]).collect();
    let names: Vec<&str> = strings(&rule["resourceNames"]).collect();
    verbs.iter().all(|v| {
        groups.iter().all(|g| {
            resources.iter().all(|r| {
                owner.iter().any(|o| {
                    let owner_names: Vec<&str> = strings(&o["resourceNames"]).collect();
                    has(o, "verbs", v)
                        && has(o, "apiGroups", g)
                        && has(o, "resources", r)
                        && (owner_names.is_empty()
                            || (!names.is_empty() && names.iter().all(|n| owner_names.contains(n))))
                })
            })
        })
    })
}

impl Policy {
    /// Whether `user` may write `object` (a Role, ClusterRole, RoleBinding or
    /// ClusterRoleBinding) without gaining what it does not hold (upstream's escalation
    /// prevention): a role only with rules the user holds where the role applies (or the
    /// `escalate` verb on it); a binding only to a role whose rules the user holds where the
    /// binding applies (or the `bind` verb on that role). `Err` carries the apiserver's reason.
    pub fn may_write(&self, user: &User, object: &Value) -> Result<(), String> {
        if user.is_master() {
            return Ok(());
        }
        let kind = text(&object["kind"]);
        let namespace = text(&object["metadata"]["namespace"]);
        let name = text(&object["metadata"]["name"]);
        let held = self.rules_for(user, namespace);
        let verb_on = |verb: &str, resource: &str, ns: &str, name: &str| {
            let a = Attributes {
                verb: verb.into(),
                resource_request: true,
                api_group: GROUP.into(),
                resource: resource.into(),
                namespace: ns.into(),
                name: name.into(),
                ..Default::default()
            };
            held.iter().any(|r| covers(r, &a))
        };
        let (rules, what) = match kind {
            "Role" | "ClusterRole" => {
                let resource = if kind == "Role" {
                    "roles"
                } else {
                    "clusterroles"
                };
                if verb_on("escalate", resource, namespace, name) {
                    return Ok(());
                }
                let rules: Vec<&Value> = object["rules"].as_array().into_iter().flatten().collect();
                (rules, format!("{kind} {name:?}"))
            }
            "RoleBinding" | "ClusterRoleBinding" => {
                let role = &object["roleRef"];
                let role_kind = text(&role["kind"]);
                let role_name = text(&role["name"]);
                let (resource, role_ns) = if role_kind == "Role" {
                    ("roles", namespace)
                } else {
                    ("clusterroles", "")
                };
                if verb_on("bind", resource, role_ns, role_name) {
                    return Ok(());
                }
                let binding = json!({"metadata": {"namespace": namespace}, "roleRef": role});
                (self.granted(&binding), format!("{role_kind} {role_name:?}"))
            }
            _ => return Ok(()),
        };
        match rules.iter().find(|r| !rules_cover(&held, r)) {
            None => Ok(()),
            Some(missing) => Err(format!(
                "user {:?} (groups={:?}) is attempting to grant RBAC permissions not currently held: {missing} (through {what})",
                user.name, user.groups
            )),
        }
    }
}

/// An authorization's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Forbidden, with the apiserver's message.
    Deny(String),
}

/// The apiserver's 403 message: `pods is forbidden: User "jane" cannot list resource "pods"
/// in API group "" in the namespace "default"`.
pub fn forbidden_message(user: &User, a: &Attributes) -> String {
    if !a.resource_request {
        return format!(
            "forbidden: User {:?} cannot {} path {:?}",
            user.name, a.verb, a.path
        );
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let subject = if a.name.is_empty() {
        format!("{resource} is forbidden")
    } else {
        format!("{resource} {:?} is forbidden", a.name)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace {:?}", a.namespace)
    };
    format!(
        "{subject}: User {:?} cannot {} resource {:?} in API group {:?} {scope}",
        user.name, a.verb, resource, a.api_group
    )
}

/// The most rules one role may hold, and subjects one binding may name (Shoal's bounds: every
/// authorization reads them).
pub const MAX_RULES: usize = 1000;
pub const MAX_SUBJECTS: usize = 1000;

fn problem(field: impl Into<String>, detail: impl Into<String>) -> crate::FieldError {
    crate::FieldError::new(field, detail)
}

/// A Role's or ClusterRole's rules, as the apiserver checks them: each names verbs, and
/// either resources (with API groups) or non-resource URLs (only in a ClusterRole).
pub fn validate_role(role: &Value) -> Result<(), crate::FieldError> {
    let rules = role["rules"].as_array().map_or(&[][..], Vec::as_slice);
    if rules.len() > MAX_RULES {
        return Err(problem(
            "rules",
            format!(
                "Too many: {}: must have at most {MAX_RULES} items",
                rules.len()
            ),
        ));
    }
    let cluster = role["kind"] == "ClusterRole";
    for (i, r) in rules.iter().enumerate() {
        let at = |f: &str| format!("rules[{i}].{f}");
        if strings(&r["verbs"]).next().is_none() {
            return Err(problem(
                at("verbs"),
                "Required value: verbs must contain at least one value",
            ));
        }
        let urls = strings(&r["nonResourceURLs"]).count();
        if urls > 0 && !cluster {
            return Err(problem(
                at("nonResourceURLs"),
                "Invalid value: namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if urls > 0 && strings(&r["resources"]).next().is_some() {
            return Err(problem(
                at("nonResourceURLs"),
                "Invalid value: rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        if urls == 0 && strings(&r["apiGroups"]).next().is_none() {
            return Err(problem(
                at("apiGroups"),
                "Required value: resource rules must supply at least one api group",
            ));
        }
        if urls == 0 && strings(&r["resources"]).next().is_none() {
            return Err(problem(
                at("resources"),
                "Required value: resource rules must supply at least one resource",
            ));
        }
    }
    Ok(())
}

/// A RoleBinding's or ClusterRoleBinding's `roleRef` (a ClusterRoleBinding refers to a
/// ClusterRole) and subjects.
pub fn validate_binding(kind: &str, binding: &Value) -> Result<(), crate::FieldError> {
    let role = &binding["roleRef"];
    let allowed: &[&str] = if kind == "ClusterRoleBinding" {
        &["ClusterRole"]
    } else {
        &["Role", "ClusterRole"]
    };
    if !allowed.contains(&text(&role["kind"])) {
        return Err(problem(
            "roleRef.kind",
            format!(
                "Unsupported value: {}: supported values: {}",
                role["kind"],
                allowed
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if text(&role["name"]).is_empty() {
        return Err(problem("roleRef.name", "Required value"));
    }
    if !matches!(text(&role["apiGroup"]), "" | GROUP) {
        return Err(problem(
            "roleRef.apiGroup",
            format!(
                "Unsupported value: {}: supported values: \"{GROUP}\"",
                role["apiGroup"]
            ),
        ));
    }
    let subjects = binding["subjects"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if subjects.len() > MAX_SUBJECTS {
        return Err(problem(
            "subjects",
            format!(
                "Too many: {}: must have at most {MAX_SUBJECTS} items",
                subjects.len()
            ),
        ));
    }
    for (i, s) in subjects.iter().enumerate() {
        let kind = text(&s["kind"]);
        if !matches!(kind, "User" | "Group" | "ServiceAccount") {
            return Err(problem(
                format!("subjects[{i}].kind"),
                format!(
                    "Unsupported value: {}: supported values: \"ServiceAccount\", \"User\", \"Group\"",
                    s["kind"]
                ),
            ));
        }
        if text(&s["name"]).is_empty() {
            return Err(problem(format!("subjects[{i}].name"), "Required value"));
        }
        if kind == "ServiceAccount" && text(&s["namespace"]).is_empty() && kind_is_cluster(binding)
        {
            return Err(problem(
                format!("subjects[{i}].namespace"),
                "Required value",
            ));
        }
    }
    Ok(())
}

fn kind_is_cluster(binding: &Value) -> bool {
    binding["kind"] == "ClusterRoleBinding"
}

/// A binding's `roleRef` cannot change (the apiserver's rule: delete and recreate it).
pub fn validate_binding_update(old: &Value, new: &Value) -> Result<(), crate::FieldError> {
    let strip = |r: &Value| (text(&r["kind"]).to_owned(), text(&r["name"]).to_owned());
    if strip(&old["roleRef"]) != strip(&new["roleRef"]) {
        return Err(problem("roleRef", "Invalid value: cannot change roleRef"));
    }
    Ok(())
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn cluster_role(
    name: &str,
    labels: Value,
    rules: Vec<Value>,
    aggregate_from: Option<&str>,
) -> Value {
    let mut role = json!({
        "apiVersion": format!("{GROUP}/v1"),
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels,
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "rules": rules,
    });
    if let Some(label) = aggregate_from {
        role["aggregationRule"] =
            json!({"clusterRoleSelectors": [{"matchLabels": {label: "true"}}]});
    }
    role
}

fn cluster_binding(name: &str, role: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": GROUP, "kind": "Group", "name": g}))
        .collect();
    json!({
        "apiVersion": format!("{GROUP}/v1"),
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

/// The ClusterRoles and ClusterRoleBindings a cluster starts with: upstream's user-facing
/// roles (`cluster-admin`; `admin`, `edit`, `view`, aggregated from the roles labeled
/// `rbac.authorization.k8s.io/aggregate-to-*` as upstream's are, so a CRD's roles can join
/// them) and the discovery roles every user needs.
pub fn bootstrap() -> Vec<Value> {
    let read = ["get", "list", "watch"];
    let write = ["create", "delete", "deletecollection", "patch", "update"];
    let labels = |to: &str| {
        json!({"kubernetes.io/bootstrapping": "rbac-defaults",
            format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true"})
    };
    let defaults = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    let core_read = [
        "configmaps",
        "endpoints",
        "persistentvolumeclaims",
        "persistentvolumeclaims/status",
        "pods",
        "pods/log",
        "pods/status",
        "replicationcontrollers",
        "services",
        "services/status",
        "serviceaccounts",
        "events",
        "limitranges",
        "resourcequotas",
        "namespaces",
        "namespaces/status",
    ];
    let apps = [
        "controllerrevisions",
        "daemonsets",
        "daemonsets/status",
        "deployments",
        "deployments/scale",
        "deployments/status",
        "replicasets",
        "replicasets/scale",
        "replicasets/status",
        "statefulsets",
        "statefulsets/scale",
        "statefulsets/status",
    ];
    let view_rules = vec![
        rule(&[""], &core_read, &read),
        rule(&["apps"], &apps, &read),
        rule(
            &["batch"],
            &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
            &read,
        ),
        rule(
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
            &read,
        ),
        rule(&["discovery.k8s.io"], &["endpointslices"], &read),
        rule(&["events.k8s.io"], &["events"], &read),
        rule(&["metrics.k8s.io"], &["pods", "nodes"], &read),
    ];
    let edit_rules = vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "pods",
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
                "pods/eviction",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "secrets",
                "services",
                "services/proxy",
                "serviceaccounts",
            ],
            &write,
        ),
        rule(
            &[""],
            &["secrets", "pods/attach", "pods/exec", "pods/portforward"],
            &read,
        ),
        rule(&[""], &["serviceaccounts/token"], &["create"]),
        rule(&["apps"], &apps, &write),
        rule(&["batch"], &["cronjobs", "jobs"], &write),
        rule(&["autoscaling"], &["horizontalpodautoscalers"], &write),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &[
                "get",
                "list",
                "watch",
                "create",
                "delete",
                "deletecollection",
                "patch",
                "update",
            ],
        ),
    ];
    let admin_rules = vec![
        rule(
            &[GROUP],
            &["roles", "rolebindings"],
            &[
                "get",
                "list",
                "watch",
                "create",
                "delete",
                "deletecollection",
                "patch",
                "update",
            ],
        ),
        rule(
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
            &["create"],
        ),
    ];
    let discovery_urls = [
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/healthz",
        "/livez",
        "/readyz",
        "/version",
        "/version/",
        "/openapi",
        "/openapi/*",
    ];
    let public = ["/healthz", "/livez", "/readyz", "/version", "/version/"];
    vec![
        cluster_role(
            "cluster-admin",
            defaults.clone(),
            vec![
                rule(&["*"], &["*"], &["*"]),
                json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
            ],
            None,
        ),
        // The user-facing roles: empty but for what the roles labeled for them hold.
        cluster_role(
            "admin",
            defaults.clone(),
            vec![],
            Some("rbac.authorization.k8s.io/aggregate-to-admin"),
        ),
        cluster_role(
            "edit",
            labels("admin"),
            vec![],
            Some("rbac.authorization.k8s.io/aggregate-to-edit"),
        ),
        cluster_role(
            "view",
            labels("edit"),
            vec![],
            Some("rbac.authorization.k8s.io/aggregate-to-view"),
        ),
        cluster_role(
            "system:aggregate-to-admin",
            labels("admin"),
            admin_rules,
            None,
        ),
        cluster_role("system:aggregate-to-edit", labels("edit"), edit_rules, None),
        cluster_role("system:aggregate-to-view", labels("view"), view_rules, None),
        cluster_role(
            "system:discovery",
            defaults.clone(),
            vec![json!({"nonResourceURLs": discovery_urls, "verbs": ["get"]})],
            None,
        ),
        cluster_role(
            "system:public-info-viewer",
            defaults.clone(),
            vec![json!({"nonResourceURLs": public, "verbs": ["get"]})],
            None,
        ),
        cluster_role(
            "system:basic-user",
            defaults.clone(),
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
            ],
            None,
        ),
        // Systems outside the cluster verifying its service-account tokens.
        cluster_role(
            "system:service-account-issuer-discovery",
            defaults.clone(),
            vec![json!({"nonResourceURLs": [
                "/.well-known/openid-configuration",
                "/.well-known/openid-configuration/",
                "/openid/v1/jwks",
                "/openid/v1/jwks/",
            ], "verbs": ["get"]})],
            None,
        ),
        // What a proxy or webhook that delegates authentication and authorization needs.
        cluster_role(
            "system:auth-delegator",
            defaults,
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ],
            None,
        ),
        cluster_binding("cluster-admin", "cluster-admin", &[MASTERS]),
        cluster_binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            &["system:serviceaccounts"],
        ),
        cluster_binding("system:discovery", "system:discovery", &[AUTHENTICATED]),
        cluster_binding("system:basic-user", "system:basic-user", &[AUTHENTICATED]),
        cluster_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[AUTHENTICATED, UNAUTHENTICATED],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: Vec<Value>) -> Policy {
        let mut p = Policy::default();
        for o in bootstrap().into_iter().chain(extra) {
            match text(&o["kind"]) {
                "Role" => p.roles.push(o),
                "ClusterRole" => p.cluster_roles.push(o),
                "RoleBinding" => p.role_bindings.push(o),
                "ClusterRoleBinding" => p.cluster_role_bindings.push(o),
                _ => {}
            }
        }
        p
    }

    #[test]
    fn requests_read_as_the_apiserver_reads_them() {
        let a = attributes("GET", "/api/v1/namespaces/dev/pods", false);
        assert_eq!(
            (
                a.verb.as_str(),
                a.resource.as_str(),
                a.namespace.as_str(),
                a.resource_request
            ),
            ("list", "pods", "dev", true)
        );
        let a = attributes("GET", "/api/v1/namespaces/dev/pods/web/log", false);
        assert_eq!(
            (a.verb.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("get", "web", "log")
        );
        let a = attributes("GET", "/apis/apps/v1/deployments", true);
        assert_eq!(
            (a.verb.as_str(), a.api_group.as_str(), a.namespace.as_str()),
            ("watch", "apps", "")
        );
        let a = attributes("GET", "/api/v1/watch/namespaces/dev/pods/web", false);
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "web"));
        let a = attributes("DELETE", "/api/v1/namespaces/dev", false);
        assert_eq!(
            (a.verb.as_str(), a.resource.as_str(), a.name.as_str()),
            ("delete", "namespaces", "dev")
        );
        let a = attributes("PUT", "/api/v1/namespaces/dev/finalize", false);
        assert_eq!(
            (
                a.resource.as_str(),
                a.name.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str()
            ),
            ("namespaces", "dev", "finalize", "dev")
        );
        let a = attributes("DELETE", "/apis/batch/v1/namespaces/dev/jobs", false);
        assert_eq!(a.verb, "deletecollection");
        let a = attributes("POST", "/api/v1/namespaces/dev/pods/web/eviction", false);
        assert_eq!(
            (a.verb.as_str(), a.subresource.as_str()),
            ("create", "eviction")
        );
        for path in [
            "/api",
            "/apis/apps/v1",
            "/version",
            "/openapi/v2",
            "/api/v1",
        ] {
            let a = attributes("GET", path, false);
            assert!(!a.resource_request, "{path}");
            assert_eq!(a.verb, "get");
        }
    }

    #[test]
    fn bindings_grant_their_roles_rules_where_they_apply() {
        let role = json!({"kind": "Role", "metadata": {"name": "reader", "namespace": "dev"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["get"]}]});
        let binding = json!({"kind": "RoleBinding", "metadata": {"name": "jane-reads", "namespace": "dev"},
            "roleRef": {"kind": "Role", "name": "reader"},
            "subjects": [{"kind": "User", "name": "jane"}, {"kind": "ServiceAccount", "name": "bot"}]});
        let ops = json!({"kind": "ClusterRoleBinding", "metadata": {"name": "ops-view"},
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "name": "ops"}]});
        let p = policy(vec![role, binding, ops]);
        let jane = User::new("jane", &[AUTHENTICATED]);
        let allowed = |u: &User, method: &str, path: &str| {
            p.authorize(u, &attributes(method, path, false)) == Decision::Allow
        };
        assert!(allowed(&jane, "GET", "/api/v1/namespaces/dev/pods"));
        assert!(allowed(&jane, "GET", "/api/v1/namespaces/dev/pods/web/log"));
        assert!(
            !allowed(&jane, "GET", "/api/v1/namespaces/prod/pods"),
            "another namespace"
        );
        assert!(!allowed(&jane, "GET", "/api/v1/pods"), "all namespaces");
        assert!(!allowed(&jane, "DELETE", "/api/v1/namespaces/dev/pods/web"));
        assert!(!allowed(
            &jane,
            "GET",
            "/api/v1/namespaces/dev/pods/web/exec"
        ));
        assert!(allowed(
            &jane,
            "GET",
            "/api/v1/namespaces/dev/configmaps/settings"
        ));
        assert!(!allowed(
            &jane,
            "GET",
            "/api/v1/namespaces/dev/configmaps/other"
        ));
        // Discovery and self-review for every authenticated user.
        assert!(allowed(&jane, "GET", "/apis/apps/v1"));
        assert!(allowed(
            &jane,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        ));
        // A service account named in the binding (its namespace the binding's).
        let bot = User::new("system:serviceaccount:dev:bot", &[AUTHENTICATED]);
        assert!(allowed(&bot, "GET", "/api/v1/namespaces/dev/pods"));
        let other_bot = User::new("system:serviceaccount:prod:bot", &[AUTHENTICATED]);
        assert!(!allowed(&other_bot, "GET", "/api/v1/namespaces/dev/pods"));
        // A group bound to the aggregated `view` role reads everywhere, no secrets, no writes.
        let ops = User::new("sam", &["ops", AUTHENTICATED]);
        assert!(allowed(
            &ops,
            "GET",
            "/apis/apps/v1/namespaces/prod/deployments"
        ));
        assert!(allowed(&ops, "GET", "/api/v1/pods"));
        assert!(!allowed(&ops, "GET", "/api/v1/namespaces/prod/secrets"));
        assert!(!allowed(&ops, "POST", "/api/v1/namespaces/prod/pods"));
        // The privileged group; nobody else.
        assert!(allowed(
            &User::new("admin", &[MASTERS]),
            "DELETE",
            "/api/v1/nodes/n1"
        ));
        let anonymous = User::new("system:anonymous", &[UNAUTHENTICATED]);
        assert!(allowed(&anonymous, "GET", "/healthz"));
        assert!(!allowed(&anonymous, "GET", "/api"));
        assert_eq!(
            p.authorize(&jane, &attributes("GET", "/api/v1/namespaces/prod/pods", false)),
            Decision::Deny(
                "pods is forbidden: User \"jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"prod\"".into()
            )
        );
    }

    /// Escalation prevention: a user who may write roles and bindings in a namespace can
    /// grant only what it holds there, unless it holds `escalate` or `bind`.
    #[test]
    fn nobody_grants_what_they_do_not_hold() {
        let manager = json!({"kind": "Role", "metadata": {"name": "manager", "namespace": "dev"},
            // Explicit verbs: `*` would include `escalate` and `bind`.
            "rules": [{"apiGroups": [GROUP], "resources": ["roles", "rolebindings"],
                    "verbs": ["get", "list", "create", "update", "patch", "delete"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]});
        let binding = json!({"kind": "RoleBinding", "metadata": {"name": "m", "namespace": "dev"},
            "roleRef": {"kind": "Role", "name": "manager"}, "subjects": [{"kind": "User", "name": "mo"}]});
        let p = policy(vec![manager, binding]);
        let mo = User::new("mo", &[AUTHENTICATED]);
        let role = |rules: Value| json!({"kind": "Role", "metadata": {"name": "r", "namespace": "dev"}, "rules": rules});
        // What mo holds: fine; more: refused, naming it.
        assert_eq!(
            p.may_write(
                &mo,
                &role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]))
            ),
            Ok(())
        );
        let err = p
            .may_write(
                &mo,
                &role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}])),
            )
            .unwrap_err();
        assert!(err.contains("not currently held"), "{err}");
        assert!(
            p.may_write(
                &mo,
                &role(json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]))
            )
            .is_err()
        );
        // In another namespace mo holds nothing.
        let elsewhere = json!({"kind": "Role", "metadata": {"name": "r", "namespace": "prod"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        assert!(p.may_write(&mo, &elsewhere).is_err());
        // Binding cluster-admin: refused; binding view's rules mo lacks: refused.
        let bind = |role: &str| {
            json!({"kind": "RoleBinding", "metadata": {"name": "b", "namespace": "dev"},
            "roleRef": {"kind": "ClusterRole", "name": role}, "subjects": [{"kind": "User", "name": "eve"}]})
        };
        assert!(p.may_write(&mo, &bind("cluster-admin")).is_err());
        assert!(p.may_write(&mo, &bind("view")).is_err());
        // Its own role: fine. The `bind` verb on cluster-admin: fine.
        let own = json!({"kind": "RoleBinding", "metadata": {"name": "b", "namespace": "dev"},
            "roleRef": {"kind": "Role", "name": "manager"}, "subjects": [{"kind": "User", "name": "eve"}]});
        assert_eq!(p.may_write(&mo, &own), Ok(()));
        let binder = json!({"kind": "ClusterRole", "metadata": {"name": "binder"},
            "rules": [{"apiGroups": [GROUP], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}]});
        let grant = json!({"kind": "RoleBinding", "metadata": {"name": "g", "namespace": "dev"},
            "roleRef": {"kind": "ClusterRole", "name": "binder"}, "subjects": [{"kind": "User", "name": "mo"}]});
        let p2 = policy(vec![
            json!({"kind": "Role", "metadata": {"name": "manager", "namespace": "dev"}, "rules": []}),
            binder,
            grant,
        ]);
        assert_eq!(p2.may_write(&mo, &bind("cluster-admin")), Ok(()));
        assert_eq!(
            p.may_write(&User::new("root", &[MASTERS]), &bind("cluster-admin")),
            Ok(())
        );
    }

    #[test]
    fn aggregated_roles_take_the_rules_of_the_roles_their_selectors_match() {
        let crd_view = json!({"kind": "ClusterRole", "metadata": {"name": "widgets-view",
            "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}]});
        let p = policy(vec![crd_view]);
        let view = p.cluster_role("view").unwrap();
        let rules = p.cluster_role_rules(view);
        let a = attributes("GET", "/apis/example.com/v1/namespaces/x/widgets/w", false);
        assert!(rules.iter().any(|r| covers(r, &a)));
        // admin aggregates edit, which aggregates view: all of it is admin's.
        let admin = p.cluster_role("admin").unwrap();
        let delete = attributes("DELETE", "/api/v1/namespaces/x/pods/p", false);
        assert!(
            p.cluster_role_rules(admin)
                .iter()
                .any(|r| covers(r, &delete))
        );
        assert!(p.cluster_role_rules(admin).iter().any(|r| covers(r, &a)));
    }
}
