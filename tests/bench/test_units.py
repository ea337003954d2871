"""bench/harness/units.py: a model's heavy layers cut out as models of
their own (bench/kernels.py runs each alone in both engines): a
normalization written out in elementary operators is one layer, a QDQ
MatMul keeps its quantization nodes, and each layer fed the values the
whole model computes gives the whole model's values."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
from harness import units as U  # noqa: E402  (bench/harness/units.py)


def _model():
    """x -> written-out layer norm (scale, shift) -> QDQ MatMul -> Softmax -> MatMul with itself. The int8
    weights use 7 bits: onnxruntime's AVX2 kernel without VNNI saturates on full-range ones (int16 pair sums)."""
    rng = np.random.default_rng(0)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [c("two", 2.0), c("eps", 1e-5), c("gamma", rng.random(16) + 0.5), c("beta", rng.random(16)),
             c("xs", 0.05), numpy_helper.from_array(np.array(128, np.uint8), "xz"),
             numpy_helper.from_array(rng.integers(-64, 64, (16, 8)).astype(np.int8), "wq"), c("ws", 0.02)]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["ng"]),
        helper.make_node("Add", ["ng", "beta"], ["ln"]),
        helper.make_node("QuantizeLinear", ["ln", "xs", "xz"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "xs", "xz"], ["dq"]),
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"]),
        helper.make_node("MatMul", ["dq", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["p"], axis=-1),
        helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["p", "pt"], ["y"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 6])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def test_the_heavy_layers_are_found_whole():
    found = U.units(_model().graph)
    assert [(u.kind, [n.op_type for n in u.nodes]) for u in found] == [
        ("normalization", ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]),
        ("matmul", ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "MatMul"]),
        ("softmax", ["Softmax"]),
        ("matmul", ["MatMul"]),
    ]


def test_each_layer_alone_computes_the_whole_models_values():
    import onnxruntime as ort

    model = _model()
    x = {"x": np.random.default_rng(1).standard_normal((1, 6, 16)).astype(np.float32)}
    found = U.units(model.graph)
    values = U.captured(model, x, [n for u in found for side in U.interface(model.graph, u) for n in side])
    keys = set()
    for u in found:
        m, feeds, key = U.unit_model(model, u, values)
        keys.add(key)
        _, outs = U.interface(model.graph, u)
        got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(outs, feeds)
        for name, v in zip(outs, got):
            np.testing.assert_allclose(v, values[name], rtol=1e-5, atol=1e-6)
        assert all(i.name in feeds for i in m.graph.input)  # weights stay constants, activations are inputs
    assert len(keys) == len(found)  # different shapes or operators: different keys
