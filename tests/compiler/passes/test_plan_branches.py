"""compiler/passes/plan_branches.py: an If whose condition is computed at run
time executes only the branch the condition takes (branch steps guarded by
the condition, skipped by the runtime: seen in the trace), with the model's
outputs for either value; a bundle whose guard is not a bool is refused."""
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import coldbrew
from conftest import ROOT, ort_run
from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.tools.inspect import describe


def if_model(nested=False):
    """out = relu(If(sum(x) > 0, then: x * 2 + 1 then a 64-wide projection,
    else: x - 3)): each branch a few layers, one with its own weights. With
    `nested`, the then branch holds a second If on max(x) > 1."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    then_nodes = [helper.make_node("Mul", ["x", "two"], ["t1"]), helper.make_node("Add", ["t1", "one"], ["t2"]),
                  helper.make_node("MatMul", ["t2", "w"], ["t3"]), helper.make_node("Tanh", ["t3"], ["ty"])]
    if nested:
        inner_then = helper.make_graph([helper.make_node("Sigmoid", ["ty"], ["iy"])], "inner_then", [],
                                       [helper.make_tensor_value_info("iy", TensorProto.FLOAT, [1, 8])])
        inner_else = helper.make_graph([helper.make_node("Neg", ["ty"], ["ny"])], "inner_else", [],
                                       [helper.make_tensor_value_info("ny", TensorProto.FLOAT, [1, 8])])
        then_nodes += [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
                       helper.make_node("Greater", ["m", "one"], ["c2"]),
                       helper.make_node("If", ["c2"], ["ty2"], then_branch=inner_then, else_branch=inner_else,
                                        name="inner")]
    then_g = helper.make_graph(then_nodes, "then", [],
                               [helper.make_tensor_value_info("ty2" if nested else "ty", TensorProto.FLOAT, [1, 8])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "three"], ["ey"])], "else", [],
                               [helper.make_tensor_value_info("ey", TensorProto.FLOAT, [1, 8])])
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="outer"),
         helper.make_node("Relu", ["y"], ["out"])], "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
         (("two", 2), ("one", 1), ("three", 3), ("zero", 0))] + [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("nested", [False, True])
def test_only_the_branch_the_condition_takes_is_executed(nested):
    """Each guarded step runs exactly when its condition holds its value
    (an inner If's steps: and the outer one takes their branch); every
    other step runs; the outputs are onnxruntime's for either branch."""
    model = if_model(nested)
    data = compile_model(model)
    b = read_bytes(data)[0]
    selects = [s for s in b.plan.steps if b.layers[s.layer].op.startswith(b"cb_branch_select")]
    conditions = {s.kind.guard.tensor for s in b.plan.steps if s.kind.guard}
    assert len(selects) == len(conditions) == (2 if nested else 1)
    outer = selects[0].kind.guard.tensor if nested else conditions.pop()  # the inner select: a step of the outer If
    inner = (conditions - {outer}).pop() if nested else outer
    steps = {b.layers[s.layer].name.decode(): (s.kind.guard.tensor, s.kind.guard.value) if s.kind.guard else (-1, False)
             for s in b.plan.steps}
    assert {v for g, v in steps.values() if g == outer} == {True, False}  # both branches have steps
    s = coldbrew.load(data, trace=True)
    for x in (np.full((1, 8), 0.5, np.float32), np.full((1, 8), -0.5, np.float32), np.full((1, 8), 2.0, np.float32),
              np.linspace(-1, 3, 8, dtype=np.float32).reshape(1, 8)):
        np.testing.assert_allclose(s.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
        ran = {e["layer"] for e in s.trace() if e["phase"] == "execute"}
        truth = {inner: bool(x.max() > 1), outer: bool(x.sum() > 0)}  # one condition when not nested
        for name, (g, v) in steps.items():
            if g < 0:
                assert name in ran, (name, x)
            elif g == outer:
                assert (name in ran) == (v == truth[outer]), (name, x)
            else:  # the inner If: its own condition decides where the outer If reaches it; else nothing runs
                assert (name in ran) == (truth[outer] and v == truth[inner]), (name, x)


def test_every_step_runs_in_an_order_that_computes_each_guard_first(tmp_path):
    data = compile_model(if_model(nested=True))
    b = read_bytes(data)[0]
    written = set(b.inputs)
    for s in b.plan.steps:
        layer = b.layers[s.layer]
        if s.kind.guard:
            assert s.kind.guard.tensor in written, (layer.name, s.kind.guard.tensor)
        written |= set(layer.args[len(layer.args) - layer.numOutputs:])
    (tmp_path / "if.brew").write_bytes(data)  # the inspector names each branch step's condition
    guarded = [s for s in b.plan.steps if s.kind.guard]
    lines = describe(str(tmp_path / "if.brew"))
    assert len([ln for ln in lines if "branch step: runs when" in ln]) == len(guarded) > 0
    assert f"branches   {len(guarded)} branch steps" in "\n".join(lines)


def test_a_guard_that_is_not_one_bool_is_refused(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
    from hostile import expect, repack

    data = bytearray(compile_model(if_model()))
    b = read_bytes(bytes(data))[0]
    k = next(i for i, s in enumerate(b.plan.steps) if s.kind.guard)

    def a_weight(bt):
        bt.plan.steps[k].kind.guard.tensor = next(i for i, t in enumerate(bt.tensors) if t.kind == 3)

    def out_of_range(bt):
        bt.plan.steps[k].kind.guard.tensor = len(bt.tensors)

    def a_float(bt):
        bt.plan.steps[k].kind.guard.tensor = bt.inputs[0]

    for mutate in (a_weight, out_of_range, a_float):
        expect(repack(data, mutate), "CORRUPT", tmp_path, match="guard")


def test_a_branch_not_taken_has_its_weights_read_by_the_first_run_that_takes_it(tmp_path):
    """The first run (else branch) reads none of the then branch's weights;
    the first run that takes the then branch reads them, checks them (a
    damaged one fails that run, named), and gives onnxruntime's output."""
    model = if_model()
    data = compile_model(model, weights="raw")
    b = read_bytes(data)[0]
    then_steps = {b.layers[s.layer].name.decode() for s in b.plan.steps if s.kind.guard and s.kind.guard.value}
    weighted = {b.layers[s.layer].name.decode() for s in b.plan.steps
                if any(b.tensors[a].kind == 3 for a in list(b.layers[s.layer].args) + list(s.transformArgs if s.transformArgs is not None else []))}
    assert then_steps & weighted
    low, high = np.full((1, 8), -0.5, np.float32), np.full((1, 8), 0.5, np.float32)
    s = coldbrew.load(data, trace=True)
    s.run(None, {"x": low})
    assert not {e["layer"] for e in s.trace() if e["phase"] in ("read", "transform")} & then_steps
    np.testing.assert_allclose(s.run(None, {"x": high})[0], ort_run(model, {"x": high})[0], rtol=1e-5, atol=1e-6)
    assert then_steps & weighted <= {e["layer"] for e in s.trace() if e["phase"] == "read"}
    np.testing.assert_allclose(s.run(None, {"x": high})[0], ort_run(model, {"x": high})[0], rtol=1e-5, atol=1e-6)
    assert not {e["layer"] for e in s.trace() if e["phase"] == "read"}  # read once
    # a damaged weight of the branch not taken surfaces when the branch is first taken
    w = next(t for t in b.tensors if t.kind == 3)
    bad = bytearray(data)
    bad[b.segments[w.segment].offset + w.segmentOffset] ^= 0xFF
    s = coldbrew.load(bytes(bad))
    s.run(None, {"x": low})
    with pytest.raises(coldbrew.BundleError, match="checksum|CORRUPT|corrupt"):
        s.run(None, {"x": high})
