"""Quantized convolutions on the integer kernel (conv2d.pair_blocked): a
ConvInteger after DynamicQuantizeLinear (onnxruntime's quantize_dynamic of
a CNN) and a QDQ convolution (QuantizeLinear / DequantizeLinear around a
float Conv) take it where compiler/ir/grid.py finds the input on an
integer grid, and match onnxruntime; convolutions whose input is on no
grid within the kernel's bound keep the float kernel."""
import numpy as np
import pytest
from conftest import assert_close, ort_run
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.ir.forms import DTYPES

C, K, H, W = 16, 24, 18, 20


def _model(nodes, inits, out_shape=(1, K, H, W), c=C):
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", T.FLOAT, [1, c, H, W])],
                          [helper.make_tensor_value_info("y", T.FLOAT, list(out_shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def conv_integer(weights, stride=1, c=C, zero=134):
    """x -> DynamicQuantizeLinear -> ConvInteger (3x3, pads 1) -> Cast -> Mul
    by the scales -> Relu. uint8 weights with a zero point far from 128
    (centred, they leave int8: [-134, 121]), or 7-bit int8 ones (onnxruntime's
    uint8 x int8 kernel on AVX2 saturates product pairs of full-range ones)."""
    rng = np.random.default_rng(5)
    if weights == "uint8":
        w, wz = rng.integers(0, 256, (K, c, 3, 3)).astype(np.uint8), np.uint8(zero)
    else:
        w, wz = rng.integers(-64, 64, (K, c, 3, 3)).astype(np.int8), np.int8(3)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("ConvInteger", ["q", "w", "z", "wz"], ["p"], pads=[1, 1, 1, 1], strides=[stride, stride]),
             helper.make_node("Cast", ["p"], ["pf"], to=T.FLOAT),
             helper.make_node("Mul", ["s", "ws"], ["scale"]),
             helper.make_node("Mul", ["pf", "scale"], ["y0"]),
             helper.make_node("Relu", ["y0"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(wz), "wz"),
             numpy_helper.from_array(np.float32(0.0123), "ws")]
    return _model(nodes, inits, (1, K, -(-H // stride), -(-W // stride)), c)


def qdq_conv(zero=128, kind=np.uint8):
    """x -> QuantizeLinear -> DequantizeLinear -> Conv with DequantizeLinear'd
    int8 weights (a scale per output channel) and a bias -> Relu."""
    rng = np.random.default_rng(6)
    w = rng.integers(-64, 64, (K, C, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["y0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y0"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array((rng.random(K) * 0.02 + 1e-3).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(K, np.int8), "wz"),
             numpy_helper.from_array(np.float32(0.03), "xs"), numpy_helper.from_array(np.array(zero, kind), "xz"),
             numpy_helper.from_array(rng.standard_normal(K).astype(np.float32), "b")]
    return _model(nodes, inits)


def _conv_steps(data):
    """{variant: weight dtype} of a bundle's convolution layers."""
    b = read_bytes(data)[0]
    return {s.variant.decode(): DTYPES[s.weightPrecision] for s in b.plan.steps
            if s.variant.decode().startswith("conv2d")}


def _feeds(seed=0, c=C):
    return {"x": (np.random.default_rng(seed).standard_normal((1, c, H, W)) * 3).astype(np.float32)}


def _run(tmp_path, model, data, seeds=(0, 1)):
    path = tmp_path / "m.brew"
    path.write_bytes(data)
    sess = coldbrew.load(str(path))
    c = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    for seed in seeds:
        feeds = _feeds(seed, c)
        assert_close(sess.run(None, feeds)[0], ort_run(model, feeds)[0], rel=1e-5)


def _integer_kernel_here():
    from coldbrew.compiler.kernels import ConvSpec, get
    from coldbrew.targets import resolve

    vector = resolve("host").vector
    return get("conv2d.pair_blocked", vector).applies(
        ConvSpec(1, C, H, W, K, 3, 3, (1, 1), (1, 1, 1, 1), in_block=vector.lanes, out_block=vector.lanes, in_scale=1.0))


@pytest.mark.parametrize("weights", ["uint8", "int8"])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_integer_runs_on_the_integer_kernel_and_matches_onnxruntime(tmp_path, weights, stride):
    """The int32 sums are exact, so the outputs match onnxruntime's to its
    float epilogue; the weights are stored int16 (uint8 ones less 134 do
    not fit int8)."""
    model = conv_integer(weights, stride)
    data = compile_model(model)
    if _integer_kernel_here():
        assert _conv_steps(data) == {"conv2d.pair_blocked": "int16"}
    _run(tmp_path, model, data)


@pytest.mark.parametrize("zero, kind", [(128, np.uint8), (0, np.int8), (37, np.uint8)])
def test_qdq_convolution_runs_on_the_integer_kernel_and_matches_onnxruntime(tmp_path, zero, kind):
    """The input's grid is the DequantizeLinear's scale; each output is its
    integer sum times that scale and its channel's weight scale."""
    model = qdq_conv(zero, kind)
    data = compile_model(model)
    if _integer_kernel_here():
        assert _conv_steps(data) == {"conv2d.pair_blocked": "int16"}
    _run(tmp_path, model, data)


def test_inputs_on_no_grid_keep_the_float_kernel():
    """The same weights on a float input (no quantization before the conv),
    and integers past the kernel's bound (int16 values cast to float): the
    float kernel."""
    q = qdq_conv()
    plain = [n for n in q.graph.node if n.op_type != "QuantizeLinear" and n.input[0] != "q"]
    for n in plain:
        if n.op_type == "Conv":
            n.input[0] = "x"
    assert "conv2d.pair_blocked" not in _conv_steps(compile_model(_model(plain, list(q.graph.initializer))))
    wide = [helper.make_node("Cast", ["x"], ["x16"], to=T.INT16), helper.make_node("Cast", ["x16"], ["xf"], to=T.FLOAT)]
    for n in plain:
        if n.op_type == "Conv":
            n.input[0] = "xf"
    assert "conv2d.pair_blocked" not in _conv_steps(compile_model(_model(wide + plain, list(q.graph.initializer))))


def test_a_conv_integer_summed_in_runs_of_channels_takes_the_integer_kernel(tmp_path):
    """A ConvInteger whose float32 sums would not be exact (64 channels of
    weights up to 255: compiler/onnx/decompose.py sums Slices of the input's
    channels, each an exact float32 Conv): every run on the grid (the
    Slices only pick values), each on the integer kernel."""
    model = conv_integer("uint8", c=64, zero=0)
    data = compile_model(model)
    if _integer_kernel_here():
        assert set(_conv_steps(data).items()) == {("conv2d.pair_blocked", "int16")}
        assert sum(s.variant.decode() == "conv2d.pair_blocked" for s in read_bytes(data)[0].plan.steps) > 1
    _run(tmp_path, model, data)


def test_the_grid_is_found_through_max_pooling_and_slices(tmp_path):
    """A DequantizeLinear's output through a MaxPool and a Slice (values
    only picked) stays on its grid."""
    q = qdq_conv()
    nodes, inits = list(q.graph.node), list(q.graph.initializer)
    conv = next(n for n in nodes if n.op_type == "Conv")
    conv.input[0] = "x_picked"
    moves = [helper.make_node("MaxPool", ["xd"], ["xp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Slice", ["xp", "lo", "hi", "ax"], ["x_picked"])]
    inits += [numpy_helper.from_array(np.array([0]), "lo"), numpy_helper.from_array(np.array([C]), "hi"),
              numpy_helper.from_array(np.array([1]), "ax")]
    model = _model(nodes[:2] + moves + nodes[2:], inits)
    data = compile_model(model)
    if _integer_kernel_here():
        assert _conv_steps(data) == {"conv2d.pair_blocked": "int16"}
    _run(tmp_path, model, data)


def test_the_integer_kernels_own_schedule_runs_with_its_border_rows_bounded():
    """Through the compiler (the model's int64 indices): the integer
    kernel's schedule runs, not the generic one it falls back to when a
    step fails (a border-row bound put before its blockize did, in the
    models alone), and its filter-row loop skips the border rows' padding
    (conv_blocked.rows_on_the_input)."""
    from coldbrew.compiler import compile_graph

    _, graph = compile_graph(qdq_conv(), target="x86_64-avx2")  # compiled, not run: any host
    assert not [n for n in graph.notes if "schedule failed" in n], graph.notes
    (kernel,) = [f for name, f in graph.kernels.items() if "pair_blocked" in name]
    loop = next(line for line in kernel.script().splitlines()
                if line.strip().startswith("for ") and "rr" in line.split(" in ")[0].replace(",", " ").split())
    assert "T.max(" in loop, loop
