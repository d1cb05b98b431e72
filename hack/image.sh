#!/usr/bin/env bash
# Build the project's images with podman, without Docker and without any registry.
#
#   hack/image.sh          build what is missing; print "name=ref" lines (app, etcd, pause)
#   hack/image.sh --print  print those lines only (no build)
#   hack/image.sh --env    print the podman environment (eval it to use this podman storage)
#
# - app: the repo's Dockerfile, unchanged. Its base (python:3.11-slim-bookworm) is made here
#   from Debian's own packages by mmdebstrap and imported under that name; the build runs
#   with --pull=never, so nothing is ever fetched from a registry. The host's CA bundle is
#   mounted for pip (PyPI through this machine's TLS setup). Debian's Python is 3.11.2, not
#   the official image's 3.11.x: what the image runs is Debian's.
# - etcd: FROM scratch, the test bed's etcd and etcdutl (hack/testbed-bin.sh), uid 10001,
#   at the official image's paths; also tagged as the official image the Dockerfile copies
#   etcdutl from (ETCD_PUBLIC), so the app's build takes it from here with --pull=never.
# - pause: the pod sandbox's pause, a static build of Kubernetes' own pause.c.
#
# Cached by content: each tag is a hash of what goes into the image, and a build happens
# only when no image of that tag exists. Each image is also saved as a docker-archive under
# $CACHE/images/ (containerd imports those). podman's config and storage are the project's
# own, under $CACHE/podman: the machine's /etc/containers and /var/lib/containers are never used.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${O41_CACHE:-$HOME/.cache/o41}
PODMAN_DIR="$CACHE/podman"
IMAGES="$CACHE/images"
LOG="$CACHE/build.log"
SUITE=bookworm
BASE_TAG=docker.io/library/python:3.11-slim-bookworm # the Dockerfile's FROM
BASE_PACKAGES=python3,python3-pip,python-is-python3,ca-certificates
APP_REPO=localhost/o41-artifacts
PUBLIC_NAME=ghcr.io/o41/o41-artifacts # the chart's default repository
PAUSE_VERSION=3.10.2 # what kubeadm v1.37 uses
ETCD_PUBLIC=quay.io/coreos/etcd # the Dockerfile's ETCD_IMAGE, at the pinned ETCD_VERSION

podman_env() {
  cat <<EOF
export CONTAINERS_CONF=$PODMAN_DIR/containers.conf
export CONTAINERS_STORAGE_CONF=$PODMAN_DIR/storage.conf
export CONTAINERS_REGISTRIES_CONF=$PODMAN_DIR/registries.conf
EOF
}

write_podman_config() {
  mkdir -p "$PODMAN_DIR"/{storage,run,networks,tmp}
  # runc: crun refuses this kernel's hybrid cgroups. No CAP_SYS_RESOURCE here, so podman's
  # default ulimits fail: set ones the machine allows. Host network: no bridge and no
  # iptables rule of podman's (netavark/CNI) is ever made.
  cat >"$PODMAN_DIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=30000:30000"]
netns = "host"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$PODMAN_DIR/events.log"
tmp_dir = "$PODMAN_DIR/tmp"
[network]
network_config_dir = "$PODMAN_DIR/networks"
EOF
  cat >"$PODMAN_DIR/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_DIR/storage"
runroot = "$PODMAN_DIR/run"
EOF
  # no registry to search: a short name resolves only to an image already stored here
  cat >"$PODMAN_DIR/registries.conf" <<EOF
unqualified-search-registries = []
short-name-mode = "disabled"
EOF
}

hash_of() { sha256sum | cut -c1-12; }

