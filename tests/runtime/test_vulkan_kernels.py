"""GPU (Vulkan) bundles of models whose layers stress coldbrew's own GPU
kernels (int64 indices, a float -> int Cast, recurrences unrolled into
many steps, a Split's several outputs, ScatterND), run on lavapipe against
onnxruntime; and a bundle the runtime's verifier refuses is never written."""
import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import coldbrew
from cell_models import cell_model
from conftest import assert_close, ort_run
from coldbrew.compiler import InternalError, compile_model
from coldbrew.compiler.gpu import glsl


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COLDBREW_CACHE_DIR", str(tmp_path / "cache"))


def _model(nodes, inputs, outputs, inits):
    m = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def embedding_conv():
    """Token ids (int64, negative ones counted from the end) and positions
    given as floats (Cast to int32) each pick rows of an embedding; their
    sum feeds a Conv1d."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "E"),
             numpy_helper.from_array((rng.standard_normal((6, 8, 3)) * 0.3).astype(np.float32), "W")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["e"], axis=0),
             helper.make_node("Cast", ["pos"], ["pi"], to=TP.INT32),
             helper.make_node("Gather", ["E", "pi"], ["p"], axis=0),
             helper.make_node("Add", ["e", "p"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["t", "W"], ["y"], pads=[1, 1])]
    m = _model(nodes, [helper.make_tensor_value_info("ids", TP.INT64, [1, 12]),
                       helper.make_tensor_value_info("pos", TP.FLOAT, [1, 12])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [1, 6, 12])], inits)
    feeds = {"ids": rng.integers(-50, 50, (1, 12)).astype(np.int64),
             "pos": rng.integers(-50, 50, (1, 12)).astype(np.float32)}
    return m, feeds


def scatter_nd():
    rng = np.random.default_rng(12)
    idx = numpy_helper.from_array(np.array([[1], [3]], np.int64), "idx")
    nodes = [helper.make_node("ScatterND", ["x", "idx", "upd"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [5, 4]),
                       helper.make_tensor_value_info("upd", TP.FLOAT, [2, 4])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [5, 4])], [idx])
    return m, {"x": rng.standard_normal((5, 4)).astype(np.float32),
               "upd": rng.standard_normal((2, 4)).astype(np.float32)}


def recurrent(op, seq):
    m = cell_model(op, seq=seq, hid=12)
    return m, {"x": np.random.default_rng(13).standard_normal((seq, 1, 10)).astype(np.float32)}


CASES = {
    "embedding_conv": embedding_conv,
    "scatter_nd": scatter_nd,
    # 20 steps stack 20 tensors: more than one shader may bind
    "rnn_20_steps": lambda: recurrent("RNN", 20),
    # the gates are a Split of several outputs
    "gru": lambda: recurrent("GRU", 3),
    "lstm": lambda: recurrent("LSTM", 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model_on_vulkan_matches_onnxruntime(name, tmp_path):
    model, feeds = CASES[name]()
    path = str(tmp_path / f"{name}.brew")
    compile_model(model, path, target="vulkan")
    ours = coldbrew.load(path).run(None, feeds)
    for o, r in zip(ours, ort_run(model, feeds)):
        assert_close(o, r)


def test_a_bundle_the_runtime_refuses_is_never_written(tmp_path, monkeypatch):
    """A shader record of a workgroup of no invocations (planted into the
    emitter's result) fails the runtime's structural checks, which the
    compiler runs on what it wrote: an InternalError naming the check, no
    file."""
    emit = glsl.emit
    monkeypatch.setattr(glsl, "emit", lambda f, name: dataclasses.replace(emit(f, name), local_size=(0, 1, 1)))
    model, _ = scatter_nd()
    path = tmp_path / "bad.brew"
    with pytest.raises(InternalError, match="runtime.s verifier.*workgroup of 0 invocations"):
        compile_model(model, str(path), target="vulkan")
    assert not path.exists()
