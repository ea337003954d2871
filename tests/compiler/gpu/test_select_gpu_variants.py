"""compiler/gpu/select_gpu_variants.py: every convolution chain (conv ->
[+ bias] -> [+ residual] -> [relu | clip]...) becomes one opaque call of a
function computing the same thing, anchored by its weights and numbered
c0, c1, ... in graph order; a chain ends where a value is used elsewhere;
forced variants: per layer (an error where it does not apply), per op or
global (falling back where it does not apply)."""
import math

import numpy as np
import pytest
from conftest import ort_run
from gpu_models import chain_model, conv_sigmoid_model, front, make_model, prim_funcs
from onnx import helper, numpy_helper

from coldbrew.compiler import CompileError
from coldbrew.compiler.gpu import select_gpu_variants as sgv
from coldbrew.compiler.options import Choices
from coldbrew.compiler.ir.anchors import GPU_ANCHOR_RE
from coldbrew.compiler.passes import fuse_layers


@pytest.fixture(scope="module")
def chain():
    model, weights = chain_model()
    return model, weights, front(model).mod


def test_chains_are_found_and_numbered_in_graph_order(chain):
    _, w, mod = chain
    _, anchors = sgv.apply(mod)
    assert [(a.id, a.index, a.ops) for a in anchors] == [
        ("c0", 0, "conv2d_bias_add_relu"), ("c1", 1, "conv2d_bias_clip"), ("c2", 2, "conv2d")]
    e0, e1, e2 = (a.epilogue for a in anchors)
    assert (e0.residual, e0.lo, e0.hi) == (True, 0.0, math.inf)
    assert (e1.residual, e1.lo, e1.hi) == (False, 0.0, 3.0)  # relu, then clip(-1, 3): [0, 3]
    assert (e2.residual, e2.lo, e2.hi) == (False, -math.inf, math.inf)
    c0, c2 = anchors[0].conv, anchors[2].conv
    assert (c2.groups, c2.stride) == (16, (2, 2))
    assert (c0.n, c0.c, c0.h, c0.w, c0.k, c0.r, c0.s, c0.pad) == (1, 16, 8, 8, 16, 3, 3, (1, 1, 1, 1))
    np.testing.assert_array_equal(anchors[0].weight, w["W0"])
    np.testing.assert_array_equal(anchors[0].bias, w["B0"])
    np.testing.assert_array_equal(anchors[1].bias, w["B1"])
    np.testing.assert_array_equal(anchors[2].bias, np.zeros(16, np.float32))  # no bias: zeros
    assert anchors[0].res is not None and anchors[1].res is None and anchors[2].res is None
    assert [a.variant.name for a in anchors] == ["gpu.conv_gemm", "gpu.conv_gemm", "gpu.conv_direct"]


def test_each_chain_becomes_one_opaque_anchored_function(chain):
    _, _, mod = chain
    new, anchors = sgv.apply(mod)
    funcs = prim_funcs(new)
    named = sorted(n for n in funcs if GPU_ANCHOR_RE.search(n))
    assert named == ["cbg0_conv2d_bias_add_relu", "cbg1_conv2d_bias_clip", "cbg2_conv2d"]
    for n in named:
        assert int(funcs[n].attrs["op_pattern"]) == 8  # relax kOpaque: FuseOps leaves it alone
    # each call reads its anchor's weight constant (extract_layers finds the layer by it) and bias
    calls = {}
    for b in new["main"].body.blocks[0].bindings:
        if hasattr(b.value, "args") and b.value.args and hasattr(b.value.args[0], "name_hint"):
            calls[b.value.args[0].name_hint] = b.value.args[1].fields
    for a, n in zip(anchors, named):
        x, w, bias, *res = calls[n]
        assert w.same_as(a.const) and len(res) == (a.res is not None)
        np.testing.assert_array_equal(bias.value.numpy(), a.bias)
    # after fusion only the three chain functions are left: every op of each chain went into its call
    assert sorted(prim_funcs(fuse_layers.apply(new, cpu=False))) == named


