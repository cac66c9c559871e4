#!/usr/bin/env bash
# Builds Shoal's test images from Debian's busybox-static as OCI image archives (what
# `skopeo copy … oci-archive:` produces) and, with DOCKER=1, `docker save` archives too.
#
#   examples/images/build.sh [OUT_DIR]          # default OUT_DIR: target/images
#   DOCKER=1 examples/images/build.sh [OUT_DIR] # also docker-save archives
#
# Images (all one 2 MB busybox binary plus applet links; deterministic bytes):
#   shoal.local/busybox:1   sh, sleep, nc, wget, … (Cmd: sh)
#   shoal.local/httpd:1     busybox layer + a second layer with /www (Cmd: httpd -f -p 8080 -h /www)
#   shoal.local/python-kube:1  with PYTHON_KUBE=1 (only it): busybox + python3 and the
#                           official Kubernetes client, copied from this machine
set -euo pipefail

out=$(realpath -m "${1:-target/images}")
busybox=${BUSYBOX:-/bin/busybox}
# The image needs a static busybox: nothing else goes into the root filesystem.
is_static() { [ -x "$1" ] && case "$(ldd "$1" 2>&1 || true)" in *"not a dynamic"*) true ;; *) false ;; esac; }
if ! is_static "$busybox"; then
  command -v apt-get >/dev/null && apt-get install -y busybox-static >/dev/null
fi
if ! is_static "$busybox"; then
  echo "build.sh: $busybox is not a static busybox (apt-get install busybox-static)" >&2
  exit 1
fi

arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
blobs="$work/layout/blobs/sha256"
mkdir -p "$blobs"

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# Adds FILE to the blob store; prints its hex digest.
add_blob() {
  local d; d=$(sha "$1")
  cp "$1" "$blobs/$d"
  echo "$d"
}

# Tars DIR reproducibly into a gzip layer; sets LAYER_DIGEST, LAYER_SIZE, DIFF_ID.
make_layer() {
  local dir=$1 name=$2
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
      --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
      -C "$dir" -cf "$work/$name.tar" .
  DIFF_ID=$(sha "$work/$name.tar")
  gzip -n -9 -c "$work/$name.tar" > "$work/$name.tar.gz"
  LAYER_DIGEST=$(add_blob "$work/$name.tar.gz")
  LAYER_SIZE=$(size "$work/$name.tar.gz")
  cp "$work/$name.tar" "$work/$DIFF_ID.rawtar"
}

# Root filesystem of the base layer.
base="$work/base"
mkdir -p "$base"/{bin,etc,tmp,proc,sys,dev,root,home,var/www}
chmod 1777 "$base/tmp"
cp "$busybox" "$base/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$base/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/sh\n' > "$base/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$base/etc/group"
make_layer "$base" base
base_digest=$LAYER_DIGEST base_size=$LAYER_SIZE base_diff=$DIFF_ID

www="$work/www"
mkdir -p "$www/www"
echo 'hello from shoal' > "$www/www/index.html"
make_layer "$www" www
www_digest=$LAYER_DIGEST www_size=$LAYER_SIZE www_diff=$DIFF_ID

LAYER='application/vnd.oci.image.layer.v1.tar+gzip'
CONFIG='application/vnd.oci.image.config.v1+json'
MANIFEST='application/vnd.oci.image.manifest.v1+json'

