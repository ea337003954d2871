"""elide_copies: concatenations and reshapes that only move bytes become
arena aliases; the layers that write their inputs write the output in place."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_close, ort_run


def _model(nodes, inits, outputs, x_shape=(1, 3, 12, 12)):
    """The model, its outputs typed by ONNX shape inference."""
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    g = helper.make_graph(nodes, "copies", x, [], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    known = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    m.graph.output.extend(known[o] for o in outputs)
    onnx.checker.check_model(m)
    return m


def _conv(rng, name, src, c_in, c_out, k=1):
    w = numpy_helper.from_array((rng.standard_normal((c_out, c_in, k, k)) * 0.3).astype(np.float32), f"{name}_w")
    node = helper.make_node("Conv", [src, w.name], [name], pads=[k // 2] * 4, name=name)
    return node, w


def _fire_model():
    """A squeeze/expand block whose two branches are concatenated, that
    concatenation a part of a second one, then flattened. Every channel
    count is one no vector's blocks take (5 pads to 8, more than a third):
    every convolution writes NCHW, on 4, 8 or 16 lanes."""
    rng = np.random.default_rng(3)
    made = [_conv(rng, "s", "x", 3, 5), _conv(rng, "e1", "sr", 5, 5), _conv(rng, "e3", "sr", 5, 5, 3),
            _conv(rng, "t", "cat", 10, 3)]
    nodes = [made[0][0], helper.make_node("Relu", ["s"], ["sr"]), made[1][0], made[2][0],
             helper.make_node("Concat", ["e1", "e3"], ["cat"], axis=1), made[3][0],
             helper.make_node("Concat", ["t", "cat"], ["cat2"], axis=1),
             helper.make_node("Flatten", ["cat2"], ["y"], axis=1)]
    return _model(nodes, [w for _, w in made], ["y"])


def _run(model, x):
    import coldbrew
    from coldbrew.compiler import compile_graph

    data, graph = compile_graph(model)
    sess = coldbrew.load(data)
    return graph, sess.run(None, {"x": x})


def test_concatenations_and_flatten_become_aliases_and_match_onnxruntime():
    model = _fire_model()
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    graph, (y,) = _run(model, x)
    ops = [layer.op for layer in graph.layers]
    assert not [op for op in ops if op.startswith(("concatenate", "reshape"))], ops
    assert len(ops) == 4, ops  # the four convolutions (relu fused into the first)
    # every part lies in its root's region at the sum of the parts before it
    from coldbrew.compiler.ir.graph import resolve

    out = graph.outputs[0]
    e1, e3, t = (layer.args[-1] for layer in graph.layers[1:])  # the tensors the convolutions write
    written = {layer.args[-1] for layer in graph.layers}
    (cat,) = [i for i in graph.aliases if i not in written]  # the first concatenation's output
    assert set(graph.aliases) == {e1, e3, t, cat}
    plane = 144 * 4  # bytes per channel
    for part, before in ((t, 0), (cat, 3 * plane), (e1, 3 * plane), (e3, 8 * plane)):
        root, offset = resolve(graph, part)
        assert root == out and offset == before, (part, root, offset)
        assert graph.tensors[part].arena_offset == graph.tensors[out].arena_offset + before
    assert_close(y, ort_run(model, {"x": x})[0], 1e-4)


def test_copies_that_move_bytes_stay_layers():
    """Concatenation along rows (parts interleave), with the model's input
    as a part, or with a part that is also a model output: a real copy."""
    rng = np.random.default_rng(5)
    a, wa = _conv(rng, "a", "x", 3, 3)
    b, wb = _conv(rng, "b", "x", 3, 3)
    nodes = [a, b, helper.make_node("Concat", ["a", "b"], ["rows"], axis=2),
             helper.make_node("Concat", ["x", "a"], ["with_input"], axis=1),
             helper.make_node("Concat", ["b", "a"], ["with_output"], axis=1)]
    model = _model(nodes, [wa, wb], ["rows", "with_input", "with_output", "b"])
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    graph, got = _run(model, x)
    concats = [layer for layer in graph.layers if layer.op.startswith("concatenate")]
    assert len(concats) == 3, [layer.op for layer in graph.layers]
    assert not graph.aliases
    assert_close(got, ort_run(model, {"x": x}), 1e-4)


def test_a_part_that_would_start_off_alignment_keeps_its_copy():
    """A part at byte 100 of its concatenation (one 5x5 channel first) would
    sit off the runtime's 64-byte tensor alignment: the copy stays, and the
    bundle opens and matches onnxruntime."""
    rng = np.random.default_rng(4)
    made = [_conv(rng, "a", "x", 3, 1), _conv(rng, "b", "x", 3, 2)]
    nodes = [made[0][0], made[1][0], helper.make_node("Relu", ["a"], ["ar"]), helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Concat", ["ar", "br"], ["y"], axis=1)]
    model = _model(nodes, [w for _, w in made], ["y"], x_shape=(1, 3, 5, 5))
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    graph, (got,) = _run(model, x)
    assert graph.aliases == {} and any("concatenate" in layer.op for layer in graph.layers)
    assert_close(got, ort_run(model, {"x": x})[0])
