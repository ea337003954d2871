"""Integer grids of Relax values: whether a tensor holds integers within
known bounds (a quantized model's 8-bit values less their zero point),
so that a layer reading it can multiply integers instead of floats
(compiler/passes/select_variants.py, conv2d.pair_blocked).

The bounds follow the operators that keep values integral: casts of
integer tensors, constants, round / floor / ceil of a bounded value,
+, -, min, max and where of integral values, and what only moves or picks
values (slices, reshapes, max pooling, concatenation, the blocked
layout's relayout). Anything else is unbounded.
"""
import numpy as np

_DTYPE_RANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}
_MOVES = ("strided_slice", "reshape", "permute_dims", "squeeze", "expand_dims", "nn.max_pool2d")
_DEPTH = 16  # the chains a quantized model writes are a few operators deep


def _call(e, binding):
    """(op name without "relax.", call) computing `e`, or (None, None)."""
    import tvm
    from tvm import relax

    call = binding(e) if isinstance(e, relax.Var) else e
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
        return call.op.name.removeprefix("relax."), call
    return None, call


def _constant(e):
    from .relax import is_const

    return e.value.numpy() if is_const(e) else None


def integer_bounds(e, binding, depth=_DEPTH):
    """(lo, hi) where every value of `e` is an integer in [lo, hi], else None."""
    if depth == 0:
        return None
    c = _constant(e)
    if c is not None:
        return (float(c.min()), float(c.max())) if c.size and np.array_equal(np.rint(c), c) else None
    op, call = _call(e, binding)
    if _is_relayout(call):
        return _relayout_bounds(call, binding, depth)
    if op == "astype":
        src = call.args[0]
        return _DTYPE_RANGE.get(str(src.ty.dtype)) or integer_bounds(src, binding, depth - 1)
    if op in _MOVES:  # values moved or picked, none made
        return integer_bounds(call.args[0], binding, depth - 1)
    if op == "concat":
        parts = [integer_bounds(x, binding, depth - 1) for x in call.args[0].fields]
        return None if None in parts else (min(p[0] for p in parts), max(p[1] for p in parts))
    if op in ("round", "floor", "ceil"):
        lo, hi = float_bounds(call.args[0], binding, depth - 1)
        f = {"round": np.round, "floor": np.floor, "ceil": np.ceil}[op]
        return None if lo is None or hi is None else (float(f(lo)), float(f(hi)))
    if op in ("add", "subtract", "minimum", "maximum", "where"):
        args = call.args[1:] if op == "where" else call.args
        a, b = (integer_bounds(x, binding, depth - 1) for x in args)
        if a is None or b is None:
            return None
        if op == "add":
            return a[0] + b[0], a[1] + b[1]
        if op == "subtract":
            return a[0] - b[1], a[1] - b[0]
        if op == "minimum":
            return min(a[0], b[0]), min(a[1], b[1])
        if op == "maximum":
            return max(a[0], b[0]), max(a[1], b[1])
        return min(a[0], b[0]), max(a[1], b[1])
    return None


def float_bounds(e, binding, depth=_DEPTH):
    """(lo, hi) bounds of `e`'s values, either None where unknown."""
    exact = integer_bounds(e, binding, depth)
    if exact is not None:
        return exact
    c = _constant(e)
    if c is not None and c.size:
        return float(c.min()), float(c.max())
    op, call = _call(e, binding)
    if op in ("minimum", "maximum") and depth > 0:
        (alo, ahi), (blo, bhi) = (float_bounds(x, binding, depth - 1) for x in call.args)
        known = lambda *v: [x for x in v if x is not None]  # noqa: E731
        if op == "minimum":  # below the smaller upper bound; above the smaller lower one if both are known
            return (min(alo, blo) if None not in (alo, blo) else None), (min(known(ahi, bhi)) if known(ahi, bhi) else None)
        return (max(known(alo, blo)) if known(alo, blo) else None), (max(ahi, bhi) if None not in (ahi, bhi) else None)
    return None, None


def _relayout_bounds(call, binding, depth):
    """A layout change's (compiler/passes/block_layout.py: values moved,
    channels padded with zeros) bounds: its input's, and 0."""
    if not _is_relayout(call):
        return None
    inner = integer_bounds(call.args[1].fields[0], binding, depth - 1)
    return None if inner is None else (min(inner[0], 0.0), max(inner[1], 0.0))


def _is_relayout(call):
    import tvm
    from tvm import relax

    return (isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.call_tir"))
            and str(call.args[0].name_hint).startswith("cb_block") and len(call.args[1].fields) == 1)


def grid_scale(x, binding, bound):
    """The scale s with x = s * q, q integers within +-bound, that `x`'s
    computation shows, else None: a DequantizeLinear's output (its constant
    scale, 8-bit values less a constant zero point), or integers (1), seen
    through what only moves or picks values."""
    op, call = _call(x, binding)
    if _is_relayout(call):
        return grid_scale(call.args[1].fields[0], binding, bound)
    if op in _MOVES:
        return grid_scale(call.args[0], binding, bound)
    if op == "dequantize" and str(call.args[0].ty.dtype) in ("uint8", "int8"):
        scale, zero = (_constant_of(a, binding) for a in call.args[1:3])
        if scale is None or zero is None or scale.size != 1 or zero.size != 1 or not float(scale.reshape(())) > 0:
            return None
        lo, hi = _DTYPE_RANGE[str(call.args[0].ty.dtype)]
        z = float(zero.reshape(()))
        return float(scale.reshape(())) if max(hi - z, z - lo) <= bound else None
    b = integer_bounds(x, binding)
    return 1.0 if b is not None and max(-b[0], b[1]) <= bound else None


def _constant_of(e, binding):
    from .relax import const_value

    return const_value(e, binding)
