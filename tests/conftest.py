"""Shared fixtures: small models, compiled bundles cached per test session."""
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the kernel has MADV_POPULATE_READ (Linux 5.14), which the runtime's reader uses
POPULATE_READ = tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (5, 14)
sys.path.insert(0, os.path.join(ROOT, "tests"))


@pytest.hookimpl(trylast=True)  # (after pytest's own faulthandler, which writes to stderr)
def pytest_configure(config):
    """COLDBREW_FAULTS=DIR (tests/run.sh): each process's fatal-error dump
    (every thread's Python stack) goes to a file there, which run.sh prints
    last: a worker that dies is otherwise only 'node down'."""
    where = os.environ.get("COLDBREW_FAULTS")
    if where:
        import faulthandler

        os.makedirs(where, exist_ok=True)
        config._coldbrew_faults = open(os.path.join(where, f"{os.getpid()}.txt"), "w")
        faulthandler.enable(file=config._coldbrew_faults, all_threads=True)


def small_cnn():
    """A conv+relu -> pool -> framework-style flatten -> gemm model."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B"),
        numpy_helper.from_array((rng.standard_normal((5, 8)) * 0.3).astype(np.float32), "FW"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "FB"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Shape", ["g"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["nu"], name="unsq"),
        helper.make_node("Concat", ["nu", "minus1"], ["shp"], axis=0, name="concat"),
        helper.make_node("Reshape", ["g", "shp"], ["f"], name="reshape"),
        helper.make_node("Gemm", ["f", "FW", "FB"], ["y"], transB=1, name="fc"),
    ]
    g = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def ort_run(model, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _load_check():
    """compiler/tools/check.py, the output check every comparison uses."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("coldbrew_output_check", os.path.join(ROOT, "compiler", "tools", "check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load_check()


def assert_close(ours, ref, rel=1e-3):
    """compiler/tools/check.py's comparison: one output, or lists of outputs
    (their counts compared); shapes, NaN and infinity, integers exactly,
    floats within rel of the scale of the values they sit among (at least 1)."""
    if isinstance(ref, (list, tuple)):
        verdict = check.compare(ref, list(ours), rel)
    else:
        err, why = check.one(ref, ours, rel)
        verdict = check.Verdict(err, [why] if why else [], rel)
    assert verdict.ok, verdict.message()


@pytest.fixture(scope="session")
def small_model():
    return small_cnn()


def padded_cnn():
    """Convolutions of 6 channels between ones of 16: a CPU target blocking
    channels by 8 pads the 1x1 weights to 8 (their raw form, before it
    blocks them), a GPU target reads them as they are."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("W0", (16, 3, 3, 3)), ("W1", (6, 16, 1, 1)), ("W2", (16, 6, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "W0"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "W1"], ["b"]), helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("Conv", ["c", "W2"], ["y"])]
    g = helper.make_graph(nodes, "padded_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


@pytest.fixture(scope="session")
def small_bundle(tmp_path_factory, small_model):
    from coldbrew.compiler import compile_model

    path = tmp_path_factory.mktemp("bundles") / "small.brew"
    compile_model(small_model, str(path))
    return str(path)


@pytest.fixture(scope="session")
def qemu_runner(tmp_path_factory):
    """run_bundle and the runtime cross-built for aarch64, run under qemu (tests/qemu.py).
    Without the tools the tests using it fail, naming the packages to install."""
    import qemu

    try:
        return qemu.build_runner(str(tmp_path_factory.mktemp("aarch64")))
    except qemu.QemuError as e:
        missing = str(e)
    pytest.fail(missing, pytrace=False)


def cpu_targets():
    """The CPU targets a kernel or model test compiles for: the host, and on
    an x86-64 host whose vector unit is wider than AVX2's, x86_64-avx2 too
    (on an AVX2 host the host's kernels are AVX2's: the same ISA, lanes and
    registers, so the second run would repeat the first)."""
    from coldbrew.targets import resolve

    host, avx2 = resolve("host"), resolve("x86_64-avx2")
    unit = lambda t: (t.vector.isa, t.vector.lanes, t.vector.registers)  # noqa: E731
    return ["host"] + (["x86_64-avx2"] if host.arch == "x86_64" and unit(host) != unit(avx2) else [])


def vnni_target():
    """The AVX-512 build target with VNNI (Ice Lake and later): the code the
    integer variants make where a CPU has it, buildable on any x86 host."""
    import dataclasses

    from coldbrew.targets import resolve

    t = resolve("x86_64-avx512")
    return dataclasses.replace(t, cpu="icelake-server", features=tuple(t.features) + ("avx512vnni",))


def amx_target():
    """The AVX-512 build target with AMX's int8 tiles (Sapphire Rapids and
    later): the code dense.int8_tiles makes, buildable on any x86 host."""
    import dataclasses

    t = vnni_target()
    return dataclasses.replace(t, cpu="sapphirerapids", features=tuple(t.features) + ("amx-tile", "amx-int8"))
