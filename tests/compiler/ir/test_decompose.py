"""compiler/ir/decompose.py: each single-operator rewrite computes what
onnxruntime computes for the operator it replaces (and the operator is
gone); float16 products accumulate in float32; ConvInteger is exact."""
import numpy as np
import onnx
import pytest
from conftest import assert_close, ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.ir import decompose
from coldbrew.compiler.passes import legalize_onnx

F = TensorProto.FLOAT


def one_node(op, inputs, out_shape, inits=(), opset=17, out_type=F, **attrs):
    """A model of one `op` node: graph inputs [(name, type, shape)], constant inputs `inits`."""
    names = [n for n, _, _ in inputs] + [t.name for t in inits]
    g = helper.make_graph([helper.make_node(op, names, ["y"], name="n", **attrs)], op,
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info("y", out_type, out_shape)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def c(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
X[0, 0, 0, :3] = [np.inf, -np.inf, np.nan]
CASES = {
    "IsInf positive": one_node("IsInf", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5], out_type=TensorProto.BOOL,
                               detect_negative=0),
    "IsInf negative": one_node("IsInf", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5], out_type=TensorProto.BOOL,
                               detect_positive=0),
    "Celu": one_node("Celu", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5], alpha=0.7),
    "LRN": one_node("LRN", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5], size=3, alpha=0.01, beta=0.6, bias=1.5),
    "Upsample linear": one_node("Upsample", [("x", F, [2, 3, 4, 5])], [2, 3, 8, 7],
                                [c("s", np.array([1, 1, 2, 1.5], np.float32))], opset=9, mode="linear"),
    "Upsample nearest": one_node("Upsample", [("x", F, [2, 3, 4, 5])], [2, 3, 6, 15],
                                 [c("s", np.array([1, 1, 1.5, 3], np.float32))], opset=9),
    "ReverseSequence": one_node("ReverseSequence", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5],
                                [c("lens", np.array([1, 3], np.int64))], batch_axis=0, time_axis=1),
    "ReverseSequence whole": one_node("ReverseSequence", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5],
                                      [c("lens", np.array([2, 2, 2], np.int64))], batch_axis=1, time_axis=0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decomposition_matches_onnxruntime(name):
    model = CASES[name]
    op = model.graph.node[0].op_type
    out = legalize_onnx.apply(onnx.ModelProto.FromString(model.SerializeToString()))
    assert op not in {n.op_type for n in out.graph.node}
    x = np.nan_to_num(X, posinf=3.0, neginf=-3.0) if op not in ("IsInf",) else X
    got = coldbrew.load(compile_model(model)).run(None, {"x": x})[0]
    assert_close(got, ort_run(model, {"x": x})[0])


def test_rms_normalization_over_every_axis():
    """axis 0 normalizes the whole tensor (the importer's own form fails there)."""
    scale = c("scale", np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32))
    model = one_node("RMSNormalization", [("x", F, [2, 3, 4, 5])], [2, 3, 4, 5], [scale], opset=23, axis=0)
    x = np.nan_to_num(X, posinf=3.0, neginf=-3.0)
    got = coldbrew.load(compile_model(model)).run(None, {"x": x})[0]
    s = scale.float_data or numpy_helper.to_array(scale)
    ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5) * np.asarray(s).reshape(x.shape)
    assert_close(got, ref)


def test_apply_runs_every_decomposition_in_order(monkeypatch):
    originals = list(decompose.DECOMPOSITIONS)
    assert len(set(originals)) == len(originals) and decompose.celu in originals
    ran = []
    monkeypatch.setattr(decompose, "DECOMPOSITIONS", [lambda m, f=f: ran.append(f) for f in originals])
    decompose.apply(onnx.ModelProto())
    assert ran == originals


def fp16_matmul_model(k):
    w = (np.random.default_rng(2).standard_normal((k, 8)) / np.sqrt(k)).astype(np.float16)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm16",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, w


def test_float16_products_accumulate_in_float32():
    """A long float16 dot product is computed in float32 and rounded once:
    the result is the float64 product rounded to float16 (accumulating in
    float16 is off by many float16 steps)."""
    model, w = fp16_matmul_model(4096)
    ops = [n.op_type for n in legalize_onnx.apply(onnx.ModelProto.FromString(model.SerializeToString())).graph.node]
    assert ops == ["Cast", "Cast", "MatMul", "Cast"]
    x = np.random.default_rng(3).standard_normal((1, 4096)).astype(np.float16)
    got = coldbrew.load(compile_model(model)).run(None, {"x": x})[0]
    exact = x.astype(np.float64) @ w.astype(np.float64)
    step = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= step), (got, exact)


def test_conv_integer_is_exact_with_per_channel_zero_points():
    """ConvInteger computed as a float64 Conv of the centred inputs: every
    int32 result exact, sums past float32's 2^24 included."""
    rng = np.random.default_rng(4)
    x = rng.integers(200, 256, (1, 128, 6, 6), dtype=np.uint8)
    w = rng.integers(-128, -100, (8, 128, 3, 3), dtype=np.int8)
    xz, wz = np.array(3, np.uint8), rng.integers(-5, 5, 8, dtype=np.int8)
    g = helper.make_graph([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1] * 4)], "ci",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 8, 6, 6])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(xz, "xz"),
                           numpy_helper.from_array(wz, "wz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    got = coldbrew.load(compile_model(m)).run(None, {"x": x})[0]
    xc = np.pad(x.astype(np.int64) - 3, ((0, 0), (0, 0), (1, 1), (1, 1)))
    wc = w.astype(np.int64) - wz.reshape(-1, 1, 1, 1)
    ref = np.zeros((1, 8, 6, 6), np.int64)
    for i in range(6):
        for j in range(6):
            ref[0, :, i, j] = np.einsum("chw,mchw->m", xc[0, :, i:i + 3, j:j + 3], wc)
    assert np.abs(ref).max() > 2**24
    np.testing.assert_array_equal(got, ref)
