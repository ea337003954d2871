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
import numpy as np

from ..ir import dims
from ..ir.anchors import forced
from ..ir.graph import BLOCKED_MARK
from ..ir.relax import FOLDED, LayerIds, bindings_of, clip_half, const_value, extents_of, per_channel, same_extents
from ..kernels.schedule import round_up

NAME = "block_layout"

_UNARY = ("nn.relu", "sigmoid", "tanh", "exp", "negative", "sqrt", "nn.silu", "clip", "abs")
_BINARY = ("add", "multiply", "subtract", "maximum", "minimum")  # no divide: padded lanes may hold zeros
_POOLS = ("nn.max_pool2d", "nn.avg_pool2d")


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

    n, _, h, w = x.shape
    return te.compute((n, round_up(c, lanes) // lanes, h, w, lanes), lambda i, cb, y, z, l: tirx.if_then_else(
        cb * lanes + l < c, x[i, tirx.min(cb * lanes + l, c - 1), y, z], tirx.const(0, x.dtype)), name="cb_block")


def _unblock_te(x, c):
    """TE: blocked x -> NCHW with c channels (padding dropped)."""
    from tvm import te

    n, _, h, w, lanes = x.shape
    lanes = int(lanes)
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
    from tvm import relax

    main = mod["main"]
    blocks = main.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return mod
    r = _Rewrite(mod, isa, choice, bindings_of(blocks[0]))
    bb, nchw, blocked = r.bb, r.nchw, r.blocked
    with bb.function("cb_blocked_main", list(main.params), attrs=dict(main.attrs or {})):
        with bb.dataflow():
            for p in main.params:
                nchw[p] = p
            for binding in blocks[0].bindings:
                var, value = binding.var, binding.value
                out_shape = extents_of(var)
                new = None
                if isinstance(value, relax.Call) and out_shape is not None:
                    new = r.rewrite(value, out_shape)
                    new = r.global_mean(value, out_shape) if new is None else new
                if isinstance(new, tuple):  # a Clip half as a TE function
                    blocked[var] = bb.emit_te(*new, name_hint=r.name(var))
                elif new is not None:
                    blocked[var] = bb.emit(new, name_hint=r.name(var))
                else:
                    nchw[var] = bb.emit(r.plain(value), name_hint=var.name)
            result = bb.emit_output(r.plain(main.body.body))
        bb.emit_func_output(result)
    out = bb.get()
    new_main = out[out.get_global_var("cb_blocked_main")]
    out = tvm.IRModule({gv: f for gv, f in out.functions.items() if gv.name_hint not in ("main", "cb_blocked_main")})
    out["main"] = new_main.with_attr("global_symbol", "main")
    return relax.transform.DeadCodeElimination()(out)


