"""The official Kubernetes Python client against two Shoal agents.

Its models validate every response (client_side_validation is on by default): a missing
required field or a malformed timestamp raises. Usage: python_client.py KUBECONFIG_A KUBECONFIG_B
"""
import sys
import time

from kubernetes import client, config, watch


def api(path):
    return client.ApiClient(configuration=_config(path))


def _config(path):
    c = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=c)
    assert c.client_side_validation, "strict models must be on"
    return c


def wait_for(what, check, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


a, b = api(sys.argv[1]), api(sys.argv[2])
core_a, core_b = client.CoreV1Api(a), client.CoreV1Api(b)
apps_a, apps_b = client.AppsV1Api(a), client.AppsV1Api(b)

nodes = core_a.list_node().items
assert len(nodes) == 2, nodes
for n in nodes:
    info = n.status.node_info
    assert info.kernel_version and info.os_image and info.architecture, info
    assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)

assert core_a.list_namespaced_pod("default").items == []

labels = {"app": "py"}
deployment = client.V1Deployment(
    metadata=client.V1ObjectMeta(name="py", labels=labels),
    spec=client.V1DeploymentSpec(
        replicas=1,
        selector=client.V1LabelSelector(match_labels=labels),
        template=client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels=labels),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1.36")]),
        ),
    ),
)
created = apps_a.create_namespaced_deployment("default", deployment)
assert created.metadata.uid and created.metadata.creation_timestamp, created.metadata
assert created.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"

# Written at agent A, read at agent B.
wait_for("the deployment at agent B", lambda: any(d.metadata.name == "py" for d in apps_b.list_namespaced_deployment("default").items))
patched = apps_b.patch_namespaced_deployment("py", "default", {"spec": {"replicas": 4}})
assert patched.spec.replicas == 4
wait_for("the patch at agent A", lambda: apps_a.read_namespaced_deployment("py", "default").spec.replicas == 4)

pod = client.V1Pod(
    metadata=client.V1ObjectMeta(name="py-pod"),
    spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="busybox:1.36")]),
)
core_a.create_namespaced_pod("default", pod)
assert "py-pod" in [p.metadata.name for p in core_a.list_namespaced_pod("default").items]
# The Deployment's controller made its 4 pods (they parse under the client's strict models).
wait_for("the deployment's 4 pods", lambda: len(core_b.list_namespaced_pod("default", label_selector="app=py").items) == 4)
owned = core_b.list_namespaced_pod("default", label_selector="app=py").items
assert all(p.metadata.owner_references[0].kind == "ReplicaSet" for p in owned), owned
assert apps_a.list_namespaced_replica_set("default").items[0].metadata.owner_references[0].name == "py"
assert core_a.read_namespaced_pod("py-pod", "default").status.phase == "Pending"

events = []
w = watch.Watch()
for event in w.stream(apps_a.list_namespaced_deployment, "default", timeout_seconds=2):
    events.append((event["type"], event["object"].metadata.name))
assert ("ADDED", "py") in events, events

try:
    core_b.read_namespaced_pod_log("py-pod", "default")
    raise AssertionError("no pod runs yet: logs must be refused")
except client.exceptions.ApiException as e:
    assert e.status == 400 and "waiting to start" in e.body, (e.status, e.body)

apps_b.delete_namespaced_deployment("py", "default")
core_b.delete_namespaced_pod("py-pod", "default")
wait_for("the delete at agent A", lambda: apps_a.list_namespaced_deployment("default").items == [])
# Its ReplicaSet and pods go with it (owner references).
wait_for("the deployment's pods gone", lambda: core_a.list_namespaced_pod("default", label_selector="app=py").items == [])

try:
    apps_a.read_namespaced_deployment("py", "default")
    raise AssertionError("deleted")
except client.exceptions.ApiException as e:
    assert e.status == 404, e.status

# deletecollection: what the selector matches goes (the answer lists it), the rest stays.
for i, tier in enumerate(["batch", "batch", "batch", "keep"]):
    core_a.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=f"dc-{i}", labels={"tier": tier}), data={"i": str(i)}))
# The client reads the answer as a Status (its OpenAPI says so); the apiserver and Shoal send
# the list of what was deleted, which it reads without complaint.
gone = core_b.delete_collection_namespaced_config_map("default", label_selector="tier=batch")
assert gone.kind == "ConfigMapList", gone
left = [c.metadata.name for c in core_a.list_namespaced_config_map("default", label_selector="tier").items]
assert left == ["dc-3"], left

# Bookmarks: a watch that allows them gets one (every 10 s), naming a version to resume from;
# a watch resumed there sees what came after it and nothing from before (the deletes above).
w = watch.Watch()
bookmark = None
for event in w.stream(core_a.list_namespaced_config_map, "default", allow_watch_bookmarks=True, timeout_seconds=20):
    if event["type"] == "BOOKMARK":
        bookmark = event["raw_object"]["metadata"]["resourceVersion"]
        w.stop()
assert bookmark, "no BOOKMARK within 20 s"
core_a.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="after-bookmark")))
seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
    core_a.list_namespaced_config_map, "default", resource_version=bookmark, timeout_seconds=3)]
assert ("ADDED", "after-bookmark") in seen and not any(n.startswith("dc-") for _, n in seen), seen

print("python client: all checks passed")
