"""compiler/onnx/decompose.py: each single-operator rewrite computes what
onnxruntime computes for the operator it replaces (and the operator is
gone); float16 products accumulate in float32; ConvInteger is exact."""
import numpy as np
import onnx
import pytest
from conftest import assert_close, ort_run
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.onnx import decompose
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


def test_apply_runs_each_decomposition_whose_operators_are_there_in_order(monkeypatch):
    originals = [f for _, f in decompose.DECOMPOSITIONS]
    assert len(set(originals)) == len(originals) and decompose.celu in originals
    ran = []
    monkeypatch.setattr(decompose, "DECOMPOSITIONS",
                        [(ops, lambda m, f=f: ran.append(f)) for ops, f in decompose.DECOMPOSITIONS])
    every = onnx.ModelProto()
    every.graph.node.extend(helper.make_node(op, [], []) for ops, _ in decompose.DECOMPOSITIONS for op in ops)
    decompose.apply(every)
    assert ran == originals
    ran.clear()
    decompose.apply(one_node("Celu", [("x", F, [2])], [2]))  # nothing to infer for the absent operators
    assert ran == [decompose.celu]


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


@pytest.mark.parametrize("low,high,channels,how", [(-3, 4, 128, "whole"), (-128, -100, 128, "runs"),
                                                    (-128, -100, 1200, "float64")])
def test_conv_integer_is_exact_with_per_channel_zero_points(low, high, channels, how):
    """ConvInteger computed as a Conv of the centred inputs: every int32
    result exact, sums past float32's 2^24 included. Where the weights bound
    every sum under 2^24, in float32 on a convolution variant (whole); where
    they bound each run of input channels' sums (3 runs of the 128 here),
    one float32 Conv per run on convolution variants, summed in int32;
    past 16 runs (1200 channels), in float64 on no variant."""
    from coldbrew.compiler.bundle.reader import read_bytes

    rng = np.random.default_rng(4)
    x = rng.integers(200, 256, (1, channels, 6, 6), dtype=np.uint8)
    w = rng.integers(low, high, (8, channels, 3, 3), dtype=np.int8)
    xz, wz = np.array(3, np.uint8), rng.integers(-5, 5, 8, dtype=np.int8)
    g = helper.make_graph([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1] * 4)], "ci",
                          [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 8, 6, 6])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(xz, "xz"),
                           numpy_helper.from_array(wz, "wz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = compile_model(m)
    convs = [st for st in read_bytes(data)[0].plan.steps if (st.variant or b"").startswith(b"conv2d.")]
    assert len(convs) == {"whole": 1, "runs": 3, "float64": 0}[how]
    got = coldbrew.load(data).run(None, {"x": x})[0]
    xc = np.pad(x.astype(np.int64) - 3, ((0, 0), (0, 0), (1, 1), (1, 1)))
    wc = w.astype(np.int64) - wz.reshape(-1, 1, 1, 1)
    ref = np.zeros((1, 8, 6, 6), np.int64)
    for i in range(6):
        for j in range(6):
            ref[0, :, i, j] = np.einsum("chw,mchw->m", xc[0, :, i:i + 3, j:j + 3], wc)
    assert (np.abs(ref).max() > 2**24) == (how != "whole")
    np.testing.assert_array_equal(got, ref)


def _check(model, feeds, gone, ref=None):
    """legalize leaves no node for which gone(node) holds, and the compiled
    model computes what onnxruntime (or `ref`) computes."""
    out = legalize_onnx.apply(onnx.ModelProto.FromString(model.SerializeToString()))
    assert not [n for n in out.graph.node if gone(n)]
    got = coldbrew.load(compile_model(model)).run(None, feeds)
    assert_close(got, ref or ort_run(model, feeds))


def test_layer_normalization_statistics_outputs():
    scale, bias = c("scale", np.full((4, 5), 1.5, np.float32)), c("bias", np.full((4, 5), 0.25, np.float32))
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y", "mean", "inv"],
                                            axis=2, epsilon=1e-3)], "ln",
                          [helper.make_tensor_value_info("x", F, [2, 3, 4, 5])],
                          [helper.make_tensor_value_info(o, F, s) for o, s in
                           (("y", [2, 3, 4, 5]), ("mean", [2, 3, 1, 1]), ("inv", [2, 3, 1, 1]))], [scale, bias])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    _check(m, {"x": np.nan_to_num(X, posinf=3.0, neginf=-3.0)}, lambda n: n.op_type == "LayerNormalization")


