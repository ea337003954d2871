"""Narrow weights (fp16, int8 per output channel) end to end: bundles
against onnxruntime, the error the compiler measures and stores,
--max-error, the calibration data's checks, refused precision requests, the
runtime refusing a widening whose tensors do not fit, the simulator's view
of the narrow forms, and aarch64 under qemu. (How plan_weights stores them,
in each form: passes/test_plan_weights.py.)"""
import os
import struct
import sys

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, ort_run
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.measure.error import output_error, sample_inputs
from coldbrew.schemas.generated import bundle_generated as fb
from narrow_bundles import TOL, _error_against_onnxruntime, _steps, describe_bytes

sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402


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


def test_runtime_refuses_a_widening_whose_tensors_do_not_fit(small_model, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
    from hostile import expect, repack

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


def test_simulator_reads_the_narrow_forms_of_a_bundle(small_model):
    from coldbrew.compiler.plan.simulate import plan_of_bundle

    plan = plan_of_bundle(compile_model(small_model, precision="int8", weights="raw"))
    assert {s["layer"]: s["form"] for s in plan["steps"] if s["variant"] != "generic"} == {"c0": "int8", "d0": "int8"}
    plan = plan_of_bundle(compile_model(small_model, precision="int8"))
    assert {s["form"] for s in plan["steps"] if s["variant"] != "generic"} == {"direct_int8"}


def test_the_calibration_samples_option_reaches_the_error_measurement(small_model, tmp_path):
    """--calibration-samples (Options.calibration_samples): as many generated
    inputs measure the narrow weights' error, from the CLI and compile_model
    alike; zero is refused when the options are made."""
    from click.testing import CliRunner

    from coldbrew.compiler.tools.cli import main

    model = tmp_path / "small.onnx"
    model.write_bytes(small_model.SerializeToString())
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "a.brew"), "--weights-precision",
                                  "fp16", "--calibration-samples", "2"])
    assert r.exit_code == 0, r.output
    acc = read_bytes((tmp_path / "a.brew").read_bytes())[0].accuracy
    assert acc.samples == 2 and acc.inputs.decode().startswith("generated (2 samples")
    assert (tmp_path / "a.brew").read_bytes() == compile_model(small_model, precision="fp16", calibration_samples=2)
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(tmp_path / "b.brew"), "--weights-precision",
                                  "fp16", "--calibration-samples", "0"])
    assert r.exit_code != 0 and "calibration samples must be a positive integer" in r.output
