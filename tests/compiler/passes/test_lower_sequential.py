"""compiler/passes/lower_sequential.py: coldbrew's own TopK and CumSum
kernels (TVM's lowerings call functions the runtime lacks) agree with their
numpy references and with onnxruntime: ties resolved by the lower index,
largest and smallest, an inner axis, k equal to the axis length; running
sums inclusive and exclusive along any axis."""
import numpy as np
import pytest
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.passes.lower_sequential import topk_reference


def topk_model(shape, k, axis, largest):
    out = list(shape)
    out[axis] = k
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)], "topk",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, out),
                           helper.make_tensor_value_info("i", TensorProto.INT64, out)],
                          [numpy_helper.from_array(np.array([k], np.int64), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("shape, k, axis, largest", [((2, 50, 3), 7, 1, 1), ((2, 50, 3), 7, 1, 0),
                                                     ((4, 9), 9, -1, 1), ((1, 300), 1, 1, 1)])
def test_topk(shape, k, axis, largest):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, shape).astype(np.float32)  # many ties
    model = topk_model(shape, k, axis, largest)
    v, i = coldbrew.load(compile_model(model)).run(None, {"x": x})
    rv, ri = topk_reference(x, k, axis % len(shape), bool(largest))
    np.testing.assert_array_equal(v, rv)
    np.testing.assert_array_equal(i, ri)
    ov, oi = ort_run(model, {"x": x})
    np.testing.assert_array_equal(v, ov)
    np.testing.assert_array_equal(i, oi)


def test_topk_reference_keeps_the_lower_index_first():
    v, i = topk_reference(np.array([[1, 3, 3, 2, 3]], np.float32), 3, 1)
    assert i.tolist() == [[1, 2, 4]] and v.tolist() == [[3, 3, 3]]


@pytest.mark.parametrize("axis, exclusive, reverse", [(0, 0, 0), (1, 1, 0), (2, 0, 1), (-1, 1, 1)])
def test_cumsum(axis, exclusive, reverse):
    x = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    g = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                          "cumsum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                          [numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    got = coldbrew.load(compile_model(model)).run(None, {"x": x})[0]
    ref = np.flip(np.cumsum(np.flip(x, axis) if reverse else x, axis=axis), axis) if reverse else np.cumsum(x, axis=axis)
    if exclusive:
        ref = ref - x
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
