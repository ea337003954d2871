"""compiler/passes/plan_weights.py: narrow weights' forms. fp16 stored in the
kernel's layout and widened by the runtime (cb.widen_f16, exact, several
weights of a layer in one widening, also for layers without a variant),
the direct form (fp16 or int8 read in place by the kernel), and the raw and
cached forms, preparation queues and refused requests of apply itself."""
import os
import sys

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, ort_run
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.schemas.generated import bundle_generated as fb

sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests", "compiler"))
import zoo  # noqa: E402
from narrow_bundles import TOL, _error_against_onnxruntime, _steps, describe_bytes  # noqa: E402
from coldbrew.compiler.options import Choices


def test_fp16_stores_half_the_weight_bytes():
    model = zoo.build("squeezenet")
    full, half = compile_model(model), compile_model(model, precision="fp16", weights="cached")
    weight = lambda data: sum(t.nbytes for t in read_bytes(data)[0].tensors if t.kind == fb.TensorKind.weight)  # noqa: E731
    assert weight(half) <= 0.502 * weight(full)  # biases stay fp32
    b = read_bytes(half)[0]
    for s in b.plan.steps:  # each layer's fp16 weights are half the fp32 tensor its kernel reads
        if s.weightPrecision:
            stored, prepared = (b.tensors[i] for i in s.transformArgs)
            assert stored.nbytes * 2 == prepared.nbytes and prepared.kind == fb.TensorKind.prepared
    # fp16 in the kernel's own layout: the runtime widens it, so no code is added
    code = lambda data: next(s.rawSize for s in read_bytes(data)[0].segments  # noqa: E731
                             if s.kind == fb.SegmentKind.cpu_code_lz4)
    assert code(half) <= code(full) * 1.01


def test_fp16_widened_by_the_runtime_is_exact(tmp_path):
    """A direct conv (no transform) with fp16 weights including subnormals,
    the largest finite value and signed zeros: the runtime's widening gives
    exactly the fp16 values, so the output equals the fp32 model run with
    the fp16-rounded weights."""
    import onnx
    from onnx import TensorProto, helper

    w = np.random.default_rng(3).standard_normal((4, 2, 3, 3)).astype(np.float32)
    w.flat[:5] = [6e-8, -3e-5, 65504.0, -0.0, 1e-6]  # subnormal, subnormal, max, -0, subnormal
    w16 = w.astype(np.float16).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "direct",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    data = compile_model(model, variants={"*": "direct"}, precision="fp16", weights="cached")
    steps = _steps(data)[1]
    assert [s.transform.decode() for s in steps] == ["cb.widen_f16"]
    x = np.random.default_rng(4).standard_normal((1, 2, 6, 6)).astype(np.float32)
    ours = coldbrew.load(data).run(None, {"x": x})[0]
    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    rounded.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w16, "w"))
    np.testing.assert_allclose(ours, ort_run(rounded, {"x": x})[0], rtol=1e-5, atol=1e-3)


