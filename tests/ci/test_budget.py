"""The size limits .ci/budget.py checks in CI: today's tree passes, and a
runtime source or function over its limit (in runtime/src's folders), or a
listed long function that grew, fails."""
import importlib.util
import os
import shutil

from conftest import ROOT

spec = importlib.util.spec_from_file_location("budget", os.path.join(ROOT, ".ci", "budget.py"))
budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(budget)


def test_the_tree_is_within_its_budget(capsys):
    assert budget.main() == 0
    out = capsys.readouterr().out
    assert "compiler " in out and "runtime " in out


def _tree(tmp_path):
    for folder in ("compiler", "runtime/src/base", "runtime/src/exec", "runtime/include", "runtime/python"):
        os.makedirs(tmp_path / folder, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "runtime", "src", "base", "base.c"), tmp_path / "runtime" / "src" / "base")
    return tmp_path


def test_a_long_c_function_fails(tmp_path, capsys):
    root = _tree(tmp_path)
    assert budget.main(str(root)) == 0
    body = "\n".join(f"  x += {k};" for k in range(budget.FUNCTION_LINES))
    (root / "runtime" / "src" / "exec" / "long.c").write_text(f"int long_one(int x) {{\n{body}\n  return x;\n}}\n")
    assert budget.main(str(root)) == 1
    assert "runtime/src/exec/long.c:long_one is 83 lines" in capsys.readouterr().out


def test_a_long_runtime_source_fails(tmp_path, capsys):
    root = _tree(tmp_path)
    (root / "runtime" / "src" / "base" / "big.c").write_text("/* */\n" * (budget.FILE_LINES + 1))
    assert budget.main(str(root)) == 1
    assert f"runtime/src/base/big.c is {budget.FILE_LINES + 1} lines" in capsys.readouterr().out


def test_a_long_compiler_function_fails(tmp_path, capsys):
    root = _tree(tmp_path)
    body = "\n".join("    x += 1" for _ in range(budget.FUNCTION_LINES))
    (root / "compiler" / "__init__.py").write_text(f"def compile_model(x):\n{body}\n    return x\n")
    assert budget.main(str(root)) == 1
    assert f"compiler/__init__.py:compile_model is {budget.FUNCTION_LINES + 2} lines" in capsys.readouterr().out
