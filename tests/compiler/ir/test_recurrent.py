"""compiler/ir/recurrent.py: LSTM and GRU unrolled into plain ONNX nodes
compute what onnxruntime computes for the cell (both directions, initial
states, both GRU reset orders), and what unrolling does not cover is named."""
import numpy as np
import pytest
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, compile_model

SEQ, BATCH, IN, HID = 3, 2, 5, 4


def cell_model(op, direction="bidirectional", initial=True, **attrs):
    rng = np.random.default_rng(3)
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    inits = [numpy_helper.from_array((rng.standard_normal((dirs, gates * HID, IN)) * 0.5).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((dirs, gates * HID, HID)) * 0.5).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal((dirs, 2 * gates * HID)) * 0.5).astype(np.float32), "B")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, BATCH, IN])]
    names = ["x", "W", "R", "B", ""]
    if initial:
        names.append("h0")
        inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, [dirs, BATCH, HID]))
        if op == "LSTM":
            names.append("c0")
            inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, [dirs, BATCH, HID]))
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, name="rnn", hidden_size=HID, direction=direction, **attrs)
    g = helper.make_graph([node], "cell", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SEQ, dirs, BATCH, HID])] +
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [dirs, BATCH, HID]) for o in outs[1:]],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


CASES = [("LSTM", "bidirectional", {}), ("LSTM", "reverse", {}), ("LSTM", "forward", {}),
         ("GRU", "bidirectional", {"linear_before_reset": 1}), ("GRU", "forward", {"linear_before_reset": 0}),
         ("GRU", "reverse", {})]


@pytest.mark.parametrize("op,direction,attrs", CASES)
def test_an_unrolled_cell_computes_what_onnxruntime_computes(op, direction, attrs):
    model = cell_model(op, direction, **attrs)
    rng = np.random.default_rng(5)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort_run(model, feeds)
    got = coldbrew.load(compile_model(model)).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_without_initial_states_they_start_at_zero():
    model = cell_model("LSTM", "forward", initial=False)
    x = np.random.default_rng(6).standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    for w, g in zip(ort_run(model, {"x": x}), coldbrew.load(compile_model(model)).run(None, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,words", [({"clip": 1.0}, "the clip attribute"),
                                         ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations"),
                                         ({"input_forget": 1}, "input_forget=1")])
def test_what_unrolling_does_not_cover_is_named(attrs, words):
    with pytest.raises(CompileError, match=f"LSTM node 'rnn': unrolling it is not supported with .*{words}"):
        compile_model(cell_model("LSTM", "forward", **attrs))
