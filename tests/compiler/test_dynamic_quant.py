"""Dynamic quantization (onnxruntime's quantize_dynamic: DynamicQuantizeLinear
on activations, MatMulInteger with constant 8-bit weights, Cast, Mul by the
two scales) against onnxruntime: the integers equal, the float outputs at
float-model tolerance. The inputs put x / scale on ties (half to even),
where x / scale and x * (1 / scale) round apart, keep the range on one side
of 0 or collapse it to 0 (a scale of 1)."""

import numpy as np
import onnx
import pytest
from conftest import assert_close, ort_run
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model

K, N, ROWS = 64, 24, 4


def _model(nodes, inputs, outputs, inits, opset=17):
    m = helper.make_model(helper.make_graph(nodes, "dq", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _bare(weights=np.int8, per_column=False):
    """x -> DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by the scales;
    the integers (q, its scale and zero point, the int32 products) outputs too.
    int8 weights use 7 bits: onnxruntime's uint8 x int8 kernel on AVX2
    without VNNI sums product pairs in int16, which saturates on full-range
    weights (its quantizer's reduce_range); its uint8 x uint8 one does not."""
    rng = np.random.default_rng(11)
    lo, hi = (-64, 64) if weights == np.int8 else (0, 256)
    w = rng.integers(lo, hi, (K, N)).astype(weights)
    wz = (rng.integers(lo, hi, N) if per_column else np.array(rng.integers(lo, hi))).astype(weights)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["p"]),
             helper.make_node("Cast", ["p"], ["pf"], to=T.FLOAT),
             helper.make_node("Mul", ["s", "ws"], ["scale"]),
             helper.make_node("Mul", ["pf", "scale"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", T.FLOAT, [ROWS, N]), helper.make_tensor_value_info("q", T.UINT8, [ROWS, K]),
               helper.make_tensor_value_info("s", T.FLOAT, []), helper.make_tensor_value_info("z", T.UINT8, []),
               helper.make_tensor_value_info("p", T.INT32, [ROWS, N])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(wz, "wz"),
             numpy_helper.from_array(np.float32(0.0123), "ws")]
    return _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [ROWS, K])], outputs, inits)


def _ties(low):
    """Values whose x / scale is k + 0.5 exactly (a power-of-two scale),
    the zero point itself a tie when `low` is: -low steps below 0."""
    step = np.float32(2.0 ** -4)
    x = ((np.arange(ROWS * K) % 200 - low + 0.5) * step).astype(np.float32)
    x[0], x[1] = -low * step, (255 - low) * step  # the range: 255 steps from -low
    return x.reshape(ROWS, K)


def _quotients_apart():
    """Values on either side of ties where x / scale and x * (1 / scale)
    round to different integers (a scale that is no power of two)."""
    top = np.float32(3.3)
    scale = np.float32(top / np.float32(255))
    found = []
    for k in range(1, 255):
        v = np.float32((k + 0.5) * np.float64(scale))
        for _ in range(8):
            if np.rint(v / scale) != np.rint(v * (np.float32(1) / scale)):
                found.append(v)
            v = np.nextafter(v, np.float32(np.inf))
    assert len(found) >= 8, "no quotient rounds apart: the input checks nothing"
    x = np.resize(np.array(found, np.float32), ROWS * K)
    x[0], x[1] = 0, top
    return x.reshape(ROWS, K)


INPUTS = {
    "normal": lambda: np.random.default_rng(1).standard_normal((ROWS, K)).astype(np.float32),
    "all_positive": lambda: np.random.default_rng(2).random((ROWS, K)).astype(np.float32) + 0.5,
    "all_negative": lambda: -np.random.default_rng(3).random((ROWS, K)).astype(np.float32) - 0.5,
    "constant": lambda: np.full((ROWS, K), -2.5, np.float32),
    "all_zero": lambda: np.zeros((ROWS, K), np.float32),
    "ties_zero_point_even": lambda: _ties(10),
    "ties_zero_point_odd": lambda: _ties(11),
    "quotients_apart": _quotients_apart,
}


@pytest.fixture(scope="module")
def bare_bundles():
    return {key: coldbrew.load(compile_model(_bare(*key), target="host"))
            for key in ((np.int8, False), (np.uint8, True))}


@pytest.mark.parametrize("weights", [(np.int8, False), (np.uint8, True)], ids=["int8", "uint8_per_column"])
@pytest.mark.parametrize("case", list(INPUTS))
def test_integers_match_onnxruntime(bare_bundles, weights, case):
    x = INPUTS[case]()
    ours = bare_bundles[weights].run(None, {"x": x})
    ref = ort_run(_bare(*weights), {"x": x})
    for name, o, r in zip(("y", "q", "scale", "zero point", "products"), ours, ref):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(r), err_msg=f"{case}: {name}")


def _block(seq=16, d=64, ff=128):
    """A small transformer block: RMS norm, single-head attention, Relu FFN."""
    rng = np.random.default_rng(4)
    inits, nodes = [], []

    def const(v):
        inits.append(numpy_helper.from_array(np.asarray(v), f"c{len(inits)}"))
        return inits[-1].name

    def op(kind, ins, **kw):
        nodes.append(helper.make_node(kind, ins, [f"t{len(nodes)}"], **kw))
        return nodes[-1].output[0]

    def linear(x, i, o):
        return op("MatMul", [x, const((rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32))])

    def rms(x):
        mean = op("ReduceMean", [op("Pow", [x, const(np.float32(2))])], axes=[-1])
        return op("Mul", [x, op("Reciprocal", [op("Sqrt", [op("Add", [mean, const(np.float32(1e-6))])])])])

    h = rms("x")
    q, k, v = linear(h, d, d), linear(h, d, d), linear(h, d, d)
    scores = op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 2, 1])]), const(np.float32(d ** -0.5))])
    x = op("Add", ["x", linear(op("MatMul", [op("Softmax", [scores], axis=-1), v]), d, d)])
    op("Add", [x, linear(op("Relu", [linear(rms(x), d, ff)]), ff, d)])
    nodes[-1].output[0] = "y"
    return _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [1, seq, d])],
                  [helper.make_tensor_value_info("y", T.FLOAT, [1, seq, d])], inits, opset=13)


@pytest.mark.parametrize("weights", ["QInt8", "QUInt8"])
def test_quantized_block_matches_onnxruntime(tmp_path, weights):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx.save(_block(), tmp_path / "f.onnx")
    # reduce_range: 7-bit weights, which onnxruntime's AVX2 kernel without VNNI multiplies without saturating
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=getattr(QuantType, weights),
                     reduce_range=True)
    model = onnx.load(tmp_path / "q.onnx")
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    x = np.random.default_rng(5).standard_normal((1, 16, 64)).astype(np.float32)
    ours = coldbrew.load(compile_model(model, target="host")).run(None, {"x": x})[0]
    assert_close(ours, ort_run(model, {"x": x})[0], rel=1e-5)