def _sequence_model():
    """A batch-1 sequence block: a per-position scale and shift (one fused
    elementwise layer without a variant, its two weights 8192 values each),
    then a dense projection (a variant layer)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((256, 256)) * 0.06).astype(np.float32)
    scale, shift = (rng.standard_normal((32, 256)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["t"]), helper.make_node("Add", ["t", "shift"], ["h"]),
         helper.make_node("MatMul", ["h", "w"], ["y"])], "sequence",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 256])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (scale, "scale"), (shift, "shift"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_fp16_also_narrows_the_weights_of_layers_without_a_variant():
    # the elementwise layer's weights run on a generic kernel: fp16 stores
    # them narrow too, widened by the runtime in (fp16, prepared) pairs
    model = _sequence_model()
    half = compile_model(model, precision="fp16")
    b, steps = _steps(half)
    assert any(s.variant.decode() == "dense.packed_gemm" and s.weightPrecision for s in steps)
    generic = [s for s in steps if s.variant.decode() == "generic" and s.weightPrecision]
    assert generic and all(s.transform.decode() == "cb.widen_f16" for s in generic)
    for s in generic:
        for k in range(0, len(s.transformArgs), 2):
            stored, prepared = b.tensors[s.transformArgs[k]], b.tensors[s.transformArgs[k + 1]]
            assert stored.dtype == fb.DType.f16 and stored.nbytes * 2 == prepared.nbytes
    err, _ = _error_against_onnxruntime(model, half)
    assert err <= TOL["fp16"]
    # int8 is for the variant layers only: the generic weights stay fp32
    b8, steps8 = _steps(compile_model(model, precision="int8"))
    assert not [s for s in steps8 if s.variant.decode() == "generic" and s.weightPrecision]
    assert any(s.variant.decode() == "dense.packed_gemm" and s.weightPrecision for s in steps8)


def test_one_widening_takes_several_weights_of_a_layer():
    # y = x * a + b: one fused elementwise layer with two large weights
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal((1, 4, 32, 32)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])], "axpb",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 32, 32])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    data = compile_model(model, precision="fp16")
    steps = [s for s in _steps(data)[1] if s.weightPrecision]
    assert len(steps) == 1 and len(steps[0].transformArgs) == 4, [list(s.transformArgs) for s in steps]
    x = rng.standard_normal((1, 4, 32, 32)).astype(np.float32)
    want = x * a.astype(np.float16).astype(np.float32) + b.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(coldbrew.load(data).run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-6)
    del onnx


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_direct_form_reads_narrow_weights_in_place(small_model, precision):
    """Narrow weights' default form: no transform, no prepared copy and no
    transform code; the kernels read the fp16 or int8 weights from the
    bundle (int8 with an fp32 scale per output channel, applied to the
    sums), and compute what the widened form computes."""
    data = compile_model(small_model, precision=precision)
    b, steps = _steps(data)
    direct = [s for s in steps if s.weightForm == fb.WeightForm.direct]
    assert len(direct) == 2  # the conv and the dense layer
    dtype = {"fp16": fb.DType.f16, "int8": fb.DType.i8}[precision]
    for s in direct:
        assert s.weightPrecision == dtype and not s.transform.decode() and s.weightError > 0
        args = [b.tensors[a] for a in b.layers[s.layer].args]
        narrow = [t for t in args if t.dtype == dtype and t.kind == fb.TensorKind.weight]
        assert len(narrow) == 1
        if precision == "int8":  # one fp32 scale per output channel, beside the bias
            scales = [t for t in args if t.dtype == fb.DType.f32 and t.kind == fb.TensorKind.weight]
            assert len(scales) == 2 and all(t.nbytes == scales[0].nbytes for t in scales), [t.name for t in args]
    assert not [t for t in b.tensors if t.kind == fb.TensorKind.prepared]
    assert f"direct {precision}" in "\n".join(describe_bytes(data))
    widened = compile_model(small_model, precision=precision, weights="cached" if precision == "fp16" else "raw")
    assert [t for t in read_bytes(widened)[0].tensors if t.kind == fb.TensorKind.prepared]
    shape = [d.dim_value for d in small_model.graph.input[0].type.tensor_type.shape.dim]
    x = {"x": np.random.default_rng(5).standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(coldbrew.load(data).run(None, x)[0], coldbrew.load(widened).run(None, x)[0],
                               rtol=1e-5, atol=1e-5)
    err, top1 = _error_against_onnxruntime(small_model, data)
    assert err <= TOL[precision] and top1 == 1.0
    from coldbrew.compiler.plan.simulate import plan_of_bundle

    assert {s["form"] for s in plan_of_bundle(data)["steps"] if s["variant"] != "generic"} == {
        {"fp16": "direct", "int8": "direct_int8"}[precision]}


def _extracted(model):
    """`model`'s Graph as extract_layers leaves it, its conv on Winograd
    (a transform that computes): plan_weights' input."""
    from coldbrew.compiler import pipeline

    c = pipeline.Compilation(model=model, choices=Choices(variants={"conv2d": "conv2d.winograd_f2"}))
    return pipeline.run(pipeline.PASSES, c, stop="extract_layers").graph


def test_raw_form_ships_the_raw_weights_and_their_transform_kernel(small_model):
    from coldbrew.compiler.passes import plan_weights

    graph = _extracted(small_model)
    transformed = {layer.name: next(i for i in layer.args if graph.tensors[i].anchor is not None)
                   for layer in graph.layers if layer.name in ("c0", "d0")}
    raw_c0 = np.asarray(graph.tensors[transformed["c0"]].anchor.raw)
    plan_weights.apply(graph, {"*": "raw", "d0": "cached"})
    c0, d0 = (next(x for x in graph.layers if x.name == n) for n in ("c0", "d0"))
    # raw: the raw weights are shipped, the transformed ones become a prepared tensor the transform fills
    assert c0.weight_form == "raw" and c0.transform in graph.kernels
    raw, prepared = c0.transform_args
    assert prepared == transformed["c0"] and graph.tensors[prepared].kind == "prepared"
    assert graph.tensors[prepared].data is None
    assert graph.tensors[raw].kind == "weight" and not graph.tensors[raw].cached
    np.testing.assert_array_equal(graph.tensors[raw].data, raw_c0)
    # cached: the transformed weights are shipped, nothing runs on the first run
    assert d0.weight_form == "cached" and not d0.transform and not d0.transform_args
    w = graph.tensors[transformed["d0"]]
    assert w.kind == "weight" and w.cached and w.data is not None
    assert [s for s in graph.kernels if s.startswith("cb_transform_")] == [c0.transform]


def test_preparation_queues_and_refused_requests(small_model):
    from coldbrew.compiler import CompileError
    from coldbrew.compiler.passes import plan_weights
    from coldbrew.compiler.pipeline import Compilation

    graph = plan_weights.apply(_extracted(small_model), queues={"*": 1, "d0": 2})
    assert {layer.name: layer.prep_queue for layer in graph.layers} == {
        layer.name: 2 if layer.name == "d0" else 1 for layer in graph.layers}
    for option, message in (({"queues": plan_weights.MAX_QUEUES + 1}, "preparation queue must be an integer 0..8"),
                            ({"weights": "packed"}, "weight form must be one of raw, cached, direct, not 'packed'"),
                            ({"precision": {"*": "bf16"}}, "weight precision must be one of")):
        with pytest.raises(CompileError, match=message):
            plan_weights.run(Compilation(graph=_extracted(small_model), choices=Choices(**option)))


