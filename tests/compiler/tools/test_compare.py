"""`coldbrew compare`: a bundle run layer by layer (the runtime's observed
run) against onnxruntime's values of the same ONNX tensors, on every target
this machine runs: host CPU, Vulkan on lavapipe, aarch64 under qemu-user.
A bundle compiled from a model with one convolution's weights changed is
reported at exactly that layer; a correct one matches at every layer."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import qemu
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read
from coldbrew.compiler.tools.compare import compare


def two_convs(w2_scale=1.0):
    """conv -> relu -> conv -> sigmoid + skip -> global pool -> flatten ->
    gemm; 16 channels, so CPU targets block the convolutions (NCHW{b}c).
    `w2_scale` changes the second convolution's weights alone."""
    rng = np.random.default_rng(1)
    arrays = {"W1": rng.standard_normal((16, 3, 3, 3)), "B1": rng.standard_normal(16),
              "W2": rng.standard_normal((16, 16, 3, 3)) * w2_scale, "B2": rng.standard_normal(16),
              "FW": rng.standard_normal((4, 16)), "FB": rng.standard_normal(4)}
    inits = [numpy_helper.from_array((a * 0.3).astype(np.float32), n) for n, a in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1] * 4, name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig2"),
        helper.make_node("Add", ["s2", "r1"], ["a2"], name="add2"),
        helper.make_node("GlobalAveragePool", ["a2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "FW", "FB"], ["y"], transB=1, name="fc"),
    ]
    g = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def conv2_layer(path):
    """The name of the layer that computes conv2 (the one reading W2's 16x16x3x3 weights)."""
    b = read(path)[0]
    for s in b.plan.steps:
        layer = b.layers[s.layer]
        if any(b.tensors[a].kind == 3 and int(np.prod(b.tensors[a].shape)) == 16 * 16 * 9 for a in layer.args):
            return layer.name.decode()
    raise AssertionError("no layer reads conv2's weights")


def check(tmp_path, target, runner=None):
    good, bad = str(tmp_path / "good.brew"), str(tmp_path / "bad.brew")
    compile_model(two_convs(), good, target=target)
    compile_model(two_convs(w2_scale=1.5), bad, target=target)
    ok = compare(two_convs(), good, runner=runner)
    assert ok.first is None, ok.lines()
    assert ok.matched >= 3, ok.lines()  # every layer before the model's output too
    wrong = compare(two_convs(), bad, runner=runner)
    assert wrong.first is not None, wrong.lines()
    assert wrong.first["layer"] == conv2_layer(bad), wrong.lines()
    assert wrong.first["source"] in ("c2", "s2", "a2"), wrong.lines()  # conv2's output, or what it is fused with
    assert wrong.matched >= 1, wrong.lines()  # conv1's layer matched first
    return ok, wrong


def test_host_bundle_matches_and_a_changed_layer_is_named(tmp_path):
    ok, wrong = check(tmp_path, "host")
    blocked = [t for t in read(str(tmp_path / "good.brew"))[0].tensors if t.layout]
    assert blocked, "the CPU bundle should hold blocked (NCHW{b}c) layer outputs"
    assert "departs" in "\n".join(wrong.lines()) and "every layer compared matches" in "\n".join(ok.lines())


def test_vulkan_bundle_on_lavapipe(tmp_path, monkeypatch):
    monkeypatch.setenv("COLDBREW_CACHE_DIR", str(tmp_path / "cache"))
    check(tmp_path, "vulkan")


def test_aarch64_bundle_under_qemu(tmp_path, qemu_runner):
    check(tmp_path, "aarch64", runner=qemu.command(qemu_runner))


def test_given_inputs_and_clear_errors(tmp_path):
    path = str(tmp_path / "good.brew")
    compile_model(two_convs(), path)
    x = np.zeros((1, 3, 12, 12), np.float32)
    assert compare(two_convs(), path, inputs={"x": x}).first is None
    with pytest.raises(Exception, match="no bundle input named 'z'"):
        compare(two_convs(), path, inputs={"z": x})
