#!/usr/bin/env bash
# Set up the peer engines of bench/peers.py on top of .ci/setup.sh: the
# package's `bench` extra, and pnnx (ncnn's converter) without its PyTorch
# dependency (only its converter binary runs). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
.venv/bin/python -m pip install --quiet -e ".[bench]"
.venv/bin/python -m pip install --quiet --no-deps "pnnx>=20240410"