def qdq_conv_model(per_channel):
    """A QDQ export's convolution: int8 weights (zero point 0) widened by a
    DequantizeLinear, per output channel or per tensor."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    q = rng.integers(-127, 128, (32, 16, 3, 3)).astype(np.int8)
    scale = (rng.uniform(0.001, 0.01, 32) if per_channel else np.array(0.004)).astype(np.float32)
    zero = np.zeros(scale.shape, np.int8)
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
         helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])],
        [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(scale, "ws"), numpy_helper.from_array(zero, "wz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.ModelProto.FromString(m.SerializeToString())


@pytest.mark.parametrize("per_channel", [True, False])
def test_a_quantized_models_int8_weights_stay_int8_and_exact(per_channel):
    """The bundle stores the model's own int8 weights with its own scales
    (a quarter of the fp32 bytes) and computes exactly what the fp32
    weights compute."""
    model = qdq_conv_model(per_channel)
    data = compile_model(model)  # the default precision: nothing to ask for
    from coldbrew.compiler.pipeline import front_end, lower

    g = lower(front_end(model), Choices(None, "cached", 2, 0))
    narrowed = [layer for layer in g.layers if layer.weight_precision == "int8"]
    assert narrowed and all(layer.weight_error == 0.0 for layer in narrowed)
    assert len(data) < 32 * 16 * 9 * 4 * 0.6 + 20000  # int8 weights, not fp32
    x = np.random.default_rng(8).standard_normal((1, 16, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(coldbrew.load(data).run(None, {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def qdq_generic_model(axis):
    """x * dq(wq) + b: a quantized model's int8 weights (zero point 0, one
    scale per tensor, or per entry of `axis`) in an elementwise layer,
    which has no variant."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    q = rng.integers(-127, 128, (32, 256)).astype(np.int8)
    n = 1 if axis is None else q.shape[axis]
    scale = rng.uniform(0.001, 0.01, n).astype(np.float32).reshape(() if axis is None else (n,))
    b = rng.standard_normal((32, 256)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=axis or 0),
         helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])], "qdq_generic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 256])],
        [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(scale, "ws"),
         numpy_helper.from_array(np.zeros(scale.shape, np.int8), "wz"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.ModelProto.FromString(m.SerializeToString())


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_a_quantized_models_int8_weights_stay_int8_in_layers_without_a_variant(axis):
    """The generic layer's weights are stored int8 with the model's own
    scales and widened by the runtime's cb.widen_i8 in (int8, scale,
    prepared) triples: a quarter of the bytes, and exactly the model's
    output."""
    model = qdq_generic_model(axis)
    data = compile_model(model)
    b, steps = _steps(data)
    widened = [s for s in steps if s.transform and s.transform.decode() == "cb.widen_i8"]
    assert len(widened) == 1 and widened[0].variant.decode() == "generic"
    q, scale, prepared = (b.tensors[i] for i in widened[0].transformArgs)
    assert q.dtype == fb.DType.i8 and q.nbytes * 4 == prepared.nbytes
    assert list(scale.shape) == ([1, 1] if axis is None else [32 if axis == 0 else 1, 256 if axis == 1 else 1])
    import onnx

    plain = onnx.ModelProto()  # the same weights as an fp32 initializer: 3 bytes more per value
    plain.CopyFrom(model)
    from coldbrew.compiler.passes.fold_constants import apply as fold

    plain = fold(plain)
    assert len(compile_model(plain)) - len(data) >= 3 * 32 * 256 - 1024
    x = np.random.default_rng(10).standard_normal((1, 32, 256)).astype(np.float32)
    np.testing.assert_allclose(coldbrew.load(data).run(None, {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-6, atol=1e-6)


def test_runtime_refuses_an_int8_widening_whose_tensors_do_not_fit(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
    from hostile import expect, repack

    data = compile_model(qdq_generic_model(1))
    k = next(i for i, s in enumerate(_steps(data)[1]) if s.transform and s.transform.decode() == "cb.widen_i8")

    def scale_too_wide(bt):  # 256 scales along the weights' axis of 32
        bt.tensors[bt.plan.steps[k].transformArgs[1]].shape = [256, 1]

    def pair_not_triple(bt):
        bt.plan.steps[k].transformArgs = bt.plan.steps[k].transformArgs[:2]

    def not_int8(bt):
        bt.tensors[bt.plan.steps[k].transformArgs[0]].dtype = fb.DType.u8

    for mutate in (scale_too_wide, pair_not_triple, not_int8):
        expect(repack(bytearray(data), mutate), "CORRUPT", tmp_path, match="cb.widen_i8")
