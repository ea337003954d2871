"""The package as users install it: the wheel holds every module of the
source tree, and a runtime-only install (no extras: numpy alone) loads and
runs a bundle with neither TVM nor onnx importable. (.ci/wheel.sh installs
the same wheel with the compiler extra and compiles a zoo model with it.)"""
import importlib.util
import os
import subprocess
import sys
import venv
import zipfile

import numpy as np
import pytest
from conftest import ROOT



def _roots():
    """{source folder: the package path it becomes}, from setup.py's ROOTS
    (the tree below each is walked here, not through setup.py's finder)."""
    spec = importlib.util.spec_from_file_location("coldbrew_setup", os.path.join(ROOT, "setup.py"))
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)  # setup() runs only as __main__
    return {folder: package.replace(".", "/") for package, folder in setup.ROOTS.items()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), ROOT],
                   check=True, capture_output=True, text=True)
    (path,) = out.glob("coldbrew-*.whl")
    return path


@pytest.fixture(scope="module")
def runtime_env(tmp_path_factory, wheel):
    """A fresh virtual environment with the wheel and its own dependencies only."""
    env = tmp_path_factory.mktemp("runtime-env")
    venv.create(env, with_pip=True)
    py = str(env / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return env


def _in_env(env, *args, cwd):
    return subprocess.run([str(env / "bin" / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd)


def test_wheel_holds_every_module_of_the_source_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, package in _roots().items():
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" not in files:
                dirnames[:] = []
                continue
            rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
            expected |= {os.path.normpath(os.path.join(package, rel, f)) for f in files if f.endswith(".py")}
    assert expected and expected <= names, sorted(expected - names)
    assert {"coldbrew/libcoldbrew.so", "coldbrew/compiler/kernels/conv.py", "coldbrew/targets/sd855.json",
            "coldbrew/schemas/bundle.fbs", "coldbrew/include/coldbrew.h"} <= names
    assert "-none-any" not in wheel.name  # it carries native code: tagged for this platform


def test_runtime_only_install_runs_a_bundle(runtime_env, small_model, small_bundle, tmp_path):
    import coldbrew

    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = f"""
import importlib.util, sys
import numpy as np
import coldbrew
assert not coldbrew.__file__.startswith({ROOT!r}), coldbrew.__file__
missing = [m for m in ("tvm", "onnx", "click", "flatbuffers") if importlib.util.find_spec(m) is None]
assert missing == ["tvm", "onnx", "click", "flatbuffers"], missing
sess = coldbrew.load({small_bundle!r})
(y,) = sess.run(None, {{"x": np.load("x.npy")}})
np.save("y.npy", y)
"""
    r = _in_env(runtime_env, "python", "-c", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (ref,) = coldbrew.load(small_bundle).run(None, {"x": x})
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), ref)


def test_runtime_only_install_says_how_to_get_the_compiler(runtime_env, tmp_path):
    r = _in_env(runtime_env, "coldbrew", "compile", "model.onnx", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "pip install 'coldbrew[compiler]'" in r.stderr and "missing: click, onnx, tvm" in r.stderr
    r = _in_env(runtime_env, "python", "-c", "import coldbrew.compiler", cwd=tmp_path)
    assert r.returncode == 1 and "coldbrew's compiler needs packages that are not installed here" in r.stderr
