#!/usr/bin/env bash
# Prepares everything the tests need outside Python: kube-apiserver and etcd (built from their Go
# modules with the machine's Go) and the helm binary. Binaries are cached in
# ${HPKV_HARNESS_DIR:-~/.cache/hpkv-test}/bin, outside the repository.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/build-kube-harness.sh"
"$here/install-helm.sh"
