"""Narrow weights (fp16, int8 per output channel): bundles against
onnxruntime, the error the compiler measures and stores, --max-error, the
calibration data's checks, the runtime's own fp16 widening (also refused
when its tensors do not fit), and aarch64 under qemu."""
import os
import struct
import sys

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, ort_run
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.tools.inspect import describe
from coldbrew.compiler.measure.error import output_error, sample_inputs
from coldbrew.schemas.generated import bundle_generated as fb

sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402

TOL = {"fp16": 1e-2, "int8": 6e-2}  # max |y' - y| / max |y| against onnxruntime fp32


def _error_against_onnxruntime(model, data, seed=11):
    sess = coldbrew.load(data)
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in sess.get_inputs()}
    ours, ref = sess.run(None, feeds), ort_run(model, feeds)
    return output_error([ref], [ours])


def _steps(data):
    b = read_bytes(data)[0]
    return b, list(b.plan.steps)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_small_model_matches_onnxruntime_and_stores_what_it_measured(small_model, precision):
    data = compile_model(small_model, precision=precision)
    err, top1 = _error_against_onnxruntime(small_model, data)
    assert err <= TOL[precision] and top1 == 1.0
    b, steps = _steps(data)
    narrowed = [s for s in steps if s.weightPrecision != 0]
    assert len(narrowed) == 2  # the conv and the dense layer
    assert all(0 < s.weightError < (1e-3 if precision == "fp16" else 1e-2) for s in narrowed)
    assert all(s.outputError > 0 for s in narrowed)
    # the stored whole-model error is what the bundle does on the same generated inputs
    sess = coldbrew.load(data)
    feeds, described = sample_inputs(sess.get_inputs())
    assert b.accuracy.samples == len(feeds) and b.accuracy.inputs.decode() == described
    ours = [sess.run(None, f) for f in feeds]
    ref = [ort_run(small_model, f) for f in feeds]
    direct, _ = output_error(ref, ours)
    assert abs(direct - b.accuracy.outputError) <= 0.05 * direct + 1e-6, (direct, b.accuracy.outputError)
    text = "\n".join(describe_bytes(data))
    assert f"direct {precision}" in text  # the default form of narrow weights
    assert "model output error" in text and "narrowed: weight error" in text


def describe_bytes(data):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".brew") as f:
        f.write(data)
        f.flush()
        return describe(f.name)


@pytest.mark.parametrize("name", ["squeezenet", "mobilenet_v2", "crnn"])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_zoo_model_with_narrow_weights_matches_onnxruntime(name, precision):
    model = zoo.build(name)
    data = compile_model(model, precision=precision)
    err, top1 = _error_against_onnxruntime(model, data)
    assert err <= TOL[precision] and top1 == 1.0, err
    b, steps = _steps(data)
    assert b.accuracy.outputError <= TOL[precision]
    # every conv/dense layer narrowed: its stored weights are half (fp16) or a quarter plus scales (int8)
    fp32 = {s.variant for s in steps if s.weightPrecision == 0 and s.variant.decode().startswith(("conv2d", "dense"))}
    assert not fp32


def map_agreement(ours, ref, threshold=0.3):
    """The fraction of a probability map's pixels on the same side of the
    threshold a DB post-process binarizes at (a detector's "top-1")."""
    return float(np.mean((np.asarray(ours) > threshold) == (np.asarray(ref) > threshold)))


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_text_detector_map_with_narrow_weights(precision):
    # a real-model shape outside classification: an FPN text detector whose
    # output is a probability map (upsampling, concatenation, transposed convs)
    model = zoo.build("text_detector")
    data = compile_model(model, precision=precision)
    sess = coldbrew.load(data)
    for seed in range(4):
        x = {"input": np.random.default_rng(seed).standard_normal((1, 3, 160, 160)).astype(np.float32)}
        ours, ref = sess.run(None, x)[0], ort_run(model, x)[0]
        assert output_error([[ref]], [[ours]])[0] <= TOL[precision]
        assert map_agreement(ours, ref) >= (0.999 if precision == "fp16" else 0.99)
    narrowed = [s for s in _steps(data)[1] if s.weightPrecision]
    assert len(narrowed) >= 10  # every variant conv


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