def run_on_cpu(mod, x):
    """The module built for the CPU (Relax VM): its output for input x."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_the_new_module_computes_what_the_model_does(chain):
    """The chain functions (TE) compute conv, bias, residual and clamps as ONNX does."""
    model, _, mod = chain
    new, _ = sgv.apply(mod)
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run_on_cpu(new, x), ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_sum_of_two_convolutions_is_the_residual_of_the_first_chain_only():
    """relu(conv_a(x) + conv_b(x)): conv_b's output is conv_a's residual; conv_b's chain stops at the
    add the first chain took."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), n) for n in "AB"]
    inits += [numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), n) for n in ("bA", "bB")]
    nodes = [helper.make_node("Conv", ["x", "A", "bA"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "B", "bB"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, inits, (1, 3, 5, 5), {"y": (1, 6, 5, 5)})
    new, anchors = sgv.apply(front(model).mod)
    assert [(a.id, a.ops, a.epilogue.residual) for a in anchors] == [
        ("c0", "conv2d_bias_add_relu", True), ("c1", "conv2d_bias", False)]
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(run_on_cpu(new, x), ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_chain_function_stays_apart_from_what_follows():
    """The sigmoid after conv + bias is no clamp: the chain ends, and the opaque call is not fused with it."""
    new, anchors = sgv.apply(front(conv_sigmoid_model()).mod)
    assert [a.ops for a in anchors] == ["conv2d_bias"]
    names = sorted(prim_funcs(fuse_layers.apply(new, cpu=False)))
    assert "cbg0_conv2d_bias" in names and len(names) == 2, names


def _reused_model(as_output):
    """conv + bias -> c; relu(c) -> r; c is also used by an add (or is a model output)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"]), helper.make_node("Relu", ["c"], ["r"])]
    if as_output:
        return make_model(nodes, inits, (1, 4, 5, 5), {"c": (1, 4, 5, 5), "r": (1, 4, 5, 5)})
    nodes.append(helper.make_node("Add", ["c", "r"], ["y"]))
    return make_model(nodes, inits, (1, 4, 5, 5), {"y": (1, 4, 5, 5)})


@pytest.mark.parametrize("as_output", [False, True], ids=["used_twice", "model_output"])
def test_a_value_used_elsewhere_ends_the_chain(as_output):
    _, anchors = sgv.apply(front(_reused_model(as_output)).mod)
    (a,) = anchors
    assert a.ops == "conv2d_bias" and (a.epilogue.lo, a.epilogue.hi) == (-math.inf, math.inf)


def test_a_global_choice_applies_where_it_can(chain):
    _, _, mod = chain
    _, anchors = sgv.apply(mod, {"*": "winograd"})
    assert [a.variant.name for a in anchors] == ["gpu.conv_winograd", "gpu.conv_winograd", "gpu.conv_direct"]
    _, anchors = sgv.apply(mod, {"conv2d": "gpu.conv_direct"})
    assert [a.variant.name for a in anchors] == ["gpu.conv_direct"] * 3


def test_a_per_layer_choice_wins_over_a_global_one(chain):
    _, _, mod = chain
    _, anchors = sgv.apply(mod, {"c1": "winograd", "*": "direct", "c0": "auto"})
    assert [a.variant.name for a in anchors] == ["gpu.conv_gemm", "gpu.conv_winograd", "gpu.conv_direct"]


@pytest.mark.parametrize("want", ["winograd", "gemm"])
def test_a_per_layer_choice_that_does_not_apply_is_an_error(chain, want):
    _, _, mod = chain
    with pytest.raises(CompileError, match=f"GPU variant {want} does not apply to c2 "
                                           r"\(it takes gpu.conv_direct\)"):
        sgv.apply(mod, {"c2": want})


def test_run_sets_the_module_and_anchors_on_the_compilation(chain):
    model, _, _ = chain
    c = front(model)
    c.choices = Choices(variants={"c0": "winograd"})
    before = c.mod
    c = sgv.run(c)
    assert c.mod is not before and [a.id for a in c.anchors] == ["c0", "c1", "c2"]
    assert c.anchors[0].variant.name == "gpu.conv_winograd"
