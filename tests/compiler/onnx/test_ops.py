"""compiler/onnx/ops.py: facts about an ONNX graph (its inputs, which inputs a shape depends on)."""
import pytest
from onnx import TensorProto, helper

from coldbrew.compiler import CompileError
from coldbrew.compiler.onnx.ops import check_static, graph_inputs


def test_graph_inputs_leave_out_initializers():
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    assert [i.name for i in graph_inputs(helper.make_model(graph))] == ["x"]


def test_check_static_names_the_model_input_a_shape_depends_on():
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    with pytest.raises(CompileError, match=r"Reshape node 'r': input 1 \('s'\) must be a compile-time constant .* "
                                           r"model input\(s\) s; bind them with --bind"):
        check_static(helper.make_model(graph))
