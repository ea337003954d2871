"""GPU (Vulkan) bundles of small models built from the operator forms of
real ones, run on lavapipe against onnxruntime: a super-resolution network's
operators at opset 9 and 13, int64 and bool tensors in storage buffers, and
a convolution's epilogue constants."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from conftest import assert_close, ort_run
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle.reader import read_bytes


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COLDBREW_CACHE_DIR", str(tmp_path / "cache"))


def model(nodes, inits, x_shape, outputs, opset):
    """A model of one float input `x`; `outputs` {name: elem type}, shapes inferred."""
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    inferred.update({v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.output})
    for o in m.graph.output:
        o.CopyFrom(inferred[o.name])
    onnx.checker.check_model(m)
    return m


def weights(rng, name, shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def assert_matches_onnxruntime(m, tmp_path):
    path = str(tmp_path / "m.brew")
    compile_model(m, path, target="vulkan")
    sess = coldbrew.load(path)
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(1).standard_normal(inp.shape).astype(np.float32)
    ours, ref = sess.run(None, {"x": x}), ort_run(m, {"x": x})
    assert [o.dtype for o in ours] == [r.dtype for r in ref]
    assert_close(ours, ref)


def super_resolution(opset, c=8):
    """A super-resolution U-Net's operators: Conv, LeakyRelu, squeeze-excitation
    (ReduceMean, Sigmoid, a per-channel Mul over H and W), ConvTranspose of
    stride 2, Slice crops, Clip; in `opset`'s forms (attributes before 10/11)."""
    rng = np.random.default_rng(0)
    inits = [weights(rng, "w1", (c, 3, 3, 3)), weights(rng, "b1", (c,)), weights(rng, "ws1", (c // 2, c, 1, 1)),
             weights(rng, "ws2", (c, c // 2, 1, 1)), weights(rng, "wt", (c, c, 4, 4)), weights(rng, "bt", (c,)),
             weights(rng, "w3", (3, c, 3, 3)), weights(rng, "b3", (3,))]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             node("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
             node("ReduceMean", ["l1"], ["m"], axes=[2, 3], keepdims=1),
             node("Conv", ["m", "ws1"], ["s1"]), node("Relu", ["s1"], ["s1r"]),
             node("Conv", ["s1r", "ws2"], ["s2"]), node("Sigmoid", ["s2"], ["sg"]),
             node("Mul", ["l1", "sg"], ["se"]),
             node("ConvTranspose", ["se", "wt", "bt"], ["up"], strides=[2, 2], pads=[3, 3, 3, 3]),
             node("LeakyRelu", ["up"], ["ul"], alpha=0.1)]
    if opset < 10:
        nodes.append(node("Slice", ["ul"], ["cr"], axes=[2, 3], starts=[2, 1], ends=[-2, -1]))
    else:
        inits += [ints("st", [2, 1]), ints("en", [-2, -1]), ints("ax", [2, 3])]
        nodes.append(node("Slice", ["ul", "st", "en", "ax"], ["cr"]))
    nodes.append(node("Conv", ["cr", "w3", "b3"], ["c3"]))
    if opset < 11:
        nodes.append(node("Clip", ["c3"], ["y"], min=0.0, max=1.0))
    else:
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0), ("hi", 1))]
        nodes.append(node("Clip", ["c3", "lo", "hi"], ["y"]))
    return model(nodes, inits, (1, 3, 32, 32), {"y": TensorProto.FLOAT, "up": TensorProto.FLOAT}, opset)


@pytest.mark.parametrize("opset", [9, 13])
def test_super_resolution_operators_match_onnxruntime(opset, tmp_path):
    """Opset 9's Slice (bounds as attributes) imports as a take by int64
    indices: the shader reads them in the host's 8-byte layout."""
    assert_matches_onnxruntime(super_resolution(opset), tmp_path)


def test_int64_tensors_read_and_written_in_the_host_layout(tmp_path):
    """Gather by constant int64 indices (read), ArgMax's int64 output
    (written, with its high words)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gather", ["r", "idx"], ["g"], axis=2),
             helper.make_node("ArgMax", ["x"], ["arg"], axis=1, keepdims=1)]
    m = model(nodes, [ints("idx", [3, 0, 5, 5, 1])], (1, 4, 6, 6), {"g": TensorProto.FLOAT, "arg": TensorProto.INT64},
              13)
    assert_matches_onnxruntime(m, tmp_path)


def test_bool_tensors_of_odd_sizes_are_bytes(tmp_path):
    """A bool output of 9 bytes (not a whole number of words), and a bool
    read by a layer of its own."""
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("ReduceMax", ["x"], ["mx"], axes=[2, 3], keepdims=1),
             helper.make_node("Where", ["pos", "mx", "x"], ["y"])]
    m = model(nodes, [zero], (1, 1, 3, 3), {"pos": TensorProto.BOOL, "y": TensorProto.FLOAT}, 13)
    assert_matches_onnxruntime(m, tmp_path)


def test_a_convolution_plus_a_constant_by_column_is_not_a_bias(tmp_path):
    """conv [1, K, H, W] + a constant [K] (W == K) adds along W: not the
    per-channel bias the GPU variants' epilogue adds."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "cols"], ["y"])]
    inits = [weights(rng, "w", (8, 4, 3, 3)), numpy_helper.from_array(np.arange(8, dtype=np.float32), "cols")]
    assert_matches_onnxruntime(model(nodes, inits, (1, 4, 8, 8), {"y": TensorProto.FLOAT}, 13), tmp_path)


@pytest.mark.parametrize("variant", ["gemm", "winograd"])
def test_convolutions_of_more_tiles_than_a_grid_dimension_fold_them(variant):
    """A 2050 x 2050 output has more pixel tiles (65,666 of 64 for the GEMM)
    than the 65,535 workgroups a Vulkan grid dimension surely holds: they go
    on along z. (Compiled only: lavapipe takes over a minute to run it; the
    folded shaders matched onnxruntime there.)"""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    m = model(nodes, [weights(rng, "w", (16, 16, 3, 3))], (1, 16, 2050, 2050), {"y": TensorProto.FLOAT}, 13)
    (step,) = read_bytes(compile_model(m, target="vulkan", variants={"*": variant}))[0].plan.steps
    assert step.variant.decode() == f"gpu.conv_{variant}"
    (d,) = step.kind.dispatches
    tiles = -(-2050 * 2050 // 64) if variant == "gemm" else -(-1025 * 1025 // 8)
    assert max(d.grid) <= 65535 and d.grid[0] * d.grid[2] >= tiles


def test_int64_constant_tensors_beyond_32_bits_are_refused():
    """Shaders compute integers in 32 bits: an int64 constant tensor they
    would read that does not fit is a compile error, not a wrong answer."""
    big = numpy_helper.from_array(np.full(4, 2**40, np.int64), "big")
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
             helper.make_node("Add", ["xi", "big"], ["y"])]
    with pytest.raises(CompileError, match="32 bits"):
        compile_model(model(nodes, [big], (1, 4, 6, 4), {"y": TensorProto.INT64}, 13), target="vulkan")


def test_int64_input_values_beyond_32_bits_are_refused_at_run(tmp_path):
    """A GPU bundle computes int64 in 32 bits: an int64 input value beyond
    them is an error naming the input, never a wrong answer; values within
    them run."""
    table = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "ids",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3])],
                          [numpy_helper.from_array(table, "table")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = coldbrew.load(compile_model(m, target="vulkan"))
    ids = np.array([[1, 39, -2, 7]], np.int64)
    assert_close(sess.run(None, {"ids": ids}), ort_run(m, {"ids": ids}))
    with pytest.raises(Exception, match=r"input 'ids' holds 4294967297 at element 2: a GPU bundle computes int64 in "
                                        r"32 bits"):
        sess.run(None, {"ids": np.array([[1, 2, 2**32 + 1, 3]], np.int64)})


def test_an_input_passed_straight_to_an_output_is_copied_on_the_gpu(tmp_path):
    """A model output no layer writes (an input passed through, as an
    encoder hands its mask on) is a copy layer, scheduled for the GPU too."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["x"], ["same"])]
    m = model(nodes, [], (1, 3, 5), {"r": TensorProto.FLOAT, "same": TensorProto.FLOAT}, 13)
    assert_matches_onnxruntime(m, tmp_path)
