"""aarch64 bundles: compiled here, run under qemu-aarch64 by the runtime
cross-built for aarch64 (tests/qemu.py) and compared with onnxruntime;
refused by a runtime of another ISA. tests/aarch64_zoo.py runs every zoo model."""
import os
import subprocess
import sys

import pytest

import coldbrew
import qemu
from conftest import ROOT, assert_close

sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402

MODELS = ("crnn", "squeezenet")  # the quickest zoo models to compile; crnn calls libm (erff)
TARGETS = {"aarch64": ("libm.so.6", "libc.so.6"), "sd855": ("libm.so", "libc.so")}  # target -> libraries named


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_under_qemu_matches_onnxruntime(qemu_runner, name, target, tmp_path):
    pairs = qemu.compile_and_run(qemu_runner, zoo.build(name), target, str(tmp_path))
    assert pairs
    for ours, ref in pairs:
        assert_close(ours, ref)


@pytest.mark.parametrize("target", TARGETS)
def test_code_segment_is_aarch64_and_names_only_libm_libc(small_model, target, tmp_path):
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.inspect_bundle import read_bytes
    from coldbrew.compiler.write_bundle import CODE_KINDS, unpack_code

    data = compile_model(small_model, target=target)
    (seg,) = [s for s in read_bytes(data)[0].segments if s.kind in CODE_KINDS]
    code = unpack_code(seg.kind, data[seg.offset:seg.offset + seg.size], seg.rawSize)
    assert code[:4] == b"\x7fELF" and int.from_bytes(code[18:20], "little") == 183  # EM_AARCH64
    (tmp_path / "code.so").write_bytes(code)
    dyn = subprocess.run(["readelf", "-d", str(tmp_path / "code.so")], capture_output=True, text=True, check=True)
    needed = [line.split("[")[1].rstrip("]") for line in dyn.stdout.splitlines() if "(NEEDED)" in line]
    assert needed == list(TARGETS[target])


def test_this_runtime_refuses_aarch64_bundle(small_model, tmp_path):
    from coldbrew.compiler import compile_model

    path = tmp_path / "small-aarch64.brew"
    compile_model(small_model, str(path), target="aarch64")
    with pytest.raises(coldbrew.BundleError, match=r"\[TARGET\] bundle is built for aarch64-linux-gnu "
                                                   rf"\(cpu generic\); this machine is {os.uname().machine}"):
        coldbrew.load(str(path))


def test_aarch64_runtime_refuses_host_bundle(qemu_runner, small_bundle, tmp_path):
    host = os.uname().machine
    with pytest.raises(qemu.QemuError, match=rf"TARGET: bundle is built for {host}-linux-gnu .* is aarch64"):
        qemu.run(qemu_runner, small_bundle, [], str(tmp_path))


def test_missing_linker_is_named(small_model, monkeypatch):
    from coldbrew.compiler import CompileError, codegen, compile_model

    monkeypatch.setattr(codegen.shutil, "which", lambda tool: None)
    with pytest.raises(CompileError, match=r"ld.lld not found \(install the Debian package lld\)"):
        compile_model(small_model, target="sd855")
