"""No module reaches into another's private names: across the compiler,
the targets, the schemas (not their generated code), the Python binding
and the benchmarks, no `from <module> import _name` from a module of ours
(relative, or coldbrew.* absolute; inside functions too), and the
binding's ctypes library (coldbrew.runtime._lib) is used by the binding
(runtime/python/) alone: everything else goes through its public API."""
import ast
import os

from conftest import ROOT

FOLDERS = ["compiler", "targets", "schemas", os.path.join("runtime", "python"), "bench"]
BINDING = os.path.join("runtime", "python") + os.sep
SKIPPED = {"__pycache__", "generated"}


def private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def reaches(path, rel):
    """One file's private reaches, as "rel:line what"."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "coldbrew"):
            module = "." * node.level + (node.module or "")
            found += [f"{rel}:{node.lineno} from {module} import {a.name}" for a in node.names if private(a.name)]
        elif isinstance(node, ast.Attribute) and node.attr == "_lib" and not rel.startswith(BINDING):
            found.append(f"{rel}:{node.lineno} ._lib (the binding's library)")
    return found


def scan(root):
    found = []
    for folder in FOLDERS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED)
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    found += reaches(path, os.path.relpath(path, root))
    return found


def test_no_module_imports_another_modules_private_names():
    found = scan(ROOT)
    assert not found, "\n".join(found)


def test_the_check_catches_each_kind_of_reach(tmp_path):
    def plant(rel, text):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    plant("compiler/passes/a.py", "from ..ir.narrow import choice as _choice\n"  # a public name, renamed: fine
                                  "def f():\n    from ..ir.narrow import _pick, pick\n")
    plant("compiler/b.py", "from . import __version__\nfrom tvm.topi import _helper\n")  # a dunder, not ours: fine
    plant("bench/c.py", "from coldbrew.compiler.plan.scheduler import balance, _spread\n")
    plant("bench/experiments/d.py", "def f():\n    from coldbrew.runtime import _lib\n")
    plant("compiler/measure/e.py", "import coldbrew.runtime\nfn = coldbrew.runtime._lib.cb_checksum64\n")
    plant("runtime/python/runtime.py", "_lib = None\nx = _lib.cb_run\ny = self._lib\n")  # the binding's own: fine
    plant("runtime/python/__init__.py", "from .runtime import load, _check\n")
    plant("schemas/generated/g.py", "from ..x import _y\n")  # generated code: not scanned
    plant("tests/h.py", "from coldbrew.runtime import _lib\n")  # not a scanned folder
    assert sorted(scan(str(tmp_path))) == sorted([
        "compiler/passes/a.py:3 from ..ir.narrow import _pick",
        "bench/c.py:1 from coldbrew.compiler.plan.scheduler import _spread",
        "bench/experiments/d.py:2 from coldbrew.runtime import _lib",
        "compiler/measure/e.py:2 ._lib (the binding's library)",
        "runtime/python/__init__.py:1 from .runtime import _check",
    ])