def test_float_mod_takes_the_divisor_sign():
    m = one_node("Mod", [("x", F, [2, 3, 4, 5]), ("d", F, [5])], [2, 3, 4, 5])
    feeds = {"x": np.nan_to_num(X, posinf=3.0, neginf=-3.0) * 4, "d": np.array([1.5, -1.5, 0.7, -2.0, 3.0], np.float32)}
    ref = [np.mod(feeds["x"], feeds["d"])]  # numpy's mod takes the divisor's sign too (onnxruntime: opset 28 on)
    _check(m, feeds, lambda n: n.op_type == "Mod" and not any(a.name == "fmod" and a.i for a in n.attribute), ref)


def test_extrema_of_bools():
    for op in ("ReduceMax", "ReduceMin"):
        m = one_node(op, [("x", TensorProto.BOOL, [3, 4])], [3, 1], [c("axes", np.array([1], np.int64))],
                     opset=20, out_type=TensorProto.BOOL)
        _check(m, {"x": X[0, :3, 0, :4] > 0}, lambda n: n.op_type == op and n.input[0] == "x")


def test_conv_transpose_output_shape_becomes_pads():
    w = c("w", np.random.default_rng(3).standard_normal((3, 2, 3, 3)).astype(np.float32))
    m = one_node("ConvTranspose", [("x", F, [2, 3, 4, 5])], [2, 2, 9, 10], [w], strides=[2, 2],
                 output_shape=[9, 10])
    _check(m, {"x": np.nan_to_num(X, posinf=3.0, neginf=-3.0)},
           lambda n: any(a.name == "output_shape" for a in n.attribute))


@pytest.mark.parametrize("attrs, scales, out", [
    ({"mode": "linear"}, [1, 1, 0.6, 1.3], [2, 3, 2, 6]),                       # scales not giving whole sizes
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.5, 0.6], [2, 3, 2, 3]),        # antialiased downsampling
    ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 1.7, 1], [2, 3, 6, 5]),
    ({"mode": "linear", "axes": [3, 2]}, [0.6, 1.5], [2, 3, 6, 3])])
def test_resize_modes_by_matrices(attrs, scales, out):
    m = one_node("Resize", [("x", F, [2, 3, 4, 5])], out,
                 [c("roi", np.array([], np.float32)), c("s", np.array(scales, np.float32))], opset=19, **attrs)
    _check(m, {"x": np.nan_to_num(X, posinf=3.0, neginf=-3.0)}, lambda n: n.op_type == "Resize")


@pytest.mark.parametrize("op,wshape,out,opset,attrs", [
    ("Conv", (6, 3, 5), [2, 6, 4], 17, {"strides": [2], "pads": [1, 2], "dilations": [1]}),
    ("Conv", (6, 3, 3), [2, 6, 4], 11, {"dilations": [2], "kernel_shape": [3]}),
    ("ConvTranspose", (3, 4, 4), [2, 4, 25], 17, {"strides": [3], "pads": [1, 0], "output_padding": [1]})])
def test_a_convolution_over_one_axis_becomes_the_2d_one(op, wshape, out, opset, attrs):
    """Its weights become [.., 1, k] (a 2-D convolution variant computes it)."""
    x = np.random.default_rng(4).standard_normal((2, 3, 8)).astype(np.float32)
    w = c("w", np.random.default_rng(5).standard_normal(wshape).astype(np.float32))
    m = one_node(op, [("x", F, [2, 3, 8])], out, [w], opset=opset, **attrs)
    _check(m, {"x": x}, lambda n: list(n.input[1:2]) == ["w"])  # the 1-D weights are gone


