#!/usr/bin/env bash
# Set everything up, then the main job on a model that ships with the
# project: build mobilenet_v2 from the zoo, compile it to a bundle, describe
# the bundle, and run it cold (evicted from the page cache): its result and
# the time to it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
MODEL=${1:-mobilenet_v2}
mkdir -p out
.venv/bin/python examples/zoo.py out "$MODEL"
.venv/bin/coldbrew compile "out/$MODEL.onnx" -o "out/$MODEL.brew"
# the bundle's description goes to a file, its first lines to the terminal
# (no pipe: a reader that stops early would fail the command it reads)
.venv/bin/coldbrew inspect "out/$MODEL.brew" > "out/$MODEL.inspect.txt"
sed -n '1,9p' "out/$MODEL.inspect.txt"
echo "  ... (all of it: out/$MODEL.inspect.txt)"
.venv/bin/coldbrew run "out/$MODEL.brew" --cold
