"""compiler/passes/schedule_kernels.py: every kernel after fusion gets a schedule
(its variant's where it holds an anchor, the generic one elsewhere), and a
variant schedule that fails falls back to the generic one with a note,
still computing the right result."""
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_close, ort_run

import coldbrew
from coldbrew.compiler import compile_graph, compile_model
from coldbrew.compiler.errors import ScheduleFallbackWarning
from coldbrew.compiler.kernels import Variant
from coldbrew.compiler.tools.cli import main


def _run(data, x):
    return coldbrew.load(data).run(None, {"x": x})[0]


def _break_every_variant_schedule(monkeypatch):
    def broken(self, sch, block, spec, params):
        raise ValueError("no tile fits")

    def every(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from every(sub)

    for cls in [Variant, *every(Variant)]:
        if "schedule" in vars(cls):
            monkeypatch.setattr(cls, "schedule", broken)


def test_a_failing_variant_schedule_falls_back_with_a_note(small_model, monkeypatch):
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    data, graph = compile_graph(small_model)
    assert not [n for n in graph.notes if "schedule failed" in n]
    _break_every_variant_schedule(monkeypatch)
    fallback, fgraph = compile_graph(small_model)
    failed = [n for n in fgraph.notes if "schedule failed (ValueError: no tile fits), generic schedule used" in n]
    assert len(failed) == len([la for la in fgraph.layers if la.variant != "generic"]) > 0
    assert fallback != data
    assert_close(_run(fallback, x), ort_run(small_model, {"x": x})[0])


def test_a_compile_whose_kernels_fall_back_warns_its_user(small_model, monkeypatch, tmp_path):
    """The note alone reached no user: compile_model warns
    (ScheduleFallbackWarning, every such kernel named) and `coldbrew
    compile` prints it as a line; a compile without one warns nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleFallbackWarning)
        compile_model(small_model)
    path = tmp_path / "m.onnx"
    path.write_bytes(small_model.SerializeToString())
    _break_every_variant_schedule(monkeypatch)
    with pytest.warns(ScheduleFallbackWarning, match=r"kernel\(s\) run on the generic schedule .*fused_cb0.*no tile fits"):
        compile_model(small_model)
    done = CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "m.brew")])
    assert done.exit_code == 0, done.output
    assert "warning: " in done.output and "run on the generic schedule" in done.output


def test_an_epilogue_reading_a_value_computed_ahead_of_the_anchor_keeps_the_variant_schedule():
    """A MatMulInteger whose left operand's zero point is computed at run
    time (decompose.py: a x b_c - a_zero x b_c's column sums): the zero
    point's cast to float is a block ahead of the anchor that only the
    epilogue reads; it is inlined so the epilogue can follow the tiles
    (else the variant's schedule fails and the layer runs generic)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    b = rng.integers(-127, 128, (64, 48), dtype=np.int8)
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])], "mi",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [40, 64]),
         helper.make_tensor_value_info("az", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [40, 48])], [numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data, graph = compile_graph(m)
    assert not [n for n in graph.notes if "schedule failed" in n], graph.notes
    a = rng.integers(0, 256, (40, 64), dtype=np.uint8)
    az = np.array(131, np.uint8)
    got = coldbrew.load(data).run(None, {"a": a, "az": az})[0]
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 131) @ b.astype(np.int64))
