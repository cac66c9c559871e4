"""Concurrent patches of different fields of one object, through three agents (two writers on
the same agent), and label patches racing the auction's bindings: nothing written may be
reverted by a patch computed from an older version.

Usage: patch_race.py KUBECONFIG_0 KUBECONFIG_1 KUBECONFIG_2. Prints "patch race: nothing lost".
"""
import sys
import threading
import time

from kubernetes import client, config, watch

ROUNDS = 60
PODS = 12
# Which agent each ConfigMap writer goes through: most through agent 0, where their
# read-modify-writes race each other.
WRITERS = [0, 0, 0, 0, 0, 0, 1, 2]


def core(path):
    c = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=c)
    return client.CoreV1Api(client.ApiClient(configuration=c))


apis = [core(p) for p in sys.argv[1:4]]
errors = []


def run(target, *args):
    def body():
        try:
            target(*args)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{target.__name__}{args}: {e!r}")
    t = threading.Thread(target=body)
    t.start()
    return t


# 1. One ConfigMap, four writers each owning one label; writers 0 and 1 share agent 0.
apis[0].create_namespaced_config_map("default", {"metadata": {"name": "race"}, "data": {"a": "b"}})


def writer(k, api):
    for i in range(ROUNDS):
        api.patch_namespaced_config_map("race", "default", {"metadata": {"labels": {f"w{k}": str(i)}}})


threads = [run(writer, k, apis[a]) for k, a in enumerate(WRITERS)]
for t in threads:
    t.join()
assert not errors, errors
want = {f"w{k}": str(ROUNDS - 1) for k in range(len(WRITERS))}
deadline = time.time() + 30
while time.time() < deadline:
    seen = [api.read_namespaced_config_map("race", "default").metadata.labels or {} for api in apis]
    if all(s == want for s in seen):
        break
    time.sleep(0.1)
else:
    raise AssertionError(f"a patch was lost: want {want} on every agent, see {seen}")

# 2. Pods being bound by the auction while their labels are patched through every agent: a
# binding, once seen, must never be seen undone (a stale read-modify-write would write the pod
# back unbound). Watched through agent 2 from before the pods exist.
violations = []
bound = {}
stop = threading.Event()
rv = apis[2].list_namespaced_pod("default").metadata.resource_version


def observe():
    w = watch.Watch()
    for event in w.stream(apis[2].list_namespaced_pod, "default", resource_version=rv, timeout_seconds=60):
        pod = event["object"]
        name, node = pod.metadata.name, pod.spec.node_name
        if not name.startswith("racer-"):
            continue
        if bound.get(name) and not node and event["type"] != "DELETED":
            violations.append(f"{name} was bound to {bound[name]} and then seen unbound")
        if node:
            bound[name] = node
        if stop.is_set() and len(bound) == PODS:
            w.stop()


observer = run(observe)
time.sleep(0.3)
for i in range(PODS):
    apis[i % 3].create_namespaced_pod("default", {
        "metadata": {"name": f"racer-{i}", "labels": {"app": "racer"}},
        "spec": {"containers": [{"name": "c", "image": "shoal.local/busybox:1", "command": ["sleep", "1000"]}]},
    })


def labeller(a):
    for i in range(8):
        for p in range(PODS):
            apis[a].patch_namespaced_pod(f"racer-{p}", "default", {"metadata": {"labels": {f"l{a}": str(i)}}})


threads = [run(labeller, a) for a in range(3)]
for t in threads:
    t.join()
stop.set()
deadline = time.time() + 60
while time.time() < deadline and len(bound) < PODS:
    time.sleep(0.1)
assert len(bound) == PODS, f"only {sorted(bound)} were bound"
observer.join(timeout=70)
assert not errors, errors
assert not violations, violations
for p in range(PODS):
    pod = apis[0].read_namespaced_pod(f"racer-{p}", "default")
    assert pod.spec.node_name, f"racer-{p} is not bound"
    for a in range(3):
        assert (pod.metadata.labels or {}).get(f"l{a}") == "7", (p, pod.metadata.labels)
for p in range(PODS):
    apis[0].delete_namespaced_pod(f"racer-{p}", "default")
print("patch race: nothing lost")
