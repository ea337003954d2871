"""Pass `block_layout`: activations between convolutions in the blocked
layout NCHW{b}c, b = the target's fp32 lanes ([N, C / b, H, W, b]: the b
channels of a block are one vector at every pixel).

In NCHW a convolution's inner loop either vectorizes along a row (wasted
lanes on 7-, 13- and 14-wide rows, gathers on strided ones) or reads one
input plane per channel (as many memory streams as channels). Blocked, its
tiles broadcast input values and load output-channel vectors, and every
load is contiguous. The pass rewrites the Relax graph:

- a conv2d whose output channels are a multiple of b writes them blocked
  (depthwise: when its channels are); it reads its input blocked when the
  input's channels are a multiple of b, else NCHW (a first layer's RGB);
- an operator that works per channel lane runs on the blocked form of its
  inputs when they all have one: the elementwise ones (with tensors of the
  same channels or per-channel / scalar constants, re-laid out here), the
  halves of an ONNX Clip, pooling, global averages, channel concatenation;
- every other use of a value reads an NCHW copy, made once per value
  (free where H = W = 1: both layouts then hold the same bytes).

The decision for a convolution depends on its own shape only
(`conv_blocks`), so a layer measured alone (compiler/tune.py, profile.py)
runs in the layout it has in the model. Model inputs and outputs stay NCHW.
"""
import re

import numpy as np

NAME = "block_layout"

_UNARY = ("nn.relu", "sigmoid", "tanh", "exp", "negative", "sqrt", "nn.silu", "clip", "abs")
_BINARY = ("add", "multiply", "subtract", "divide", "maximum", "minimum")
_POOLS = ("nn.max_pool2d", "nn.avg_pool2d")


def conv_blocks(c, k, groups, lanes):
    """(input block, output block) of a convolution, 0 meaning NCHW."""
    if groups == 1 and k % lanes == 0:
        return (lanes if c % lanes == 0 else 0), lanes
    if groups == c == k and c % lanes == 0:
        return lanes, lanes
    return 0, 0


