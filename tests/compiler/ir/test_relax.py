"""compiler/ir/relax.py: constants seen through the operators that fold
them, Clip halves as TVM legalizes them, and layer ids."""
import numpy as np
import pytest

from coldbrew.compiler.ir.relax import LayerIds, bindings_of, clip_half, const_value, is_const, layer_id, shape_of

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402


def build(body):
    """A one-block Relax function main(x: [1, 6]) whose bindings `body(bb, x)` emits."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def test_const_value_sees_through_reshapes_transposes_and_nan_guards():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    w[0, 1] = np.nan
    seen = {}

    def body(bb, x):
        t = bb.emit(relax.op.permute_dims(relax.const(w)))               # [3, 2]
        r = bb.emit(relax.op.reshape(t, (1, 6)))
        nan = bb.emit(relax.op.isnan(r))
        guard = bb.emit(relax.op.where(nan, relax.const(np.zeros((1, 6), np.float32)), r))
        seen.update(t=t, r=r, guard=guard)
        return bb.emit(relax.op.add(x, guard))

    mod = build(body)
    block = mod["main"].body.blocks[0]
    bound = bindings_of(block)
    expect = np.nan_to_num(w.T.reshape(1, 6))
    vars_ = [b.var for b in block.bindings]
    values = [const_value(v, bound) for v in vars_]
    assert any(v is not None and v.shape == (3, 2) and np.allclose(np.nan_to_num(v), np.nan_to_num(w.T)) for v in values)
    assert any(v is not None and v.shape == (1, 6) and np.array_equal(v, expect) for v in values)
    assert const_value(vars_[-1], bound) is None  # x + ...: not a constant
    assert all(const_value(v) is None for v in vars_)  # without the bindings only constants count


def test_is_const_and_shape_of():
    c = relax.const(np.ones((2, 3), np.float32))
    assert is_const(c) and shape_of(c) == (2, 3)
    x = relax.Var("x", relax.TensorType((1, 6), "float32"))
    assert not is_const(x) and shape_of(x) == (1, 6)
    assert shape_of(relax.Var("t", relax.TupleType([]))) is None


def tir_call(name, x, operand):
    """call_tir of a PrimFunc named `name` on (x, operand), as TVM's
    legalization of an ONNX Clip half calls its `maximum` / `minimum`."""
    return relax.call_tir(relax.GlobalVar(name), relax.Tuple([x, operand]), relax.TensorType((1, 6), "float32"))


def test_clip_halves_are_found_with_their_bounds():
    x = relax.Var("x", relax.TensorType((1, 6), "float32"))
    low = clip_half(tir_call("maximum", x, relax.const(np.float32(-1.5))))
    high = clip_half(tir_call("minimum3", x, relax.const(np.full((1, 1), 6.0, np.float32))))
    assert (low[0], low[1].same_as(x), float(low[2])) == ("maximum", True, -1.5)
    assert (high[0], float(high[2]), high[2].shape) == ("minimum", 6.0, ())


def test_a_clip_half_over_a_size_set_at_run_time_takes_the_sizes_variable():
    """Over a size set at run time, the legalized call passes the size's
    variable after the bound; a tensor there is not a Clip half."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((1, n * 4), "float32"))
    six = relax.const(np.float32(6.0))
    call = lambda *f: relax.call_tir(relax.GlobalVar("minimum"), relax.Tuple(list(f)),  # noqa: E731
                                     relax.TensorType((1, n * 4), "float32"))
    high = clip_half(call(x, six, relax.prim_value(n)))
    assert (high[0], high[1].same_as(x), float(high[2])) == ("minimum", True, 6.0)
    assert clip_half(call(x, six, x)) is None


def test_what_is_not_a_clip_half():
    x = relax.Var("x", relax.TensorType((1, 6), "float32"))
    assert clip_half(tir_call("maximum", x, relax.const(np.zeros((1, 6), np.float32)))) is None  # a tensor bound
    assert clip_half(tir_call("maximum", x, x)) is None  # not a constant
    assert clip_half(tir_call("add", x, relax.const(np.float32(1)))) is None
    assert clip_half(relax.op.maximum(x, relax.const(np.float32(1)))) is None  # not legalized


def test_layer_ids_count_each_kind_in_order():
    ids = LayerIds()
    assert [ids.next(k) for k in ("conv2d", "dense", "conv2d", "conv2d", "dense")] == ["c0", "d0", "c1", "c2", "d1"]
    assert layer_id("conv2d", 7) == "c7"
