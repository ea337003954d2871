#!/usr/bin/env bash
# The package as a user installs it: build the wheel, install it (not
# editable) with the compiler extra into a fresh virtual environment, and
# compile and run a zoo model with it from outside the source tree.
# Needs .ci/setup.sh's environment (the build tools) first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
.venv/bin/python -m pip wheel --quiet --no-deps -w "$WORK/dist" .
WHEEL=$(ls "$WORK"/dist/coldbrew-*.whl)
echo "wheel: $(basename "$WHEEL")"
.venv/bin/python -m venv "$WORK/env"
"$WORK/env/bin/python" -m pip install --quiet --upgrade pip
"$WORK/env/bin/python" -m pip install --quiet "$WHEEL[compiler]"
cd "$WORK"  # nothing of the source tree on the path
MODEL=squeezenet
env/bin/python -m coldbrew.examples.zoo . "$MODEL"
env/bin/coldbrew compile "$MODEL.onnx" -o "$MODEL.brew"
env/bin/coldbrew run "$MODEL.brew" --cold
env/bin/python - "$MODEL.brew" "$ROOT" <<'PY'
import os, sys
import coldbrew
root = os.path.realpath(sys.argv[2])
for mod in (coldbrew, __import__("coldbrew.compiler.kernels").compiler.kernels):
    assert not os.path.realpath(mod.__file__).startswith(root), f"{mod.__name__} imported from the source tree"
print(f"installed wheel ran {sys.argv[1]} from {os.path.dirname(coldbrew.__file__)}")
PY
