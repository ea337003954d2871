"""Compiler end to end: integer inputs, several outputs, outputs that pass an
input or a constant through; output is deterministic; --dump-ir writes the
IR after every pass. (The front door's refusals, --input-shape and --bind:
passes/test_load_onnx.py; shape subgraphs folding: passes/test_fold_constants.py.)"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from conftest import assert_close, ort_run
from onnx_graphs import _model


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
    assert_close(got, ort_run(m, feeds))


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
