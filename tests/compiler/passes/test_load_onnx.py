"""compiler/passes/load_onnx.py: a file that is not ONNX, a graph the ONNX
checker rejects, an opset out of range and unsupported operators (all named
at once) are refused clearly; input dimensions that are not fixed need
--input-shape; --bind turns an input into a constant."""
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import coldbrew
from coldbrew.compiler import CompileError, UnsupportedOperatorError, compile_model
from coldbrew.compiler.passes import load_onnx
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "compiler"))
from onnx_graphs import _model  # noqa: E402


def test_non_onnx_file(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    with pytest.raises(CompileError, match="not an ONNX model"):
        compile_model(str(p))
    with pytest.raises(CompileError, match="cannot read model"):
        compile_model(str(tmp_path / "missing.onnx"))
    p.write_bytes(b"")
    with pytest.raises(CompileError, match="not an ONNX model"):
        compile_model(str(p))


def test_checker_rejects_malformed_graph():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    m = _model([helper.make_node("Relu", ["nowhere"], ["y"])], [x], [y])
    with pytest.raises(CompileError, match="ONNX checker"):
        compile_model(m)


def test_unsupported_ops_are_all_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("DFT", ["a"], ["b"], name="dft1"),
             helper.make_node("Det", ["b"], ["c"], name="det1"),
             helper.make_node("Det", ["c"], ["y"], name="det2")]
    m = _model(nodes, [x], [y])
    with pytest.raises(UnsupportedOperatorError) as e:
        load_onnx.apply(m)
    msg = str(e.value)
    assert "DFT (nodes 'dft1')" in msg and "Det (nodes 'det1', 'det2')" in msg
    assert set(e.value.unsupported) == {"DFT", "Det"}
    custom = _model([helper.make_node("Foo", ["x"], ["y"], domain="com.acme", name="foo")], [x], [y])
    custom.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(UnsupportedOperatorError, match="com.acme.Foo"):
        load_onnx.apply(custom)


def test_dynamic_shape_needs_input_shape():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    with pytest.raises(CompileError, match=r"dimension 0 \('batch'\) is not fixed"):
        compile_model(m)
    with pytest.raises(CompileError, match="names 'z'"):
        compile_model(m, input_shapes={"z": [1, 3]})
    with pytest.raises(CompileError, match="rank 2"):
        compile_model(m, input_shapes={"x": [1, 3, 3]})
    sess = coldbrew.load(compile_model(m, input_shapes={"x": [4, 3]}))
    assert sess.get_inputs()[0].shape == [4, 3]
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(sess.run(None, {"x": a})[0], np.maximum(a, 0))


def test_opset_out_of_range():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], opset=99)
    with pytest.raises(CompileError, match="opset"):
        compile_model(m)


def test_non_constant_shape_input_is_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    s = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")], [x, s], [y])
    with pytest.raises(CompileError, match=r"Reshape node 'rs': input 1 \('shape'\) must be a compile-time constant"):
        compile_model(m)
    sess = coldbrew.load(compile_model(m, constants={"shape": np.array([3, 4], np.int64)}))
    assert sess.get_outputs()[0].shape == [3, 4] and [i.name for i in sess.get_inputs()] == ["x"]
