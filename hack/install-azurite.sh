#!/usr/bin/env bash
# Install (once) or reuse Azurite, the Azure Storage emulator, pinned and cached outside the
# work tree, and print the path of its azurite-blob binary.
#
#   hack/install-azurite.sh            install if missing, print the azurite-blob path
#   hack/install-azurite.sh --print    print the path only (no install)
#
# Why 3.35.0: 3.37 requires Node 22 and the machines here have Node 20. Why npm: Azurite is
# published there by Microsoft and checks SAS signatures, which the tests depend on.
set -euo pipefail

AZURITE_VERSION=${AZURITE_VERSION:-3.35.0}
CACHE=${O41_CACHE:-$HOME/.cache/o41}
DIR="$CACHE/azurite-$AZURITE_VERSION"
BIN="$DIR/node_modules/.bin/azurite-blob"

if [[ "${1:-}" == "--print" ]]; then echo "$BIN"; exit 0; fi

installed_version() {
  node -p "require('$DIR/node_modules/azurite/package.json').version" 2>/dev/null || true
}

if [[ ! -x "$BIN" || "$(installed_version)" != "$AZURITE_VERSION" ]]; then
  command -v npm >/dev/null || { echo "install-azurite: npm not found (need Node >= 20)" >&2; exit 1; }
  mkdir -p "$DIR"
  echo "installing azurite@$AZURITE_VERSION into $DIR ..." >&2
  # Own package.json so npm treats DIR as a project root and never climbs to a parent one.
  [[ -f "$DIR/package.json" ]] || echo '{"name": "o41-azurite", "private": true}' > "$DIR/package.json"
  npm install --no-audit --no-fund --save-exact --prefix "$DIR" "azurite@$AZURITE_VERSION" >&2
fi
[[ -x "$BIN" ]] || { echo "install-azurite: $BIN missing after install" >&2; exit 1; }
echo "$BIN"