@pytest.mark.parametrize("attrs", [{"pads": [2, 0, 1, 0]}, {"strides": [2, 1], "dilations": [2, 1], "group": 3}])
def test_a_convolution_down_a_column_runs_along_the_width(attrs):
    x = np.random.default_rng(6).standard_normal((1, 6, 20, 1)).astype(np.float32)
    w = c("w", np.random.default_rng(7).standard_normal((6, 6 // attrs.get("group", 1), 5, 1)).astype(np.float32))
    out = [1, 6, 19, 1] if "pads" in attrs else [1, 6, 6, 1]
    m = one_node("Conv", [("x", F, [1, 6, 20, 1])], out, [w], **attrs)
    _check(m, {"x": x}, lambda n: list(n.input[1:2]) == ["w"])  # the column weights are gone


@pytest.mark.parametrize("low,high,variant", [(-128, 127, False), (-4, 5, True)])
def test_matmul_integer_is_exact(low, high, variant):
    """MatMulInteger with constant weights whose sums stay under 2^24 runs
    as a float32 MatMul on the dense variant, exact; others stay integer."""
    from coldbrew.compiler.bundle.reader import read_bytes

    rng = np.random.default_rng(8)
    a = rng.integers(0, 256, (6, 1024), dtype=np.uint8)
    b = rng.integers(low, high, (1024, 32), dtype=np.int8)
    az, bz = np.array(7, np.uint8), rng.integers(-3, 3, 32, dtype=np.int8)
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], "mi",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [6, 32])],
                          [numpy_helper.from_array(b, "b"), numpy_helper.from_array(az, "az"),
                           numpy_helper.from_array(bz, "bz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = compile_model(m)
    assert any((st.variant or b"").startswith(b"dense.") for st in read_bytes(data)[0].plan.steps) == variant
    ref = (a.astype(np.int64) - 7) @ (b.astype(np.int64) - bz.astype(np.int64))
    np.testing.assert_array_equal(coldbrew.load(data).run(None, {"a": a})[0], ref)


@pytest.mark.parametrize("bias", [False, True])
def test_exact_sums_cast_back_to_float_skip_the_int32(bias):
    """A MatMulInteger dequantized as onnxruntime's dynamic quantization
    writes it (Cast to float, Mul by the scale; with its bias quantized
    on the fly: Floor(b / scale) cast to int32, reshaped, added in int32):
    on the exact float32 form the Cast back to float reads float values
    (the int32 round trip is the identity), and the result is unchanged."""
    rng = np.random.default_rng(9)
    a = rng.integers(0, 256, (4, 256), dtype=np.uint8)
    b = rng.integers(-6, 7, (256, 48), dtype=np.int8)
    bb = rng.standard_normal(48).astype(np.float32) * 40
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["y"])]
    if bias:
        nodes += [helper.make_node("Div", ["bb", "s"], ["bq"]), helper.make_node("Floor", ["bq"], ["bf"]),
                  helper.make_node("Cast", ["bf"], ["bi"], to=TensorProto.INT32),
                  helper.make_node("Reshape", ["bi", "shape"], ["br"]), helper.make_node("Add", ["y", "br"], ["ys"])]
    nodes += [helper.make_node("Cast", ["ys" if bias else "y"], ["yf"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["yf", "s"], ["out"])]
    g = helper.make_graph(nodes, "mi", [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 48])],
                          [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(0.25, np.float32), "s"),
                           numpy_helper.from_array(bb, "bb"), numpy_helper.from_array(np.array([1, 48]), "shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out = legalize_onnx.apply(onnx.ModelProto.FromString(m.SerializeToString()))
    int32 = {n.output[0] for n in out.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.INT32}
    int32 |= {n.output[0] for n in out.graph.node if n.op_type in ("Add", "Reshape") and n.input[0] in int32}
    assert int32 and not [n for n in out.graph.node if n.op_type == "Cast" and n.input[0] in int32]
    y = a.astype(np.int64) @ b.astype(np.int64) + (np.floor(bb / np.float32(0.25)).astype(np.int64) if bias else 0)
    np.testing.assert_array_equal(coldbrew.load(compile_model(m)).run(None, {"a": a})[0], y.astype(np.float32) * 0.25)


@pytest.mark.parametrize("kernel,pads", [((13, 13), (6, 6, 6, 6)), ((5, 3), (2, 0, 1, 1)), ((3, 3), (0, 0, 0, 0))])
def test_a_large_stride_1_max_pool_is_a_column_pool_then_a_row_pool(kernel, pads):
    """An SPP block's 13 x 13 window: 26 comparisons per output, not 169;
    the max is separable and padding counts as -inf in both pools."""
    h, w = 13 + 2, 13
    m = one_node("MaxPool", [("x", F, [1, 3, h, w])],
                 [1, 3, h + pads[0] + pads[2] - kernel[0] + 1, w + pads[1] + pads[3] - kernel[1] + 1],
                 kernel_shape=list(kernel), pads=list(pads))
    x = np.random.default_rng(3).standard_normal((1, 3, h, w)).astype(np.float32)
    _check(m, {"x": x}, lambda n: n.op_type == "MaxPool" and list(n.attribute[0].ints) == list(kernel))
