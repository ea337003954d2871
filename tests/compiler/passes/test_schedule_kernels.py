"""compiler/passes/schedule_kernels.py: every kernel after fusion gets a schedule
(its variant's where it holds an anchor, the generic one elsewhere), and a
variant schedule that fails falls back to the generic one with a note,
still computing the right result."""
import numpy as np
from conftest import assert_close, ort_run

import coldbrew
from coldbrew.compiler import compile_graph
from coldbrew.compiler.kernels import Variant


def _run(data, x):
    return coldbrew.load(data).run(None, {"x": x})[0]


def test_a_failing_variant_schedule_falls_back_with_a_note(small_model, monkeypatch):
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    data, graph = compile_graph(small_model)
    assert not [n for n in graph.notes if "schedule failed" in n]

    def broken(self, sch, block, spec, params):
        raise ValueError("no tile fits")

    def every(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from every(sub)

    for cls in [Variant, *every(Variant)]:
        if "schedule" in vars(cls):
            monkeypatch.setattr(cls, "schedule", broken)
    fallback, fgraph = compile_graph(small_model)
    failed = [n for n in fgraph.notes if "schedule failed (ValueError: no tile fits), generic schedule used" in n]
    assert len(failed) == len([la for la in fgraph.layers if la.variant != "generic"]) > 0
    assert fallback != data
    assert_close(_run(fallback, x), ort_run(small_model, {"x": x})[0])
