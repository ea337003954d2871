"""compiler/onnx/recurrent.py: LSTM, GRU and onnxruntime's quantized LSTM,
unrolled into plain ONNX nodes (GPU targets) or as a cell layer (CPU),
compute what onnxruntime computes for the cell (both directions, initial
states, both GRU reset orders), and what unrolling does not cover is named."""
import numpy as np
import pytest
import cell_models as cells
from conftest import ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import CompileError, compile_model

SEQ, BATCH, IN, HID = 3, 2, 5, 4


def cell_model(op, direction="bidirectional", initial=True, **attrs):
    return cells.cell_model(op, direction, SEQ, BATCH, IN, HID, initial, "rnn", seed=3, scale=0.5, **attrs)


CASES = [("LSTM", "bidirectional", {}), ("LSTM", "reverse", {}), ("LSTM", "forward", {}),
         ("GRU", "bidirectional", {"linear_before_reset": 1}), ("GRU", "forward", {"linear_before_reset": 0}),
         ("GRU", "reverse", {})]


def unrolled(model):
    """The bundle of `model` with its cells unrolled (as for a GPU target),
    checked to have no cell layer."""
    from coldbrew.compiler.bundle.reader import read_bytes
    from coldbrew.compiler.pipeline import compile_graph, front_end

    data, _ = compile_graph(model, front=front_end(model, cells=False))
    assert not any((s.variant or b"").startswith(b"recurrent.") for s in read_bytes(data)[0].plan.steps)
    return data


@pytest.mark.parametrize("op,direction,attrs", CASES)
@pytest.mark.parametrize("compile", [unrolled, compile_model], ids=["unrolled", "cell"])
def test_a_cell_computes_what_onnxruntime_computes(op, direction, attrs, compile):
    model = cell_model(op, direction, **attrs)
    rng = np.random.default_rng(5)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort_run(model, feeds)
    got = coldbrew.load(compile(model)).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("compile", [unrolled, compile_model], ids=["unrolled", "cell"])
def test_without_initial_states_they_start_at_zero(compile):
    model = cell_model("LSTM", "forward", initial=False)
    x = np.random.default_rng(6).standard_normal((SEQ, BATCH, IN)).astype(np.float32)
    for w, g in zip(ort_run(model, {"x": x}), coldbrew.load(compile(model)).run(None, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,words", [({"clip": 1.0}, "the clip attribute"),
                                         ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations"),
                                         ({"input_forget": 1}, "input_forget=1")])
def test_what_unrolling_does_not_cover_is_named(attrs, words):
    with pytest.raises(CompileError, match=f"LSTM node 'rnn': unrolling it is not supported with .*{words}"):
        compile_model(cell_model("LSTM", "forward", **attrs))


