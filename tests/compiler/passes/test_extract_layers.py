"""compiler/passes/extract_layers.py: the fused module becomes a coldbrew Graph:
one layer per kernel call, constants as weight tensors, the anchors'
layers named and labelled with their variants; an output that no layer
writes (an input or the same tensor twice) gets a copy layer of its own."""
import numpy as np
from onnx import TensorProto, helper

import coldbrew
from coldbrew.compiler import compile_graph, compile_model


def test_layers_tensors_and_anchors(small_model):
    _, graph = compile_graph(small_model)
    kinds = [t.kind for t in graph.tensors]
    assert kinds.count("input") == 1 and kinds.count("output") == 1 and "weight" in kinds
    assert [graph.tensors[i].name for i in graph.inputs] == ["x"]
    assert [graph.tensors[i].name for i in graph.outputs] == ["y"]
    assert {la.kernel for la in graph.layers} <= set(graph.kernels)
    named = {la.name: la.variant for la in graph.layers if la.variant != "generic"}
    assert set(named) == {"c0", "d0"}  # the convolution and the dense layer, by anchor id
    for la in graph.layers:
        outs = la.args[len(la.args) - la.num_outputs:]
        assert all(graph.tensors[o].kind in ("intermediate", "output") for o in outs)


def _passthrough_model():
    """Outputs `a` (the input itself), `b` (relu) and `c` (relu again: the same tensor)."""
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
                           helper.make_node("Identity", ["b"], ["c"])], "p",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "abc"])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_outputs_no_layer_writes_get_copy_layers():
    m = _passthrough_model()
    _, graph = compile_graph(m)
    assert [la.op for la in graph.layers].count("copy") == 2  # `a` (the input) and `c` (b's tensor again)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    a, b, c = coldbrew.load(compile_model(m)).run(None, {"x": x})
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, np.maximum(x, 0))
    np.testing.assert_array_equal(c, np.maximum(x, 0))


def test_a_long_fused_name_gets_a_short_stable_symbol():
    from coldbrew.compiler.passes.extract_layers import MAX_SYMBOL, symbol

    short = "fused_conv2d_add_relu"
    long_a = "fused_" + "_".join(["split_sigmoid_tanh_multiply"] * 20)
    long_b = long_a + "_add"
    assert symbol(short) == short
    assert len(symbol(long_a)) == MAX_SYMBOL and symbol(long_a).startswith(long_a[:MAX_SYMBOL - 13])
    assert symbol(long_a) == symbol(long_a) != symbol(long_b)
