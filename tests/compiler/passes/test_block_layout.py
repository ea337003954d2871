"""block_layout: activations between convolutions in the vector's blocked
layout NCHW{lanes}c, channel counts padded to whole blocks where that adds
at most a third; every other consumer reads an NCHW copy. Checked against
onnxruntime for the host's lanes and AVX2's (8), whatever the machine."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_close, cpu_targets, ort_run
from coldbrew.compiler.passes.block_layout import conv_blocks
from coldbrew.targets import resolve

TARGETS = cpu_targets()


def test_conv_blocks_follow_the_channel_counts_only():
    assert conv_blocks(3, 32, 1, 16) == (0, 16)      # RGB in NCHW, output blocked
    assert conv_blocks(96, 24, 1, 16) == (16, 16)    # 24 -> 32: a third more
    assert conv_blocks(24, 144, 1, 8) == (8, 8)      # exact on 8 lanes
    assert conv_blocks(16, 10, 1, 16) == (0, 0)      # 10 -> 16 pads too much: NCHW
    assert conv_blocks(24, 24, 24, 16) == (16, 16)   # depthwise, padded
    assert conv_blocks(12, 12, 3, 4) == (0, 0)       # grouped, not depthwise: NCHW


def _model():
    """RGB conv -> relu -> conv to 24 channels (padded on 16 lanes) -> Clip
    -> depthwise -> residual add -> max pool -> two branches concatenated ->
    average pool -> Softmax over channels (an NCHW consumer) and a global
    average pool -> flatten -> gemm."""
    rng = np.random.default_rng(5)
    inits = []

    def const(name, shape, scale=0.3):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def conv(name, src, c_in, c_out, k, stride=1, group=1):
        return helper.make_node("Conv", [src, const(f"{name}_w", (c_out, c_in // group, k, k)),
                                         const(f"{name}_b", (c_out,))], [name], pads=[k // 2] * 4,
                                strides=[stride] * 2, group=group, name=name)

    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "lo"))
    inits.append(numpy_helper.from_array(np.array(6.0, np.float32), "hi"))
    nodes = [
        conv("c0", "x", 3, 16, 3, stride=2), helper.make_node("Relu", ["c0"], ["r0"]),
        conv("c1", "r0", 16, 24, 1), helper.make_node("Clip", ["c1", "lo", "hi"], ["k1"]),
        conv("c2", "k1", 24, 24, 3, group=24), helper.make_node("Add", ["c2", "k1"], ["a2"]),
        helper.make_node("MaxPool", ["a2"], ["p2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        conv("c3", "p2", 24, 16, 1), conv("c4", "p2", 24, 32, 3),
        helper.make_node("Concat", ["c3", "c4"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[1, 1]),
        helper.make_node("Softmax", ["ap"], ["sm"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", const("fw", (5, 48)), const("fb", (5,))], ["y"], transB=1),
    ]
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 18])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
            helper.make_tensor_value_info("sm", TensorProto.FLOAT, [1, 48, 4, 4])]
    m = helper.make_model(helper.make_graph(nodes, "blocks", x, outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_model_matches_onnxruntime(target):
    import coldbrew
    from coldbrew.compiler import compile_graph

    model = _model()
    lanes = resolve(target).vector.lanes
    x = np.random.default_rng(1).standard_normal((1, 3, 20, 18)).astype(np.float32)
    data, graph = compile_graph(model, target=target)
    variants = {layer.variant for layer in graph.layers}
    assert {"conv2d.blocked", "conv2d.depthwise_blocked"} <= variants, variants
    blocked = [t for t in graph.tensors if len(t.shape) == 5]
    assert blocked and all(t.shape[-1] == lanes for t in blocked)
    # the 24-channel values: exact blocks on 8 lanes, padded to 32 on 16
    assert any(t.shape[1] * t.shape[-1] == (32 if lanes == 16 else 24) for t in blocked)
    got = coldbrew.load(data).run(None, {"x": x})
    assert_close(got, ort_run(model, {"x": x}), 1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_a_layer_alone_gets_the_layout_it_has_in_the_model(target):
    # the tuner and the profiler measure each layer in a model of its own
    from coldbrew.compiler.measure.tune import anchors_of, layers_model
    from coldbrew.compiler.options import Options
    from coldbrew.compiler.pipeline import front_end

    for a in anchors_of(front_end(_model(), Options(target=target))):
        (alone,) = anchors_of(front_end(layers_model([a.spec]), Options(target=target)))
        assert alone.spec == a.spec


def test_a_forced_nchw_variant_keeps_its_convolution_nchw():
    from coldbrew.compiler import compile_graph

    _, graph = compile_graph(_model(), variants={"*": "im2col_gemm"})
    assert not [t for t in graph.tensors if len(t.shape) == 5]
    variants = {layer.variant for layer in graph.layers} - {"generic"}
    assert variants == {"conv2d.im2col_gemm", "conv2d.depthwise_direct", "dense.packed_gemm"}, variants
    _, graph = compile_graph(_model(), variants={"c2": "depthwise_direct"})  # one layer NCHW, the rest blocked
    by_name = {layer.name: layer.variant for layer in graph.layers}
    assert by_name["c2"] == "conv2d.depthwise_direct" and by_name["c1"] == "conv2d.blocked"


def test_relax_clip_keeps_its_bounds_on_blocked_values():
    # R.clip carries its bounds as operands: the blocked call keeps them
    import tvm
    from tvm import relax

    from coldbrew.compiler.passes import block_layout

    isa = resolve("host").vector
    c = 2 * isa.lanes
    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const((rng.standard_normal((c, c, 3, 3)) * 0.3).astype(np.float32))
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            z = bb.emit(relax.op.clip(y, 0.0, 0.5))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    mod = bb.get()
    blocked = block_layout.apply(mod, isa)
    clips = [b.value for b in blocked["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.clip"]
    assert len(clips) == 1 and len(clips[0].args) == 3 and len(clips[0].args[0].ty.shape.values) == 5
    data = rng.standard_normal((1, c, 6, 6)).astype(np.float32)

    def run(m):
        ex = relax.build(m, tvm.target.Target({"kind": "llvm"}))
        return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()

    # TVM's own lowering has no blocked conv2d: the blocked one runs as its variant
    from coldbrew.compiler.passes import select_variants

    assert_close(run(select_variants.apply(blocked, isa)[0]), run(mod), 1e-5)


def test_float16_convolutions_stay_nchw():
    """The blocked variants are float32: a float16 convolution that reaches
    block_layout (legalize_onnx widens CPU ones; this one skips it) keeps
    NCHW, where its generic lowering exists."""
    from coldbrew.compiler.passes import block_layout, import_relax

    w = numpy_helper.from_array(np.ones((32, 16, 3, 3), np.float16), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], "c16",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 16, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 32, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    mod = block_layout.apply(import_relax.apply(m), resolve("host").vector)
    assert "NCHW16c" not in mod.script() and "NCHW8c" not in mod.script()
