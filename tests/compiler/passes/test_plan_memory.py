"""compiler/passes/plan_memory.py: every non-weight tensor gets an aligned arena
offset, and no two tensors alive at the same step share a byte; prepared
weights get slots of their own."""
import pytest

from coldbrew.compiler import compile_graph
from coldbrew.compiler.ir.graph import resolve
from coldbrew.compiler.passes.plan_memory import ALIGN


def lifetimes(graph):
    """{root tensor: (first step, last step)}, inputs from before the first
    step and inputs and outputs to after the last, as the pass counts them."""
    n = len(graph.layers)
    span = {}
    for step, layer in enumerate(graph.layers):
        for a in layer.args:
            if graph.tensors[a].kind not in ("weight", "prepared"):
                r = resolve(graph, a)[0]
                lo, hi = span.get(r, (step, step))
                span[r] = (min(lo, step), max(hi, step))
    for i in graph.inputs:
        span[resolve(graph, i)[0]] = (-1, n)
    for i in graph.outputs:
        r = resolve(graph, i)[0]
        span[r] = (span.get(r, (n, n))[0], n)
    return span


@pytest.mark.parametrize("weights", ["cached", "raw"])
def test_live_tensors_never_overlap(small_model, weights):
    _, graph = compile_graph(small_model, weights=weights)
    span = lifetimes(graph)
    placed = [(graph.tensors[t].arena_offset, graph.tensors[t].nbytes, lo, hi) for t, (lo, hi) in span.items()]
    assert len(placed) > 2
    for k, (o, s, lo, hi) in enumerate(placed):
        assert o % ALIGN == 0 and o + s <= graph.arena_size
        for o2, s2, lo2, hi2 in placed[k + 1:]:
            if not (hi < lo2 or hi2 < lo):  # alive together
                assert o + s <= o2 or o2 + s2 <= o, (o, s, o2, s2)
    prepared = sorted((t.arena_offset, t.nbytes) for t in graph.tensors if t.kind == "prepared")
    assert (len(prepared) > 0) == (weights == "raw")
    for (o, s), (o2, _) in zip(prepared, prepared[1:]):
        assert o % ALIGN == 0 and o + s <= o2
    assert sum(-(-s // ALIGN) * ALIGN for _, s in prepared) == graph.prepared_size


def test_tensors_that_do_not_live_together_share_memory(small_model):
    _, graph = compile_graph(small_model)
    roots = [t for t in lifetimes(graph)]
    total = sum(-(-graph.tensors[t].nbytes // ALIGN) * ALIGN for t in roots)
    assert graph.arena_size < total  # some bytes are reused
