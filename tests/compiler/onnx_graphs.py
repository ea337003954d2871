"""ONNX models built from nodes, for the compiler's tests
(test_compiler.py, passes/test_load_onnx.py, passes/test_fold_constants.py)."""
from onnx import helper


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m
