#!/usr/bin/env bash
# The test command (README "Testing"): installs hpkv with its test dependencies into .venv,
# prepares the harness (kube-apiserver, etcd, helm), checks lint and format, and runs pytest.
# Extra arguments go to pytest, e.g. ./scripts/test.sh tests/cli -k tiered
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'

scripts/prepare-harness.sh

.venv/bin/ruff check .
.venv/bin/ruff format --check .

exec .venv/bin/python -m pytest "$@"
