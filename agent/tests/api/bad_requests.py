"""Bad requests against a Shoal agent's API: each must get the right 4xx with a message naming
the problem, and none a 5xx. Usage: bad_requests.py KUBECONFIG
"""
import base64
import json
import ssl
import sys
import tempfile
import urllib.error
import urllib.request

import yaml

kubeconfig = yaml.safe_load(open(sys.argv[1]))
server = kubeconfig["clusters"][0]["cluster"]["server"]
token = kubeconfig["users"][0]["user"]["token"]
ca = base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
context = ssl.create_default_context(cadata=ca)


def request(method, path, body=None, content_type="application/json", auth=True):
    data = body if isinstance(body, (bytes, type(None))) else (body if isinstance(body, bytes) else json.dumps(body).encode())
    if isinstance(body, str):
        data = body.encode()
    req = urllib.request.Request(server + path, data=data, method=method)
    if auth is True:
        req.add_header("Authorization", f"Bearer {token}")
    elif auth:
        req.add_header("Authorization", f"Bearer {auth}")
    if data is not None and content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, context=context, timeout=20) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


P = "/api/v1/namespaces/default/pods"
D = "/apis/apps/v1/namespaces/default/deployments"
S = "/api/v1/namespaces/default/services"
C = "/api/v1/namespaces/default/configmaps"


def pod(name="p", **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def deploy(**spec_over):
    spec = {"replicas": 1, "selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    spec.update(spec_over)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec}


J = "/apis/batch/v1/namespaces/default/jobs"
CJ = "/apis/batch/v1/namespaces/default/cronjobs"


def job(**spec):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}, **spec}}


def cm(name="cm", **data):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


# Objects some cases need.
assert request("POST", C, cm("exists", a="1"))[0] == 201
status, body = request("GET", C + "/exists")
stale = json.loads(body)
stale["metadata"]["resourceVersion"] = "1"
assert request("PUT", C + "/exists", cm("exists", a="2"))[0] == 200
assert request("POST", D, {**deploy(), "metadata": {"name": "scaled"}})[0] == 201

no_image = deploy()
no_image["spec"]["template"]["spec"]["containers"][0].pop("image")
mismatch = deploy(selector={"matchLabels": {"app": "y"}})