# Everything the Dockerfile's context lets in (see .dockerignore), and the Dockerfile.
app_hash() {
  { cat Dockerfile .dockerignore pyproject.toml README.md requirements/lock.txt
    find src -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' ! -name '*.pyc' \
      -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    echo "base $(base_hash)"
    echo "etcd $(etcd_ref)"; } | hash_of # etcdutl comes from the etcd image
}
base_hash() { echo "$SUITE $BASE_PACKAGES hook-v1" | hash_of; }
etcd_bin() { echo "$(hack/testbed-bin.sh --print)/etcd"; }
etcdutl_bin() { echo "$(hack/testbed-bin.sh --print)/etcdutl"; }
pinned() { sed -n "s/^$1=\${$1:-\(.*\)}\$/\1/p" hack/testbed-bin.sh; }
# Kubernetes' own pause.c, from the module the test bed's kube binaries are built from
pause_src() {
  local dir
  dir=$(go mod download -json "k8s.io/kubernetes@$(pinned KUBE_VERSION)" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  echo "$dir/build/pause/linux/pause.c"
}

app_ref() { echo "$APP_REPO:$(app_hash)"; }
etcd_ref() {
  local v; v=$(pinned ETCD_VERSION)
  if [[ -x "$(etcd_bin)" && -x "$(etcdutl_bin)" ]]; then
    echo "localhost/o41-etcd:$v-$(cat "$(etcd_bin)" "$(etcdutl_bin)" | sha256sum | cut -c1-8)"
  else
    echo "localhost/o41-etcd:$v-unbuilt"
  fi
}
pause_ref() { echo "localhost/o41-pause:$PAUSE_VERSION"; }

refs() {
  echo "app=$(app_ref)"
  echo "etcd=$(etcd_ref)"
  echo "pause=$(pause_ref)"
}

timed() { # timed NAME CMD...: run CMD, log wall time and peak memory
  local name=$1; shift
  echo "building $name ..." >&2
  /usr/bin/time -f "$name: %e s wall, %M KB peak RSS" -a -o "$LOG" "$@" >&2
  tail -n 1 "$LOG" >&2
}

have() { podman image exists "$1"; }

# docker-archive of an image, for `ctr images import`; made once per tag
save() {
  local ref=$1 file; file="$IMAGES/$(echo "$ref" | tr '/:' '__').tar"
  [[ -s "$file" ]] && return 0
  podman save --format docker-archive -o "$file.part" "$ref" >&2
  mv "$file.part" "$file"
}

build_base() {
  local stamp; stamp="$IMAGES/base-$(base_hash).stamp"
  if [[ -f "$stamp" ]] && have "$BASE_TAG"; then return 0; fi
  local tar="$CACHE/build/base-$(base_hash).tar"
  mkdir -p "$CACHE/build"
  # PEP 668: Debian marks its Python externally managed, and pip refuses to install; the
  # image is the one environment, so the marker goes. apt's lists and the docs go too.
  timed base-image mmdebstrap --variant=minbase --include="$BASE_PACKAGES" \
    --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/*' \
    "$SUITE" "$tar" \
    "deb http://deb.debian.org/debian $SUITE main" \
    "deb http://deb.debian.org/debian $SUITE-updates main" \
    "deb http://deb.debian.org/debian-security $SUITE-security main" >&2
  podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$tar" "$BASE_TAG" >&2
  rm -f "$tar"
  touch "$stamp"
}

build_app() {
  local ref; ref=$(app_ref)
  if ! have "$ref" || ! have "$PUBLIC_NAME:$(app_version)"; then
    build_base
    timed app-image podman build --pull=never --network=host \
      -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
      -t "$ref" -t "$PUBLIC_NAME:$(app_version)" . >&2
  fi
  save "$ref"
  prune "$APP_REPO" "$ref"
}

# Images of older sources, and the build stages left untagged, go (with their archives):
# the cache keeps the images of the current sources only.
prune() {
  local repo=$1 keep=$2 old
  for old in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=$repo"); do
    [[ "$old" == "$keep" || "$old" != "$repo:"* ]] && continue
    podman rmi "$old" >/dev/null
    rm -f "$IMAGES/$(echo "$old" | tr '/:' '__').tar"
  done
  podman image prune -f >/dev/null
}

app_version() { sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml; }

build_etcd() {
  local ref; ref=$(etcd_ref)
  [[ "$ref" == *-unbuilt ]] && hack/testbed-bin.sh etcd >/dev/null && ref=$(etcd_ref)
  if ! have "$ref"; then
    local ctx; ctx=$(mktemp -d "$CACHE/build/etcd-image.XXXX")
    cp "$(etcd_bin)" "$ctx/etcd"
    cp "$(etcdutl_bin)" "$ctx/etcdutl"
    # etcd writes only its data dir (a volume); numeric ids so runAsNonRoot can check them
    printf 'FROM scratch\nCOPY etcd etcdutl /usr/local/bin/\nUSER 10001:10001\nENTRYPOINT ["/usr/local/bin/etcd"]\n' >"$ctx/Containerfile"
    timed etcd-image podman build --pull=never --network=host -t "$ref" "$ctx" >&2
    rm -rf "$ctx"
  fi
  podman tag "$ref" "$ETCD_PUBLIC:$(pinned ETCD_VERSION)" >&2
  save "$ref"
}

build_pause() {
  local ref; ref=$(pause_ref)
  if ! have "$ref"; then
    local src; src=$(pause_src)
    local ctx; ctx=$(mktemp -d "$CACHE/build/pause-image.XXXX")
    gcc -static -Os -Wall -Werror -DVERSION="$PAUSE_VERSION" -o "$ctx/pause" "$src"
    strip "$ctx/pause"
    printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$ctx/Containerfile"
    timed pause-image podman build --pull=never --network=host -t "$ref" "$ctx" >&2
    rm -rf "$ctx"
  fi
  save "$ref"
}

write_podman_config
eval "$(podman_env)"
case "${1:-}" in
  --print) refs; exit 0 ;;
  --env) podman_env; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print|--env]" >&2; exit 2 ;;
esac
hack/install-debs.sh image
mkdir -p "$IMAGES" "$CACHE/build"
build_pause
build_etcd
build_app
refs
