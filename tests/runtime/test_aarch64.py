"""aarch64 bundles: compiled here, run under qemu-aarch64 by the runtime
cross-built for aarch64 (tests/qemu.py) and compared with onnxruntime;
refused by a runtime of another ISA, and by an aarch64 CPU without the
features the bundle records (qemu -cpu cortex-a53, ARMv8.0). tests/aarch64_zoo.py
runs every zoo model."""
import os
import re
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
    from coldbrew.compiler.bundle.reader import read_bytes
    import lz4.block

    from coldbrew.compiler.passes.write_bundle import CODE_KINDS
    from coldbrew.schemas.generated import bundle_generated as fb

    data = compile_model(small_model, target=target)
    (seg,) = [s for s in read_bytes(data)[0].segments if s.kind in CODE_KINDS]
    code = data[seg.offset:seg.offset + seg.size]
    if seg.kind == fb.SegmentKind.cpu_code_lz4:
        code = lz4.block.decompress(code, uncompressed_size=seg.rawSize)
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
    from coldbrew.compiler import CompileError, compile_model
    from coldbrew.compiler.passes import codegen

    monkeypatch.setattr(codegen.shutil, "which", lambda tool: None)
    with pytest.raises(CompileError, match=r"ld.lld not found \(install the Debian package lld\)"):
        compile_model(small_model, target="sd855")


# CPU features (runtime/src/bundle/target.c's aarch64 table, read from AT_HWCAP / AT_HWCAP2)

@pytest.fixture(scope="module")
def sd855_bundle(small_model, tmp_path_factory):
    from coldbrew.compiler import compile_model

    path = tmp_path_factory.mktemp("sd855") / "small-sd855.brew"
    compile_model(small_model, str(path), target="sd855")
    return str(path)


def _target_c_names(table):
    """The feature names of one of runtime/src/bundle/target.c's tables (k_arm, k_x86), in order."""
    with open(os.path.join(ROOT, "runtime", "src", "bundle", "target.c")) as f:
        src = f.read()
    body = re.search(rf"\b{table}\[\] = \{{(.*?)\n\}};", src, re.S)
    assert body, f"runtime/src/bundle/target.c has no table {table}"
    return re.findall(r'\{"([^"]+)",', body.group(1))


def test_checked_features_are_target_c_tables():
    from coldbrew.targets.schema import CHECKED_FEATURES

    assert CHECKED_FEATURES["aarch64"] == _target_c_names("k_arm")
    assert sorted(CHECKED_FEATURES["x86_64"]) == sorted(_target_c_names("k_x86"))


def test_sd855_bundle_records_its_cpu_features(sd855_bundle):
    from coldbrew.compiler.bundle.reader import read
    from coldbrew.targets import resolve

    t = read(sd855_bundle)[0].target
    features = [f.decode() for f in t.features]
    assert {"neon", "fp16", "dotprod"} <= set(features)
    assert features == list(resolve("sd855").features)
    assert (t.cpu.decode(), t.triple.decode()) == ("cortex-a76", "aarch64-linux-android")


def test_armv80_core_refuses_sd855_bundle(qemu_runner, sd855_bundle, tmp_path):
    """Cortex-A53 (ARMv8.0 + crc, aes, sha2) lacks every ARMv8.2 feature the bundle records, each named."""
    with pytest.raises(qemu.QemuError, match=r"failed: TARGET: bundle is built for cpu cortex-a76 and needs 'fp16', "
                                             r"'dotprod', 'rdm', 'lse', 'rcpc', which this CPU lacks$"):
        qemu.run(qemu_runner, sd855_bundle, [], str(tmp_path), cpu="cortex-a53")


@pytest.mark.parametrize("cpu", ["cortex-a76", "max"])
def test_sd855_bundle_runs_on_cpus_with_its_features(qemu_runner, small_model, sd855_bundle, cpu, tmp_path):
    pairs = qemu.run_and_compare(qemu_runner, small_model, sd855_bundle, str(tmp_path), cpu=cpu)
    assert pairs
    for ours, ref in pairs:
        assert_close(ours, ref)


@pytest.mark.parametrize("target,cpu", [("aarch64", "cortex-a53"), ("jetson_nano", "cortex-a57")])
def test_armv80_bundles_run_on_armv80_cores(qemu_runner, small_model, target, cpu, tmp_path):
    pairs = qemu.compile_and_run(qemu_runner, small_model, target, str(tmp_path), cpu=cpu)
    assert pairs
    for ours, ref in pairs:
        assert_close(ours, ref)


def test_unknown_qemu_cpu_is_named(qemu_runner, sd855_bundle, tmp_path):
    with pytest.raises(qemu.QemuError, match=r"cannot emulate cpu 'cortex-a99' \(it can: .*cortex-a53"):
        qemu.run(qemu_runner, sd855_bundle, [], str(tmp_path), cpu="cortex-a99")
