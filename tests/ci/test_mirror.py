"""Every compiler module is exercised by a test named after it or its
folder: tests/compiler mirrors compiler/, and a module compiler/F/M.py has
tests/compiler/F/test_M.py or tests/compiler/F/test_F.py, or a test in
tests/compiler/F/ imports it (top-level modules: tests/compiler/test_M.py,
or a test beside it that imports it)."""
import ast
import os

from conftest import ROOT


def compiler_modules(root):
    """{dotted name under coldbrew.compiler: (folder, module)} of every module with code."""
    out = {}
    base = os.path.join(root, "compiler")
    for dirpath, dirnames, files in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            if f == "__init__.py" and not _has_code(path):
                continue
            rel = os.path.relpath(path, base)[:-3].split(os.sep)
            folder = "/".join(rel[:-1])
            name = rel[-1] if rel[-1] != "__init__" else (rel[-2] if len(rel) > 1 else "compiler")
            out[".".join(p for p in rel if p != "__init__")] = (folder, name)
    return out


def _has_code(path):
    tree = ast.parse(open(path).read())
    return any(not isinstance(n, ast.Expr) for n in tree.body)  # more than a docstring


def test_imports(path, package):
    """Dotted compiler modules a test file imports (absolute coldbrew.compiler.* imports)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coldbrew.compiler"):
            mod = node.module[len("coldbrew.compiler"):].lstrip(".")
            found.add(mod)
            found |= {f"{mod}.{a.name}" if mod else a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name[len("coldbrew.compiler."):] for a in node.names if a.name.startswith("coldbrew.compiler.")}
    return found


test_imports.__test__ = False  # a helper, not a test


def untested(root):
    tests = os.path.join(root, "tests", "compiler")
    missing = []
    for dotted, (folder, name) in sorted(compiler_modules(root).items()):
        here = os.path.join(tests, folder)
        if any(os.path.exists(os.path.join(here, f"test_{n}.py")) for n in (name, os.path.basename(folder)) if n):
            continue
        files = [os.path.join(here, f) for f in (os.listdir(here) if os.path.isdir(here) else [])
                 if f.startswith("test_") and f.endswith(".py")]
        if not any(dotted in test_imports(f, folder) for f in files):
            missing.append(f"compiler/{dotted.replace('.', '/')}.py")
    return missing


def test_every_compiler_module_has_a_test_named_after_it_or_its_folder():
    assert untested(ROOT) == []


def test_the_check_sees_a_module_without_a_test(tmp_path):
    (tmp_path / "compiler" / "plan").mkdir(parents=True)
    (tmp_path / "compiler" / "plan" / "exact.py").write_text("X = 1\n")
    (tmp_path / "tests" / "compiler" / "plan").mkdir(parents=True)
    (tmp_path / "tests" / "compiler" / "plan" / "test_other.py").write_text("from coldbrew.compiler.plan import simulate\n")
    assert untested(str(tmp_path)) == ["compiler/plan/exact.py"]
    (tmp_path / "tests" / "compiler" / "plan" / "test_other.py").write_text("from coldbrew.compiler.plan import exact\n")
    assert untested(str(tmp_path)) == []


def untested_runtime_python(root):
    """runtime/python modules (the coldbrew package) without tests/runtime/test_<module>.py."""
    import glob

    mods = [os.path.basename(p)[:-3] for p in glob.glob(os.path.join(root, "runtime", "python", "*.py"))]
    return sorted(f"runtime/python/{m}.py" for m in mods if m != "__init__"
                  and not os.path.exists(os.path.join(root, "tests", "runtime", f"test_{m}.py")))


def test_every_runtime_python_module_has_a_test_named_after_it():
    assert untested_runtime_python(ROOT) == []  # runtime/src's folders: tests/runtime/test_layers.py


def test_the_runtime_check_sees_a_module_without_a_test(tmp_path):
    (tmp_path / "runtime" / "python").mkdir(parents=True)
    (tmp_path / "tests" / "runtime").mkdir(parents=True)
    for m in ("__init__", "runtime", "extra"):
        (tmp_path / "runtime" / "python" / f"{m}.py").write_text("")
    (tmp_path / "tests" / "runtime" / "test_runtime.py").write_text("")
    assert untested_runtime_python(str(tmp_path)) == ["runtime/python/extra.py"]