class _Rewrite:
    """The new function being built: each original value's NCHW and blocked
    forms (made once each), and the rewrite of one call at a time."""

    def __init__(self, mod, isa, choice, bound):
        import tvm
        from tvm import relax

        self.isa, self.lanes, self.choice = isa, isa.lanes, dict(choice or {})
        self.ids = LayerIds()  # convolutions seen, numbered as select_variants numbers its anchors
        self.op = {name: tvm.ir.Op.get(f"relax.{name}") for name in
                   ("nn.conv2d", "concat", "mean", "call_tir", *FOLDED, *_UNARY, *_BINARY, *_POOLS)}
        self.bound = bound  # binding(var) of the original block
        self.layout = f"NCHW{isa.lanes}c"
        self.bb = relax.BlockBuilder(mod)
        self.nchw, self.blocked = {}, {}  # original Var -> its NCHW / blocked value in the new function

    def name(self, v):
        """The blocked form's name: v's and the layout (extract_layers records both)."""
        return f"{v.name}{BLOCKED_MARK}{self.layout}"

    def channels(self, v):
        shape = extents_of(v)
        return shape[1] if shape is not None and len(shape) == 4 and isinstance(shape[1], int) else None

    def get_blocked(self, v):
        """The blocked form of Var v (made from its NCHW one if need be), or None."""
        from tvm import relax

        if v in self.blocked:
            return self.blocked[v]
        c = self.channels(v)
        if not isinstance(v, relax.Var) or c is None or not _fills(c, self.lanes) or v not in self.nchw:
            return None
        self.blocked[v] = self.bb.emit_te(_block_te, self.nchw[v], c, self.lanes, primfunc_name_hint="cb_block",
                                          name_hint=self.name(v))
        return self.blocked[v]

    def get_nchw(self, v):
        from tvm import relax

        if v not in self.nchw:
            shape = extents_of(v)
            if all(isinstance(d, int) and d == 1 for d in shape[2:]) and shape[1] % self.lanes == 0:  # the same bytes: an alias (elide_copies)
                self.nchw[v] = self.bb.emit(relax.op.reshape(self.blocked[v], shape), name_hint=v.name)
            else:
                self.nchw[v] = self.bb.emit_te(_unblock_te, self.blocked[v], shape[1], primfunc_name_hint="cb_unblock",
                                               name_hint=v.name)
        return self.nchw[v]

    def plain(self, e):
        """e with every Var replaced by its NCHW value."""
        from tvm import relax

        if isinstance(e, relax.Var):
            return self.get_nchw(e) if e in self.nchw or e in self.blocked else e
        if isinstance(e, relax.Tuple):
            return relax.Tuple([self.plain(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(self.plain(e.tuple_value), e.index)
        if isinstance(e, relax.Call):
            return relax.Call(e.op, [self.plain(a) for a in e.args], e.attrs, e.ty_args)
        return e

    def per_channel(self, v, c):
        """A per-channel constant [.., c, 1, 1] as a blocked one, padded with zeros."""
        from tvm import relax

        out = np.zeros(round_up(c, self.lanes), v.dtype)
        out[:c] = v.reshape(c)
        return relax.const(out.reshape(1, -1, 1, 1, self.lanes))

    def operand(self, a, c):
        """A binary operand in blocked form: a blocked value of c channels,
        a per-channel constant, a scalar constant; None if none of these."""
        from tvm import relax

        v = const_value(a, self.bound)
        if v is not None:
            if v.size == 1:
                return relax.const(v.reshape(()))
            if per_channel(v, c) is not None:
                return self.per_channel(v, c)
            return None
        return self.get_blocked(a) if isinstance(a, relax.Var) and self.channels(a) == c else None

    def blocked_clip_half(self, call):
        """topi.maximum / minimum of an ONNX Clip: (topi function, x, bound)."""
        from tvm import relax, topi

        half = clip_half(call, self.bound)
        if half is None or not isinstance(half[1], relax.Var):
            return None
        kind, x, limit = half
        return getattr(topi, kind), x, relax.const(limit)

    def conv(self, call, c_out):
        """The convolution reading and writing its blocks (padded weights), or None."""
        from tvm import relax

        a = call.attrs
        x, w = call.args
        w = const_value(w, self.bound)
        if w is None:
            return None
        anchor_id = self.ids.next("conv2d")
        c = self.channels(x)
        if (c is None or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW" or str(a.out_layout) != "NCHW"
                or str(x.ty.dtype) != "float32" or str(w.dtype) != "float32"):
            return None  # the blocked variants are float32 (a float16 model's convolutions stay NCHW)
        shape = extents_of(x)
        if not dims.is_plain(shape[0]) or any(map(dims.clamped, shape)):
            return None  # a batch that is an expression, or a length a slice clamps (import_relax._slice_within):
            # NCHW, the generic schedule (TVM's buffer compaction under-allocates blocked rows of clamped extents)
        ib, ob = conv_blocks(c, c_out, int(a.groups), self.lanes)
        sized = not all(isinstance(d, int) for d in shape)  # at run time: only the blocked variants compute it
        if not ob and int(a.groups) == 1 and sized:
            ib, ob = (self.lanes if _fills(c, self.lanes) else 0), self.lanes  # its output channels padded to a block
        if not ob or (_forced_nchw(self.choice, anchor_id, self.isa) and not sized):
            return None
        xin = self.get_blocked(x) if ib else self.plain(x)
        if xin is None:
            return None
        kp = round_up(c_out, self.lanes)
        groups = int(a.groups)
        if groups == 1:
            cp = round_up(c, self.lanes) if ib else c
            wp = np.zeros((kp, cp) + w.shape[2:], w.dtype)
            wp[:c_out, :c] = w
        else:  # depthwise: one zero filter per padded channel
            wp = np.zeros((kp,) + w.shape[1:], w.dtype)
            wp[:c_out] = w
            groups = kp
        return relax.op.nn.conv2d(xin, relax.const(wp), strides=a.strides, padding=a.padding, dilation=a.dilation,
                                  groups=groups, data_layout=self.layout if ib else "NCHW", kernel_layout="OIHW",
                                  out_layout=self.layout, out_dtype=a.out_dtype)

    def rewrite(self, call, out_shape):
        """The blocked form of `call`'s result, or None to run it in NCHW."""
        from tvm import relax

        if call.op.same_as(self.op["nn.conv2d"]):
            return self.conv(call, out_shape[1]) if isinstance(out_shape[1], int) else None
        if (len(out_shape) != 4 or not isinstance(out_shape[1], int) or not _fills(out_shape[1], self.lanes)
                or not any(v in self.blocked for v in _vars(call))):
            return None  # blocked operators follow blocked inputs, never start a chain
        c, a = out_shape[1], call.attrs
        half = self.blocked_clip_half(call)
        if half is not None:
            fn, x, b = half
            xb = self.get_blocked(x) if same_extents(extents_of(x), out_shape) else None
            return None if xb is None else (fn, xb, b)
        if any(call.op.same_as(self.op[n]) for n in _UNARY):
            x, rest = call.args[0], list(call.args[1:])  # rest: scalar operands (clip's bounds)
            if any(isinstance(r, relax.Var) for r in rest):
                return None
            xb = self.get_blocked(x) if isinstance(x, relax.Var) and same_extents(extents_of(x), out_shape) else None
            return None if xb is None else relax.Call(call.op, [xb, *rest], a, call.ty_args)
        if any(call.op.same_as(self.op[n]) for n in _BINARY):
            args = [self.operand(x, c) for x in call.args]
            if any(x is None for x in args):
                return None
            return relax.Call(call.op, args, a, call.ty_args)
        if any(call.op.same_as(self.op[n]) for n in _POOLS):
            xb = self.get_blocked(call.args[0])
            if xb is None or str(a.layout) != "NCHW":
                return None
            make = relax.op.nn.max_pool2d if call.op.same_as(self.op["nn.max_pool2d"]) else relax.op.nn.avg_pool2d
            return make(xb, a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode, a.count_include_pad,
                        layout=self.layout, out_layout=self.layout)
        if call.op.same_as(self.op["concat"]):
            # the parts' blocks end to end: no part may be padded
            parts = call.args[0].fields
            if int(a.axis) not in (1, -3) or not all(isinstance(p, relax.Var) and self.channels(p) is not None
                                                     and self.channels(p) % self.lanes == 0 for p in parts):
                return None
            bs = [self.get_blocked(p) for p in parts]
            return None if None in bs else relax.op.concat(bs, axis=1)
        return None

    def global_mean(self, call, out_shape):
        """mean over H and W of a blocked value (blocked, keepdims) or None."""
        from tvm import relax

        if not call.op.same_as(self.op["mean"]) or call.attrs.axis is None or len(out_shape) != 4:
            return None
        x = call.args[0]
        if (not isinstance(x, relax.Var) or x not in self.blocked
                or sorted(int(i) % 4 for i in call.attrs.axis) != [2, 3]):
            return None
        if not call.attrs.keepdims:
            return None
        if all(isinstance(d, int) for d in extents_of(x)):
            return relax.op.mean(self.blocked[x], axis=[2, 3], keepdims=True)
        # sized at run time (up to a whole page's rows): each row's mean, then theirs, so that no float32 sum
        # runs over every value of the plane (a 240 x 168 plane's one running sum drifts 2e-3 off)
        rows = self.bb.emit(relax.op.mean(self.blocked[x], axis=[3], keepdims=True), name_hint=f"{self.name(x)}_rows")
        return relax.op.mean(rows, axis=[2], keepdims=True)


def run(c):
    c.mod = apply(c.mod, c.target.vector, c.choices.variants)
    return c
