#!/usr/bin/env bash
# Regenerates k8s.fds, the protobuf descriptors of the Kubernetes API groups Shoal serves
# (`application/vnd.kubernetes.protobuf` bodies, agent/src/api/protobuf.rs).
#
# The .proto files are Kubernetes' own (Apache-2.0, k8s.io/api and k8s.io/apimachinery, release
# 1.35) as the crates.io package k8s-rs-pb 0.5.0 ships them (it renames the packages, e.g.
# `k8s.io.api.core.v1` -> `api.core.v1`; field numbers are upstream's, and only they reach the
# wire). The descriptor set is committed so that a build needs neither protoc nor the package.
# It keeps the files' comments (--include_source_info): the OpenAPI models that `kubectl
# explain` reads take their descriptions and x-kubernetes-* markers from them
# (agent/src/api/openapi.rs).
#
# Needs: cargo, protoc (apt-get install protobuf-compiler).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src"
cat >"$scratch/Cargo.toml" <<'TOML'
[package]
name = "fetch-k8s-protos"
version = "0.0.0"
edition = "2021"
[dependencies]
k8s-rs-pb = { version = "=0.5.0", default-features = false }
TOML
echo 'fn main() {}' >"$scratch/src/main.rs"
cargo fetch --manifest-path "$scratch/Cargo.toml" >/dev/null
src="$(cargo metadata --manifest-path "$scratch/Cargo.toml" --format-version 1 |
    python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="k8s-rs-pb"))')"
protos="$(dirname "$src")/src/v1_35"
cd "$protos"
protoc -I . --include_imports --include_source_info -o "$here/k8s.fds" \
    api/core/v1/generated.proto \
    api/apps/v1/generated.proto \
    api/batch/v1/generated.proto \
    api/autoscaling/v1/generated.proto \
    api/autoscaling/v2/generated.proto \
    api/discovery/v1/generated.proto \
    api/events/v1/generated.proto \
    api/policy/v1/generated.proto \
    api/coordination/v1/generated.proto \
    api/rbac/v1/generated.proto \
    api/authorization/v1/generated.proto \
    api/authentication/v1/generated.proto \
    api/storage/v1/generated.proto \
    apimachinery/pkg/apis/meta/v1/generated.proto 2>/dev/null
echo "wrote $here/k8s.fds ($(wc -c <"$here/k8s.fds") bytes)"
