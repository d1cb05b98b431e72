#!/usr/bin/env bash
# Build (once) or reuse the test bed's binaries: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, etcd, kwok, helm, CoreDNS, versitygw, kube-score (the
# chart's lint) and promtool (the chart's alert rules are unit-tested with `promtool test
# rules`), pinned by version and cached outside the work tree.
#
#   hack/testbed-bin.sh            build whatever is missing, print the bin directory
#   hack/testbed-bin.sh etcd ...   only those parts (helm kwok etcd versitygw kube-score promtool kube
#                                  coredns)
#   hack/testbed-bin.sh --print    print the bin directory only (no build)
#
# A binary added to a part builds alone: the others are found in the bin directory and
# kept (the directory is named by the versions of the first four, not by its contents).
# kubelet and kube-proxy are the real node's (src/o41/testbed/node.py); CoreDNS, its
# cluster DNS, lives in a directory of its own version and is linked into the bin directory.
#
# Why a throwaway module for Kubernetes: k8s.io/kubernetes replaces its ~33 staging modules
# with ./staging paths, so `go install` refuses it. Every staging module is also published as
# v0.X.Y, so a module that requires k8s.io/kubernetes v1.X.Y and replaces each staging module
# with k8s.io/<name> v0.X.Y builds the real binaries.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
HELM_VERSION=${HELM_VERSION:-v3.20.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.6} # what kubeadm v1.37 deploys
VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
KUBE_SCORE_VERSION=${KUBE_SCORE_VERSION:-v1.20.0} # the chart's lint (tests/test_chart_hygiene.py)
# Debian bookworm's prometheus package, of which only promtool is kept (never installed:
# no service, no user); the alert rules and their tests use nothing newer than 2.42.
PROMTOOL_DEB=${PROMTOOL_DEB:-prometheus}

CACHE=${O41_CACHE:-$HOME/.cache/o41}
BIN="$CACHE/bin/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
BUILD="$CACHE/build"
LOG="$CACHE/build.log"

if [[ "${1:-}" == "--print" ]]; then echo "$BIN"; exit 0; fi
mkdir -p "$BIN" "$BUILD"
# one build at a time on this machine: a second caller waits, then finds the binaries
exec 9>"$CACHE/build.lock"
flock 9
export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0

timed() { # timed NAME CMD...: run CMD, log wall time and peak memory
  local name=$1; shift
  echo "building $name ..." >&2
  local one="$BUILD/$name.time"
  /usr/bin/time -f "$name: %e s wall, %M KB peak RSS" -o "$one" "$@" >&2
  cat "$one" >>"$LOG"
  cat "$one" >&2
}

