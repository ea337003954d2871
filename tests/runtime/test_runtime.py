"""The runtime's Python API (runtime/python: coldbrew.load, its checks of
the caller's inputs) and the C API used from a plain C program."""
import os
import subprocess
import sys

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, assert_close, ort_run


def test_import_runtime_loads_no_tvm():
    code = ("import sys, coldbrew.runtime, coldbrew\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'onnx'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_c_program(small_model, small_bundle, tmp_path):
    lib_dir = os.path.dirname(coldbrew.runtime.__file__)
    exe = tmp_path / "run_bundle"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", os.path.join(ROOT, "examples", "c", "run_bundle.c"),
                    "-I", os.path.join(ROOT, "runtime", "include"), "-L", lib_dir, "-lcoldbrew",
                    f"-Wl,-rpath,{lib_dir}", "-o", str(exe)], check=True)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    out = subprocess.run([str(exe), small_bundle, str(tmp_path / "out"), str(tmp_path / "x.bin")],
                         check=True, capture_output=True, text=True).stdout
    assert "output 0 y: 20 bytes" in out
    y = np.fromfile(tmp_path / "out0.bin", dtype=np.float32).reshape(1, 5)
    assert_close(y, ort_run(small_model, {"x": x})[0])
    bad = subprocess.run([str(exe), str(tmp_path / "x.bin")], capture_output=True, text=True)
    assert bad.returncode == 1 and "BAD_MAGIC" in bad.stderr


def test_wrong_inputs_raise_clear_errors(small_bundle):
    sess = coldbrew.load(small_bundle)
    x = np.zeros((1, 3, 16, 16), np.float32)
    with pytest.raises(ValueError, match="unknown input"):
        sess.run(None, {"y": x})
    with pytest.raises(ValueError, match="missing input"):
        sess.run(None, {})
    with pytest.raises(TypeError, match="dtype float32"):
        sess.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(ValueError, match=r"shape \[1, 3, 16, 16\]"):
        sess.run(None, {"x": np.zeros((1, 3, 16, 17), np.float32)})
    with pytest.raises(TypeError, match="numpy array"):
        sess.run(None, {"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="unknown output"):
        sess.run(["nope"], {"x": x})
    assert sess.run(["y"], {"x": x})[0].shape == (1, 5)
