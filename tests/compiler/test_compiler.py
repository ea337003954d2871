"""Compiler front door: bad input is refused clearly; shape subgraphs fold;
output is deterministic; --input-shape and --bind work."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, UnsupportedOperatorError, compile_model
from coldbrew.compiler.passes import fold_constants, load_onnx
from conftest import assert_close, ort_run


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


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


def test_shape_subgraph_folds_to_constants(small_model):
    m = onnx.ModelProto()
    m.CopyFrom(small_model)
    folded = fold_constants.apply(load_onnx.apply(m))
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["Conv", "Relu", "GlobalAveragePool", "Reshape", "Gemm"], ops


def test_expand_range_constantofshape_fold():
    # positions = Range(0, W) expanded to x's shape, W read from Shape(x)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 5])
    i = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "k3"], ["w"], axis=0),
        helper.make_node("Range", ["zero", "w", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("Expand", ["rf", "s"], ["pos"]),
        helper.make_node("Mul", ["pos", "ones"], ["p2"]),
        helper.make_node("Add", ["x", "p2"], ["y"]),
    ]
    m = _model(nodes, [x], [y], [i("k3", 3), i("zero", 0), i("one", 1)])
    folded = fold_constants.apply(load_onnx.apply(onnx.load_from_string(m.SerializeToString())))
    assert [n.op_type for n in folded.graph.node] == ["Add"]
    # the folded positions repeat along channels and rows: stored at their broadcast shape
    assert [list(t.dims) for t in folded.graph.initializer] == [[1, 1, 1, 5]]
    a = np.random.default_rng(0).standard_normal((1, 2, 3, 5)).astype(np.float32)
    assert_close(coldbrew.load(compile_model(m)).run(None, {"x": a})[0], ort_run(m, {"x": a})[0])


def test_folded_constant_keeps_its_extent_where_the_activation_broadcasts():
    """A constant is compacted only along axes the other operand already
    spans: one that also widens the output keeps its full extent."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 5])
    c = numpy_helper.from_array(np.full((1, 2, 3, 5), 0.5, np.float32), "c")
    m = _model([helper.make_node("Mul", ["x", "c"], ["y"])], [x], [y], [c])
    folded = fold_constants.apply(load_onnx.apply(onnx.load_from_string(m.SerializeToString())))
    assert [list(t.dims) for t in folded.graph.initializer] == [[1, 2, 1, 1]]
    a = np.random.default_rng(1).standard_normal((1, 1, 3, 5)).astype(np.float32)
    assert_close(coldbrew.load(compile_model(m)).run(None, {"x": a})[0], ort_run(m, {"x": a})[0])


def test_non_constant_shape_input_is_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    s = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")], [x, s], [y])
    with pytest.raises(CompileError, match=r"Reshape node 'rs': input 1 \('shape'\) must be a compile-time constant"):
        compile_model(m)
    sess = coldbrew.load(compile_model(m, constants={"shape": np.array([3, 4], np.int64)}))
    assert sess.get_outputs()[0].shape == [3, 4] and [i.name for i in sess.get_inputs()] == ["x"]


def test_integer_inputs_and_multiple_outputs():
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [3])
    table = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4), "table")
    nodes = [helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0),
             helper.make_node("ReduceSum", ["rows"], ["total"], keepdims=0),
             helper.make_node("Greater", ["rows", "ten"], ["big"])]
    outs = [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("big", TensorProto.BOOL, [3, 4])]
    m = _model(nodes, [idx], outs, [table, numpy_helper.from_array(np.array(10, np.float32), "ten")])
    feeds = {"idx": np.array([4, 0, 2], np.int64)}
    got = coldbrew.load(compile_model(m)).run(None, feeds)
    for g, r in zip(got, ort_run(m, feeds)):
        assert_close(g, r)


def test_passthrough_and_constant_outputs():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in ("same", "const", "dup1", "dup2")]
    c = numpy_helper.from_array(np.eye(2, dtype=np.float32), "c")
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Identity", ["c"], ["const"]),
             helper.make_node("Relu", ["x"], ["dup1"]), helper.make_node("Identity", ["dup1"], ["dup2"])]
    m = _model(nodes, [x], outs, [c])
    a = np.array([[1, -2], [-3, 4]], np.float32)
    got = coldbrew.load(compile_model(m)).run(None, {"x": a})
    for g, r in zip(got, ort_run(m, {"x": a})):
        np.testing.assert_array_equal(g, r)


def test_deterministic_bundle(small_model):
    assert compile_model(small_model) == compile_model(small_model)


def test_dump_ir_writes_every_pass(small_model, tmp_path):
    from coldbrew.compiler import PASSES

    compile_model(small_model, dump_ir=str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n[3:-4] for n in names] == [p.NAME for p in PASSES]


