#!/usr/bin/env bash
# Set everything up and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
# the test files spread over one worker per core (pytest-xdist), each file on one worker; a worker
# that dies ends the run naming its test (xdist's loadfile scheduling can wait forever on a replacement),
# and its fatal-error dump (tests/conftest.py) is printed last
export COLDBREW_FAULTS="$(mktemp -d)"
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --max-worker-restart=0 "$@" || rc=$?
for f in "$COLDBREW_FAULTS"/*.txt; do
  if [ -s "$f" ]; then
    echo "== a test process's fatal error ($(basename "$f" .txt)):"; cat "$f"
    echo "== its crashing thread:"; sed -n '/^Current thread/,/^$/p' "$f"
  fi
done
rm -rf "$COLDBREW_FAULTS"
exit $rc
