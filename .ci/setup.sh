#!/usr/bin/env bash
# Set up everything coldbrew needs on a fresh machine: a virtual environment
# in .venv with the package (its C runtime built by the package build) and
# the test tools. Idempotent; used by both README commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
