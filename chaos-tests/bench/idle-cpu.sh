#!/usr/bin/env bash
# Idle cost: 3 agents (release build, or $SHOAL), $PODS pods (default 1,000) whose image no node
# has, then each agent's CPU over 10 s of idling.
#
#   PODS=300 chaos-tests/bench/idle-cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${SHOAL:-}" ] || cargo build --release --locked --quiet -p shoal-agent --bin shoal
shoal=${SHOAL:-target/release/shoal}
dir=$(mktemp -d)
pids=()
# SIGTERM (agents run with --cleanup: bridge, routes, nftables table go), then `shoal reset` for
# the pod sandboxes (network namespaces, cgroups), so a run leaves nothing on the host.
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for i in 1 2 3; do "$shoal" reset --data-dir "$dir/n$i" >/dev/null 2>&1 || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
"$shoal" init --secret-file "$dir/secret" >/dev/null
for i in 1 2 3; do
  join=(); [ "$i" -gt 1 ] && join=(--join 127.0.0.1:7751)
  "$shoal" agent --name "node-$i" --data-dir "$dir/n$i" --secret-file "$dir/secret" --bind "127.0.0.1:775$i" --api "127.0.0.1:655$i" --cleanup "${join[@]}" >"$dir/n$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do "$shoal" kubeconfig --data-dir "$dir/n1" >"$dir/kc" 2>/dev/null && break; sleep 0.1; done
TOKEN=$(sed -n 's/^    token: //p' "$dir/kc")
python3 - https://127.0.0.1:6551 "$TOKEN" <<'PY'
import json, ssl, sys, urllib.request
api, token = sys.argv[1], sys.argv[2]
ctx = ssl._create_unverified_context()
for i in range(int(__import__("os").environ.get("PODS", "1000"))):
    body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{i}"}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}).encode()
    req = urllib.request.Request(api + "/api/v1/namespaces/default/pods", data=body, method="POST", headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    urllib.request.urlopen(req, context=ctx).read()
PY
sleep 5
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; }
b=(); for p in "${pids[@]}"; do b+=("$(cpu "$p")"); done
sleep 10
i=0; for p in "${pids[@]}"; do echo "agent $i: $(awk -v a="$(cpu "$p")" -v b="${b[$i]}" 'BEGIN{print a-b}') s CPU in 10 s idle"; i=$((i+1)); done


