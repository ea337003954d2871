"""How the compiler's modules depend on each other: no pass imports another
pass (what passes share lives in helper modules: anchors, narrow, graph,
ops, ...), and no two modules import each other, directly or round a circle
(imports inside functions count)."""
import ast
import os

from conftest import ROOT

from coldbrew.compiler import GPU_PASSES, PASSES

COMPILER = os.path.join(ROOT, "compiler")


def modules():
    """{module name relative to the compiler package ('' = its __init__): path}."""
    out = {}
    for dirpath, dirnames, files in os.walk(COMPILER):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), COMPILER)[:-3].replace(os.sep, ".")
                out[rel[:-len("__init__")].rstrip(".") if rel.endswith("__init__") else rel] = os.path.join(dirpath, f)
    return out


def imports(name, path, known):
    """The compiler modules `name` imports, anywhere in its file."""
    package = name.split(".")[:-1] if not path.endswith("__init__.py") else name.split(".") if name else []
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coldbrew.compiler"):
            target = node.module[len("coldbrew.compiler"):].lstrip(".")
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_pass_imports_another_pass():
    passes = {p.__name__[len("coldbrew.compiler."):] for p in PASSES + GPU_PASSES}
    g = graph()
    assert passes <= set(g)
    bad = {p: sorted(g[p] & passes) for p in passes if g[p] & passes}
    assert not bad, bad


def test_no_import_cycles():
    g = graph()
    cycles, state, path = [], {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(g[m]):
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, [" -> ".join(c or "__init__" for c in cyc) for cyc in cycles]


def test_the_check_sees_imports_inside_functions(tmp_path):
    known = {"a": "", "b": ""}
    path = tmp_path / "a.py"
    path.write_text("def f():\n    from . import b\n    from .b import g\n")
    assert imports("a", str(path), known) == {"b"}


# The compiler's folders from the bottom up: a module imports only from its
# own folder and the folders below it (compiler/__init__.py is "").
LAYERS = ["errors", "ir", "onnx", "options", "kernels", "bundle", "gpu", "passes", "pipeline", "measure", "plan", "driver", "",
          "tools"]


def folder(module):
    return module.split(".")[0] if module else ""


def upward(g):
    rank = {name: k for k, name in enumerate(LAYERS)}
    return sorted(f"{m or '__init__'} -> {d or '__init__'}" for m, deps in g.items() for d in deps
                  if rank[folder(d)] > rank[folder(m)])


def test_every_folder_has_a_layer():
    assert {folder(m) for m in graph()} == set(LAYERS)


def test_lower_layers_never_import_upward():
    assert upward(graph()) == []


def test_the_layer_check_sees_an_upward_import():
    assert upward({"ir.graph": {"passes.codegen"}, "passes.codegen": {"ir.graph"}}) == ["ir.graph -> passes.codegen"]


def unresolved(root=COMPILER, package="coldbrew.compiler"):
    """Relative imports anywhere in the compiler (inside functions too) that
    name a module or a name that does not exist: a moved module leaves
    these behind, and they fail only when their function first runs."""
    import importlib

    bad = []
    for name, path in modules().items() if root == COMPILER else _modules_under(root).items():
        pkg = package.split(".") + (name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1])
        pkg = [p for p in pkg if p]
        for node in ast.walk(ast.parse(open(path).read())):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            target = ".".join(pkg[:len(pkg) - (node.level - 1)] + ([node.module] if node.module else []))
            try:
                mod = importlib.import_module(target)
            except ImportError:
                bad.append(f"{name}:{node.lineno} {target}")
                continue
            for alias in node.names:
                if not hasattr(mod, alias.name) and importlib.util.find_spec(f"{target}.{alias.name}") is None:
                    bad.append(f"{name}:{node.lineno} {target}.{alias.name}")
    return bad


def _modules_under(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, ".")
                out[rel[:-len("__init__")].rstrip(".") if rel.endswith("__init__") else rel] = os.path.join(dirpath, f)
    return out


def test_every_relative_import_resolves():
    assert unresolved() == []


def test_the_resolver_sees_an_import_left_behind(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text("")
    (tmp_path / "tools" / "inspect.py").write_text("def f():\n    from .sign import signer\n")
    assert unresolved(str(tmp_path), "coldbrew.compiler") == ["tools.inspect:2 coldbrew.compiler.tools.sign"]
