#!/usr/bin/env bash
# Set everything up and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
