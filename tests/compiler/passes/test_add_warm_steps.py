"""compiler/passes/add_warm_steps.py (continuous mode): a layer whose warm
plan variant differs from the cold plan's gets that variant as an alternate
(its kernel under a `warm_` symbol, its activations mapped onto the cold
layer's tensors, its weights added once, one the plan already ships shared);
a warm plan whose layers do not line up adds none, with a note."""
import numpy as np
import pytest

from coldbrew.compiler import pipeline
from coldbrew.compiler.passes import add_warm_steps
from coldbrew.compiler.options import Choices

COLD = {"conv2d": "conv2d.im2col_gemm"}
WARM = {"conv2d": "conv2d.winograd_f2"}


@pytest.fixture(scope="module")
def lowered(small_model):
    """A function giving a fresh (cold, warm) pair of the small model's
    Graphs, lowered as compile_graph lowers them in continuous mode."""
    front = pipeline.front_end(small_model)

    def make():
        cold = pipeline.lower(front, Choices(COLD, "raw", 2, 1))
        warm = pipeline.lower(front, Choices(WARM, "cached", 2, 0))
        return cold, warm

    return make


def _layer(graph, name):
    return next(layer for layer in graph.layers if layer.name == name)


def _activations(graph, layer):
    return [i for i in layer.args if graph.tensors[i].kind in ("input", "output", "intermediate")]


def test_the_warm_variant_becomes_the_layers_alternate(lowered):
    cold, warm = lowered()
    n_tensors, kernels = len(cold.tensors), dict(cold.kernels)
    assert cold.warm_threads == 0
    out = add_warm_steps.apply(cold, warm, 3)
    assert out is cold and cold.warm_threads == 3
    c0, w0 = _layer(cold, "c0"), _layer(warm, "c0")
    assert c0.variant == "conv2d.im2col_gemm" and w0.variant == "conv2d.winograd_f2"
    alt = c0.warm
    assert alt["variant"] == "conv2d.winograd_f2" and alt["params"] == w0.params
    # the warm kernel joins the code under its own symbol; the plan's kernels stay
    assert alt["kernel"] == f"warm_{w0.kernel}" and cold.kernels[alt["kernel"]] is warm.kernels[w0.kernel]
    assert set(cold.kernels) == set(kernels) | {alt["kernel"]}
    # activations: the cold layer's own tensors, in order
    assert len(alt["args"]) == len(w0.args)
    acts = [a for a, w in zip(alt["args"], w0.args) if warm.tensors[w].kind != "weight"]
    assert acts == _activations(cold, c0)
    # weights: the Winograd weights added (cached, warm's bytes), the bias the plan ships reused
    weights = [(a, w) for a, w in zip(alt["args"], w0.args) if warm.tensors[w].kind == "weight"]
    added = [(a, w) for a, w in weights if a >= n_tensors]
    shared = [(a, w) for a, w in weights if a < n_tensors]
    assert len(added) == 1 and len(shared) == 1 and len(cold.tensors) == n_tensors + 1
    (a, w), = added
    t = cold.tensors[a]
    assert t.kind == "weight" and t.cached and t.name == f"{warm.tensors[w].name}.warm"
    np.testing.assert_array_equal(t.data, warm.tensors[w].data)
    (a, w), = shared
    assert cold.tensors[a].kind == "weight"
    np.testing.assert_array_equal(cold.tensors[a].data, warm.tensors[w].data)
    # a layer on the same variant with the same parameters has nothing to switch to
    assert all(layer.warm is None for layer in cold.layers if layer.name != "c0")
    assert not cold.notes


def test_warm_layers_that_do_not_line_up_add_no_alternate(lowered):
    cold, warm = lowered()
    warm.layers.pop()
    add_warm_steps.apply(cold, warm, 2)
    assert all(layer.warm is None for layer in cold.layers)
    assert any("the warm plan has" in n and "no warm alternates" in n for n in cold.notes), cold.notes
    # a layer of another name, or whose activations have other shapes, keeps the plan's variant
    for mismatch in ("name", "shape"):
        cold, warm = lowered()
        n_tensors, kernels = len(cold.tensors), set(cold.kernels)
        w0 = _layer(warm, "c0")
        if mismatch == "name":
            w0.name = "other"
        else:
            out = warm.tensors[_activations(warm, w0)[-1]]
            out.shape = (out.shape[0] * 2, *out.shape[1:])
        add_warm_steps.apply(cold, warm, 2)
        assert _layer(cold, "c0").warm is None, mismatch
        assert len(cold.tensors) == n_tensors and set(cold.kernels) == kernels
        assert any("does not line up" in n and "keeps conv2d.im2col_gemm" in n for n in cold.notes), cold.notes


def test_run_adds_alternates_only_with_a_warm_graph(lowered):
    cold, warm = lowered()
    c = add_warm_steps.run(pipeline.Compilation(graph=cold, choices=Choices(later_threads=4)))
    assert c.graph.warm_threads == 4 and all(layer.warm is None for layer in c.graph.layers)
    c = add_warm_steps.run(pipeline.Compilation(graph=cold, choices=Choices(warm=(WARM, 2)), warm_graph=warm))
    assert c.graph.warm_threads == 2 and _layer(c.graph, "c0").warm["variant"] == "conv2d.winograd_f2"
