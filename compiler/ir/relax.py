"""Relax helpers the passes share, one copy of each: what a constant is
and its value, an expression's static shape, the halves of an ONNX Clip,
and the ids of the layers that get kernel variants.

TVM is imported inside the functions (importing coldbrew.compiler stays
cheap)."""
import re

import numpy as np

# what a constant may go through between the model's initializer and its use
FOLDED = ("reshape", "permute_dims", "isnan", "where")


def is_const(e):
    """Whether a Relax expression is a constant (Constant or GenericConst)."""
    return type(e).__name__ in ("GenericConst", "Constant") and hasattr(e, "value")


def shape_of(e):
    """The static shape of a tensor expression as a tuple of ints, else None."""
    try:
        return tuple(int(d) for d in e.ty.shape.values)
    except (AttributeError, TypeError):
        return None


def extents_of(e):
    """A tensor expression's shape as a tuple of ints, with symbolic extents
    (sized at run time) as TVM expressions; None where its shape is unknown."""
    values = getattr(getattr(getattr(e, "ty", None), "shape", None), "values", None)
    if values is None:
        return None
    return tuple(int(d) if hasattr(d, "value") else d for d in values)


def same_extents(a, b):
    """Whether two extents_of shapes are the same (symbolic ones equal as expressions)."""
    from tvm_ffi import structural_equal

    return (a is not None and b is not None and len(a) == len(b)
            and all(x == y if isinstance(x, int) and isinstance(y, int) else
                    not isinstance(x, int) and not isinstance(y, int) and structural_equal(x, y) for x, y in zip(a, b)))


def const_value(e, binding=None):
    """The numpy value of a constant, or of a Var computed from constants
    only by FOLDED operators; else None. `binding(var)` gives the value a
    Var is bound to (None when unknown); without it only constants count."""
    from tvm import relax

    if is_const(e):
        return e.value.numpy()
    call = binding(e) if binding is not None and isinstance(e, relax.Var) else None
    if not isinstance(call, relax.Call) or not any(call.op.same_as(_op(n)) for n in FOLDED):
        return None
    args = [a if isinstance(a, relax.ShapeExpr) else const_value(a, binding) for a in call.args]
    if any(a is None for a in args):
        return None
    if call.op.same_as(_op("reshape")):
        return args[0].reshape(shape_of(e) or shape_of(call))
    if call.op.same_as(_op("permute_dims")):
        axes = call.attrs.axes
        return np.transpose(args[0], None if axes is None else [int(i) for i in axes])
    if call.op.same_as(_op("isnan")):
        return np.isnan(args[0])
    return np.where(*args).astype(args[1].dtype)  # where


def per_channel(v, c):
    """A constant's values as [c] where it holds one per channel of an NCHW
    tensor of c channels ([c, 1, 1] or [1, c, 1, 1]; a [c] is one per
    column), else None."""
    if v is None or v.size != c or v.ndim not in (3, 4) or v.shape[-3] != c:
        return None
    return v.reshape(c)


def bindings_of(block):
    """binding(var) over a dataflow block, for const_value."""
    bound = {b.var: b.value for b in block.bindings}
    return bound.get


def clip_half(call, binding=None):
    """A half of an ONNX Clip as TVM legalizes it (a call_tir of its `maximum` or `minimum` PrimFunc, by a
    scalar constant bound, then any size variables): ("maximum" | "minimum", x, 0-d bound array), else None."""
    if not call.op.same_as(_op("call_tir")) or len(call.args[1].fields) < 2:
        return None
    x, b, *sizes = call.args[1].fields
    kind = re.fullmatch(r"(maximum|minimum)\d*", call.args[0].name_hint)
    bound = const_value(b, binding)
    if kind is None or bound is None or bound.size != 1 or any(type(s.ty).__name__ != "PrimType" for s in sizes):
        return None
    return kind.group(1), x, bound.reshape(())


class LayerIds:
    """The ids of the layers that get kernel variants, in binding order:
    c0, c1, ... for convolutions, d0, d1, ... for dense layers. A
    convolution takes the next id when its weights are constant, before any
    other check, so that block_layout (which decides its layout) and
    select_variants (which gives it a variant) number it alike."""

    def __init__(self):
        self.count = {}

    def next(self, op_name):
        k = self.count.get(op_name, 0)
        self.count[op_name] = k + 1
        return layer_id(op_name, k)


def layer_id(op_name, k):
    """The id of the k-th layer of its kind: c3 is the fourth convolution."""
    return f"{op_name[0]}{k}"


def _op(name):
    import tvm

    return tvm.ir.Op.get(f"relax.{name}")
