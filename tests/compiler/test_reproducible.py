"""Identical rebuilds: the same model compiled for the same target in two
fresh processes (different hash seeds, different working folders) gives
byte-identical bundles."""
import hashlib
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from conftest import small_cnn
from coldbrew.compiler import compile_model
compile_model(small_cnn(), {out!r}, target={target!r}, tune=False)
"""


@pytest.mark.parametrize("target", ["host", "aarch64", "vulkan"])
def test_two_fresh_processes_build_identical_bundles(tmp_path, target):
    digests = []
    for seed in ("1", "2"):
        work = tmp_path / f"run{seed}"
        work.mkdir()
        out = str(work / "small.brew")
        code = SCRIPT.format(tests=os.path.join(ROOT, "tests"), out=out, target=target)
        r = subprocess.run([sys.executable, "-c", code], cwd=str(work), capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr[-3000:]
        digests.append(hashlib.sha256(open(out, "rb").read()).hexdigest())
    assert digests[0] == digests[1], f"{target}: two builds differ"