def quantized_cell(direction, h0_zero=False, per_column=False, chained=False):
    """onnxruntime's com.microsoft.DynamicQuantizeLSTM with int8 weights
    (and, chained, a second one reading the first's output through a
    Shape-computed Reshape, as exporters write it). The weights use 7 bits
    (onnxruntime's quantizer's reduce_range): onnxruntime's AVX2 kernel
    without VNNI sums pairs of uint8 x int8 products in int16, which
    saturates on full-range weights (on a Zen 3, full-range weights put
    onnxruntime's results 0.56 away from coldbrew's; on AVX-512 machines
    with VNNI they agreed)."""
    rng = np.random.default_rng(5)
    dirs = 2 if direction == "bidirectional" else 1
    inits, nodes = [], []

    def cell(k, x, inp):
        w = rng.integers(-64, 64, (dirs, inp, 4 * HID)).astype(np.int8)
        r = rng.integers(-64, 64, (dirs, HID, 4 * HID)).astype(np.int8)
        scale = (dirs, 4 * HID) if per_column else (dirs,)
        inits.extend([numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(r, f"R{k}"),
                      numpy_helper.from_array((rng.standard_normal((dirs, 8 * HID)) * 0.1).astype(np.float32), f"B{k}"),
                      numpy_helper.from_array(rng.uniform(0.005, 0.02, scale).astype(np.float32), f"ws{k}"),
                      numpy_helper.from_array(np.zeros(scale, np.int8) if per_column  # onnxruntime: symmetric
                                              else rng.integers(-3, 3, scale).astype(np.int8), f"wz{k}"),
                      numpy_helper.from_array(rng.uniform(0.01, 0.03, (dirs,)).astype(np.float32), f"rs{k}"),
                      numpy_helper.from_array(np.zeros(dirs, np.int8), f"rz{k}")])
        nodes.append(helper.make_node("DynamicQuantizeLSTM", [x, f"W{k}", f"R{k}", f"B{k}", "", "h0", "c0", "",
                                                              f"ws{k}", f"wz{k}", f"rs{k}", f"rz{k}"],
                                      [f"y{k}", f"yh{k}", ""], domain="com.microsoft", direction=direction,
                                      hidden_size=HID))
        return f"y{k}"

    y = cell(0, "x", IN)
    if chained:  # [seq, dirs, batch, hid] -> [seq, batch, dirs * hid], its shape computed from the output's
        inits.append(numpy_helper.from_array(np.array([0, 1, 3], np.int64), "keep"))
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "minus1"))
        nodes += [helper.make_node("Transpose", [y], ["yt"], perm=[0, 2, 1, 3]),
                  helper.make_node("Shape", ["yt"], ["ys"]),
                  helper.make_node("Gather", ["ys", "keep"], ["dims3"]),
                  helper.make_node("Slice", ["dims3", "zero1", "two1"], ["dims2"]),
                  helper.make_node("Concat", ["dims2", "minus1"], ["shape"], axis=0),
                  helper.make_node("Reshape", ["yt", "shape"], ["x1"])]
        inits += [numpy_helper.from_array(np.array([0], np.int64), "zero1"),
                  numpy_helper.from_array(np.array([2], np.int64), "two1")]
        y = cell(1, "x1", dirs * HID)
    g = helper.make_graph(nodes, "qcell", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, BATCH, IN]),
                                           helper.make_tensor_value_info("h0", TensorProto.FLOAT, [dirs, BATCH, HID]),
                                           helper.make_tensor_value_info("c0", TensorProto.FLOAT, [dirs, BATCH, HID])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, [SEQ, dirs, BATCH, HID])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    rng2 = np.random.default_rng(6)
    feeds = {"x": rng2.standard_normal((SEQ, BATCH, IN)).astype(np.float32),
             "h0": np.zeros((dirs, BATCH, HID), np.float32) if h0_zero
             else (rng2.standard_normal((dirs, BATCH, HID)) * 0.5).astype(np.float32),
             "c0": (rng2.standard_normal((dirs, BATCH, HID)) * 0.5).astype(np.float32)}
    return m, feeds


@pytest.mark.parametrize("direction, h0_zero, per_column, chained", [
    ("forward", False, False, False), ("reverse", True, False, False), ("bidirectional", False, True, False),
    ("bidirectional", False, False, True)])
@pytest.mark.parametrize("compile", [unrolled, compile_model], ids=["unrolled", "cell"])
def test_quantized_lstm_computes_what_onnxruntime_computes(direction, h0_zero, per_column, chained, compile):
    """Every product quantizes its left operand on the fly as onnxruntime
    does, so the results agree to float rounding, not to int8 steps
    (onnxruntime on two threads: on one it quantizes the state of the whole
    batch at once, per row on more)."""
    import onnxruntime as ort

    model, feeds = quantized_cell(direction, h0_zero, per_column, chained)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = coldbrew.load(compile(model)).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def test_a_quantized_cell_reads_its_int8_weights_in_place():
    """The quantized cell's recurrent weights are the model's int8 values
    (their scales applied to each sum): the kernel reads them int8, in
    place, a quarter of the bytes every step streams."""
    from coldbrew.compiler.bundle.reader import WEIGHT_FORMS, read_bytes
    from coldbrew.compiler.tools.inspect import PRECISION_OF_DTYPE

    model, feeds = quantized_cell("bidirectional")
    step = next(st for st in read_bytes(compile_model(model))[0].plan.steps
                if (st.variant or b"").startswith(b"recurrent."))
    assert WEIGHT_FORMS[step.weightForm] == "direct" and PRECISION_OF_DTYPE[step.weightPrecision] == "int8"
    # where the CPU has VNNI, or AVX2, the cell multiplies the integers themselves
    from coldbrew.targets import resolve
    vector = resolve("host").vector
    assert step.variant.decode() == ("recurrent.int8_dot" if vector.int8_dot else "recurrent.pair_dot"
                                     if vector.isa in ("avx2", "avx512") else "recurrent.packed")