def test_max_error_keeps_the_fewest_layers_fp32(small_model):
    free = compile_model(small_model, precision="int8")
    bound = read_bytes(free)[0].accuracy.outputError / 3  # all narrowed does not meet it
    data = compile_model(small_model, precision="int8", max_error=bound)
    b, steps = _steps(data)
    assert b.accuracy.outputError <= bound and b.accuracy.maxError == pytest.approx(bound)
    assert any(s.weightPrecision == 0 for s in steps if s.variant.decode() != "generic")
    err, _ = _error_against_onnxruntime(small_model, data)
    assert err <= TOL["int8"]


def test_calibration_data_is_used_and_checked(small_model, tmp_path):
    good = tmp_path / "cal.npz"
    np.savez(good, x=np.random.default_rng(0).random((3, 1, 3, 16, 16)).astype(np.float32))
    data = compile_model(small_model, precision="fp16", calibration=str(good))
    acc = read_bytes(data)[0].accuracy
    assert acc.samples == 3 and acc.inputs.decode() == "cal.npz (3 samples)"
    np.savez(tmp_path / "wrong_name.npz", image=np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(CompileError, match="lacks input"):
        compile_model(small_model, precision="fp16", calibration=str(tmp_path / "wrong_name.npz"))
    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(CompileError, match="has shape"):
        compile_model(small_model, precision="fp16", calibration=str(tmp_path / "wrong_shape.npz"))


def test_unusable_precision_requests_are_refused(small_model):
    with pytest.raises(CompileError, match="precision must be one of"):
        compile_model(small_model, precision="bf16")
    with pytest.raises(CompileError, match="maximum error applies to narrow weights"):
        compile_model(small_model, max_error=1e-3)
    with pytest.raises(CompileError, match="not available for GPU targets"):
        compile_model(small_model, target="vulkan", precision="fp16")


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


def test_runtime_refuses_a_widening_whose_tensors_do_not_fit(small_model, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
    from test_hostile import expect, repack

    data = bytearray(compile_model(small_model, precision="fp16", weights="cached"))
    b, steps = _steps(bytes(data))
    k = next(i for i, s in enumerate(steps) if s.transform.decode() == "cb.widen_f16")

    def wrong_dtype(bt):
        bt.tensors[bt.plan.steps[k].transformArgs[0]].dtype = fb.DType.i16  # 2 bytes, but not fp16

    def wrong_count(bt):
        bt.plan.steps[k].transformArgs = bt.plan.steps[k].transformArgs[:1]

    def odd_pair(bt):  # a second pair whose output is not a prepared fp32 tensor of the input's shape
        args = list(bt.plan.steps[k].transformArgs)
        bt.plan.steps[k].transformArgs = args + [args[0], bt.inputs[0]]

    for mutate in (wrong_dtype, wrong_count, odd_pair):
        expect(repack(data, mutate), "CORRUPT", tmp_path, match="cb.widen_f16")
    assert struct.unpack_from("<8s", data, 0)[0] == b"COLDBREW"


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_narrow_weights_on_aarch64_under_qemu(qemu_runner, small_model, precision, tmp_path):
    import qemu

    pairs = qemu.compile_and_run(qemu_runner, small_model, "aarch64", str(tmp_path), precision=precision)
    for ours, ref in pairs:
        err, _ = output_error([[ref]], [[ours]])
        assert err <= TOL[precision], err


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


def test_simulator_reads_the_narrow_forms_of_a_bundle(small_model):
    from coldbrew.compiler.plan.simulate import plan_of_bundle

    plan = plan_of_bundle(compile_model(small_model, precision="int8", weights="raw"))
    assert {s["layer"]: s["form"] for s in plan["steps"] if s["variant"] != "generic"} == {"c0": "int8", "d0": "int8"}
    plan = plan_of_bundle(compile_model(small_model, precision="int8"))
    assert {s["form"] for s in plan["steps"] if s["variant"] != "generic"} == {"direct_int8"}


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
