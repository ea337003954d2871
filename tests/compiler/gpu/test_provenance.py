"""A GPU layer the GPU path cannot compile is refused in words about the
model: the ONNX operator and node, then what the GPU path lacks."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from coldbrew.compiler import CompileError, compile_model
from gpu_models import needs_tools


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@needs_tools
def test_a_kernel_with_no_gpu_form_is_refused_naming_its_operator_and_node():
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top_boxes")],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
              [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 5]),
               helper.make_tensor_value_info("i", TensorProto.INT64, [1, 5])],
              [numpy_helper.from_array(np.array([5], np.int64), "k")])
    with pytest.raises(CompileError, match=r"^TopK node(\(s\))? 'top_boxes' cannot run on the GPU: .*kernel topk"):
        compile_model(m, target="vulkan")


@needs_tools
def test_a_shader_the_emitter_cannot_write_is_refused_naming_the_node():
    """float16 arithmetic has no GLSL form here: the Cast node is named."""
    m = model([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="to_half"),
               helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="to_float")],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    with pytest.raises(CompileError, match=r"^Cast node 'to_(half|float)' cannot run on the GPU: .*float16"):
        compile_model(m, target="vulkan")