cases = [
    ("GET", "/api/v1/pods", None, "application/json", False, 401, "Unauthorized"),
    ("GET", "/api/v1/pods", None, "application/json", "wrong-token", 401, "Unauthorized"),
    ("POST", P, "{not json", "application/json", True, 400, "not valid JSON"),
    ("POST", P, [1, 2], "application/json", True, 400, "JSON object"),
    ("POST", P, {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}}, "application/json", True, 422, "metadata.name: Required value"),
    ("POST", P, pod("UPPER"), "application/json", True, 422, "metadata.name"),
    ("POST", P, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}, "application/json", True, 422, "spec.containers: Required value"),
    ("POST", P, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, "application/json", True, 422, "spec.containers[0].image: Required value"),
    ("POST", P, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 70000}]}]}}, "application/json", True, 422, "containerPort"),
    ("POST", P, pod(restartPolicy="Sometimes"), "application/json", True, 422, "spec.restartPolicy"),
    ("POST", P, pod(dnsPolicy="ClusterOnly"), "application/json", True, 422, "spec.dnsPolicy: Unsupported value"),
    ("POST", P, pod(dnsPolicy="None"), "application/json", True, 422, "spec.dnsConfig.nameservers: Required value"),
    ("POST", P, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}, {"name": "c", "image": "j"}]}}, "application/json", True, 422, "Duplicate value"),
    ("POST", D, deploy(replicas="two"), "application/json", True, 422, "spec.replicas"),
    ("POST", D, deploy(replicas=-1), "application/json", True, 422, "spec.replicas"),
    ("POST", D, {**deploy(), "spec": {k: v for k, v in deploy()["spec"].items() if k != "selector"}}, "application/json", True, 422, "spec.selector: Required value"),
    ("POST", D, mismatch, "application/json", True, 422, "spec.template.metadata.labels"),
    ("POST", D, no_image, "application/json", True, 422, "spec.template.spec.containers[0].image: Required value"),
    ("POST", S, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 0}]}}, "application/json", True, 422, "spec.ports[0].port"),
    ("POST", S, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"type": "Bogus"}}, "application/json", True, 422, "spec.type"),
    ("POST", C, cm(a=5), "application/json", True, 422, "data[a]"),
    ("POST", C, {**cm(), "metadata": {"name": "cm", "labels": {"a": "b c"}}}, "application/json", True, 422, "metadata.labels.a"),
    ("POST", C, {**cm(), "metadata": {"name": "cm", "labels": {"-x": "1"}}}, "application/json", True, 422, "metadata.labels.-x"),
    ("POST", P, {"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w"}}, "application/json", True, 400, "does not match"),
    ("GET", "/api/v1/widgets", None, "application/json", True, 404, "widgets"),
    ("GET", "/apis/nope.io/v1/things", None, "application/json", True, 404, "could not find"),
    ("POST", P, {**pod(), "metadata": {"name": "p", "namespace": "other"}}, "application/json", True, 400, "namespace of the provided object"),
    ("POST", C + "?fieldValidation=Strict", {**cm(), "spex": 1}, "application/json", True, 400, "unknown field \\\"spex\\\""),
    ("POST", C + "?fieldValidation=Strict", {**cm(), "metadata": {"name": "x", "nmae": "y"}}, "application/json", True, 400, "metadata.nmae"),
    # At any depth, by the kind's schema.
    ("POST", P + "?fieldValidation=Strict", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typo"}, "spec": {"containers": [{"name": "c", "image": "i", "imagee": "x"}]}}, "application/json", True, 400, "spec.containers[0].imagee"),
    ("POST", D + "?fieldValidation=Strict", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "typo"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i", "livenessProbe": {"httpGet": {"port": 80}, "sucessThreshold": 1}}]}}}}, "application/json", True, 400, "livenessProbe.sucessThreshold"),
    ("POST", C + "?fieldValidation=Sometimes", cm(), "application/json", True, 400, "fieldValidation"),
    ("POST", C, cm(big="x" * (2 << 20)), "application/json", True, 413, "limit"),
    ("GET", P + "?labelSelector=a%20b%20c", None, "application/json", True, 400, "labelSelector"),
    ("GET", P + "?labelSelector=x%20in%20a", None, "application/json", True, 400, "labelSelector"),
    ("GET", P + "?fieldSelector=spec.bogus%3Dx", None, "application/json", True, 400, "field label not supported: spec.bogus"),
    ("PUT", C + "/exists", stale, "application/json", True, 409, "has been modified"),
    ("POST", C, cm("exists"), "application/json", True, 409, "already exists"),
    ("GET", P + "/nope", None, "application/json", True, 404, "not found"),
    ("DELETE", P + "/nope", None, "application/json", True, 404, "not found"),
    ("PATCH", C + "/exists", "x", "text/plain", True, 415, "unknown format"),
    ("PATCH", C + "/exists", [{"op": "frobnicate", "path": "/data"}], "application/json-patch+json", True, 422, "operation 0"),
    ("PATCH", C + "/exists", [{"op": "remove", "path": "/nope"}], "application/json-patch+json", True, 422, "does not exist"),
    ("PATCH", C + "/exists", {"op": "add"}, "application/json-patch+json", True, 422, "array of operations"),
    ("PATCH", C + "/missing", {"data": {"a": "b"}}, "application/merge-patch+json", True, 404, "not found"),
    ("PATCH", D + "/scaled", {"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}, "application/strategic-merge-patch+json", True, 422, "merge key"),
    ("PATCH", C + "/exists", "a: [b", "application/apply-patch+yaml", True, 400, "not valid YAML"),
    ("PUT", C + "/exists", cm("other-name"), "application/json", True, 400, "does not match the name"),
    ("POST", C, b"k8s\x00\x0a", "application/vnd.kubernetes.protobuf", True, 400, "protobuf body does not decode"),
    ("POST", C, b"{}", "application/vnd.kubernetes.protobuf", True, 400, "magic"),
    # typeMeta {apiVersion "example.com/v1", kind "Widget"}: a kind without a schema.
    ("POST", C, b"k8s\x00\x0a\x18\x0a\x0eexample.com/v1\x12\x06Widget", "application/vnd.kubernetes.protobuf", True, 400, "no protobuf schema for example.com/v1/Widget"),
    ("POST", C, b"\xa0", "application/cbor", True, 415, "unknown format"),
    ("POST", "/api/v1/namespaces/default/events", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "../../etc"}, "reason": "R"}, "application/json", True, 422, "involvedObject.name"),
    ("POST", "/api/v1/namespaces/default/events", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "other"}, "reason": "R"}, "application/json", True, 422, "involvedObject.namespace"),
    ("POST", "/api/v1/namespaces/default/events", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R", "type": "Bad"}, "application/json", True, 422, "type"),
    ("GET", C + "?watch=true&resourceVersion=abc", None, "application/json", True, 400, "resourceVersion"),
    ("DELETE", C + "/exists?propagationPolicy=Sometimes", None, "application/json", True, 422, "propagationPolicy"),
    ("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "fake"}}, "application/json", True, 405, "observed"),
    ("PUT", D + "/scaled/scale", {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "scaled"}, "spec": {"replicas": -3}}, "application/json", True, 422, "spec.replicas"),
    ("GET", P + "/nope/exec", None, "application/json", True, 404, '\\"nope\\" not found'),
    ("GET", P + "/nope/nosuchsubresource", None, "application/json", True, 404, "nosuchsubresource"),
    ("GET", C + "?limit=1&continue=garbage", None, "application/json", True, 400, "continue"),
    ("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "UPPER"}}, "application/json", True, 422, "metadata.name"),
    ("GET", "/openapi/v2", None, "application/json", True, 404, ""),
    ("DELETE", "/api/v1/namespaces", None, "application/json", True, 405, "not supported"),
    ("DELETE", "/api/v1/nodes", None, "application/json", True, 405, "not supported"),
    ("DELETE", C + "?labelSelector=a%3D%3D%3D", None, "application/json", True, 400, "labelSelector"),
    # Issue #13, hole 6: malformed DeleteOptions and stale preconditions are refused, not
    # ignored; a watch timeout that would overflow the clock is capped; JSON patches cannot
    # amplify an object; quantities, durations, volume names and subPaths are checked.
    ("DELETE", C + "/exists", "{not json", "application/json", True, 400, "DeleteOptions"),
    ("DELETE", C + "/exists", {"preconditions": "x"}, "application/json", True, 422, "preconditions"),
    ("DELETE", C + "/exists", {"preconditions": {"resourceVersion": "1"}}, "application/json", True, 409, "precondition"),
    ("PATCH", C + "/exists", [{"op": "add", "path": "/data/big", "value": "x" * 1000}] + [{"op": "copy", "from": "/data", "path": f"/data/c{i}"} for i in range(40)], "application/json-patch+json", True, 422, "would grow the object"),
    ("POST", P, pod(containers=[{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1e16"}}}]), "application/json", True, 422, "spec.containers[0].resources.limits.cpu"),
    ("POST", P, pod(terminationGracePeriodSeconds=2**64 - 1), "application/json", True, 422, "spec.terminationGracePeriodSeconds"),
    ("POST", P, pod(volumes=[{"name": "../../etc", "emptyDir": {}}]), "application/json", True, 422, "spec.volumes[0].name"),
    ("POST", P, pod(containers=[{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "/etc"}]}], volumes=[{"name": "v", "emptyDir": {}}]), "application/json", True, 422, "subPath"),
    # Issue #35: poison manifests. Counts that once aborted every agent in turn (a 16 TiB
    # allocation for parallelism 2^40), $(VAR) chains that multiply 1 KB by 1000 per step,
    # and one name for an init and an app container.
    ("POST", J, job(parallelism=2**40), "application/json", True, 422, "spec.parallelism: Invalid value: 1099511627776: must be less than or equal to 2147483647"),
    ("POST", J, job(completions=2**62), "application/json", True, 422, "spec.completions"),
    ("POST", J, job(completionMode="Indexed", completions=10**6), "application/json", True, 422, "spec.completions"),
    ("POST", CJ, {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"}, "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": job(parallelism=2**40)["spec"]}}}, "application/json", True, 422, "spec.jobTemplate.spec.parallelism"),
    ("POST", D, deploy(replicas=2**40), "application/json", True, 422, "spec.replicas"),
    ("POST", P, pod(containers=[{"name": "c", "image": "i", "env": [{"name": "A", "value": "x" * 1000}, {"name": "B", "value": "$(A)" * 1000}, {"name": "C", "value": "$(B)" * 1000}]}]), "application/json", True, 422, "spec.containers[0].env[1].value: Invalid value: $(B) expands to more than"),
    ("POST", D, deploy(template={"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "x" * 100000}], "args": ["$(A)"] * 11}]}}), "application/json", True, 422, "spec.template.spec.containers[0].args[9]"),
    ("POST", P, pod(initContainers=[{"name": "c", "image": "i"}]), "application/json", True, 422, "spec.containers[0].name: Duplicate value"),
]

failures = []
for method, path, body, ctype, auth, want, text in cases:
    status, answer = request(method, path, body, ctype, auth)
    problem = None
    if status != want:
        problem = f"status {status}, wanted {want}"
    elif status >= 500:
        problem = "server error"
    elif text and text not in answer:
        problem = f"message lacks {text!r}"
    elif status != 413 and answer.strip().startswith("{") and json.loads(answer).get("kind") != "Status":
        problem = "error is not a Status object"
    if problem:
        failures.append(f"{method} {path[:80]}: {problem}: {answer[:300]}")

# A watch asked to last 2^64 seconds is served (capped), not a crash of the connection.
watch = urllib.request.Request(server + C + "?watch=true&timeoutSeconds=18446744073709551615")
watch.add_header("Authorization", f"Bearer {token}")
with urllib.request.urlopen(watch, context=context, timeout=20) as r:
    assert r.status == 200, r.status

# The server still answers normally after all of that.
assert request("GET", "/healthz", auth=False)[0] == 200
if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"bad requests: all {len(cases)} refused with the right 4xx")
