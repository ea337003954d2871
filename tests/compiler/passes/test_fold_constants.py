"""The pass fold_constants (compiler/onnx/fold.py): shape subgraphs (Shape, Gather, Range,
ConstantOfShape, Expand, ...) fold to constants, and a folded constant is
stored at its smallest broadcast shape only where the other operand spans
the output."""
import os
import sys

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.passes import fold_constants, load_onnx
from conftest import ROOT, assert_close, ort_run

sys.path.insert(0, os.path.join(ROOT, "tests", "compiler"))
from onnx_graphs import _model  # noqa: E402


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


@pytest.mark.parametrize("flag", [True, False])
def test_an_if_with_a_bound_condition_becomes_the_branch_it_takes(flag):
    from if_models import if_model

    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    model = load_onnx.apply(if_model(), constants={"flag": np.array([flag])})
    folded = fold_constants.apply(model)
    assert [n.op_type for n in folded.graph.node] == (["Mul", "Relu", "Identity"] if flag else ["Sub", "Identity"])
    assert all(n.name.startswith("gate/") for n in folded.graph.node)
    (y,) = ort_run(folded, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x * 2, 0) if flag else x - 1)


def test_values_read_only_inside_a_branch_are_kept():
    from if_models import if_model

    folded = fold_constants.apply(load_onnx.apply(if_model(cond_from="x")))
    assert [n.op_type for n in folded.graph.node][-1] == "If"
    assert {"w", "one"} <= {t.name for t in folded.graph.initializer}


def test_inputs_that_are_constants_are_inputs_no_more():
    """An IR-3 export lists its initializers as graph inputs: after folding,
    the model's only input is its real one. (Before, a BatchNormalization's
    parameters stayed inputs after fold_batchnorm took their values, and
    extract_layers failed on them.)"""
    from conftest import ort_run

    rng = np.random.default_rng(9)
    params = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "s": rng.random(4).astype(np.float32) + 0.5,
              "b": rng.standard_normal(4).astype(np.float32), "mean": rng.standard_normal(4).astype(np.float32),
              "var": rng.random(4).astype(np.float32) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mean", "var"], ["y"])]
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    vi += [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in params.items()]
    g = helper.make_graph(nodes, "ir3", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [numpy_helper.from_array(v, k) for k, v in params.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    folded = fold_constants.apply(load_onnx.apply(onnx.load_model_from_string(model.SerializeToString())))
    assert [i.name for i in folded.graph.input] == ["x"]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_close(coldbrew.load(compile_model(model)).run(None, {"x": x})[0], ort_run(model, {"x": x})[0])


def test_constants_that_do_not_fit_their_node_are_named():
    """A Reshape of a constant to a size it lacks is the model's error,
    named with the node; a node ONNX's reference cannot compute at its
    opset stays for run time."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["c", "s"], ["r"], name="bad_reshape"),
         helper.make_node("Add", ["x", "r"], ["y"])], "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.ones(4, np.float32), "c"), numpy_helper.from_array(np.array([3]), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match="Reshape node 'bad_reshape' computes from constants only.*cannot reshape"):
        fold_constants.apply(m)
