"""Pass `block_layout`: activations between convolutions in the blocked
layout NCHW{b}c, b = the target's fp32 lanes ([N, C / b, H, W, b]: the b
channels of a block are one vector at every pixel).

In NCHW a convolution's inner loop either vectorizes along a row (wasted
lanes on 7-, 13- and 14-wide rows, gathers on strided ones) or reads one
input plane per channel (as many memory streams as channels). Blocked, its
tiles broadcast input values and load output-channel vectors, and every
load is contiguous. The pass rewrites the Relax graph:

- a conv2d writes its output blocked, and reads its input blocked, where
  the channels fill the blocks well enough (`conv_blocks`: channel counts
  that are not a multiple of b are padded with zero channels, when that
  adds at most a third: 24 channels become 32 on AVX-512, but a first
  layer's 3 RGB channels stay NCHW). Padding is exact: the padded filters
  and biases are zero, and the padded input channels meet zero weights;
- an operator that works per channel lane runs on the blocked form of its
  inputs when they all have one: the elementwise ones (with tensors of the
  same channels or per-channel / scalar constants, re-laid out here), the
  halves of an ONNX Clip, pooling, global averages, channel concatenation;
- every other use of a value reads an NCHW copy, made once per value
  (free where H = W = 1 and no channel is padded: both layouts then hold
  the same bytes).

The decision for a convolution depends on its own shape only
(`conv_blocks`), so a layer measured alone (compiler/measure/tune.py, profile.py)
runs in the layout it has in the model. Model inputs and outputs stay NCHW.
"""
import re

import numpy as np

from ..ir.anchors import forced
from ..kernels.schedule_util import round_up

NAME = "block_layout"

_UNARY = ("nn.relu", "sigmoid", "tanh", "exp", "negative", "sqrt", "nn.silu", "clip", "abs")
_BINARY = ("add", "multiply", "subtract", "maximum", "minimum")  # no divide: padded lanes may hold zeros
_POOLS = ("nn.max_pool2d", "nn.avg_pool2d")
_FOLDED = ("reshape", "permute_dims", "isnan", "where")  # what constants go through before their use


def _fills(c, lanes):
    return round_up(c, lanes) * 3 <= c * 4  # padding adds at most a third


def conv_blocks(c, k, groups, lanes):
    """(input block, output block) of a convolution with c input and k
    output channels, 0 meaning NCHW."""
    if groups == 1 and _fills(k, lanes):
        return (lanes if _fills(c, lanes) else 0), lanes
    if groups == c == k and _fills(c, lanes):
        return lanes, lanes
    return 0, 0


def to_blocked(a, b):
    """numpy NCHW -> NCHW{b}c, the channels a multiple of b (tests and tools)."""
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


def _block_te(x, c, lanes):
    """TE: NCHW x -> blocked, channels past c zero."""
    from tvm import te, tirx

    n, _, h, w = (int(d) for d in x.shape)
    return te.compute((n, round_up(c, lanes) // lanes, h, w, lanes), lambda i, cb, y, z, l: tirx.if_then_else(
        cb * lanes + l < c, x[i, tirx.min(cb * lanes + l, c - 1), y, z], tirx.const(0, x.dtype)), name="cb_block")


