"""The library's exported symbols are exactly its headers' declarations:
coldbrew.h (the API apps use) and coldbrew_testing.h (the runtime's own tests
and the compiler's measurements), plus the one hook kernels' code calls."""
import os
import re
import subprocess

import coldbrew
from conftest import ROOT

INCLUDE = os.path.join(ROOT, "runtime", "include")
KERNEL_HOOKS = {"TVMFFIErrorSetRaisedFromCStrParts"}  # the kernels' one undefined symbol (runtime/src/cpu/backend.c)


def declared(header):
    """Function names declared in a header (prototypes at the start of a line)."""
    with open(os.path.join(INCLUDE, header)) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    return set(re.findall(r"^[a-z_][\w *]*?[\s*](cb_\w+)\(", text, flags=re.M))


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[-2] in "TtWwDdBbRr"}


def test_library_exports_exactly_the_headers():
    public, testing = declared("coldbrew.h"), declared("coldbrew_testing.h")
    assert "cb_session_run" in public and "cb_lz4_decode" in testing and not public & testing
    lib = os.path.join(os.path.dirname(coldbrew.__file__), "libcoldbrew.so")
    assert exported(lib) == public | testing | KERNEL_HOOKS


def test_python_binding_calls_only_declared_functions():
    """The ctypes binding (what apps use from Python) needs nothing from the testing header."""
    with open(os.path.join(ROOT, "runtime", "python", "runtime.py")) as f:
        called = set(re.findall(r"\b(cb_\w+)\b", f.read())) - {"cb_phase", "cb_mode"}
    assert called and called <= declared("coldbrew.h"), called - declared("coldbrew.h")
