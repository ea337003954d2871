#!/usr/bin/env bash
# Set up everything coldbrew needs on a fresh machine: a virtual environment
# in .venv with the package (its C runtime built by the package build) and
# the test tools. Idempotent; used by both README commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages for aarch64 bundles: ld.lld links their code; the tests
# cross-build the runtime and run it under qemu-user (tests/qemu.py).
# For GPU (Vulkan) bundles: glslang and SPIRV-Tools compile and validate the
# shaders, the Vulkan headers build the runtime's executor, and the Vulkan
# loader with Mesa's CPU driver (lavapipe) runs them in the tests.
# Hardening: clang builds the runtime under ASan/UBSan and TSan and its
# libFuzzer targets (libfuzzer-14-dev; the sanitizer runtimes are
# libclang-rt-14-dev, only a recommendation of clang, so named here);
# libsodium verifies signed bundles.
PACKAGES="lld qemu-user gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-arm64-cross
          glslang-tools spirv-tools libvulkan-dev libvulkan1 mesa-vulkan-drivers
          clang libclang-rt-14-dev libfuzzer-14-dev libsodium23 libsodium-dev"
missing=$(for p in $PACKAGES; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -qq -y --no-install-recommends $missing >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -qq -y --no-install-recommends $missing >/dev/null; }
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[compiler,test]"
