"""A Loop the data stops, as the runtime reads it (schema 6 Plan.loops;
runtime/src/bundle/model.cc parse_loops, runtime/src/exec/run.c): a loop
whose steps, state or carried and scan values do not fit is CORRUPT naming
it (each made by editing the header of a compiled bundle); the memory plan
keeps what the body reads from before the loop alive across iterations."""
import numpy as np
import pytest
from test_shapes import header, refused, rewrite

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes

import sys
import os

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "compiler", "onnx"))
from test_loops import data_loop, loop_feeds  # noqa: E402


@pytest.fixture(scope="module")
def data():
    return compile_model(data_loop(8))


def test_the_bundle_has_one_loop_around_its_body(data):
    b, _, version = read_bytes(data)
    (loop,) = b.plan.loops
    assert version == 6 and 0 <= loop.start < loop.end < len(b.plan.steps) and loop.most == 8
    assert loop.name == b"hs" and list(loop.carriedTo)[0] == loop.cond and len(loop.scanFrom) == 1
    sess = coldbrew.load(data)
    assert sess.run(None, loop_feeds(1.5))[1].shape == (2, 1, 4)


def test_inspect_shows_the_loop(data, tmp_path):
    from coldbrew.compiler.tools.inspect import describe

    path = tmp_path / "loop.brew"
    path.write_bytes(data)
    (line,) = [x for x in describe(str(path)) if x.startswith("loop ")]
    assert "('hs')" in line and "at most 8 iterations" in line and "2 carried values, 1 scan outputs" in line, line


def edit(**fields):
    def mutate(b):
        for k, v in fields.items():
            setattr(b.plan.loops[0], k, v(b.plan.loops[0]) if callable(v) else v)
    return mutate


@pytest.mark.parametrize("fields", [
    dict(start=lambda lp: lp.end), dict(end=10**6), dict(cond=lambda lp: lp.iteration),
    dict(trip=lambda lp: lp.cond), dict(most=0), dict(carriedTo=lambda lp: list(lp.carriedTo)[::-1]),
    dict(carriedFrom=lambda lp: list(lp.carriedFrom)[:1]), dict(scanTo=lambda lp: list(lp.scanFrom)),
    dict(iteration=10**6)])
def test_a_loop_that_does_not_fit_is_refused(data, fields):
    refused(rewrite(data, edit(**fields)), "loop 0 ('hs')")


def test_a_version_5_bundle_cannot_hold_loops(data):
    refused(rewrite(data, lambda b: None, version=5), "the plan has loops, which a version-5 bundle cannot hold")


def test_what_the_body_reads_from_before_the_loop_keeps_its_place():
    """Every tensor a body step reads that was written before the loop (or
    is an input) lies apart from every tensor the body writes: the next
    iteration reads it again."""
    data = compile_model(data_loop(8))
    b = header(data)
    (loop,) = b.plan.loops
    args = [list(b.layers[s.layer].args) for s in b.plan.steps]
    outs = [a[len(a) - b.layers[s.layer].numOutputs:] for s, a in zip(b.plan.steps, args)]
    body = range(loop.start + 1, loop.end)
    written_in = {t for k in body for t in outs[k]}
    written_before = {t for k in range(loop.start + 1) for t in outs[k]} | set(b.inputs)
    read = {t for k in body for t in args[k][:len(args[k]) - len(outs[k])]} & written_before - written_in

    def region(t):
        x = b.tensors[t]
        return x.arenaOffset, x.arenaOffset + max(x.nbytes, 1)

    assert read
    for t in read:
        for u in written_in:
            (a0, a1), (b0, b1) = region(t), region(u)
            assert a1 <= b0 or b1 <= a0, (b.tensors[t].name, b.tensors[u].name)
