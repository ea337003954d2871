"""compiler/ir/graph.py and anchors.py: the coldbrew Graph (aliases,
kernel signatures, its dump), anchor names and forced
choices."""
import pytest

from coldbrew.compiler import CompileError
from coldbrew.compiler.ir.anchors import ANCHOR_RE, GPU_ANCHOR_RE, forced
from coldbrew.compiler.ir.graph import Graph, Layer, Tensor, resolve, signatures


def test_resolve_follows_aliases_to_the_root_adding_offsets():
    g = Graph("m")
    for k in range(3):
        g.add_tensor(Tensor(f"t{k}", "float32", (4,), "intermediate"))
    g.aliases = {2: (1, 8), 1: (0, 16)}
    assert resolve(g, 2) == (0, 24) and resolve(g, 1) == (0, 16) and resolve(g, 0) == (0, 0)


def test_signatures_give_each_kernels_argument_dtypes_and_bytes():
    from tvm import te

    a = te.placeholder((2, 3), "float32", name="a")
    b = te.compute((2, 3), lambda i, j: a[i, j].astype("float16"), name="b")
    g = Graph("m", kernels={"k1": te.create_prim_func([a, b])})
    assert signatures(g) == [("k1", [("float32", 24), ("float16", 12)])]
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    g.kernels["k0"] = te.create_prim_func([x, te.compute((n,), lambda i: x[i], name="y")])
    with pytest.raises(CompileError, match="k0: argument 'x' has a symbolic dimension"):
        signatures(g)


def test_the_dump_names_every_input_layer_alias_and_output():
    g = Graph("m")
    x = g.add_tensor(Tensor("x", "float32", (1, 4), "input"))
    y = g.add_tensor(Tensor("y", "float32", (1, 4), "output"))
    g.inputs, g.outputs, g.aliases = [x], [y], {y: (x, 0)}
    g.layers.append(Layer("c0", "conv2d", "cb0_conv", [x, y], 1, variant="conv2d.blocked"))
    text = g.dump()
    for part in ("graph m: 2 tensors, 1 layers", "input  %0 x float32[1, 4]", "c0: conv2d [conv2d.blocked, raw] (%0, %1)",
                 "alias  %1 = bytes 0.. of %0", "output %1 y float32[1, 4]"):
        assert part in text


def test_anchor_names_are_found_after_fusion():
    assert ANCHOR_RE.search("fused_cb12_blocked_add_relu").group(1) == "12"
    assert ANCHOR_RE.search("cb3_winograd").group(1) == "3"
    assert ANCHOR_RE.search("fused_conv2d_add") is None and ANCHOR_RE.search("xcb3_a") is None
    assert GPU_ANCHOR_RE.match("cbg4_direct").group(1) == "4" and GPU_ANCHOR_RE.match("cb4_x") is None


def test_forced_choices_come_most_specific_first():
    choice = {"*": "direct", "conv2d": ("winograd_f4", {"tile": 2}), "c3": "conv2d.im2col_gemm", "c4": "auto"}
    assert list(forced(choice, "c3", "conv2d")) == [
        ("c3", "conv2d.im2col_gemm", "conv2d.im2col_gemm", None),
        ("conv2d", "winograd_f4", "conv2d.winograd_f4", {"tile": 2}),
        ("*", "direct", "conv2d.direct", None)]
    assert [k for k, *_ in forced(choice, "c4", "conv2d")] == ["conv2d", "*"]  # auto: no choice
    assert list(forced({}, "c0", "dense")) == []
