"""ONNX's own backend node test cases (shipped inside the onnx package), for
every operator coldbrew claims to support (compiler/onnx/ops.py SUPPORTED_OPS).

A case runs when all its ops are supported, its opset is in range, its
tensors use dtypes coldbrew has and none of its values is random (a
seeded random operator's values are the engine's own). Inputs that decide
shapes or modes (the ones ops.STATIC_INPUTS lists, a Loop's trip count and
first condition, a Range's limits; traced back to the graph inputs they
come from) are bound as compile-time constants, as they are in real models.
Every selected case must either match the reference outputs or, where the
case uses a mode coldbrew does not implement, be refused with a
CompileError that names it (never a crash, never a wrong answer).
"""
import warnings

import numpy as np
import onnx
import pytest

import coldbrew
from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.ir.forms import DTYPES
from coldbrew.compiler.onnx.ops import MAX_OPSET, MIN_OPSET, STATIC_INPUTS, SUPPORTED_OPS
from coldbrew.compiler.passes.import_relax import RANDOM

# Modes refused by ops.check_static, with the words its message uses.
REFUSED = ("training_mode", "optional outputs", "output_shape attribute", "zero-size tensors",
           "bool inputs are not supported", "axes attribute", "antialias", "keep_aspect_ratio_policy",
           "half_pixel_symmetric", "whole output sizes", "fmod=0 is not supported yet",
           "blocked quantization (block_size) is not supported yet", "unrolling it is not supported",
           "mode=max is not supported", "opset-8 Scan")


def _dtypes_ok(model):
    g = model.graph
    for v in list(g.input) + list(g.output):
        if not v.type.HasField("tensor_type"):
            return False
        try:
            if onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name not in DTYPES:
                return False
        except Exception:
            return False
    return True


def _selected():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    out = []
    for c in cases:
        g = c.model.graph
        ops = {n.op_type for n in g.node}
        opset = next((o.version for o in c.model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if (ops and ops <= SUPPORTED_OPS and not ops & set(RANDOM) and all(n.domain in ("", "ai.onnx") for n in g.node)
                and MIN_OPSET <= opset <= MAX_OPSET and _dtypes_ok(c.model)):
            out.append(c)
    return out


CASES = _selected()
BOUND = {**STATIC_INPUTS, "Loop": {0, 1}, "Range": {0, 1, 2}}  # as an app binds them (else: --bound)


def _static_graph_inputs(model):
    """Graph inputs that feed (through any chain of nodes) a BOUND position."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    inputs = {i.name for i in g.input}
    found, stack, seen = set(), [], set()
    for n in g.node:
        for pos in BOUND.get(n.op_type, ()):
            if pos < len(n.input) and n.input[pos]:
                stack.append(n.input[pos])
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
        elif name in producer:
            stack.extend(i for i in producer[name].input if i)
    return found


def test_selection_is_broad():
    assert len(CASES) >= 1000  # the README's count (1,214 on 2026-11-28)
    covered = {n.op_type for c in CASES for n in c.model.graph.node}
    missing = {op for op in SUPPORTED_OPS if "." not in op} - covered  # contrib ops: tests/compiler/ir
    missing -= set(RANDOM)  # ONNX has no case of random values: tests/compiler/kernels/test_random.py
    assert not missing, f"supported ops without any ONNX node test case: {sorted(missing)}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case):
    inputs, expected = ([onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in xs]
                        for xs in case.data_sets[0])
    names = [i.name for i in case.model.graph.input]
    feeds = dict(zip(names, inputs))
    static = _static_graph_inputs(case.model)
    constants = {n: np.asarray(feeds.pop(n)) for n in names if n in static}
    try:
        data = compile_model(case.model, constants=constants)
    except CompileError as e:
        assert any(word in str(e) for word in REFUSED), f"unexpected compile error: {e}"
        return
    sess = coldbrew.load(data)
    got = sess.run(None, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.shape == e.shape
        if e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=max(case.rtol, 1e-3), atol=max(case.atol, 1e-4), equal_nan=True)