build_kube() {
  local need=()
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [[ -x "$BIN/$b" ]] || need+=("k8s.io/kubernetes/cmd/$b")
  done
  [[ ${#need[@]} -eq 0 ]] && return 0
  local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  local staging=v0.${KUBE_VERSION#v1.}
  local dir="$BUILD/kube-$KUBE_VERSION"
  mkdir -p "$dir"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module o41.local/testbed/kube"
    echo
    grep -E '^go ' "$gomod"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    grep -E '=> \./staging/' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } > "$dir/go.mod"
  # -mod=mod lets go build fill in go.sum and the indirect requirements.
  (cd "$dir" && timed kube go build -mod=mod -o "$BIN/" -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$minor \
      -X k8s.io/component-base/version.gitTreeState=clean" "${need[@]}")
}

build_etcd() {
  [[ -x "$BIN/etcd" ]] && return 0
  # etcd's server module has replace directives of its own, so `go install` refuses it;
  # in a throwaway module those of a dependency are ignored and the build works.
  local dir="$BUILD/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  (cd "$dir" && { [[ -f go.mod ]] || go mod init o41.local/testbed/etcd >/dev/null 2>&1; } \
    && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 \
    && timed etcd go build -mod=mod -o "$BIN/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  [[ -x "$BIN/kwok" ]] && return 0
  GOBIN="$BIN" timed kwok go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

build_helm() {
  # The Kubernetes version `helm template` and `helm lint` assume without a cluster is set
  # at link time, as helm's Makefile does (from its client-go, v0.35 for v3.20): without it
  # helm says v1.20.0 and refuses the chart's kubeVersion. A stamp file carries the flags.
  local kv=1.35 stamp="$BIN/helm.kube-version"
  [[ -x "$BIN/helm" && "$(cat "$stamp" 2>/dev/null)" == "$kv" ]] && return 0
  local flags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/chartutil pkg/lint/rules; do
    flags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=${kv%%.*} -X helm.sh/helm/v3/$pkg.k8sVersionMinor=${kv#*.}"
  done
  # built aside and renamed into place: a helm another test runs now is never overwritten
  local tmp="$BUILD/helm-gobin"
  rm -rf "$tmp" && mkdir -p "$tmp"
  GOBIN="$tmp" timed helm go install -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv -f "$tmp/helm" "$BIN/helm"
  echo "$kv" > "$stamp"
}

build_coredns() {
  local dir="$CACHE/bin/coredns-$COREDNS_VERSION"
  if [[ ! -x "$dir/coredns" ]]; then
    mkdir -p "$dir"
    GOBIN="$dir" timed coredns go install -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  fi
  ln -sfn "$dir/coredns" "$BIN/coredns"
}

build_versitygw() {
  # The S3 stand-in that checks SigV4 (Apache-2.0; no replace directives, so `go install`).
  # The bin directory's name doesn't carry its version: a stamp file does, so a new pin
  # rebuilds it.
  local stamp="$BIN/versitygw.version"
  [[ -x "$BIN/versitygw" && "$(cat "$stamp" 2>/dev/null)" == "$VERSITYGW_VERSION" ]] && return 0
  GOBIN="$BIN" timed versitygw go install -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION" \
    "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  echo "$VERSITYGW_VERSION" > "$stamp"
}

build_kube_score() {
  # The chart's static checks (docs/chart.md, "Hygiene"). A stamp file carries its version.
  local stamp="$BIN/kube-score.version"
  [[ -x "$BIN/kube-score" && "$(cat "$stamp" 2>/dev/null)" == "$KUBE_SCORE_VERSION" ]] && return 0
  GOBIN="$BIN" timed kube-score go install -ldflags "-s -w -X main.version=$KUBE_SCORE_VERSION" \
    "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION"
  echo "$KUBE_SCORE_VERSION" > "$stamp"
}

build_promtool() {
  # Prometheus's rule unit tester, for the chart's PrometheusRule: the binary out of
  # Debian's package (apt-get download + dpkg-deb -x, nothing installed on the machine).
  # A stamp file carries the package's version.
  local stamp="$BIN/promtool.version" version
  version=$(apt-cache policy "$PROMTOOL_DEB" 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [[ -z "$version" || "$version" == "(none)" ]]; then
    apt-get update -qq >&2
    version=$(apt-cache policy "$PROMTOOL_DEB" | sed -n 's/^ *Candidate: //p')
  fi
  [[ -x "$BIN/promtool" && "$(cat "$stamp" 2>/dev/null)" == "$version" ]] && return 0
  local tmp="$BUILD/promtool-deb"
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$tmp" && timed promtool sh -c "apt-get download -qq '$PROMTOOL_DEB=$version' \
      && dpkg-deb --fsys-tarfile ${PROMTOOL_DEB}_*.deb | tar -x ./usr/bin/promtool")
  mv -f "$tmp/usr/bin/promtool" "$BIN/promtool"
  rm -rf "$tmp"
  echo "$version" > "$stamp"
}

# Two lanes: the kube binaries (one `go build`, the longest) and the rest one after the
# other. go build already uses both cores, but each build also waits on module downloads
# and links on one core: the lanes fill those gaps. The Go build cache is shared.
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(etcd helm kwok versitygw kube-score promtool coredns kube)
for part in "${parts[@]}"; do
  case "$part" in
    helm|kwok|etcd|kube|coredns|versitygw|promtool|kube-score) ;;
    *) echo "unknown part '$part' (helm kwok etcd versitygw kube-score promtool kube coredns)" >&2; exit 2 ;;
  esac
done
lane() { local part; for part in "$@"; do "build_${part//-/_}"; done; }
small=()
kube=no
for part in "${parts[@]}"; do [[ "$part" == kube ]] && kube=yes || small+=("$part"); done
if [[ $kube == yes && ${#small[@]} -gt 0 ]]; then
  lane kube & kube_pid=$!
  lane "${small[@]}"
  wait "$kube_pid"
elif [[ $kube == yes ]]; then
  lane kube
else
  lane "${small[@]}"
fi
echo "$BIN"
