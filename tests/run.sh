#!/usr/bin/env bash
# Set everything up and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
# the test files spread over one worker per core (pytest-xdist), each file on one worker; a worker
# that dies ends the run naming its test (xdist's loadfile scheduling can wait forever on a replacement)
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --max-worker-restart=0 "$@"
