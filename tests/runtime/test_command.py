"""runtime/python/command.py: the `coldbrew` command's entry point runs
the compiler's command line, or, in a runtime-only install, names what is
missing and how to install it instead of a traceback."""
import subprocess
import sys

import pytest

from coldbrew import command


def test_the_compilers_modules_are_found_here():
    assert command.missing_compiler_modules() == []


def test_a_runtime_only_install_is_told_what_to_install(monkeypatch):
    monkeypatch.setattr(command, "missing_compiler_modules", lambda: ["tvm", "onnx"])
    with pytest.raises(SystemExit) as e:
        command.main()
    message = str(e.value.code)
    assert "missing: tvm, onnx" in message and "pip install 'coldbrew[compiler]'" in message
    assert "coldbrew.load('model.brew')" in message


def test_missing_modules_are_looked_up_by_name(monkeypatch):
    monkeypatch.setattr(command, "COMPILER_MODULES", ("numpy", "no_such_module_cb"))
    assert command.missing_compiler_modules() == ["no_such_module_cb"]


def test_the_command_runs_the_compilers_command_line():
    out = subprocess.run([sys.executable, "-c", "import sys; from coldbrew.command import main; "
                          "sys.argv = ['coldbrew', '--help']; main()"], capture_output=True, text=True)
    assert out.returncode == 0 and "compile" in out.stdout and "inspect" in out.stdout