def _unblock_te(x, c):
    """TE: blocked x -> NCHW with c channels (padding dropped)."""
    from tvm import te

    n, _, h, w, lanes = (int(d) for d in x.shape)
    return te.compute((n, c, h, w), lambda i, k, y, z: x[i, k // lanes, y, z, k % lanes], name="cb_unblock")


def _forced_nchw(choice, anchor_id, isa):
    """Whether a forced variant choice (select_variants' {"c3": v,
    "conv2d": v, "*": v}) names an NCHW variant for this convolution."""
    from ..kernels import get

    for _, _, full, _ in forced(choice, anchor_id, "conv2d"):
        try:
            v = get(full, isa)
        except KeyError:
            continue  # not a conv variant (select_variants reports unknown names)
        return not v.blocked
    return False


def apply(mod, isa, choice=None):
    """The rewritten module for the vector unit `isa`; unchanged when `main`
    is not one dataflow block. A convolution whose forced variant (`choice`,
    as select_variants takes it) is an NCHW one stays NCHW."""
    import tvm
    from tvm import relax, topi

    lanes, choice = isa.lanes, dict(choice or {})
    count = [0]  # convolutions seen, numbered as select_variants numbers its anchors (c0, c1, ...)

    main = mod["main"]
    blocks = main.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return mod
    op = {name: tvm.ir.Op.get(f"relax.{name}") for name in
          ("nn.conv2d", "concat", "mean", "call_tir", *_FOLDED,
           *_UNARY, *_BINARY, *_POOLS)}
    bound = {b.var: b.value for b in blocks[0].bindings}
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

    def const_value(e):
        """The numpy value of a constant, or of a Var computed from
        constants only by reshapes, transposes and NaN guards; else None."""
        if type(e).__name__ in ("GenericConst", "Constant") and hasattr(e, "value"):
            return e.value.numpy()
        call = bound.get(e) if isinstance(e, relax.Var) else None
        if not isinstance(call, relax.Call) or not any(call.op.same_as(op[n]) for n in _FOLDED):
            return None
        args = [const_value(a) if not isinstance(a, relax.ShapeExpr) else a for a in call.args]
        if any(a is None for a in args):
            return None
        if call.op.same_as(op["reshape"]):
            return args[0].reshape(shape_of(e))
        if call.op.same_as(op["permute_dims"]):
            axes = call.attrs.axes
            return np.transpose(args[0], None if axes is None else [int(i) for i in axes])
        if call.op.same_as(op["isnan"]):
            return np.isnan(args[0])
        if call.op.same_as(op["where"]):
            return np.where(*args).astype(args[1].dtype)
        return None

    def channels(v):
        shape = shape_of(v)
        return shape[1] if shape is not None and len(shape) == 4 else None

    def get_blocked(v):
        """The blocked form of Var v (made from its NCHW one if need be), or None."""
        if v in blocked:
            return blocked[v]
        c = channels(v)
        if not isinstance(v, relax.Var) or c is None or not _fills(c, lanes) or v not in nchw:
            return None
        blocked[v] = bb.emit_te(_block_te, nchw[v], c, lanes, primfunc_name_hint="cb_block")
        return blocked[v]

    def get_nchw(v):
        if v not in nchw:
            shape = shape_of(v)
            if shape[2] * shape[3] == 1 and shape[1] % lanes == 0:  # the same bytes: an alias (elide_copies)
                nchw[v] = bb.emit(relax.op.reshape(blocked[v], shape))
            else:
                nchw[v] = bb.emit_te(_unblock_te, blocked[v], shape[1], primfunc_name_hint="cb_unblock")
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

    def per_channel(v, c):
        """A per-channel constant [.., c, 1, 1] as a blocked one, padded with zeros."""
        out = np.zeros(round_up(c, lanes), v.dtype)
        out[:c] = v.reshape(c)
        return relax.const(out.reshape(1, -1, 1, 1, lanes))

    def operand(a, c):
        """A binary operand in blocked form: a blocked value of c channels,
        a per-channel constant, a scalar constant; None if none of these."""
        v = const_value(a)
        if v is not None:
            if v.size == 1:
                return relax.const(v.reshape(()))
            if v.ndim in (3, 4) and v.shape[-3] == c and v.size == c:
                return per_channel(v, c)
            return None
        return get_blocked(a) if isinstance(a, relax.Var) and channels(a) == c else None

    def clip_half(call):
        """topi.maximum / minimum of an ONNX Clip: (topi function, x, bound)."""
        if not call.op.same_as(op["call_tir"]) or len(call.args[1].fields) != 2:
            return None
        kind = re.fullmatch(r"(maximum|minimum)\d*", call.args[0].name_hint)
        x, b = call.args[1].fields
        value = const_value(b)
        if kind and isinstance(x, relax.Var) and value is not None and value.size == 1:
            return getattr(topi, kind.group(1)), x, relax.const(value.reshape(()))
        return None

    def conv(call, c_out):
        """The convolution reading and writing its blocks (padded weights), or None."""
        a = call.attrs
        x, w = call.args
        w = const_value(w)
        c = channels(x)
        if (w is None or c is None or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW"
                or str(a.out_layout) != "NCHW"):
            return None
        anchor_id = f"c{count[0]}"
        count[0] += 1
        ib, ob = conv_blocks(c, c_out, int(a.groups), lanes)
        if not ob or _forced_nchw(choice, anchor_id, isa):
            return None
        xin = get_blocked(x) if ib else plain(x)
        if xin is None:
            return None
        kp = round_up(c_out, lanes)
        groups = int(a.groups)
        if groups == 1:
            cp = round_up(c, lanes) if ib else c
            wp = np.zeros((kp, cp) + w.shape[2:], w.dtype)
            wp[:c_out, :c] = w
        else:  # depthwise: one zero filter per padded channel
            wp = np.zeros((kp,) + w.shape[1:], w.dtype)
            wp[:c_out] = w
            groups = kp
        return relax.op.nn.conv2d(xin, relax.const(wp), strides=a.strides, padding=a.padding, dilation=a.dilation,
                                  groups=groups, data_layout=layout if ib else "NCHW", kernel_layout="OIHW",
                                  out_layout=layout, out_dtype=a.out_dtype)

    def rewrite(call, out_shape):
        """The blocked form of `call`'s result, or None to run it in NCHW."""
        if call.op.same_as(op["nn.conv2d"]):
            return conv(call, out_shape[1])
        if len(out_shape) != 4 or not _fills(out_shape[1], lanes) or not any(v in blocked for v in _vars(call)):
            return None  # blocked operators follow blocked inputs, never start a chain
        c, a = out_shape[1], call.attrs
        half = clip_half(call)
        if half is not None:
            fn, x, b = half
            xb = get_blocked(x) if shape_of(x) == out_shape else None
            return None if xb is None else (fn, xb, b)
        if any(call.op.same_as(op[n]) for n in _UNARY):
            x, rest = call.args[0], list(call.args[1:])  # rest: scalar operands (clip's bounds)
            if any(isinstance(r, relax.Var) for r in rest):
                return None
            xb = get_blocked(x) if isinstance(x, relax.Var) and shape_of(x) == out_shape else None
            return None if xb is None else relax.Call(call.op, [xb, *rest], a, call.ty_args)
        if any(call.op.same_as(op[n]) for n in _BINARY):
            args = [operand(x, c) for x in call.args]
            if any(x is None for x in args):
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
            # the parts' blocks end to end: no part may be padded
            parts = call.args[0].fields
            if int(a.axis) not in (1, -3) or not all(isinstance(p, relax.Var) and channels(p) is not None
                                                     and channels(p) % lanes == 0 for p in parts):
                return None
            bs = [get_blocked(p) for p in parts]
            return None if None in bs else relax.op.concat(bs, axis=1)
        return None

    def global_mean(call, out_shape):
        """mean over H and W of a blocked value (blocked, keepdims) or None."""
        if not call.op.same_as(op["mean"]) or call.attrs.axis is None or len(out_shape) != 4:
            return None
        x = call.args[0]
        if not isinstance(x, relax.Var) or x not in blocked or sorted(int(i) % 4 for i in call.attrs.axis) != [2, 3]:
            return None
        m = relax.op.mean(blocked[x], axis=[2, 3], keepdims=True)
        return m if call.attrs.keepdims else None

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
                    new = global_mean(value, out_shape) if new is None else new
                if isinstance(new, tuple):  # a Clip half as a TE function
                    blocked[var] = bb.emit_te(*new)
                elif new is not None:
                    blocked[var] = bb.emit(new)
                else:
                    nchw[var] = bb.emit(plain(value))
            result = bb.emit_output(plain(main.body.body))
        bb.emit_func_output(result)
    out = bb.get()
    new_main = out[out.get_global_var("cb_blocked_main")]
    out = tvm.IRModule({gv: f for gv, f in out.functions.items() if gv.name_hint not in ("main", "cb_blocked_main")})
    out["main"] = new_main.with_attr("global_symbol", "main")
    return relax.transform.DeadCodeElimination()(out)


def run(c):
    c.mod = apply(c.mod, c.target.vector, c.variants)
    return c
