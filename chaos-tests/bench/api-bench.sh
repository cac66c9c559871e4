#!/usr/bin/env bash
# API latency under load: a 3-agent cluster (release build) with 1,000 pods in the store; wrk
# (Debian) drives GET of one pod, LIST of the namespace's pods, and CREATE of new pods against
# one agent's HTTPS API, with the cluster's bearer token. Prints wrk's latency distribution.
#
#   chaos-tests/bench/api-bench.sh [DURATION] [CONNECTIONS]     (defaults: 20s, 16)
#   AUTHZ=1 chaos-tests/bench/api-bench.sh …   GET and LIST as the administrator and as a
#                                               ServiceAccount among 1,000 RoleBindings
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-20s}
connections=${2:-16}
command -v wrk >/dev/null || { echo "wrk is required: apt-get install -y wrk" >&2; exit 1; }
cargo build --release --locked --quiet -p shoal-agent --bin shoal
shoal=target/release/shoal
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # Agents ran with --cleanup (bridge, routes, nftables table); reset removes the pod sandboxes.
  for i in 1 2 3; do "$shoal" reset --data-dir "$dir/n$i" >/dev/null 2>&1 || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
"$shoal" init --secret-file "$dir/secret" >/dev/null
for i in 1 2 3; do
  join=()
  [ "$i" -gt 1 ] && join=(--join 127.0.0.1:7651)
  "$shoal" agent --name "node-$i" --data-dir "$dir/n$i" --secret-file "$dir/secret" \
    --bind "127.0.0.1:765$i" --api "127.0.0.1:645$i" --cleanup "${join[@]}" >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do
  "$shoal" kubeconfig --data-dir "$dir/n1" >"$dir/kc" 2>/dev/null && break
  sleep 0.1
done
TOKEN=$(sed -n 's/^    token: //p' "$dir/kc")
export TOKEN
api=https://127.0.0.1:6451
echo "loading 1,000 pods..."
python3 - "$api" "$TOKEN" <<'PY'
import json, ssl, sys, urllib.request
api, token = sys.argv[1], sys.argv[2]
ctx = ssl._create_unverified_context()
for i in range(1000):
    body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}", "labels": {"app": "bench"}},
                       "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}).encode()
    req = urllib.request.Request(api + "/api/v1/namespaces/default/pods", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    urllib.request.urlopen(req, context=ctx).read()
PY
auth="Authorization: Bearer $TOKEN"
# CPU seconds (user + system) the agent serving the API has used so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/${pids[0]}/stat"; }
# wrk, then the serving agent's CPU per request over the run.
measure() {
  local before after out requests
  before=$(cpu)
  out=$(wrk --latency -t2 -c"$connections" -d"$duration" "$@")
  after=$(cpu)
  echo "$out"
  requests=$(echo "$out" | awk '/requests in/ { print $1 }')
  awk -v b="$before" -v a="$after" -v n="$requests" 'BEGIN { printf "server CPU: %.2f s for %d requests = %.2f ms per request\n", a - b, n, (a - b) * 1000 / n }'
}
if [ "${AUTHZ:-0}" = 1 ]; then
  # Authorization's cost (issue #40): the same GET and LIST with the administrator's token
  # (system:masters, never authorized) and with a ServiceAccount's token (verified, then
  # authorized by RBAC) among 1,000 RoleBindings, back to back in one run.
  echo "loading 1,000 RoleBindings and a ServiceAccount allowed to read pods..."
  SA_TOKEN=$(python3 - "$api" "$TOKEN" <<'PY'
import json, ssl, sys, urllib.request
api, token = sys.argv[1], sys.argv[2]
ctx = ssl._create_unverified_context()
def call(path, body):
    req = urllib.request.Request(api + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, context=ctx).read())
rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/default"
call(rbac + "/roles", {"metadata": {"name": "reader"},
     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
for i in range(1000):
    call(rbac + "/rolebindings", {"metadata": {"name": f"user-{i}"}, "subjects": [{"kind": "User", "name": f"user-{i}"}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}})
call("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": "bench"}})
call(rbac + "/rolebindings", {"metadata": {"name": "bench"}, "subjects": [{"kind": "ServiceAccount", "name": "bench", "namespace": "default"}],
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}})
print(call("/api/v1/namespaces/default/serviceaccounts/bench/token", {"spec": {}})["status"]["token"])
PY
)
  for who in admin serviceaccount; do
    header=$auth
    [ "$who" = serviceaccount ] && header="Authorization: Bearer $SA_TOKEN"
    echo; echo "== GET one pod as $who ($connections connections, $duration)"
    measure -H "$header" "$api/api/v1/namespaces/default/pods/pod-500"
    echo; echo "== LIST 1,000 pods as $who ($connections connections, $duration)"
    measure -H "$header" -H "Accept: application/json" "$api/api/v1/namespaces/default/pods"
  done
  exit 0
fi

echo; echo "== GET one pod ($connections connections, $duration)"
wrk --latency -t2 -c"$connections" -d"$duration" -H "$auth" "$api/api/v1/namespaces/default/pods/pod-500"
echo; echo "== LIST 1,000 pods, JSON ($connections connections, $duration)"
measure -H "$auth" -H "Accept: application/json" "$api/api/v1/namespaces/default/pods"
echo; echo "== LIST 1,000 pods, protobuf, as client-go's typed clients ask ($connections connections, $duration)"
measure -H "$auth" -H "Accept: application/vnd.kubernetes.protobuf, */*" "$api/api/v1/namespaces/default/pods"
echo; echo "== LIST 1,000 pods as a Table, as kubectl get asks ($connections connections, $duration)"
wrk --latency -t2 -c"$connections" -d"$duration" -H "$auth" -H "Accept: application/json;as=Table;v=v1;g=meta.k8s.io" "$api/api/v1/namespaces/default/pods?limit=500"
echo; echo "== CREATE pods (write quorum 2 of 3 agents; $connections connections, $duration)"
wrk --latency -t2 -c"$connections" -d"$duration" -s chaos-tests/bench/create-pod.lua "$api"
