"""compiler/passes/legalize_onnx.py: Pow forms the importer lacks rewritten to
equivalent ones (same outputs), and shape-deciding inputs required constant."""
import numpy as np
import onnx
import pytest
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

from coldbrew.compiler import CompileError
from coldbrew.compiler.passes import legalize_onnx


def pow_model(base, expo, base_values=None):
    inits = [numpy_helper.from_array(np.array(2, dtype=helper.tensor_dtype_to_np_dtype(expo)), "e")]
    g = helper.make_graph([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")], "pow",
                          [helper.make_tensor_value_info("x", base, [4])],
                          [helper.make_tensor_value_info("y", base, [4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


@pytest.mark.parametrize("base, expo, casts", [(TensorProto.FLOAT, TensorProto.INT64, 1),
                                               (TensorProto.INT32, TensorProto.INT32, 3),
                                               (TensorProto.FLOAT, TensorProto.FLOAT, 0)])
def test_pow_is_rewritten_with_the_same_result(base, expo, casts):
    model = pow_model(base, expo)
    x = np.array([1, 2, 3, -4], dtype=helper.tensor_dtype_to_np_dtype(base))
    out = legalize_onnx.apply(onnx.ModelProto.FromString(model.SerializeToString()))
    assert [n.op_type for n in out.graph.node].count("Cast") == casts
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], ort_run(model, {"x": x})[0])


def test_a_shape_deciding_input_that_is_not_constant_is_refused():
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="shape"):
        legalize_onnx.apply(m)
