#!/usr/bin/env bash
# Install (once) the Debian packages a part of the test bed needs; a no-op when they are in.
#
#   hack/install-debs.sh image   podman and mmdebstrap: `make image` without Docker or a registry
#   hack/install-debs.sh node    containerd, runc, CNI plugins, iptables: the real node
#
# Needs root (CI runs as root). `apt-get update` runs only when something is missing.
set -euo pipefail

declare -A SETS=(
  [image]="podman buildah mmdebstrap runc uidmap fuse-overlayfs slirp4netns"
  [node]="containerd runc containernetworking-plugins iptables conntrack socat nftables"
)

want=()
for set in "$@"; do
  [[ -n "${SETS[$set]:-}" ]] || { echo "unknown set '$set' (one of: ${!SETS[*]})" >&2; exit 2; }
  for p in ${SETS[$set]}; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || want+=("$p")
  done
done
[[ ${#want[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "missing Debian packages: ${want[*]}; install them as root (apt-get install ${want[*]})" >&2
  exit 1
fi
echo "installing ${want[*]} ..." >&2
apt-get update -qq
# --no-install-recommends: podman's recommends pull in a whole desktop stack of tools
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >&2
