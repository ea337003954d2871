#!/usr/bin/env bash
# Set everything up, then the main job on a model that ships with the
# project: build mobilenet_v2 from the zoo, compile it to a bundle, run the
# bundle cold (evicted from the page cache) and print result and timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
MODEL=${1:-mobilenet_v2}
mkdir -p out
.venv/bin/python examples/zoo.py out "$MODEL"
.venv/bin/coldbrew compile "out/$MODEL.onnx" -o "out/$MODEL.brew"
.venv/bin/coldbrew inspect "out/$MODEL.brew" | head -8
.venv/bin/coldbrew run "out/$MODEL.brew" --cold
