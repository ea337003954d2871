"""A layer writes its whole output, whatever the arena held before: an
anchor's epilogue that pads its output for the next layer (a Pad fused after
a convolution) writes the border too, on every run of a session. The arena
is filled with NaN bytes first (COLDBREW_POISON_ARENA), so a value a layer
leaves unwritten is seen on the first run."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from conftest import assert_close, ort_run
from coldbrew.compiler import compile_graph


def conv_pad_conv(n=16):
    """Conv + Relu + a bottom/right Pad + a stride-2 Conv (an exporter's
    asymmetric padding written out)."""
    rng = np.random.default_rng(3)
    w = lambda name, shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Pad", ["r1", "pads"], ["p1"]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["y"], strides=[2, 2])]
    inits = [w("w1", (8, 4, 3, 3)), w("b1", (8,)), w("w2", (8, 8, 3, 3)), w("b2", (8,)),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")]
    g = helper.make_graph(nodes, "conv_pad_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, n // 2, n // 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("variant", ["im2col_gemm", "direct", "blocked", "im2col_blocked", "winograd_f2"])
def test_a_padding_epilogue_writes_its_border_on_every_run(variant, monkeypatch):
    monkeypatch.setenv("COLDBREW_POISON_ARENA", "1")
    model = conv_pad_conv()
    data, graph = compile_graph(model, variants={"conv2d": variant})
    assert not [n for n in graph.notes if "schedule failed" in n], graph.notes  # the variant's own schedule
    sess = coldbrew.load(data)
    for seed in (0, 1):
        x = {"x": np.random.default_rng(seed).standard_normal((1, 4, 16, 16)).astype(np.float32)}
        assert_close(sess.run(None, x), ort_run(model, x))
