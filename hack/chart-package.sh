#!/usr/bin/env bash
# Package both charts (o41-artifacts, o41-remote) as the image is versioned: chart version
# and appVersion are the project's version (pyproject.toml, o41.__version__), which is the
# image's tag (hack/image.sh tags ghcr.io/o41/o41-artifacts:<version>), so the chart's
# default image.tag (its appVersion) is the image built from the same commit.
#
#   hack/chart-package.sh [DIR]              package into DIR (default dist/charts), print the files
#   hack/chart-package.sh [DIR] --push REF   and push both with `helm push` to an OCI
#                                            registry, e.g. oci://registry.example.com/charts
#
# helm is the test bed's (hack/testbed-bin.sh, built from the Go module proxy); `helm
# registry login` first for a registry that wants credentials.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist/charts
push=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --push) push=${2:?--push needs an oci:// reference}; shift 2 ;;
    *) out=$1; shift ;;
  esac
done
[[ -z "$push" || "$push" == oci://* ]] || { echo "--push takes an oci:// reference, not $push" >&2; exit 2; }

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
[[ -n "$version" ]] || { echo "no version in pyproject.toml" >&2; exit 1; }
helm="$(hack/testbed-bin.sh --print)/helm"
[[ -x "$helm" ]] || helm="$(hack/testbed-bin.sh kube)/helm"

mkdir -p "$out"
for chart in o41-artifacts o41-remote; do
  # the chart's own Chart.yaml must say the same (tests/chart/test_chart_package.py): the
  # flags only make sure of it
  sets=()
  [[ $chart == o41-remote ]] && sets=(--set hub.endpoint=https://hub.example)  # required there
  "$helm" lint --strict "charts/$chart" "${sets[@]}" >/dev/null
  "$helm" package "charts/$chart" --version "$version" --app-version "$version" -d "$out" >/dev/null
  file="$out/$chart-$version.tgz"
  echo "$file"
  if [[ -n "$push" ]]; then
    "$helm" push "$file" "$push" >&2
  fi
done