# image NAME TAG CMD_JSON LAYERS(digest:size:diff …) → OCI archive + docker archive.
image() {
  local name=$1 tag=$2 cmd=$3; shift 3
  local diffs="" layers="" sep="" first=1
  for l in "$@"; do
    IFS=: read -r d s i <<<"$l"
    diffs+="$sep\"sha256:$i\""
    layers+="$sep{\"mediaType\":\"$LAYER\",\"digest\":\"sha256:$d\",\"size\":$s}"
    sep=,
  done
  printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":[%s]},"history":[]}' \
    "$arch" "$cmd" "$diffs" > "$work/config.json"
  local cd cs; cd=$(add_blob "$work/config.json"); cs=$(size "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"%s","config":{"mediaType":"%s","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$MANIFEST" "$CONFIG" "$cd" "$cs" "$layers" > "$work/manifest.json"
  local md ms; md=$(add_blob "$work/manifest.json"); ms=$(size "$work/manifest.json")

  # OCI archive: a tar of an image layout holding just this image.
  local lay="$work/oci-$tag-${name//\//_}"
  rm -rf "$lay"; mkdir -p "$lay/blobs/sha256"
  for b in "$cd" "$md"; do cp "$blobs/$b" "$lay/blobs/sha256/"; done
  for l in "$@"; do cp "$blobs/${l%%:*}" "$lay/blobs/sha256/"; done
  echo '{"imageLayoutVersion":"1.0.0"}' > "$lay/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"%s","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s:%s"},"platform":{"architecture":"%s","os":"linux"}}]}' \
    "$MANIFEST" "$md" "$ms" "$name" "$tag" "$arch" > "$lay/index.json"
  local file="$out/$(basename "$name")-$tag.oci.tar"
  # Written aside and renamed: tests running at once may be reading the previous archive.
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$lay" -cf "$file.$$" oci-layout index.json blobs
  mv -f "$file.$$" "$file"
  echo "$file  $name:$tag  sha256:$md"

  # docker save: uncompressed layer tars under <diff>/layer.tar, config <hex>.json, manifest.json.
  if [ "${DOCKER:-0}" = 1 ]; then
    local dk="$work/docker-$tag-${name//\//_}" paths="" sep2=""
    rm -rf "$dk"; mkdir -p "$dk"
    cp "$work/config.json" "$dk/$cd.json"
    for l in "$@"; do
      IFS=: read -r d s i <<<"$l"
      mkdir -p "$dk/$i"; cp "$work/$i.rawtar" "$dk/$i/layer.tar"
      paths+="$sep2\"$i/layer.tar\""; sep2=,
    done
    printf '[{"Config":"%s.json","RepoTags":["%s:%s"],"Layers":[%s]}]' "$cd" "$name" "$tag" "$paths" > "$dk/manifest.json"
    local dfile="$out/$(basename "$name")-$tag.docker.tar"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dk" -cf "$dfile.$$" .
    mv -f "$dfile.$$" "$dfile"
    echo "$dfile  $name:$tag (docker save)"
  fi
}

# PYTHON_KUBE=1: only shoal.local/python-kube:1, the busybox layer and a second one holding
# this machine's python3 with the official Kubernetes client (`pip install kubernetes`): the
# interpreter, its shared libraries (`ldd`), the standard library without its tests and
# tools, and the site-packages the client imports. For the in-cluster client tests.
if [ "${PYTHON_KUBE:-0}" = 1 ]; then
  py="$work/python"
  mkdir -p "$py"
  python3 - "$py" <<'PY'
import os, shutil, sys, sysconfig
from kubernetes import client, config  # what the image must be able to import
import kubernetes.config.incluster_config, ssl, json, http.client, encodings.idna  # noqa
root = sys.argv[1]
def put(path):
    dest = root + os.path.realpath(path)
    if os.path.isdir(path):
        shutil.copytree(path, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test", "tests"))
    elif os.path.exists(path):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(path, dest)
    return dest
stdlib = sysconfig.get_paths()["stdlib"]
site = sysconfig.get_paths()["purelib"]
skip = {"site-packages", "test", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo",
        "pydoc_data", "__pycache__", "lib-dynload"}
for name in os.listdir(stdlib):
    if name not in skip and not name.startswith("config-"):
        put(os.path.join(stdlib, name))
dynload = os.path.join(stdlib, "lib-dynload")
for name in os.listdir(dynload):
    if not name.startswith("_tkinter"):
        put(os.path.join(dynload, name))
tops = set()
for m in list(sys.modules.values()):
    f = getattr(m, "__file__", None) or ""
    if f.startswith(site + os.sep):
        tops.add(f[len(site) + 1:].split(os.sep)[0])
for top in sorted(tops):
    put(os.path.join(site, top))
exe = os.path.realpath(sys.executable)
put(exe)
os.makedirs(root + "/usr/bin", exist_ok=True)
os.symlink(exe, root + "/usr/bin/python3")
print(exe)
PY
  # The shared libraries of the interpreter and of every extension module, at their paths.
  # (ldd reads the machine's copy of each: the same file, at the path it is copied from.)
  { find "$py" -name '*.so*' -type f; find "$py" -path '*/bin/python3*' -type f; } |
    while read -r o; do
      ldd "${o#"$py"}" 2>/dev/null | grep -o '/[^ ]*' || true
    done | sort -u > "$work/libs"
  while read -r lib; do
    [ -e "$lib" ] || continue
    mkdir -p "$py$(dirname "$lib")"
    cp -L "$lib" "$py$lib"
  done < "$work/libs"
  make_layer "$py" python
  image shoal.local/python-kube 1 '["python3"]' \
    "$base_digest:$base_size:$base_diff" "$LAYER_DIGEST:$LAYER_SIZE:$DIFF_ID"
  exit 0
fi

image shoal.local/busybox 1 '["sh"]' "$base_digest:$base_size:$base_diff"
image shoal.local/httpd 1 '["httpd","-f","-v","-p","8080","-h","/www"]' \
  "$base_digest:$base_size:$base_diff" "$www_digest:$www_size:$www_diff"
