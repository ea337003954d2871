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


def _external(small_model, folder):
    """small_model saved with its weights in an external data file beside it."""
    import copy

    import onnx

    m = copy.deepcopy(small_model)
    path = str(folder / "m.onnx")
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
                    size_threshold=0)
    return path


def test_weights_in_an_external_data_file_are_read_from_beside_the_model(small_model, tmp_path):
    import coldbrew
    from conftest import ort_run

    path = _external(small_model, tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (want,) = ort_run(small_model, {"x": x})
    got = coldbrew.load(compile_model(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_external_data_that_cannot_be_found_is_named(small_model, tmp_path):
    import os

    path = _external(small_model, tmp_path)
    with pytest.raises(CompileError, match="external data file.*m.onnx.data: give the model's path"):
        compile_model(open(path, "rb").read())
    os.remove(tmp_path / "m.onnx.data")
    with pytest.raises(CompileError, match=r"external data file\(s\) m.onnx.data are not beside it"):
        compile_model(path)


def test_an_exporters_placeholder_shape_gives_way_to_the_input_shape(small_model):
    """An old export records the shapes of its own input everywhere (value_info,
    outputs); another --input-shape must not meet them."""
    import copy

    import onnx

    import coldbrew
    from conftest import ort_run

    m = onnx.shape_inference.infer_shapes(copy.deepcopy(small_model))
    assert len(m.graph.value_info) > 0  # the recorded shapes, for [1, 3, 16, 16]
    data = compile_model(m, input_shapes={"x": [1, 3, 24, 20]})
    x = np.random.default_rng(1).standard_normal((1, 3, 24, 20)).astype(np.float32)
    fixed = copy.deepcopy(small_model)
    fixed.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 24
    fixed.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 20
    (want,) = ort_run(fixed, {"x": x})
    np.testing.assert_allclose(coldbrew.load(data).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def _if_model(branch):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=branch("t"),
                                            else_branch=branch("e"))], "g",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_an_inference_error_inside_a_subgraph_names_the_chain_of_nodes():
    """A branch whose node takes types it cannot: the message names the If
    and the node inside it, and says what is wrong."""
    from onnx import TensorProto, helper

    from coldbrew.compiler import CompileError, compile_model

    def branch(name):
        nodes = [helper.make_node("Constant", [], [f"{name}_k"], value_int=2, name=f"{name}_k"),
                 helper.make_node("Add", ["x", f"{name}_k"], [f"{name}_y"], name=f"{name}_add")]  # float + int64
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [3])])
    with pytest.raises(CompileError, match=r"do not check: in If node 'the_if' > Add node '[te]_add': "):
        compile_model(_if_model(branch))


def test_a_branch_output_declared_with_a_wrong_shape_is_inferred_anew():
    """An exporter's branch output declared a scalar where its node makes a
    [3] (onnxruntime ignores the record): the declarations dropped, the
    shapes inferred, the If computed as onnxruntime computes it."""
    import numpy as np
    from conftest import ort_run
    from onnx import TensorProto, helper

    import coldbrew
    from coldbrew.compiler import compile_model

    def branch(name):
        op = "Relu" if name == "t" else "Neg"
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"], name=f"{name}_op")], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [])])  # x is [3]
    m = _if_model(branch)
    sess = coldbrew.load(compile_model(m))
    for c in (True, False):
        feeds = {"c": np.array(c), "x": np.array([-1.0, 2.0, -3.0], np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(m, feeds)[0])


def test_nodes_out_of_order_and_a_wrong_saved_shape_are_taken_as_engines_take_them():
    """An exporter's nodes written out of order (the ONNX checker requires
    the order, engines sort) and its value_info record of a shape that
    inference contradicts (engines re-infer): sorted, the record dropped;
    the bundle computes onnxruntime's result."""
    import coldbrew
    from coldbrew.compiler import compile_model
    from conftest import ort_run
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["r", "x"], ["y"]), helper.make_node("Relu", ["x"], ["r"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, [6])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    x = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
    got = coldbrew.load(compile_model(m)).run(None, {"x": x})[0]
    ordered = helper.make_model(helper.make_graph(nodes[::-1], "g", list(g.input), list(g.output)),
                                opset_imports=[helper.make_opsetid("", 17)])
    ordered.ir_version = 9
    np.testing.assert_array_equal(got, ort_run(ordered, {"x": x})[0])
