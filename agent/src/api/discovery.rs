//! Discovery (legacy and aggregated), OpenAPI v3 documents and `/version`, as kubectl and client
//! libraries expect them.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::resources::{self, ApiResource};

/// Content type of aggregated discovery responses; kubectl misreads them under plain JSON.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The Kubernetes version this API mirrors.
pub const KUBE_MINOR: &str = "37";

/// Whether the client asked for aggregated discovery.
pub fn wants_aggregated(accept: &str) -> bool {
    accept.contains("as=APIGroupDiscoveryList")
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0+shoal-{}", crate::AGENT_VERSION),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH }),
    })
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

pub fn group_list() -> Value {
    let groups: Vec<Value> = resources::group_versions()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, v)| {
            let gv = json!({"groupVersion": group_version(g, v), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn in_group_version(group: &str, version: &str) -> Vec<ApiResource> {
    resources::all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect()
}

pub fn resource_list(group: &str, version: &str) -> Value {
    let mut list = Vec::new();
    for r in in_group_version(group, version) {
        list.push(json!({
            "name": r.plural,
            "singularName": r.singular(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
            "shortNames": r.short_names,
            "categories": r.categories(),
        }));
        for (sub, (g, v, k), verbs) in r.subresources() {
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": k,
                "verbs": verbs,
            });
            if g != group || v != version {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            list.push(entry);
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": list,
    })
}

fn aggregated_group(group: &str) -> Value {
    let versions: Vec<Value> = resources::group_versions()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| {
            let resources: Vec<Value> = in_group_version(g, v)
                .into_iter()
                .map(|r| {
                    let subresources: Vec<Value> = r
                        .subresources()
                        .into_iter()
                        .map(|(sub, (sg, sv, sk), verbs)| {
                            json!({"subresource": sub, "responseKind": {"group": sg, "version": sv, "kind": sk}, "verbs": verbs})
                        })
                        .collect();
                    json!({
                        "resource": r.plural,
                        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": r.singular(),
                        "verbs": r.verbs(),
                        "shortNames": r.short_names,
                        "categories": r.categories(),
                        "subresources": subresources,
                    })
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions})
}

/// Aggregated discovery of the core group (`/api`) or of all named groups (`/apis`).
pub fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group("")]
    } else {
        let mut groups: Vec<&str> = resources::group_versions()
            .into_iter()
            .map(|(g, _)| g)
            .filter(|g| !g.is_empty())
            .collect();
        groups.dedup();
        groups.into_iter().map(aggregated_group).collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

fn openapi_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per group version, its URL naming a digest of the document (as the
/// apiserver's does). kubectl caches a document by that URL, so an upgraded agent whose models
/// changed is read anew, not from a cache of the old ones.
pub fn openapi_root() -> Value {
    static ROOT: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
        use sha2::Digest;
        let mut paths = serde_json::Map::new();
        for (g, v) in resources::group_versions() {
            let p = openapi_path(g, v);
            let text = openapi_document(&p)
                .and_then(|d| serde_json::to_vec(&d).ok())
                .unwrap_or_default();
            let digest = hex::encode(&sha2::Sha256::digest(&text)[..16]).to_uppercase();
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={digest}")}),
            );
        }
        json!({"paths": paths})
    });
    ROOT.clone()
}

/// `/openapi/v3/{api/v1 | apis/g/v}`: the operations kubectl's field validation looks for (a
/// PATCH carrying `x-kubernetes-group-version-kind` and a `fieldValidation` parameter), and the
/// models of the kinds, with their descriptions, from the protobuf descriptors
/// ([`super::openapi`]; `kubectl explain`). A kind without a descriptor keeps an open schema.
/// Made once per group version.
pub fn openapi_document(path: &str) -> Option<Value> {
    static DOCUMENTS: std::sync::LazyLock<std::sync::Mutex<HashMap<String, Value>>> =
        std::sync::LazyLock::new(Default::default);
    if let Some(doc) = DOCUMENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(path)
    {
        return Some(doc.clone());
    }
    let doc = make_openapi_document(path)?;
    DOCUMENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_owned(), doc.clone());
    Some(doc)
}

fn make_openapi_document(path: &str) -> Option<Value> {
    let (group, version) = resources::group_versions()
        .into_iter()
        .find(|(g, v)| openapi_path(g, v) == path)?;
    let mut paths = serde_json::Map::new();
    for r in in_group_version(group, version) {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let schema_ref = format!("#/components/schemas/{}", kind_schema_name(&r));
        let op = |verb: &str| {
            json!({
                "operationId": format!("{verb}{}", r.kind),
                "parameters": params,
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": schema_ref}}}}},
            })
        };
        let base = openapi_path(r.group, r.version);
        let item = if r.namespaced {
            format!("/{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{base}/{}/{{name}}", r.plural)
        };
        let collection = if r.namespaced {
            format!("/{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("/{base}/{}", r.plural)
        };
        paths.insert(item, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
        paths.insert(collection, json!({"get": op("list"), "post": op("post")}));
    }
    let kinds: Vec<(&str, &str, &str)> = in_group_version(group, version)
        .iter()
        .map(|r| (r.group, r.version, r.kind))
        .collect();
    let mut schemas = super::openapi::schemas(&kinds);
    for r in in_group_version(group, version) {
        schemas.entry(kind_schema_name(&r)).or_insert_with(|| {
            json!({
                "type": "object",
                "x-kubernetes-group-version-kind": [{"group": r.group, "version": r.version, "kind": r.kind}],
            })
        });
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{KUBE_MINOR}.0")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The component name of a kind's model: its message's ([`super::openapi::schema_name`]), or
/// for a kind without one a name in the same scheme.
fn kind_schema_name(r: &ApiResource) -> String {
    let api_version = if r.group.is_empty() {
        r.version.to_owned()
    } else {
        format!("{}/{}", r.group, r.version)
    };
    if let Some(message) = super::protobuf::message_for(&api_version, r.kind) {
        return super::openapi::schema_name(&message);
    }
    let group = if r.group.is_empty() { "core" } else { r.group };
    format!("io.k8s.api.{group}.{}.{}", r.version, r.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_every_resource_with_short_names() {
        let core = resource_list("", "v1");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for n in [
            "pods",
            "pods/log",
            "pods/status",
            "services",
            "nodes",
            "namespaces",
            "configmaps",
            "events",
            "endpoints",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        let agg = aggregated(false);
        let apps = agg["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "apps")
            .unwrap();
        let deploy = apps["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "deployments")
            .unwrap();
        assert_eq!(deploy["shortNames"][0], "deploy");
        assert_eq!(deploy["categories"][0], "all");
        assert!(
            openapi_document("apis/apps/v1").unwrap()["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]
                ["patch"]["x-kubernetes-group-version-kind"]["kind"]
                == "Deployment"
        );
        assert!(openapi_document("apis/nope/v1").is_none());
        // Each document's URL names a digest of it (kubectl's cache key), not the version.
        let root = openapi_root();
        let url = |p: &str| {
            root["paths"][p]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let (core, apps) = (url("api/v1"), url("apis/apps/v1"));
        let hash = core.strip_prefix("/openapi/v3/api/v1?hash=").unwrap();
        assert_eq!(hash.len(), 32, "{core}");
        assert_ne!(hash, apps.rsplit('=').next().unwrap());
    }
}