def to_blocked(a, b):
    """numpy NCHW -> NCHW{b}c (tests and tools)."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(a):
    n, cb, h, w, b = a.shape
    return np.ascontiguousarray(a.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w))


def _vars(call):
    from tvm import relax

    for a in call.args:
        if isinstance(a, relax.Var):
            yield a
        elif isinstance(a, relax.Tuple):
            yield from (f for f in a.fields if isinstance(f, relax.Var))


def run(mod, lanes):
    """The rewritten module; unchanged when `main` is not one dataflow block."""
    import tvm
    from tvm import relax, topi

    mod = relax.transform.FoldConstant()(mod)
    main = mod["main"]
    blocks = main.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return mod
    op = {name: tvm.ir.Op.get(f"relax.{name}") for name in
          ("nn.conv2d", "layout_transform", "reshape", "concat", "mean", "call_tir", *_UNARY, *_BINARY, *_POOLS)}
    layout = f"NCHW{lanes}c"
    bb = relax.BlockBuilder(mod)
    nchw, blocked = {}, {}  # original Var -> its NCHW / blocked value in the new function

    def shape_of(e):
        ty = e.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
            return None
        try:
            return tuple(int(d) for d in ty.shape.values)
        except TypeError:
            return None

    def is_const(e):
        return type(e).__name__ in ("GenericConst", "Constant") and hasattr(e, "value")

    def blockable(shape):
        return shape is not None and len(shape) == 4 and shape[1] % lanes == 0

    def get_blocked(v):
        """The blocked form of Var v (made when v is NCHW), or None."""
        if v in blocked:
            return blocked[v]
        shape = shape_of(v)
        if not isinstance(v, relax.Var) or not blockable(shape) or v not in nchw:
            return None
        blocked[v] = bb.emit(relax.op.layout_transform(
            nchw[v], index_map=lambda n, c, h, w: (n, c // lanes, h, w, c % lanes)))
        return blocked[v]

    def get_nchw(v):
        if v not in nchw:
            shape = shape_of(v)
            if shape[2] * shape[3] == 1:  # the same bytes: a reshape (an alias, elide_copies)
                nchw[v] = bb.emit(relax.op.reshape(blocked[v], shape))
            else:
                nchw[v] = bb.emit(relax.op.layout_transform(
                    blocked[v], index_map=lambda n, cb, h, w, i: (n, cb * lanes + i, h, w)))
        return nchw[v]

    def plain(e):
        """e with every Var replaced by its NCHW value."""
        if isinstance(e, relax.Var):
            return get_nchw(e) if e in nchw or e in blocked else e
        if isinstance(e, relax.Tuple):
            return relax.Tuple([plain(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(plain(e.tuple_value), e.index)
        if isinstance(e, relax.Call):
            return relax.Call(e.op, [plain(a) for a in e.args], e.attrs, e.ty_args)
        return e

    def operand(a, channels):
        """A binary operand in blocked form: a blocked value, a per-channel
        constant re-laid out, a scalar constant; None if none of these."""
        if isinstance(a, relax.Var):
            shape = shape_of(a)
            if shape is not None and len(shape) == 4 and shape[1] == channels:
                return get_blocked(a)
            return None
        if is_const(a):
            v = a.value.numpy()
            if v.size == 1:
                return a
            if v.ndim in (3, 4) and v.shape[-3] == channels and v.shape[-2:] == (1, 1) and v.size == channels:
                return relax.const(v.reshape(1, channels // lanes, 1, 1, lanes))
        return None

    def clip_half(call):
        """topi.maximum / minimum of an ONNX Clip: (kind, x, bound)."""
        if not call.op.same_as(op["call_tir"]) or len(call.args[1].fields) != 2:
            return None
        name, (x, bound) = call.args[0].name_hint, call.args[1].fields
        kind = re.fullmatch(r"(maximum|minimum)\d*", name)
        if kind and isinstance(x, relax.Var) and is_const(bound) and bound.value.numpy().size == 1:
            return kind.group(1), x, bound
        return None

    def rewrite(call, out_shape):
        """The blocked form of `call`'s result, or None to run it in NCHW."""
        a = call.attrs

        if call.op.same_as(op["nn.conv2d"]):
            x, w = call.args
            xs = shape_of(x)
            if (not is_const(w) or xs is None or len(xs) != 4 or str(a.data_layout) != "NCHW"
                    or str(a.kernel_layout) != "OIHW" or str(a.out_layout) != "NCHW"):
                return None
            ib, ob = conv_blocks(xs[1], out_shape[1], int(a.groups), lanes)
            xin = get_blocked(x) if ib else plain(x)
            if not ob or xin is None:
                return None
            return relax.op.nn.conv2d(xin, w, strides=a.strides, padding=a.padding, dilation=a.dilation,
                                      groups=a.groups, data_layout=layout if ib else "NCHW",
                                      kernel_layout="OIHW", out_layout=layout, out_dtype=a.out_dtype)
        if not blockable(out_shape) or not any(v in blocked for v in _vars(call)):
            return None  # blocked operators follow blocked inputs, never start a chain
        half = clip_half(call)
        if half is not None:
            kind, x, bound = half
            xb = get_blocked(x) if shape_of(x) == out_shape else None
            return None if xb is None else (getattr(topi, kind), xb, bound)
        if any(call.op.same_as(op[n]) for n in _UNARY):
            xb = get_blocked(call.args[0]) if isinstance(call.args[0], relax.Var) else None
            return None if xb is None else relax.Call(call.op, [xb], a, call.ty_args)
        if any(call.op.same_as(op[n]) for n in _BINARY):
            args = [operand(x, out_shape[1]) for x in call.args]
            if any(x is None for x in args) or not any(isinstance(x, relax.Var) for x in args):
                return None
            return relax.Call(call.op, args, a, call.ty_args)
        if any(call.op.same_as(op[n]) for n in _POOLS):
            xb = get_blocked(call.args[0])
            if xb is None or str(a.layout) != "NCHW":
                return None
            make = relax.op.nn.max_pool2d if call.op.same_as(op["nn.max_pool2d"]) else relax.op.nn.avg_pool2d
            return make(xb, a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode, a.count_include_pad,
                        layout=layout, out_layout=layout)
        if call.op.same_as(op["concat"]):
            parts = call.args[0].fields
            if int(a.axis) not in (1, -3) or not all(isinstance(p, relax.Var) and blockable(shape_of(p)) for p in parts):
                return None
            bs = [get_blocked(p) for p in parts]
            return None if None in bs else relax.op.concat(bs, axis=1)
        return None

    def global_mean(call, out_shape):
        """mean over H and W of a blocked value: the NCHW result directly
        (its bytes are the blocked [N, C / b, 1, 1, b] ones)."""
        if not call.op.same_as(op["mean"]) or sorted(int(i) % 4 for i in call.attrs.axis) != [2, 3]:
            return None
        x = call.args[0]
        if not isinstance(x, relax.Var) or x not in blocked:
            return None
        m = bb.emit(relax.op.mean(blocked[x], axis=[2, 3], keepdims=True))
        return relax.op.reshape(m, out_shape)

    with bb.function("cb_blocked_main", list(main.params), attrs=dict(main.attrs or {})):
        with bb.dataflow():
            for p in main.params:
                nchw[p] = p
            for binding in blocks[0].bindings:
                var, value = binding.var, binding.value
                out_shape = shape_of(var)
                new = None
                if isinstance(value, relax.Call) and out_shape is not None:
                    new = rewrite(value, out_shape)
                if isinstance(new, tuple):  # a Clip half as a TE function
                    blocked[var] = bb.emit_te(*new)
                elif new is not None:
                    blocked[var] = bb.emit(new)
                else:
                    mean = global_mean(value, out_shape) if isinstance(value, relax.Call) and out_shape else None
                    nchw[var] = bb.emit(mean if mean is not None else plain(value))
            result = bb.emit_output(plain(main.body.body))
        bb.emit_func_output(result)
    out = bb.get()
    new_main = out[out.get_global_var("cb_blocked_main")]
    out = tvm.IRModule({gv: f for gv, f in out.functions.items() if gv.name_hint not in ("main", "cb_blocked_main")})
    out["main"] = new_main.with_attr("global_symbol", "main")
    return relax.transform.DeadCodeElimination()(out)
