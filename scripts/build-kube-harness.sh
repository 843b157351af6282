#!/usr/bin/env bash
# Builds the real kube-apiserver (k8s.io/kubernetes, pinned 1.36.x) and etcd (go.etcd.io/etcd, pinned)
# with the machine's Go, into a cache outside the repository. Idempotent: a cached binary of the
# pinned version is reused.
set -euo pipefail

KUBE_VERSION="${HPKV_KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${HPKV_ETCD_VERSION:-v3.6.8}"
CACHE_DIR="${HPKV_HARNESS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hpkv-test}"
BIN_DIR="$CACHE_DIR/bin"
mkdir -p "$BIN_DIR"

log() { printf '[harness] %s\n' "$*" >&2; }

command -v go >/dev/null || { log "go is required to build kube-apiserver and etcd (install Go >= 1.25)"; exit 1; }

build_kube_apiserver() {
  local out="$BIN_DIR/kube-apiserver-$KUBE_VERSION"
  if [[ -x "$out" ]]; then log "kube-apiserver $KUBE_VERSION cached at $out"; return; fi
  local work; work="$(mktemp -d)"
  log "building kube-apiserver $KUBE_VERSION in $work (several minutes on 2 cores)"
  local staging="v0${KUBE_VERSION#v1}"   # v1.36.3 -> v0.36.3
  ( cd "$work"
    go mod init hpkv.local/kube-apiserver >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    # k8s.io/kubernetes replaces its staging modules with ./staging paths; pin them to the matching release.
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}' >> go.mod
    cat > main.go <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO
    go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
    go mod tidy >/dev/null
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp" -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$minor \
      -X k8s.io/component-base/version.gitTreeState=clean" .
  )
  mv "$out.tmp" "$out"
  rm -rf "$work"
  log "built $out"
}

build_etcd() {
  local out="$BIN_DIR/etcd-$ETCD_VERSION"
  if [[ -x "$out" ]]; then log "etcd $ETCD_VERSION cached at $out"; return; fi
  local work; work="$(mktemp -d)"
  log "building etcd $ETCD_VERSION in $work"
  ( cd "$work"
    go mod init hpkv.local/etcd >/dev/null 2>&1
    cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
GO
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
    go mod tidy >/dev/null
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" .
  )
  mv "$out.tmp" "$out"
  rm -rf "$work"
  log "built $out"
}

build_etcd
build_kube_apiserver
ln -sf "kube-apiserver-$KUBE_VERSION" "$BIN_DIR/kube-apiserver"
ln -sf "etcd-$ETCD_VERSION" "$BIN_DIR/etcd"
log "harness binaries ready in $BIN_DIR"
